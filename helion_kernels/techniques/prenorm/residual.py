"""The pre-norm block's producer: ``h = x + residual``, then ``norm(h) @ b``.

One pass reads ``x`` and ``residual`` and writes ``h`` (the new residual stream) and its
rows' fp32 statistics, 8 bytes a row; the GEMM then applies them in its epilogue (the
given-statistics kernels of :mod:`.kernels`), so the normalised ``h`` is never written. The
pass is inductor-compiled (an elementwise add and two row reductions: what inductor already
emits at memory speed for ``torch.compile`` of the block), not a Helion kernel. Unfused, the
same pass also writes the norm's output and cuBLAS multiplies it: what ``torch.compile``
makes of add -> norm -> linear.

The norm's affine parameters enter the op as they are: the fused kernels get them folded
(the weight into ``b``, the bias as ``bias @ b``). Unfused, LayerNorm applies them to the
norm's output, so its backward is the compiled block's (cuBLAS dgrad on the raw ``b``, one
pass for the norm, the add and the parameters' column sums, cuBLAS wgrad), with no extra
pass over the output gradient for a folded bias; RMSNorm keeps its weight folded (see
:func:`_grads`).
"""

from __future__ import annotations

import torch

from ... import checks, runtime
from ...autograd import (Op, col_sums, colsum_for, empty_like_layout, f32, gemm_operand, layer_row_backward,
                         layer_stats, param_grad, rms_row_backward, rms_rstd, run_compiled, wgrad)
from . import LAYERNORM, _kernels, fold_rmsnorm_weight
from .layernorm import folded_bias


def _add_stats(x: torch.Tensor, residual: torch.Tensor, eps: float, layernorm: int):
    """(h, mean, rstd): ``mean`` [0] for RMSNorm."""
    h = x + residual
    if layernorm:
        return (h, *layer_stats(h, eps))
    return h, h.new_empty(0, dtype=torch.float32), rms_rstd(h, eps)


def _affine(x_hat32: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, dtype: torch.dtype):
    """``x_hat * weight + bias`` (each optional) rounded once to ``dtype``: the norm's output."""
    out = x_hat32 if weight is None else x_hat32 * f32(weight)
    return (out if bias is None else out + f32(bias)).to(dtype)


def _x_hat32(h: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, layernorm: int) -> torch.Tensor:
    return ((f32(h) - mean[:, None]) if layernorm else f32(h)) * rstd[:, None]


def _normed(h: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor | None,
            bias: torch.Tensor | None, layernorm: int) -> torch.Tensor:
    """The norm's output from ``h`` and its statistics, in ``h.dtype``."""
    return _affine(_x_hat32(h, mean, rstd, layernorm), weight, bias, h.dtype)


def _add_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
              eps: float, layernorm: int):
    """(h, normed, mean, rstd): the producer pass that also writes the norm's output (affine
    applied), the cuBLAS GEMM's operand: what inductor makes of the block's add and norm."""
    h, mean, rstd = _add_stats(x, residual, eps, layernorm)
    return h, _normed(h, mean, rstd, weight, bias, layernorm), mean, rstd


def _spec(layernorm: int):
    return _kernels.SPEC_LAYERNORM_GIVEN if layernorm else _kernels.SPEC_GIVEN_RSTD


def _folded(b: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None):
    """(b', beta) of the fused kernels: the weight folded into ``b``, the bias as ``bias @ b``."""
    return (b if weight is None else fold_rmsnorm_weight(weight, b)), folded_bias(bias, b)


