"""Jagged attention (technique 4): ``gdpa`` and ``flash_norm_attention``, forward and
backward. Source: the PyTorch blog "Towards Free Normalization: Fusing Normalization into
GEMM and Attention Kernels" (Meta, 2026). Kernels and references: :mod:`.kernels`.
"""

from __future__ import annotations

from numbers import Integral

import torch

from ... import checks, runtime
from ...autograd import (Op, f32, filled, layer_row_backward, param_grad, records_grad, rms_row_backward,
                         run_compiled)
from ...limits import ACTIVATIONS, MAX_SEQ_LEN_KV

_kernels = runtime.LazyModule(f"{__name__}.kernels")


def _gdpa_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor,
               kv_offsets: torch.Tensor, max_seq_len_q: int, max_seq_len_kv: int, activation: str,
               qk_scale: float, validate: bool) -> torch.Tensor:
    if validate:
        checks.check_offsets("gdpa", q_offsets, kv_offsets, q.shape[0], k.shape[0], max_seq_len_q,
                             max_seq_len_kv)
    if q.shape[0] == 0:
        return torch.empty_like(q)
    args = (q.contiguous(), k.contiguous(), v.contiguous(), q_offsets, kv_offsets, max_seq_len_q,
            qk_scale, ACTIVATIONS.index(activation))
    return runtime.launch(_kernels.SPEC_GDPA, args)


def _fna_eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor,
               kv_offsets: torch.Tensor, max_seq_len_q: int, max_seq_len_kv: int,
               ln_weight: torch.Tensor | None, ln_bias: torch.Tensor | None,
               rms_weight: torch.Tensor | None, eps: float, activation: str, qk_scale: float,
               validate: bool, keep: bool = False) -> tuple:
    """(out, o, stats): with ``keep`` (autograd records the call) the kernel also writes the
    un-normalised ``o`` [total_q, H, D] and the rows' fp32 statistics [3, total_q] (LayerNorm
    mean and rstd, RMSNorm rstd) for the backward; else both are None."""
    if validate:
        checks.check_offsets("flash_norm_attention", q_offsets, kv_offsets, q.shape[0], k.shape[0],
                             max_seq_len_q, max_seq_len_kv)
    saved = (torch.empty_like(q), q.new_empty(3, q.shape[0], dtype=torch.float32)) if keep else (None, None)
    if q.shape[0] == 0:
        return torch.empty_like(q), *saved
    heads, dim = q.shape[1], q.shape[2]
    params = [None if t is None else t.reshape(heads, dim).contiguous() for t in (ln_weight, ln_bias, rms_weight)]
    args = (q.contiguous(), k.contiguous(), v.contiguous(), q_offsets, kv_offsets, max_seq_len_q,
            *params, eps, qk_scale, ACTIVATIONS.index(activation))
    return runtime.launch(_kernels.SPEC, (*args, *saved) if keep else args), *saved


def _fna_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor,
              kv_offsets: torch.Tensor, max_seq_len_q: int, max_seq_len_kv: int,
              ln_weight: torch.Tensor | None, ln_bias: torch.Tensor | None,
              rms_weight: torch.Tensor | None, eps: float, activation: str, qk_scale: float,
              validate: bool, keep: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return filled(q, _fna_eager(q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, ln_weight,
                                ln_bias, rms_weight, eps, activation, qk_scale, validate, keep))


def _gdpa_fake(q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, activation, qk_scale, validate):
    return torch.empty_like(q)


