"""The results documents are generated from the committed CSVs, never edited by hand: the
README's headline block and bench/results/README.md must match what the script writes."""

from __future__ import annotations

from _bench_scripts import REPO, run_bench_script


def test_generated_results_are_up_to_date():
    run = run_bench_script("results_readme", "--check")
    assert run.returncode == 0, run.stderr


def test_readme_is_short():
    assert len((REPO / "README.md").read_text().splitlines()) <= 200


def test_a_headline_counts_a_re_run_row_once_with_its_newer_time(tmp_path, monkeypatch):
    """Rows re-benchmarked after a re-tune (a second, newer file of the same kernel) replace the
    older file's rows in the headline; another kernel's rows at the same shape stay."""
    import json

    import pandas as pd

    import results_readme

    monkeypatch.setattr(results_readme, "RESULTS", tmp_path)
    (tmp_path / "g").mkdir()
    for stem, kernel, date, ratio in (("all", "k", "2026-01-01T00:00:00+00:00", [1.2, 1.1]),
                                      ("again", "k", "2026-02-01T00:00:00+00:00", [1.0]),
                                      ("other", "j", "2026-03-01T00:00:00+00:00", [2.0])):
        pd.DataFrame({"M": [8, 16][:len(ratio)], "K": 4, "N": 4, "dtype": "bfloat16", "x": ratio}).to_csv(
            tmp_path / "g" / f"{stem}.csv", index=False)
        (tmp_path / "g" / f"{stem}.json").write_text(json.dumps({"kernel": kernel, "date": date}))
    rows = results_readme._rows("g", ("again", "all", "other"))
    assert sorted(zip(rows.M, rows.x)) == [(8, 1.0), (8, 2.0), (16, 1.1)]
    # rows told apart by a layer, and attention rows (no M, K, N), are all kept
    pd.DataFrame({"layer": ["a", "b"], "M": 8, "K": 4, "N": 4, "dtype": "bfloat16", "x": [1, 2]}).to_csv(
        tmp_path / "g" / "layers.csv", index=False)
    pd.DataFrame({"H": [2, 4, 8], "dtype": "bfloat16", "x": [1, 2, 3]}).to_csv(tmp_path / "g" / "attn.csv", index=False)
    assert len(results_readme._rows("g", ("layers",))) == 2 and len(results_readme._rows("g", ("attn",))) == 3
    # files whose .json names no kernel (the training steps) count as re-runs of the first file's:
    # the newer file's row of a layer and shape replaces the older one's
    for stem, date, x in (("steps", "2026-01-01T00:00:00Z", [1.0, 2.0]), ("steps_where", "2026-02-01T00:00:00Z", [3.0])):
        pd.DataFrame({"layer": ["a", "b"][:len(x)], "M": 8, "K": 4, "N": 4, "x": x}).to_csv(
            tmp_path / "g" / f"{stem}.csv", index=False)
        (tmp_path / "g" / f"{stem}.json").write_text(json.dumps({"date": date}))
    rows = results_readme._rows("g", ("steps", "steps_where"))
    assert sorted(zip(rows.layer, rows.x)) == [("a", 3.0), ("b", 2.0)]
    # a re-run without a kernel counts as the first file's kernel where that one names one
    (tmp_path / "g" / "steps.json").write_text(json.dumps({"kernel": "k", "date": "2026-01-01T00:00:00Z"}))
    rows = results_readme._rows("g", ("steps", "steps_where"))
    assert sorted(zip(rows.layer, rows.x)) == [("a", 3.0), ("b", 2.0)]


def test_a_headline_finds_its_re_runs_by_command(tmp_path, monkeypatch):
    """A file is a re-run of ``stem`` when its command differs only in ``--where`` and
    ``--repeats``, whatever its name; another timer, another kernel or no recorded command is not."""
    import json

    import results_readme

    monkeypatch.setattr(results_readme, "RESULTS", tmp_path)
    folder = tmp_path / "g"
    folder.mkdir()
    files = {
        "steps": "python bench/training_step.py",
        "steps_graph": "python bench/training_step.py --timer graph --repeats 3",
        "steps_graph_M_8": "python bench/training_step.py --where 'M == 8' --timer graph --repeats=2",
        "steps_M_8": "python bench/training_step.py --where=\"M == 8\"",
        "k_w": "helion-kernels bench --kernel k --workload w --where 'M == 8' --repeats 3",
        "k_w_M_8_and_K_4": "helion-kernels bench --kernel k --workload w --where 'M == 8 and K == 4' --repeats 2",
        "k_w_other_kernel": "helion-kernels bench --kernel j --workload w --where 'M == 8'",
        "k_w_no_command": None,
        "k_x": "helion-kernels bench --kernel k --workload w --where 'M == 16'",  # not named <stem>_..., still one
    }
    for stem, command in files.items():
        (folder / f"{stem}.csv").write_text("M\n8\n")
        (folder / f"{stem}.json").write_text(json.dumps({"command": command} if command else {}))
    (folder / "k_w_broken.csv").write_text("M\n8\n")
    (folder / "k_w_broken.json").write_text("{not json")
    assert results_readme.with_reruns("g", ("steps",)) == ("steps", "steps_M_8")
    assert results_readme.with_reruns("g", ("steps_graph",)) == ("steps_graph", "steps_graph_M_8")
    assert results_readme.with_reruns("g", ("k_w",)) == ("k_w", "k_w_M_8_and_K_4", "k_x")
    # a re-run listed itself is not repeated
    assert results_readme.with_reruns("g", ("k_w", "k_w_M_8_and_K_4")) == ("k_w", "k_w_M_8_and_K_4", "k_x")


def test_a_re_run_key_reads_unquoted_reordered_and_repr_quoted_commands(tmp_path):
    """Commands written as ``" ".join(sys.argv)`` (a where clause unquoted), with options in
    another order, or with a where clause repr-quoted (escaped quotes shlex cannot read) key the
    same as the base command; a file that is no dict or no command has no key."""
    import json

    import results_readme

    def key(command):
        path = tmp_path / "r.json"
        path.write_text(json.dumps(command if not isinstance(command, str) else {"command": command}))
        return results_readme._command_key(tmp_path / "r.csv")  # the table whose .json it reads

    base = key("python bench/postnorm_training_forward.py --kernel matmul_rmsnorm --repeats 3")
    assert key("python bench/postnorm_training_forward.py --kernel matmul_rmsnorm --where M == 65536 and K <= 512") == base
    assert key("python bench/postnorm_training_forward.py --repeats=2 --where='M == 8' --kernel=matmul_rmsnorm") == base
    assert key("python bench/postnorm_training_forward.py --kernel matmul_layernorm") != base
    graph = key("python bench/training_step.py --timer graph")
    assert key("python bench/training_step.py --where 'layer == \"a\" or layer == \\'b\\'' --timer graph") == graph
    assert key("python bench/training_step.py --timer graph --bias") != graph
    assert key(["not", "a", "dict"]) is None and key({"command": 3}) is None and key({}) is None
