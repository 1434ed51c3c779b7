"""Full-row post-norm (technique 1): ``matmul_layernorm`` / ``matmul_rmsnorm`` =
``norm(a @ b)`` over N, fused into the GEMM where tuning measured that faster.

Source: the PyTorch blog "Towards Free Normalization: Fusing Normalization into GEMM and
Attention Kernels" (Meta, 2026); the kernels and their references are
:mod:`helion_kernels.kernels.postnorm_full_row`. Past the full-row N limit the ops run the
unfused path; :mod:`.split_n` has the fused ops for any N.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import checks, grads, liger_norm, runtime
from ..grads import postnorm_grads
from ._op import Op, filled, gemm_operand, records_grad

_kernels = runtime.LazyModule("helion_kernels.kernels.postnorm_full_row")


def _layer_norm(x, residual, weight, bias, eps):
    x = x if residual is None else x + residual.to(x.dtype)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def _rms_norm(x, residual, weight, eps):
    x = x if residual is None else x + residual.to(x.dtype)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def unfused_layer_norm(a: torch.Tensor, b: torch.Tensor, weight, bias, eps: float,
                       pipeline: str | None = None) -> tuple:
    """(y, mean, rstd) of ``layer_norm(a @ b)`` the unfused way: cuBLAS, then the compiled
    norm, or Liger's where ``pipeline`` is ``"cublas+liger_norm"`` (the registry's, from
    :func:`~helion_kernels.runtime.unfused_pipeline`, which names it only where Liger runs)."""
    c = torch.mm(a, b)
    if pipeline == liger_norm.PIPELINE:
        return liger_norm.layer_norm(c, weight, bias, eps)
    return _unfused_norm(_layer_norm_stats, c, weight, bias, eps)


def unfused_rms_norm(a: torch.Tensor, b: torch.Tensor, weight, eps: float, pipeline: str | None = None) -> tuple:
    """(y, rstd) of ``rms_norm(a @ b)`` the unfused way: cuBLAS, then the compiled norm, or
    Liger's, as :func:`unfused_layer_norm`."""
    c = torch.mm(a, b)
    if pipeline == liger_norm.PIPELINE:
        return liger_norm.rms_norm(c, weight, eps)
    return compiled_rms_norm(c, weight, eps)


def compiled_rms_norm(x: torch.Tensor, weight, eps: float) -> tuple:
    """(y, rstd) of ``rms_norm(x)`` [M, N] by the compiled standalone norm (eager off CUDA)."""
    return _unfused_norm(_rms_norm_stats, x, weight, eps)


def _layer_norm_stats(x, weight, bias, eps):
    """LayerNorm of [M, N] ``x`` (computed in fp32, returned in ``x.dtype``) and its
    (mean, rstd) in fp32."""
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
    """RMSNorm of [M, N] ``x`` (computed in fp32, returned in ``x.dtype``) and its rstd, fp32."""
    x32 = x.float()
    rstd = grads.rms_rstd(x32, eps)
    y = x32 * rstd[:, None]
    return (y if weight is None else y * weight.float()).to(x.dtype), rstd


def _unfused_norm(fn, x: torch.Tensor, *params):
    """The standalone norm of the unfused path: inductor-compiled on CUDA, once for every M
    (:func:`~helion_kernels.grads.run_compiled`), eager elsewhere."""
    return grads.run_compiled(fn, x, *params)


