"""Result files of the benchmark (the timing itself needs a GPU)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from helion_kernels import benchmark
from helion_kernels.benchmark import write_results


def _meta(**over):
    meta = {"gpu": "Some GPU", "measured_at": "2026-11-29T10:00:00+00:00", "commit": "abc1234",
            "command": "helion-kernels bench --kernel rmsnorm_matmul", "timer": "graph", "order": "balanced",
            "repeats": 1, "copy_GBps": 4250.0, "gemm_TFLOPs": 744.0, "versions": "torch 2.11", "timing": "graphs",
            "kernel": "rmsnorm_matmul"}
    return {**meta, **over}


def _rows(*shapes, ms=0.1):
    return pd.DataFrame([{"kernel": "rmsnorm_matmul", "M": m, "K": k, "N": n, "dtype": "bfloat16",
                          "rmsnorm_matmul_ms": ms, "cublas_mm_ms": 0.1, "inductor_norm_ms": 0.08,
                          "cublas+inductor_norm_ms": 0.2, "speedup_vs_best_unfused": 0.2 / ms,
                          "saved_vs_cublas_inductor_pct": 50.0, "byte_floor_ms": 0.03, "flop_floor_ms": 0.01,
                          "fused_over_floor": ms / 0.03} for m, k, n in shapes])


def test_write_results_merges_a_re_run_in_place(tmp_path):
    """One table per op and workload: a re-run of some rows replaces those rows (and only
    those) in place, each row keeping the provenance of the run that measured it; the .md
    lists the runs and every row names its run; no .json beside it."""
    out = tmp_path / "gpu"
    paths = write_results(_rows((64, 64, 64), (128, 64, 64)), _meta(), out, "stem")
    assert [p.name for p in paths] == ["stem.csv", "stem.md", "stem.png"]
    assert paths[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = write_results(_rows((128, 64, 64), (256, 64, 64), ms=0.05),
                          _meta(measured_at="2026-12-01T10:00:00+00:00", commit="def5678", repeats=3), out, "stem")
    table = pd.read_csv(again[0])
    assert list(zip(table.M, table.rmsnorm_matmul_ms, table.commit, table.repeats)) == [
        (64, 0.1, "abc1234", 1), (128, 0.05, "def5678", 3), (256, 0.05, "def5678", 3)]
    md = again[1].read_text()
    assert "# stem on Some GPU" in md and "`helion-kernels bench --kernel rmsnorm_matmul`" in md
    assert "1. 2026-11-29T10:00, commit abc1234" in md and "2. 2026-12-01T10:00, commit def5678" in md
    assert not list(out.glob("*.json"))


def test_an_interrupted_write_leaves_the_old_table(tmp_path, monkeypatch):
    """The table is written beside it and renamed: a failure mid-write keeps the rows saved."""
    from helion_kernels import results

    out = tmp_path / "gpu"
    write_results(_rows((64, 64, 64)), _meta(), out, "stem")
    before = (out / "stem.csv").read_text()

    def broken(self, text):
        raise OSError("disk full")

    monkeypatch.setattr(Path, "write_text", broken)
    with pytest.raises(OSError):
        results.write_table(_rows((64, 64, 64), ms=0.5), _meta(), out, "stem", "t")
    monkeypatch.undo()
    assert (out / "stem.csv").read_text() == before


def test_refloor_scales_every_floor_to_the_new_ceilings():
    """A floor is bytes (FLOPs) over a rate: at a 2x higher copy ceiling the byte floor halves,
    and fused_over_floor is the kernel's time over the larger floor at the new ceilings."""
    from helion_kernels import results
    from helion_kernels.timing import Ceilings

    table = results.with_provenance(_rows((64, 64, 64)), _meta(copy_GBps=2000.0, gemm_TFLOPs=500.0))
    new = results.refloor(table, Ceilings(4000.0, 1000.0))
    assert new.byte_floor_ms[0] == pytest.approx(0.015) and new.flop_floor_ms[0] == pytest.approx(0.005)
    assert new.fused_over_floor[0] == pytest.approx(0.1 / 0.015)
    assert (new.copy_GBps[0], new.gemm_TFLOPs[0]) == (4000.0, 1000.0)


def test_ceilings_file_round_trip(tmp_path):
    """The ceilings every floor of a GPU reads: the best row of each kind; none without the file."""
    from helion_kernels import results

    assert results.read_ceilings(tmp_path) is None
    rows = [{"kind": "copy", "method": m, "size": "1 GiB", "ms": 1.0, "rate": r, "note": ""}
            for m, r in (("torch_copy", 2700.0), ("compiled_scale", 4100.0))]
    rows.append({"kind": "bf16_gemm", "method": "cublas_mm", "size": "8192^3", "ms": 1.0, "rate": 700.0, "note": ""})
    results.write_ceilings(tmp_path, rows, _meta())
    found = results.read_ceilings(tmp_path)
    assert (found.bandwidth_gbps, found.bf16_tflops) == (4100.0, 700.0)
    assert "copy ceiling 4100 GB/s" in (tmp_path / "ceilings.md").read_text()


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


