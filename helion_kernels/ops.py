"""Public functions: validate inputs, pick the tuned config, launch the Helion kernel.

Every check runs before any kernel launches. Configs come from the committed registry
(:mod:`helion_kernels.registry`); a call never autotunes. The bound, compiled kernel is
cached per specialization (shapes, strides, dtypes, device), so the registry is read once
per shape per process: configs tuned by another process are seen after a restart.
"""

from __future__ import annotations

import os
from numbers import Real

import torch
from helion.runtime.ref_mode import is_ref_mode_enabled

from . import registry
from .kernels import matmul as _matmul
from .kernels import rmsnorm_matmul as _rmsnorm_matmul
from .kernels.spec import KernelSpec
from .kernels.rmsnorm_matmul import fold_rmsnorm_weight

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


# specialization -> (compiled BoundKernel, where its config came from)
_BOUND: dict[tuple, tuple[object, registry.Resolved]] = {}


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
            f"{op}: needs CUDA tensors, got {device.type}. CPU tensors are accepted only "
            "under HELION_INTERPRET=1 or TRITON_INTERPRET=1, which the CPU test suite uses "
            "together with two small patches for gaps of torch's CPU build and of the Triton "
            "interpreter (tests/conftest.py)."
        )


def _check_gemm_operands(op: str, a: object, b: object) -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(
                f"{op}: {name} must be 2-D ({'[M, K]' if name == 'a' else '[K, N]'}), "
                f"got shape {tuple(t.shape)}; flatten leading dims with a.reshape(-1, K)"
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
        bound.set_config(resolved.config)
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
        return spec.kernel(*args)
    return _bound(spec, args)[0](*args)


def clear_cache() -> None:
    """Forget compiled kernels so the next call re-reads the registry."""
    _BOUND.clear()


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
    ``rstd = 1 / sqrt(mean(a**2, dim=1) + eps)``: the k-loop accumulates ``a @ b`` and the
    per-row sum of squares of ``a`` together, and the epilogue scales by ``rstd``.
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
    k = a.shape[1]
    if weight is not None:
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"{op}: weight must be a torch.Tensor or None, got {type(weight).__name__}")
        if tuple(weight.shape) != (k,):
            raise ValueError(f"{op}: weight must have shape [K] = ({k},), got {tuple(weight.shape)}")
        if not weight.is_floating_point():
            raise TypeError(f"{op}: weight must be floating point, got {weight.dtype}")
        _check_device(op, a, weight)
    if isinstance(eps, bool) or not isinstance(eps, Real) or not eps >= 0 or eps == float("inf"):
        raise ValueError(f"{op}: eps must be a finite number >= 0, got {eps!r}")
    _check_no_grad(op, a, b, weight)
    m, n = a.shape[0], b.shape[1]
    if m == 0 or n == 0:
        c = a.new_empty(m, n)
        rstd = torch.empty(m, dtype=torch.float32, device=a.device)
    else:
        if weight is not None:
            b = fold_rmsnorm_weight(weight, b)
        c, rstd = run(_rmsnorm_matmul.SPEC, (a.contiguous(), b.contiguous(), float(eps)))
    return (c, rstd) if return_rstd else c
