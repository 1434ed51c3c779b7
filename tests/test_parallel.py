"""The multi-GPU sweep (``helion-kernels autotune --gpus N``) with fake tuning jobs on the CPU:
one worker per GPU pinned by ``CUDA_VISIBLE_DEVICES``, every item done once, a crashed worker
losing only its item, and the shared registry file intact under many concurrent writers (worker
processes, and separate processes each running a sweep)."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helion_kernels import registry, tuning
from helion_kernels.parallel import Item, parse_gpus, run_parallel
from helion_kernels.spec import Shape

import _parallel_jobs

pytestmark = pytest.mark.ref_mode  # no kernel runs; once per CPU session
TESTS = Path(__file__).resolve().parent


def _entries(kernel: str) -> dict:
    path = registry.registry_path(kernel, "fake_gpu")
    doc = json.loads(path.read_text())  # a valid file
    return {(e["M"], e["K"], e["N"]): e for e in doc["entries"]}


def _items(kernel: str, ms, crash_at=-1, pause=0.05, barrier=None):
    return [Item(Shape(m, 64, 64), f"{m}x64x64", (kernel, m, crash_at, pause, barrier)) for m in ms]


def test_every_item_once_over_two_pinned_workers(registry_dir, tmp_path):
    ms = list(range(1, 13))
    barrier = tmp_path / "barrier"  # both workers take an item before either finishes one
    barrier.mkdir()
    results = run_parallel("fake", _items("k_two", ms, barrier=str(barrier)), _parallel_jobs.save_job,
                           tuning.failed_result, ["0", "1"])
    assert [r.key for r in results] == [Shape(m, 64, 64) for m in ms]  # in the order given
    assert all(r.status == "tuned" for r in results)
    entries = _entries("k_two")
    assert set(entries) == {(m, 64, 64) for m in ms}
    assert {e["gpu_worker"] for e in entries.values()} == {"0", "1"}  # both GPUs took work


def test_a_crashed_worker_loses_only_its_item(registry_dir):
    ms = list(range(1, 9))
    results = run_parallel("fake", _items("k_crash", ms, crash_at=3), _parallel_jobs.save_job, tuning.failed_result, ["0", "1"])
    status = {r.key.M: r.status for r in results}
    assert status.pop(3) == "failed" and set(status.values()) == {"tuned"}
    assert "died" in next(r.message for r in results if r.key.M == 3)
    assert set(_entries("k_crash")) == {(m, 64, 64) for m in ms if m != 3}


def test_many_writers_keep_every_entry(registry_dir):
    """Eight processes saving 25 entries each into one registry file at once."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_parallel_jobs.write_entries, args=("k_many", 1000 * i + 1, 25)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    entries = _entries("k_many")
    assert set(entries) == {(1000 * i + 1 + j, 32, 32) for i in range(8) for j in range(25)}
    assert not list(registry.registry_path("k_many", "fake_gpu").parent.glob("*.tmp"))  # no leftovers


def test_two_sweeps_at_once(registry_dir):
    """Two separate processes, each a two-worker sweep, into the same registry."""
    script = (
        "import sys; sys.path.insert(0, {tests!r});"
        "import _parallel_jobs;"
        "from helion_kernels.parallel import Item, run_parallel;"
        "from helion_kernels.spec import Shape;"
        "items = [Item(Shape(m, 64, 64), str(m), ('k_sweeps', m, -1, 0.02, None)) for m in range({a}, {b})];"
        "from helion_kernels.tuning import failed_result;"
        "r = run_parallel('fake', items, _parallel_jobs.save_job, failed_result, ['0', '1']);"
        "sys.exit(0 if all(x.status == 'tuned' for x in r) else 1)"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script.format(tests=str(TESTS), a=a, b=a + 10)])
             for a in (1, 101)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    assert set(_entries("k_sweeps")) == {(m, 64, 64) for a in (1, 101) for m in range(a, a + 10)}


def test_tune_hands_the_largest_keys_out_first(monkeypatch):
    """``tune(..., gpus)`` with two GPUs builds one item per key, most FLOPs first."""
    from helion_kernels import parallel
    from helion_kernels.techniques import get_spec

    seen = {}
    monkeypatch.setattr(parallel, "run_parallel", lambda title, items, job, failed, gpus: seen.update(
        items=items, job=job, gpus=gpus) or [])
    spec = get_spec("matmul")
    problems = [Shape(64, 64, 64), Shape(4096, 512, 512), Shape(1024, 256, 256)]
    tuning.tune(spec, problems, torch.bfloat16, tuning.TuneOptions(), torch.device("cpu"), ["0", "1"])
    assert [i.key for i in seen["items"]] == [Shape(4096, 512, 512), Shape(1024, 256, 256), Shape(64, 64, 64)]
    assert seen["job"] is tuning._tune_job and seen["gpus"] == ["0", "1"]
    assert seen["items"][0].payload[0] == "matmul"  # the spec travels by name


@pytest.mark.parametrize(("value", "available", "visible", "expected"), [
    ("all", 4, None, ["0", "1", "2", "3"]), ("2", 4, None, ["0", "1"]), ("1", 1, None, ["0"]),
    ("all", 2, "5,7", ["5", "7"]), ("1", 2, "5,7", ["5"]),
])
def test_parse_gpus(value, available, visible, expected, monkeypatch):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert parse_gpus(value, available) == expected


@pytest.mark.parametrize(("value", "available"), [("0", 2), ("-1", 2), ("two", 2), ("3", 2), ("all", 0)])
def test_parse_gpus_refuses(value, available):
    with pytest.raises(ValueError, match="--gpus"):
        parse_gpus(value, available)
