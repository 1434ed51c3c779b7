"""Autotune/benchmark plumbing of flash_norm_attention through the generic spec path
(:mod:`helion_kernels.tuning`, :mod:`helion_kernels.benchmark`), on the CPU.

Timing needs a GPU; here the timer is replaced so the rest of a benchmark row (inputs,
reference checks, the unfused baselines, the metrics) runs in reference mode.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from helion_kernels import bench_specs
from helion_kernels.bench_specs import bench_spec
from helion_kernels import benchmark, runtime, tuning
from helion_kernels.techniques.attention import kernels as fna
from helion_kernels.spec import AttentionRow, AttentionShape
from helion_kernels.timing import Ceilings

pytestmark = pytest.mark.usefixtures("poisoned_empty")

SPEC = fna.SPEC
ROW = AttentionRow(batch=3, H=2, D=16, max_seq_len_q=20, seq_len_kv=8, fill=0.5, seed=0)


def test_tuning_problem_is_the_longest_q_per_head_shape():
    rows = [AttentionRow(4, h, 16, q, 8, 0.5, 0) for h in (2, 4) for q in (64, 16, 32)]
    picked = tuning.tuning_problems(SPEC, rows)
    assert set(picked) == {AttentionShape(2, 16), AttentionShape(4, 16)}
    assert all(r.max_seq_len_q == 64 for r in picked.values())


def test_make_args_same_lengths_other_values():
    a, b = fna.make_args(ROW, torch.float32, "cpu", 0), fna.make_args(ROW, torch.float32, "cpu", 1)
    assert torch.equal(a[3], b[3]) and a[3][-1] == sum(ROW.q_lengths()) == a[0].shape[0]
    assert torch.equal(a[4], torch.arange(0, 8 * 3 + 1, 8))
    assert a[5] == ROW.max_seq_len_q and max(ROW.q_lengths()) <= a[5]
    assert not torch.equal(a[0], b[0]) and a[6].shape == (2, 16)
    assert bench_spec(SPEC.name).min_bytes(ROW, torch.float32) == 4 * (2 * a[0].numel() + 2 * a[1].numel())
    assert bench_spec(SPEC.name).flops(ROW) == 4 * 2 * 16 * 8 * sum(ROW.q_lengths())
    assert SPEC.key_of(a) == ROW.key == AttentionShape(2, 16)
    assert ROW.columns()["total_q"] == a[0].shape[0]


@pytest.fixture
def eager_block(monkeypatch):
    """The compiled unfused block, eager (compiling it with inductor on CPU takes minutes)."""
    monkeypatch.setattr(bench_specs, "compiled_unfused_block", lambda: bench_specs.unfused_block)


@pytest.mark.ref_mode
def test_bench_row_checks_and_metrics(monkeypatch, registry_dir, eager_block):
    calls = []

    def fake_time(fns, rep_ms=50):
        fns = fns if isinstance(fns, list) else [fns]
        for fn in fns:
            fn()
        calls.append(len(fns))
        # fused, compiled, eager, gdpa + eager norms; then the same columns in reverse order
        return [2.0, 6.0, 4.0, 3.0, 3.0, 4.0, 6.0, 2.0][len(calls) - 1]

    monkeypatch.setattr(benchmark, "time_ms", fake_time)
    monkeypatch.setattr(benchmark, "input_copies", lambda nbytes, device: 2)
    with pytest.warns(match="default config"):
        row = benchmark.bench_problem(SPEC, ROW, torch.float32, torch.device("cpu"), Ceilings(1000.0, 100.0))
    assert calls == [2] * 8  # every candidate timed over both input sets, in order and reversed
    assert row["check"] == "ok" and row["unfused_compiled_check"] == "ok"
    assert row["rel_error"] < 1e-5 and row["config"] == "default" and row["total_q"] == sum(ROW.q_lengths())
    assert row["speedup_vs_unfused_compiled"] == 3.0 and row["speedup_vs_unfused_eager"] == 2.0
    assert row["speedup_vs_gdpa+eager_norms"] == 1.5 and row["speedup_vs_best_unfused"] == 1.5
    assert "saved_vs_cublas_inductor_pct" not in row and "vs_cublas_mm" not in row
    assert row["fused_over_floor"] == pytest.approx(2.0 / row["byte_floor_ms"])


@pytest.mark.ref_mode
def test_bench_row_reports_a_wrong_kernel(monkeypatch, registry_dir, eager_block):
    monkeypatch.setattr(benchmark, "time_ms", lambda fns, rep_ms=50: 1.0)
    monkeypatch.setattr(benchmark, "input_copies", lambda nbytes, device: 1)
    monkeypatch.setattr(runtime, "launch", lambda spec, args: torch.zeros_like(args[0]))
    with pytest.warns(match="default config"):
        row = benchmark.bench_problem(SPEC, ROW, torch.float32, torch.device("cpu"), Ceilings(1000.0, 100.0))
    assert row["check"].startswith("FAILED")
    assert row["unfused_compiled_check"] == "ok"


def test_plot_writes_a_png(tmp_path):
    df = pd.DataFrame([{"H": 2, "max_seq_len_q": q, "flash_norm_attention_ms": 1.0, "unfused_compiled_ms": 2.0,
                        "unfused_eager_ms": 2.5, "gdpa+eager_norms_ms": 0.8, "byte_floor_ms": 0.1,
                        "speedup_vs_best_unfused": 0.8} for q in (256, 512)])
    benchmark.plot(df, {"gpu": "GPU X", "relative_to": "unfused_compiled", "aim": 1.35}, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_tune_tunes_each_head_shape_on_its_longest_row(monkeypatch):
    """One tuning per (H, D), on its longest-Q row, the most FLOPs first; a failure does not
    stop the others."""
    tuned = []

    def fake_tune_problem(spec, row, dtype, options, device, progress_bar=True):
        tuned.append(row)
        if row.H == 4:
            raise RuntimeError("no config")
        return tuning.TuneResult(row.key, "tuned", 0.0, "ok")

    monkeypatch.setattr(tuning, "tune_problem", fake_tune_problem)
    rows = [AttentionRow(4, h, 16, q, 8, 0.5, 0) for h in (2, 4) for q in (16, 64)]
    results = tuning.tune(SPEC, rows, torch.bfloat16, tuning.TuneOptions(), torch.device("cpu"))
    assert [(r.H, r.max_seq_len_q) for r in tuned] == [(4, 64), (2, 64)]
    assert [(r.key, r.status) for r in results] == [(AttentionShape(4, 16), "failed"),
                                                    (AttentionShape(2, 16), "tuned")]
    assert "RuntimeError: no config" in results[0].message
