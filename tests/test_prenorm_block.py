"""``bench/prenorm_block.py``: the pre-norm block (residual add, norm, Linear), the package's op
against torch.compile, forward and training.

On the CPU (Helion's reference mode) a tiny row is built with a fake timer and torch.compile
replaced by the function itself (inductor's CPU build is too slow for a test): the float64
check of both op columns (outputs, and in training every gradient) and the row's arithmetic.
No timing here."""

from __future__ import annotations

import math

import prenorm_block as script
import pytest
import torch
from _bench_scripts import run_bench_script

FAKE_MS = {"op": 1.0, "op_fused": 0.8, "op_unfused": 1.5, "compiled_block": 1.2, "compiled_pair": 1.3,
           "cublas_mm": 0.8}
COLUMNS = ["op", "op_fused", "op_unfused", "compiled_block", "compiled_pair", "cublas_mm"]  # no Liger off a GPU


@pytest.fixture
def fake_timing(monkeypatch):
    """The columns each row timed; torch.compile the identity."""
    timed = []

    def fake_time_all(steps, timer, repeats=1):
        timed.append(list(steps))
        return {name: [FAKE_MS[name]] * repeats for name in steps}, timer

    monkeypatch.setattr(script, "_time_all", fake_time_all)
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    return timed


@pytest.mark.ref_mode
@pytest.mark.parametrize("unfused", [False, True], ids=["as_dispatched", "op_unfused"])
@pytest.mark.parametrize("mode", script.MODES)
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_row_checks_the_op_and_derives_the_ratios(norm, mode, unfused, fake_timing, monkeypatch):
    """Reference mode dispatches fused=None to the kernels; ``op_unfused`` has the op column
    take the unfused path instead (the GPU's, where the registry has no entry), also checked."""
    if unfused:
        real = script._op
        monkeypatch.setattr(script, "_op", lambda norm, fused: real(norm, False if fused is None else fused))
    row = script.bench_row(norm, 40, 64, 48, mode, "graph", repeats=2, device="cpu")
    assert row["check"] == "ok", row["check"]
    assert 0 <= row["rel_error"] < script.GRAD_TOLERANCE
    assert fake_timing == [COLUMNS]
    assert (row["mode"], row["M"], row["K"], row["N"]) == (mode, 40, 64, 48)
    assert (row["dtype"], row["timer"], row["repeats"], row["dispatch"]) == ("bfloat16", "graph", 2, "fused")
    assert row["speedup_vs_compiled_block"] == pytest.approx(1.2)
    assert row["fused_speedup_vs_compiled_block"] == pytest.approx(1.5)
    assert row["unfused_speedup_vs_compiled_block"] == pytest.approx(0.8)
    assert row["speedup_vs_compiled_block_spread"] == 0
    assert row["norm_share_removed_pct"] == pytest.approx(50.0)  # (1.2 - 1.0) / (1.2 - 0.8)
    assert all(math.isfinite(v) for k, v in row.items() if isinstance(v, float))


@pytest.mark.ref_mode
@pytest.mark.parametrize("mode", script.MODES)
def test_a_wrong_op_fails_the_check(mode, fake_timing, monkeypatch):
    """Forward: y off by 10%; training: h detached, so its gradient never reaches x and
    residual (the outputs are right, the gradients are not)."""
    real = script._op

    def wrong(norm, fused):
        def run(*args):
            y, h = real(norm, fused)(*args)
            return (y, h.detach().requires_grad_()) if mode == "training" else (y * 1.1, h)
        return run

    monkeypatch.setattr(script, "_op", wrong)
    row = script.bench_row("rmsnorm", 32, 64, 32, mode, "plain", device="cpu")
    assert row["check"].startswith("FAILED: op:") and math.isinf(row["rel_error"]), row["check"]


@pytest.mark.ref_mode
def test_plot_draws_rows_with_and_without_a_time(tmp_path):
    df = script.pd.DataFrame([{"M": 64, "K": 32, "N": 16, "mode": "forward", "speedup_vs_compiled_block": 1.1},
                              {"M": 64, "K": 32, "N": 16, "mode": "training", "check": "FAILED: boom"}])
    script.plot(df, {"gpu": "cpu", "norm": "rmsnorm"}, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.ref_mode  # on a GPU machine the script would run the whole benchmark
def test_without_a_gpu_it_exits_2():
    result = run_bench_script("prenorm_block", "--mode", "training", "--where", "M == 65536")
    assert result.returncode == 2 and "needs a CUDA GPU" in result.stderr
