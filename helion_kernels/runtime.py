"""Launching kernels: bind a Helion kernel to a call's arguments, resolve its config from the
registry (exact / nearest / default), cache the compiled kernel, launch.

The bound, compiled kernel is cached per specialization (shapes, strides, dtypes, device),
so the registry is read once per shape per process: configs tuned by another process are
seen after :func:`clear_cache` or a restart. A spec with ``dynamic_m`` runs a shape that is
not tuned exactly, with M >= 2, on its kernel's dynamic-shape build (:func:`dynamic_build`,
:func:`uses_dynamic_build`), compiled once per config, so a new M costs a registry lookup
rather than a compile. In Helion's reference mode (``HELION_INTERPRET=1``) configs do not
apply and the kernel runs eagerly.

Kernel modules are imported by their first launch (through :class:`LazyModule`), not with
the package: ``import helion`` takes seconds, and a model that imports helion_kernels but
runs unfused should not pay for it.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import types
import warnings
from typing import Any, Callable

import torch

from . import liger_norm, registry
from .kernels import cpu_reference_mode
from .spec import KernelSpec


class LazyModule(types.ModuleType):
    """A module imported on first attribute access (``importlib.import_module``)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._module: types.ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:  # only for attributes not yet copied here
        if attr.startswith("__"):
            raise AttributeError(attr)
        if self._module is None:
            self._module = importlib.import_module(self.__name__)
        value = getattr(self._module, attr)
        setattr(self, attr, value)  # later lookups are plain attribute reads
        return value


def interpret_mode() -> str | None:
    """``"helion"`` under HELION_INTERPRET=1, ``"triton"`` under TRITON_INTERPRET=1, else None."""
    if os.environ.get("HELION_INTERPRET", "0") not in ("", "0"):
        return "helion"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "triton"
    return None


@dataclasses.dataclass(frozen=True)
class Resolved:
    """The config a call runs with (a ``helion.Config``) and where it came from."""

    config: Any
    source: str  # "exact", "nearest" or "default"
    entry: registry.Entry | None


# (spec name, specialization) -> (compiled BoundKernel, Resolved)
_BOUND: dict[tuple, tuple[Any, Resolved]] = {}
# keys of _BOUND launched once (the GPU accepted their config)
_LAUNCHED: set[tuple] = set()
# a config refused at one call (_shrink_key) -> the smaller one that launched; a key of _BOUND
# whose config was shrunk (here or at another M) -> the config its registry lookup gave
_SMALLER: dict[tuple, Any] = {}
_ORIGINAL: dict[tuple, Any] = {}
# (kernel name, specialization) -> compiled BoundKernel, for kernels run outside a spec
_KERNEL_BOUND: dict[tuple, Any] = {}
# (spec name, key, dtype, gpu) -> the registry's decision for such calls (_Decision)
_FUSED_CHOICE: dict[tuple, "_Decision"] = {}
# spec name -> the kernel's dynamic-shape build (KernelSpec.dynamic_m)
_DYNAMIC_BUILDS: dict[str, Any] = {}
# fallback warnings already given for a dynamic_m spec: (kind, spec name, key without M, dtype, gpu)
_WARNED: set[tuple] = set()


def _helion_config(config: dict):
    import helion  # already imported by the kernel module that is being launched

    return helion.Config(**config)


def resolve_entry(spec: KernelSpec, found: registry.Lookup, args: tuple):
    """The ``helion.Config`` of a registry lookup for ``args``: the entry's (or the spec's
    default), made portable (``spec.portable_config``) and, unless tuned at this exact shape
    on this GPU, fitted to the call (``spec.fit_config``), then adapted to what the call adds
    (``spec.call_config``)."""
    config = spec.default_config if found.entry is None else _helion_config(found.entry.config)
    if spec.portable_config is not None:
        config = spec.portable_config(config)
    if spec.fit_config is not None and found.source != "exact":
        config = spec.fit_config(config, args)
    if spec.call_config is not None:
        config = spec.call_config(config, args)
    return config


