"""Full-row post-norm (technique 1): ``matmul_layernorm`` / ``matmul_rmsnorm`` =
``norm(a @ b)`` over N, fused into the GEMM where tuning measured that faster.

Source: the PyTorch blog "Towards Free Normalization: Fusing Normalization into GEMM and
Attention Kernels" (Meta, 2026). Kernel, reference and specs: :mod:`.kernels`. Past the
full-row N limit the ops run the unfused path; :mod:`..split_n` has fused ops for any N.
Both norms share one op body, one fake and one backward (the split-N ops use it too).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import checks, liger_norm, runtime
from ...autograd import (Op, contiguous_or_none, f32, filled, gemm_operand, layer_row_backward, matmul_grads,
                         param_grad, records_grad, rms_row_backward, rms_rstd, run_compiled)

_kernels = runtime.LazyModule(f"{__name__}.kernels")


# --- the unfused path: cuBLAS, then the compiled (or Liger's) standalone norm ---------------


def _layer_norm(x, residual, weight, bias, eps):
    x = x if residual is None else x + residual.to(x.dtype)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def _rms_norm(x, residual, weight, eps):
    x = x if residual is None else x + residual.to(x.dtype)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _layer_norm_stats(x, weight, bias, eps):
    """LayerNorm of [M, N] ``x`` (fp32 inside, ``x.dtype`` out) and its (mean, rstd), fp32."""
    x32 = x.float()
    var, mean = torch.var_mean(x32, dim=1, correction=0)
    rstd = torch.rsqrt(var + eps)
    y = (x32 - mean[:, None]) * rstd[:, None]
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype), mean, rstd


def _rms_norm_stats(x, weight, eps):
    """RMSNorm of [M, N] ``x`` (fp32 inside, ``x.dtype`` out) and its rstd, fp32."""
    x32 = x.float()
    rstd = rms_rstd(x32, eps)
    y = x32 * rstd[:, None]
    return (y if weight is None else y * weight.float()).to(x.dtype), rstd


def unfused_norm(layernorm: bool, x: torch.Tensor, weight, bias, eps: float, pipeline: str | None = None) -> tuple:
    """(y, mean or None, rstd) of the standalone norm of [M, N] ``x``: inductor-compiled on
    CUDA (eager elsewhere), or Liger's where ``pipeline`` is ``"cublas+liger_norm"`` (the
    registry's :class:`~helion_kernels.runtime.Decision` names it only where Liger runs)."""
    if pipeline == liger_norm.PIPELINE:
        if layernorm:
            return liger_norm.layer_norm(x, weight, bias, eps)
        y, rstd = liger_norm.rms_norm(x, weight, eps)
        return y, None, rstd
    if layernorm:
        return _unfused_norm(_layer_norm_stats, x, weight, bias, eps)
    y, rstd = _unfused_norm(_rms_norm_stats, x, weight, eps)
    return y, None, rstd


def compiled_rms_norm(x: torch.Tensor, weight, eps: float) -> tuple:
    """(y, rstd) of ``rms_norm(x)`` [M, N] by the compiled standalone norm (eager off CUDA)."""
    return _unfused_norm(_rms_norm_stats, x, weight, eps)


def _unfused_norm(fn, x: torch.Tensor, *params):
    """Every standalone norm of the unfused paths: inductor-compiled on CUDA, eager elsewhere."""
    return run_compiled(fn, x, *params)


