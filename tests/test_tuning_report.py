"""``bench/tuning_report.py``: one row per committed registry entry, and the committed report
matches the committed registry."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from _bench_scripts import REPO, run_bench_script

GPU = "nvidia_h200_sm90"


def _report(tmp_path: Path) -> pd.DataFrame:
    run = run_bench_script("tuning_report", "--gpu", GPU, "--out", tmp_path)
    assert run.returncode == 0, run.stderr
    return pd.read_csv(tmp_path / "tuning_report.csv")


def test_one_row_per_entry_with_seed_gain(tmp_path):
    import json

    df = _report(tmp_path)
    entries = sum(len(json.loads(p.read_text())["entries"]) for p in (REPO / "configs" / GPU).glob("*.json"))
    assert len(df) == entries
    timed = df.dropna(subset=["best_seed_ms"])
    assert len(timed) and ((timed.best_seed_ms / timed.final_ms).round(3) == timed.search_gain).all()


def test_committed_report_is_current(tmp_path):
    _report(tmp_path)
    committed = REPO / "bench" / "results" / GPU / "tuning_report.csv"
    assert committed.read_text() == (tmp_path / "tuning_report.csv").read_text(), \
        "run python bench/tuning_report.py after changing the registry"


def test_since_prints_and_leaves_the_committed_report_whole(tmp_path):
    """``--since`` without ``--out`` prints the filtered tables and writes nothing; a date past
    every entry says so in a line (no pandas dump)."""
    committed = REPO / "bench" / "results" / GPU / "tuning_report.csv"
    before = committed.stat().st_mtime_ns
    run = run_bench_script("tuning_report", "--gpu", GPU, "--since", "2026-12-02")
    assert run.returncode == 0, run.stderr
    assert "rmsnorm_matmul" in run.stdout and "wrote" not in run.stdout
    assert committed.stat().st_mtime_ns == before
    run = run_bench_script("tuning_report", "--gpu", GPU, "--since", "2099-01-01")
    assert run.returncode == 0 and run.stdout.strip() == f"tuning_report: no {GPU} entries tuned on or after 2099-01-01 (UTC)"
    assert committed.stat().st_mtime_ns == before


def test_tiling_names_a_flattened_tile_loop(tmp_path):
    """The tiling column says ``flattened`` exactly for the entries whose config flattens a loop
    (``range_flattens``), so a table read shows which entries took that tiling."""
    import json

    df = _report(tmp_path)
    flattened = {(p.stem, "x".join(str(e[k]) for k in "MKN"))
                 for p in (REPO / "configs" / GPU).glob("*.json") for e in json.loads(p.read_text())["entries"]
                 if "M" in e and any(e["config"].get("range_flattens") or [])}
    shown = {(r.kernel, r.shape) for r in df.itertuples() if str(r.tiling).endswith(" flattened")}
    assert flattened and shown == flattened
