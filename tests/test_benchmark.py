"""Result files of the benchmark (the timing itself needs a GPU)."""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest
import torch

from helion_kernels import benchmark
from helion_kernels.benchmark import write_results


def test_write_results(tmp_path):
    df = pd.DataFrame([
        {"M": 65536, "K": 1024, "N": 512, "rmsnorm_matmul_ms": 0.11, "cublas_mm_ms": 0.1,
         "helion_matmul_ms": 0.105, "inductor_norm_ms": 0.08, "saved_vs_helion_gemm_pct": 94.0,
         "saved_vs_cublas_inductor_pct": 88.0, "byte_floor_ms": 0.03, "flop_floor_ms": 0.09},
        {"M": 65536, "K": 256, "N": 256, "rmsnorm_matmul_ms": 0.03, "cublas_mm_ms": 0.024,
         "helion_matmul_ms": 0.026, "inductor_norm_ms": 0.017, "saved_vs_helion_gemm_pct": 76.0,
         "saved_vs_cublas_inductor_pct": 65.0, "byte_floor_ms": 0.016, "flop_floor_ms": 0.011},
    ])
    meta = {"gpu": "Some GPU", "command": "helion-kernels bench --kernel rmsnorm_matmul", "date": "2026-11-29",
            "versions": {"torch": "2.11"}, "ceilings": {"copy_GBps": 4250.0, "bf16_TFLOPs": 744.0}, "timing": "graphs"}
    paths = write_results(df, meta, tmp_path / "gpu", "stem")
    assert [p.name for p in paths] == ["stem.csv", "stem.md", "stem.json", "stem.png"]
    assert pd.read_csv(paths[0]).shape == (2, len(df.columns))
    md = paths[1].read_text()
    assert "# stem on Some GPU" in md and "`helion-kernels bench --kernel rmsnorm_matmul`" in md and "| 65536 |" in md
    assert json.loads(paths[2].read_text())["gpu"] == "Some GPU"
    assert paths[3].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_workload_script_args(monkeypatch, capsys):
    """The bench scripts' command line: a bad query is a usage error before the GPU check;
    on a machine without CUDA a good one exits with status 2 and says why."""
    from helion_kernels.benchmark import workload_script_args

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["script", "--where", "Q == 1"])
    with pytest.raises(SystemExit) as err:
        workload_script_args("test")
    assert err.value.code == 2 and "bad --where expression" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["script", "--where", "N == 512", "--norm", "x"])
    with pytest.raises(SystemExit) as err:
        workload_script_args("test", lambda p: p.add_argument("--norm"))
    assert err.value.code == 2 and "needs a CUDA GPU" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    args, table = workload_script_args("test", lambda p: p.add_argument("--norm"))
    assert args.norm == "x" and set(table.N) == {512} and len(table) == 3


def test_repeated_timing_balances_the_column_order(monkeypatch):
    """Each repeat times every column in order, then in reverse order (so clock drift and a
    column's place fall on all alike), and a column's time for the repeat is the mean of its
    two; the per-repeat ratios pair times of the same repeat."""
    order = []
    # per repeat: f, g, c, then c, g, f
    clock = iter([1.0, 2.0, 3.0, 3.4, 2.2, 1.2,
                  1.5, 2.5, 3.5, 3.5, 2.5, 1.5])
    monkeypatch.setattr(benchmark, "time_ms", lambda fns: order.append(fns[0]) or next(clock))
    times = benchmark.time_columns({"fused": ["f"], "helion_matmul": ["g"], "cublas_mm": ["c"]}, repeats=2)
    assert order == ["f", "g", "c", "c", "g", "f"] * 2
    expected = {"fused": [1.1, 1.5], "helion_matmul": [2.1, 2.5], "cublas_mm": [3.2, 3.5]}
    assert list(times) == list(expected)
    for name, ts in expected.items():
        assert times[name] == pytest.approx(ts)
    assert benchmark._ratio(times, "fused", "helion_matmul") == pytest.approx([1.1 / 2.1, 0.6])


def test_balanced_order_cancels_a_place_bias():
    """A timer that makes whichever column runs second 8% slower (as the H200 did for the same
    GEMM and cuBLAS) leaves the two equal columns equal once the order is balanced; timed in
    one order only, the second column would read 1.08x the first."""
    state = {"calls": 0}

    def timer(column):
        state["calls"] += 1
        return 1.0 * (1.08 if state["calls"] % 2 == 0 else 1.0)

    times = benchmark.time_columns({"gemm": "g", "cublas_mm": "c"}, repeats=3, timer=timer)
    assert benchmark._ratio(times, "gemm", "cublas_mm") == pytest.approx([1.0] * 3)


@pytest.mark.ref_mode
@pytest.mark.filterwarnings("ignore::helion_kernels.registry.ConfigFallbackWarning")  # no registry for the CPU
def test_plain_gemm_benchmark_reports_its_ratio_to_cublas(monkeypatch):
    """The plain GEMM's own benchmark gives ``helion_gemm_vs_cublas`` (the median of the
    per-repeat ratios, and their spread) as the fused kernels' benchmarks do for their twin, so
    its runs count in the GEMM report; it has no fused-over-GEMM ratio."""
    from helion_kernels.techniques import get_spec
    from helion_kernels.spec import Shape
    from helion_kernels.timing import Ceilings

    # (matmul, cublas_mm) per repeat, in order then reversed: ratios 1.1, 1.0, 0.8 (median 1.0); the
    # medians' ratio would be 1.2 / 1.3
    clock = iter([1.10, 1.00, 1.00, 1.10, 1.30, 1.30, 1.30, 1.30, 1.20, 1.50, 1.50, 1.20])
    monkeypatch.setattr(benchmark, "time_ms", lambda fns: next(clock))
    monkeypatch.setattr(benchmark, "input_copies", lambda *a, **k: 1)
    row = benchmark.bench_problem(get_spec("matmul"), Shape(33, 40, 24), torch.float32, torch.device("cpu"),
                                  Ceilings(bandwidth_gbps=1000.0, bf16_tflops=100.0), repeats=3)
    assert row["check"] == "ok"
    assert row["helion_gemm_vs_cublas"] == pytest.approx(1.00)
    assert row["helion_gemm_vs_cublas_spread"] == pytest.approx(0.30)
    assert "fused_vs_helion_gemm" not in row


def test_a_partial_deferred_run_never_replaces_the_whole_table():
    """``bench/postnorm_deferred.py --where ...`` once wrote its one row over the 10-row table;
    a partial run is named after its clause, as the other benchmarks' re-runs are."""
    import postnorm_deferred  # bench/, on the path through conftest

    whole = postnorm_deferred.results_stem("postnorm_split_n", None)
    part = postnorm_deferred.results_stem("postnorm_split_n", "K == 512 and N == 2048")
    assert whole == "matmul_rmsnorm_matmul_postnorm_split_n"
    assert part == "matmul_rmsnorm_matmul_postnorm_split_n_K_512_and_N_2048"
