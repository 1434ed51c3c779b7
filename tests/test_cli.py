"""Smoke tests of the command line (CPU: no timings, no tuning)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import helion
import re

import pandas as pd
import pytest

from helion_kernels import registry
from helion_kernels.cli import main
from helion_kernels.spec import Shape

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def workload_registry(registry_dir):
    shutil.copy(REPO / "configs" / "workloads" / "prenorm_rmsnorm.csv", registry_dir / "workloads")
    return registry_dir


def test_list(capsys, workload_registry):
    registry.save_entry("rmsnorm_matmul", "some_gpu_sm90",
                        registry.Entry(Shape(65536, 256, 256), "bfloat16", helion.Config(block_sizes=[64, 64, 64])))
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "rmsnorm_matmul" in out and re.search(r"prenorm_rmsnorm +30 rows \(gemm\)", out)
    assert re.search(r"some_gpu_sm90 +rmsnorm_matmul +1 entry \(all yours\)\n", out)


def test_list_counts_the_user_and_shipped_layers(capsys, workload_registry, monkeypatch, tmp_path_factory):
    """A user entry that replaces a shipped key and one that adds a key: 3 entries in all, 2 of
    them the user's, 2 shipped; a GPU only the user has; a kernel only shipped; a file named after
    no op (a typo, an op's former name) is named as ignored; one corrupt file does not stop the
    listing."""
    shipped = tmp_path_factory.mktemp("shipped")
    monkeypatch.setattr(registry, "shipped_dir", lambda: shipped)
    cfg = helion.Config(block_sizes=[64, 64, 64])
    user = workload_registry
    saves = ((shipped, "some_gpu_sm90", "rmsnorm_matmul", (64, 128)), (shipped, "some_gpu_sm90", "matmul", (64,)),
             (user, "some_gpu_sm90", "rmsnorm_matmul", (64, 256)), (user, "a_longer_gpu_name_80gb_hbm3_sm90", "matmul", (64,)))
    for root, gpu, kernel, ms in saves:
        monkeypatch.setenv("HELION_KERNELS_CONFIG_DIR", str(root))
        for m in ms:
            registry.save_entry(kernel, gpu, registry.Entry(Shape(m, 64, 64), "bfloat16", cfg))
    (user / "some_gpu_sm90" / "matmull.json").write_text("{}")
    (user / "some_gpu_sm90" / "matmul_layernorm_row_sweep.json").write_text("{}")
    (user / "some_gpu_sm90" / "matmul_rmsnorm.json").write_text("[]")
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"some_gpu_sm90 +rmsnorm_matmul +3 entries \(2 yours, 1 replacing shipped ones; 2 shipped\)",
                     out), out
    assert re.search(r"some_gpu_sm90 +matmul +1 entry \(shipped\)", out), out
    assert re.search(r"a_longer_gpu_name_80gb_hbm3_sm90 matmul +1 entry \(all yours\)", out), out
    assert re.search(r"some_gpu_sm90 +matmull.json: no op of this name; ignored", out), out
    assert re.search(r"matmul_layernorm_row_sweep.json: no op of this name; its op is now matmul_layernorm_split_n", out)
    assert re.search(r"some_gpu_sm90 +matmul_rmsnorm +unusable: .*matmul_rmsnorm.json is corrupt or incomplete "
                     r"\(TypeError: the file holds a JSON list, not a registry object\).*removing it loses", out), out
    assert "git checkout" not in out  # that hint is for the shipped registry of a checkout


def test_a_config_dir_that_is_a_file_is_one_clear_error(capsys, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("HELION_KERNELS_CONFIG_DIR", str(tmp_path / "file"))
    assert main(["list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("helion-kernels: error: $HELION_KERNELS_CONFIG_DIR") and "Traceback" not in err


def test_list_reports_a_bad_table_and_goes_on(capsys, workload_registry):
    (workload_registry / "workloads" / "bad.csv").write_text("M,K,N\n64,100,abc\n")
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"bad +unusable \(gemm\): .*bad.csv: M, K, N must be positive integers", out)
    assert re.search(r"prenorm_rmsnorm +30 rows \(gemm\)", out)


def test_list_names_a_user_table_that_replaces_a_shipped_one(capsys, workload_registry):
    """A user table named like a shipped one is read instead of it: `list` says so (a plain copy
    of the shipped table changes nothing and is not marked)."""
    assert main(["list"]) == 0
    assert re.search(r"prenorm_rmsnorm +30 rows \(gemm\)\n", capsys.readouterr().out)
    (workload_registry / "workloads" / "prenorm_rmsnorm.csv").write_text("M,K,N\n64,128,256\n")
    assert main(["list"]) == 0
    assert re.search(r"prenorm_rmsnorm +1 rows \(gemm, your table in place of the shipped one\)",
                     capsys.readouterr().out)


def test_a_config_dir_with_a_tilde_is_under_home(monkeypatch, tmp_path):
    """A quoted ``~/...`` (the shell did not expand it) still means the home folder."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HELION_KERNELS_CONFIG_DIR", "~/cfg")
    assert registry.user_dir() == tmp_path / "cfg"


