"""Running the kernels: the one fused-or-unfused decision, config resolution, launch.

* :func:`decide` chooses a call's path (fused kernel, or which unfused pipeline) from the
  registry record of its shape; every op, the benchmark and the CPU report ask it.
* :func:`launch` runs a spec's kernel. A repeated call with the same signature (shapes,
  strides, dtypes, device, scalar values) is one dictionary lookup and a call of the host
  function Helion generated for the bound kernel and its config: no file is read, no device
  queried, no Helion specialisation recomputed (Triton still takes the current stream and
  its own pointer-alignment key per launch). The first call of a signature resolves the
  config (registry: exact, nearest or default), binds and compiles.
* Configs tuned by another process are seen by a new process or after :func:`clear_cache`.

A spec with ``dynamic_m`` runs a shape not tuned exactly, with M >= 2, on its kernel's
dynamic-shape build (compiled once per config, not per M). In Helion's reference mode
(``HELION_INTERPRET=1``) configs do not apply and the kernel runs eagerly.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import types
import warnings
from typing import Any, Callable

import torch

from . import liger_norm, registry
from . import cpu_reference_mode
from .spec import KernelSpec


class LazyModule(types.ModuleType):
    """A module imported on first attribute access (``import helion`` takes seconds)."""

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


@dataclasses.dataclass(frozen=True)
class Decision:
    """A call's path: the fused kernel, or the unfused ``pipeline`` (a key of the benchmark's
    baselines, e.g. ``"cublas+liger_norm"``; None: the op's default, cuBLAS + the compiled norm)."""

    fused: bool
    pipeline: str | None = None
    record: dict | None = dataclasses.field(default=None, compare=False)  # the registry record followed
    followed: registry.Entry | None = dataclasses.field(default=None, compare=False)  # a nearest entry


@dataclasses.dataclass(frozen=True)
class _Launch:
    run: Callable  # the compiled host function (or a stand-in the tests put there)
    resolved: Resolved


# The caches, all cleared by clear_cache(). Keys hold M, so the first two are bounded.
_LAUNCHES: dict[tuple, _Launch] = {}  # call signature -> what launched for it
_DECISIONS: dict[tuple, Decision] = {}  # (spec, flags, shapes, dtype, device) -> decision
_SHRUNK: dict[tuple, Any] = {}  # a config refused for shared memory (_shrink_key) -> the one that launched
_RESOLVED: dict[tuple, Resolved] = {}  # (spec, registry key, dtype, device, tensors passed) -> resolve()
_WARNED: set[tuple] = set()  # fallback warnings given once per shape apart from M
_MAX_ENTRIES = 4096  # a long run with a new M every step must not grow without bound


def _store(cache: dict, key, value):
    if len(cache) >= _MAX_ENTRIES:
        cache.clear()
    cache[key] = value
    return value


def _signature(name, args: tuple) -> tuple | None:
    """What a compiled kernel is specialised on, and more: each tensor's dtype, shape and
    strides, the device, the other arguments' values (floats by type); None where an
    argument is not a plain tensor or scalar (no caching)."""
    sig = [name, args[0].device]
    for t in args:
        kind = type(t)
        if kind is _TENSOR or kind is _PARAMETER:
            sig.append((t.dtype, t.shape, t.stride()))
        elif kind is float:
            sig.append(float)
        elif t is None or kind is int or kind is bool or kind is str:
            sig.append(t)
        else:
            return None
    return tuple(sig)


_TENSOR, _PARAMETER = torch.Tensor, torch.nn.Parameter


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


def _first_warning(what: str, spec: KernelSpec, key: tuple, dtype, gpu: str) -> bool:
    """Whether a fallback warning of ``what`` kind is the first of its kind: once per shape,
    or for a ``dynamic_m`` spec once per shape apart from M (a new token count every step)."""
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
    quiet = found.source == "default" and not spec.warn_default
    if warn and found.source != "exact" and not quiet and _first_warning("config", spec, key, args[0].dtype, gpu):
        registry.lookup(spec.name, key, args[0].dtype, gpu, warn=True)  # the same answer, warned
    return Resolved(resolve_entry(spec, found, args), found.source, found.entry)