def _fna_fake(q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, ln_weight, ln_bias,
              rms_weight, eps, activation, qk_scale, validate, keep):
    if not keep:
        return torch.empty_like(q), q.new_empty(0, dtype=torch.float32), q.new_empty(0, dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(q), q.new_empty(3, q.shape[0], dtype=torch.float32)


# --- backward -----------------------------------------------------------------------------


def _gdpa_backward_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor,
                        q_offsets: torch.Tensor, kv_offsets: torch.Tensor, max_seq_len_q: int,
                        max_seq_len_kv: int, activation: str,
                        qk_scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of jagged GDPA: the two deterministic Helion kernels of
    :mod:`.kernels`, each with its registry config for (H, D) (else its default)."""
    if q.shape[0] == 0 or k.shape[0] == 0:  # no products: every gradient is 0
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    q, k, v, dout = (t.contiguous() for t in (q, k, v, dout))
    act = ACTIVATIONS.index(activation)
    dq = runtime.launch(_kernels.SPEC_GDPA_DQ, (q, k, v, dout, q_offsets, kv_offsets, max_seq_len_q, qk_scale, act))
    dk, dv = runtime.launch(_kernels.SPEC_GDPA_DKDV,
                            (q, k, v, dout, q_offsets, kv_offsets, max_seq_len_kv, qk_scale, act))
    return dq, dk, dv


def _gdpa_backward_fake(q, k, v, dout, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, activation,
                        qk_scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


_GDPA_BACKWARD = Op("gdpa_backward", _gdpa_backward_impl, _gdpa_backward_fake)


def _setup_gdpa(ctx, inputs, output):
    x = _GDPA.named(inputs)
    ctx.save_for_backward(x.q, x.k, x.v, x.q_offsets, x.kv_offsets)
    ctx.args = (x.max_seq_len_q, x.max_seq_len_kv, x.activation, x.qk_scale)


def _backward_gdpa(ctx, dout):
    q, k, v, q_offsets, kv_offsets = ctx.saved_tensors
    dq, dk, dv = _GDPA_BACKWARD(q, k, v, dout, q_offsets, kv_offsets, *ctx.args)
    return _GDPA.input_grads(q=dq, k=dk, v=dv)


def _setup_fna(ctx, inputs, output):
    x = _FNA.named(inputs)
    if not x.keep:
        raise RuntimeError("flash_norm_attention: a recorded call must keep o and the statistics")
    ctx.set_materialize_grads(False)
    _, o, stats = output
    ctx.save_for_backward(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, x.ln_weight, x.ln_bias, x.rms_weight, o, stats)
    ctx.args = (x.max_seq_len_q, x.max_seq_len_kv, x.activation, x.qk_scale)
    ctx.mark_non_differentiable(o, stats)


def _fna_output_backward(dy, o, q, stats, ln_weight, ln_bias, rms_weight):
    """(do in ``o.dtype``, the recomputed ``ln`` in ``q.dtype``, drms_weight fp32 [W] or
    None) from ``dy`` [T, W]: the RMSNorm's backward (parameters [W] or None)."""
    dy32 = f32(dy)
    rstd_o = stats[2]
    o_hat = f32(o) * rstd_o[:, None]
    g = dy32 if rms_weight is None else dy32 * f32(rms_weight)
    do = rms_row_backward(g, o_hat, rstd_o)
    drms_weight = (dy32 * o_hat).sum(dim=0) if rms_weight is not None else None
    ln = (f32(q) - stats[0][:, None]) * stats[1][:, None]
    if ln_weight is not None:
        ln = ln * f32(ln_weight)
    if ln_bias is not None:
        ln = ln + f32(ln_bias)
    return do.to(o.dtype), ln.to(q.dtype), drms_weight


def _fna_input_backward(dy, do, dln_attention, q, stats, ln_weight):
    """(dq in ``q.dtype``, dln_weight fp32 [W] or None, dln_bias fp32 [W]): the LayerNorm's
    backward of ``dln = do + dln_attention``, plus the outer residual's ``dy``."""
    dln = f32(do) + f32(dln_attention)
    q_hat = (f32(q) - stats[0][:, None]) * stats[1][:, None]
    g = dln if ln_weight is None else dln * f32(ln_weight)
    dq = f32(dy) + layer_row_backward(g, q_hat, stats[1])
    dln_weight = (dln * q_hat).sum(dim=0) if ln_weight is not None else None
    return dq.to(q.dtype), dln_weight, dln.sum(dim=0)


def _norms_apart_dq(q, k, v, dy, o, stats, q_offsets, kv_offsets, max_seq_len_q, ln_weight, ln_bias, rms_weight,
                    qk_scale, act, need_params):
    """What :data:`~.kernels.SPEC_FNA_DQ`'s kernel computes, with the norms apart: an inductor
    row pass (RMSNorm backward, ``ln`` recomputed), GDPA's dq kernel, a second inductor row
    pass (LayerNorm backward). Returns (dq, ln, do, the parameters' fp32 gradients [3, H, D]
    or an empty tensor)."""
    total, heads, dim = q.shape
    flat = [None if t is None else t.reshape(heads * dim) for t in (ln_weight, ln_bias, rms_weight)]
    rows = [t.reshape(total, heads * dim) for t in (dy, o, q)]
    do, ln, drms_weight = run_compiled(_fna_output_backward, rows[0], rows[1], rows[2], stats, *flat)
    ln, do = ln.view(q.shape), do.view(q.shape)
    if k.shape[0] == 0:  # no keys: no attention path
        dln = torch.zeros_like(ln)
    else:
        dln = runtime.launch(_kernels.SPEC_GDPA_DQ, (ln, k, v, do, q_offsets, kv_offsets, max_seq_len_q, qk_scale,
                                                     act))
    dq, dln_weight, dln_bias = run_compiled(_fna_input_backward, rows[0], do.view(total, -1),
                                            dln.view(total, -1), rows[2], stats, flat[0])
    if not need_params:
        return dq.view(q.shape), ln, do, q.new_empty(0, dtype=torch.float32)
    grads = [dln_bias.new_zeros(heads * dim) if g is None else g for g in (dln_weight, dln_bias, drms_weight)]
    return dq.view(q.shape), ln, do, torch.stack(grads).view(3, heads, dim)


def _fna_backward_impl(dy: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       stats: torch.Tensor, q_offsets: torch.Tensor, kv_offsets: torch.Tensor,
                       ln_weight: torch.Tensor | None, ln_bias: torch.Tensor | None,
                       rms_weight: torch.Tensor | None, max_seq_len_q: int, max_seq_len_kv: int,
                       activation: str, qk_scale: float, need_params: bool, need_kv: bool,
                       fused: bool | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, the three norm parameters' fp32 gradients [3, H, D] (LayerNorm weight,
    bias, RMSNorm weight), or an empty tensor without ``need_params``).

    dq and the norms: the fused norms-and-dq kernel (registry ``flash_norm_attention_dq``)
    where tuning measured it faster than the norms apart for (H, D), else
    :func:`_norms_apart_dq` (``fused`` True / False forces). Then, with ``need_kv``, GDPA's
    dk/dv kernel (``gdpa_dkdv``) on the ``ln`` and ``do`` either wrote (else dk, dv are zeros)."""
    total, heads, dim = q.shape
    act = ACTIVATIONS.index(activation)
    if total == 0:
        dparams = q.new_zeros((3, heads, dim) if need_params else (0,), dtype=torch.float32)
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), dparams
    dy, q, k, v, o = (t.contiguous() for t in (dy, q, k, v, o))
    params = [None if t is None else t.reshape(heads, dim).contiguous() for t in (ln_weight, ln_bias, rms_weight)]
    args = (q, k, v, dy, o, stats, q_offsets, kv_offsets, max_seq_len_q, *params, qk_scale, act, int(need_params))
    if runtime.decide(_kernels.SPEC_FNA_DQ, args, fused).fused:
        dq, ln, do, partials = runtime.launch(_kernels.SPEC_FNA_DQ, args)
        dparams = partials.sum(dim=1) if need_params else q.new_empty(0, dtype=torch.float32)
    else:
        dq, ln, do, dparams = _norms_apart_dq(*args)
    if need_kv and k.shape[0] > 0:
        dk, dv = runtime.launch(_kernels.SPEC_GDPA_DKDV, (ln, k, v, do, q_offsets, kv_offsets, max_seq_len_kv,
                                                          qk_scale, act))
    else:
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    return dq, dk, dv, dparams


def _fna_backward_fake(dy, q, k, v, o, stats, q_offsets, kv_offsets, ln_weight, ln_bias, rms_weight,
                       max_seq_len_q, max_seq_len_kv, activation, qk_scale, need_params, need_kv, fused=None):
    dparams = q.new_empty((3, q.shape[1], q.shape[2]) if need_params else (0,), dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dparams


_FNA_BACKWARD = Op("flash_norm_attention_backward", _fna_backward_impl, _fna_backward_fake)


def _backward_fna(ctx, dy, *_):
    """Both norms' backward around GDPA's dq loop (fused into its kernel where tuning measured
    that faster), then GDPA's dk/dv kernel (:func:`_fna_backward_impl`); the scores are
    recomputed, never stored."""
    if dy is None:
        return _FNA.input_grads()
    need = _FNA.named(ctx.needs_input_grad)
    q, k, v, q_offsets, kv_offsets, ln_weight, ln_bias, rms_weight, o, stats = ctx.saved_tensors
    params = {"ln_weight": ln_weight, "ln_bias": ln_bias, "rms_weight": rms_weight}  # dparams' order
    need_params = any(getattr(need, name) and p is not None for name, p in params.items())
    max_q, max_kv, activation, qk_scale = ctx.args
    dq, dk, dv, dparams = _FNA_BACKWARD(dy, q, k, v, o, stats, q_offsets, kv_offsets, *params.values(), max_q,
                                        max_kv, activation, qk_scale, need_params, bool(need.k or need.v), None)
    grads = {name: param_grad(dparams[i] if need_params else None, p, getattr(need, name))
             for i, (name, p) in enumerate(params.items())}
    return _FNA.input_grads(q=dq, k=dk, v=dv, **grads)


_GDPA = Op("gdpa", _gdpa_impl, _gdpa_fake, backward=_backward_gdpa, setup_context=_setup_gdpa)
_FNA = Op("flash_norm_attention", _fna_impl, _fna_fake, eager=_fna_eager, backward=_backward_fna,
          setup_context=_setup_fna)


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
    2026), an activation in place of the softmax (:mod:`.kernels`). Its three kernels (forward,
    dq, dk/dv) take their registry configs for (H, D) (``helion-kernels autotune --kernel gdpa``,
    ``gdpa_dq`` or ``gdpa_dkdv`` ``--workload flash_norm_attention``), else a fixed default,
    without a warning.

    Args:
        q: [total_q, H, D], bf16/fp16/fp32, CUDA. Sequence i is rows
            ``q_offsets[i]:q_offsets[i + 1]``.
        k, v: [total_kv, H, D], same dtype and device, delimited by ``kv_offsets``.
        q_offsets, kv_offsets: int64 [B + 1], from 0 to total_q / total_kv, non-decreasing.
        max_seq_len_q, max_seq_len_kv: upper bounds of the sequence lengths; the kernel
            launches programs for ``max_seq_len_q`` rows per sequence.
        activation: "fast_gelu" (GELU, tanh approximation), "gelu", "silu" or "relu".
        qk_scale: multiplies the scores before the activation.
        validate: check the offsets' values (one device-to-host copy per call, also inside
            a compiled graph). False skips that, and then offsets that are not 0..total and
            non-decreasing are undefined behaviour (out-of-bounds reads and writes on a GPU),
            and rows of a sequence longer than ``max_seq_len_q`` are left uninitialised.

    Returns:
        [total_q, H, D] in the input dtype (fp32 scores and accumulation; the activation's
        output is rounded to the input dtype before the second GEMM, as in flash attention,
        so with fp16 an activation past 65504 overflows). Rows of a sequence with no KV rows are 0.
        Differentiable in ``q``, ``k`` and ``v``: the backward recomputes the scores and runs
        two deterministic Helion kernels (dq; dk and dv), nothing saved beyond the inputs
        (:mod:`.kernels`).

    Raises:
        TypeError, ValueError: bad ranks, dtypes, devices, offsets, lengths past the
            maxima, H < 1 or D < 16, unknown activation.
    """
    op = "gdpa"
    checks.jagged(op, q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, activation, qk_scale)
    runtime.check_runnable(op, q.device)
    return _GDPA(q, k, v, q_offsets, kv_offsets, int(max_seq_len_q), int(max_seq_len_kv), activation,
                 float(qk_scale), bool(validate))


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
    :mod:`.kernels`. One program owns a tile of Q rows of
    one sequence for all heads, walks the heads with 2-D dots and the sequence's K/V (at
    most 128 rows) in KV tiles, and rescales its own un-normalised writes for the RMSNorm. The
    config comes from the registry, keyed by (H, D, dtype) (``helion-kernels autotune
    --kernel flash_norm_attention``); untuned (H, D) take the nearest tuned one, and a GPU
    without entries the conservative default, with a ``ConfigFallbackWarning``.

    Args:
        q, k, v, q_offsets, kv_offsets, max_seq_len_q, activation, qk_scale, validate: as
            :func:`gdpa`.
        max_seq_len_kv: at most 128 (:data:`~helion_kernels.limits.MAX_SEQ_LEN_KV`).
        ln_weight, ln_bias: LayerNorm affine parameters, [H * D] or [H, D], or None.
        rms_weight: RMSNorm weight, [H * D] or [H, D], or None.
        eps: of both norms, >= 0.

    Returns:
        [total_q, H, D] in the input dtype (fp32 statistics and accumulation).
        Differentiable in ``q``, ``k``, ``v`` and the three norm parameters. When autograd
        records the call the kernel also writes the un-normalised ``o = gdpa(ln_q) + ln_q``
        and each row's fp32 statistics of both norms (as FlashAttention saves its output);
        the backward is two kernels: both norms' backward fused into GDPA's dq kernel
        (registry ``flash_norm_attention_dq``), then GDPA's dk/dv kernel (``gdpa_dkdv``) on
        the ``ln_q`` and ``do`` the first wrote; the scores are recomputed, never stored.

    Raises:
        ValueError: ``max_seq_len_kv`` (or a KV sequence) longer than 128, with the unfused
            alternative named; affine parameters of the wrong shape; and everything
            :func:`gdpa` raises. (A head_dim D that is not a power of two is fine: the kernel
            masks the padded lanes out of both norms.)
    """
    op = "flash_norm_attention"
    if isinstance(max_seq_len_kv, Integral) and not isinstance(max_seq_len_kv, bool) and max_seq_len_kv > MAX_SEQ_LEN_KV:
        raise ValueError(
            f"{op}: max_seq_len_kv = {max_seq_len_kv} is past this kernel's limit of {MAX_SEQ_LEN_KV} KV "
            f"rows per sequence (the short-KV regime it is built and tuned for); use gdpa() with "
            f"separate norms for longer KV"
        )
    checks.jagged(op, q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, activation, qk_scale)
    heads, dim = q.shape[1], q.shape[2]
    for name, t in (("ln_weight", ln_weight), ("ln_bias", ln_bias), ("rms_weight", rms_weight)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{op}: {name} must be a floating-point tensor or None")
        if tuple(t.shape) not in ((heads * dim,), (heads, dim)):
            raise ValueError(f"{op}: {name} must have shape [H * D] = ({heads * dim},) or "
                             f"[H, D] = ({heads}, {dim}), got {tuple(t.shape)}")
        checks.same_device(op, q, t)
    eps = checks.finite(op, "eps", eps, minimum=0.0)
    runtime.check_runnable(op, q.device)
    keep = records_grad(q, k, v, ln_weight, ln_bias, rms_weight)
    return _FNA(q, k, v, q_offsets, kv_offsets, int(max_seq_len_q), int(max_seq_len_kv), ln_weight,
                ln_bias, rms_weight, eps, activation, float(qk_scale), bool(validate), keep)[0]