@pytest.mark.ref_mode  # the no-GPU behaviour: CPU session only
def test_bench_without_gpu_checks_configs(capsys, workload_registry):
    cfg = helion.Config(block_sizes=[64, 128, 128, 64], num_warps=8, num_stages=3)
    registry.save_entry("rmsnorm_matmul", "some_gpu_sm90",
                        registry.Entry(Shape(65536, 256, 256), "bfloat16", cfg, {"latency_ms": 0.02}))
    rc = main(["bench", "--kernel", "rmsnorm_matmul", "--workload", "prenorm_rmsnorm",
               "--where", "M == 65536 and K == 256"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "No CUDA GPU found: nothing is timed or written" in out
    assert "exact" in out and re.search(r"nearest +65536x256x256", out), out
    assert "3 of 3 configs compile" in out


@pytest.mark.ref_mode  # the no-GPU behaviour: CPU session only
def test_bench_without_gpu_on_the_committed_registry(capsys):
    """The README's main job on a CPU machine: every committed config compiles for its
    shape, and the committed GPU results are printed."""
    assert "nvidia_h200_sm90" in registry.known_gpus()
    for kernel in ("rmsnorm_matmul", "matmul"):  # reported on the GPUs that hold entries of the kernel
        n = 10 * sum(bool(registry.entries_for(kernel, gpu)) for gpu in registry.known_gpus())
        rc = main(["bench", "--kernel", kernel, "--workload", "prenorm_rmsnorm", "--where", "M == 65536"])
        out = capsys.readouterr().out
        assert rc == 0, out
        assert f"{n} of {n} configs compile" in out
        assert "FAILED" not in out
    rc = main(["bench", "--kernel", "rmsnorm_matmul", "--workload", "prenorm_rmsnorm", "--where", "M == 524288 and K == 256"])
    out = capsys.readouterr().out
    table = pd.read_csv(REPO / "bench" / "results" / "nvidia_h200_sm90" / "rmsnorm_matmul_prenorm_rmsnorm.csv")
    row = table.query("M == 524288 and K == 256 and N == 256").iloc[0]
    assert rc == 0 and "Committed GPU results (bench/results/nvidia_h200_sm90/rmsnorm_matmul_prenorm_rmsnorm.csv" in out
    assert re.search(rf"524288 +256 +256 .* {row.rmsnorm_matmul_ms:.4g} ", out), out  # the row's committed time
    assert len(out.splitlines()) <= 60


@pytest.mark.ref_mode  # the no-GPU behaviour: CPU session only
def test_bench_without_gpu_prints_the_selected_committed_rows(capsys):
    main(["bench", "--kernel", "rmsnorm_matmul", "--workload", "prenorm_rmsnorm", "--where", "M == 65536 and K == 1024"])
    out = capsys.readouterr().out
    assert re.search(r"65536 +1024 +512 .* \d{4}-\d\d-\d\d", out) and not re.search(r"65536 +256 +256", out)
    main(["bench", "--kernel", "rmsnorm_matmul_backward", "--workload", "prenorm_rmsnorm", "--where", "M == 65536 and K == 1024"])
    out = capsys.readouterr().out
    assert "No committed GPU results of rmsnorm_matmul_backward" in " ".join(out.split())


@pytest.mark.ref_mode  # the no-GPU behaviour: CPU session only
def test_bench_reports_a_config_that_does_not_compile(capsys, workload_registry):
    bad = helion.Config(block_sizes=[64])  # wrong number of block sizes for this kernel
    registry.save_entry("matmul", "g_sm90", registry.Entry(Shape(65536, 256, 256), "bfloat16", bad))
    rc = main(["bench", "--kernel", "matmul", "--workload", "prenorm_rmsnorm", "--where", "M == 65536 and K == 256 and N == 256"])
    out = capsys.readouterr().out
    assert rc == 1 and "FAILED" in out and "0 of 1 configs compile" in out


@pytest.mark.ref_mode  # the no-GPU behaviour: CPU session only
def test_autotune_needs_a_gpu(capsys):
    assert main(["autotune", "--kernel", "rmsnorm_matmul", "--shape", "64,64,64"]) == 2
    assert "autotuning times kernels on a CUDA GPU and none was found" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["bench", "--kernel", "matmul", "--workload", "nope"], "unknown gemm workload 'nope'"),
    (["bench", "--kernel", "matmul", "--workload", "prenorm_rmsnorm", "--where", "M >"], "bad --where"),
])
def test_errors_are_one_line(capsys, argv, message, workload_registry):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("helion-kernels bench: error:") and message in err


