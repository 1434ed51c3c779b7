"""Public functions: validate inputs, pick the tuned config, launch the Helion kernel.

Every check runs before any kernel launches. Configs come from the committed registry
(:mod:`helion_kernels.registry`); a call never autotunes. The bound, compiled kernel is
cached per specialization (shapes, strides, dtypes, device), so the registry is read once
per shape per process: configs tuned by another process are seen after a restart.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from numbers import Integral, Real

import helion
import torch
import torch.nn.functional as F
from helion.runtime.ref_mode import is_ref_mode_enabled

from . import registry
from .kernels import matmul as _matmul
from .kernels import postnorm_full_row as _postnorm
from .kernels import postnorm_row_sweep as _row_sweep
from .kernels import postnorm_split_n as _split_n
from .kernels import postnorm_deferred as _deferred
from .kernels import flash_norm_attention as _fna
from .kernels import gdpa as _gdpa
from .kernels import rmsnorm_matmul as _rmsnorm_matmul
from .kernels.spec import AttentionShape, KernelSpec, Shape
from .kernels.rmsnorm_matmul import fold_rmsnorm_weight

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


# specialization -> (compiled BoundKernel, where its config came from)
_BOUND: dict[tuple, tuple[object, registry.Resolved]] = {}
# (kernel, shape, dtype, gpu) -> whether the registry chose the fused kernel
_FUSED_CHOICE: dict[tuple, bool] = {}
# specialisation -> compiled BoundKernel, for kernels run outside KernelSpec (_cached_call)
_CALL_BOUND: dict[tuple, object] = {}


def interpret_mode() -> str | None:
    """``"helion"`` under HELION_INTERPRET=1, ``"triton"`` under TRITON_INTERPRET=1, else None."""
    if os.environ.get("HELION_INTERPRET", "0") not in ("", "0"):
        return "helion"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "triton"
    return None


def _check_device(op: str, *tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"{op}: all tensors must be on one device, got {sorted(map(str, devices))}")
    (device,) = devices
    if device.type == "meta":
        raise ValueError(f"{op}: meta tensors hold no data; pass CUDA tensors")
    if device.type != "cuda" and interpret_mode() is None:
        raise ValueError(
            f"{op}: needs CUDA tensors, got {device.type}. (The CPU test suite runs the "
            "kernels under HELION_INTERPRET=1 or TRITON_INTERPRET=1, and only with two patches "
            "for gaps of torch's CPU build and of the Triton interpreter, in tests/conftest.py; "
            "that is for checking the kernels, not for using them.)"
        )


def _check_gemm_operands(op: str, a: object, b: object) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(
                f"{op}: {name} must be 2-D ({'[M, K]' if name == 'a' else '[K, N]'}), "
                f"got shape {tuple(t.shape)}"
                + ("; flatten leading dims with a.reshape(-1, K)" if name == "a" else "")
            )
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"{op}: {name} has dtype {t.dtype}; supported: "
                f"{', '.join(registry.dtype_name(d) for d in SUPPORTED_DTYPES)}"
            )
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: a and b must share a dtype, got {a.dtype} and {b.dtype}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"{op}: mismatched K: a is {tuple(a.shape)} ([M, K]) but b is {tuple(b.shape)} ([K, N])"
        )
    if a.shape[1] == 0:
        raise ValueError(f"{op}: K must be at least 1, got a of shape {tuple(a.shape)}")
    _check_device(op, a, b)


def _check_no_grad(op: str, *tensors: torch.Tensor | None) -> None:
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise NotImplementedError(
            f"{op} has no backward yet; call it under torch.no_grad() or on tensors that "
            "do not require grad"
        )


def _bound(spec: KernelSpec, args: tuple) -> tuple[object, registry.Resolved]:
    key = (spec.name, spec.kernel.specialization_key(args))
    hit = _BOUND.get(key)
    if hit is None:
        gpu = registry.gpu_key(args[0].device)
        resolved = registry.resolve(
            spec.name, spec.default_config, spec.shape_of(args), args[0].dtype, gpu
        )
        bound = spec.kernel.bind(args)
        config = resolved.config
        if spec.portable_config is not None:
            config = spec.portable_config(config)
        if spec.fit_config is not None and resolved.source != "exact":
            config = spec.fit_config(config, args)
        bound.set_config(config)
        hit = _BOUND[key] = (bound, resolved)
    return hit


def resolved_config(spec: KernelSpec, args: tuple) -> registry.Resolved:
    """The registry config (and its source) that :func:`run` uses for ``args``."""
    return _bound(spec, args)[1]


def run(spec: KernelSpec, args: tuple):
    """Launch ``spec.kernel`` on already-validated ``args`` with its registry config.

    In Helion's reference mode (HELION_INTERPRET=1) configs do not apply and the kernel
    runs eagerly. Otherwise the config is the registry's exact entry for the shape, else
    the nearest tuned shape's, else the kernel's default (both with a warning, once per
    shape and process).
    """
    if is_ref_mode_enabled(spec.kernel.settings):
        return _reference_mode_call(spec.kernel, args)
    return _bound(spec, args)[0](*args)


def _reference_mode_call(kernel, args: tuple):
    """Run ``kernel`` eagerly (Helion's reference mode), turning the CPU build's missing
    ``mm``/``bmm`` with ``out_dtype`` into an error that says what is going on."""
    try:
        return kernel(*args)
    except NotImplementedError as err:
        if "mm.dtype" not in str(err):
            raise
        raise NotImplementedError(
            "Helion's reference mode (HELION_INTERPRET=1) runs the kernels' dots as "
            "torch.mm / torch.bmm with out_dtype=, which torch's CPU build does not implement. "
            "Run on a CUDA device; the CPU test suite patches this in tests/conftest.py to "
            "check the kernels' math."
        ) from err


def clear_cache() -> None:
    """Forget compiled kernels and dispatch decisions so the next call re-reads the registry."""
    _BOUND.clear()
    _FUSED_CHOICE.clear()
    _CALL_BOUND.clear()


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The Helion GEMM ``a @ b`` with the tuned config for this shape.

    Args:
        a: [M, K], bf16, fp16 or fp32, on a CUDA device.
        b: [K, N], same dtype and device.

    Returns:
        [M, N] in the input dtype; fp32 accumulation (fp32 inputs use TF32 tensor cores).

    Raises:
        TypeError: non-tensor input, unsupported or mismatched dtypes.
        ValueError: not 2-D, mismatched K, K = 0, CPU tensors outside interpret modes,
            tensors on different devices.
        NotImplementedError: an input requires grad (no backward yet).
    """
    _check_gemm_operands("matmul", a, b)
    _check_no_grad("matmul", a, b)
    if a.shape[0] == 0 or b.shape[1] == 0:
        return a.new_empty(a.shape[0], b.shape[1])
    return run(_matmul.SPEC, (a.contiguous(), b.contiguous()))


def rmsnorm_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    return_rstd: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``rmsnorm(a, weight, eps) @ b`` in one kernel (deferred pre-norm).

    Computes ``c = (a * rstd[:, None] * weight) @ b`` with
    ``rstd = 1 / sqrt(mean(a**2, dim=1) + eps)``: the GEMM runs on the raw ``a`` and its
    epilogue scales the accumulator by ``rstd``, which each program computes once for its
    block of rows (see :mod:`helion_kernels.kernels.rmsnorm_matmul`).
    Technique 2 ("deferred pre-norm") of the PyTorch blog "Towards Free Normalization:
    Fusing Normalization into GEMM and Attention Kernels" (Meta, 2026).

    Args:
        a: [M, K] activations, bf16, fp16 or fp32, on a CUDA device. The norm is over K.
        b: [K, N] right operand, same dtype and device (for an ``nn.Linear`` weight W of
            shape [N, K], pass ``W.t().contiguous()`` once).
        weight: optional RMSNorm affine weight [K]. It is folded into ``b``
            (:func:`fold_rmsnorm_weight`) on every call; when it is fixed across calls,
            fold it once yourself and pass ``weight=None``.
        eps: added to the mean square, >= 0.
        return_rstd: also return ``rstd`` [M] fp32 (what a backward needs).

    Returns:
        ``c`` [M, N] in the input dtype (fp32 accumulation and statistics), or
        ``(c, rstd)`` with ``return_rstd=True``.

    Raises:
        TypeError: non-tensor input, unsupported or mismatched dtypes.
        ValueError: not 2-D, mismatched K, K = 0, weight not of shape [K], negative eps,
            CPU tensors outside interpret modes, tensors on different devices.
        NotImplementedError: an input requires grad (no backward yet).
    """
    op = "rmsnorm_matmul"
    _check_gemm_operands(op, a, b)
    _check_norm_params(op, a, a.shape[1], eps, dim="K", weight=weight)  # the norm is over K
    _check_no_grad(op, a, b, weight)
    m, n = a.shape[0], b.shape[1]
    if m == 0 or n == 0:
        c = a.new_empty(m, n)
        rstd = torch.rsqrt(a.float().pow(2).mean(dim=1) + eps)  # defined: the norm is over K
    else:
        if weight is not None:
            b = fold_rmsnorm_weight(weight, b)
        c, rstd = run(_rmsnorm_matmul.SPEC, (a.contiguous(), b.contiguous(), float(eps)))
    return (c, rstd) if return_rstd else c


# --- full-row post-norm: GEMM -> LayerNorm / RMSNorm over N (technique 1) ----------------


def _layer_norm(x, weight, bias, eps):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def _rms_norm(x, weight, eps):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _layer_norm_stats(x32, weight, bias, eps):
    """LayerNorm of an fp32 [M, N] and its (mean, rstd), all in fp32."""
    var, mean = torch.var_mean(x32, dim=1, correction=0)
    rstd = torch.rsqrt(var + eps)
    y = (x32 - mean[:, None]) * rstd[:, None]
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y, mean, rstd


def _rms_norm_stats(x32, weight, eps):
    """RMSNorm of an fp32 [M, N] and its rstd, in fp32."""
    rstd = torch.rsqrt(x32.pow(2).mean(dim=1) + eps)
    y = x32 * rstd[:, None]
    return (y if weight is None else y * weight.float()), rstd


@functools.cache
def _inductor(fn):
    """``fn`` compiled by inductor once per process (it then specializes per shape)."""
    return torch.compile(fn, dynamic=False)


def _unfused_norm(fn, x: torch.Tensor, *params):
    """The standalone norm of the unfused path: inductor-compiled on CUDA, eager elsewhere."""
    return (_inductor(fn) if x.is_cuda else fn)(x, *params)


def _check_norm_params(op: str, a: torch.Tensor, n: int, eps, dim: str = "N", **params) -> None:
    """Each affine parameter in ``params`` None or a float tensor [n] on ``a``'s device (``dim``
    names n in the message); ``eps`` finite and >= 0."""
    for name, t in params.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor or None, got {type(t).__name__}")
        if tuple(t.shape) != (n,):
            raise ValueError(f"{op}: {name} must have shape [{dim}] = ({n},), got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{op}: {name} must be floating point, got {t.dtype}")
        _check_device(op, a, t)
    _finite(op, "eps", eps, minimum=0.0)


def _registry_choice(spec: KernelSpec, args: tuple) -> bool:
    """The registry's dispatch decision for this call's shape (read without compiling)."""
    a = args[0]
    shape, dtype, gpu = spec.shape_of(args), registry.dtype_name(a.dtype), registry.gpu_key(a.device)
    key = (spec.name, shape, dtype, gpu)
    if key not in _FUSED_CHOICE:
        entries = registry.entries_for(spec.name, gpu)
        entry = entries.get((*shape, dtype)) or registry.nearest_entry(entries, shape, dtype)
        choice = entry is not None and entry.meta.get("dispatch", {}).get("choice") == "fused"
        if entry is not None and not choice and entry.key != (*shape, dtype):
            # (A fused choice warns when the kernel picks up the nearest shape's config.)
            warnings.warn(
                f"{spec.name}: no dispatch decision tuned for {shape} {dtype} on {gpu}; "
                f"following the one tuned for {entry.shape} {entry.dtype} (unfused). Tune this "
                f"shape with: {registry.tune_command(spec.name, shape, dtype)}",
                registry.ConfigFallbackWarning,
                stacklevel=4,
            )
        _FUSED_CHOICE[key] = choice
    return _FUSED_CHOICE[key]


def use_fused(spec: KernelSpec, args: tuple, fused: bool | None = None) -> bool:
    """Whether a full-row post-norm call runs the fused kernel (True) or cuBLAS + the
    inductor norm (False).

    ``fused=None`` follows the registry: the fused kernel only where tuning measured it
    faster than ``spec.dispatch_baseline`` at this shape (or, for an untuned shape, at the
    nearest tuned one, with a warning), never for a GPU with no tuned entry, never past
    :func:`~.kernels.postnorm_full_row.max_full_row_n`. ``fused=True`` forces the kernel
    (ValueError past the N limit); ``fused=False`` forces the unfused path. In Helion's
    reference mode (no configs, no timings) the kernel always runs.

    Raises:
        TypeError: ``fused`` is not None, True or False.
        ValueError: ``fused=True`` and N is past the full-row limit.
    """
    if fused is not None and not isinstance(fused, bool):
        raise TypeError(f"fused must be None, True or False, got {fused!r}")
    a, b = args[0], args[1]
    n = b.shape[1]
    device = a.device if a.is_cuda else None
    if fused is False:
        return False
    if fused:
        _postnorm.check_full_row_n(n, a.dtype, device, op=spec.name)
        return True
    if n > _postnorm.max_full_row_n(a.dtype, device):
        return False
    if is_ref_mode_enabled(spec.kernel.settings):
        return True
    return _registry_choice(spec, args)


def _mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` accumulated and returned in fp32 (torch's CPU build has no ``out_dtype``)."""
    if a.is_cuda and a.dtype != torch.float32:
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()


