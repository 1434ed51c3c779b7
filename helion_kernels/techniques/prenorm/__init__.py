"""Deferred pre-norm (technique 2): ``rmsnorm_matmul`` = ``rms_norm(a, weight) @ b`` (here),
``layernorm_matmul`` (:mod:`.layernorm`), and the block's residual add with either norm,
``add_rmsnorm_matmul`` / ``add_layernorm_matmul`` (:mod:`.residual`).

Source: the PyTorch blog "Towards Free Normalization: Fusing Normalization into GEMM and
Attention Kernels" (Meta, 2026); the kernels (one per loop nest, both norms behind a flag)
and their references are :mod:`.kernels`.
"""

from __future__ import annotations

import torch

from ... import checks, runtime
from ...autograd import (Op, empty_like_layout, f32, gemm_operand, mm_fp32, rms_row_backward, rms_rstd, rms_x_hat,
                         run_compiled, wgrad)

_kernels = runtime.LazyModule(f"{__name__}.kernels")
LAYERNORM, RMSNORM = 1, 0  # the kernels' ``layernorm`` argument (as in .kernels, which imports Helion)


def fold_rmsnorm_weight(weight: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Fold an RMSNorm affine weight into the GEMM's right operand: ``weight[:, None] * b``.

    ``rms_norm(a, weight) @ b == rms_norm(a) @ (weight[:, None] * b)``: the weight scales
    columns of the normalised ``a``, i.e. rows of ``b``.

    Args:
        weight: [K], the RMSNorm elementwise weight (any float dtype).
        b: [K, N], the GEMM's right operand.

    Returns:
        [K, N] in ``b.dtype`` (and ``b``'s layout), computed in fp32 and rounded once. Compute it once per
        weight update and pass it as ``b`` with ``weight=None`` to reuse it.

    Raises:
        TypeError: ``weight`` or ``b`` is not a floating-point tensor.
        ValueError: ``b`` is not 2-D, ``weight`` is not [K], or they are on two devices.
    """
    op = "fold_rmsnorm_weight"
    for name, t in (("weight", weight), ("b", b)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{op}: {name} must be a floating-point tensor, got "
                            f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
    if b.dim() != 2:
        raise ValueError(f"{op}: b must be 2-D [K, N], got shape {tuple(b.shape)}")
    if tuple(weight.shape) != (b.shape[0],):
        raise ValueError(f"{op}: weight must have shape [K] = ({b.shape[0]},) to match b "
                         f"{tuple(b.shape)}, got {tuple(weight.shape)}")
    if weight.device != b.device:
        raise ValueError(f"{op}: weight is on {weight.device} and b on {b.device}")
    # Torch computes a bf16/fp16 product in fp32 and a mixed one in the promoted dtype (fp32
    # for an fp32 weight): the same single rounding as casting both first, in fewer kernels.
    return (weight[:, None] * b).to(b.dtype)


def _rmsnorm_matmul(a: torch.Tensor, b: torch.Tensor, eps: float,
                    fused: bool | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(c, rstd, x_hat): ``x_hat`` is the unfused path's normalised ``a`` [M, K] (the cuBLAS
    GEMM's operand, already written, so the backward keeps it instead of writing it again),
    [0, K] after the fused kernel, which never writes it."""
    args = (a.contiguous(), gemm_operand(b), eps, RMSNORM)
    if runtime.decide(_kernels.SPEC, args, fused).fused:
        return (*runtime.launch(_kernels.SPEC, args), a.new_empty(0, a.shape[1]))
    # cuBLAS + the standalone norm (rstd is defined when there is nothing to multiply).
    x_hat, rstd = run_compiled(_rms_norm_rstd, args[0], eps)
    return torch.mm(x_hat, b), rstd, x_hat


def _rms_norm_rstd(a: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    rstd = rms_rstd(a, eps)
    return rms_x_hat(a, rstd), rstd


def _rmsnorm_matmul_fake(a, b, eps, fused):
    # x_hat has M rows after the unfused path and none after the fused kernel. For a graph of
    # static sizes the fake takes the implementation's decision (the registry's, for those
    # sizes); for symbolic sizes (a graph that serves every M) the decision waits for the run,
    # so the row count is a size the graph learns then (an unbacked size: nothing in a graph
    # branches on it; the backward op does, when it runs). Reading symbolic sizes here would
    # specialise them: one compilation per M. (Inductor does not CUDA-graph a graph with an
    # unbacked size, so mode="reduce-overhead" replays only the static-size graphs.)
    if all(isinstance(size, int) for size in (*a.shape, b.shape[1])):
        rows = 0 if runtime.decide(_kernels.SPEC, (a, b, eps, RMSNORM), fused).fused else a.shape[0]
    else:
        rows = torch.library.get_ctx().new_dynamic_size()
    return (a.new_empty(a.shape[0], b.shape[1]), a.new_empty(a.shape[0], dtype=torch.float32),
            a.new_empty(rows, a.shape[1]))


# --- backward formulas (the fused dgrad kernel's math, and the unfused backward) -----------


def given_rstd_dgrad(g: torch.Tensor, a: torch.Tensor, rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(da in ``a.dtype``, drstd fp32) of ``c = (a * rstd[:, None]) @ b`` with ``rstd`` an
    input, from ``g = dc @ b^T`` (fp32): ``da = rstd * g``, ``drstd = sum_k(a * g)``."""
    g32 = f32(g)
    return (g32 * rstd[:, None]).to(a.dtype), (f32(a) * g32).sum(dim=1)


def prenorm_norm_backward(dx_hat: torch.Tensor, a: torch.Tensor, rstd: torch.Tensor):
    """(da, x_hat) in ``a.dtype`` from ``dx_hat = dc @ b^T``: the RMSNorm backward the
    pre-norm dgrad kernel applies in its epilogue."""
    x_hat = f32(a) * rstd[:, None]
    return rms_row_backward(f32(dx_hat), x_hat, rstd).to(a.dtype), x_hat.to(a.dtype)


def _prenorm_norm_backward_into(dx_hat: torch.Tensor, a: torch.Tensor, rstd: torch.Tensor):
    """:func:`prenorm_norm_backward` with dA written over ``dx_hat`` (same dtype as ``a``)."""
    da, x_hat = prenorm_norm_backward(dx_hat, a, rstd)
    return dx_hat.copy_(da), x_hat


def rmsnorm_matmul_dgrad(a, b, dc, rstd):
    """(da, x_hat) of ``c = (a * rstd[:, None]) @ b``, unfused: the dgrad GEMM (cuBLAS), then
    the norm's backward as one pass (inductor-compiled on CUDA), which writes dA over the
    GEMM's output ``dx_hat`` (:func:`_dgrad_then`)."""
    return _dgrad_then(prenorm_norm_backward, _prenorm_norm_backward_into, a, b, dc, rstd)


def prenorm_da(dx_hat: torch.Tensor, a: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """dA in ``a.dtype`` from ``dx_hat = dc @ b^T``: :func:`prenorm_norm_backward` without
    writing ``x_hat`` (rebuilt in fp32 from ``a``), for a backward that kept the forward's."""
    return rms_row_backward(f32(dx_hat), f32(a) * rstd[:, None], rstd).to(a.dtype)


def _prenorm_da_into(dx_hat: torch.Tensor, a: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """:func:`prenorm_da` written over ``dx_hat`` (same dtype as ``a``)."""
    return dx_hat.copy_(prenorm_da(dx_hat, a, rstd))


def dgrad_in_place(dx_hat: torch.Tensor, a: torch.Tensor) -> bool:
    """Whether the norm's backward writes dA over the dgrad GEMM's output ``dx_hat`` [M, K]
    (a new contiguous tensor of ``a``'s shape, which nothing reads after it): when it has dA's
    dtype, ``a``'s. Each row's statistic is read before its elements are written, and inductor
    stores into the mutated input's buffer (one kernel, no copy; checked in its output code).
    It saves an [M, K] allocation at the backward's peak: ``a``, ``x_hat``, ``dx_hat`` and dA
    were live together."""
    return dx_hat.dtype == a.dtype


def _dgrad_then(norm_pass, norm_pass_into, a, b, dc, rstd):
    """The dgrad GEMM ``dx_hat = dc @ b^T`` (cuBLAS), then one compiled norm pass over it:
    ``norm_pass_into`` (dA written over ``dx_hat``) where :func:`dgrad_in_place`, else
    ``norm_pass``."""
    dx_hat = torch.mm(dc, b.t())
    return run_compiled(norm_pass_into if dgrad_in_place(dx_hat, a) else norm_pass, dx_hat, a, rstd)


def rmsnorm_matmul_da(a, b, dc, rstd):
    """dA alone of ``c = (a * rstd[:, None]) @ b``, unfused: :func:`rmsnorm_matmul_dgrad`
    without writing ``x_hat`` (the dgrad GEMM, then one compiled pass, :func:`prenorm_da`,
    writing dA over ``dx_hat``: :func:`_dgrad_then`)."""
    return _dgrad_then(prenorm_da, _prenorm_da_into, a, b, dc, rstd)


def kept_x_hat_grads(a, b, rstd, x_hat, dc, need_a: bool = True, need_b: bool = True):
    """(dA, dB) of ``c = x_hat @ b``, ``x_hat = a * rstd[:, None]`` in ``a.dtype``, with the
    forward's ``x_hat`` kept (the unfused pre-norm path): the cuBLAS dgrad, one compiled pass
    that reads ``dx_hat`` and ``a`` (rebuilding ``x_hat`` in fp32) and writes only dA
    (:func:`rmsnorm_matmul_da`), and the cuBLAS wgrad on the kept ``x_hat``: one [M, K] write
    less than :func:`rmsnorm_matmul_grads`."""
    da = rmsnorm_matmul_da(a, b, dc, rstd) if need_a else None
    db = wgrad(x_hat, dc, b) if need_b else None
    return da, db


def rmsnorm_matmul_grads(a, b, rstd, dc, need_a: bool = True, need_b: bool = True):
    """(dA, dB) of ``c = (a * rstd[:, None]) @ b`` (the weight is folded into ``b``), unfused:
    the dgrad GEMM, the norm's backward, the wgrad GEMM on ``x_hat``."""
    da = x_hat = db = None
    if need_a:
        da, x_hat = rmsnorm_matmul_dgrad(a, b, dc, rstd)
    if need_b:
        db = wgrad(run_compiled(rms_x_hat, a, rstd) if x_hat is None else x_hat, dc, b)
    return da, db



def _dgrad(a: torch.Tensor, b: torch.Tensor, dc: torch.Tensor, rstd: torch.Tensor,
           fused: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(da, x_hat) of ``c = (a * rstd) @ b`` for the output gradient ``dc``."""
    args = (a, b, dc.contiguous(), rstd)
    if runtime.decide(_kernels.SPEC_BACKWARD, args, fused).fused:
        return runtime.launch(_kernels.SPEC_BACKWARD, args)
    return rmsnorm_matmul_dgrad(*args)


def _dgrad_fake(a, b, dc, rstd, fused):
    return torch.empty_like(a), torch.empty_like(a)


_DGRAD = Op("rmsnorm_matmul_backward", _dgrad, _dgrad_fake)


def _grads(a: torch.Tensor, b: torch.Tensor, dc: torch.Tensor, rstd: torch.Tensor, x_hat: torch.Tensor,
           fused: bool | None, need_a: bool, need_b: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dA, dB) of ``c = (a * rstd[:, None]) @ b``, each [0] where not needed; dA contiguous, dB laid
    out as ``b`` (:func:`~helion_kernels.wgrad`: W's gradient row-major for ``b = W.t()``).

    With the unfused forward's ``x_hat`` kept (M rows): the cuBLAS dgrad, one compiled pass
    writing only dA, the cuBLAS wgrad on ``x_hat``. Without (the fused forward, or dB not
    needed): the dgrad op, fused or not (:func:`~helion_kernels.runtime.decide`), which writes ``x_hat``
    for the cuBLAS wgrad; when only dA is needed, the unfused dgrad writes no ``x_hat``."""
    a = a.contiguous()
    if x_hat.shape[0]:
        da, db = kept_x_hat_grads(a, b, rstd, x_hat, dc, need_a, need_b)
    else:
        da = db = None
        fused_dgrad = need_a and runtime.decide(_kernels.SPEC_BACKWARD, (a, b, dc, rstd), fused).fused
        if need_a and (need_b or fused_dgrad):
            da, x_hat = _DGRAD(a, b, dc, rstd, fused_dgrad)
        elif need_a:
            da = rmsnorm_matmul_da(a, b, dc, rstd)
        if need_b:
            db = wgrad(x_hat if x_hat.shape[0] else run_compiled(rms_x_hat, a, rstd), dc, b)
    return (a.new_empty(0) if da is None else da), (b.new_empty(0) if db is None else db)


def _grads_fake(a, b, dc, rstd, x_hat, fused, need_a, need_b):
    return (a.new_empty(a.shape) if need_a else a.new_empty(0),
            empty_like_layout(b) if need_b else b.new_empty(0))


_GRADS = Op("rmsnorm_matmul_grads", _grads, _grads_fake)


def _setup_context(ctx, inputs, output):
    a, b, _, fused = inputs
    ctx.set_materialize_grads(False)
    # x_hat only serves the wgrad: kept only when b's gradient is wanted (a frozen weight
    # keeps nothing more than before).
    x_hat = output[2] if ctx.needs_input_grad[1] else output[2].new_empty(0, a.shape[1])
    ctx.save_for_backward(a, b, output[1], x_hat)
    ctx.fused = fused
    ctx.mark_non_differentiable(output[1], output[2])


def _backward(ctx, dc, _drstd, _dx_hat):
    """dA and dB by :func:`_grads` (a custom op of its own: whether the forward kept ``x_hat``
    is known only when it runs)."""
    if dc is None:  # nothing downstream used c
        return None, None, None, None
    a, b, rstd, x_hat = ctx.saved_tensors
    need_a, need_b = ctx.needs_input_grad[:2]
    da, db = _GRADS(a, b, dc, rstd, x_hat, ctx.fused, need_a, need_b)
    return (da if need_a else None), (db if need_b else None), None, None


_OP = Op("rmsnorm_matmul", _rmsnorm_matmul, _rmsnorm_matmul_fake, backward=_backward,
         setup_context=_setup_context)


def _given_rstd(a: torch.Tensor, b: torch.Tensor, rstd: torch.Tensor, fused: bool | None) -> torch.Tensor:
    args = (a.contiguous(), gemm_operand(b), rstd.contiguous())
    if runtime.decide(_kernels.SPEC_GIVEN_RSTD, args, fused).fused:
        return runtime.launch(_kernels.SPEC_GIVEN_RSTD, args)
    return torch.mm(run_compiled(rms_x_hat, a, rstd), b)


def _given_rstd_fake(a, b, rstd, fused):
    return a.new_empty(a.shape[0], b.shape[1])


def _setup_given_rstd(ctx, inputs, output):
    a, b, rstd, _ = inputs
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(a, b, rstd)


def _backward_given_rstd(ctx, dc):
    """``c = (a * rstd[:, None]) @ b`` with ``rstd`` an input: g = dc @ b^T (cuBLAS, fp32 out),
    dA = rstd * g, dRstd = sum_k(a * g), dB = (a * rstd)^T @ dc (cuBLAS). The gradient that
    reaches rstd flows on into whatever computed it (the norm's own backward is there)."""
    if dc is None:
        return None, None, None, None
    a, b, rstd = ctx.saved_tensors
    need_a, need_b, need_rstd = ctx.needs_input_grad[:3]
    da = db = drstd = None
    if need_a or need_rstd:
        da, drstd = run_compiled(given_rstd_dgrad, mm_fp32(dc, b.t()), a, rstd)
    if need_b:
        db = wgrad(run_compiled(rms_x_hat, a, rstd), dc, b)
    return (da if need_a else None), db, (drstd if need_rstd else None), None


_GIVEN_RSTD = Op("rmsnorm_matmul_given_rstd", _given_rstd, _given_rstd_fake, backward=_backward_given_rstd,
                 setup_context=_setup_given_rstd, public="rmsnorm_matmul(rstd=)")


def rmsnorm_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    rstd: torch.Tensor | None = None,
    return_rstd: bool = False,
    fused: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``rmsnorm(a, weight, eps) @ b`` in one kernel (deferred pre-norm).

    Computes ``c = (a * rstd[:, None] * weight) @ b`` with
    ``rstd = 1 / sqrt(mean(a**2, dim=1) + eps)``: the GEMM runs on the raw ``a`` and its
    epilogue scales the accumulator by ``rstd``, which each program computes once for its
    block of rows (see :mod:`.kernels`).
    Technique 2 ("deferred pre-norm") of the PyTorch blog "Towards Free Normalization:
    Fusing Normalization into GEMM and Attention Kernels" (Meta, 2026).

    Args:
        a: [M, K] activations, bf16, fp16 or fp32, on a CUDA device. The norm is over K.
        b: [K, N] right operand, same dtype and device (for an ``nn.Linear`` weight W of
            shape [N, K], pass ``W.t()``).
        weight: optional RMSNorm affine weight [K]. It is folded into ``b``
            (:func:`fold_rmsnorm_weight`) on every call; when it is fixed across calls,
            fold it once yourself and pass ``weight=None``.
        eps: added to the mean square, >= 0 (unused when ``rstd`` is given).
        rstd: optional [M] fp32 ``1 / sqrt(mean(a**2, dim=1) + eps)``, from whatever produced
            ``a``: a residual add or GEMM epilogue that also emits its rows' statistics
            (under ``torch.compile``, ``x = r + h; rstd = torch.rsqrt(x.float().square().mean(-1)
            + eps)`` compiles to one pass). The GEMM then only scales its epilogue by it (kernel
            ``rmsnorm_matmul_given_rstd``; measured: ``bench/results/<gpu>/prenorm_stats_bound.md``).
            Differentiable: its gradient flows back into its producer.
        return_rstd: also return ``rstd`` [M] fp32 (what a backward needs; the given one
            when ``rstd`` is given).
        fused: None: the forward and the backward each follow the registry's decision for
            this shape (:func:`~helion_kernels.runtime.decide` for ``rmsnorm_matmul``, and for
            ``rmsnorm_matmul_backward`` after a fused forward or for dA alone; the fused kernel
            only where tuning measured it faster than cuBLAS + the inductor-compiled norm; with
            ``rstd`` given, for ``rmsnorm_matmul_given_rstd``); True: both fused; False: both
            unfused (the inductor-compiled norm, cuBLAS GEMMs). With ``rstd`` given the
            backward is cuBLAS GEMMs and one compiled elementwise pass either way.

    Returns:
        ``c`` [M, N] in the input dtype (fp32 accumulation and statistics), or
        ``(c, rstd)`` with ``return_rstd=True``. Differentiable in ``a``, ``b`` and
        ``weight``, and in a given ``rstd`` (a returned, computed ``rstd`` is not). Without
        ``rstd`` the backward saves ``a``, ``b`` and the fp32 ``rstd``. After the fused
        forward it rebuilds the normalised ``a`` on the fly: the dgrad (fused: the whole
        RMSNorm backward in the GEMM's epilogue,
        :mod:`.kernels`) writes ``x_hat`` for the cuBLAS
        wgrad. After the unfused forward it also keeps that forward's ``x_hat`` when ``b``
        needs a gradient (one [M, K] tensor in the input dtype, as the compiled PyTorch pair
        keeps its norm output): the wgrad reads it and the norm's backward writes only dA.
        A graph compiled for symbolic sizes learns which path ran only at run time, so it
        serves every M (but is not CUDA-graphed by ``mode="reduce-overhead"``). With
        ``rstd`` given, ``a``'s gradient is only the scaled GEMM's; the norm's part reaches
        ``a`` through ``rstd``'s own graph, so an ``rstd`` computed without autograd
        (detached, under ``no_grad``) leaves it out. Once differentiable (no gradient of a
        gradient).

    Raises:
        TypeError: non-tensor input, unsupported or mismatched dtypes, an ``rstd`` that is
            not fp32.
        ValueError: not 2-D, mismatched K, K = 0, weight not of shape [K], rstd not of
            shape [M], negative eps (checked even when ``rstd`` is given), CPU tensors outside
            interpret modes, tensors on different devices.
    """
    op = "rmsnorm_matmul"
    checks.gemm_operands(op, a, b)
    eps = checks.norm_params(op, a, a.shape[1], eps, dim="K", weight=weight)  # the norm is over K
    checks.row_stat(op, "rstd", rstd, a)
    checks.flag(op, "return_rstd", return_rstd)
    checks.fused_flag(op, fused)
    runtime.check_runnable(op, a.device)
    if weight is not None:
        b = fold_rmsnorm_weight(weight, b)
    if rstd is not None:
        c = _GIVEN_RSTD(a, b, rstd, fused)
    else:
        c, rstd, _ = _OP(a, b, eps, fused)
    return (c, rstd) if return_rstd else c


from .layernorm import layernorm_matmul  # noqa: E402, F401  (they build on the names above)
from .residual import add_layernorm_matmul, add_rmsnorm_matmul  # noqa: E402, F401