@pytest.mark.parametrize("value", ["abc", "0", "-1", "1.5"])
def test_gpus_must_be_a_count_or_all(capsys, value):
    """Checked when the arguments are read, before anything asks for a GPU."""
    with pytest.raises(SystemExit) as exc:
        main(["autotune", "--kernel", "matmul", "--shape", "64,64,64", "--gpus", value])
    assert exc.value.code == 2 and "--gpus: must be a positive integer or 'all'" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "x", "-2"])
def test_repeats_must_be_a_positive_count(capsys, value):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--kernel", "matmul", "--workload", "gemm", "--repeats", value])
    assert exc.value.code == 2 and "--repeats: must be a positive integer" in capsys.readouterr().err


def test_unknown_kernel_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--kernel", "nope", "--workload", "x"])
    assert exc.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err


def test_python_dash_m_entry_point():
    out = subprocess.run([sys.executable, "-m", "helion_kernels", "list"], capture_output=True, text=True,
                         check=True, timeout=300).stdout
    assert "kernels (op = registry file = --kernel):" in out and "rmsnorm_matmul" in out


@pytest.mark.ref_mode  # the no-GPU behaviour: CPU session only
def test_attention_bench_without_gpu_checks_configs(capsys):
    """flash_norm_attention has its own workloads and (H, D) registry keys; on a CPU the
    bench checks that each (H, D)'s config generates code and prints committed results."""
    rc = main(["bench", "--kernel", "flash_norm_attention", "--workload", "flash_norm_attention"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "No CUDA GPU found" in out and "FAILED" not in out
    # the H200's committed row (a gpu column and tuned_at appear once another GPU has entries)
    assert re.search(r"\n +8 +128 +3000 +(nvidia_h200_sm90 +)?exact +(\S+ +)?dynamic +ok +[\d.]+ +[\d.]+", out), out
    assert "Committed GPU results (bench/results/nvidia_h200_sm90/flash_norm_attention_flash_norm_attention.csv" in out


def test_attention_autotune_takes_workload_rows_not_shapes(capsys):
    assert main(["autotune", "--kernel", "flash_norm_attention", "--shape", "1,2,3"]) == 2
    assert "not --shape" in capsys.readouterr().err
    assert main(["bench", "--kernel", "flash_norm_attention", "--workload", "prenorm_rmsnorm"]) == 2
    assert "unknown attention workload 'prenorm_rmsnorm'" in (err := capsys.readouterr().err)
    assert "'prenorm_rmsnorm' is a gemm workload, for the GEMM-shaped kernels" in err
    assert main(["bench", "--kernel", "matmul", "--workload", "flash_norm_attention"]) == 2
    assert "'flash_norm_attention' is an attention workload (--kernel flash_norm_attention)" in capsys.readouterr().err


def test_deprecated_name_warns_where_a_user_sees_it(capsys):
    """Old --kernel names still work, with a one-line note on stderr (not a warning that
    prints a line of cli.py), and are then handled as the new name."""
    assert main(["bench", "--kernel", "matmul_layernorm_row_sweep", "--workload", "nope"]) == 2
    err = capsys.readouterr().err
    assert "note: kernel name 'matmul_layernorm_row_sweep' is deprecated; it is now 'matmul_layernorm_split_n'" in err
    assert "cli.py" not in err
    assert "unknown gemm workload 'nope'" in err


def test_bad_where_lists_the_columns(capsys, workload_registry):
    assert main(["bench", "--kernel", "matmul", "--workload", "prenorm_rmsnorm", "--where", "Q == 1"]) == 2
    assert "(columns: M, K, N)" in capsys.readouterr().err


def test_argument_errors_come_before_helion_is_imported():
    """A mistyped workload is answered without importing Helion (seconds)."""
    code = ("import sys; from helion_kernels.cli import main; rc = main(['bench', '--kernel', 'matmul', "
            "'--workload', 'nope']); print(rc, 'helion' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300).stdout
    assert out.split() == ["2", "False"]


@pytest.mark.ref_mode  # the no-GPU behaviour: CPU session only
def test_cpu_report_says_what_a_full_row_op_runs(capsys):
    rc = main(["bench", "--kernel", "matmul_layernorm", "--workload", "postnorm_split_n", "--where", "N >= 2048"])
    out = capsys.readouterr().out
    assert rc == 0 and re.search(r"262144 +512 +4096 .* unfused \(N > 2048\) +ok", out)
    assert max(len(line) for line in out.splitlines()) <= 120


@pytest.mark.ref_mode  # the no-GPU behaviour: CPU session only
def test_cpu_report_names_a_training_decision_apart(capsys):
    """The committed registry's full-row LayerNorm at 65536x256x256: fused in the forward
    benchmark, unfused once the kernel also writes the norm's input (its training record)."""
    rc = main(["bench", "--kernel", "matmul_layernorm", "--workload", "postnorm_fullrow", "--where",
               "M == 65536 and K == 256 and N == 256"])
    out = capsys.readouterr().out
    assert rc == 0 and re.search(r"65536 +256 +256 .* fused; training: unfused +ok", out)
    assert max(len(line) for line in out.splitlines()) <= 120


@pytest.mark.ref_mode  # the no-GPU behaviour: CPU session only
def test_cpu_report_marks_a_training_decision_carried_over_a_re_tune(capsys, registry_dir):
    """The shipped full-row LayerNorm entry at 262144x128x512 (forward fused, training measured
    unfused), re-tuned after its training benchmark: the report shows the training record carried
    from the replaced config, marked with a star and explained."""
    from helion_kernels.tuning import carried_training_record

    shutil.copy(REPO / "configs" / "workloads" / "postnorm_fullrow.csv", registry_dir / "workloads")
    gpu, shape = "nvidia_h200_sm90", Shape(262144, 128, 512)
    shipped = registry.load_entries(REPO / "configs" / gpu / "matmul_layernorm.json")[(*shape, "bfloat16")]
    assert shipped.meta["dispatch"]["choice"] == "fused"
    assert shipped.meta[registry.TRAINING_DISPATCH]["choice"] == "unfused"
    meta = {**shipped.meta, "tuned_at": "2030-01-01T00:00:00+00:00", **carried_training_record(shipped)}
    registry.save_entry("matmul_layernorm", gpu, registry.Entry(shape, "bfloat16", shipped.config, meta))
    rc = main(["bench", "--kernel", "matmul_layernorm", "--workload", "postnorm_fullrow", "--where",
               "M == 262144 and K == 128 and N == 512"])
    out = capsys.readouterr().out
    assert rc == 0 and re.search(r"262144 +128 +512 .* fused; training: unfused\* +ok", out), out
    assert "*: measured with the config the entry had before its last re-tune" in " ".join(out.split())
    assert max(len(line) for line in out.splitlines()) <= 120


@pytest.mark.ref_mode  # the no-GPU behaviour: CPU session only
def test_committed_rows_re_tuned_or_re_decided_since_are_starred(registry_dir):
    """A committed result row whose exact registry entry is newer than the row (its times are not
    the shipped config's), or now records another path than the row's ``dispatch``, is starred;
    older entries, rows without entries and rows without a shape are not."""
    from helion_kernels.results import _stale
    from helion_kernels.techniques import get_spec

    spec = get_spec("matmul_layernorm_split_n")
    liger = {"choice": "unfused", "unfused": "cublas+liger_norm", "fused_ms": 2.0, "unfused_ms": 1.0}
    compiled = {**liger, "unfused": "cublas+inductor_norm"}
    for n, tuned_at, record in ((64, "2026-12-01T22:43:30+00:00", compiled), (128, "2026-11-29T10:00:00+00:00", compiled),
                                (512, "2026-11-29T10:00:00+00:00", liger)):
        registry.save_entry(spec.name, "g_sm90", registry.Entry(Shape(64, 32, n), "bfloat16", {"block_sizes": [16]},
                                                                 {"tuned_at": tuned_at, "dispatch": record}))
    df = pd.DataFrame({"M": 64, "K": 32, "N": [64, 128, 512, 1024], "dtype": "bfloat16", "dispatch": "unfused"})
    dates = pd.to_datetime(pd.Series(["2026-11-30T01:52:54+00:00"] * 4), utc=True)
    assert _stale(df, dates, spec, "g_sm90") == [True, False, True, False]
    later = pd.to_datetime(pd.Series(["2026-12-01T23:00:00+01:00"] * 4), utc=True)  # 22:00 UTC: times, not strings
    assert _stale(df, later, spec, "g_sm90") == [True, False, True, False]
    assert _stale(df.drop(columns="dispatch"), dates, spec, "g_sm90") == [True, False, False, False]
    assert _stale(df.drop(columns="M"), dates, spec, "g_sm90") == [False] * 4


def test_committed_rows_follow_the_table():
    """The CPU report's committed columns: one row per shape of the op's one table, the kernel's
    time and the fastest unfused pipeline's, and their ratio."""
    from helion_kernels.results import committed
    from helion_kernels.techniques import get_spec

    table = pd.read_csv(REPO / "bench" / "results" / "nvidia_h200_sm90" / "rmsnorm_matmul_prenorm_rmsnorm.csv")
    found = committed(get_spec("rmsnorm_matmul"), "prenorm_rmsnorm", "nvidia_h200_sm90")
    assert len(found) == len(table) == 30 and list(found.M) == list(table.M)
    assert (found.fused_ms == table.rmsnorm_matmul_ms).all()
    assert found.best_unfused_ms.le(table["cublas+inductor_norm_ms"]).all()
    assert found.speedup.round(6).equals((found.best_unfused_ms / found.fused_ms).round(6))
    assert committed(get_spec("rmsnorm_matmul"), "no_such_workload", "nvidia_h200_sm90") is None


def test_time_limit_becomes_the_sweeps_deadline_and_is_reported(capsys, monkeypatch, registry_dir):
    """``--time-limit S``: the sweep's options carry ``deadline`` = the command's start + S; the
    summary counts the keys the limit left for a rerun and the command exits 3; a limit that
    cannot hold one shape is refused (the sweep itself is faked: no GPU here)."""
    import time

    import torch

    from helion_kernels import tuning

    seen = {}

    def fake_tune(spec, problems, dtype, options, device, gpus):
        seen["options"] = options
        return [tuning.TuneResult(Shape(1, 2, 3), "tuned", 1.0, ""),
                tuning.TuneResult(Shape(4, 5, 6), "not started", 0.0, "late")]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(tuning, "tune", fake_tune)
    monkeypatch.setattr(registry, "gpu_key", lambda device=None: "test_gpu_sm90")
    # the CLI sets Helion's cache folder in a checkout (setdefault): set here, it is restored after
    monkeypatch.setenv("HELION_CACHE_DIR", str(registry_dir / "helion_cache"))
    t0 = time.time()
    assert main(["autotune", "--kernel", "matmul", "--shape", "64,64,64", "--time-limit", "600"]) == 3
    assert t0 + 600 <= seen["options"].deadline <= time.time() + 600
    assert "1 tuned, 0 skipped, 1 not started (--time-limit; run the command again), 0 failed" in capsys.readouterr().out
    seen.clear()
    need = 60 + tuning.OVERSHOOT_SECONDS  # the default budget's
    assert main(["autotune", "--kernel", "matmul", "--shape", "64,64,64", "--time-limit", str(need - 1)]) == 2
    assert not seen and f"--time-limit {need - 1} s leaves no time for one shape" in capsys.readouterr().err
    assert main(["autotune", "--kernel", "matmul", "--shape", "64,64,64", "--time-limit", str(need)]) == 3
    main(["autotune", "--kernel", "matmul", "--shape", "64,64,64"])
    assert seen["options"].deadline is None


def test_time_limit_help_and_readme_state_the_overshoot(capsys):
    from helion_kernels import tuning

    with pytest.raises(SystemExit):
        main(["autotune", "--help"])
    assert f"budget + {tuning.OVERSHOOT_SECONDS} s" in " ".join(capsys.readouterr().out.split())
    assert f"budget + {tuning.OVERSHOOT_SECONDS} s" in " ".join((REPO / "README.md").read_text().split())