@functools.cache
def _dynamic_build(kernel):
    import helion  # already imported by the kernel module that is being launched

    return helion.kernel(kernel.fn, static_shapes=False)


def dynamic_build(spec: KernelSpec):
    """``spec.kernel``'s function compiled with dynamic shapes (``static_shapes=False``):
    one bound kernel for every size >= 2 of each dimension, so a config compiles once for
    every M."""
    return _dynamic_build(spec.kernel)


def uses_dynamic_build(spec: KernelSpec, args: tuple, source: str) -> bool:
    """Whether a call runs :func:`dynamic_build`: a ``dynamic_m`` spec at a shape not tuned
    exactly, with M >= 2 (Helion 1.5's dynamic build treats a size-1 dimension as a
    broadcast and drops the row mask on stores into it, so M = 1 keeps the static build)."""
    return spec.dynamic_m and source != "exact" and int(args[0].shape[0]) >= 2


def _build(spec: KernelSpec, args: tuple, source: str):
    return dynamic_build(spec) if uses_dynamic_build(spec, args, source) else spec.kernel


def _bound(spec: KernelSpec, args: tuple):
    """(bound kernel, resolved config) of a call: the build and config :func:`launch` runs."""
    resolved = resolved_config(spec, args)
    return _build(spec, args, resolved.source).bind(args), resolved


def _compiled(spec: KernelSpec, args: tuple, resolved: Resolved) -> Callable:
    """The host function Helion generated for ``args`` and ``resolved.config`` (compiled once
    per config and build; Helion caches both). A registry config saved for an earlier version
    of the kernel, whose per-loop or per-access lists no longer have the kernel's lengths
    (a loop or a load added or removed since), runs fitted to the kernel
    (:func:`~.tuning.fit_seed`), with a ``ConfigFallbackWarning`` naming the re-tune."""
    from helion.exc import InvalidConfig  # already imported by the kernel module

    bound = _build(spec, args, resolved.source).bind(args)
    try:
        return bound.compile_config(resolved.config)
    except InvalidConfig as err:
        from .tuning import fit_seed

        fitted = fit_seed(bound.config_spec, resolved.config)
        if fitted is resolved.config:
            raise
        warnings.warn(registry.ConfigFallbackWarning(
            f"{spec.name}: the registry's config for {spec.key_of(args)} does not fit this version of the kernel "
            f"({err}); running it fitted to the kernel's loops and memory accesses. Re-tune: helion-kernels "
            f"autotune --kernel {spec.name} ... --force"), stacklevel=4)
        return bound.compile_config(fitted)


def _resolved(spec: KernelSpec, args: tuple) -> Resolved:
    """:func:`resolve` (once per spec, registry key, dtype, device and optional tensors passed,
    until :func:`clear_cache`), with a config the GPU refused before (at another M) replaced by
    the smaller one that launched then."""
    key = (spec.name, spec.key_of(args), args[0].dtype, args[0].device,
           tuple(isinstance(t, torch.Tensor) for t in args))
    resolved = _RESOLVED.get(key)
    if resolved is None:  # a jagged call changes its totals every step: one registry read per key
        resolved = _store(_RESOLVED, key, resolve(spec, args))
    smaller = _SHRUNK.get(_shrink_key(spec, args, resolved.config))
    return resolved if smaller is None else dataclasses.replace(resolved, config=smaller)


def resolved_config(spec: KernelSpec, args: tuple) -> Resolved:
    """The config :func:`launch` uses for ``args`` (in reference mode, where configs do not
    apply, the registry's answer)."""
    if reference_mode(spec.kernel):
        return resolve(spec, args)
    hit = _LAUNCHES.get(_signature(spec.name, args))
    return hit.resolved if hit is not None else _resolved(spec, args)


