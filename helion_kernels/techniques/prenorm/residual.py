"""The pre-norm block's producer: ``h = x + residual``, then ``norm(h) @ b``.

One pass reads ``x`` and ``residual`` and writes ``h`` (the new residual stream) and its
rows' fp32 statistics, 8 bytes a row; the GEMM then applies them in its epilogue (the
given-statistics kernels of :mod:`.kernels`), so the normalised ``h`` is never written. The
pass is inductor-compiled (an elementwise add and two row reductions: what inductor already
emits at memory speed for ``torch.compile`` of the block), not a Helion kernel. Unfused, the
same pass also writes the normalised ``h`` and cuBLAS multiplies it: what ``torch.compile``
makes of add -> norm -> linear.
"""

from __future__ import annotations

import torch

from ... import checks, runtime
from ...autograd import (Op, col_sums, colsum_for, empty_like_layout, f32, gemm_operand, layer_row_backward,
                         layer_stats, layer_x_hat, rms_row_backward, rms_rstd, rms_x_hat, run_compiled, wgrad)
from . import LAYERNORM, _kernels, fold_rmsnorm_weight
from .layernorm import _plus_beta, folded_bias


def _add_stats(x: torch.Tensor, residual: torch.Tensor, eps: float, layernorm: int):
    """(h, mean, rstd): ``mean`` [0] for RMSNorm."""
    h = x + residual
    if layernorm:
        return (h, *layer_stats(h, eps))
    return h, h.new_empty(0, dtype=torch.float32), rms_rstd(h, eps)


def _add_norm(x: torch.Tensor, residual: torch.Tensor, eps: float, layernorm: int):
    """(h, x_hat, mean, rstd): the producer pass that also writes the normalised ``h``."""
    h, mean, rstd = _add_stats(x, residual, eps, layernorm)
    return h, (layer_x_hat(h, mean, rstd) if layernorm else rms_x_hat(h, rstd)), mean, rstd


def _spec(layernorm: int):
    return _kernels.SPEC_LAYERNORM_GIVEN if layernorm else _kernels.SPEC_GIVEN_RSTD