def _like(param: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    """An affine parameter in the activation dtype, as torch's standalone norms expect."""
    return None if param is None else param.to(x.dtype)


def contiguous_or_none(*tensors) -> tuple:
    """Optional tensors (affine parameters, addends), contiguous; None stays None."""
    return tuple(None if t is None else t.contiguous() for t in tensors)


def contiguous_operands(a, b, *params) -> tuple:
    """``a`` contiguous, ``b`` as :func:`gemm_operand`, the optional ``params`` as
    :func:`contiguous_or_none`."""
    return (a.contiguous(), gemm_operand(b), *contiguous_or_none(*params))


def _norm_input(a, b, linear_bias, residual, with_residual: bool = True) -> torch.Tensor:
    """The unfused ``a @ b [+ linear_bias] [+ residual]`` in ``a.dtype`` (cuBLAS; the bias in
    its epilogue)."""
    c = torch.mm(a, b) if linear_bias is None else torch.addmm(linear_bias.to(a.dtype), a, b)
    return c if residual is None or not with_residual else c + residual.to(c.dtype)


def _empty_outputs(spec, args, a, m, n, fused, stats: int, keep: bool) -> tuple:
    """What an op returns for M = 0 or N = 0: the output, ``stats`` NaN statistics (over no
    columns) and the kept norm input, after the fused flag is checked."""
    runtime.decide(spec, args, fused if fused is not None else False)  # fused=True past the limit raises
    nan = torch.full((stats, m), float("nan"), dtype=torch.float32, device=a.device)
    return (a.new_empty(m, n), *(nan[i].clone() for i in range(stats)), a.new_empty(m, n) if keep else None)


def _matmul_layernorm_eager(a, b, weight, bias, eps, return_stats, fused, keep=False, linear_bias=None,
                            residual=None) -> tuple:
    """(y, mean, rstd, h): the statistics are None unless ``return_stats`` or ``keep``, the
    norm's input ``h = a @ b [+ linear_bias] [+ residual]`` (input dtype) None unless ``keep``
    (a backward will need them)."""
    spec = _kernels.SPEC_LAYERNORM
    m, n = a.shape[0], b.shape[1]
    args = (*contiguous_operands(a, b, weight, bias), eps, *contiguous_or_none(linear_bias, residual))
    stats = return_stats or keep
    if m == 0 or n == 0:
        y, mean, rstd, h = _empty_outputs(spec, args, a, m, n, fused, 2, keep)
        return (y, mean, rstd, h) if stats else (y, None, None, None)
    if runtime.decide(spec, args, fused, training=keep).fused:
        h = a.new_empty(m, n) if keep else None
        y, mean, rstd = runtime.launch(spec, (*args, h) if keep else args)
        return (y, mean, rstd, h) if stats else (y, None, None, None)
    if not stats:
        c = _norm_input(a, b, linear_bias, residual, with_residual=False)
        return _unfused_norm(_layer_norm, c, residual, _like(weight, c), _like(bias, c), eps), None, None, None
    h = _norm_input(a, b, linear_bias, residual)
    y, mean, rstd = _unfused_norm(_layer_norm_stats, h, weight, bias, eps)
    return y, mean, rstd, h if keep else None


def _matmul_layernorm(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None,
                      bias: torch.Tensor | None, eps: float, return_stats: bool,
                      fused: bool | None, keep: bool, linear_bias: torch.Tensor | None,
                      residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return filled(a, _matmul_layernorm_eager(a, b, weight, bias, eps, return_stats, fused, keep, linear_bias,
                                             residual))


def _matmul_layernorm_fake(a, b, weight, bias, eps, return_stats, fused, keep, linear_bias, residual):
    m, n = a.shape[0], b.shape[1]
    rows = m if return_stats or keep else 0
    return (a.new_empty(m, n), a.new_empty(rows, dtype=torch.float32), a.new_empty(rows, dtype=torch.float32),
            a.new_empty(m, n) if keep else a.new_empty(0, dtype=torch.float32))


def _matmul_rmsnorm_eager(a, b, weight, eps, return_rstd, fused, keep=False, linear_bias=None,
                          residual=None) -> tuple:
    """(y, rstd, h), as :func:`_matmul_layernorm_eager`."""
    spec = _kernels.SPEC_RMSNORM
    m, n = a.shape[0], b.shape[1]
    args = (*contiguous_operands(a, b, weight), eps, *contiguous_or_none(linear_bias, residual))
    stats = return_rstd or keep
    if m == 0 or n == 0:
        y, rstd, h = _empty_outputs(spec, args, a, m, n, fused, 1, keep)
        return y, rstd if stats else None, h
    if runtime.decide(spec, args, fused, training=keep).fused:
        h = a.new_empty(m, n) if keep else None
        y, rstd = runtime.launch(spec, (*args, h) if keep else args)
        return y, rstd if stats else None, h
    if not stats:
        c = _norm_input(a, b, linear_bias, residual, with_residual=False)
        return _unfused_norm(_rms_norm, c, residual, _like(weight, c), eps), None, None
    h = _norm_input(a, b, linear_bias, residual)
    y, rstd = compiled_rms_norm(h, weight, eps)
    return y, rstd, h if keep else None


def _matmul_rmsnorm(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None, eps: float,
                    return_rstd: bool, fused: bool | None, keep: bool, linear_bias: torch.Tensor | None,
                    residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return filled(a, _matmul_rmsnorm_eager(a, b, weight, eps, return_rstd, fused, keep, linear_bias, residual))


def _matmul_rmsnorm_fake(a, b, weight, eps, return_rstd, fused, keep, linear_bias, residual):
    m, n = a.shape[0], b.shape[1]
    rows = m if return_rstd or keep else 0
    return (a.new_empty(m, n), a.new_empty(rows, dtype=torch.float32),
            a.new_empty(m, n) if keep else a.new_empty(0, dtype=torch.float32))


# Autograd. The full-row ops are called with keep=True when autograd records them: the
# forward (fused or not) also returns the norm's input h = a @ b [+ linear_bias] [+ residual]
# and the statistics, which the backward uses (see helion_kernels.grads for why). The
# split-N ops reuse these functions with nothing kept and no addends (inputs a, b, weight,
# [bias,] eps): their backward recomputes the product. The statistics outputs are not
# differentiable. ``eps`` is input 4 (LayerNorm) or 3; the full-row ops' addends are their
# last two inputs.


def _kept(ctx, kind: str, saved: list) -> tuple | None:
    """The forward's (h, mean, rstd) from ``saved`` [h, mean, rstd] or None."""
    if not ctx.kept:
        return None
    product, mean, rstd = saved
    return product, (mean if kind == "layernorm" else None), rstd


def _setup(ctx, inputs, output, n_params: int, keep_at: int, kept: tuple[int, ...]) -> None:
    """Autograd context of a post-norm op: inputs ``[:n_params]`` saved, ``inputs[keep_at]``
    the keep flag (absent for split-N), ``output[i]`` for ``i`` in ``kept`` saved when kept."""
    ctx.set_materialize_grads(False)  # no [M, N] zero gradients for the statistics and h
    ctx.kept = len(inputs) > keep_at and inputs[keep_at]
    ctx.has_addends = len(inputs) > keep_at + 1
    addends = inputs[keep_at + 1:keep_at + 3] if ctx.has_addends else (None, None)
    ctx.addend_dtypes = tuple(None if t is None else t.dtype for t in addends)
    ctx.save_for_backward(*inputs[:n_params], *(output[i] for i in (kept if ctx.kept else ())))
    ctx.eps = inputs[n_params]
    ctx.mark_non_differentiable(*output[1:])


def _input_grads(ctx, param_grads: tuple, addend_grads: tuple) -> tuple:
    """One gradient per op input: the GEMM operands' and norm parameters', None for eps and
    the flags, then the addends' (full-row ops only)."""
    n = len(ctx.needs_input_grad)
    if not ctx.has_addends:
        return (*param_grads, *(None,) * (n - len(param_grads)))
    return (*param_grads, *(None,) * (n - len(param_grads) - 2), *addend_grads)


def setup_layernorm(ctx, inputs, output):
    _setup(ctx, inputs, output, 4, 7, (3, 1, 2))


def backward_layernorm(ctx, dy, *_):
    if dy is None:  # nothing downstream used y
        return (None,) * len(ctx.needs_input_grad)
    a, b, weight, bias, *saved = ctx.saved_tensors
    needs = (*ctx.needs_input_grad[:4], *ctx.needs_input_grad[8:10])
    grads = postnorm_grads("layernorm", a, b, weight, bias, ctx.eps, dy, needs, _kept(ctx, "layernorm", saved),
                           ctx.addend_dtypes)
    return _input_grads(ctx, grads[:4], grads[4:])


def setup_rmsnorm(ctx, inputs, output):
    _setup(ctx, inputs, output, 3, 6, (2, 1, 1))


def backward_rmsnorm(ctx, dy, *_):
    if dy is None:
        return (None,) * len(ctx.needs_input_grad)
    a, b, weight, *saved = ctx.saved_tensors
    needs = (*ctx.needs_input_grad[:3], False, *ctx.needs_input_grad[7:9])
    grads = postnorm_grads("rmsnorm", a, b, weight, None, ctx.eps, dy, needs, _kept(ctx, "rmsnorm", saved),
                           ctx.addend_dtypes)
    return _input_grads(ctx, grads[:3], grads[4:])


_LAYERNORM = Op("matmul_layernorm", _matmul_layernorm, _matmul_layernorm_fake, eager=_matmul_layernorm_eager,
                backward=backward_layernorm, setup_context=setup_layernorm)
_RMSNORM = Op("matmul_rmsnorm", _matmul_rmsnorm, _matmul_rmsnorm_fake, eager=_matmul_rmsnorm_eager,
              backward=backward_rmsnorm, setup_context=setup_rmsnorm)


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
    (:mod:`helion_kernels.kernels.postnorm_full_row`). Per shape, the registry records
    whether that kernel beat cuBLAS + the inductor-compiled norm when it was tuned; the
    call runs the winner (see :func:`use_fused`), so a tuned shape never regresses. When
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
        (:mod:`helion_kernels.grads`).

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