def _like(param: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    """An affine parameter in the activation dtype, as torch's standalone norms expect."""
    return None if param is None else param.to(x.dtype)


def _norm_input(a, b, linear_bias, residual, with_residual: bool = True) -> torch.Tensor:
    """The unfused ``a @ b [+ linear_bias] [+ residual]`` in ``a.dtype`` (cuBLAS, the bias in
    its epilogue)."""
    c = torch.mm(a, b) if linear_bias is None else torch.addmm(linear_bias.to(a.dtype), a, b)
    return c if residual is None or not with_residual else c + residual.to(c.dtype)


# --- the op: one body for both norms ---------------------------------------------------------


def _postnorm(layernorm: bool, a, b, weight, bias, eps, stats: bool, fused, keep: bool, linear_bias,
              residual) -> tuple:
    """(y, mean, rstd, h) of ``norm(h)``, ``h = a @ b [+ linear_bias] [+ residual]``: ``mean``
    is None for RMSNorm; the statistics are None unless ``stats`` or ``keep``, and the norm's
    input ``h`` (input dtype) None unless ``keep`` (autograd records the call: the backward
    needs them)."""
    spec = _kernels.SPEC_LAYERNORM if layernorm else _kernels.SPEC_RMSNORM
    m, n = a.shape[0], b.shape[1]
    args = (a.contiguous(), gemm_operand(b), *contiguous_or_none(weight, bias), eps, int(layernorm),
            *contiguous_or_none(linear_bias, residual))
    stats = stats or keep
    if m == 0 or n == 0:
        runtime.decide(spec, args, fused if fused is not None else False)  # fused=True past the limit raises
        nan = torch.full((m,), float("nan"), dtype=torch.float32, device=a.device)  # over no columns
        h = a.new_empty(m, n) if keep else None
        return a.new_empty(m, n), (nan.clone() if layernorm and stats else None), (nan if stats else None), h
    if runtime.decide(spec, args, fused, training=keep).fused:
        h = a.new_empty(m, n) if keep else None
        out = runtime.launch(spec, (*args, h) if keep else args)
        y, mean, rstd = out if layernorm else (out[0], None, out[1])
    elif not stats:
        c = _norm_input(a, b, linear_bias, residual, with_residual=False)
        if layernorm:
            return _unfused_norm(_layer_norm, c, residual, _like(weight, c), _like(bias, c), eps), None, None, None
        return _unfused_norm(_rms_norm, c, residual, _like(weight, c), eps), None, None, None
    else:
        h = _norm_input(a, b, linear_bias, residual)
        y, mean, rstd = unfused_norm(layernorm, h, weight, bias, eps)
    return (y, mean, rstd, h if keep else None) if stats else (y, None, None, None)


def _postnorm_fake(layernorm: bool, a, b, stats: bool, keep: bool) -> tuple:
    m, n = a.shape[0], b.shape[1]
    rows = m if stats or keep else 0
    stat = a.new_empty(rows, dtype=torch.float32)
    return (a.new_empty(m, n), stat if layernorm else None, a.new_empty(rows, dtype=torch.float32),
            a.new_empty(m, n) if keep else a.new_empty(0, dtype=torch.float32))


# The two custom ops' schemas (inputs and outputs) differ; their bodies are _postnorm's.


def _layernorm_eager(a, b, weight, bias, eps, return_stats, fused, keep=False, linear_bias=None, residual=None):
    return _postnorm(True, a, b, weight, bias, eps, return_stats, fused, keep, linear_bias, residual)


def _layernorm_impl(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                    eps: float, return_stats: bool, fused: bool | None, keep: bool, linear_bias: torch.Tensor | None,
                    residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return filled(a, _layernorm_eager(a, b, weight, bias, eps, return_stats, fused, keep, linear_bias, residual))


def _layernorm_fake(a, b, weight, bias, eps, return_stats, fused, keep, linear_bias, residual):
    return _postnorm_fake(True, a, b, return_stats, keep)


def _rmsnorm_eager(a, b, weight, eps, return_rstd, fused, keep=False, linear_bias=None, residual=None):
    y, _, rstd, h = _postnorm(False, a, b, weight, None, eps, return_rstd, fused, keep, linear_bias, residual)
    return y, rstd, h


def _rmsnorm_impl(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None, eps: float, return_rstd: bool,
                  fused: bool | None, keep: bool, linear_bias: torch.Tensor | None,
                  residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return filled(a, _rmsnorm_eager(a, b, weight, eps, return_rstd, fused, keep, linear_bias, residual))


def _rmsnorm_fake(a, b, weight, eps, return_rstd, fused, keep, linear_bias, residual):
    y, _, rstd, h = _postnorm_fake(False, a, b, return_rstd, keep)
    return y, rstd, h


# --- backward (shared with the split-N ops) ----------------------------------------------------


def postnorm_stats(c: torch.Tensor, kind: str, eps: float):
    """(mean or None, rstd) of the rows of ``c`` in fp32, for ``kind`` "layernorm" or "rmsnorm"."""
    c32 = f32(c)
    if kind == "layernorm":
        if c32.shape[0] == 0:  # no rows (var_mean would warn about its degrees of freedom)
            return c32.new_empty(0), c32.new_empty(0)
        var, mean = torch.var_mean(c32, dim=1, correction=0)
        return mean, torch.rsqrt(var + eps)
    return None, rms_rstd(c32, eps)


def postnorm_row_backward(dy, c, mean, rstd, weight, dweight_dtype: torch.dtype | None = None,
                          dbias_dtype: torch.dtype | None = None, dc_sum_dtype: torch.dtype | None = None):
    """(dc in ``c.dtype``, dweight [N], dbias [N], the column sum of dc [N]) of
    ``y = norm(c) * weight + bias`` over the rows of ``c`` [M, N], from the forward's fp32
    ``mean`` (None: RMSNorm) and ``rstd``; ``weight`` None: no affine weight. The column sum of
    dc is the gradient of a Linear bias added into ``c``. The last three are summed in fp32
    and returned in their ``*_dtype`` (the parameter's: the cast is part of this one compiled
    pass, not a kernel of its own after it); None where that dtype is None (not needed)."""
    dy32 = f32(dy)
    x_hat = (f32(c) if mean is None else f32(c) - mean[:, None]) * rstd[:, None]
    g = dy32 if weight is None else dy32 * f32(weight)
    dc = (rms_row_backward if mean is None else layer_row_backward)(g, x_hat, rstd)
    dweight = (dy32 * x_hat).sum(dim=0).to(dweight_dtype) if dweight_dtype is not None and weight is not None else None
    dbias = dy32.sum(dim=0).to(dbias_dtype) if dbias_dtype is not None else None
    return dc.to(c.dtype), dweight, dbias, dc.sum(dim=0).to(dc_sum_dtype) if dc_sum_dtype is not None else None


def postnorm_grads(kind: str, a, b, weight, bias, eps: float, dy, needs: tuple[bool, ...],
                   saved: tuple | None = None,
                   addend_dtypes: tuple[torch.dtype | None, torch.dtype | None] = (None, None)):
    """Gradients of ``y = norm(h) * weight + bias`` over N, ``h = a @ b [+ linear_bias]
    [+ residual]``, ``kind`` being ``"layernorm"`` or ``"rmsnorm"`` (no bias): (dA, dB,
    dWeight, dBias, dLinearBias, dResidual), each None unless ``needs`` (one flag per input in
    that order; missing flags are False) asks for it and the input exists. ``saved``: the
    forward's ``(h, mean, rstd)`` (``h`` in the input dtype, fp32 statistics, ``mean`` None for
    RMSNorm); None recomputes them from ``a @ b`` (one GEMM; only for calls without addends).
    ``addend_dtypes``: the dtypes of the forward's ``linear_bias`` [N] and ``residual`` [M, N]
    (None where absent), which their gradients take; the Linear bias's gradient is the fp32
    column sum of dh, the residual's is dh."""
    needs = (*needs, False, False, False, False, False, False)[:6]
    if saved is None:
        if addend_dtypes != (None, None):
            raise ValueError("postnorm_grads: recomputing h needs the forward's saved h when it has addends")
        c = torch.mm(a, b)
        mean, rstd = run_compiled(postnorm_stats, c, kind, eps)
    else:
        c, mean, rstd = saved
    linear_bias_dtype, residual_dtype = addend_dtypes
    need_linear_bias = needs[4] and linear_bias_dtype is not None
    dc, dweight, dbias, dc_sum = run_compiled(
        postnorm_row_backward, dy, c, mean, rstd, weight,
        weight.dtype if needs[2] and weight is not None else None,
        bias.dtype if needs[3] and bias is not None else None,
        linear_bias_dtype if need_linear_bias else None)
    da, db = matmul_grads(a, b, dc, needs[0], needs[1])
    dresidual = dc.to(residual_dtype) if needs[5] and residual_dtype is not None else None
    return (da, db, param_grad(dweight, weight, needs[2]), param_grad(dbias, bias, needs[3]), dc_sum, dresidual)



OUTPUTS = {"matmul_layernorm": ("y", "mean", "rstd", "h"), "matmul_rmsnorm": ("y", "rstd", "h"),
           "matmul_layernorm_split_n": ("y", "mean", "rstd"), "matmul_rmsnorm_split_n": ("y", "rstd")}


def setup_context(op: Op, ctx, inputs, output) -> None:
    """The autograd context of a post-norm op (full-row or split-N), read by name: ``a``,
    ``b`` and the norm parameters saved; with ``keep`` (full-row, autograd recording) also
    the forward's ``h`` and statistics, else the backward recomputes them."""
    x, out = op.named(inputs), dict(zip(OUTPUTS[op.name], output))
    ctx.set_materialize_grads(False)  # no [M, N] zero gradients for the statistics and h
    ctx.op, ctx.eps, ctx.layernorm = op, x.eps, "mean" in out
    ctx.kept = getattr(x, "keep", False)
    addends = (getattr(x, "linear_bias", None), getattr(x, "residual", None))
    ctx.addend_dtypes = tuple(None if t is None else t.dtype for t in addends)
    kept = (out["h"], out.get("mean"), out["rstd"]) if ctx.kept else ()
    ctx.save_for_backward(x.a, x.b, x.weight, getattr(x, "bias", None), *kept)
    ctx.mark_non_differentiable(*output[1:])


def backward(ctx, dy, *_):
    op = ctx.op
    if dy is None:  # nothing downstream used y
        return op.input_grads()
    a, b, weight, bias, *kept = ctx.saved_tensors
    need = op.named(ctx.needs_input_grad)
    needs = tuple(getattr(need, name, False) for name in ("a", "b", "weight", "bias", "linear_bias", "residual"))
    da, db, dweight, dbias, dlinear_bias, dresidual = postnorm_grads(
        "layernorm" if ctx.layernorm else "rmsnorm", a, b, weight, bias, ctx.eps, dy, needs,
        tuple(kept) if ctx.kept else None, ctx.addend_dtypes)
    return op.input_grads(a=da, b=db, weight=dweight, bias=dbias, linear_bias=dlinear_bias, residual=dresidual)


def post_norm_op(name: str, impl, fake, eager=None) -> Op:
    """A post-norm custom op with the shared backward."""
    op = None

    def setup(ctx, inputs, output):
        setup_context(op, ctx, inputs, output)

    op = Op(name, impl, fake, eager=eager, backward=backward, setup_context=setup)
    return op


_LAYERNORM = post_norm_op("matmul_layernorm", _layernorm_impl, _layernorm_fake, eager=_layernorm_eager)
_RMSNORM = post_norm_op("matmul_rmsnorm", _rmsnorm_impl, _rmsnorm_fake, eager=_rmsnorm_eager)


def matmul_layernorm(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    linear_bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    return_stats: bool = False,
    fused: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``layer_norm(a @ b [+ linear_bias] [+ residual], (N,), weight, bias, eps)``, fused into
    the GEMM where that is faster.

    Full-row post-norm fusion, technique 1 of the PyTorch blog "Towards Free Normalization:
    Fusing Normalization into GEMM and Attention Kernels" (Meta, 2026): one program owns
    whole output rows, so the row statistics are taken from the fp32 accumulator in
    registers and the un-normalised product never goes to memory
    (:mod:`.kernels`). Per shape, the registry records
    whether that kernel beat cuBLAS + the inductor-compiled norm when it was tuned; the
    call runs the winner (:func:`~helion_kernels.runtime.decide`), so a tuned shape never regresses. When
    autograd records the call, the kernel also writes the norm's input for the backward, and
    the call follows the decision measured with that write where the entry has one
    (``bench/postnorm_training_forward.py``).

    Args:
        a: [M, K], bf16, fp16 or fp32, on a CUDA device.
        b: [K, N], same dtype and device. N is the normalised dimension. Row-major, or the
            transposed view of an ``nn.Linear`` weight [N, K] (``W.t()``), read in place.
        weight, bias: optional LayerNorm affine parameters [N] (any float dtype).
        eps: added to the variance, >= 0.
        linear_bias: optional [N] (a Linear's bias, any float dtype), added to ``a @ b``
            before the statistics, in fp32 inside the kernel.
        residual: optional [M, N] (any float dtype), added before the statistics as well
            (a post-LN block, ``layer_norm(x + linear(h))``).
        return_stats: also return the row ``mean`` and ``rstd`` [M] fp32 (for a backward).
        fused: None (the registry decides), True (always the fused kernel), False (always
            cuBLAS + the standalone norm).

    Returns:
        ``y`` [M, N] in the input dtype (fp32 accumulation and statistics), or
        ``(y, mean, rstd)`` with ``return_stats=True``. Differentiable in ``a``, ``b``,
        ``weight``, ``bias``, ``linear_bias`` and ``residual`` (the statistics are not). When
        autograd records the call, the forward (fused or not) also writes the norm's input
        ``h = a @ b [+ linear_bias] [+ residual]`` and keeps it with the fp32 statistics for
        the backward: the norm's backward as one inductor-compiled pass (with the Linear
        bias's gradient as its column sum), then the cuBLAS dgrad and wgrad GEMMs
        (:func:`postnorm_grads`).

    Raises:
        TypeError: non-tensor input, unsupported or mismatched dtypes, ``fused`` not a bool
            or None.
        ValueError: not 2-D, mismatched K, K = 0, weight/bias/linear_bias not of shape [N],
            residual not of shape [M, N], negative eps, CPU tensors outside interpret modes, tensors on different devices, or
            ``fused=True`` with N past the full-row limit (the error names the split-N
            strategy; raised at launch, before the kernel runs).
    """
    op = "matmul_layernorm"
    checks.gemm_operands(op, a, b)
    eps = checks.norm_params(op, a, b.shape[1], eps, weight=weight, bias=bias, linear_bias=linear_bias)
    checks.residual(op, residual, a, b)
    checks.fused_flag(op, fused)
    checks.flag(op, "return_stats", return_stats)
    runtime.check_runnable(op, a.device)
    y, mean, rstd, _ = _LAYERNORM(a, b, weight, bias, eps, return_stats, fused,
                                  records_grad(a, b, weight, bias, linear_bias, residual), linear_bias, residual)
    return (y, mean, rstd) if return_stats else y


def matmul_rmsnorm(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    linear_bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    return_rstd: bool = False,
    fused: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``rms_norm(a @ b [+ linear_bias] [+ residual], (N,), weight, eps)``, fused into the GEMM
    where that is faster.

    Same strategy, dispatch and errors as :func:`matmul_layernorm` (technique 1 of the
    PyTorch blog "Towards Free Normalization", 2026), with
    ``rstd = 1 / sqrt(mean(h**2, dim=1) + eps)`` of ``h = a @ b [+ linear_bias] [+ residual]``.

    Args:
        a: [M, K], bf16, fp16 or fp32, on a CUDA device.
        b: [K, N], same dtype and device (row-major or ``W.t()``, as :func:`matmul_layernorm`).
        weight: optional RMSNorm affine weight [N].
        eps: added to the mean square, >= 0.
        linear_bias, residual: optional [N] and [M, N] addends, as :func:`matmul_layernorm`.
        return_rstd: also return ``rstd`` [M] fp32.
        fused: None (the registry decides), True (always fused), False (always unfused).

    Returns:
        ``y`` [M, N] in the input dtype, or ``(y, rstd)`` with ``return_rstd=True``.

    Differentiable in ``a``, ``b``, ``weight`` and the addends, as :func:`matmul_layernorm`.

    Raises:
        TypeError, ValueError: as :func:`matmul_layernorm`.
    """
    op = "matmul_rmsnorm"
    checks.gemm_operands(op, a, b)
    eps = checks.norm_params(op, a, b.shape[1], eps, weight=weight, linear_bias=linear_bias)
    checks.residual(op, residual, a, b)
    checks.fused_flag(op, fused)
    checks.flag(op, "return_rstd", return_rstd)
    runtime.check_runnable(op, a.device)
    y, rstd, _ = _RMSNORM(a, b, weight, eps, return_rstd, fused,
                          records_grad(a, b, weight, linear_bias, residual), linear_bias, residual)
    return (y, rstd) if return_rstd else y
