"""``bench/gemm_ceiling.py``: every GEMM workload row once, the newest measurement, the aim
checked on the median of the runs since the row's entry was tuned, and the committed report
current."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
from _bench_scripts import REPO, run_bench_script

GPU = "nvidia_h200_sm90"


def _report(tmp_path: Path) -> pd.DataFrame:
    run = run_bench_script("gemm_ceiling", "--gpu", GPU, "--out", tmp_path)
    assert run.returncode == 0, run.stderr
    return pd.read_csv(tmp_path / "gemm_ceiling.csv", keep_default_na=False, na_values=[""])


def test_every_committed_row_once_with_the_aim(tmp_path):
    from helion_kernels import workloads

    df = _report(tmp_path)
    tables = pd.concat([workloads.load_workload(t)[["M", "K", "N"]] for t in
                        ("prenorm_rmsnorm", "postnorm_fullrow", "postnorm_split_n", "training")])
    assert len(df) == len(tables.drop_duplicates()) and not df.duplicated(["M", "K", "N"]).any()
    assert (df["aim"] == df["K"].map(lambda k: 1.07 if k >= 512 else 1.15)).all()
    checked = df[df.status.isin(["meets", "misses"])]
    assert ((checked.judged <= checked.aim) == (checked.status == "meets")).all()
    for group, count, median in (("balanced", "balanced_runs", "balanced_median"),
                                 ("beside fused", "runs", "runs_median"), ("alone", "alone_runs", "alone_median")):
        part = checked[checked.judged_by == group]
        assert (part[count] >= 1).all() and (part.judged == part[median]).all()
    by_runs = checked[checked.runs >= 1]
    assert (by_runs.runs_min <= by_runs.runs_median).all() and (by_runs.runs_median <= by_runs.runs_max).all()
    assert df[df.status == "not measured"].helion_gemm_vs_cublas.isna().all()


def test_committed_report_is_current(tmp_path):
    _report(tmp_path)
    for name in ("gemm_ceiling.csv", "gemm_ceiling.md"):
        committed = REPO / "bench" / "results" / GPU / name
        assert committed.read_text() == (tmp_path / name).read_text(), \
            "run python bench/gemm_ceiling.py after changing benchmarks or the matmul registry"


def _bench_file(folder: Path, stem: str, date: str | None, rows: list[dict], kernel: str = "rmsnorm_matmul",
                balanced: bool = False) -> None:
    """A result table whose rows record their run (kernel, date, column order); an undated one
    records none of it."""
    df = pd.DataFrame(rows)
    if date is not None:
        df = df.assign(kernel=kernel, measured_at=date, order="balanced" if balanced else "one order")
    df.to_csv(folder / f"{stem}.csv", index=False)


def test_newest_timed_measurement_wins_and_single_runs_stray_files_and_missing_folders(tmp_path, monkeypatch):
    """Synthetic results: an old repeated run, a newer single run (no spread, no repeats), a
    newest one whose GEMM ratio is missing, a result without a date; a registry entry tuned
    between the first two; a row without an entry measured twice, whose newest run alone would
    miss the aim and whose median meets it."""
    from helion_kernels import registry
    from helion_kernels.spec import Shape

    configs, results = tmp_path / "configs", tmp_path / "results"
    shutil.copytree(REPO / "configs" / "workloads", configs / "workloads")
    (results / GPU).mkdir(parents=True)
    row = {"M": 65536, "K": 1024, "N": 1024, "dtype": "bfloat16", "rmsnorm_matmul_ms": 1.0}
    _bench_file(results / GPU, "old", "2026-01-01T00:00:00+00:00",
                [{**row, "helion_gemm_vs_cublas": 1.20, "helion_gemm_vs_cublas_spread": 0.01, "repeats": 3,
                  "fused_vs_helion_gemm": 1.5}])
    _bench_file(results / GPU, "new", "2026-02-01T00:00:00Z",
                [{**row, "helion_gemm_vs_cublas": 1.05, "fused_vs_helion_gemm": 1.3},
                 {**row, "K": 256, "N": 256, "helion_gemm_vs_cublas": 1.10}])
    _bench_file(results / GPU, "newest", "2026-03-01T00:00:00+00:00", [{**row, "helion_gemm_vs_cublas": None}])
    _bench_file(results / GPU, "again", "2026-02-15T00:00:00+00:00", [{**row, "K": 256, "N": 256,
                                                                       "helion_gemm_vs_cublas": 1.18}])
    _bench_file(results / GPU, "undated", None, [{**row, "M": 131072, "helion_gemm_vs_cublas": 1.0}])
    # a single run from before the bench wrote the ratio columns: the ratios come from the times
    _bench_file(results / GPU, "single", "2026-01-01T00:00:00+00:00",
                [{**row, "M": 262144, "K": 64, "N": 64, "helion_matmul_ms": 2.0, "cublas_mm_ms": 1.0}])
    # the plain GEMM's own benchmark, from before it wrote the ratio: its own time over cuBLAS's
    plain = {"dtype": "bfloat16", "matmul_ms": 1.1, "cublas_mm_ms": 1.0}
    _bench_file(results / GPU, "plain", "2026-01-01T00:00:00+00:00", [{"M": 262144, "K": 128, "N": 128, **plain}],
                kernel="matmul")
    # ... and one undated, without a kernel column: the kernel is read from the first timing column
    _bench_file(results / GPU, "plain_undated", None, [{"M": 131072, "K": 256, "N": 256, **plain}])
    # 65536x1024x1024 timed alone before its entry was tuned (not counted) and after; 65536x512x512
    # misses beside a fused kernel and meets alone: the runs beside a fused kernel judge it
    alone_row = {"M": 65536, "K": 1024, "N": 1024, "dtype": "bfloat16", "matmul_ms": 1.0}
    _bench_file(results / GPU, "alone_before", "2026-01-10T00:00:00+00:00",
                [{**alone_row, "helion_gemm_vs_cublas": 0.90}], kernel="matmul")
    _bench_file(results / GPU, "alone_after", "2026-02-10T00:00:00+00:00",
                [{**alone_row, "helion_gemm_vs_cublas": 0.95}, {**alone_row, "K": 512, "N": 512,
                                                               "helion_gemm_vs_cublas": 1.00}], kernel="matmul")
    _bench_file(results / GPU, "alone_again", "2026-02-11T00:00:00+00:00",
                [{**alone_row, "K": 512, "N": 512, "helion_gemm_vs_cublas": 1.01}], kernel="matmul")
    _bench_file(results / GPU, "fused_512", "2026-02-09T00:00:00+00:00",
                [{**row, "K": 512, "N": 512, "helion_gemm_vs_cublas": 1.10}])
    # 131072x512x512: one-order runs beside a fused kernel miss (1.09); two runs in a balanced
    # order, one beside a fused kernel (1.06) and one alone (1.04), judge it and meet the aim
    _bench_file(results / GPU, "fused_131072_one_order", "2026-02-09T00:00:00+00:00",
                [{**row, "M": 131072, "K": 512, "N": 512, "helion_gemm_vs_cublas": 1.09}])
    _bench_file(results / GPU, "fused_131072_balanced", "2026-02-10T00:00:00+00:00",
                [{**row, "M": 131072, "K": 512, "N": 512, "helion_gemm_vs_cublas": 1.06}], balanced=True)
    _bench_file(results / GPU, "alone_131072_balanced", "2026-02-11T00:00:00+00:00",
                [{**alone_row, "M": 131072, "K": 512, "N": 512, "helion_gemm_vs_cublas": 1.04}], kernel="matmul",
                balanced=True)
    monkeypatch.setenv("HELION_KERNELS_CONFIG_DIR", str(configs))
    registry.save_entry("matmul", GPU, registry.Entry(Shape(65536, 1024, 1024), "bfloat16", {"block_sizes": [64, 64, 64]},
                                                      {"tuned_at": "2026-01-15T00:00:00+00:00"}))

    def run(out):
        done = run_bench_script("gemm_ceiling", "--gpu", GPU, "--results", results, "--configs", configs, "--out", out)
        assert done.returncode == 0, done.stderr
        return pd.read_csv(out / "gemm_ceiling.csv", keep_default_na=False, na_values=[""]).set_index(["M", "K", "N"])

    df = run(tmp_path / "a")
    assert df.loc[(65536, 1024, 1024), ["helion_gemm_vs_cublas", "status", "matmul_entry", "file"]].tolist() == \
        [0.95, "meets", "exact", "alone_after.csv"]
    # the runs before the entry was tuned (1.20, and 0.90 alone) are not among its runs
    assert df.loc[(65536, 1024, 1024), ["runs", "runs_median", "alone_runs", "alone_median"]].tolist() == \
        [1, 1.05, 1, 0.95]
    assert df.loc[(65536, 512, 512), ["helion_gemm_vs_cublas", "runs", "runs_median", "alone_runs", "judged_by",
                                      "status"]].tolist() == [1.01, 1, 1.10, 2, "beside fused", "misses"]
    # balanced runs judge where there are any, alone or beside a fused kernel alike
    assert df.loc[(131072, 512, 512), ["helion_gemm_vs_cublas", "balanced_runs", "balanced_min", "balanced_max",
                                       "runs", "runs_median", "alone_runs", "judged_by", "status"]].tolist() == \
        [1.04, 2, 1.04, 1.06, 1, 1.09, 0, "balanced", "meets"]
    assert abs(df.loc[(131072, 512, 512), "judged"] - 1.05) < 1e-12
    assert abs(df.loc[(65536, 512, 512), "alone_median"] - 1.005) < 1e-12
    assert df.loc[(65536, 1024, 1024), "rmsnorm_matmul_vs_helion_gemm"] == 1.3
    # no entry: both runs count; the newest (1.18) misses the 1.15 aim below K = 512, the median meets it
    assert df.loc[(65536, 256, 256), ["helion_gemm_vs_cublas", "runs", "runs_min", "runs_max", "status"]].tolist() \
        == [1.18, 2, 1.10, 1.18, "meets"]
    assert abs(df.loc[(65536, 256, 256), "runs_median"] - 1.14) < 1e-12
    assert df.loc[(131072, 1024, 1024), "status"] == "date unknown"
    assert df.loc[(262144, 64, 64), ["helion_gemm_vs_cublas", "rmsnorm_matmul_vs_helion_gemm", "status"]].tolist() == \
        [2.0, 0.5, "misses"]
    # timed alone only: judged by those runs
    assert df.loc[(262144, 128, 128), ["helion_gemm_vs_cublas", "runs", "status", "alone_runs", "alone_median",
                                       "judged_by"]].tolist() == [1.1, 0, "meets", 1, 1.1, "alone"]
    assert df.loc[(65536, 256, 256), "alone_runs"] == 0 and pd.isna(df.loc[(65536, 256, 256), "alone_median"])
    assert df.loc[(131072, 256, 256), ["helion_gemm_vs_cublas", "status"]].tolist() == [1.1, "date unknown"]
    assert "matmul_vs_helion_gemm" not in df
    measured = [(65536, 1024, 1024), (65536, 256, 256), (131072, 1024, 1024), (262144, 64, 64), (262144, 128, 128),
                (65536, 512, 512), (131072, 256, 256), (131072, 512, 512)]
    assert (df.drop(index=measured).status == "not measured").all()

    # a stray empty table and one with a column the reader adds are named and left out; the report goes on
    (results / GPU / "stray.csv").write_text("")
    _bench_file(results / GPU, "broken", None, [{**row, "M": 131072, "helion_gemm_vs_cublas": 1.0, "file": "x"}])
    (results / GPU / "folder.csv").mkdir()  # not a file: named and left out too
    done = run_bench_script("gemm_ceiling", "--gpu", GPU, "--results", results, "--configs", configs,
                            "--out", tmp_path / "b")
    assert done.returncode == 0 and "left out stray.csv" in done.stderr and "left out broken.csv" in done.stderr
    assert "left out folder.csv" in done.stderr
    (results / GPU / "folder.csv").rmdir()
    again = pd.read_csv(tmp_path / "b" / "gemm_ceiling.csv", keep_default_na=False, na_values=[""])
    assert again.equals(pd.read_csv(tmp_path / "a" / "gemm_ceiling.csv", keep_default_na=False, na_values=[""]))
    assert f"--results {results} --configs {configs}" in (tmp_path / "b" / "gemm_ceiling.md").read_text()

    # no results for the GPU (a typo, or --results one folder too deep), or no registry root: a clear error
    for path in (results / GPU).iterdir():
        path.unlink()
    for args, message in ((("--gpu", GPU, "--results", results), f"no benchmark results in {results / GPU}"),
                          (("--gpu", "other_gpu", "--results", results / GPU), "--results is the folder above the GPU folders"),
                          (("--gpu", GPU, "--configs", tmp_path / "none"), "has no workloads/ folder")):
        done = run_bench_script("gemm_ceiling", *args, "--out", tmp_path / "c")
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