@functools.cache
def reference_mode(kernel) -> bool:
    """Whether ``kernel`` runs in Helion's reference mode (eager, configs ignored; fixed when
    the kernel is defined); if so, torch's CPU build gets the dot kernels that mode needs."""
    from helion.runtime.ref_mode import is_ref_mode_enabled  # Helion is imported by now

    found = is_ref_mode_enabled(kernel.settings)
    if found:
        cpu_reference_mode.install()
    return found


def launch(spec: KernelSpec, args: tuple):
    """Run ``spec.kernel`` on already-validated ``args`` with its registry config.

    The config is the registry's exact entry for the shape, else the nearest tuned shape's,
    else the kernel's default (both with a ``ConfigFallbackWarning``, once per shape; the
    default unwarned for a spec with ``warn_default=False``). Where
    the GPU refuses the first launch of a signature for want of shared memory (a call that
    adds a store to the tuned kernel can need more than the tuned config did), the spec's
    ``smaller_config`` steps are taken until one launches, with a ``ConfigFallbackWarning``.
    """
    key = _signature(spec.name, args)
    hit = _LAUNCHES.get(key)
    if hit is not None:
        return hit.run(*args)
    if reference_mode(spec.kernel):
        return spec.kernel(*args)
    from triton.runtime.errors import InterpreterError, OutOfResources

    resolved = _resolved(spec, args)
    original = resolved.config
    while True:
        run = _compiled(spec, args, resolved)
        try:
            out = run(*args)
        except OutOfResources as err:
            if getattr(err, "name", None) != "shared memory":
                raise
            resolved = _smaller(spec, args, resolved, original, err)
            continue
        except InterpreterError as err:
            raise _interpreter_error(spec.name, err) from err
        if key is not None:
            _store(_LAUNCHES, key, _Launch(run, resolved))
        return out


def _interpreter_error(name: str, err: Exception) -> RuntimeError:
    """What a user sees where Triton's interpreter cannot run a kernel the op launched."""
    return RuntimeError(
        f"{name}: Triton's interpreter (TRITON_INTERPRET=1) cannot run this kernel "
        f"({str(err).strip().splitlines()[-1][:160]}); to run the ops on a CPU, set HELION_INTERPRET=1 "
        f"instead (Helion's reference mode)")


def _shrink_key(spec: KernelSpec, args: tuple, config) -> tuple:
    """What decides whether a config fits a block's shared memory: the spec, the config, the
    call's key but for M, dtype, and which optional tensors the call passes."""
    return (spec.name, repr(config), tuple(spec.key_of(args))[1:], args[0].dtype,
            tuple(isinstance(t, torch.Tensor) for t in args))


def _smaller(spec: KernelSpec, args: tuple, resolved: Resolved, original, err: Exception) -> Resolved:
    """``resolved`` with ``spec.smaller_config`` of its config, remembered for other M and
    warned once per shape apart from M; ``err`` re-raised where there is none."""
    smaller = None if spec.smaller_config is None else spec.smaller_config(resolved.config)
    if smaller is None or repr(smaller) == repr(resolved.config):
        raise err
    shrink_key = _shrink_key(spec, args, original)
    first = shrink_key not in _SHRUNK
    _SHRUNK[shrink_key] = smaller
    shape, gpu = spec.key_of(args), registry.gpu_key(args[0].device)
    if first and _first_warning("shared_memory", spec, shape, args[0].dtype, gpu):
        warnings.warn(f"{spec.name}: the {resolved.source} config needs more shared memory than the GPU has "
                      f"for this call ({err}); running it with smaller tiles or fewer pipeline stages",
                      registry.ConfigFallbackWarning, stacklevel=4)
    return dataclasses.replace(resolved, config=smaller)


