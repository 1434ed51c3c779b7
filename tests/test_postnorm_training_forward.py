"""``bench/postnorm_training_forward.py``: the full-row ops' forward as autograd records it (the
norm's input kept), fused against unfused, checked against fp32 and timed per column.

On the CPU (Helion's reference mode) the row is built with a fake timer: the check of both
paths' outputs (y, statistics and the kept h) and the row's arithmetic. On a GPU, one small
row as the script times it."""

from __future__ import annotations

import math

import postnorm_training_forward as script
import pytest
import torch
from _bench_scripts import run_bench_script

from helion_kernels.spec import Shape

KERNELS = ["matmul_layernorm", "matmul_rmsnorm"]
FAKE_MS = {"forward_fused": 0.8, "forward_unfused": 1.2, "cublas_mm": 0.5, "inductor_norm": 0.6}


@pytest.mark.ref_mode
@pytest.mark.parametrize("kernel", KERNELS)
def test_row_checks_both_paths_and_derives_the_ratios(kernel, monkeypatch):
    timed = []

    def fake_time_columns(columns, repeats):
        times = {}
        for name, fns in columns.items():
            out = fns[0]()  # each column runs on the CPU once
            timed.append((name, None if not isinstance(out, tuple) else len(out)))
            times[name] = [{kernel: 1.0, script.UNFUSED: 1.5, **FAKE_MS}[name]] * repeats
        return times

    monkeypatch.setattr(script, "time_columns", fake_time_columns)
    monkeypatch.setattr(script, "input_copies", lambda nbytes, device: 2)
    row = script.bench_row(kernel, Shape(33, 40, 48), torch.bfloat16, torch.device("cpu"), repeats=2)
    assert row["check"] == "ok" and 0 <= row["rel_error"] < 3e-2
    kept = 4 if kernel == "matmul_layernorm" else 3  # y, [mean,] rstd, h
    assert dict(timed)[kernel] == kept and dict(timed)[script.UNFUSED] == kept
    assert row["speedup_vs_best_unfused"] == pytest.approx(1.5) and row["speedup_spread"] == 0
    assert row["forward_speedup"] == pytest.approx(1.5)
    assert row["saved_vs_cublas_inductor_pct"] == pytest.approx(100 * 0.5 / 0.6)
    assert row["training_write_ms"] == pytest.approx(0.2)
    assert row["training_decision"] == "fused"  # 1.5x, past the 2% margin
    assert (row["M"], row["K"], row["N"], row["dtype"], row["repeats"]) == (33, 40, 48, "bfloat16", 2)


@pytest.mark.ref_mode
def test_a_wrong_kept_product_fails_the_check(monkeypatch):
    real = script.KERNELS["matmul_rmsnorm"]

    def wrong_h(*args):
        y, rstd, h = real(*args)
        return y, rstd, None if h is None else h * 1.1

    monkeypatch.setitem(script.KERNELS, "matmul_rmsnorm", wrong_h)
    monkeypatch.setattr(script, "time_columns", lambda columns, repeats: {n: [1.0] for n in columns})
    monkeypatch.setattr(script, "input_copies", lambda nbytes, device: 1)
    row = script.bench_row("matmul_rmsnorm", Shape(16, 32, 64), torch.bfloat16, torch.device("cpu"), 1)
    assert row["check"].startswith("FAILED") and math.isinf(row["rel_error"])


def test_an_unknown_kernel_is_a_usage_error():
    result = run_bench_script("postnorm_training_forward", "--kernel", "matmul")
    assert result.returncode == 2 and "invalid choice: 'matmul'" in result.stderr


@pytest.mark.ref_mode  # on a GPU machine the script would run the whole benchmark
def test_without_a_gpu_it_exits_2():
    result = run_bench_script("postnorm_training_forward", "--kernel", "matmul_layernorm")
    assert result.returncode == 2 and "needs a CUDA GPU" in result.stderr


@pytest.mark.cuda
@pytest.mark.parametrize("kernel", KERNELS)
def test_one_row_on_the_gpu(kernel):
    """A shape of the committed registry (an untuned one warns, and the suite makes that an
    error, where this GPU has entries of its own; another GPU runs the tuned one's, warned)."""
    import contextlib
    import warnings

    from helion_kernels import registry

    own = registry.entries_for(kernel, registry.gpu_key(torch.device("cuda")))
    with contextlib.nullcontext() if own else warnings.catch_warnings():
        if not own:
            warnings.simplefilter("ignore", registry.ConfigFallbackWarning)
        row = script.bench_row(kernel, Shape(65536, 64, 64), torch.bfloat16, torch.device("cuda"), repeats=1)
    assert row["check"] == "ok", row["check"]
    times = [row[f"{c}_ms"] for c in (kernel, script.UNFUSED, *FAKE_MS)]
    assert all(math.isfinite(t) and t > 0 for t in times), times
    assert row["training_decision"] in ("fused", "unfused")