def _first_warning(what: str, spec: KernelSpec, key: tuple, dtype: torch.dtype, gpu: str) -> bool:
    """Whether a fallback warning of ``what`` kind for this call is the first of its kind:
    once per shape, or, for a ``dynamic_m`` spec, once per shape apart from M (a training
    run with a new token count every step would otherwise warn every step)."""
    if not spec.dynamic_m:
        return True
    seen = (what, spec.name, tuple(key)[1:], dtype, gpu)
    if seen in _WARNED:
        return False
    _WARNED.add(seen)
    return True


def resolve(spec: KernelSpec, args: tuple, warn: bool = True) -> Resolved:
    """The registry config (and its source) of ``spec`` for a call with ``args``."""
    key, gpu = spec.key_of(args), registry.gpu_key(args[0].device)
    found = registry.lookup(spec.name, key, args[0].dtype, gpu, warn=False)
    if warn and found.source != "exact" and _first_warning("config", spec, key, args[0].dtype, gpu):
        registry.lookup(spec.name, key, args[0].dtype, gpu, warn=True)  # the same answer, warned
    return Resolved(resolve_entry(spec, found, args), found.source, found.entry)


def dynamic_build(spec: KernelSpec):
    """``spec.kernel``'s function compiled with dynamic shapes (``static_shapes=False``):
    Helion binds one kernel for every size >= 2 of each dimension (sizes 0 and 1, and the
    layouts its code assumed, get their own), so a config compiles once for every M."""
    kernel = _DYNAMIC_BUILDS.get(spec.name)
    if kernel is None:
        import helion  # already imported by the kernel module that is being launched

        kernel = _DYNAMIC_BUILDS[spec.name] = helion.kernel(spec.kernel.fn, static_shapes=False)
    return kernel


def uses_dynamic_build(spec: KernelSpec, args: tuple, source: str) -> bool:
    """Whether a call runs :func:`dynamic_build`: a ``dynamic_m`` spec at a shape not tuned
    exactly, with M >= 2. Helion 1.5's dynamic build treats a dimension of size 1 as a
    broadcast and drops the row mask on stores into it (seen on the H200: the full-row
    kernels' [1, N] ``product`` buffer received every row of the tile, the zero rows past M
    included), and a size-1 M is compiled once in either build, so M = 1 keeps the static one."""
    return spec.dynamic_m and source != "exact" and int(args[0].shape[0]) >= 2


def _bound_key(spec: KernelSpec, args: tuple) -> tuple:
    return (spec.name, spec.kernel.specialization_key(args))


def _compiled(spec: KernelSpec, args: tuple, resolved: Resolved):
    """``spec.kernel`` bound to ``args`` with ``resolved.config``: the dynamic-shape build
    where :func:`uses_dynamic_build`, compiled once per config (Helion caches it on the bound
    kernel), not per M; else the static one."""
    if uses_dynamic_build(spec, args, resolved.source):
        return dynamic_build(spec).bind(args).compile_config(resolved.config)
    run = spec.kernel.bind(args)
    run.set_config(resolved.config)
    return run


def _bound(spec: KernelSpec, args: tuple, key: tuple | None = None) -> tuple[Any, Resolved]:
    """The compiled kernel and resolved config for ``args`` (``key``: their :func:`_bound_key`,
    where the caller has it), bound and cached on the first call."""
    key = _bound_key(spec, args) if key is None else key
    hit = _BOUND.get(key)
    if hit is None:
        resolved = resolve(spec, args)
        smaller = _SMALLER.get(_shrink_key(spec, args, resolved.config))
        if smaller is not None:  # refused at another M: start from the config that launched there
            _ORIGINAL[key] = resolved.config
            resolved = dataclasses.replace(resolved, config=smaller)
        hit = _BOUND[key] = (_compiled(spec, args, resolved), resolved)
    return hit


