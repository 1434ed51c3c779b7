"""The results documents are generated from the committed tables, never edited by hand: the
README's headline block and bench/results/README.md must match what the script writes, and each
headline must name its table, its baseline, its timer and the runs behind it."""

from __future__ import annotations

import pandas as pd
from _bench_scripts import REPO, run_bench_script



def test_generated_results_are_up_to_date():
    run = run_bench_script("results_readme", "--check")
    assert run.returncode == 0, run.stderr


def test_documents_are_short():
    assert len((REPO / "README.md").read_text().splitlines()) <= 200
    assert len((REPO / "bench" / "results" / "README.md").read_text().splitlines()) <= 600


def test_every_headline_reads_one_committed_table_per_op():
    import results_readme

    gpus = [d for d in (REPO / "bench" / "results").iterdir() if d.is_dir()]
    for h in results_readme.HEADLINES:
        for table in h.tables:
            assert any((gpu / f"{table}.csv").is_file() for gpu in gpus), (h.technique, table)


def test_a_headline_without_rows_is_left_out_and_a_caveat_can_go_stale(tmp_path, monkeypatch):
    """A GPU whose table has no row the headline selects gets no line for it (not a NaN); a
    ``stale_before`` caveat shows only on rows all measured before that date."""
    import results_readme

    monkeypatch.setattr(results_readme, "RESULTS", tmp_path)
    for gpu, date in (("old", "2026-01-02"), ("new", "2026-02-02")):
        (tmp_path / gpu).mkdir()
        pd.DataFrame({"x": [1.5], "timer": ["plain"], "repeats": [1], "order": "one order",
                      "measured_at": [f"{date}T00:00:00+00:00"]}).to_csv(tmp_path / gpu / "op_w.csv", index=False)
    h = results_readme.Headline("Op", ("op_w",), "{x}x", {"x": "x"}, "base", where="timer == 'plain'",
                                caveat="stale", stale_before="2026-02-01")
    assert "**Caveat:** stale." in results_readme.headline(h, "old")
    assert "Caveat" not in results_readme.headline(h, "new")
    graph = results_readme.Headline("Op", ("op_w",), "{x}x", {"x": "x"}, "base", where="timer == 'graph'")
    assert not results_readme._has(graph, "old") and results_readme._has(h, "old")


def test_a_headline_names_its_table_baseline_timer_runs_and_dates(tmp_path, monkeypatch):
    """Ranges over the selected rows only; the timer, the runs per row, the column order and the
    dates come from the rows themselves; the path the op ran is counted per row."""
    import results_readme

    monkeypatch.setattr(results_readme, "RESULTS", tmp_path)
    (tmp_path / "g").mkdir()
    pd.DataFrame({"M": [8, 16, 32], "x": [1.2, 1.1, 9.0], "dispatch": ["fused", "unfused", "fused"],
                  "timer": ["graph", "graph", "plain"], "repeats": [2, 3, 1], "order": "balanced",
                  "measured_at": ["2026-01-02T00:00:00+00:00", "2026-01-05T00:00:00+00:00",
                                  "2026-01-09T00:00:00+00:00"]}).to_csv(tmp_path / "g" / "op_w.csv", index=False)
    h = results_readme.Headline("Op", ("op_w",), "{x}x ({dispatch})", {"x": "x"}, "cuBLAS + norm",
                                where="timer == 'graph'", caveat="soft")
    line = results_readme.headline(h, "g")
    assert line.startswith("- **Op**: 1.10 to 1.20x (fused at 1 row, unfused at 1 row) (2 rows).")
    assert "Baseline as run: cuBLAS + norm." in line
    assert "Timer: CUDA-graph replay (GPU time), median; runs per row: 2-3 (column order: balanced)" in line
    assert "measured 2026-01-02 to 2026-01-05" in line
    assert "Table: `g/op_w.md` (rows where timer == 'graph')." in line and line.endswith("**Caveat:** soft.")
