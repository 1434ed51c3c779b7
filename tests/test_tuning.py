"""Tuning logic that runs without a GPU (the tuning itself is exercised on the GPU)."""

from __future__ import annotations

from pathlib import Path

import helion
import pytest
import torch

from helion_kernels import registry, tuning
from helion_kernels.verify import verify_config
from helion_kernels.techniques import CATALOG, get_spec
from helion_kernels.spec import Shape

REPO = Path(__file__).resolve().parent.parent


def test_options_are_validated():
    with pytest.raises(ValueError, match="effort must be one of"):
        tuning.TuneOptions(effort="max")
    with pytest.raises(ValueError, match="budget_seconds must be positive"):
        tuning.TuneOptions(budget_seconds=0)


def test_tune_problem_refuses_cpu():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        tuning.tune_problem(get_spec("matmul"), Shape(8, 8, 8), torch.bfloat16, tuning.TuneOptions(), torch.device("cpu"))


def test_a_failing_shape_does_not_stop_the_sweep(monkeypatch):
    def fake(spec, shape, dtype, options, device, progress_bar=True):
        if shape.M == 2:
            raise RuntimeError("compile failed")
        return tuning.TuneResult(shape, "tuned", 0.1, "ok")

    monkeypatch.setattr(tuning, "tune_problem", fake)
    shapes = [Shape(1, 8, 8), Shape(2, 8, 8), Shape(3, 8, 8)]
    results = tuning.tune(get_spec("matmul"), shapes, torch.bfloat16, tuning.TuneOptions(), torch.device("cpu"))
    assert [r.status for r in results] == ["tuned", "failed", "tuned"]
    assert "RuntimeError: compile failed" in results[1].message


def test_a_bare_assert_is_reported_with_its_line(monkeypatch, capsys):
    """A failure without a message (an ``assert`` inside the autotuner) names the line that
    raised it, and the sweep prints the traceback."""
    def fake(spec, shape, dtype, options, device, progress_bar=True):
        raise AssertionError  # as a bare assert outside pytest's rewritten modules

    monkeypatch.setattr(tuning, "tune_problem", fake)
    results = tuning.tune(get_spec("matmul"), [Shape(2, 8, 8)], torch.bfloat16, tuning.TuneOptions(),
                          torch.device("cpu"))
    assert results[0].status == "failed"
    assert results[0].message.startswith("AssertionError at ") and "/tests/test_tuning.py:" in results[0].message
    assert results[0].message.endswith("(raise AssertionError  # as a bare assert outside pytest's rewritten modules)")
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_a_failed_search_keeps_the_best_seed():
    """Helion's search raising (an internal assert) leaves the best seed, which is then
    verified like any pick; with no seed that ran there is nothing to record."""
    seed = helion.Config(block_sizes=[64, 64, 32], num_warps=4)
    assert tuning.keep_seed(None, None, seed, 0.5, "AssertionError at x.py:1")
    with pytest.raises(RuntimeError, match=r"search failed \(AssertionError at x.py:1\) and no seed ran"):
        tuning.keep_seed(None, None, None, None, "AssertionError at x.py:1")
    picked = helion.Config(block_sizes=[128, 64, 32], num_warps=8)
    assert tuning.keep_seed(picked, 0.6, seed, 0.5, None)  # 1.2x slower than the seed
    assert not tuning.keep_seed(picked, 0.505, seed, 0.5, None)  # within the 2% margin
    assert not tuning.keep_seed(picked, 0.6, None, None, None)


def test_versions_name_what_decides_speed():
    assert set(tuning.versions()) == {"torch", "cuda", "triton", "helion"}


class _FakeBound:
    """Stands in for a compiled kernel: returns the reference, optionally spoiled."""

    def __init__(self, spec, spoil_call: int | None = None):
        self.spec, self.calls, self.spoil_call = spec, 0, spoil_call

    def __call__(self, *args):
        self.calls += 1
        (out,) = self.spec.reference(*args)
        if self.calls == self.spoil_call:
            out = out.clone()
            out[0, 0] += 1.0
        return out.to(args[0].dtype)


def test_verify_config_accepts_a_correct_kernel():
    spec = get_spec("matmul")
    err = verify_config(_FakeBound(spec), spec, Shape(16, 32, 8), torch.float32, torch.device("cpu"), seed=1)
    assert 0 <= err < 1e-6


