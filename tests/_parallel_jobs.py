"""Fake tuning jobs for ``test_parallel.py``: module-level, so spawned workers can unpickle them."""

from __future__ import annotations

import os
import time
from pathlib import Path

import helion

from helion_kernels import registry
from helion_kernels.spec import Shape
from helion_kernels.tuning import TuneResult

CONFIG = helion.Config(block_sizes=[16, 16, 16], num_warps=4, num_stages=1)


def save_job(payload) -> TuneResult:
    """Write one registry entry for ``payload`` = (kernel, M, crash_at_M, sleep seconds,
    barrier folder or None) as a real job would, noting the GPU it was pinned to; exit hard at
    ``crash_at_M``. With a barrier folder, each worker marks it and waits (up to 120 s) until
    two workers have: a worker that started first cannot take every item while the other is
    still importing torch (seen on a 2-core machine)."""
    kernel, m, crash_at, pause, barrier = payload
    if m == crash_at:
        os._exit(3)  # a crash: no exception, no message
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "?")
    if barrier is not None:
        Path(barrier, f"worker_{gpu}").touch()
        deadline = time.monotonic() + 120
        while len(list(Path(barrier).iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    time.sleep(pause)
    entry = registry.Entry(Shape(m, 64, 64), "bfloat16", CONFIG, {"latency_ms": 0.01, "gpu_worker": gpu})
    registry.save_entry(kernel, "fake_gpu", entry, gpu_name="Fake GPU")
    return TuneResult(Shape(m, 64, 64), "tuned", pause, f"on gpu {gpu}", entry)


def write_entries(kernel: str, first: int, count: int) -> None:
    """``count`` entries of M = first .. first + count - 1, one save each (a busy writer)."""
    for m in range(first, first + count):
        registry.save_entry(kernel, "fake_gpu", registry.Entry(Shape(m, 32, 32), "float16", CONFIG, {}))
