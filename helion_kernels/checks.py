"""Input validation shared by the public ops: every check runs before any kernel launches.

All checks read only metadata (shape, dtype, device, requires_grad) and Python scalars, so
they also run while ``torch.compile`` traces a model (on fake tensors); the one check that
reads tensor values, :func:`check_offsets`, runs inside the ops at launch.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import torch

from .limits import ACTIVATIONS
from .registry import DTYPE_NAMES, dtype_name

SUPPORTED_DTYPES = tuple(getattr(torch, name) for name in DTYPE_NAMES)


def finite(op: str, name: str, x, minimum: float | None = None) -> float:
    """``x`` as a float; TypeError unless it is a real number, ValueError unless it is finite
    (and >= minimum). While ``torch.compile`` traces, the value is not checked: a changing
    eps is traced as a symbolic float, which has no value yet (eager calls check it)."""
    if not isinstance(x, Real) or isinstance(x, bool):
        raise TypeError(f"{op}: {name} must be a real number, got {type(x).__name__} {x!r}")
    if torch.compiler.is_compiling():
        return x
    try:
        value = float(x)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value) or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum:g}"
        raise ValueError(f"{op}: {name} must be a finite number{bound}, got {x!r}")
    return value


def flag(op: str, name: str, x) -> bool:
    """``x`` if it is a bool; TypeError otherwise (``return_stats="no"`` is a bug, not a no)."""
    if not isinstance(x, bool):
        raise TypeError(f"{op}: {name} must be True or False, got {x!r}")
    return x


def same_device(op: str, *tensors: torch.Tensor) -> torch.device:
    """The one device of ``tensors``; ValueError if they are on several, or on ``meta``."""
    device = tensors[0].device
    for t in tensors[1:]:
        if t.device != device:
            raise ValueError(f"{op}: all tensors must be on one device, got "
                             f"{sorted({str(t.device) for t in tensors})}")
    if device.type == "meta":
        raise ValueError(f"{op}: meta tensors hold no data; pass CUDA tensors")
    return device


def gemm_operands(op: str, a: object, b: object, names: tuple[str, str] = ("a", "b")) -> None:
    """``a`` [M, K] and ``b`` [K, N]: tensors of one supported dtype, on one device, K >= 1
    (``names``: the caller's argument names, for the messages)."""
    an, bn = names
    for name, t in ((an, a), (bn, b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(
                f"{op}: {name} must be 2-D ({'[M, K]' if name == an else '[K, N]'}), "
                f"got shape {tuple(t.shape)}"
                + (f"; flatten leading dims with {an}.reshape(-1, K)" if name == an else "")
            )
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(
                f"{op}: {name} has dtype {t.dtype}; supported: "
                f"{', '.join(dtype_name(d) for d in SUPPORTED_DTYPES)}"
            )
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: {an} and {bn} must share a dtype, got {a.dtype} and {b.dtype}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"{op}: mismatched K: {an} is {tuple(a.shape)} ([M, K]) but {bn} is {tuple(b.shape)} ([K, N])"
        )
    if a.shape[1] == 0:
        raise ValueError(f"{op}: K must be at least 1, got {an} of shape {tuple(a.shape)}")
    same_device(op, a, b)


def norm_params(op: str, a: torch.Tensor, n: int, eps, dim: str = "N", **params) -> float:
    """Each affine parameter in ``params`` None or a float tensor [n] on ``a``'s device
    (``dim`` names n in the message); ``eps`` finite and >= 0, returned as a float."""
    for name, t in params.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a torch.Tensor or None, got {type(t).__name__}")
        if t.shape != (n,):
            raise ValueError(f"{op}: {name} must have shape [{dim}] = ({n},), got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{op}: {name} must be floating point, got {t.dtype}")
        if t.device != a.device:
            same_device(op, a, t)
    return finite(op, "eps", eps, minimum=0.0)


def residual(op: str, residual, a: torch.Tensor, b: torch.Tensor) -> None:
    """``residual`` None or a float tensor [M, N] (``a`` [M, K] @ ``b`` [K, N]) on their device."""
    if residual is None:
        return
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"{op}: residual must be a torch.Tensor or None, got {type(residual).__name__}")
    shape = (a.shape[0], b.shape[1])
    if tuple(residual.shape) != shape:
        raise ValueError(f"{op}: residual must have shape [M, N] = {shape}, got {tuple(residual.shape)}")
    if not residual.is_floating_point():
        raise TypeError(f"{op}: residual must be floating point, got {residual.dtype}")
    same_device(op, a, residual)


def row_stat(op: str, name: str, t, a: torch.Tensor) -> None:
    """``t`` None or an fp32 tensor [M] (one value per row of ``a`` [M, K]) on ``a``'s device."""
    if t is None:
        return
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor or None, got {type(t).__name__}")
    if tuple(t.shape) != (a.shape[0],):
        raise ValueError(f"{op}: {name} must have shape [M] = ({a.shape[0]},), got {tuple(t.shape)}")
    if t.dtype != torch.float32:
        raise TypeError(f"{op}: {name} must be float32 (the rows' statistics in fp32), got {t.dtype}")
    same_device(op, a, t)


def fused_flag(op: str, fused) -> None:
    """``fused`` must be None, True or False."""
    if fused is not None and not isinstance(fused, bool):
        raise TypeError(f"{op}: fused must be None, True or False, got {fused!r}")


def jagged(op: str, q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv,
           activation, qk_scale) -> None:
    """Ranks, dtypes, devices and sizes of a jagged attention call (not the offsets' values:
    :func:`check_offsets`)."""
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
    same_device(op, q, k, v, q_offsets, kv_offsets)
    if activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {ACTIVATIONS}, got {activation!r}")
    finite(op, "qk_scale", qk_scale)
    for name, limit in (("max_seq_len_q", max_seq_len_q), ("max_seq_len_kv", max_seq_len_kv)):
        if isinstance(limit, bool) or not isinstance(limit, Integral) or limit < 0:
            raise ValueError(f"{op}: {name} must be an int >= 0, got {limit!r}")


def check_offsets(op: str, q_offsets: torch.Tensor, kv_offsets: torch.Tensor, total_q: int,
                  total_kv: int, max_seq_len_q: int, max_seq_len_kv: int) -> None:
    """The jagged layout's values (one device-to-host copy of each offsets tensor): from 0
    to the total, non-decreasing, no sequence past its maximum length.

    Raises:
        ValueError: naming the first problem found.
    """
    for name, offsets, total, limit in (("q", q_offsets, total_q, max_seq_len_q),
                                        ("kv", kv_offsets, total_kv, max_seq_len_kv)):
        values = offsets.tolist()
        lengths = [b - a for a, b in zip(values, values[1:])]
        if values[0] != 0 or values[-1] != total or any(n < 0 for n in lengths):
            raise ValueError(f"{op}: {name}_offsets must start at 0, never decrease and end at "
                             f"{total} (the rows of {name if name == 'q' else 'k/v'}); got "
                             f"{values[:4]}{'...' if len(values) > 4 else ''} ending at {values[-1]}")
        if lengths and max(lengths) > limit:
            raise ValueError(f"{op}: a {name} sequence has {max(lengths)} rows, more than "
                             f"max_seq_len_{name} = {limit}")