@pytest.mark.parametrize("spoil_call,match", [(2, "changed between identical runs"), (7, "elements off by more")],
                         ids=["nondeterministic", "wrong_on_a_later_draw"])
def test_verify_config_rejects(spoil_call, match):
    from helion_kernels.verify import VerificationError

    spec = get_spec("matmul")
    with pytest.raises(VerificationError, match=match):
        verify_config(_FakeBound(spec, spoil_call), spec, Shape(16, 32, 8), torch.float32,
                             torch.device("cpu"), seed=1)


def test_accuracy_check_compares_summed_partials():
    """The producer of matmul_rmsnorm_matmul writes per-tile partials whose count depends on
    the tiling: candidates are compared after ``spec.compare_outputs`` (a row total)."""
    spec = get_spec("matmul_rmsnorm_matmul")
    args = spec.make_args(Shape(6, 16, 12), torch.float32, "cpu", 0)
    x, row_sumsq = spec.reference(*args)
    partials = torch.stack([(x[:, :8] ** 2).sum(1), (x[:, 8:] ** 2).sum(1)], dim=1)  # two N tiles
    tuning._accuracy_check((x, partials), (x, row_sumsq), spec.compare_outputs, torch.float32)
    with pytest.raises(AssertionError):
        tuning._accuracy_check((x, partials * 1.1), (x, row_sumsq), spec.compare_outputs, torch.float32)


@pytest.mark.parametrize("name", sorted(__import__("helion_kernels.techniques", fromlist=["CATALOG"]).CATALOG))
def test_tuning_settings_pickle(name):
    """Helion sends the accuracy hook and baseline to its benchmarking subprocesses by
    pickling them; an unpicklable hook fails every tuning run on the GPU."""
    import pickle

    from helion_kernels.techniques import get_spec
    from helion_kernels.tuning import TuneOptions, tuning_kernel

    spec = get_spec(name)
    kernel = tuning_kernel(spec, list(spec.seed_configs), torch.bfloat16, TuneOptions(), progress_bar=False,
                           n_args=2)
    pickle.dumps(kernel.settings.autotune_baseline_accuracy_check_fn)
    pickle.dumps(kernel.settings.autotune_baseline_fn)


def test_retune_before_keeps_only_entries_from_that_date_on():
    """``--retune-before`` makes a stopped re-tune resumable: entries tuned on or after the
    date are kept, older or undated ones re-tuned, missing ones tuned; ``--force`` re-tunes all."""
    import datetime

    from helion_kernels.registry import Entry
    from helion_kernels.spec import Shape
    from helion_kernels.tuning import TuneOptions

    def entry(tuned_at):
        return Entry(Shape(64, 64, 64), "bfloat16", {"block_sizes": [16, 16, 16]},
                     {} if tuned_at is None else {"tuned_at": tuned_at})

    day = datetime.date(2026, 12, 2)
    again = TuneOptions(retune_before=day)
    assert again.keeps(entry("2026-12-02T01:00:00+00:00")) and again.keeps(entry("2026-12-03T00:00:00+00:00"))
    assert not again.keeps(entry("2026-12-01T23:59:59+00:00")) and not again.keeps(entry(None))
    assert not again.keeps(None)
    assert TuneOptions().keeps(entry("2026-11-01T00:00:00+00:00")) and not TuneOptions().keeps(None)
    assert not TuneOptions(force=True).keeps(entry("2026-12-03T00:00:00+00:00"))
    with pytest.raises(ValueError, match="retune_before must be a datetime.date"):
        TuneOptions(retune_before="2026-12-02")


