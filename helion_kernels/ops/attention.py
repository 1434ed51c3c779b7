"""Jagged attention (technique 4): ``gdpa`` and ``flash_norm_attention``.

Source: the PyTorch blog "Towards Free Normalization: Fusing Normalization into GEMM and
Attention Kernels" (Meta, 2026); the kernels and references are
:mod:`helion_kernels.kernels.gdpa` and :mod:`helion_kernels.kernels.flash_norm_attention`.
"""

from __future__ import annotations

from numbers import Integral

import torch

from .. import checks, runtime
from ..kernels.limits import ACTIVATIONS, MAX_SEQ_LEN_KV
from ._op import Op

_gdpa = runtime.LazyModule("helion_kernels.kernels.gdpa")
_fna = runtime.LazyModule("helion_kernels.kernels.flash_norm_attention")


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
    return runtime.launch_kernel(_gdpa.gdpa_kernel, args)  # its config is pinned on the kernel


def _fna_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor,
              kv_offsets: torch.Tensor, max_seq_len_q: int, max_seq_len_kv: int,
              ln_weight: torch.Tensor | None, ln_bias: torch.Tensor | None,
              rms_weight: torch.Tensor | None, eps: float, activation: str, qk_scale: float,
              validate: bool) -> torch.Tensor:
    if validate:
        checks.check_offsets("flash_norm_attention", q_offsets, kv_offsets, q.shape[0], k.shape[0],
                             max_seq_len_q, max_seq_len_kv)
    if q.shape[0] == 0:
        return torch.empty_like(q)
    heads, dim = q.shape[1], q.shape[2]
    params = [None if t is None else t.reshape(heads, dim).contiguous() for t in (ln_weight, ln_bias, rms_weight)]
    args = (q.contiguous(), k.contiguous(), v.contiguous(), q_offsets, kv_offsets, max_seq_len_q,
            *params, eps, qk_scale, ACTIVATIONS.index(activation))
    return runtime.launch(_fna.SPEC, args)


def _gdpa_fake(q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, activation, qk_scale, validate):
    return torch.empty_like(q)


def _fna_fake(q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, ln_weight, ln_bias,
              rms_weight, eps, activation, qk_scale, validate):
    return torch.empty_like(q)


_GDPA = Op("gdpa", _gdpa_impl, _gdpa_fake)
_FNA = Op("flash_norm_attention", _fna_impl, _fna_fake)


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
    2026), an activation in place of the softmax (:mod:`helion_kernels.kernels.gdpa`). Not
    yet tuned: runs one fixed config (``GDPA_CONFIG``) on every GPU.

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
        [total_q, H, D] in the input dtype (fp32 accumulation; the activation's output is
        rounded to the input dtype before the second GEMM, as in flash attention, so fp16
        scores past 65504 overflow). Rows of a sequence with no KV rows are 0.

    Raises:
        TypeError, ValueError: bad ranks, dtypes, devices, offsets, lengths past the
            maxima, H < 1 or D < 16, unknown activation. NotImplementedError: an input
            requires grad.
    """
    op = "gdpa"
    checks.jagged(op, q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv, activation, qk_scale)
    runtime.check_runnable(op, q.device)
    checks.no_grad(op, q, k, v)
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
    :mod:`helion_kernels.kernels.flash_norm_attention`. One program owns a tile of Q rows of
    one sequence for all heads, walks the heads with 2-D dots and the sequence's K/V (at
    most 128 rows) in KV tiles, and rescales its own un-normalised writes for the RMSNorm. The
    config comes from the registry, keyed by (H, D, dtype) (``helion-kernels autotune
    --kernel flash_norm_attention``); untuned (H, D) take the nearest tuned one, and a GPU
    without entries the conservative default, with a ``ConfigFallbackWarning``.

    Args:
        q, k, v, q_offsets, kv_offsets, max_seq_len_q, activation, qk_scale, validate: as
            :func:`gdpa`.
        max_seq_len_kv: at most 128 (:data:`~helion_kernels.kernels.limits.MAX_SEQ_LEN_KV`).
        ln_weight, ln_bias: LayerNorm affine parameters, [H * D] or [H, D], or None.
        rms_weight: RMSNorm weight, [H * D] or [H, D], or None.
        eps: of both norms, >= 0.

    Returns:
        [total_q, H, D] in the input dtype (fp32 statistics and accumulation).

    Raises:
        ValueError: ``max_seq_len_kv`` (or a KV sequence) longer than 128, with the unfused
            alternative named; a head_dim D that is not a power of two; affine parameters of
            the wrong shape; and everything :func:`gdpa` raises.
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
    if dim & (dim - 1):
        # Helion 1.5 leaves the padded lanes of a non-power-of-two D in the per-head kernel's
        # LayerNorm variance (x - mean != 0 there): wrong results under Triton (bench/NOTES.md).
        raise ValueError(f"{op}: head_dim D = {dim} must be a power of two (16, 32, 64, 128, "
                         f"256, ...); use gdpa() with separate norms for other head sizes")
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
    checks.no_grad(op, q, k, v, ln_weight, ln_bias, rms_weight)
    return _FNA(q, k, v, q_offsets, kv_offsets, int(max_seq_len_q), int(max_seq_len_kv), ln_weight,
                ln_bias, rms_weight, eps, activation, float(qk_scale), bool(validate))
