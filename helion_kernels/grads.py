"""Backward passes of the GEMM + norm ops, in PyTorch: the formulas the kernels implement
and the unfused backward the ops fall back to.

Pure functions of what the forward saved and the incoming gradients, so the tests can
check them with ``torch.autograd.gradcheck`` in float64 and the ops' autograd
registrations (:mod:`.ops`) stay thin. Norm statistics and elementwise arithmetic are fp32;
the GEMMs run in the input dtype with fp32 accumulation (as ``nn.Linear``'s backward does);
norm weight and bias gradients are fp32 sums over rows (deterministic, never accumulated in
bf16), cast to the parameter's dtype at the end.

What each forward saves, and why (the cheapest set that rebuilds the normalised tensor):

* pre-norm ``rms_norm(a) @ b``: ``a``, ``b`` (alive anyway: the layer's input and weight)
  and the fp32 ``rstd`` [M]. After the fused forward ``x_hat = a * rstd`` is rebuilt on the
  fly; the unfused forward writes it for its cuBLAS GEMM anyway, and it is kept for the wgrad
  (when ``b``'s gradient is wanted), as the compiled PyTorch pair keeps its norm output.
* full-row post-norm ``norm(a @ b [+ linear_bias] [+ residual])``: ``a``, ``b``, the affine
  parameters, the norm's input ``c = a @ b [+ ...]`` in the input dtype (written by the
  forward, fused or not, only when autograd records the call) and the fp32 ``mean``/``rstd``. Recomputing ``c`` would cost a whole GEMM
  in the backward; rebuilding ``x_hat`` from the output, ``(y - bias) / weight``, fails where a
  weight element is 0 (a common initialisation of a residual branch's norm) and loses
  precision where ``|bias| >> |weight * x_hat|``. Keeping ``c`` costs one [M, N] write in the
  forward and its memory until the backward, as the unfused pair's autograd keeps it.
* split-N post-norm: ``a``, ``b`` and the affine parameters; the product is recomputed (its
  kernels do not write it).
* ``rms_norm(a @ b) @ c`` (deferred): ``a``, ``b``, ``c``, the producer's un-normalised
  ``x = a @ b`` (it writes it anyway) and the fp32 ``rstd``.
"""

from __future__ import annotations

import functools

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode


def tracing(args: tuple) -> bool:
    """Whether a call is being traced rather than run: ``torch.compile``, or a tracer that
    works below it (AOTAutograd tracing a backward, ``opcheck``, ``make_fx``) with a dispatch
    mode active or tensor subclasses (fake, functional) as arguments."""
    return (torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None
            or any(isinstance(t, torch.Tensor) and type(t) not in _PLAIN for t in args))


_PLAIN = (torch.Tensor, torch.nn.Parameter)


@functools.cache
def _inductor(fn):
    return torch.compile(fn, dynamic=None)


def widths_static(args: tuple) -> tuple:
    """``args`` with every size marked static for ``torch.compile`` except the rows: any
    dimension of ``args[0]``'s first dimension's length (M, a batch's token count, which may
    change between steps: the rows of an [M, N] tensor, an [M] rstd, the last dimension of the
    attention's [3, M] statistics). Widths (N, K, a weight's length) never change for a layer.

    With ``dynamic=None`` inductor compiles for the first shape and, at the next M, once more
    with what changed made symbolic: M, but unmarked also N when another layer of another
    width calls the same function, which turns its one-pass row reduction into a loop. (And
    ``dynamic=False`` compiles once per M until dynamo's recompile limit, 8, sends the
    function to eager.) The marks go on aliases (``detach``), not on the caller's tensors.
    Rows are told by length: a width that happens to equal M is left unmarked like the rows,
    which can cost one more compile (the results are the same). Each width is a graph of its
    own, times each dtype, each pattern of None arguments and each flag value, so
    :func:`call_compiled` raises dynamo's per-function recompile limit (8) for these calls.
    """
    m = args[0].shape[0]
    marked = []
    for t in args:
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            t = t.detach()
            for dim, size in enumerate(t.shape):
                if size != m:
                    torch._dynamo.mark_static(t, dim)
        marked.append(t)
    return tuple(marked)


# Graphs one compiled pass may hold (dynamo's default is 8 per function, past which it runs
# eagerly): widths x dtypes x None patterns x flags of one process, e.g. the post-norm row
# backward at 2 widths, both norms and both bias flags already needs 8.
RECOMPILE_LIMIT = 64