def resolved_config(spec: KernelSpec, args: tuple) -> Resolved:
    """The config :func:`launch` uses for ``args`` (compiling the kernel if needed; in
    reference mode, where configs do not apply, the registry's answer alone)."""
    if reference_mode(spec.kernel):
        return resolve(spec, args)
    return _bound(spec, args)[1]


def reference_mode(kernel) -> bool:
    """Whether ``kernel`` runs in Helion's reference mode (eager, configs ignored; fixed when
    the kernel is defined, so asked once per kernel); if so, torch's CPU build gets the dot
    kernels that mode needs (:mod:`.kernels.cpu_reference_mode`)."""
    found = _REFERENCE_MODE.get(kernel)
    if found is None:
        from helion.runtime.ref_mode import is_ref_mode_enabled  # Helion is imported by now

        found = _REFERENCE_MODE[kernel] = is_ref_mode_enabled(kernel.settings)
        if found:
            cpu_reference_mode.install()
    return found


_REFERENCE_MODE: dict[Any, bool] = {}


def launch(spec: KernelSpec, args: tuple):
    """Run ``spec.kernel`` on already-validated ``args`` with its registry config.

    The config is the registry's exact entry for the shape, else the nearest tuned shape's,
    else the kernel's default (both with a ``ConfigFallbackWarning``, once per shape and
    process); in reference mode the kernel runs eagerly. Where the GPU refuses the first
    launch of a specialization for want of shared memory (Triton's ``OutOfResources``: a
    call that adds a store to the tuned kernel, such as the full-row kernels' ``product``,
    can need more than the tuned config did), the spec's ``smaller_config`` steps are taken
    until one launches, with a ``ConfigFallbackWarning``.
    """
    if reference_mode(spec.kernel):
        return spec.kernel(*args)
    key = _bound_key(spec, args)
    run = _bound(spec, args, key)[0]
    if key in _LAUNCHED:
        return run(*args)
    from triton.runtime.errors import OutOfResources

    while True:
        try:
            out = run(*args)
        except OutOfResources as err:
            if getattr(err, "name", None) != "shared memory":
                raise
            run = _rebind_smaller(spec, args, key, err)
            continue
        _LAUNCHED.add(key)
        return out


def _shrink_key(spec: KernelSpec, args: tuple, config) -> tuple:
    """What decides whether a config fits a block's shared memory: the spec, the config, the
    call's key but for M (a new token count needs no new attempt), dtype, and which optional
    tensors the call passes (an added store needs more)."""
    return (spec.name, repr(config), tuple(spec.key_of(args))[1:], args[0].dtype,
            tuple(isinstance(t, torch.Tensor) for t in args))


def _rebind_smaller(spec: KernelSpec, args: tuple, key: tuple, err: Exception):
    """The bound kernel of ``key`` again with ``spec.smaller_config`` of its config (cached
    in its place and remembered for other M, :data:`_SMALLER`), warning once per shape apart
    from M; ``err`` re-raised where there is no smaller config."""
    resolved = _BOUND[key][1]
    smaller = None if spec.smaller_config is None else spec.smaller_config(resolved.config)
    if smaller is None or repr(smaller) == repr(resolved.config):
        raise err
    first_shrink = key not in _ORIGINAL  # else shrunk (and warned) before, here or at another M
    original = _ORIGINAL.setdefault(key, resolved.config)
    _SMALLER[_shrink_key(spec, args, original)] = smaller
    shape, gpu = spec.key_of(args), registry.gpu_key(args[0].device)
    if first_shrink and _first_warning("shared_memory", spec, shape, args[0].dtype, gpu):
        warnings.warn(f"{spec.name}: the {resolved.source} config needs more shared memory than the GPU has "
                      f"for this call ({err}); running it with smaller tiles or fewer pipeline stages",
                      registry.ConfigFallbackWarning, stacklevel=4)
    resolved = dataclasses.replace(resolved, config=smaller)
    run = _compiled(spec, args, resolved)
    _BOUND[key] = (run, resolved)
    return run


