"""``bench/dispatch_from_bench.py``: a benchmark CSV's medians become the registry's dispatch
records, by the library's margin rule, without touching configs or other entries.

The script's ``main`` runs in this process (a subprocess per call re-imports torch and Helion:
20 s a call on a busy GPU machine); one test runs it as a user does, as a separate process."""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from _bench_scripts import REPO, run_bench_script
from dispatch_from_bench import decisions, main

from helion_kernels import registry
from helion_kernels import results

GPU = "nvidia_h200_sm90"
KERNEL = "matmul_layernorm_split_n"


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run_script(capsys, monkeypatch, tmp_path):
    """``run_script(*argv)``: the script's ``main`` in this process -> Run(returncode, stdout,
    stderr). ``main`` points the registry's environment variable at ``--registry``: setting it
    here first makes monkeypatch restore it (or remove it) afterwards; ``delenv`` of an unset
    variable would record nothing, and ``main``'s value would leak into later tests."""
    monkeypatch.setenv(registry.ENV_CONFIG_DIR, str(tmp_path))

    def run(*argv) -> Run:
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as err:  # argparse and the script's refusals
            code = 0 if err.code is None else err.code
            if isinstance(code, str):
                print(code, file=sys.stderr)
                code = 1
        out = capsys.readouterr()
        return Run(code, out.out, out.err)
    return run


@pytest.fixture
def run(run_script):
    """``run(csv, registry_dir, kernel=KERNEL)``: the script on the test's registry copy."""
    def _run(csv: Path, registry_dir: Path, kernel: str = KERNEL) -> Run:
        return run_script("--kernel", kernel, "--csv", csv, "--gpu", GPU, "--registry", registry_dir)
    return _run


def _copy_registry(tmp_path: Path, kernel: str) -> Path:
    path = tmp_path / GPU / f"{kernel}.json"
    path.parent.mkdir(exist_ok=True)
    shutil.copy(REPO / "configs" / GPU / f"{kernel}.json", path)
    return path


def _entries(path: Path) -> dict[tuple, dict]:
    return {(e["M"], e["K"], e["N"], e["dtype"]): e for e in json.loads(path.read_text())["entries"]}