@pytest.mark.parametrize("argv,message", [
    (["--force", "--retune-before", "2026-12-02"], "not allowed with argument"),
    (["--retune-before", "12/02/2026"], "not a date (YYYY-MM-DD)"),
    (["--retune-before", "20261202"], "not a date (YYYY-MM-DD)"),  # ISO, but not the documented form
    (["--budget-seconds", "-5"], "must be a positive integer"),
])
def test_retune_before_argument_errors(capsys, argv, message):
    from helion_kernels.cli import _parser

    with pytest.raises(SystemExit):
        _parser().parse_args(["autotune", "--kernel", "matmul", "--shape", "64,64,64", *argv])
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("compiler_seeds", [True, False])
def test_compiler_seeds_option_reaches_helion(compiler_seeds):
    """``--no-compiler-seeds`` is Helion's ``disable_autotuner_heuristics``; the default keeps
    Helion's seeds, and the entry records which it was."""
    from helion_kernels.cli import _parser
    from helion_kernels.techniques import get_spec
    from helion_kernels.tuning import TuneOptions, entry_meta, tuning_kernel

    argv = ["autotune", "--kernel", "matmul", "--shape", "64,64,64"] + ([] if compiler_seeds else ["--no-compiler-seeds"])
    assert _parser().parse_args(argv).compiler_seeds is compiler_seeds
    options = TuneOptions(compiler_seeds=compiler_seeds)
    kernel = tuning_kernel(get_spec("matmul"), [], torch.bfloat16, options, progress_bar=False, n_args=2)
    assert kernel.settings.disable_autotuner_heuristics is (not compiler_seeds)
    assert entry_meta(1.0, 0.0, options, 1.0, None)["autotune"]["compiler_seeds"] is compiler_seeds


