"""GPU timing: CUDA-graph replay, median, rotating input sets so L2 does not flatter."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Sequence

import torch


def time_ms(fns: Callable[[], object] | Sequence[Callable[[], object]], rep_ms: int = 50) -> float:
    """Median milliseconds per call of ``fns``, by CUDA-graph replay (``do_bench_cudagraph``:
    a graph of about ``rep_ms`` of back-to-back calls, replayed 10 times).

    Pass several callables (the same op on different input sets) to have consecutive calls
    in the graph cycle through them, so inputs are not served from a warm L2.
    """
    from triton.testing import do_bench_cudagraph

    seq = [fns] if callable(fns) else list(fns)
    for fn in seq:  # compile / autotune / allocate outside the graph capture
        fn()
    torch.cuda.synchronize()
    cycle = itertools.cycle(seq)
    return float(do_bench_cudagraph(lambda: next(cycle)(), rep=rep_ms, return_mode="median"))


def input_copies(bytes_per_set: int, device: torch.device, cap: int = 8) -> int:
    """How many input sets make the rotation at least 4x the L2 cache (1..cap)."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return max(1, min(cap, -(-4 * l2 // max(bytes_per_set, 1))))


@dataclasses.dataclass(frozen=True)
class Ceilings:
    """Measured device ceilings: copy bandwidth (read + write) and bf16 GEMM rate."""

    bandwidth_gbps: float
    bf16_tflops: float


def measure_ceilings(device: torch.device) -> Ceilings:
    """A 1 GiB device-to-device copy and an 8192^3 bf16 cuBLAS GEMM on random data."""
    src = torch.randn(2**28, device=device)  # 1 GiB fp32
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src), rep_ms=100)
    bandwidth = 2 * src.numel() * src.element_size() / (copy_ms * 1e-3) / 1e9
    del src, dst
    n = 8192
    x = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    y = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    mm_ms = time_ms(lambda: torch.mm(x, y), rep_ms=100)
    return Ceilings(bandwidth_gbps=bandwidth, bf16_tflops=2 * n**3 / (mm_ms * 1e-3) / 1e12)
