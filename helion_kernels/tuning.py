"""Autotuning one shape or a workload sweep, verifying each config before it is saved.

Per shape: Helion's autotuner (``autotune_effort`` and ``autotune_budget_seconds`` bound
the time; the search is seeded with the nearest registered shape's config and the spec's
hand-picked tilings; every candidate is checked against the fp32 reference), then the
winning config is checked again (:func:`~.verify.verify_config`: several fresh random
draws, and bitwise-identical repeated runs), timed by CUDA-graph replay, and written to the
registry. For a kernel with a ``dispatch_baseline`` (the full-row post-norms) the unfused
pipeline is timed too and the faster of the two is recorded in the entry, which is what
the public function then runs. Helion's own cache (``HELION_CACHE_DIR``, the repository's ``autotune_cache/``
when run from the CLI) makes an interrupted sweep resume cheaply; shapes already in the
registry are skipped unless ``force``.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib.metadata
import time
from typing import Iterable

import helion
import torch

from . import registry
from .kernels.spec import KernelSpec, Shape
from .timing import time_ms
from .verify import check_outputs, verify_config

EFFORTS = ("quick", "full")


@dataclasses.dataclass(frozen=True)
class TuneOptions:
    """Autotuner settings for one sweep (Helion's ``autotune_*`` settings)."""

    effort: str = "quick"
    budget_seconds: int = 60
    force: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.effort not in EFFORTS:
            raise ValueError(f"effort must be one of {EFFORTS}, got {self.effort!r}")
        if self.budget_seconds <= 0:
            raise ValueError(f"budget_seconds must be positive, got {self.budget_seconds}")


@dataclasses.dataclass(frozen=True)
class TuneResult:
    shape: Shape
    status: str  # "tuned", "skipped" or "failed"
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


def tune_shape(
    spec: KernelSpec,
    shape: Shape,
    dtype: torch.dtype,
    options: TuneOptions,
    device: torch.device,
    progress_bar: bool = True,
) -> TuneResult:
    """Tune ``spec`` at ``shape``/``dtype`` on ``device`` and save the verified config.

    Raises:
        VerificationError: the winning config fails :func:`verify_config` (a fresh draw
            off the fp32 reference, or repeated runs that differ); nothing is saved.
    """
    if device.type != "cuda":
        raise ValueError(f"autotuning needs a CUDA device, got {device}")
    gpu = registry.gpu_key(device)
    name = registry.dtype_name(dtype)
    entries = registry.entries_for(spec.name, gpu)
    if not options.force and (*shape, name) in entries:
        return TuneResult(shape, "skipped", 0.0, "already in the registry (--force re-tunes)")
    near = registry.nearest_entry(entries, shape, name)
    seeds = ([near.config] if near is not None else []) + list(spec.seed_configs)

    t0 = time.perf_counter()
    kernel = tuning_kernel(spec.kernel, seeds, spec.reference, dtype, options, progress_bar)
    args = spec.make_args(shape, dtype, device, options.seed)
    bound = kernel.bind(args)
    config = bound.autotune(args, force=options.force)
    if spec.portable_config is not None:
        config = spec.portable_config(config)
        bound.set_config(config)
    tune_seconds = time.perf_counter() - t0

    rel_error = verify_config(bound, spec, shape, dtype, device, options.seed + 1)
    latency = time_ms(lambda: bound(*args))
    meta_dispatch = {}
    if spec.dispatch_baseline is not None:
        unfused_ms = time_ms(spec.baselines(*args)[spec.dispatch_baseline])
        meta_dispatch = {"dispatch": {
            "choice": "fused" if latency < unfused_ms else "unfused",
            "fused_ms": round(latency, 5),
            "unfused_ms": round(unfused_ms, 5),
            "unfused": spec.dispatch_baseline,
        }}
    entry = registry.Entry(
        shape=shape,
        dtype=name,
        config=config,
        meta=entry_meta(latency, rel_error, options, tune_seconds, near, **meta_dispatch),
    )
    registry.save_entry(spec.name, gpu, entry, gpu_name=torch.cuda.get_device_name(device))
    decision = ""
    if meta_dispatch:
        d = meta_dispatch["dispatch"]
        decision = f", {d['choice']} (unfused {d['unfused']}: {d['unfused_ms']:.4f} ms)"
    return TuneResult(
        shape, "tuned", time.perf_counter() - t0,
        f"{latency:.4f} ms{decision}, rel. error {rel_error:.2e}, tuned in {tune_seconds:.0f} s",
        entry,
    )


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
            "seconds": round(tune_seconds, 1),
            "seeded_from": None if near is None else f"{near.shape} {near.dtype}",
        },
        "versions": versions(),
        **extra,
    }


def tuning_kernel(kernel: helion.Kernel, seeds: list, reference, dtype: torch.dtype,
                  options: TuneOptions, progress_bar: bool) -> helion.Kernel:
    """``kernel`` (same static_shapes) with Helion's autotuner settings from ``options``:
    seeded with ``seeds``, every candidate checked against ``reference`` by
    :func:`~.verify.check_outputs` at ``dtype``'s tolerance."""
    return helion.kernel(
        kernel.fn,
        static_shapes=kernel.settings.static_shapes,
        autotune_effort=options.effort,
        autotune_budget_seconds=options.budget_seconds,
        autotune_seed_configs=seeds,
        autotune_random_seed=options.seed,
        autotune_baseline_fn=reference,
        autotune_baseline_accuracy_check_fn=functools.partial(_accuracy_check, dtype=dtype),
        autotune_progress_bar=progress_bar,
    )


def _accuracy_check(output, baseline, dtype: torch.dtype) -> None:
    """Helion's per-candidate accuracy hook: the same bar as the final check."""
    check_outputs(output, baseline, dtype)


def tune_shapes(
    spec: KernelSpec,
    shapes: Iterable[Shape],
    dtype: torch.dtype,
    options: TuneOptions,
    device: torch.device,
) -> list[TuneResult]:
    """Tune every shape in turn with a progress bar; a failing shape does not stop the rest.

    Each finished shape is in the registry as soon as it is done, so an interrupted sweep
    loses at most the shape in progress.
    """
    name = registry.dtype_name(dtype)
    # progress_bar=False: Helion's own bar would fight ours for the terminal.
    return sweep(f"autotune {spec.name}", [(shape, f"{shape} {name}") for shape in shapes],
                 lambda shape: tune_shape(spec, shape, dtype, options, device, progress_bar=False))


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
                result = TuneResult(key, "failed", time.perf_counter() - t0, f"{type(err).__name__}: {err}")
            results.append(result)
            style = {"tuned": "green", "skipped": "dim", "failed": "red"}[result.status]
            progress.console.print(f"[{style}]{result.status:8}[/] {result.shape}  {result.message}")
            progress.advance(task)
    return results
