"""Jagged GDPA: ``act(q_i @ k_i^T * qk_scale) @ v_i`` per sequence i and head.

GDPA ("generalized dot-product attention") is the attention of the ads models in the PyTorch
blog "Towards Free Normalization: Fusing Normalization into GEMM and Attention Kernels"
(Meta, July 2026): an elementwise activation takes the place of the softmax, so there is no
running max or denominator, only two GEMMs per (Q tile, KV tile). Sequences are jagged:
``q_offsets`` / ``kv_offsets`` [B + 1] delimit each sequence's rows in ``q`` [total_q, H, D]
and ``k``, ``v`` [total_kv, H, D]. This is the unfused building block of technique 4
(:mod:`.flash_norm_attention` adds the norms and residuals around it) and the attention of
its "gdpa + eager norms" baseline.

One program per (Q tile, head, sequence), up to ``max_seq_len_q`` rows per sequence (the
caller's bound, as in other jagged attention kernels); a loop over the sequence's KV tiles
accumulates ``act(s) @ v`` in fp32. Padded rows and columns of a tile
are masked out of the product, so any activation is safe there.
"""

from __future__ import annotations

import math

import helion
import helion.language as hl
import torch
import torch.nn.functional as F

from .limits import ACTIVATIONS

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

# gdpa is not tuned yet: one fixed config, pinned on the kernel ([tile_q, tile_kv]).
GDPA_CONFIG = helion.Config(block_sizes=[64, 64], num_warps=4, num_stages=2)


def apply_activation(s: torch.Tensor, act: int) -> torch.Tensor:
    """``ACTIVATIONS[act]`` of a score tile, inside a Helion kernel (``act`` specialized)."""
    if act == 0:  # GELU, tanh approximation
        return 0.5 * s * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (s + 0.044715 * s * s * s)))
    if act == 1:
        return F.gelu(s)
    if act == 2:
        return s * torch.sigmoid(s)
    return torch.relu(s)


# Not static_shapes: total_q / total_kv change with every batch of jagged sequences, and a
# kernel compiled per total would recompile on every call. H and D are specialised.
@helion.kernel(static_shapes=False, configs=[GDPA_CONFIG])
def gdpa_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_seq_len_q: int,
    qk_scale: float,
    activation: int,
) -> torch.Tensor:
    """``out`` [total_q, H, D] in ``q.dtype``; ``activation`` indexes :data:`ACTIVATIONS`.

    Config ``block_sizes`` = [tile_q, tile_kv]. Rows past ``max_seq_len_q`` in a sequence
    are not computed: the caller guarantees the bound.
    """
    num_heads = hl.specialize(q.size(1))
    head_dim = hl.specialize(q.size(2))
    act = hl.specialize(activation)
    block_q = hl.register_block_size(16, 256)
    batch = q_offsets.size(0) - 1
    out = torch.empty_like(q)
    # One program per (Q tile, head, sequence), Q tiles fastest so that the programs of one
    # (sequence, head) run together and share its K/V in L2. The inner tile loop runs once
    # (a masked partial tile at the end of a sequence) or not at all (past its end).
    for q_block, head, seq in hl.grid([(max_seq_len_q + block_q - 1) // block_q, num_heads, batch]):
        q_end = q_offsets[seq + 1]
        begin = q_offsets[seq] + q_block * block_q
        kv_start = kv_offsets[seq]
        kv_end = kv_offsets[seq + 1]
        for tile_q in hl.tile(begin, torch.minimum(begin + block_q, q_end), block_size=block_q):
            q_tile = q[tile_q, head, :]
            acc = hl.zeros([tile_q, head_dim], dtype=torch.float32)
            for tile_kv in hl.tile(kv_start, kv_end):
                p = apply_activation(torch.matmul(q_tile, k[tile_kv, head, :].T) * qk_scale, act)
                acc = torch.addmm(acc, p.to(v.dtype), v[tile_kv, head, :])
            out[tile_q, head, :] = acc.to(out.dtype)
    return out


def activation_fn(name: str):
    """The PyTorch function of an activation name in :data:`ACTIVATIONS`."""
    return {
        "fast_gelu": lambda s: F.gelu(s, approximate="tanh"),
        "gelu": F.gelu,
        "silu": F.silu,
        "relu": F.relu,
    }[name]


def gdpa_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    qk_scale: float = 1.0,
    activation: str = "fast_gelu",
) -> torch.Tensor:
    """Sequence by sequence in fp32 (float64 stays float64): ``act(q_i k_i^T * scale) v_i``."""
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    act = activation_fn(activation)
    out = torch.zeros(q.shape, dtype=dt, device=q.device)
    qo, ko = q_offsets.tolist(), kv_offsets.tolist()
    for i in range(len(qo) - 1):
        qi = q[qo[i]:qo[i + 1]].to(dt)
        ki, vi = k[ko[i]:ko[i + 1]].to(dt), v[ko[i]:ko[i + 1]].to(dt)
        scores = torch.einsum("qhd,khd->hqk", qi, ki) * qk_scale
        out[qo[i]:qo[i + 1]] = torch.einsum("hqk,khd->qhd", act(scores), vi)
    return out


def random_jagged_inputs(
    q_lengths: list[int],
    kv_lengths: list[int],
    num_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, k, v, q_offsets, kv_offsets) for the given per-sequence lengths; q, v ~ N(0, 1),
    k ~ N(0, 1/D) so that q k^T has unit variance."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def offsets(lengths):
        return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64,
                            device=device)

    qo, ko = offsets(q_lengths), offsets(kv_lengths)
    total_q, total_kv = int(sum(q_lengths)), int(sum(kv_lengths))
    q = torch.randn(total_q, num_heads, head_dim, generator=gen, device=device)
    k = torch.randn(total_kv, num_heads, head_dim, generator=gen, device=device) * head_dim**-0.5
    v = torch.randn(total_kv, num_heads, head_dim, generator=gen, device=device)
    return q.to(dtype), k.to(dtype), v.to(dtype), qo, ko