def _add_norm_matmul(x: torch.Tensor, residual: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None,
                     bias: torch.Tensor | None, eps: float, layernorm: int, fused: bool | None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, h, mean, rstd, normed): ``normed`` the unfused path's cuBLAS operand (kept for the
    wgrad): LayerNorm's output, or RMSNorm's ``x_hat`` (its weight folded into ``b``); [0, K]
    after the fused GEMM; ``mean`` [0] for RMSNorm."""
    b = gemm_operand(b)
    spec = _spec(layernorm)
    if runtime.decide(spec, (x, b), fused).fused:
        h, mean, rstd = run_compiled(_add_stats, x.contiguous(), residual.contiguous(), eps, layernorm)
        b_folded, beta = _folded(b, weight, bias)
        stats = (rstd, mean, colsum_for(b_folded), beta) if layernorm else (rstd,)
        return runtime.launch(spec, (h, b_folded, *stats)), h, mean, rstd, h.new_empty(0, h.shape[1])
    if layernorm:
        h, normed, mean, rstd = run_compiled(_add_norm, x.contiguous(), residual.contiguous(), weight, bias, eps, 1)
        return torch.mm(normed, b), h, mean, rstd, normed
    h, normed, mean, rstd = run_compiled(_add_norm, x.contiguous(), residual.contiguous(), None, None, eps, 0)
    return torch.mm(normed, _folded(b, weight, None)[0]), h, mean, rstd, normed


def _add_norm_matmul_fake(x, residual, b, weight, bias, eps, layernorm, fused):
    if all(isinstance(size, int) for size in (*x.shape, b.shape[1])):
        rows = 0 if runtime.decide(_spec(layernorm), (x, b), fused).fused else x.shape[0]
    else:
        rows = torch.library.get_ctx().new_dynamic_size()
    m = x.shape[0]
    return (x.new_empty(m, b.shape[1]), x.new_empty(x.shape), x.new_empty(m if layernorm else 0, dtype=torch.float32),
            x.new_empty(m, dtype=torch.float32), x.new_empty(rows, x.shape[1]))


def _norm_backward(g: torch.Tensor, h: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                   weight: torch.Tensor | None, bias: torch.Tensor | None, dh: torch.Tensor | None, layernorm: int,
                   need_h: bool, write_normed: bool, need_weight: bool, need_bias: bool):
    """(dH, normed, dWeight, dBias), each None where not asked for, from ``g = dy @ b^T``: the
    norm's backward over whole rows plus the gradient reaching ``h`` itself, and the affine
    parameters' column sums, in one compiled pass (inductor fuses the row and the column
    reductions, as it does for the block's own backward)."""
    x_hat = _x_hat32(h, mean, rstd, layernorm)
    g32 = f32(g)
    dn = None
    if need_h:
        dx_hat = g32 if weight is None else g32 * f32(weight)
        dn = (layer_row_backward if layernorm else rms_row_backward)(dx_hat, x_hat, rstd)
        dn = (dn if dh is None else dn + f32(dh)).to(h.dtype)
    return (dn, _affine(x_hat, weight, bias, h.dtype) if write_normed else None,
            (g32 * x_hat).sum(dim=0) if need_weight else None, g32.sum(dim=0) if need_bias else None)


def _fused_dgrad(h, b, weight, bias, mean, rstd, y, dy, dh, layernorm):
    """(dH, x_hat): the dgrad GEMM with the norm's backward in its epilogue, on the folded ``b``."""
    b_folded, beta = _folded(b, weight, bias)
    spec = _kernels.SPEC_LAYERNORM_BACKWARD if layernorm else _kernels.SPEC_BACKWARD
    if layernorm:
        s2, s1 = run_compiled(_kernels.row_terms, dy, y, beta, col_sums(b_folded))
        dn, x_hat = runtime.launch(spec, (h, b_folded, dy, rstd, s2, mean, s1))
    else:
        dn, x_hat = runtime.launch(spec, (h, b_folded, dy, rstd))
    return (dn if dh is None else dn + dh), x_hat


def _unfold_param_grads(x_hat, dy, b, weight, bias, need_b, need_weight, need_bias):
    """(dB, dWeight, dBias) from ``x_hat`` (no affine) after the fused dgrad, which leaves no
    ``dy @ b^T``: through ``D = x_hat^T @ dy`` (fp32), ``dB = weight * D + bias (x) colsum(dy)``,
    ``dWeight = rowsum(D * b)``, ``dBias = b @ colsum(dy)``."""
    d = wgrad(x_hat, dy, b, fp32=True)
    dcol = col_sums(dy) if bias is not None and (need_b or need_bias) else None
    db = dw = dbias = None
    if need_b:
        db = d if weight is None else d * f32(weight)[:, None]
        db = (db if dcol is None else db + f32(bias)[:, None] * dcol).to(b.dtype)
    if need_weight:
        dw = (d * f32(b)).sum(dim=1)
    if need_bias:
        dbias = f32(b) @ dcol
    return db, dw, dbias


