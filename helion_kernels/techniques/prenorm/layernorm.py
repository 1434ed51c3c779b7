"""Deferred pre-LayerNorm: ``layernorm_matmul`` = ``layer_norm(a, (K,), weight, bias) @ b``.

The LayerNorm weight is folded into ``b`` and its bias enters as ``bias @ b``, so the
kernels see ``layer_norm(a) @ b' + beta`` (:mod:`.kernels`); autograd carries the fold's
gradients back to the weight, the bias and ``b``. The ops here are those of
``rmsnorm_matmul`` for the other norm, with the statistics computed by the kernel or given
by the producer of ``a`` (``mean=``, ``rstd=``).
"""

from __future__ import annotations

import torch

from ... import checks, runtime
from ...autograd import (Op, col_sums, colsum_for, empty_like_layout, f32, gemm_operand, layer_row_backward,
                         layer_stats, layer_x_hat, mm_fp32, run_compiled, wgrad)
from . import LAYERNORM, _kernels, fold_rmsnorm_weight


def folded_bias(bias: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor | None:
    """A LayerNorm bias as the row vector ``bias @ b`` [N] in fp32 (the epilogue adds it), or
    None; differentiable in both."""
    return None if bias is None else bias.float() @ b.float()


def _plus_beta(x_hat: torch.Tensor, b: torch.Tensor, beta: torch.Tensor | None) -> torch.Tensor:
    """The unfused GEMM ``x_hat @ b [+ beta]`` (cuBLAS, the bias in its epilogue)."""
    return torch.mm(x_hat, b) if beta is None else torch.addmm(beta.to(x_hat.dtype), x_hat, b)


def _layer_norm_stats(a: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    mean, rstd = layer_stats(a, eps)
    return layer_x_hat(a, mean, rstd), mean, rstd


# --- the statistics computed by the kernel -------------------------------------------------


def _layernorm_matmul(a: torch.Tensor, b: torch.Tensor, beta: torch.Tensor | None, eps: float,
                      fused: bool | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(c, mean, rstd, x_hat): ``x_hat`` is the unfused path's normalised ``a`` (the cuBLAS
    GEMM's operand, kept for the wgrad), [0, K] after the fused kernel."""
    a, b = a.contiguous(), gemm_operand(b)
    if runtime.decide(_kernels.SPEC_LAYERNORM, (a, b), fused).fused:
        args = (a, b, eps, LAYERNORM, colsum_for(b), beta)
        return (*runtime.launch(_kernels.SPEC_LAYERNORM, args), a.new_empty(0, a.shape[1]))
    x_hat, mean, rstd = run_compiled(_layer_norm_stats, a, eps)
    return _plus_beta(x_hat, b, beta), mean, rstd, x_hat


def _layernorm_matmul_fake(a, b, beta, eps, fused):
    # as rmsnorm_matmul's fake: x_hat's row count is the decision's, known for static sizes
    if all(isinstance(size, int) for size in (*a.shape, b.shape[1])):
        rows = 0 if runtime.decide(_kernels.SPEC_LAYERNORM, (a, b), fused).fused else a.shape[0]
    else:
        rows = torch.library.get_ctx().new_dynamic_size()
    stat = a.new_empty(a.shape[0], dtype=torch.float32)
    return a.new_empty(a.shape[0], b.shape[1]), stat, stat.clone(), a.new_empty(rows, a.shape[1])


def layer_dgrad(a: torch.Tensor, b: torch.Tensor, dc: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor):
    """(dA, x_hat) in ``a.dtype`` of ``c = x_hat @ b``, unfused: the dgrad GEMM (cuBLAS), then
    the LayerNorm backward over whole rows in one compiled pass, which also writes ``x_hat``."""
    return run_compiled(_layer_backward, torch.mm(dc, b.t()), a, mean, rstd)


def _layer_backward(dx_hat: torch.Tensor, a: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor):
    x_hat = (f32(a) - mean[:, None]) * rstd[:, None]
    return layer_row_backward(f32(dx_hat), x_hat, rstd).to(a.dtype), x_hat.to(a.dtype)


def _layer_da(dx_hat: torch.Tensor, a: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """:func:`_layer_backward` without writing ``x_hat`` (a backward that kept the forward's)."""
    return layer_row_backward(f32(dx_hat), (f32(a) - mean[:, None]) * rstd[:, None], rstd).to(a.dtype)


def layernorm_grads(a, b, beta, mean, rstd, x_hat, c, dc, fused, need_a: bool, need_b: bool):
    """(dA, dB) of ``c = layer_norm(a) @ b + beta`` (the statistics a function of ``a``), each
    None where not needed. With the unfused forward's ``x_hat`` kept: the unfused dgrad and the
    cuBLAS wgrad on ``x_hat``. Else the dgrad as :func:`~helion_kernels.runtime.decide` says for
    ``layernorm_matmul_backward``: fused (the norm's backward in the dgrad GEMM's epilogue, its
    row terms from ``c``) or unfused; either writes ``x_hat`` for the wgrad."""
    da = db = None
    a, dc = a.contiguous(), dc.contiguous()
    kept = x_hat.shape[0] > 0
    if need_a:
        if not kept and runtime.decide(_kernels.SPEC_LAYERNORM_BACKWARD, (a, b), fused).fused:
            s2, s1 = run_compiled(_kernels.row_terms, dc, c, beta, col_sums(b))
            da, x_hat = runtime.launch(_kernels.SPEC_LAYERNORM_BACKWARD, (a, b, dc, rstd, s2, mean, s1))
        elif kept:
            da = run_compiled(_layer_da, torch.mm(dc, b.t()), a, mean, rstd)
        else:
            da, x_hat = layer_dgrad(a, b, dc, mean, rstd)
    if need_b:
        db = wgrad(x_hat if x_hat.shape[0] else run_compiled(layer_x_hat, a, mean, rstd), dc, b)
    return da, db


def _grads(a: torch.Tensor, b: torch.Tensor, beta: torch.Tensor | None, mean: torch.Tensor, rstd: torch.Tensor,
           x_hat: torch.Tensor, c: torch.Tensor, dc: torch.Tensor, fused: bool | None, need_a: bool,
           need_b: bool) -> tuple[torch.Tensor, torch.Tensor]:
    da, db = layernorm_grads(a, b, beta, mean, rstd, x_hat, c, dc, fused, need_a, need_b)
    return (a.new_empty(0) if da is None else da), (b.new_empty(0) if db is None else db)


def _grads_fake(a, b, beta, mean, rstd, x_hat, c, dc, fused, need_a, need_b):
    return (a.new_empty(a.shape) if need_a else a.new_empty(0),
            empty_like_layout(b) if need_b else b.new_empty(0))


_GRADS = Op("layernorm_matmul_grads", _grads, _grads_fake)


def _setup_context(ctx, inputs, output):
    a, b, beta, _, fused = inputs
    c, mean, rstd, x_hat = output
    ctx.set_materialize_grads(False)
    x_hat = x_hat if ctx.needs_input_grad[1] else x_hat.new_empty(0, a.shape[1])  # only the wgrad reads it
    ctx.save_for_backward(a, b, beta, mean, rstd, x_hat, c)
    ctx.fused = fused
    ctx.mark_non_differentiable(mean, rstd, x_hat)


def _backward(ctx, dc, _dmean, _drstd, _dx_hat):
    if dc is None:
        return None, None, None, None, None
    a, b, beta, mean, rstd, x_hat, c = ctx.saved_tensors
    need = _OP.named(ctx.needs_input_grad)
    da, db = _GRADS(a, b, beta, mean, rstd, x_hat, c, dc, ctx.fused, need.a, need.b)
    dbeta = col_sums(dc) if need.beta else None
    return _OP.input_grads(a=da if need.a else None, b=db if need.b else None, beta=dbeta)


_OP = Op("layernorm_matmul", _layernorm_matmul, _layernorm_matmul_fake, backward=_backward,
         setup_context=_setup_context)


# --- the statistics given by the producer --------------------------------------------------


def _given(a: torch.Tensor, b: torch.Tensor, beta: torch.Tensor | None, mean: torch.Tensor, rstd: torch.Tensor,
           fused: bool | None) -> torch.Tensor:
    a, b = a.contiguous(), gemm_operand(b)
    if runtime.decide(_kernels.SPEC_LAYERNORM_GIVEN, (a, b), fused).fused:
        args = (a, b, rstd.contiguous(), mean.contiguous(), colsum_for(b), beta)
        return runtime.launch(_kernels.SPEC_LAYERNORM_GIVEN, args)
    return _plus_beta(run_compiled(layer_x_hat, a, mean, rstd), b, beta)


def _given_fake(a, b, beta, mean, rstd, fused):
    return a.new_empty(a.shape[0], b.shape[1])


def given_stats_dgrad(g: torch.Tensor, a: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor):
    """(dA in ``a.dtype``, dMean, dRstd fp32) of ``c = ((a - mean) * rstd) @ b`` with the
    statistics inputs, from ``g = dc @ b^T`` (fp32)."""
    g32 = f32(g)
    return ((g32 * rstd[:, None]).to(a.dtype), -rstd * g32.sum(dim=1),
            ((f32(a) - mean[:, None]) * g32).sum(dim=1))


def _setup_given(ctx, inputs, output):
    a, b, beta, mean, rstd, _ = inputs
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(a, b, mean, rstd)


def _backward_given(ctx, dc):
    """cuBLAS dgrad (fp32 out), one compiled pass for dA, dMean, dRstd; the cuBLAS wgrad on
    the rebuilt ``x_hat``; dBeta the column sums of ``dc``. The statistics' gradients flow on
    into whatever computed them."""
    if dc is None:
        return None, None, None, None, None, None
    a, b, mean, rstd = ctx.saved_tensors
    need = _GIVEN.named(ctx.needs_input_grad)
    da = dmean = drstd = db = None
    if need.a or need.mean or need.rstd:
        da, dmean, drstd = run_compiled(given_stats_dgrad, mm_fp32(dc, b.t()), a, mean, rstd)
    if need.b:
        db = wgrad(run_compiled(layer_x_hat, a, mean, rstd), dc, b)
    return _GIVEN.input_grads(a=da if need.a else None, b=db, beta=col_sums(dc) if need.beta else None,
                              mean=dmean if need.mean else None, rstd=drstd if need.rstd else None)


_GIVEN = Op("layernorm_matmul_given_stats", _given, _given_fake, backward=_backward_given,
            setup_context=_setup_given, public="layernorm_matmul(mean=, rstd=)")


def layernorm_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    mean: torch.Tensor | None = None,
    rstd: torch.Tensor | None = None,
    return_stats: bool = False,
    fused: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``layer_norm(a, (K,), weight, bias, eps) @ b`` with the norm deferred into the GEMM.

    ``weight`` is folded into ``b`` (``weight[:, None] * b``) and ``bias`` enters as the row
    vector ``bias @ b``, so the GEMM runs on the raw ``a`` and its epilogue computes
    ``rstd * (acc - mean * colsum(b')) + bias @ b`` (:mod:`.kernels`; for fp32 inputs, whose
    MMA rounds to TF32, the mean comes off each ``a`` tile before the MMA). Technique 2
    ("deferred pre-norm") of the PyTorch blog "Towards Free Normalization" (Meta, 2026), for
    LayerNorm.

    Args:
        a: [M, K] activations, bf16, fp16 or fp32, on a CUDA device. The norm is over K.
        b: [K, N] right operand, same dtype and device (``W.t()`` for an ``nn.Linear`` weight).
        weight, bias: optional LayerNorm affine parameters [K] (any float dtype), folded on
            every call.
        eps: added to the variance, >= 0 (unused when the statistics are given).
        mean, rstd: optional [M] fp32 statistics of ``a``'s rows, from whatever produced ``a``
            (:func:`add_layernorm_matmul` computes them with the residual add): both or
            neither. The GEMM then only applies them in its epilogue (kernel
            ``layernorm_matmul_given_stats``); differentiable, their gradients flow back into
            their producer.
        return_stats: also return ``(mean, rstd)`` (the given ones when given).
        fused: None: the forward and the backward each follow the registry's decision for
            the shape (``layernorm_matmul``, ``layernorm_matmul_given_stats``,
            ``layernorm_matmul_backward``; unfused where nothing is tuned); True / False force.

    Returns:
        ``c`` [M, N] in ``a``'s dtype, or ``(c, mean, rstd)`` with ``return_stats=True``.
        Differentiable in ``a``, ``b``, ``weight``, ``bias`` and given statistics. Without
        given statistics the backward keeps ``a``, ``c`` and the fp32 statistics (and the
        unfused forward's normalised ``a`` when ``b`` needs a gradient), never a normalised
        copy of its own.

    Raises:
        TypeError: non-tensor input, unsupported or mismatched dtypes, statistics not fp32.
        ValueError: not 2-D, mismatched K, K = 0, parameters not of shape [K], statistics not
            of shape [M] or only one of them, negative eps, CPU tensors outside interpret
            modes, tensors on different devices.
    """
    op = "layernorm_matmul"
    checks.gemm_operands(op, a, b)
    eps = checks.norm_params(op, a, a.shape[1], eps, dim="K", weight=weight, bias=bias)
    if (mean is None) != (rstd is None):
        raise ValueError(f"{op}: pass both mean and rstd (the rows' LayerNorm statistics) or neither; got only "
                         f"{'mean' if rstd is None else 'rstd'}")
    checks.row_stat(op, "mean", mean, a)
    checks.row_stat(op, "rstd", rstd, a)
    checks.flag(op, "return_stats", return_stats)
    checks.fused_flag(op, fused)
    runtime.check_runnable(op, a.device)
    beta = folded_bias(bias, b)
    if weight is not None:
        b = fold_rmsnorm_weight(weight, b)
    if rstd is not None:
        c = _GIVEN(a, b, beta, mean, rstd, fused)
    else:
        c, mean, rstd, _ = _OP(a, b, beta, eps, fused)
    return (c, mean, rstd) if return_stats else c