@pytest.mark.parametrize("name", sorted(__import__("helion_kernels.techniques", fromlist=["CATALOG"]).CATALOG))
def test_tuning_baseline_takes_the_kernels_bound_arguments(name):
    """Helion calls the baseline with the kernel's arguments after binding, defaults included
    (seen on the H200: every full-row tuning run failed with 'Custom baseline function failed'
    once the kernels gained optional trailing tensors). The hook must give the reference's
    outputs on them."""
    from helion_kernels.techniques import get_spec
    from helion_kernels.spec import AttentionRow, Shape
    from helion_kernels.tuning import TuneOptions, tuning_kernel

    spec = get_spec(name)
    problem = Shape(8, 32, 16) if spec.workload == "gemm" else AttentionRow(2, 2, 16, 8, 8, 0.5, 0)
    args = spec.make_args(problem, torch.float32, "cpu", 0)
    kernel = tuning_kernel(spec, [], torch.float32, TuneOptions(), progress_bar=False, n_args=len(args))
    got = kernel.settings.autotune_baseline_fn(*spec.kernel.normalize_args(*args))
    want = spec.reference(*args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_best_seed_skips_seeds_that_fail():
    """The fastest seed and its index; a seed that cannot compile or run is skipped."""
    from helion_kernels.tuning import best_seed

    class Bound:
        def set_config(self, config):
            self.config = config

    times = {"a": 2.0, "b": None, "c": 1.5}

    def timer(bound):
        if times[bound.config] is None:
            raise RuntimeError("out of shared memory")
        return times[bound.config]

    assert best_seed(Bound, ["a", "b", "c"], timer) == (1.5, 2)
    assert best_seed(Bound, ["b"], timer) == (None, None)


def test_search_counts_come_from_helions_hook():
    from helion.autotuner.metrics import AutotuneMetrics, _run_post_autotune_hooks

    from helion_kernels import tuning

    tuning._LAST_SEARCH.clear()
    _run_post_autotune_hooks(AutotuneMetrics(num_configs_tested=17, num_generations=2, num_compile_failures=2,
                                              num_accuracy_failures=1))
    assert tuning._LAST_SEARCH == {"configs_tested": 17, "generations": 2, "compile_failures": 2,
                                   "accuracy_failures": 1}


GEMM_OPS = [name for name, entry in CATALOG.items() if entry.workload == "gemm"]


@pytest.mark.triton_interpret  # code generation only
@pytest.mark.parametrize("name", GEMM_OPS)
def test_every_seed_generates_code_and_one_is_persistent(name):
    """Every hand-picked seed of a GEMM-shaped kernel is valid Helion at a workload-like bf16
    shape (a seed the autotuner had to drop would be a wasted start), and each kernel has a
    persistent tensor-descriptor seed: the GEMM core's fastest tiling on the H200 (issue table)."""
    spec = get_spec(name)
    args = spec.make_args(Shape(512, 512, 256), torch.bfloat16, "cpu", None)
    bound = spec.kernel.bind(args)
    persistent = 0
    for config in spec.seed_configs:
        code = bound.to_triton_code(spec.portable_config(config) if spec.portable_config else config)
        assert "@triton.jit" in code
        if config.config.get("pid_type") == "persistent_interleaved" and "tensor_descriptor" in str(config.config):
            persistent += 1
    assert persistent >= 1


def test_dispatch_needs_a_margin():
    """A tie, or a win smaller than the margin, keeps the unfused path."""
    assert tuning.dispatch_decision(1.0, 1.0, "x")["choice"] == "unfused"
    assert tuning.dispatch_decision(1.0, 1.01, "x")["choice"] == "unfused"
    assert tuning.dispatch_decision(1.0, tuning.DISPATCH_MARGIN, "x")["choice"] == "fused"
    assert tuning.dispatch_decision(1.0, 0.9, "x") == {"choice": "unfused", "fused_ms": 1.0, "unfused_ms": 0.9,
                                                       "unfused": "x", "margin": tuning.DISPATCH_MARGIN}


def test_dispatch_takes_an_alternative_unfused_pipeline_only_clearly_faster():
    """Liger's pipeline replaces cuBLAS + the compiled norm as the unfused path only where the
    compiled one took at least the margin longer; the fused kernel is then measured against
    the faster path; every pipeline's time is kept."""
    m = tuning.DISPATCH_MARGIN
    liger = tuning.dispatch_decision(1.0, 0.9 * m, "cublas+inductor_norm", {"cublas+liger_norm": 0.9})
    assert liger["unfused"] == "cublas+liger_norm" and liger["unfused_ms"] == 0.9 and liger["choice"] == "unfused"
    assert liger["unfused_timed_ms"] == {"cublas+inductor_norm": round(0.9 * m, 5), "cublas+liger_norm": 0.9}
    close = tuning.dispatch_decision(1.0, 0.91, "cublas+inductor_norm", {"cublas+liger_norm": 0.9})
    assert close["unfused"] == "cublas+inductor_norm" and close["unfused_ms"] == 0.91  # within the margin
    # the kernel must beat the faster unfused path: it beats the compiled norm's, not Liger's
    beaten = tuning.dispatch_decision(1.0, 1.5, "cublas+inductor_norm", {"cublas+liger_norm": 1.01})
    assert beaten["choice"] == "unfused" and beaten["unfused"] == "cublas+liger_norm"
    assert tuning.dispatch_decision(1.0, 1.5, "x", {"cublas+liger_norm": 1.3})["choice"] == "fused"
    assert "unfused_timed_ms" not in tuning.dispatch_decision(1.0, 1.5, "x", {})  # Liger not installed


def test_a_seed_replaces_the_search_pick_only_clearly_faster_and_different():
    from helion_kernels.tuning import SEED_MARGIN, _same_config, prefer_seed

    assert prefer_seed(1.06, 1.0, same=False)
    assert not prefer_seed(1.01, 1.0, same=False)  # within the noise of two timings
    assert not prefer_seed(1.5, 1.0, same=True)  # the pick is that seed
    assert not prefer_seed(1.5, None, same=False)  # no seed ran
    assert prefer_seed(SEED_MARGIN, 1.0, same=False)
    seed = helion.Config(block_sizes=[128, 256, 64], num_warps=8, indexing="tensor_descriptor")
    full = helion.Config(block_sizes=[128, 256, 64], num_warps=8, num_stages=3,
                         indexing=["tensor_descriptor"] * 3, pid_type="flat")
    assert _same_config(seed, full)
    assert not _same_config(seed, helion.Config(**{**full.config, "indexing": ["tensor_descriptor", "pointer", "pointer"]}))
    assert not _same_config(seed, helion.Config(**{**full.config, "num_warps": 4}))


def test_fit_seed_cuts_and_pads_per_access_lists():
    """A seed's ``indexing`` list is fitted to the kernel's length (4 memory accesses in
    matmul_rmsnorm_matmul's producer): cut from the 10 of the split-N kernel its registry
    entries came from, padded with its last value when short; a single string or a list that
    fits is left as it is. Unfitted, Helion's search could not encode the seed."""
    from helion.autotuner.config_generation import ConfigGeneration  # Helion 1.5 internals
    from helion.runtime.settings import RefMode

    spec = get_spec("matmul_rmsnorm_matmul")
    kernel = helion.kernel(spec.kernel.fn, static_shapes=True, ref_mode=RefMode.OFF)
    config_spec = kernel.bind(spec.make_args(Shape(64, 96, 256), torch.bfloat16, "cpu", None)).config_spec
    generation = ConfigGeneration(config_spec)
    base = {"block_sizes": [128, 64, 64], "num_warps": 4, "num_stages": 3}
    long = helion.Config(**base, indexing=["tensor_descriptor"] + ["pointer"] * 9)
    with pytest.raises(AssertionError):  # Helion's failure, which fit_seed avoids
        generation.encode_config(generation.flatten(long))
    fitted = tuning.fit_seed(config_spec, long)
    assert fitted.config["indexing"] == ["tensor_descriptor", "pointer", "pointer", "pointer"]
    assert {k: v for k, v in fitted.config.items() if k != "indexing"} == base
    generation.encode_config(generation.flatten(fitted))
    short = tuning.fit_seed(config_spec, helion.Config(**base, indexing=["pointer", "tensor_descriptor"]))
    assert short.config["indexing"] == ["pointer"] + ["tensor_descriptor"] * 3
    empty = tuning.fit_seed(config_spec, helion.Config(**base, indexing=[]))
    assert empty.config["indexing"] == ["pointer"] * 4  # Helion's default
    for fits in (helion.Config(**base, indexing="tensor_descriptor"), helion.Config(**base, indexing=["pointer"] * 4),
                 helion.Config(**base)):
        assert tuning.fit_seed(config_spec, fits) is fits


def test_fit_seed_pads_and_cuts_per_loop_lists_with_their_defaults():
    """A per-loop list shorter than the kernel's loops (the flattened seed's
    ``range_flattens=[True]`` for ``matmul``'s tile loop and k-loop) is padded with Helion's
    defaults, as its normalisation pads it; a longer one is cut; ``block_sizes`` has no default
    and stays as written. Unfitted, Helion's search dropped the seed ("Failed to transfer
    autotune seed config")."""
    from helion.autotuner.config_generation import ConfigGeneration  # Helion 1.5 internals

    config_spec = _matmul_config_spec()
    generation = ConfigGeneration(config_spec)
    short = helion.Config(block_sizes=[128, 256, 64], range_flattens=[True])
    with pytest.raises(AssertionError):  # Helion's failure, which fit_seed avoids
        generation.encode_config(generation.flatten(short))
    fitted = tuning.fit_seed(config_spec, short)
    assert fitted.config == {"block_sizes": [128, 256, 64], "range_flattens": [True, None]}
    generation.encode_config(generation.flatten(fitted))
    long = tuning.fit_seed(config_spec, helion.Config(block_sizes=[128, 256, 64], range_num_stages=[2, 3, 4]))
    assert long.config["range_num_stages"] == [2, 3]
    few_blocks = helion.Config(block_sizes=[128, 256])
    assert tuning.fit_seed(config_spec, few_blocks) is few_blocks


@pytest.mark.parametrize("name", GEMM_OPS)
def test_every_hand_picked_seed_enters_the_search(name):
    """Every hand-picked seed of a GEMM-shaped kernel, fitted as tuning fits it, is taken by
    Helion's search into its first population (``user_seed_flat_config_pairs``, what the search
    runs on ``autotune_seed_configs``): none is dropped with "Failed to transfer"."""
    from helion.autotuner.config_generation import ConfigGeneration  # Helion 1.5 internals
    from helion.runtime.settings import RefMode

    spec = get_spec(name)
    kernel = helion.kernel(spec.kernel.fn, static_shapes=True, ref_mode=RefMode.OFF)
    config_spec = kernel.bind(spec.make_args(Shape(512, 512, 256), torch.bfloat16, "cpu", None)).config_spec
    seeds = [config for config, _ in tuning.registry_seeds(config_spec, {}, (512, 512, 256), "bfloat16",
                                                           spec.seed_configs)]
    dropped: list[str] = []
    taken = ConfigGeneration(config_spec).user_seed_flat_config_pairs(seeds, dropped.append)
    assert not dropped and len(taken) == len(seeds)


@pytest.mark.triton_interpret  # a compiled mode: reference mode never autotunes
def test_a_kernel_called_without_a_config_fails_the_test_at_once():
    """conftest's guard: on a GPU, a kernel called without a config would autotune for minutes
    inside the test (what stalled the CUDA suite of 2026-12-02); under the guard it raises."""
    kernel = helion.kernel(get_spec("matmul").kernel.fn, static_shapes=True)
    a, b = torch.randn(32, 48), torch.randn(48, 16)
    with pytest.raises(RuntimeError, match="called without a config, so Helion would autotune it"):
        kernel(a, b)


def _matmul_config_spec():
    from helion.runtime.settings import RefMode

    spec = get_spec("matmul")
    kernel = helion.kernel(spec.kernel.fn, static_shapes=True, ref_mode=RefMode.OFF)
    return kernel.bind(spec.make_args(Shape(64, 96, 256), torch.bfloat16, "cpu", None)).config_spec


def test_registry_seeds_nearest_then_distinct_neighbours_then_hand_picked():
    """A search is seeded with the nearest entry's config, then up to ``neighbours`` configs of
    entries within distance 1 that are not seeds already (a config the search found at
    131072x256x512 beat the picks at three neighbouring shapes), then the hand-picked seeds:
    none twice, even written differently (sparse or with Helion's defaults filled in)."""
    from helion_kernels.registry import Entry

    config_spec = _matmul_config_spec()
    cfg = lambda **kw: helion.Config(**{"block_sizes": [64, 64, 32], "num_warps": 4, "num_stages": 3, **kw})
    hand = (cfg(num_warps=8), cfg(num_stages=4))
    hand_full = config_spec.normalized_config(hand[0])  # the same config as hand[0], written in full
    assert dict(hand_full.config) != dict(hand[0].config)
    entry = lambda m, k, n, c: Entry(Shape(m, k, n), "bfloat16", dict(c.config), {})
    entries = {e.key: e for e in (
        entry(1024, 512, 512, cfg(num_stages=2)),      # the key itself: nearest, first
        entry(1024, 256, 512, hand_full),               # distance 0.25, a hand-picked seed: skipped
        entry(2048, 512, 512, cfg(num_stages=2)),       # 0.5, the nearest's config again: skipped
        entry(1024, 1024, 512, cfg(num_stages=5)),      # 0.25: a neighbour
        entry(4096, 512, 512, cfg(block_sizes=[32, 64, 32])),  # 1.0: a neighbour
        entry(1024, 512, 1024, cfg(block_sizes=[64, 32, 32])),  # 1.0: past the limit of 2
        entry(1024, 512, 4096, cfg(block_sizes=[16, 16, 16])),  # 3.0: too far
    )}
    got = tuning.registry_seeds(config_spec, entries, Shape(1024, 512, 512), "bfloat16", hand, neighbours=2)
    assert [source for _, source in got] == ["entry 1024x512x512", "entry 1024x1024x512", "entry 4096x512x512",
                                             "hand-picked 0", "hand-picked 1"]
    assert [c.config["num_stages"] for c, _ in got][:3] == [2, 5, 3]
    assert len(tuning.registry_seeds(config_spec, entries, Shape(1024, 512, 512), "bfloat16", hand)) == 6
    # A key with no entry: the nearest entry first, never again as a neighbour.
    new_key = tuning.registry_seeds(config_spec, entries, Shape(1024, 512, 600), "bfloat16", ())
    assert [source for _, source in new_key][0] == "entry 1024x512x512"
    assert len({source for _, source in new_key}) == len(new_key)
    assert [dict(c.config) for c, _ in tuning.registry_seeds(config_spec, {}, Shape(8, 8, 8), "bfloat16", hand)] == [
        dict(h.config) for h in hand]


def test_registry_seeds_borrowed_after_the_nearest_and_never_twice():
    """Another kernel's entry with the same loops (``same_loops_as``) seeds the search right
    after the nearest entry, under its own source; a borrowed config equal to a seed already
    taken counts once."""
    from helion_kernels.registry import Entry

    config_spec = _matmul_config_spec()
    cfg = lambda **kw: helion.Config(**{"block_sizes": [64, 64, 32], "num_warps": 4, "num_stages": 3, **kw})
    entries = {(1024, 512, 512, "bfloat16"): Entry(Shape(1024, 512, 512), "bfloat16", dict(cfg().config), {})}
    borrowed = [(dict(cfg(num_stages=4).config), "entry 1024x512x512 of twin"), (cfg(), "entry 1024x512x512 of other")]
    got = tuning.registry_seeds(config_spec, entries, Shape(1024, 512, 512), "bfloat16", (cfg(num_warps=8),), borrowed)
    assert [source for _, source in got] == ["entry 1024x512x512", "entry 1024x512x512 of twin", "hand-picked 0"]
    assert got[1][0].config["num_stages"] == 4


def test_borrowed_seeds_the_twins_exact_entry_and_survive_a_corrupt_twin_file(tmp_path, monkeypatch):
    """The seeds borrowed for a kernel are its loop twins' entries at exactly the key and dtype;
    a twin's registry file that cannot be read is skipped with a warning, not an error."""
    from helion_kernels.registry import Entry

    monkeypatch.setenv("HELION_KERNELS_CONFIG_DIR", str(tmp_path))
    gpu, key = "some_gpu_sm90", Shape(1024, 512, 512)
    config = {"block_sizes": [64, 64, 32], "num_warps": 4, "num_stages": 3}
    for shape in (key, Shape(2048, 512, 512)):
        registry.save_entry("rmsnorm_matmul_given_rstd", gpu, Entry(shape, "bfloat16", config, {}))
    spec = get_spec("matmul")
    assert tuning.borrowed_seeds(spec, gpu, key, "bfloat16") == [(config, "entry 1024x512x512 of rmsnorm_matmul_given_rstd")]
    assert tuning.borrowed_seeds(spec, gpu, key, "float16") == []
    assert tuning.borrowed_seeds(spec, gpu, Shape(1024, 512, 256), "bfloat16") == []  # exact shapes only
    registry.registry_path("rmsnorm_matmul_given_rstd", gpu).write_text("{ half-written")
    with pytest.warns(UserWarning, match="not used as seeds"):
        assert tuning.borrowed_seeds(spec, gpu, key, "bfloat16") == []


def test_same_loops_as_is_declared_on_both_sides_and_the_configs_fit():
    """Each kernel named in a spec's ``same_loops_as`` names it back, and a config of either,
    fitted as a seed, is one Helion's search takes for the other (its encoding asserts on a
    list of the wrong length)."""
    from helion.autotuner.config_generation import ConfigGeneration  # Helion 1.5 internals
    from helion.runtime.settings import RefMode

    pairs = 0
    for name in CATALOG:
        spec = get_spec(name)
        for twin_name in spec.same_loops_as:
            twin = get_spec(twin_name)
            assert name in twin.same_loops_as, (name, twin_name)
            shape = Shape(256, 256, 256)
            config_spec = helion.kernel(spec.kernel.fn, static_shapes=True, ref_mode=RefMode.OFF).bind(
                spec.make_args(shape, torch.bfloat16, "cpu", None)).config_spec
            # the twin's hand-picked configs, and its committed H200 entries (full per-access lists)
            committed = registry.load_entries(REPO / "configs" / "nvidia_h200_sm90" / f"{twin_name}.json")
            configs = [twin.default_config, *twin.seed_configs,
                       *(helion.Config(**e.config) for e in list(committed.values())[:8])]
            assert len(configs) > len(twin.seed_configs) + 1 or not committed, twin_name  # none tuned yet
            seeds = [tuning.fit_seed(config_spec, c) for c in configs]
            dropped: list[str] = []
            ConfigGeneration(config_spec).user_seed_flat_config_pairs(seeds, dropped.append)
            assert not dropped, (name, twin_name, dropped)
            pairs += 1
    assert pairs >= 2  # matmul and rmsnorm_matmul_given_rstd, both ways


def test_registry_seeds_fit_an_entry_made_for_another_kernel():
    """The nearest entry's per-access lists are fitted to the kernel (10 indexing values of the
    split-N kernel cut to matmul_rmsnorm_matmul's 4)."""
    from helion.runtime.settings import RefMode

    from helion_kernels.registry import Entry

    spec = get_spec("matmul_rmsnorm_matmul")
    kernel = helion.kernel(spec.kernel.fn, static_shapes=True, ref_mode=RefMode.OFF)
    config_spec = kernel.bind(spec.make_args(Shape(64, 96, 256), torch.bfloat16, "cpu", None)).config_spec
    base = {"block_sizes": [128, 64, 64], "num_warps": 4, "num_stages": 3}
    long = helion.Config(**base, indexing=["tensor_descriptor"] + ["pointer"] * 9)
    entries = {(1024, 512, 512, "bfloat16"): Entry(Shape(1024, 512, 512), "bfloat16", dict(long.config), {})}
    (config, source), = tuning.registry_seeds(config_spec, entries, Shape(1024, 512, 512), "bfloat16")
    assert config.config["indexing"] == ["tensor_descriptor"] + ["pointer"] * 3 and source == "entry 1024x512x512"


@pytest.mark.triton_interpret  # code generation only
@pytest.mark.parametrize("name", ["matmul", "rmsnorm_matmul", "rmsnorm_matmul_given_rstd"])
def test_a_seed_flattens_the_persistent_tile_loop(name):
    """The pre-norm GEMMs are seeded with the persistent tilings whose tile loop is flattened
    into its k-loop(s): the one Helion's search found at 131072x256x512 on the H200 (rmsnorm_matmul
    fits the GEMM seeds to its row-block form) and, for the plain GEMM's loops, the N = 128 one
    found by a GEMM tiling A/B run (bench/NOTES.md)."""
    spec = get_spec(name)
    bound = spec.kernel.bind(spec.make_args(Shape(512, 512, 256), torch.bfloat16, "cpu", None))
    flattened = [c for c in spec.seed_configs if (c.config.get("range_flattens") or [None])[0]]
    assert len(flattened) == (1 if name == "rmsnorm_matmul" else 2)
    for config in flattened:
        assert "total_pids, _NUM_SM, flatten=True)" in bound.to_triton_code(config)


def test_a_key_starts_only_while_its_budget_and_the_overshoot_fit():
    """``deadline``: a key starts only while ``budget_seconds + OVERSHOOT_SECONDS`` remain."""
    import time

    need = 45 + tuning.OVERSHOOT_SECONDS
    assert tuning.TuneOptions(budget_seconds=45).too_late() is None
    assert tuning.TuneOptions(budget_seconds=45, deadline=time.time() + need + 30).too_late() is None
    late = tuning.TuneOptions(budget_seconds=45, deadline=time.time() + need - 30).too_late()
    assert late.startswith(f"{need - 30 - 1} s left") or late.startswith(f"{need - 30} s left"), late
    assert f"the 45 s budget + {tuning.OVERSHOOT_SECONDS} s" in late
    assert tuning.TuneOptions(deadline=time.time() - 5).too_late().startswith("0 s left")


def test_a_late_key_is_not_started_and_an_existing_one_still_skipped(monkeypatch, registry_dir):
    """Past the deadline ``tune_problem`` returns "not started" before it builds inputs (on a
    CPU-only machine: nothing here may touch CUDA); a key already in the registry is "skipped"."""
    import time

    from helion_kernels import registry

    monkeypatch.setattr(registry, "gpu_key", lambda device=None: "test_gpu_sm90")
    spec = get_spec("matmul")
    registry.save_entry("matmul", "test_gpu_sm90", registry.Entry(
        Shape(64, 64, 64), "bfloat16", helion.Config(block_sizes=[64, 64, 64])))
    options = tuning.TuneOptions(budget_seconds=10, deadline=time.time() + 1)
    cuda = torch.device("cuda")
    late = tuning.tune_problem(spec, Shape(128, 64, 64), torch.bfloat16, options, cuda)
    assert (late.status, late.seconds) == ("not started", 0.0) and "the same command tunes it" in late.message
    kept = tuning.tune_problem(spec, Shape(64, 64, 64), torch.bfloat16, options, cuda)
    assert kept.status == "skipped"


def test_a_retune_carries_the_training_record_marked_with_the_config_it_timed():
    """Tuning times the forward only: the replaced entry's training decision stays, marked as
    measured with that entry's config, or with the config it already names over a second
    re-tune; nothing is carried for a new key or an entry without one."""
    from helion_kernels import registry

    def entry(tuned_at, training=None):
        meta = {"tuned_at": tuned_at} | ({} if training is None else {registry.TRAINING_DISPATCH: training})
        return registry.Entry(Shape(64, 64, 64), "bfloat16", {"block_sizes": [64, 64, 64]}, meta=meta)

    record = {"choice": "unfused", "fused_ms": 0.24, "unfused_ms": 0.23, "source": "bench.csv"}
    first = "2026-12-02T01:02:19+00:00"
    carried = tuning.carried_training_record(entry(first, record))
    assert carried == {registry.TRAINING_DISPATCH: {**record, registry.MEASURED_CONFIG: first}}
    assert registry.MEASURED_CONFIG not in record  # the replaced entry's record is not changed
    # a second re-tune: still the config the benchmark timed, not the one in between
    between = entry("2026-12-04T15:43:26+00:00", carried[registry.TRAINING_DISPATCH])
    assert tuning.carried_training_record(between) == carried
    assert tuning.carried_training_record(None) == {}
    assert tuning.carried_training_record(entry(first)) == {}