def _add_norm_matmul(x: torch.Tensor, residual: torch.Tensor, b: torch.Tensor, beta: torch.Tensor | None,
                     eps: float, layernorm: int, fused: bool | None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, h, mean, rstd, x_hat): ``x_hat`` the unfused path's normalised ``h`` (kept for the
    wgrad), [0, K] after the fused GEMM; ``mean`` [0] for RMSNorm."""
    b = gemm_operand(b)
    spec = _spec(layernorm)
    if runtime.decide(spec, (x, b), fused).fused:
        h, mean, rstd = run_compiled(_add_stats, x.contiguous(), residual.contiguous(), eps, layernorm)
        stats = (rstd, mean, colsum_for(b), beta) if layernorm else (rstd,)
        return runtime.launch(spec, (h, b, *stats)), h, mean, rstd, h.new_empty(0, h.shape[1])
    h, x_hat, mean, rstd = run_compiled(_add_norm, x.contiguous(), residual.contiguous(), eps, layernorm)
    return _plus_beta(x_hat, b, beta), h, mean, rstd, x_hat


def _add_norm_matmul_fake(x, residual, b, beta, eps, layernorm, fused):
    if all(isinstance(size, int) for size in (*x.shape, b.shape[1])):
        rows = 0 if runtime.decide(_spec(layernorm), (x, b), fused).fused else x.shape[0]
    else:
        rows = torch.library.get_ctx().new_dynamic_size()
    m = x.shape[0]
    return (x.new_empty(m, b.shape[1]), x.new_empty(x.shape), x.new_empty(m if layernorm else 0, dtype=torch.float32),
            x.new_empty(m, dtype=torch.float32), x.new_empty(rows, x.shape[1]))


def _norm_backward(dx_hat: torch.Tensor, h: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                   dh: torch.Tensor | None, layernorm: int, write_x_hat: bool):
    """(dH, x_hat or None) in ``h.dtype`` from ``dx_hat = dy @ b^T``: the norm's backward over
    whole rows plus the gradient reaching ``h`` itself, one pass (as inductor fuses the block's)."""
    x32 = f32(h) - mean[:, None] if layernorm else f32(h)
    x_hat = x32 * rstd[:, None]
    dn = (layer_row_backward if layernorm else rms_row_backward)(f32(dx_hat), x_hat, rstd)
    if dh is not None:
        dn = dn + f32(dh)
    return dn.to(h.dtype), (x_hat.to(h.dtype) if write_x_hat else None)


def _x_hat(h: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, layernorm: int) -> torch.Tensor:
    return layer_x_hat(h, mean, rstd) if layernorm else rms_x_hat(h, rstd)


def _grads(h: torch.Tensor, b: torch.Tensor, beta: torch.Tensor | None, mean: torch.Tensor, rstd: torch.Tensor,
           x_hat: torch.Tensor, y: torch.Tensor, dy: torch.Tensor, dh: torch.Tensor | None, layernorm: int,
           fused: bool | None, need_h: bool, need_b: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dH, dB) of ``y = norm(h) @ b + beta`` with ``h`` also an output; [0] where not needed.

    dH is the norm's backward plus the gradient reaching ``h`` itself. Fused, where
    :func:`~helion_kernels.runtime.decide` says so for the backward kernel and the forward did
    not keep ``x_hat``: the dgrad GEMM with the norm in its epilogue (``layernorm_matmul_backward``
    / ``rmsnorm_matmul_backward``), then the add. Unfused: the cuBLAS dgrad, then one compiled
    pass for the norm's backward and the add (writing ``x_hat`` for the wgrad where it is needed
    and was not kept). dB: the cuBLAS wgrad on ``x_hat``."""
    h, dy = h.contiguous(), dy.contiguous()
    kept = x_hat.shape[0] > 0
    dn = db = None
    if need_h:
        spec = _kernels.SPEC_LAYERNORM_BACKWARD if layernorm else _kernels.SPEC_BACKWARD
        if not kept and runtime.decide(spec, (h, b), fused).fused:
            if layernorm:
                s2, s1 = run_compiled(_kernels.row_terms, dy, y, beta, col_sums(b))
                dn, x_hat = runtime.launch(spec, (h, b, dy, rstd, s2, mean, s1))
            else:
                dn, x_hat = runtime.launch(spec, (h, b, dy, rstd))
            if dh is not None:
                dn = dn + dh
        else:
            dn, fresh = run_compiled(_norm_backward, torch.mm(dy, b.t()), h, mean, rstd, dh, layernorm,
                                     need_b and not kept)
            x_hat = x_hat if fresh is None else fresh
    if need_b:
        db = wgrad(x_hat if x_hat.shape[0] else run_compiled(_x_hat, h, mean, rstd, layernorm), dy, b)
    return (h.new_empty(0) if dn is None else dn), (b.new_empty(0) if db is None else db)


def _grads_fake(h, b, beta, mean, rstd, x_hat, y, dy, dh, layernorm, fused, need_h, need_b):
    return (h.new_empty(h.shape) if need_h else h.new_empty(0),
            empty_like_layout(b) if need_b else b.new_empty(0))


_GRADS = Op("add_norm_matmul_grads", _grads, _grads_fake)


def _setup_context(ctx, inputs, output):
    x, residual, b, beta, _, layernorm, fused = inputs
    y, h, mean, rstd, x_hat = output
    ctx.set_materialize_grads(False)
    x_hat = x_hat if ctx.needs_input_grad[2] else x_hat.new_empty(0, x.shape[1])  # only the wgrad reads it
    ctx.save_for_backward(h, b, beta, mean, rstd, x_hat, y)
    ctx.layernorm, ctx.fused = layernorm, fused
    ctx.mark_non_differentiable(mean, rstd, x_hat)


def _backward(ctx, dy, dh, _dmean, _drstd, _dx_hat):
    need = _OP.named(ctx.needs_input_grad)
    h, b, beta, mean, rstd, x_hat, y = ctx.saved_tensors
    dh_total = db = None
    if dy is not None:
        need_h = need.x or need.residual
        dh_total, db = _GRADS(h, b, beta, mean, rstd, x_hat, y, dy, dh, ctx.layernorm, ctx.fused, need_h, need.b)
        dh_total = dh_total if need_h else None
        db = db if need.b else None
    elif dh is not None:
        dh_total = dh
    dbeta = col_sums(dy) if dy is not None and need.beta else None
    return _OP.input_grads(x=dh_total if need.x else None, residual=dh_total if need.residual else None,
                           b=db, beta=dbeta)


_OP = Op("add_norm_matmul", _add_norm_matmul, _add_norm_matmul_fake, backward=_backward,
         setup_context=_setup_context, public="add_rmsnorm_matmul / add_layernorm_matmul")


def _checked(op: str, x, residual, b, eps, fused, **params) -> float:
    checks.gemm_operands(op, x, b, names=("x", "b"))
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"{op}: residual must be a torch.Tensor, got {type(residual).__name__}")
    if residual.shape != x.shape:
        raise ValueError(f"{op}: residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    if residual.dtype != x.dtype:
        raise TypeError(f"{op}: residual and x must have one dtype (h = x + residual is the GEMM's operand, in "
                        f"that dtype), got {residual.dtype} and {x.dtype}; cast one first")
    checks.same_device(op, x, residual)
    eps = checks.norm_params(op, x, x.shape[1], eps, dim="K", **params)
    checks.fused_flag(op, fused)
    runtime.check_runnable(op, x.device)
    return eps


def add_rmsnorm_matmul(x: torch.Tensor, residual: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None = None,
                       eps: float = 1e-5, *, fused: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual`` and ``rms_norm(h, weight, eps) @ b``: the pre-norm block's add,
    norm and Linear, with the norm deferred into the GEMM.

    One compiled pass writes ``h`` and its rows' rstd; the GEMM (``rmsnorm_matmul_given_rstd``)
    scales its accumulator by them (module docstring). Unfused (the registry's decision, or
    ``fused=False``), the pass also writes the normalised ``h`` for cuBLAS.

    Args:
        x, residual: [M, K], one dtype (bf16, fp16 or fp32) and device; ``h`` has that dtype.
        b: [K, N] right operand (``W.t()`` for an ``nn.Linear`` weight), same dtype.
        weight: optional RMSNorm weight [K], folded into ``b`` on every call.
        eps: added to the mean square, >= 0.
        fused: None: as the registry decides for ``rmsnorm_matmul_given_rstd`` (forward) and
            ``rmsnorm_matmul_backward`` (backward); True / False force.

    Returns:
        ``(y, h)``: y [M, N] and the new residual stream h [M, K]. Differentiable in ``x``,
        ``residual``, ``b`` and ``weight``; the backward keeps ``h``, the fp32 rstd and (after
        the unfused forward, when ``b`` needs a gradient) the normalised ``h``.

    Raises:
        TypeError: non-tensor input, mismatched dtypes (``x`` and ``residual`` included).
        ValueError: not 2-D, ``residual`` not of ``x``'s shape, mismatched K, a weight not of
            shape [K], negative eps, CPU tensors outside interpret modes, tensors on different devices.
    """
    eps = _checked("add_rmsnorm_matmul", x, residual, b, eps, fused, weight=weight)
    if weight is not None:
        b = fold_rmsnorm_weight(weight, b)
    y, h, *_ = _OP(x, residual, b, None, eps, 0, fused)
    return y, h


def add_layernorm_matmul(x: torch.Tensor, residual: torch.Tensor, b: torch.Tensor,
                         weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, eps: float = 1e-5,
                         *, fused: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual`` and ``layer_norm(h, weight, bias, eps) @ b``, the norm deferred into
    the GEMM: as :func:`add_rmsnorm_matmul`, with the pass writing ``h``'s mean and rstd and
    the GEMM ``layernorm_matmul_given_stats`` (backward: ``layernorm_matmul_backward``).

    Args:
        x, residual, b, eps, fused: as :func:`add_rmsnorm_matmul`.
        weight, bias: optional LayerNorm affine parameters [K] (folded: ``weight`` into ``b``,
            ``bias`` as ``bias @ b``).

    Returns:
        ``(y, h)``; differentiable in ``x``, ``residual``, ``b``, ``weight`` and ``bias``.

    Raises:
        As :func:`add_rmsnorm_matmul`.
    """
    eps = _checked("add_layernorm_matmul", x, residual, b, eps, fused, weight=weight, bias=bias)
    beta = folded_bias(bias, b)
    if weight is not None:
        b = fold_rmsnorm_weight(weight, b)
    y, h, *_ = _OP(x, residual, b, beta, eps, LAYERNORM, fused)
    return y, h