def launch_kernel(kernel, args: tuple, config: Callable[[], Any] | None = None):
    """Run a kernel that has no spec of its own, compiled once per signature with
    ``config()`` (called on the first launch only) or the one config pinned on the kernel;
    eagerly in reference mode."""
    key = _signature(kernel, args)
    hit = _LAUNCHES.get(key)
    if hit is not None:
        return hit.run(*args)
    if reference_mode(kernel):
        return kernel(*args)
    from triton.runtime.errors import InterpreterError

    chosen = config() if config is not None else _pinned(kernel)
    try:
        if chosen is None:
            return kernel(*args)
        run = kernel.bind(args).compile_config(chosen)
        out = run(*args)
    except InterpreterError as err:
        raise _interpreter_error(getattr(kernel, "name", "kernel"), err) from err
    if key is not None:
        _store(_LAUNCHES, key, _Launch(run, Resolved(chosen, "pinned", None)))
    return out


def _pinned(kernel):
    configs = getattr(kernel, "configs", None) or []
    return configs[0] if len(configs) == 1 else None


# An unfused pipeline other than the spec's dispatch_baseline is followed from an entry at
# most this far (registry.shape_distance: N within 2x, M within 4x, K within 16x).
ALTERNATIVE_PIPELINE_REACH = 1.0


def decide(spec: KernelSpec, args: tuple, fused: bool | None = None, training: bool = False) -> Decision:
    """The path of a call of ``spec``'s op with the kernel arguments ``args``.

    In order: ``fused=True`` past the kernel's N limit (``spec.n_limit``) raises; M = 0 or
    N = 0 runs unfused (nothing to multiply); past the N limit, unfused; ``fused`` True or
    False forces; a spec without a ``dispatch_baseline`` always runs fused; reference mode
    runs the kernel; otherwise the registry's record for the shape (exact, or the nearest
    tuned shape's, with a ``ConfigFallbackWarning`` when that one is unfused): fused only
    where tuning or the benchmark measured the kernel faster. ``training``: the call also
    writes what its backward needs, and follows the entry's training record where it has
    one (fused only where the forward decision is fused too). The unfused ``pipeline`` is
    the registry's in every case (Liger's norm only where it runs here and the entry is
    near). Cached per spec, flags, shapes ((H, D) for attention), dtype and device.

    Raises:
        ValueError: ``fused=True`` with N past the kernel's limit.
    """
    a, b = args[0], args[1]
    # an attention call's decision depends on (H, D) and whether it has rows, not on its jagged total
    sizes = (*spec.key_of(args), a.shape[0] == 0) if spec.workload == "attention" else (a.shape, b.shape)
    key = (spec.name, fused, training, sizes, a.dtype, a.device)
    hit = _DECISIONS.get(key)
    if hit is None:
        hit = _store(_DECISIONS, key, _decide(spec, args, fused, training))
    return hit


def _decide(spec: KernelSpec, args: tuple, fused: bool | None, training: bool) -> Decision:
    a, b = args[0], args[1]
    m, n = a.shape[0], b.shape[1]
    if spec.n_limit is not None:
        device = a.device if a.is_cuda else None
        limit = spec.n_limit(a.dtype, device)
        if n > limit:
            if fused:
                from .limits import check_full_row_n

                check_full_row_n(n, a.dtype, device, op=spec.name)
            return Decision(False, spec.dispatch_baseline)
    if m == 0 or n == 0:
        return Decision(False, spec.dispatch_baseline)
    if fused is True or spec.dispatch_baseline is None:
        return Decision(fused is not False)
    if fused is None and reference_mode(spec.kernel):
        return Decision(True)
    recorded = _recorded(spec, args, training)
    if fused is False:
        return dataclasses.replace(recorded, fused=False)
    if recorded.followed is not None and not recorded.fused:
        _warn_followed(spec, args, recorded, training)
    return recorded


def _recorded(spec: KernelSpec, args: tuple, training: bool) -> Decision:
    """The registry's decision for a call (no flags, no limits)."""
    a = args[0]
    key = spec.key_of(args)
    found = registry.lookup(spec.name, key, registry.dtype_name(a.dtype), registry.gpu_key(a.device), warn=False)
    decision = registry_decision(spec, found, key, training, a.device)
    if training and decision.fused:
        # the training write adds work to the fused path only: never fused where the forward is not
        decision = dataclasses.replace(decision, fused=registry_decision(spec, found, key, False, a.device).fused)
    return decision