def _grads(h: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
           mean: torch.Tensor, rstd: torch.Tensor, normed: torch.Tensor, y: torch.Tensor, dy: torch.Tensor,
           dh: torch.Tensor | None, layernorm: int, fused: bool | None, need_h: bool, need_b: bool,
           need_weight: bool, need_bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dH, dB, dWeight, dBias) of ``y = norm(h, weight, bias) @ b`` with ``h`` also an output;
    [0] where not needed; the parameters' gradients fp32.

    Unfused (the default; also whenever the forward kept ``normed``): the cuBLAS dgrad, one
    compiled pass for the norm's backward and the add (writing ``normed`` where the wgrad needs
    it and the forward did not keep it), the cuBLAS wgrad. LayerNorm: the dgrad on the raw
    ``b``, the parameters' column sums in the pass, the wgrad on the norm's output: the
    compiled block's own backward, with no pass over ``dy`` for the bias. RMSNorm: ``normed``
    is ``x_hat`` (no affine) and the GEMMs use the folded ``b``; the weight's gradient comes
    from ``x_hat^T @ dy`` [K, N], cheaper than column sums in the pass (H100, 65536 rows,
    ``bench/NOTES.md``). Fused, where
    :func:`~helion_kernels.runtime.decide` says so for the backward kernel and the forward
    kept nothing: the dgrad GEMM with the norm in its epilogue (``layernorm_matmul_backward`` /
    ``rmsnorm_matmul_backward``) on the folded ``b``, then the add; the parameters'
    gradients from ``x_hat^T @ dy``."""
    h, dy = h.contiguous(), dy.contiguous()
    kept = normed.shape[0] > 0
    spec = _kernels.SPEC_LAYERNORM_BACKWARD if layernorm else _kernels.SPEC_BACKWARD
    need_weight, need_bias = need_weight and weight is not None, need_bias and bias is not None
    dn = db = dw = dbias = None
    if need_h and not kept and runtime.decide(spec, (h, b), fused).fused:
        dn, x_hat = _fused_dgrad(h, b, weight, bias, mean, rstd, y, dy, dh, layernorm)
        db, dw, dbias = _unfold_param_grads(x_hat, dy, b, weight, bias, need_b, need_weight, need_bias)
    elif layernorm:  # the compiled block's backward: the affine parameters' sums in the pass
        write = need_b and not kept
        if need_h or need_weight or need_bias:
            dn, fresh, dw, dbias = run_compiled(_norm_backward, torch.mm(dy, b.t()), h, mean, rstd, weight, bias, dh,
                                                1, need_h, write, need_weight, need_bias)
            normed = normed if fresh is None else fresh
        elif write:  # only b's gradient: no dgrad
            normed = run_compiled(_normed, h, mean, rstd, weight, bias, 1)
        if need_b:
            db = wgrad(normed, dy, b)
    else:  # RMSNorm: the dgrad on the folded b, the weight's gradient from x_hat^T @ dy
        write = (need_b or need_weight) and not kept
        if need_h:
            dn, fresh, _, _ = run_compiled(_norm_backward, torch.mm(dy, _folded(b, weight, None)[0].t()), h, mean,
                                           rstd, None, None, dh, 0, need_h, write, False, False)
            normed = normed if fresh is None else fresh
        elif write:
            normed = run_compiled(_normed, h, mean, rstd, None, None, 0)
        if need_b or need_weight:
            db, dw, _ = _unfold_param_grads(normed, dy, b, weight, None, need_b, need_weight, False)
    # a fresh empty tensor per unneeded output: a custom op's outputs may not alias each other
    return (h.new_empty(0) if dn is None else dn), (b.new_empty(0) if db is None else db), \
        (h.new_empty(0, dtype=torch.float32) if dw is None else dw), \
        (h.new_empty(0, dtype=torch.float32) if dbias is None else dbias)


def _grads_fake(h, b, weight, bias, mean, rstd, normed, y, dy, dh, layernorm, fused, need_h, need_b, need_weight,
                need_bias):
    k = h.shape[1]
    return (h.new_empty(h.shape) if need_h else h.new_empty(0),
            empty_like_layout(b) if need_b else b.new_empty(0),
            h.new_empty(k if need_weight and weight is not None else 0, dtype=torch.float32),
            h.new_empty(k if need_bias and bias is not None else 0, dtype=torch.float32))


_GRADS = Op("add_norm_matmul_grads", _grads, _grads_fake)


def _setup_context(ctx, inputs, output):
    x, residual, b, weight, bias, _, layernorm, fused = inputs
    y, h, mean, rstd, normed = output
    ctx.set_materialize_grads(False)
    # read by the wgrad only, and by RMSNorm's weight gradient (x_hat^T @ dy)
    keep = ctx.needs_input_grad[2] or (not layernorm and ctx.needs_input_grad[3])
    normed = normed if keep else normed.new_empty(0, x.shape[1])
    ctx.save_for_backward(h, b, weight, bias, mean, rstd, normed, y)
    ctx.layernorm, ctx.fused = layernorm, fused
    ctx.mark_non_differentiable(mean, rstd, normed)


def _backward(ctx, dy, dh, _dmean, _drstd, _dnormed):
    need = _OP.named(ctx.needs_input_grad)
    h, b, weight, bias, mean, rstd, normed, y = ctx.saved_tensors
    need_h = need.x or need.residual
    if dy is None:
        return _OP.input_grads(x=dh if need.x else None, residual=dh if need.residual else None)
    dn, db, dw, dbias = _GRADS(h, b, weight, bias, mean, rstd, normed, y, dy, dh, ctx.layernorm, ctx.fused, need_h,
                               need.b, need.weight, need.bias)
    return _OP.input_grads(x=dn if need.x else None, residual=dn if need.residual else None,
                           b=db if need.b else None, weight=param_grad(dw, weight, need.weight),
                           bias=param_grad(dbias, bias, need.bias))


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
    y, h, *_ = _OP(x, residual, b, weight, None, eps, 0, fused)
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
    y, h, *_ = _OP(x, residual, b, weight, bias, eps, LAYERNORM, fused)
    return y, h