def launch_kernel(kernel, args: tuple, config: Callable[[], Any] | None = None):
    """Run a kernel that has no spec of its own: compiled once per specialization with
    ``config()`` (called on the first launch only), or with the config pinned on the kernel
    when ``config`` is None; eagerly in reference mode."""
    if config is None or reference_mode(kernel):
        return kernel(*args)
    key = (kernel.name, kernel.specialization_key(args))
    bound = _KERNEL_BOUND.get(key)
    if bound is None:
        bound = kernel.bind(args)
        bound.set_config(config())
        _KERNEL_BOUND[key] = bound
    return bound(*args)


@dataclasses.dataclass(frozen=True)
class _Decision:
    fused: bool  # run the fused kernel
    pipeline: str | None  # the unfused pipeline (a key of the spec's baselines); None: no entry
    followed: Any = None  # the nearest entry followed when the key has no entry of its own


# An unfused pipeline other than the spec's dispatch_baseline is followed from an entry at
# most this far (registry.shape_distance: N within 2x, M within 4x, K within 16x): Liger's
# norm was measured faster at some N, and holds a whole row in one block, which has not
# been measured at N far from the tuned rows.
ALTERNATIVE_PIPELINE_REACH = 1.0


def _decision(spec: KernelSpec, args: tuple, training: bool = False) -> _Decision:
    """The registry's decision for a call of ``spec`` (exact or nearest entry, cached per
    key, dtype, GPU and ``training``), where an alternative unfused pipeline the entry names
    is checked against this machine: Liger's norm (:mod:`.liger_norm`) only where it can run
    here and the entry is within :data:`ALTERNATIVE_PIPELINE_REACH`; else the spec's
    ``dispatch_baseline``, with the fused-or-unfused choice taken again against that
    pipeline's recorded time (the entry's margin), where it was timed.

    ``training``: the call also writes what its backward needs; the entry's
    :data:`~.registry.TRAINING_DISPATCH` record decides where it has one (measured with
    those writes; after a re-tune, with the config it replaced), else its forward ``dispatch``
    record; fused only where the forward decision is fused too."""
    a = args[0]
    key = spec.key_of(args)
    dtype, gpu = registry.dtype_name(a.dtype), registry.gpu_key(a.device)
    cache_key = (spec.name, key, dtype, gpu, training)
    if cache_key not in _FUSED_CHOICE:
        found = registry.lookup(spec.name, key, dtype, gpu, warn=False)
        entry = found.entry
        meta = {} if entry is None else entry.meta
        record = meta.get(registry.TRAINING_DISPATCH) if training else None
        record = record if record is not None else meta.get("dispatch", {})
        fused, pipeline = record.get("choice") == "fused", record.get("unfused")
        if pipeline is not None and pipeline != spec.dispatch_baseline and not (
                _alternative_runs(pipeline, a.device, args[1].shape[1])
                and registry.shape_distance(entry.shape, key) <= ALTERNATIVE_PIPELINE_REACH):
            pipeline = spec.dispatch_baseline
            timed = record.get("unfused_timed_ms", {}).get(pipeline)
            if timed is not None:
                fused = timed >= record.get("margin", 1.0) * record["fused_ms"]
        if training and fused:
            # the training write adds work to the fused path only: never fused where the forward
            # is not (a training record carried over a re-tune, then a forward re-benchmark)
            fused = _decision(spec, args).fused
        _FUSED_CHOICE[cache_key] = _Decision(fused, pipeline, None if found.source == "exact" else entry)
    return _FUSED_CHOICE[cache_key]


def _alternative_runs(pipeline: str, device: torch.device, n: int) -> bool:
    """Whether this machine can run the unfused ``pipeline`` of a registry entry other than
    the compiled norm's (the only one: cuBLAS + Liger's norm)."""
    return pipeline == liger_norm.PIPELINE and liger_norm.available(device, n)