def call_compiled(compiled, args: tuple):
    """``compiled(*widths_static(args))`` with dynamo's per-function recompile limit raised to
    :data:`RECOMPILE_LIMIT` while it runs (the limit is read when a call compiles)."""
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        return compiled(*widths_static(args))


def run_compiled(fn, *args):
    """``fn(*args)``, compiled by inductor on CUDA when called eagerly (one fused pass instead
    of a dozen fp32 kernels): per set of widths and dtypes, once for the first M and once more
    for every other M >= 2 (:func:`widths_static`); traced as it is while ``torch.compile``
    traces the caller (the caller's graph compiles it) and eager on a CPU. ``fn`` computes, it
    is not differentiated through (its callers are backward formulas and custom ops' bodies)."""
    if args[0].is_cuda and not tracing(args):
        return call_compiled(_inductor(fn), args)
    return fn(*args)


def mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` accumulated and returned in fp32 (torch's CPU build has no ``out_dtype``)."""
    if a.is_cuda and a.dtype in (torch.bfloat16, torch.float16):
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()


def param_grad(value: torch.Tensor | None, param: torch.Tensor | None, needed: bool = True) -> torch.Tensor | None:
    """A parameter's gradient computed in fp32 (``value``), in the parameter's shape and dtype;
    None where it is not needed or either is None."""
    if not needed or param is None or value is None:
        return None
    return value.reshape(param.shape).to(param.dtype)


def column_major(b: torch.Tensor) -> bool:
    """Whether ``b`` [K, N] is the transposed view of a row-major [N, K] tensor (an
    ``nn.Linear`` weight passed as ``W.t()``) and not also row-major itself."""
    return b.dim() == 2 and not b.is_contiguous() and b.t().is_contiguous()


def wgrad(x: torch.Tensor, dc: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``dB = x^T @ dc`` [K, N] of ``c = x @ b``, laid out as ``b``: for a column-major ``b``
    (``W.t()``) the GEMM writes W's gradient [N, K] row-major and returns its transposed view,
    as torch's own mm backward does, so autograd accumulates it into W without a transposing
    copy."""
    return torch.mm(dc.t(), x).t() if column_major(b) else torch.mm(x.t(), dc)


def empty_like_layout(b: torch.Tensor) -> torch.Tensor:
    """An empty tensor of ``b``'s shape with :func:`wgrad`'s layout for ``b`` (custom ops' fakes)."""
    return b.new_empty(b.shape[::-1]).t() if column_major(b) else b.new_empty(b.shape)


def matmul_grads(a: torch.Tensor, b: torch.Tensor, dc: torch.Tensor, need_a: bool = True, need_b: bool = True):
    """(dA, dB) of ``c = a @ b``; dB laid out as ``b`` (:func:`wgrad`)."""
    return (torch.mm(dc, b.t()) if need_a else None, wgrad(a, dc, b) if need_b else None)


def rms_row_backward(dx_hat: torch.Tensor, x_hat: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """d(input) of ``x_hat = x * rstd`` (no affine), fp32: ``rstd * (dx_hat - x_hat * mean(dx_hat * x_hat))``."""
    s = (dx_hat * x_hat).mean(dim=1, keepdim=True)
    return rstd[:, None] * (dx_hat - x_hat * s)


def layer_row_backward(dx_hat: torch.Tensor, x_hat: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """d(input) of ``x_hat = (x - mean) * rstd`` (no affine), fp32."""
    return rstd[:, None] * (dx_hat - dx_hat.mean(dim=1, keepdim=True)
                            - x_hat * (dx_hat * x_hat).mean(dim=1, keepdim=True))


def _f32(t: torch.Tensor) -> torch.Tensor:
    """fp32, or float64 for float64 (gradcheck)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


# --- pre-norm: c = (a * rstd) @ b -------------------------------------------------------


def rms_x_hat(a: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """``x_hat = a * rstd[:, None]`` in ``a.dtype`` (the wgrad GEMM's operand)."""
    return (_f32(a) * rstd[:, None]).to(a.dtype)


def rms_rstd(a: torch.Tensor, eps: float) -> torch.Tensor:
    """The rows' ``rstd = 1 / sqrt(mean(a**2, dim=1) + eps)`` [M] in fp32."""
    return torch.rsqrt(a.float().pow(2).mean(dim=1) + eps)


def given_rstd_dgrad(g: torch.Tensor, a: torch.Tensor, rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(da in ``a.dtype``, drstd fp32) of ``c = (a * rstd[:, None]) @ b`` with ``rstd`` an
    input, from ``g = dc @ b^T`` (fp32): ``da = rstd * g``, ``drstd = sum_k(a * g)``."""
    g32 = _f32(g)
    return (g32 * rstd[:, None]).to(a.dtype), (_f32(a) * g32).sum(dim=1)


def prenorm_norm_backward(dx_hat: torch.Tensor, a: torch.Tensor, rstd: torch.Tensor):
    """(da, x_hat) in ``a.dtype`` from ``dx_hat = dc @ b^T``: the RMSNorm backward the
    pre-norm dgrad kernel applies in its epilogue."""
    x_hat = _f32(a) * rstd[:, None]
    return rms_row_backward(_f32(dx_hat), x_hat, rstd).to(a.dtype), x_hat.to(a.dtype)


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
    return rms_row_backward(_f32(dx_hat), _f32(a) * rstd[:, None], rstd).to(a.dtype)


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


# --- post-norm: y = norm(c) * weight + bias, c = a @ b ------------------------------------


def postnorm_stats(c: torch.Tensor, kind: str, eps: float):
    """(mean or None, rstd) of the rows of ``c`` in fp32, for ``kind`` "layernorm" or "rmsnorm"."""
    c32 = _f32(c)
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
    dy32 = _f32(dy)
    x_hat = (_f32(c) if mean is None else _f32(c) - mean[:, None]) * rstd[:, None]
    g = dy32 if weight is None else dy32 * _f32(weight)
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


def deferred_grads(a, b, c, x, rstd, dout, needs: tuple[bool, bool, bool]):
    """(dA, dB, dC) of ``out = rms_norm(a @ b) @ c`` (the norm weight folded into ``c``), from
    the forward's ``x = a @ b`` (input dtype) and fp32 ``rstd``."""
    dc = wgrad(run_compiled(rms_x_hat, x, rstd), dout, c) if needs[2] else None
    da = db = None
    if needs[0] or needs[1]:
        dx = rmsnorm_matmul_da(x, c, dout, rstd)
        da, db = matmul_grads(a, b, dx, needs[0], needs[1])
    return da, db, dc


# --- FlashNormAttention: out = rms_norm(gdpa(ln) + ln) + q, ln = layer_norm(q) over H*D ----
# Rows are [total_q, H * D]; ``stats`` [3, total_q] fp32 holds the forward's LayerNorm mean
# and rstd and the RMSNorm rstd; ``o`` is the forward's un-normalised gdpa(ln) + ln. The
# attention's own backward (dln, dk, dv from ``do``) runs between the two passes below.


def fna_output_backward(dy, o, q, stats, ln_weight, ln_bias, rms_weight, need_rms_weight: bool = True):
    """(do in ``o.dtype``, the recomputed ``ln`` in ``q.dtype`` (the attention's input),
    drms_weight fp32 [W] or None) from the output gradient ``dy`` [T, W]: the RMSNorm's
    backward. Affine parameters are [W] or None."""
    dy32 = _f32(dy)
    rstd_o = stats[2]
    o_hat = _f32(o) * rstd_o[:, None]
    g = dy32 if rms_weight is None else dy32 * _f32(rms_weight)
    do = rms_row_backward(g, o_hat, rstd_o)
    drms_weight = (dy32 * o_hat).sum(dim=0) if need_rms_weight and rms_weight is not None else None
    ln = (_f32(q) - stats[0][:, None]) * stats[1][:, None]
    if ln_weight is not None:
        ln = ln * _f32(ln_weight)
    if ln_bias is not None:
        ln = ln + _f32(ln_bias)
    return do.to(o.dtype), ln.to(q.dtype), drms_weight


def fna_input_backward(dy, do, dln_attention, q, stats, ln_weight, need_ln_weight: bool = True,
                       need_ln_bias: bool = True):
    """(dq in ``q.dtype``, dln_weight fp32 [W] or None, dln_bias fp32 [W] or None): the
    LayerNorm's backward of ``dln = do + dln_attention`` (the residual and the attention
    paths into ``ln``), plus the outer residual's ``dy``."""
    dln = _f32(do) + _f32(dln_attention)
    q_hat = (_f32(q) - stats[0][:, None]) * stats[1][:, None]
    g = dln if ln_weight is None else dln * _f32(ln_weight)
    dq = _f32(dy) + layer_row_backward(g, q_hat, stats[1])
    dln_weight = (dln * q_hat).sum(dim=0) if need_ln_weight and ln_weight is not None else None
    dln_bias = dln.sum(dim=0) if need_ln_bias else None
    return dq.to(q.dtype), dln_weight, dln_bias