def _like(param: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    """An affine parameter in the activation dtype, as torch's standalone norms expect."""
    return None if param is None else param.to(x.dtype)


def _as_operands(a: torch.Tensor, b: torch.Tensor, *params: torch.Tensor | None) -> tuple:
    return (a.contiguous(), b.contiguous(), *(None if p is None else p.contiguous() for p in params))


def matmul_layernorm(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    return_stats: bool = False,
    fused: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``layer_norm(a @ b, (N,), weight, bias, eps)``, fused into the GEMM where that is faster.

    Full-row post-norm fusion, technique 1 of the PyTorch blog "Towards Free Normalization:
    Fusing Normalization into GEMM and Attention Kernels" (Meta, 2026): one program owns
    whole output rows, so the row statistics are taken from the fp32 accumulator in
    registers and the un-normalised product never goes to memory
    (:mod:`helion_kernels.kernels.postnorm_full_row`). Per shape, the registry records
    whether that kernel beat cuBLAS + the inductor-compiled norm when it was tuned; the
    call runs the winner (see :func:`use_fused`), so a tuned shape never regresses.

    Args:
        a: [M, K], bf16, fp16 or fp32, on a CUDA device.
        b: [K, N], same dtype and device. N is the normalised dimension.
        weight, bias: optional LayerNorm affine parameters [N] (any float dtype).
        eps: added to the variance, >= 0.
        return_stats: also return the row ``mean`` and ``rstd`` [M] fp32 (for a backward).
        fused: None (the registry decides), True (always the fused kernel), False (always
            cuBLAS + the standalone norm).

    Returns:
        ``y`` [M, N] in the input dtype (fp32 accumulation and statistics), or
        ``(y, mean, rstd)`` with ``return_stats=True``.

    Raises:
        TypeError: non-tensor input, unsupported or mismatched dtypes.
        ValueError: not 2-D, mismatched K, K = 0, weight/bias not of shape [N], negative
            eps, CPU tensors outside interpret modes, tensors on different devices, or
            ``fused=True`` with N past the full-row limit (the error names the split-N
            strategy).
        NotImplementedError: an input requires grad (no backward yet).
    """
    op = "matmul_layernorm"
    _check_gemm_operands(op, a, b)
    _check_norm_params(op, a, b.shape[1], eps, weight=weight, bias=bias)
    _check_no_grad(op, a, b, weight, bias)
    m, n = a.shape[0], b.shape[1]
    args = (*_as_operands(a, b, weight, bias), float(eps))
    if m == 0 or n == 0:
        use_fused(_postnorm.SPEC_LAYERNORM, args, fused if fused is not None else False)
        y = a.new_empty(m, n)
        stats = torch.full((2, m), float("nan"), dtype=torch.float32, device=a.device)  # over no columns
        return (y, stats[0], stats[1]) if return_stats else y
    if use_fused(_postnorm.SPEC_LAYERNORM, args, fused):
        y, mean, rstd = run(_postnorm.SPEC_LAYERNORM, args)
        return (y, mean, rstd) if return_stats else y
    if not return_stats:
        c = torch.mm(a, b)
        return _unfused_norm(_layer_norm, c, _like(weight, c), _like(bias, c), float(eps))
    # Statistics for a backward: from the fp32 product, as the fused kernel takes them.
    y, mean, rstd = _unfused_norm(_layer_norm_stats, _mm_fp32(a, b), weight, bias, float(eps))
    return y.to(a.dtype), mean, rstd


def matmul_rmsnorm(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    return_rstd: bool = False,
    fused: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``rms_norm(a @ b, (N,), weight, eps)``, fused into the GEMM where that is faster.

    Same strategy, dispatch and errors as :func:`matmul_layernorm` (technique 1 of the
    PyTorch blog "Towards Free Normalization", 2026), with
    ``rstd = 1 / sqrt(mean((a @ b)**2, dim=1) + eps)``.

    Args:
        a: [M, K], bf16, fp16 or fp32, on a CUDA device.
        b: [K, N], same dtype and device. N is the normalised dimension.
        weight: optional RMSNorm affine weight [N].
        eps: added to the mean square, >= 0.
        return_rstd: also return ``rstd`` [M] fp32.
        fused: None (the registry decides), True (always fused), False (always unfused).

    Returns:
        ``y`` [M, N] in the input dtype, or ``(y, rstd)`` with ``return_rstd=True``.

    Raises:
        TypeError, ValueError, NotImplementedError: as :func:`matmul_layernorm`.
    """
    op = "matmul_rmsnorm"
    _check_gemm_operands(op, a, b)
    _check_norm_params(op, a, b.shape[1], eps, weight=weight)
    _check_no_grad(op, a, b, weight)
    m, n = a.shape[0], b.shape[1]
    args = (*_as_operands(a, b, weight), float(eps))
    if m == 0 or n == 0:
        use_fused(_postnorm.SPEC_RMSNORM, args, fused if fused is not None else False)
        y = a.new_empty(m, n)
        rstd = torch.full((m,), float("nan"), dtype=torch.float32, device=a.device)  # over no columns
        return (y, rstd) if return_rstd else y
    if use_fused(_postnorm.SPEC_RMSNORM, args, fused):
        y, rstd = run(_postnorm.SPEC_RMSNORM, args)
        return (y, rstd) if return_rstd else y
    if not return_rstd:
        c = torch.mm(a, b)
        return _unfused_norm(_rms_norm, c, _like(weight, c), float(eps))
    y, rstd = _unfused_norm(_rms_norm_stats, _mm_fp32(a, b), weight, float(eps))
    return y.to(a.dtype), rstd


# --- split-N post-norm (technique 3) -------------------------------------------------------


def matmul_layernorm_split_n(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    return_stats: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``layer_norm(a @ b, (N,), weight, bias, eps)`` for any N, the row split into N tiles.

    Split-N post-norm, technique 3 of the PyTorch blog "Towards Free Normalization" (Meta,
    2026), in the form that measured fastest of the four Helion versions written for it
    (README): the row sweep of :mod:`helion_kernels.kernels.postnorm_row_sweep`. The GEMM
    keeps its own N tiling (tile_n < N); one program per row block walks the block's N
    tiles, storing each un-normalised (centred on its own mean) and merging its statistics
    with Chan's formula, then re-reads the tiles from L2 and normalises them. On the H200
    it is correct but 1.11-1.24x slower than cuBLAS + the best standalone norm on every
    benchmarked shape, so ``matmul_layernorm`` does not dispatch to it; without a registry
    entry for your GPU it runs a conservative default config (with a warning).

    Args, returns and errors: as :func:`matmul_layernorm`, without ``fused`` and without an
    N limit. The un-normalised tile is stored in the input dtype between the two sweeps
    (centred on its tile mean), so with fp16 inputs a deviation past 65504 overflows, as
    in cuBLAS + a standalone norm; the full-row kernel keeps it in fp32 registers.
    """
    op = "matmul_layernorm_split_n"
    _check_gemm_operands(op, a, b)
    _check_norm_params(op, a, b.shape[1], eps, weight=weight, bias=bias)
    _check_no_grad(op, a, b, weight, bias)
    m, n = a.shape[0], b.shape[1]
    if m == 0 or n == 0:
        stats = torch.full((2, m), float("nan"), dtype=torch.float32, device=a.device)
        y = a.new_empty(m, n)
        return (y, stats[0], stats[1]) if return_stats else y
    y, mean, rstd = run(_row_sweep.SPEC_LAYERNORM, (*_as_operands(a, b, weight, bias), float(eps)))
    return (y, mean, rstd) if return_stats else y


def matmul_rmsnorm_split_n(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    return_rstd: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``rms_norm(a @ b, (N,), weight, eps)`` for any N, the row split into N tiles.

    The RMSNorm twin of :func:`matmul_layernorm_split_n` (same technique and kernel design,
    same caveats: on the H200 from break-even at K = N = 512 to 1.15x slower than cuBLAS + the
    best standalone norm; with fp16 inputs a product past 65504 overflows between the sweeps).
    Args, returns and errors: as :func:`matmul_rmsnorm`, without ``fused`` and without an
    N limit.
    """
    op = "matmul_rmsnorm_split_n"
    _check_gemm_operands(op, a, b)
    _check_norm_params(op, a, b.shape[1], eps, weight=weight)
    _check_no_grad(op, a, b, weight)
    m, n = a.shape[0], b.shape[1]
    if m == 0 or n == 0:
        rstd = torch.full((m,), float("nan"), dtype=torch.float32, device=a.device)
        y = a.new_empty(m, n)
        return (y, rstd) if return_rstd else y
    y, rstd = run(_row_sweep.SPEC_RMSNORM, (*_as_operands(a, b, weight), float(eps)))
    return (y, rstd) if return_rstd else y


def matmul_rmsnorm_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``rms_norm(a @ b, (N,), weight, eps) @ c`` without normalising ``a @ b`` (any N).

    Split-N candidate 3 (deferred post-norm) of technique 3 of the PyTorch blog "Towards
    Free Normalization" (Meta, 2026), see :mod:`helion_kernels.kernels.postnorm_deferred`:
    the first GEMM writes ``x = a @ b`` and per-row partial sums of squares; the second runs
    on ``x`` and ``w[:, None] * c`` and scales its accumulator by ``rstd``. For the Linear ->
    RMSNorm -> Linear pattern when nothing else reads the normalised activations. On the
    H200 it beats cuBLAS -> standalone RMSNorm -> cuBLAS only at K = 512 with N >= 2048
    (README), its two GEMMs running untuned at those shapes. The first GEMM's tiling is the
    phase-1 tiling of the ``matmul_rmsnorm_split_n`` registry entry of (M, K, N) (the
    persistent split-N kernel's), the second's the ``matmul`` entry of (M, N, N2), each
    falling back (with a warning) to the nearest or a default config.

    Args:
        a: [M, K], bf16, fp16 or fp32, on a CUDA device.
        b: [K, N] and c: [N, N2], same dtype and device. N is the normalised dimension.
        weight: optional RMSNorm affine weight [N], folded into ``c`` on every call (fold it
            once with :func:`fold_rmsnorm_weight` and pass ``weight=None`` to reuse it).
        eps: added to the mean square, >= 0.

    Returns:
        [M, N2] in the input dtype. ``x`` is stored in the input dtype between the GEMMs (as
        by cuBLAS + a standalone norm); statistics and accumulation are fp32.

    Raises:
        TypeError, ValueError: as :func:`matmul_rmsnorm`, and for ``c`` not [N, N2] in the
            same dtype and device, or N = 0. NotImplementedError: an input requires grad.
    """
    op = "matmul_rmsnorm_matmul"
    _check_gemm_operands(op, a, b)
    n = b.shape[1]
    if not isinstance(c, torch.Tensor):
        raise TypeError(f"{op}: c must be a torch.Tensor, got {type(c).__name__}")
    if c.dim() != 2 or c.shape[0] != n:
        raise ValueError(f"{op}: c must be 2-D [N, N2] with N = {n} (b is {tuple(b.shape)}), "
                         f"got shape {tuple(c.shape)}")
    if c.dtype != a.dtype:
        raise TypeError(f"{op}: c must have the dtype of a and b ({a.dtype}), got {c.dtype}")
    if n == 0:
        raise ValueError(f"{op}: N must be at least 1 (the norm is over N), got b of shape {tuple(b.shape)}")
    _check_device(op, a, c)
    _check_norm_params(op, a, n, eps, weight=weight)
    _check_no_grad(op, a, b, c, weight)
    m, n2 = a.shape[0], c.shape[1]
    if m == 0 or n2 == 0:
        return a.new_zeros(m, n2)
    if weight is not None:
        c = fold_rmsnorm_weight(weight, c)
    a, b, c = a.contiguous(), b.contiguous(), c.contiguous()
    def producer():
        return _split_n._phase1_config(_split_n.SPEC_RMSNORM, (a, b, None, float(eps)))

    def consumer():
        tuned = registry.resolve("matmul", _deferred.CONSUMER_DEFAULT_CONFIG, Shape(m, n, n2),
                                 a.dtype, registry.gpu_key(a.device)).config
        return helion.Config(block_sizes=tuned.block_sizes, num_warps=tuned.num_warps,
                             num_stages=tuned.num_stages)

    x, partials = _cached_call(_split_n.matmul_rmsnorm_partials_kernel, (a, b), producer)
    return _cached_call(_deferred.rmsnorm_scaled_matmul_kernel, (x, c, partials, float(eps)), consumer)


# --- jagged GDPA and FlashNormAttention (technique 4) ---------------------------------------

# gdpa's fixed config (not tuned): [tile_q, tile_kv]. FlashNormAttention's come from the
# registry, keyed by (H, D, dtype).
GDPA_CONFIG = helion.Config(block_sizes=[64, 64], num_warps=4, num_stages=2)


def _finite(op: str, name: str, x, minimum: float | None = None) -> float:
    """``x`` as a float; ValueError unless it is a finite real number (>= minimum)."""
    try:
        value = float(x) if isinstance(x, Real) and not isinstance(x, bool) else None
    except OverflowError:
        value = None
    if value is None or not math.isfinite(value) or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum:g}"
        raise ValueError(f"{op}: {name} must be a finite number{bound}, got {x!r}")
    return value


def _check_jagged(op: str, q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv,
                  activation, qk_scale, validate: bool) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{op}: {name} must be 3-D [total, H, D], got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES or t.dtype != q.dtype:
            raise TypeError(f"{op}: q, k, v must share one of bf16/fp16/fp32, got "
                            f"{q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[1] < 1 or q.shape[2] < 16:
        raise ValueError(f"{op}: q must be [total_q, H, D] with H >= 1 and D >= 16 (the smallest "
                         f"tensor-core dot), got shape {tuple(q.shape)}")
    if k.shape != v.shape or k.shape[1:] != q.shape[1:]:
        raise ValueError(f"{op}: k and v must be [total_kv, H, D] with q's H and D; got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    for name, t in (("q_offsets", q_offsets), ("kv_offsets", kv_offsets)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64:
            got = f"a {t.dtype} tensor" if isinstance(t, torch.Tensor) else type(t).__name__
            raise TypeError(f"{op}: {name} must be an int64 tensor [B + 1], got {got}")
        if t.dim() != 1 or t.numel() < 1:
            raise ValueError(f"{op}: {name} must be 1-D with B + 1 >= 1 entries, got shape "
                             f"{tuple(t.shape)}")
    if q_offsets.numel() != kv_offsets.numel():
        raise ValueError(f"{op}: q_offsets has {q_offsets.numel()} entries and kv_offsets "
                         f"{kv_offsets.numel()}; both must be [B + 1]")
    _check_device(op, q, k, v, q_offsets, kv_offsets)
    if activation not in _gdpa.ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {_gdpa.ACTIVATIONS}, got {activation!r}")
    _finite(op, "qk_scale", qk_scale)
    for name, limit in (("max_seq_len_q", max_seq_len_q), ("max_seq_len_kv", max_seq_len_kv)):
        if isinstance(limit, bool) or not isinstance(limit, Integral) or limit < 0:
            raise ValueError(f"{op}: {name} must be an int >= 0, got {limit!r}")
    _check_no_grad(op, q, k, v)
    if not validate:
        return
    # One device-to-host copy of the offsets: the jagged layout must be consistent.
    for name, offsets, total, limit in (
        ("q", q_offsets, q.shape[0], max_seq_len_q), ("kv", kv_offsets, k.shape[0], max_seq_len_kv)
    ):
        values = offsets.tolist()
        lengths = [b - a for a, b in zip(values, values[1:])]
        if values[0] != 0 or values[-1] != total or any(n < 0 for n in lengths):
            raise ValueError(f"{op}: {name}_offsets must start at 0, never decrease and end at "
                             f"{total} (the rows of {name if name == 'q' else 'k/v'}); got "
                             f"{values[:4]}{'...' if len(values) > 4 else ''} ending at {values[-1]}")
        if lengths and max(lengths) > limit:
            raise ValueError(f"{op}: a {name} sequence has {max(lengths)} rows, more than "
                             f"max_seq_len_{name} = {limit}")


def _cached_call(kernel, args: tuple, config):
    """Run ``kernel`` compiled once per specialisation with ``config()`` (called on the first
    launch only); eagerly in Helion's reference mode, where configs do not apply."""
    if is_ref_mode_enabled(kernel.settings):
        return _reference_mode_call(kernel, args)
    key = (kernel.name, kernel.specialization_key(args))
    bound = _CALL_BOUND.get(key)
    if bound is None:
        bound = kernel.bind(args)
        bound.set_config(config())
        _CALL_BOUND[key] = bound
    return bound(*args)


def _run_jagged(kernel, args: tuple, default: helion.Config, registry_name: str | None = None):
    """Run a jagged attention kernel, compiled once per (H, D, dtype, ...) specialisation,
    with the registry's config for (H, D, dtype) (``registry_name``) or ``default``."""
    def config():
        if registry_name is None:
            return default
        q = args[0]
        return registry.resolve(registry_name, default, AttentionShape(int(q.shape[1]), int(q.shape[2])),
                                q.dtype, registry.gpu_key(q.device)).config

    return _cached_call(kernel, args, config)


def gdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_seq_len_q: int,
    max_seq_len_kv: int,
    activation: str = "fast_gelu",
    qk_scale: float = 1.0,
    *,
    validate: bool = True,
) -> torch.Tensor:
    """Jagged GDPA: ``act(q_i @ k_i^T * qk_scale) @ v_i`` for every sequence i and head.

    The attention of the ads models in the PyTorch blog "Towards Free Normalization" (Meta,
    2026), an activation in place of the softmax (:mod:`helion_kernels.kernels.gdpa`). Not
    yet tuned: runs :data:`GDPA_CONFIG` on every GPU.

    Args:
        q: [total_q, H, D], bf16/fp16/fp32, CUDA. Sequence i is rows
            ``q_offsets[i]:q_offsets[i + 1]``.
        k, v: [total_kv, H, D], same dtype and device, delimited by ``kv_offsets``.
        q_offsets, kv_offsets: int64 [B + 1], from 0 to total_q / total_kv, non-decreasing.
        max_seq_len_q, max_seq_len_kv: upper bounds of the sequence lengths; the kernel
            launches programs for ``max_seq_len_q`` rows per sequence.
        activation: "fast_gelu" (GELU, tanh approximation), "gelu", "silu" or "relu".
        qk_scale: multiplies the scores before the activation.
        validate: check the offsets' values (one device-to-host copy). False skips that, and
            then offsets that are not 0..total and non-decreasing are undefined behaviour
            (out-of-bounds reads and writes on a GPU), and rows of a sequence longer than
            ``max_seq_len_q`` are left uninitialised.

    Returns:
        [total_q, H, D] in the input dtype (fp32 accumulation; the activation's output is
        rounded to the input dtype before the second GEMM, as in flash attention, so fp16
        scores past 65504 overflow). Rows of a sequence with no KV rows are 0.

    Raises:
        TypeError, ValueError: bad ranks, dtypes, devices, offsets, lengths past the
            maxima, H < 1 or D < 16, unknown activation. NotImplementedError: an input requires grad.
    """
    op = "gdpa"
    _check_jagged(op, q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv,
                  activation, qk_scale, validate)
    if q.shape[0] == 0:
        return torch.empty_like(q)
    args = (q.contiguous(), k.contiguous(), v.contiguous(), q_offsets, kv_offsets,
            int(max_seq_len_q), float(qk_scale), _gdpa.ACTIVATIONS.index(activation))
    return _run_jagged(_gdpa.gdpa_kernel, args, GDPA_CONFIG)


def flash_norm_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_seq_len_q: int,
    max_seq_len_kv: int,
    ln_weight: torch.Tensor | None = None,
    ln_bias: torch.Tensor | None = None,
    rms_weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    activation: str = "fast_gelu",
    qk_scale: float = 1.0,
    *,
    validate: bool = True,
) -> torch.Tensor:
    """FlashNormAttention forward: ``rms_norm(act(ln_q k^T) v + ln_q) + q`` in one kernel,
    with ``ln_q = layer_norm(q)``; both norms over H*D, per jagged sequence.

    Technique 4 of the PyTorch blog "Towards Free Normalization" (Meta, 2026); see
    :mod:`helion_kernels.kernels.flash_norm_attention`. One program owns a tile of Q rows of
    one sequence for all heads, walks the heads with 2-D dots and the sequence's K/V (at
    most 128 rows) in KV tiles, and rescales its own un-normalised writes for the RMSNorm. The
    config comes from the registry, keyed by (H, D, dtype) (``helion-kernels autotune
    --kernel flash_norm_attention``); untuned (H, D) take the nearest tuned one, and a GPU
    without entries the conservative default, with a ``ConfigFallbackWarning``.

    Args:
        q, k, v, q_offsets, kv_offsets, max_seq_len_q, activation, qk_scale, validate: as
            :func:`gdpa`.
        max_seq_len_kv: at most 128 (:data:`~.kernels.flash_norm_attention.MAX_SEQ_LEN_KV`).
        ln_weight, ln_bias: LayerNorm affine parameters, [H * D] or [H, D], or None.
        rms_weight: RMSNorm weight, [H * D] or [H, D], or None.
        eps: of both norms, >= 0.

    Returns:
        [total_q, H, D] in the input dtype (fp32 statistics and accumulation).

    Raises:
        ValueError: ``max_seq_len_kv`` (or a KV sequence) longer than 128, with the unfused
            alternative named; a head_dim D that is not a power of two; affine parameters of
            the wrong shape; and everything :func:`gdpa` raises.
    """
    op = "flash_norm_attention"
    limit = _fna.MAX_SEQ_LEN_KV
    if isinstance(max_seq_len_kv, Integral) and not isinstance(max_seq_len_kv, bool) and max_seq_len_kv > limit:
        raise ValueError(
            f"{op}: max_seq_len_kv = {max_seq_len_kv} is past this kernel's limit of {limit} KV "
            f"rows per sequence (the short-KV regime it is built and tuned for); use gdpa() with "
            f"separate norms for longer KV"
        )
    _check_jagged(op, q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv,
                  activation, qk_scale, validate)
    heads, dim = q.shape[1], q.shape[2]
    if dim & (dim - 1):
        # Helion 1.5 leaves the padded lanes of a non-power-of-two D in the per-head kernel's
        # LayerNorm variance (x - mean != 0 there): wrong results under Triton (bench/NOTES.md).
        raise ValueError(f"{op}: head_dim D = {dim} must be a power of two (16, 32, 64, 128, "
                         f"256, ...); use gdpa() with separate norms for other head sizes")
    params = []
    for name, t in (("ln_weight", ln_weight), ("ln_bias", ln_bias), ("rms_weight", rms_weight)):
        if t is None:
            params.append(None)
            continue
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{op}: {name} must be a floating-point tensor or None")
        if tuple(t.shape) not in ((heads * dim,), (heads, dim)):
            raise ValueError(f"{op}: {name} must have shape [H * D] = ({heads * dim},) or "
                             f"[H, D] = ({heads}, {dim}), got {tuple(t.shape)}")
        _check_device(op, q, t)
        params.append(t.reshape(heads, dim).contiguous())
    _check_no_grad(op, *[p for p in params if p is not None])
    _finite(op, "eps", eps, minimum=0.0)
    if q.shape[0] == 0:
        return torch.empty_like(q)
    args = (q.contiguous(), k.contiguous(), v.contiguous(), q_offsets, kv_offsets,
            int(max_seq_len_q), *params, float(eps), float(qk_scale), _gdpa.ACTIVATIONS.index(activation))
    return _run_jagged(_fna.flash_norm_attention_kernel, args, _fna.DEFAULT_CONFIG,
                       "flash_norm_attention")
