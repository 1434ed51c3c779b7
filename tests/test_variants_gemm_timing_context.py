"""The GEMM timing-context script (``bench/variants/gemm_timing_context.py``): which column's
time lands where, and the summary (the timing itself needs a GPU)."""

from __future__ import annotations

import itertools

import pandas as pd
import pytest

import gemm_timing_context  # bench/variants
from helion_kernels.spec import Shape


def test_contexts_replay_the_two_benchmarks_orders():
    plan = gemm_timing_context.contexts(["cublas_mm", "inductor_norm", "cublas+inductor_norm"])
    assert plan["pair"] == ["gemm", "cublas_mm"] and plan["pair_reversed"] == ["cublas_mm", "gemm"]
    assert plan["fused_bench"] == ["fused", "gemm", "cublas_mm", "inductor_norm", "cublas+inductor_norm"]
    assert plan["after_norm"] == ["inductor_norm", "gemm", "inductor_norm", "cublas_mm"]


@pytest.mark.ref_mode
def test_each_context_records_its_own_gemm_and_cublas_times(monkeypatch):
    """A clock that counts calls: per repeat the contexts run in turn and each records the times
    of its own GEMM and cuBLAS columns (on the CPU the fused benchmark has no Liger columns)."""
    clock = itertools.count(1)
    monkeypatch.setattr(gemm_timing_context, "input_copies", lambda *a, **k: 1)
    runs = gemm_timing_context.measure(Shape(33, 40, 24), "cpu", repeats=2, timer=lambda fns: next(clock))
    first = runs[runs.repeat == 0].set_index("context")
    # pair: gemm 1, cuBLAS 2; pair_reversed: cuBLAS 3, gemm 4; fused_bench: fused 5, gemm 6, cuBLAS 7,
    # two norm columns 8-9; after_norm: norm 10, gemm 11, norm 12, cuBLAS 13
    assert first.loc[["pair", "pair_reversed", "fused_bench", "after_norm"], ["gemm_ms", "cublas_ms"]
                     ].values.tolist() == [[1, 2], [4, 3], [6, 7], [11, 13]]
    assert runs[runs.repeat == 1].set_index("context").loc["pair", "gemm_ms"] == 14


def test_summary_is_the_median_of_per_repeat_ratios():
    runs = pd.DataFrame({"context": ["pair"] * 3, "repeat": [0, 1, 2],
                         "gemm_ms": [1.1, 1.3, 1.2], "cublas_ms": [1.0, 1.3, 1.5]})
    row = gemm_timing_context.summarise(Shape(8, 8, 8), runs).iloc[0]
    assert row.vs_cublas == pytest.approx(1.0) and row.vs_cublas_spread == pytest.approx(0.3)
    assert (row.gemm_ms, row.cublas_ms, row.repeats) == (1.2, 1.3, 3)


@pytest.mark.ref_mode  # on a GPU it would time them
def test_without_a_gpu_it_names_the_rows_and_exits(capsys):
    assert gemm_timing_context.main(["--where", "M == 262144 and K == 2048 and N == 2048"]) == 0
    assert "would time 1 row (262144x2048x2048) in the contexts pair, pair_reversed, fused_bench, after_norm" \
        in capsys.readouterr().err
