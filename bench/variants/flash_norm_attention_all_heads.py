"""Measured, not shipped: the all-heads FlashNormAttention kernel.

It holds the [tile_q, H*D] tile in registers and runs batched 3-D dots over all heads, which
limits Q tiles to 16-32 rows at H*D = 1024; on the H200 it measured 1.5x slower than the
shipped per-head kernel at H = 8 (``bench/results/nvidia_h200_sm90/variants/
flash_norm_attention_configs_*.md``, made by ``flash_norm_attention_configs.py`` beside this).
Same contract and config layout as
:func:`helion_kernels.techniques.attention.kernels.flash_norm_attention_kernel`.
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch

from helion_kernels.techniques.attention.kernels import apply_activation
from helion_kernels.limits import MAX_SEQ_LEN_KV


# Dynamic totals, H and D specialised (see gdpa_kernel).
@helion.kernel(static_shapes=False)
def flash_norm_attention_all_heads_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_seq_len_q: int,
    ln_weight: torch.Tensor | None,
    ln_bias: torch.Tensor | None,
    rms_weight: torch.Tensor | None,
    eps: float,
    qk_scale: float,
    activation: int,
) -> torch.Tensor:
    """Same contract as :func:`flash_norm_attention_kernel`, all heads at once: the
    [tile_q, H, D] tile is held in registers and both GEMMs are batched 3-D dots over H.
    Measured slower than the per-head kernel; kept as the alternative the config sweep
    times. Config ``block_sizes`` = [tile_kv (16 to 128), tile_q (16 to 64)]."""
    num_heads = hl.specialize(q.size(1))
    head_dim = hl.specialize(q.size(2))
    act = hl.specialize(activation)
    width = num_heads * head_dim
    # At most 128 rows: a KV sequence takes 1 to 8 tiles (the wrapper refuses longer ones).
    block_kv = hl.register_block_size(16, MAX_SEQ_LEN_KV)
    block_q = hl.register_block_size(16, 64)
    batch = q_offsets.size(0) - 1
    out = torch.empty_like(q)
    # One program per (Q tile, sequence), Q tiles fastest: a sequence's programs run together
    # and share its K/V in L2. The inner tile loop runs once (a masked partial tile at the end
    # of a sequence) or not at all (past its end).
    for q_block, seq in hl.grid([(max_seq_len_q + block_q - 1) // block_q, batch]):
        q_end = q_offsets[seq + 1]
        begin = q_offsets[seq] + q_block * block_q
        kv_start = kv_offsets[seq]
        kv_end = kv_offsets[seq + 1]
        for tile_q in hl.tile(begin, torch.minimum(begin + block_q, q_end), block_size=block_q):
            x = q[tile_q, :, :].to(torch.float32)  # [tq, H, D]
            mean = torch.sum(torch.sum(x, dim=2), dim=1) / width
            centred = x - mean[:, None, None]
            var = torch.sum(torch.sum(centred * centred, dim=2), dim=1) / width
            ln = centred * torch.rsqrt(var + eps)[:, None, None]
            if ln_weight is not None:
                ln = ln * ln_weight[None, :, :].to(torch.float32)
            if ln_bias is not None:
                ln = ln + ln_bias[None, :, :].to(torch.float32)
            ln_heads = ln.to(q.dtype).permute(1, 0, 2)  # [H, tq, D]
            acc = torch.zeros_like(ln_heads, dtype=torch.float32)  # [H, tq, D] as loaded
            for tile_kv in hl.tile(kv_start, kv_end, block_size=block_kv):
                s = torch.bmm(ln_heads, k[tile_kv, :, :].permute(1, 2, 0)) * qk_scale  # [H, tq, tkv]
                p = apply_activation(s, act)
                acc = torch.baddbmm(acc, p.to(v.dtype), v[tile_kv, :, :].permute(1, 0, 2))
            o = acc.permute(1, 0, 2) + ln  # [tq, H, D], the first residual
            mean_sq = torch.sum(torch.sum(o * o, dim=2), dim=1) / width
            y = o * torch.rsqrt(mean_sq + eps)[:, None, None]
            if rms_weight is not None:
                y = y * rms_weight[None, :, :].to(torch.float32)
            out[tile_q, :, :] = (y + x).to(out.dtype)  # the second residual
    return out



# The all-heads kernel holds [tile_q, H*D] fp32 tiles in registers and [tile_kv, H*D] K and V
# tiles in shared memory, so both shrink as H*D grows. Its default needs 2 x 16 x H*D x 2
# bytes of K/V per stage: 64 KiB at H*D = 1024.
ALL_HEADS_DEFAULT_CONFIG = helion.Config(block_sizes=[16, 16], num_warps=4, num_stages=1)
ALL_HEADS_SEED_CONFIGS = tuple(
    helion.Config(block_sizes=[kv, tq], num_warps=w, num_stages=st)
    for kv, tq, w, st in ((16, 16, 4, 1), (32, 16, 4, 2), (32, 16, 8, 1), (64, 16, 8, 1),
                          (32, 32, 8, 1), (64, 32, 8, 2), (128, 16, 8, 1), (128, 32, 8, 2))
)