def test_rewrites_only_the_dispatch_records_of_the_rows_given(tmp_path, run):
    registry_file = _copy_registry(tmp_path, KERNEL)
    before_text = registry_file.read_text()
    before = _entries(registry_file)
    rows = pd.DataFrame({
        "M": [262144, 262144, 7, 262144, 262144], "K": [512, 1024, 7, 2048, 2048],
        "N": [512, 1024, 7, 512, 1024], "dtype": ["bfloat16"] * 5,
        "check": ["ok", "ok", "ok", "FAILED: output 0 off", "ok"],
        f"{KERNEL}_ms": [0.9, 1.0, 1.0, 0.1, float("nan")],  # row 1: fused 10% faster than every pipeline
        "cublas+inductor_norm_ms": [1.0, 1.05, 1.0, 1.0, 1.0],  # row 2: Liger 5% faster, beats fused
        "cublas+liger_norm_ms": [1.2, 1.0, 1.0, 1.0, 1.0],
        "repeats": [3] * 5})
    csv = tmp_path / "bench.csv"
    rows.to_csv(csv, index=False)

    result = run(csv, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "skipped (7, 7, 7, 'bfloat16'): no registry entry" in result.stdout
    assert "skipped (262144, 2048, 512, 'bfloat16'): the fused kernel's check: FAILED" in result.stdout
    assert "skipped (262144, 2048, 1024, 'bfloat16'): a missing time" in result.stdout
    assert "2 record(s) written" in result.stdout

    after = _entries(registry_file)
    assert after.keys() == before.keys()
    fused, liger = after[(262144, 512, 512, "bfloat16")], after[(262144, 1024, 1024, "bfloat16")]
    assert (fused["dispatch"]["choice"], fused["dispatch"]["fused_ms"]) == ("fused", 0.9)
    assert (liger["dispatch"]["choice"], liger["dispatch"]["unfused"]) == ("unfused", "cublas+liger_norm")
    assert liger["dispatch"]["unfused_timed_ms"] == {"cublas+inductor_norm": 1.05, "cublas+liger_norm": 1.0}
    assert "medians of 3 repeat(s)" in liger["dispatch"]["source"]
    for key, entry in after.items():
        assert entry["config"] == before[key]["config"]
        if key[1:3] not in {(512, 512), (1024, 1024)}:
            assert entry == before[key], key
    # the same CSV again: the same file, byte for byte, but for the two records' sources
    assert registry_file.read_text() != before_text
    run(csv, tmp_path)
    assert _entries(registry_file) == after


def test_skips_rows_whose_entry_was_tuned_after_the_benchmark(tmp_path, run):
    """A benchmark that ran before the entry was tuned timed the previous config: the entry
    keeps its tuning's decision, and rows measured after their entry are still recorded."""
    registry_file = _copy_registry(tmp_path, KERNEL)
    before = _entries(registry_file)
    late, early = (262144, 512, 512, "bfloat16"), (262144, 1024, 1024, "bfloat16")
    entries = json.loads(registry_file.read_text())
    for e in entries["entries"]:
        if (e["M"], e["K"], e["N"], e["dtype"]) == late:
            e["tuned_at"] = "2026-12-02T12:00:00+00:00"
        elif (e["M"], e["K"], e["N"], e["dtype"]) == early:
            e["tuned_at"] = "2026-12-01T12:00:00+00:00"
    registry_file.write_text(json.dumps(entries))
    csv = tmp_path / "bench.csv"
    pd.DataFrame({"M": [late[0], early[0]], "K": [late[1], early[1]], "N": [late[2], early[2]],
                  "dtype": ["bfloat16"] * 2, "check": ["ok"] * 2, f"{KERNEL}_ms": [0.5, 0.5],
                  "cublas+inductor_norm_ms": [1.0, 1.0], "measured_at": "2026-12-02T06:00:00+00:00"}).to_csv(csv, index=False)

    result = run(csv, tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"skipped {late}: the entry was tuned (2026-12-02T12:00:00+00:00) after this benchmark ran" in result.stdout
    assert "1 record(s) written" in result.stdout
    after = _entries(registry_file)
    assert after[late].get("dispatch") == before[late].get("dispatch")
    assert after[early]["dispatch"]["choice"] == "fused" and after[early]["dispatch"]["fused_ms"] == 0.5


def test_a_kernel_without_liger_never_records_it(tmp_path, run):
    """The full-row ops cannot run Liger's norm: its column in their benchmark is a comparison,
    not a path, so a faster Liger pipeline leaves the compiled norm as the unfused path."""
    kernel = "matmul_rmsnorm"
    registry_file = _copy_registry(tmp_path, kernel)
    key = next(iter(_entries(registry_file)))
    rows = pd.DataFrame({"M": [key[0]], "K": [key[1]], "N": [key[2]], "dtype": [key[3]], "check": ["ok"],
                         f"{kernel}_ms": [1.0], "cublas+inductor_norm_ms": [0.9], "cublas+liger_norm_ms": [0.5]})
    csv = tmp_path / "bench.csv"
    rows.to_csv(csv, index=False)
    result = run(csv, tmp_path, kernel)
    assert result.returncode == 0, result.stderr
    record = _entries(registry_file)[key]["dispatch"]
    assert (record["choice"], record["unfused"]) == ("unfused", "cublas+inductor_norm")
    assert "unfused_timed_ms" not in record


def test_training_table_writes_the_training_records_only(tmp_path, run_script):
    """``--training`` with bench/postnorm_training_forward.py's table: each row's
    ``dispatch_training`` record by the same rule; the forward ``dispatch`` records and the
    configs stay as they were. Each kind of table is refused with the other's flag."""
    kernel = "matmul_layernorm"
    registry_file = _copy_registry(tmp_path, kernel)
    doc = json.loads(registry_file.read_text())
    for entry in doc["entries"]:  # as before any training benchmark
        entry.pop(registry.TRAINING_DISPATCH, None)
    registry_file.write_text(json.dumps(doc))
    before = _entries(registry_file)
    flip, keep = (65536, 128, 128, "bfloat16"), (65536, 64, 64, "bfloat16")
    assert before[flip]["dispatch"]["choice"] == "fused"
    rows = pd.DataFrame({"M": [flip[0], keep[0]], "K": [flip[1], keep[1]], "N": [flip[2], keep[2]],
                         "dtype": ["bfloat16"] * 2, "check": ["ok"] * 2, f"{kernel}_ms": [0.022, 0.010],
                         "cublas+inductor_norm_ms": [0.020, 0.015], "forward_fused_ms": [0.014, 0.007],
                         "repeats": [3, 3]})
    csv = tmp_path / "training.csv"
    rows.to_csv(csv, index=False)
    argv = ("--kernel", kernel, "--csv", csv, "--gpu", GPU, "--registry", tmp_path)

    refused = run_script(*argv)
    assert refused.returncode != 0 and "pass --training" in refused.stderr
    assert _entries(registry_file) == before

    result = run_script("--training", *argv)
    assert result.returncode == 0, result.stderr
    assert "65536x128x128 bfloat16 training: - -> unfused" in result.stdout
    after = _entries(registry_file)
    assert after[flip][registry.TRAINING_DISPATCH]["choice"] == "unfused"
    assert after[keep][registry.TRAINING_DISPATCH]["choice"] == "fused"
    for key, entry in after.items():
        assert {k: v for k, v in entry.items() if k != registry.TRAINING_DISPATCH} == before[key], key

    refused = run_script("--training", "--kernel", "matmul_layernorm_split_n", "--csv", csv, "--gpu", GPU,
                         "--registry", tmp_path)
    assert refused.returncode != 0 and "only matmul_layernorm and matmul_rmsnorm" in refused.stderr

    forward = tmp_path / "forward.csv"
    rows.drop(columns="forward_fused_ms").to_csv(forward, index=False)
    refused = run_script("--training", "--kernel", kernel, "--csv", forward, "--gpu", GPU, "--registry", tmp_path)
    assert refused.returncode != 0 and "not a table of bench/postnorm_training_forward.py" in refused.stderr


def test_refuses_a_kernel_without_a_dispatcher_and_a_wrong_gpu(tmp_path, run, run_script):
    csv = tmp_path / "bench.csv"
    pd.DataFrame({"M": [1], "K": [1], "N": [1], "dtype": ["bfloat16"], "matmul_ms": [1.0]}).to_csv(csv)
    result = run(csv, tmp_path, "matmul")
    assert result.returncode != 0 and "no dispatcher" in result.stderr
    _copy_registry(tmp_path, KERNEL)
    pd.DataFrame({"M": [262144], "K": [512], "N": [512], "dtype": ["bfloat16"], f"{KERNEL}_ms": [1.0],
                  "cublas+inductor_norm_ms": [1.0]}).to_csv(csv, index=False)
    result = run_script("--kernel", KERNEL, "--csv", csv, "--registry", tmp_path)
    assert result.returncode != 0 and f"GPU keys there: {GPU}" in result.stderr  # the CSV's folder is no GPU key


def test_an_unknown_kernel_is_one_line_in_a_separate_process(tmp_path):
    """As a user runs it: an unknown name exits non-zero with one line, no traceback."""
    csv = tmp_path / "bench.csv"
    pd.DataFrame({"M": [1], "K": [1], "N": [1], "dtype": ["bfloat16"], "matmul_ms": [1.0]}).to_csv(csv)
    result = run_bench_script("dispatch_from_bench", "--kernel", "foo", "--csv", csv, "--registry", tmp_path)
    assert result.returncode != 0 and "unknown kernel 'foo'" in result.stderr and "Traceback" not in result.stderr


def test_refuses_a_csv_of_another_kernel(tmp_path, run):
    csv = tmp_path / "other.csv"
    pd.DataFrame({"M": [1], "K": [1], "N": [1], "dtype": ["bfloat16"], "cublas+inductor_norm_ms": [1.0]}).to_csv(csv)
    result = run(csv, tmp_path)
    assert result.returncode != 0 and f"{KERNEL}_ms" in result.stderr


# Each dispatching op whose benchmark times what its dispatcher compares: the workloads its
# benchmark files are named after, and how many registry rows have a benchmark newer than their
# entry (the whole table but for entries re-tuned after their row was last measured).
BENCHMARKED = {
    "matmul_layernorm_split_n": (("postnorm_split_n",), 10),
    "matmul_rmsnorm_split_n": (("postnorm_split_n",), 10),
    "matmul_layernorm": (("postnorm_fullrow",), 16),
    "matmul_rmsnorm": (("postnorm_fullrow",), 16),
    "rmsnorm_matmul": (("prenorm_rmsnorm",), 30),
    # the 12 K >= 1024 rows (M = 65536, 131072, 524288) and the training table's 524288x512x512
    "rmsnorm_matmul_given_rstd": (("prenorm_rmsnorm", "training"), 13),
}


@pytest.mark.parametrize("kernel", sorted(BENCHMARKED))
def test_committed_records_are_those_of_the_newest_benchmark(kernel):
    """The committed registry's decisions are the rule applied to the newest committed benchmark
    of each row (its op's one table of the workload), wherever that
    benchmark ran after the entry was tuned; an entry re-tuned since keeps its tuning's decision.
    After re-running a benchmark, re-derive with the script (oldest file first)."""
    workloads, expected_rows = BENCHMARKED[kernel]
    files = [REPO / "bench" / "results" / GPU / f"{kernel}_{workload}.csv" for workload in workloads]
    assert _newest_records_checked(kernel, files, "dispatch") == expected_rows, kernel


# The full-row ops' training decisions (bench/postnorm_training_forward.py, dispatch_from_bench
# --training): every row of the full-row table. An entry re-tuned after the training benchmark
# ran keeps the record measured with its previous config (tuning.carried_training_record); none
# does on 2026-12-04.
TRAINING_BENCHMARKED = {"matmul_layernorm": 16, "matmul_rmsnorm": 16}


@pytest.mark.parametrize("kernel", sorted(TRAINING_BENCHMARKED))
def test_committed_training_records_are_those_of_the_newest_training_benchmark(kernel):
    """As above, for the ``dispatch_training`` records and the training-forward tables; an entry
    re-tuned since holds the record carried from the config that benchmark timed."""
    files = [REPO / "bench" / "results" / GPU / f"{kernel}_training_forward_postnorm_fullrow.csv"]
    checked = _newest_records_checked(kernel, files, registry.TRAINING_DISPATCH, carried=True)
    assert checked == TRAINING_BENCHMARKED[kernel], kernel


def _newest_records_checked(kernel: str, files: list[Path], field: str, carried: bool = False) -> int:
    """How many committed entries of ``kernel`` hold in ``field`` the record of the newest of
    the benchmark ``files`` that ran after they were tuned (asserted for each). ``carried``:
    also an entry tuned after that benchmark whose record is marked as measured with the
    config it replaced (``registry.MEASURED_CONFIG``, at or before the benchmark)."""
    assert files, kernel
    committed = _entries(REPO / "configs" / GPU / f"{kernel}.json")
    newest = {}  # (M, K, N, dtype) -> (date, expected record, file)
    for csv in sorted(files):
        for row in decisions(pd.read_csv(csv), kernel).itertuples(index=False):
            date = results.timestamp(row.measured_at)
            assert date is not None, csv  # every row records when it ran
            key = (row.M, row.K, row.N, row.dtype)
            if row.record is not None and (key not in newest or date > newest[key][0]):
                newest[key] = (date, row.record, csv.name)
    checked = 0
    for key, (date, expected, name) in newest.items():
        entry = committed.get(key)
        if entry is None:
            continue
        tuned_at = results.timestamp(entry.get("tuned_at"))
        if tuned_at is not None and tuned_at > date:
            measured = results.timestamp(entry.get(field, {}).get(registry.MEASURED_CONFIG))
            if not (carried and measured is not None and measured <= date):
                continue
        record = entry[field]
        assert {k: record.get(k) for k in expected} == expected, (kernel, key, name)
        checked += 1
    return checked


def _h200_entries(kernel: str) -> list[dict]:
    return json.loads((REPO / "configs" / "nvidia_h200_sm90" / f"{kernel}.json").read_text())["entries"]


def _count(kernel: str, record: str = "dispatch", choice: str = "fused", unfused: str | None = None) -> int:
    """How many of the kernel's H200 entries record ``choice`` (and, if given, that unfused pipeline)."""
    return sum(1 for e in _h200_entries(kernel)
               if (e.get(record) or {}).get("choice") == choice
               and (unfused is None or (e.get(record) or {}).get("unfused") == unfused))


def test_the_readme_ops_table_counts_are_the_committed_registrys():
    """The ops table's hand-written counts of dispatch decisions (outside the generated block)
    follow the committed registry: a re-bench that flips a decision must update the README."""
    readme = (REPO / "README.md").read_text()
    rows = {k: len(_h200_entries(k)) for k in ("rmsnorm_matmul", "matmul_layernorm", "matmul_rmsnorm",
                                                  "matmul_layernorm_split_n", "matmul_rmsnorm_split_n",
                                                  "matmul_rmsnorm_matmul")}
    split_n = ("matmul_layernorm_split_n", "matmul_rmsnorm_split_n")
    split_n_fused = sum(_count(k) for k in split_n)
    split_n_liger = sum(_count(k, choice="unfused", unfused="cublas+liger_norm") for k in split_n)
    claims = {
        f"({_count('rmsnorm_matmul')} of the {rows['rmsnorm_matmul']} tuned H200 rows)": "rmsnorm_matmul",
        f"fused in training at {_count('matmul_layernorm', 'dispatch_training')} of {rows['matmul_layernorm']} "
        f"LayerNorm and {_count('matmul_rmsnorm', 'dispatch_training')} of {rows['matmul_rmsnorm']} RMSNorm rows":
            "full-row training",
        f"({split_n_fused or 'none'} of {sum(rows[k] for k in split_n)} tuned rows)": "split-N fused",
        f"(on the H200, {split_n_liger} of the {sum(rows[k] for k in split_n)} rows": "split-N on Liger",
        f"(on the H200, {_count('matmul_rmsnorm_matmul')} of {rows['matmul_rmsnorm_matmul']} rows":
            "matmul_rmsnorm_matmul",
    }
    missing = [f"{what}: {text!r}" for text, what in claims.items() if text not in readme]
    assert not missing, "README.md's ops table disagrees with configs/nvidia_h200_sm90:\n" + "\n".join(missing)