def registry_decision(spec: KernelSpec, found: registry.Lookup, key, training: bool = False,
                      device: torch.device | None = None) -> Decision:
    """What a registry lookup for a call at ``key`` says: the entry's training record
    (``training``) or forward ``dispatch`` record; unfused without an entry. With a
    ``device``, an alternative unfused pipeline (Liger's norm) is kept only where it runs
    there at the call's N and the entry is within :data:`ALTERNATIVE_PIPELINE_REACH`; else
    the spec's ``dispatch_baseline``, the choice taken again against that pipeline's
    recorded time where it was timed. Without one (a report), the record as it stands."""
    entry = found.entry
    meta = {} if entry is None else entry.meta
    record = meta.get(registry.TRAINING_DISPATCH) if training else None
    record = record if record is not None else meta.get("dispatch", {})
    fused, pipeline = record.get("choice") == "fused", record.get("unfused")
    if pipeline is not None and pipeline != spec.dispatch_baseline and device is not None:
        near = registry.shape_distance(entry.shape, key) <= ALTERNATIVE_PIPELINE_REACH
        liger = pipeline == liger_norm.PIPELINE and spec.workload == "gemm"  # a GEMM pipeline's alternative only
        if not (liger and liger_norm.available(device, key.N) and near):
            pipeline = spec.dispatch_baseline
            timed = record.get("unfused_timed_ms", {}).get(pipeline)
            if timed is not None:
                fused = timed >= record.get("margin", 1.0) * record["fused_ms"]
    return Decision(fused, pipeline, record, None if found.source == "exact" else entry)


def _warn_followed(spec: KernelSpec, args: tuple, decision: Decision, training: bool) -> None:
    a = args[0]
    key, gpu = spec.key_of(args), registry.gpu_key(a.device)
    if not _first_warning("dispatch_training" if training else "dispatch", spec, key, a.dtype, gpu):
        return
    dtype, followed = registry.dtype_name(a.dtype), decision.followed
    warnings.warn(
        f"{spec.name}: no dispatch decision tuned for {key} {dtype} on {gpu}; "
        f"following the one {'(for training calls) ' if training else ''}tuned for {followed.shape} "
        f"{followed.dtype} (unfused). {registry.tune_advice(spec.name, key, dtype, gpu)}"
        + (" (and for training calls bench/postnorm_training_forward.py, then "
           "bench/dispatch_from_bench.py --training)" if training and registry.untunable(gpu) is None else ""),
        registry.ConfigFallbackWarning, stacklevel=5)


def clear_cache() -> None:
    """Forget compiled launches and decisions, so the next call re-reads the registry (a
    registry written by ``helion-kernels autotune`` in another process is then seen)."""
    for cache in (_LAUNCHES, _DECISIONS, _SHRUNK, _RESOLVED, _WARNED):
        cache.clear()
    _dynamic_build.cache_clear()


def check_runnable(op: str, device: torch.device) -> None:
    """One clear line instead of a kernel error when ``device`` cannot run the kernels.

    Raises:
        ValueError: a CPU (or other non-CUDA) tensor outside the interpret modes, or both
            interpret modes at once.
    """
    if device.type == "cuda":  # (Helion itself refuses both interpret modes at once on a GPU)
        return
    helion_mode = os.environ.get("HELION_INTERPRET", "0") not in ("", "0")
    triton_mode = os.environ.get("TRITON_INTERPRET") == "1"
    if helion_mode and triton_mode:
        raise ValueError(f"{op}: HELION_INTERPRET=1 and TRITON_INTERPRET=1 are both set; Helion runs one "
                         f"interpreter at a time (HELION_INTERPRET=1 runs the ops on a CPU)")
    if not (helion_mode or triton_mode):
        raise ValueError(
            f"{op}: the kernels need CUDA tensors, got {device.type} tensors. Without a GPU, "
            f"set HELION_INTERPRET=1 before the first call to run them in Helion's reference "
            f"mode (eager PyTorch: checks the math, slowly)"
        )