def fused_choice(spec: KernelSpec, args: tuple, training: bool = False) -> bool:
    """The registry's dispatch decision for a call of ``spec`` (one with a
    ``dispatch_baseline``), read without compiling anything.

    True where tuning measured the fused kernel faster than the unfused pipeline at this
    shape, or, for an untuned shape, at the nearest tuned one (a ``ConfigFallbackWarning``
    says so when that one chose unfused; a fused choice warns when the kernel resolves its
    config); False for a GPU with no entry at all. ``training=True``: the decision measured
    for a call that also keeps the backward's tensors, where the entry has one (see
    :func:`_decision`).
    """
    decision = _decision(spec, args, training)
    followed = decision.followed
    if followed is not None and not decision.fused:
        a = args[0]
        key, gpu = spec.key_of(args), registry.gpu_key(a.device)
        if _first_warning("dispatch_training" if training else "dispatch", spec, key, a.dtype, gpu):
            dtype = registry.dtype_name(a.dtype)
            warnings.warn(
                f"{spec.name}: no dispatch decision tuned for {key} {dtype} on {gpu}; "
                f"following the one {'(for training calls) ' if training else ''}tuned for {followed.shape} "
                f"{followed.dtype} (unfused). {registry.tune_advice(spec.name, key, dtype, gpu)}"
                + (" (and for training calls bench/postnorm_training_forward.py, then "
                   "bench/dispatch_from_bench.py --training)" if training and registry.untunable(gpu) is None
                   else ""),
                registry.ConfigFallbackWarning, stacklevel=4)
    return decision.fused


def unfused_pipeline(spec: KernelSpec, args: tuple) -> str | None:
    """The unfused pipeline a call of ``spec``'s op runs when it does not run the fused
    kernel (forced or not): the one the registry entry names (exact, or nearest as
    :func:`fused_choice` finds it; no warning here), ``spec.dispatch_baseline`` (cuBLAS +
    the compiled norm) where that one cannot run on this machine or the entry is far (see
    :func:`_decision`); None without an entry."""
    return _decision(spec, args).pipeline


def registry_choice(spec: KernelSpec, args: tuple, fused: bool | None = None) -> bool:
    """Whether a call of the op of ``spec`` (one with a ``dispatch_baseline`` and no N limit)
    runs the fused kernel: ``fused`` True/False forces; None follows :func:`fused_choice`;
    reference mode always runs the kernel; M = 0 or N = 0 never does (nothing to multiply)."""
    a, b = args[0], args[1]
    if a.shape[0] == 0 or b.shape[1] == 0:
        return False
    if fused is not None:
        return fused
    return reference_mode(spec.kernel) or fused_choice(spec, args)


def clear_cache() -> None:
    """Forget compiled kernels and dispatch decisions so the next call re-reads the registry."""
    _BOUND.clear()
    _LAUNCHED.clear()
    _SMALLER.clear()
    _ORIGINAL.clear()
    _KERNEL_BOUND.clear()
    _FUSED_CHOICE.clear()
    _DYNAMIC_BUILDS.clear()
    _WARNED.clear()


def check_runnable(op: str, device: torch.device) -> None:
    """One clear line instead of a kernel error when ``device`` cannot run the kernels.

    Raises:
        ValueError: a CPU (or other non-CUDA) tensor outside the interpret modes, or both
            interpret modes at once.
    """
    both = (os.environ.get("HELION_INTERPRET", "0") not in ("", "0")) and os.environ.get("TRITON_INTERPRET") == "1"
    if both:
        raise ValueError(f"{op}: HELION_INTERPRET=1 and TRITON_INTERPRET=1 are both set; Helion runs one "
                         f"interpreter at a time (HELION_INTERPRET=1 runs the ops on a CPU)")
    if device.type != "cuda" and interpret_mode() is None:
        raise ValueError(
            f"{op}: the kernels need CUDA tensors, got {device.type} tensors. Without a GPU, "
            f"set HELION_INTERPRET=1 before the first call to run them in Helion's reference "
            f"mode (eager PyTorch: checks the math, slowly)"
        )
