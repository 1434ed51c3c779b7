"""Autotuning a workload sweep, verifying each config before it is saved; generic over specs.

Per registry key (a GEMM shape, or an attention (H, D) tuned on its workload row with the
most FLOPs, i.e. the longest sequences): Helion's autotuner (``autotune_effort`` and
``autotune_budget_seconds`` bound the time; the search is seeded with the nearest
registered key's config, distinct configs of tuned neighbouring keys and the spec's
hand-picked tilings (:func:`registry_seeds`); every candidate is checked
against the fp32 reference; each seed is then timed on its own, and the fastest seed replaces
the search's pick where it timed faster, which a short budget leaves possible, or where
Helion's search itself raised: the error is printed and recorded in the entry), then the
winning config is checked again
(:func:`~.verify.verify_config`: several fresh random draws, and bitwise-identical repeated
runs), timed by CUDA-graph replay and written to the user registry
(:func:`~.registry.registry_path`). For a kernel with a ``dispatch_baseline`` (the pre-norm
and the post-norms) the unfused pipeline is timed too (and the spec's
``dispatch_alternatives``: the split-N ops' cuBLAS + Liger's norm, where installed) and the
faster path is recorded in the entry (:func:`dispatch_decision`), which is what the public op then runs (the whole fused op is timed
where the kernel is one of its launches: ``KernelSpec.dispatch_fused``). The entry and the printed line
also give the best seed's time (and where it came from), timed the same way, and how many configs Helion's
search timed (its post-autotune hook): what the search added over the seeds. Helion's own cache (``HELION_CACHE_DIR``)
makes an interrupted sweep resume cheaply; keys already in the registry are skipped unless
``force``, or ``retune_before`` a date later than theirs.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib.metadata
import time
import traceback
import warnings

import helion
import torch

from . import registry
from .bench_specs import bench_spec
from .parallel import error_text, result_line
from .spec import KernelSpec, Problem
from .timing import time_ms
from .verify import check_outputs, verify_config

EFFORTS = ("quick", "full")
# The fused kernel is chosen over the unfused pipeline only when that takes at least this much
# longer: one timing of each cannot tell a smaller difference from noise, and at a tie the
# unfused path (what the user has without this package) is the one to keep.
DISPATCH_MARGIN = 1.02


def dispatch_decision(fused_ms: float, unfused_ms: float, unfused: str,
                      alternatives: dict[str, float] | None = None) -> dict:
    """The registry's record of which path a shape runs.

    ``unfused`` (timed ``unfused_ms``) is the op's default unfused pipeline (cuBLAS + the
    compiled norm); ``alternatives`` maps other unfused pipelines the op can run (cuBLAS +
    Liger's norm, where installed) to their times. An alternative becomes the unfused path
    only where the default took at least :data:`DISPATCH_MARGIN` times as long as it (the
    fastest such one); the record keeps every alternative's time. Then ``"fused"`` only where
    the unfused path took at least :data:`DISPATCH_MARGIN` times ``fused_ms``."""
    times = {unfused: unfused_ms, **(alternatives or {})}
    faster = [name for name in times if name != unfused and unfused_ms >= DISPATCH_MARGIN * times[name]]
    path = min(faster, key=times.get) if faster else unfused
    record = {"choice": "fused" if times[path] >= DISPATCH_MARGIN * fused_ms else "unfused",
              "fused_ms": round(fused_ms, 5), "unfused_ms": round(times[path], 5), "unfused": path,
              "margin": DISPATCH_MARGIN}
    if alternatives:
        record["unfused_timed_ms"] = {name: round(ms, 5) for name, ms in times.items()}
    return record


# How far one key's tuning can run past ``budget_seconds``: Helion finishes the generation in
# progress, then the seeds are re-timed and the pick verified (bench/NOTES.md has the measured
# overshoots).
OVERSHOOT_SECONDS = 50


@dataclasses.dataclass(frozen=True)
class TuneOptions:
    """Autotuner settings for one sweep (Helion's ``autotune_*`` settings)."""

    effort: str = "quick"
    budget_seconds: int = 60
    force: bool = False
    seed: int = 0
    # False: Helion's own compiler seeds (its ``disable_autotuner_heuristics``) are left out of
    # the first population, which then holds the spec's seeds, the default and Helion's cached
    # configs: about half the configs to time before the search starts.
    compiler_seeds: bool = True
    # Re-tune the entries tuned before this date (and tune the missing ones); the others are
    # kept, so an interrupted re-tune resumes where it stopped. ``force`` re-tunes them all.
    retune_before: datetime.date | None = None
    # Wall-clock time (``time.time()``) by which the sweep must end: a key starts only while
    # ``budget_seconds + OVERSHOOT_SECONDS`` remain, the rest are reported "not started" (the
    # same command later tunes them and skips the finished ones). None: no limit.
    deadline: float | None = None

    def __post_init__(self) -> None:
        if self.effort not in EFFORTS:
            raise ValueError(f"effort must be one of {EFFORTS}, got {self.effort!r}")
        if self.budget_seconds <= 0:
            raise ValueError(f"budget_seconds must be positive, got {self.budget_seconds}")
        if self.retune_before is not None and not isinstance(self.retune_before, datetime.date):
            raise ValueError(f"retune_before must be a datetime.date, got {self.retune_before!r}")

    def keeps(self, entry: registry.Entry | None) -> bool:
        """Whether the sweep skips the key of ``entry`` (None: no entry, so it is tuned)."""
        if entry is None or self.force:
            return False
        if self.retune_before is None:
            return True
        return entry.tuned_on >= self.retune_before.isoformat()  # "" (no date): re-tuned

    def too_late(self) -> str | None:
        """Why a key must not start now (fewer than ``budget_seconds + OVERSHOOT_SECONDS``
        left before ``deadline``), None where it may."""
        if self.deadline is None:
            return None
        left = self.deadline - time.time()
        if left >= self.budget_seconds + OVERSHOOT_SECONDS:
            return None
        return (f"{max(left, 0):.0f} s left of the time limit, and a key takes up to the "
                f"{self.budget_seconds} s budget + {OVERSHOOT_SECONDS} s; the same command tunes it")


@dataclasses.dataclass(frozen=True)
class TuneResult:
    key: object  # the registry key: Shape or AttentionShape
    status: str  # "tuned", "skipped", "not started" (the time limit) or "failed"
    seconds: float
    message: str
    entry: registry.Entry | None = None


def versions() -> dict[str, str]:
    """Versions of what decides a config's speed: torch, CUDA, triton, helion."""
    out = {"torch": torch.__version__, "cuda": str(torch.version.cuda)}
    for pkg in ("triton", "helion"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "absent"
    return out


def tuning_problems(spec: KernelSpec, problems: list[Problem]) -> dict:
    """Per registry key of ``problems``, the one to tune it on: the one with the most FLOPs
    (a GEMM shape is its own key; an attention (H, D) is tuned on its longest sequences)."""
    picked: dict = {}
    for problem in problems:
        best = picked.get(problem.key)
        if best is None or bench_spec(spec.name).flops(problem) > bench_spec(spec.name).flops(best):
            picked[problem.key] = problem
    return picked


def tune_problem(
    spec: KernelSpec,
    problem: Problem,
    dtype: torch.dtype,
    options: TuneOptions,
    device: torch.device,
    progress_bar: bool = True,
) -> TuneResult:
    """Tune ``spec`` for ``problem``'s registry key on ``device`` and save the verified config.

    Raises:
        ValueError: ``device`` is not a CUDA device.
        VerificationError: the winning config fails :func:`verify_config` (a fresh draw
            off the fp32 reference, or repeated runs that differ); nothing is saved.
        RuntimeError: Helion's search failed and no seed runs at this shape.
    """
    if device.type != "cuda":
        raise ValueError(f"autotuning needs a CUDA device, got {device}")
    key, gpu, name = problem.key, registry.gpu_key(device), registry.dtype_name(dtype)
    entries = registry.entries_for(spec.name, gpu)
    existing = entries.get((*key, name))
    if options.keeps(existing):
        why = (f"tuned {existing.tuned_on}, not before {options.retune_before}"
               if options.retune_before else "already in the registry (--force re-tunes)")
        return TuneResult(key, "skipped", 0.0, why)
    late = options.too_late()
    if late:
        return TuneResult(key, "not started", 0.0, late)
    near = registry.nearest_entry(entries, key, name)

    t0 = time.perf_counter()
    args = spec.make_args(problem, dtype, device, options.seed)
    # A kernel of its own for the seeds' timing below (setting configs on spec.kernel's bound
    # kernel would change what the runtime's cached launches of this shape run).
    plain = helion.kernel(spec.kernel.fn, static_shapes=spec.kernel.settings.static_shapes)
    config_spec = plain.bind(args).config_spec
    seeded = registry_seeds(config_spec, entries, key, name, spec.seed_configs, borrowed_seeds(spec, gpu, key, name))
    seeds, sources = [c for c, _ in seeded], [source for _, source in seeded]
    kernel = tuning_kernel(spec, seeds, dtype, options, progress_bar, n_args=len(args))
    bound = kernel.bind(args)
    _LAST_SEARCH.clear()
    search_error = None
    try:
        # --force, or an entry being replaced: a fresh search, not Helion's cached answer
        config = bound.autotune(args, force=options.force or existing is not None)
    except Exception as err:  # Helion's search itself failed: the seeds may still run
        traceback.print_exc()
        config, search_error = None, error_text(err)
    search = dict(_LAST_SEARCH)
    if config is not None and spec.portable_config is not None:
        config = spec.portable_config(config)
        bound.set_config(config)
    tune_seconds = time.perf_counter() - t0

    latency = None if config is None else time_ms(lambda: bound(*args))
    # The best seed (registry entries' and hand-picked), timed the same way: what the search
    # added over the seeds.
    seeds = [_portable(spec, seed) for seed in seeds]  # as a call would run them
    seed_ms, seed_index = best_seed(lambda: plain.bind(args), seeds, lambda b: time_ms(lambda: b(*args)))
    search.update(best_seed_ms=None if seed_ms is None else round(seed_ms, 5), best_seed=seed_index,
                  best_seed_from=None if seed_index is None else sources[seed_index], seeds=sources,
                  search_ms=None if latency is None else round(latency, 5), kept_seed=False)
    if search_error is not None:
        search["search_error"] = search_error
    seed = None if seed_index is None else seeds[seed_index]
    if keep_seed(config, latency, seed, seed_ms, search_error):
        config = seed
        bound.set_config(config)
        latency = time_ms(lambda: bound(*args))
        search["kept_seed"] = True
    rel_error = verify_config(bound, spec, problem, dtype, device, options.seed + 1)
    extra = {} if problem == key else {"tuned_on": problem.columns()}
    decision = ""
    if spec.dispatch_baseline is not None:
        bench = bench_spec(spec.name)
        baselines = bench.baselines(*args)
        unfused_ms = time_ms(baselines[spec.dispatch_baseline])
        # Liger's pipeline where the spec offers it and liger-kernel is installed (else absent)
        alternatives = {name: time_ms(baselines[name]) for name in bench.dispatch_alternatives if name in baselines}
        fused_ms = latency if bench.dispatch_fused is None else time_ms(bench.dispatch_fused(bound, args))
        extra["dispatch"] = dispatch_decision(fused_ms, unfused_ms, spec.dispatch_baseline, alternatives)
        whole = "" if bench.dispatch_fused is None else f"fused op {fused_ms:.4f} ms, "
        timed = extra["dispatch"].get("unfused_timed_ms", {spec.dispatch_baseline: unfused_ms})
        path = extra["dispatch"]["unfused"]  # the unfused path first, then any other timed
        pipelines = ", ".join(f"{name}: {timed[name]:.4f} ms" for name in sorted(timed, key=lambda name: name != path))
        decision = f", {extra['dispatch']['choice']} ({whole}unfused {pipelines})"
    carried = carried_training_record(existing)
    if carried:
        extra.update(carried)
        decision += "; training: the decision measured before this re-tune kept until re-measured"
    meta = entry_meta(latency, rel_error, options, tune_seconds, near, **extra)
    meta["autotune"].update(search)
    entry = registry.Entry(shape=key, dtype=name, config=config, meta=meta)
    registry.save_entry(spec.name, gpu, entry, gpu_name=torch.cuda.get_device_name(device))
    on = "" if problem == key else f" on {problem}"
    seeds_text = "no seed ran" if seed_ms is None else f"best seed {seed_ms:.4f} ms"
    if search_error is not None:
        seeds_text += f", kept: Helion's search failed: {search_error}"
    elif search["kept_seed"]:
        seeds_text += f", kept: the search's pick took {search['search_ms']:.4f} ms"
    timed = f", {search['configs_tested']} configs timed" if "configs_tested" in search else ""
    if search.get("generations") == 0:
        timed += ", the search started no round past its first population: a larger budget lets it search"
    elif "generations" in search:
        timed += f", {search['generations']} search round(s) started past its first population"
    return TuneResult(
        key, "tuned", time.perf_counter() - t0,
        f"{latency:.4f} ms{on} ({seeds_text}{timed}){decision}, rel. error {rel_error:.2e}, "
        f"tuned in {tune_seconds:.0f} s",
        entry,
    )


def borrowed_seeds(spec: KernelSpec, gpu: str, key, dtype: str) -> list[tuple[dict, str]]:
    """The registry entries at exactly ``key`` and ``dtype`` of the kernels with ``spec``'s loops
    (``spec.same_loops_as``), as ``(config, source)`` seeds. A twin's registry file that cannot
    be read is skipped with a warning: it must not stop this kernel's tuning."""
    out = []
    for twin in spec.same_loops_as:
        try:
            entry = registry.entries_for(twin, gpu).get((*key, dtype))
        except registry.RegistryError as err:
            warnings.warn(f"{twin}'s entries not used as seeds: {err}", stacklevel=2)
            continue
        if entry is not None:
            out.append((entry.config, f"entry {entry.shape} of {twin}"))
    return out


# How many configs of tuned neighbouring shapes, besides the nearest entry's, seed a search
# (distinct ones, not already among the seeds).
NEIGHBOUR_SEEDS = 4


def registry_seeds(config_spec, entries: dict, key, dtype: str, hand_picked=(), borrowed=(),
                   neighbours: int = NEIGHBOUR_SEEDS) -> list[tuple[helion.Config, str]]:
    """The configs that seed a search at registry ``key``, each with where it came from:
    the nearest entry's, then the ``borrowed`` ones (``(config, source)`` pairs: another
    kernel's entries with the same loops, ``KernelSpec.same_loops_as``), then up to
    ``neighbours`` configs of other entries within distance 1
    (:func:`~.registry.neighbour_entries`, nearest first) that are not already seeds, then
    ``hand_picked``. Each is fitted to ``config_spec`` (:func:`fit_seed`); two configs that
    Helion normalises to the same one count once (the first kept).

    The neighbours are there because a config found at one shape can beat the search at the
    next (measured: bench/NOTES.md, config transfer).
    """
    def seed(config: dict | helion.Config, source: str) -> tuple[helion.Config, str, dict]:
        fitted = fit_seed(config_spec, config if isinstance(config, helion.Config) else helion.Config(**config))
        return fitted, source, _normalised(config_spec, fitted)

    def entry_seed(e: registry.Entry):
        return seed(e.config, f"entry {e.shape}" + ("" if e.dtype == dtype else f" {e.dtype}"))

    near = registry.nearest_entry(entries, key, dtype)
    first = ([] if near is None else [entry_seed(near)]) + [seed(c, source) for c, source in borrowed]
    hand = [seed(c, f"hand-picked {i}") for i, c in enumerate(hand_picked)]
    taken = [normal for *_, normal in first + hand]
    others = []
    for e in registry.neighbour_entries(entries, key, dtype):
        if len(others) == neighbours:
            break
        if e is not near and (candidate := entry_seed(e))[2] not in taken:
            taken.append(candidate[2])
            others.append(candidate)
    seeds: list[tuple[helion.Config, str]] = []
    kept: list[dict] = []
    for config, source, normal in first + others + hand:  # the hand-picked may repeat the nearest
        if normal not in kept:
            kept.append(normal)
            seeds.append((config, source))
    return seeds


def _normalised(config_spec, config: helion.Config) -> dict:
    """``config`` as Helion normalises it for ``config_spec`` (defaults filled in, a single
    ``indexing`` string spread over the accesses), to compare configs written differently;
    the config as written where Helion cannot normalise it."""
    try:
        return dict(config_spec.normalized_config(config).config)
    except Exception:  # Helion-internal API or an invalid config: compare as written
        return dict(config.config)


def fit_seed(config_spec, config: helion.Config) -> helion.Config:
    """``config`` with its lists fitted to ``config_spec`` (a bound kernel's ``config_spec``);
    ``config`` itself where every list fits:

    * each per-access list (``indexing``, ``load_eviction_policies``, ...) cut, or padded with
      its last value (the field's default for an empty list), to the kernel's number of accesses;
    * each per-loop list with a default per loop (``range_flattens``, ``range_num_stages``, ...)
      cut, or padded with those defaults, to the kernel's number of loops, as Helion's own
      normalisation pads it. Per-dimension lists without a default (``block_sizes``) stay as
      written: no value can be made up for them.

    A config made for another kernel (a registry entry derived from a kernel with more loads
    and stores, or the nearest entry of an op whose kernel has changed since) can hold a longer
    list, and a hand-picked seed a shorter one. Helion 1.5 runs either, but its search asserts
    when it encodes such a seed for its surrogate model (``ConfigGeneration.encode_config``):
    ``matmul_rmsnorm_matmul``'s derived entries held 10 ``indexing`` entries for a kernel with
    4 memory accesses, which failed the whole search, and the flattened seed's
    ``range_flattens=[True]`` (one of ``matmul``'s two loops) was dropped from every search with
    "Failed to transfer autotune seed config".
    """
    try:  # Helion 1.5 internals
        from helion.autotuner.block_id_sequence import BlockIdSequence
        from helion.autotuner.config_fragment import ListOf
    except ImportError:  # another Helion: seeds pass as they are
        return config
    fitted = dict(config.config)
    for key, value in config.config.items():
        field = getattr(config_spec, key, None)
        if not isinstance(value, list):
            continue
        if isinstance(field, ListOf) and len(value) != field.length:
            pad = value[-1] if value else field.inner.default()
            fitted[key] = (list(value) + [pad] * field.length)[:field.length]
        elif isinstance(field, BlockIdSequence) and len(value) != len(field):
            try:
                defaults = [item._fill_missing() for item in field]
            except NotImplementedError:  # no default per item (block sizes)
                continue
            fitted[key] = (list(value) + defaults[len(value):])[:len(field)]
    return config if fitted == dict(config.config) else helion.Config(**fitted)


# The best seed replaces the search's pick only when the pick took at least this much longer:
# the two are separate timings (a kept seed re-timed came out 0.98-1.0x its first timing).
SEED_MARGIN = 1.02


def keep_seed(config, search_ms: float | None, seed, seed_ms: float | None, search_error: str | None) -> bool:
    """Whether the best seed (``seed``, timed ``seed_ms``; None: no seed ran) replaces the
    search's pick (``config``, timed ``search_ms``): always where Helion's search failed
    (``search_error``; ``config`` None), else as :func:`prefer_seed` (a short budget can end
    the search before it benchmarked every seed: never record a config clearly slower than
    the best seed).

    Raises:
        RuntimeError: the search failed and no seed ran at this shape: nothing to record.
    """
    if config is None:
        if seed is None:
            raise RuntimeError(f"Helion's search failed ({search_error}) and no seed ran at this shape")
        return True
    return prefer_seed(search_ms, seed_ms, seed is not None and _same_config(seed, config))


def carried_training_record(existing: registry.Entry | None) -> dict:
    """What a re-tuned entry keeps of the entry it replaces (``existing``; None: a new key):
    its training dispatch record (:data:`~.registry.TRAINING_DISPATCH`) as
    ``{TRAINING_DISPATCH: record}``, marked with the ``tuned_at`` of the entry whose config the
    record timed (:data:`~.registry.MEASURED_CONFIG`: the mark it already had over an earlier
    re-tune, else the replaced entry's; the re-tune may have ended on that same config); else
    ``{}``.

    Tuning times the forward only. Without a training record a training call follows the
    forward decision, which leaves out the write of the norm's input that training adds, so a
    row measured unfused in training could flip to fused. Assumed, not measured: the write
    costs about the same under the new tiling, so the previous config's training
    decision is the better guess until ``bench/postnorm_training_forward.py`` and
    ``bench/dispatch_from_bench.py --training`` measure the new one. The runtime runs a
    training call fused only where the forward decision is fused too.
    """
    record = None if existing is None else existing.meta.get(registry.TRAINING_DISPATCH)
    if record is None:
        return {}
    measured = record.get(registry.MEASURED_CONFIG) or existing.meta.get("tuned_at") or "unknown"
    return {registry.TRAINING_DISPATCH: {**record, registry.MEASURED_CONFIG: measured}}


def prefer_seed(search_ms: float, seed_ms: float | None, same: bool) -> bool:
    """Whether the fastest seed (timed ``seed_ms``) replaces the search's pick (timed
    ``search_ms``): only a different config, and only :data:`SEED_MARGIN` faster."""
    return seed_ms is not None and not same and search_ms >= SEED_MARGIN * seed_ms


def _portable(spec: KernelSpec, config):
    return config if spec.portable_config is None else spec.portable_config(config)


def _same_config(seed, picked) -> bool:
    """Whether ``picked`` (a full config) is ``seed`` (a partial one) with Helion's defaults
    filled in: every key of the seed has its value there (a single indexing string standing
    for every slot of a list)."""
    full = dict(picked.config)
    for key, value in dict(seed.config).items():
        other = full.get(key)
        if isinstance(value, str) and isinstance(other, list):
            if any(v != value for v in other):
                return False
        elif other != value:
            return False
    return True


def best_seed(bind, seeds: list, timer) -> tuple[float | None, int | None]:
    """(time, index) of the fastest of ``seeds``: each set on a fresh ``bind()`` and timed by
    ``timer(bound)``; a seed that does not compile or run at this shape is skipped."""
    best: tuple[float | None, int | None] = (None, None)
    for index, seed in enumerate(seeds):
        try:
            bound = bind()
            bound.set_config(seed)
            ms = timer(bound)
        except Exception:  # a seed illegal at this shape (too much shared memory, ...)
            continue
        if best[0] is None or ms < best[0]:
            best = (ms, index)
    return best


# What Helion's autotuner reports of the last search (its post-autotune hook).
_LAST_SEARCH: dict = {}


def _record_search(metrics) -> None:
    # generations: Helion's num_generations, the search rounds (generations, polish and
    # finishing rounds) started past the first population (the seeds, Helion's compiler seeds,
    # the default and its cached configs), one the budget cut off included; 0: no round
    # started. configs_tested counts what was timed.
    _LAST_SEARCH.update(configs_tested=metrics.num_configs_tested,
                        generations=metrics.num_generations,
                        compile_failures=metrics.num_compile_failures,
                        accuracy_failures=metrics.num_accuracy_failures)


try:
    from helion.autotuner.metrics import register_post_autotune_hook
except ImportError:  # another Helion: the counts are left out of the entries
    pass
else:
    register_post_autotune_hook(_record_search)


def entry_meta(latency: float, rel_error: float, options: TuneOptions, tune_seconds: float,
               near: registry.Entry | None, **extra) -> dict:
    """What a registry entry records of its tuning: latency (ms), relative error, date,
    Helion's search settings, the entry it was seeded from, versions, and ``extra``."""
    return {
        "latency_ms": round(latency, 5),
        "rel_error": float(f"{rel_error:.3g}"),
        "tuned_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "autotune": {
            "effort": options.effort,
            "budget_seconds": options.budget_seconds,
            "compiler_seeds": options.compiler_seeds,
            "seconds": round(tune_seconds, 1),
            "seeded_from": None if near is None else f"{near.shape} {near.dtype}",
        },
        "versions": versions(),
        **extra,
    }


def tuning_kernel(spec: KernelSpec, seeds: list, dtype: torch.dtype, options: TuneOptions,
                  progress_bar: bool, n_args: int):
    """``spec.kernel`` (same static_shapes) with Helion's autotuner settings from ``options``:
    seeded with ``seeds``, every candidate checked against ``spec.reference`` by
    :func:`~.verify.check_outputs` at ``dtype``'s tolerance (after ``spec.compare_outputs``).
    ``n_args``: how many arguments ``spec.make_args`` gives, the ones the reference takes."""
    return helion.kernel(
        spec.kernel.fn,
        static_shapes=spec.kernel.settings.static_shapes,
        autotune_effort=options.effort,
        autotune_budget_seconds=options.budget_seconds,
        autotune_seed_configs=seeds,
        autotune_random_seed=options.seed,
        disable_autotuner_heuristics=not options.compiler_seeds,
        autotune_baseline_fn=functools.partial(_reference_on_call, reference=spec.reference, n_args=n_args),
        # Helion sends this hook to its benchmarking subprocesses: it must pickle, so it
        # carries the output transform (a module-level function), not the spec (whose
        # Helion kernel holds a lock).
        autotune_baseline_accuracy_check_fn=functools.partial(_accuracy_check, compare=spec.compare_outputs,
                                                              dtype=dtype),
        autotune_progress_bar=progress_bar,
    )


def _reference_on_call(*kernel_args, reference, n_args: int):
    """Helion's baseline hook: it calls the baseline with the kernel's bound arguments,
    defaults included (the full-row kernels' optional addends and ``product`` buffer, the
    attention kernel's saved-output buffers), while a spec's reference takes what its
    ``make_args`` gives: the first ``n_args``."""
    return reference(*kernel_args[:n_args])


def _accuracy_check(output, baseline, compare, dtype: torch.dtype) -> None:
    """Helion's per-candidate accuracy hook: the same bar as the final check
    (``compare``: the spec's ``compare_outputs``, as :func:`~.verify.comparable` applies it)."""
    check_outputs(output if compare is None else compare(output), baseline, dtype)


def tune(spec: KernelSpec, problems: list[Problem], dtype: torch.dtype, options: TuneOptions,
         device: torch.device, gpus: list[str] | None = None) -> list[TuneResult]:
    """Tune every registry key of ``problems`` (:func:`tuning_problems`), the most FLOPs
    first, under one progress display; a failing key does not stop the rest, and each finished
    key is in the registry as soon as it is done, so an interrupted sweep loses at most the
    keys in progress. With two or more ``gpus`` (``CUDA_VISIBLE_DEVICES`` entries) the keys
    are spread over one worker process per GPU (:func:`~.parallel.run_parallel`); else they
    run here, on ``device``. Past ``options.deadline`` (:meth:`TuneOptions.too_late`) a key is
    not started: its result says "not started", and a later sweep tunes it.
    """
    picked = tuning_problems(spec, problems)
    order = sorted(picked, key=lambda key: -bench_spec(spec.name).flops(picked[key]))
    name = registry.dtype_name(dtype)
    labels = {key: f"{picked[key]} {name}" for key in order}
    if gpus is not None and len(gpus) > 1:
        from .parallel import Item, run_parallel

        items = [Item(key, labels[key], (spec.name, picked[key], dtype, options)) for key in order]
        return run_parallel(f"autotune {spec.name}", items, _tune_job, failed_result, gpus)
    # progress_bar=False: Helion's own bar would fight ours for the terminal.
    return sweep(f"autotune {spec.name}", [(key, labels[key]) for key in order],
                 lambda key: tune_problem(spec, picked[key], dtype, options, device, progress_bar=False))


def failed_result(key, message: str) -> TuneResult:
    """The result of a key whose tuning raised or whose worker died."""
    return TuneResult(key, "failed", 0.0, message)


def _tune_job(payload: tuple) -> TuneResult:
    """One key on a worker process pinned to its GPU (``cuda:0`` there): ``payload`` =
    (kernel name, problem, dtype, options); the spec is looked up here (it does not pickle)."""
    from .techniques import get_spec

    kernel, problem, dtype, options = payload
    return tune_problem(get_spec(kernel), problem, dtype, options, torch.device("cuda"), progress_bar=False)


def sweep(title: str, items: list[tuple[object, str]], tune_one) -> list[TuneResult]:
    """Run ``tune_one(key)`` for each (key, label) of ``items`` under a progress bar, printing
    each result; an exception fails that item only (the others are still worth tuning)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    results: list[TuneResult] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as progress:
        task = progress.add_task(title, total=len(items))
        for key, label in items:
            progress.update(task, description=f"{title} {label}")
            t0 = time.perf_counter()
            try:
                result = tune_one(key)
            except Exception as err:  # keep going: the other items are still worth tuning
                progress.console.print(traceback.format_exc(), markup=False, highlight=False)
                result = TuneResult(key, "failed", time.perf_counter() - t0, error_text(err))
            results.append(result)
            progress.console.print(result_line(result))
            progress.advance(task)
    return results
