"""Jagged GDPA backward: ``dq``, ``dk``, ``dv`` of ``out = act(q k^T * qk_scale) v`` per
sequence and head (:mod:`.gdpa`).

GDPA has an elementwise activation in place of the softmax, so its backward needs no row
statistics: with ``s = q k^T * scale`` and ``p = act(s)``::

    dv = p^T @ dout        dp = dout @ v^T        ds = dp * act'(s)
    dq = ds @ k * scale    dk = ds^T @ q * scale

Deterministic, no atomics, as FlashAttention-2's backward split in two kernels: one program
per (Q tile, head, sequence) accumulates ``dq`` over the sequence's KV tiles
(:func:`gdpa_dq_kernel`, the forward's loop structure); one program per (KV tile, head,
sequence) accumulates ``dk`` and ``dv`` over the sequence's Q tiles
(:func:`gdpa_dkdv_kernel`). Both recompute ``s`` from ``q`` and ``k`` rather than store it
(the forward saves nothing of the attention), so each costs the forward's two GEMMs plus one
(dq) or two (dk, dv). ``ds`` and ``p`` are rounded to the input dtype before their GEMMs, as
the forward rounds ``p``. Padded rows and columns of a tile load as zeros, where every
activation gives ``act(0) = 0`` and ``dp = 0``, so they add nothing.

Source: the PyTorch blog "Towards Free Normalization: Fusing Normalization into GEMM and
Attention Kernels" (Meta, July 2026), whose FlashNormAttention backward this is the attention
part of; the two-kernel split follows FlashAttention-2 (Dao, 2023).
"""

from __future__ import annotations

import math

import helion
import helion.language as hl
import torch

from .gdpa import _SQRT_2_OVER_PI, apply_activation

# Not tuned yet: fixed configs pinned on the kernels (block_sizes in loop order).
DQ_CONFIG = helion.Config(block_sizes=[64, 64], num_warps=4, num_stages=2)  # [tile_q, tile_kv]
DKDV_CONFIG = helion.Config(block_sizes=[64, 64], num_warps=4, num_stages=2)  # [tile_kv, tile_q]

_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def activation_grad(s: torch.Tensor, act: int) -> torch.Tensor:
    """``act'(s)`` for ``ACTIVATIONS[act]``, inside a Helion kernel (``act`` specialized)."""
    if act == 0:  # GELU, tanh approximation
        t = torch.tanh(_SQRT_2_OVER_PI * (s + 0.044715 * s * s * s))
        return 0.5 * (1.0 + t) + 0.5 * s * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * s * s)
    if act == 1:  # GELU: Phi(s) + s phi(s)
        return 0.5 * (1.0 + torch.erf(s * _INV_SQRT_2)) + s * torch.exp(-0.5 * s * s) * _INV_SQRT_2PI
    if act == 2:  # SiLU
        sig = torch.sigmoid(s)
        return sig * (1.0 + s * (1.0 - sig))
    return (s > 0).to(torch.float32)  # ReLU (0 at 0, as torch's)


@helion.kernel(static_shapes=False, configs=[DQ_CONFIG])
def gdpa_dq_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_seq_len_q: int,
    qk_scale: float,
    activation: int,
) -> torch.Tensor:
    """``dq`` [total_q, H, D] in ``q.dtype``: one program per (Q tile, head, sequence), a loop
    over the sequence's KV tiles. Config ``block_sizes`` = [tile_q, tile_kv]."""
    num_heads = hl.specialize(q.size(1))
    head_dim = hl.specialize(q.size(2))
    act = hl.specialize(activation)
    block_q = hl.register_block_size(16, 256)
    batch = q_offsets.size(0) - 1
    dq = torch.empty_like(q)
    for q_block, head, seq in hl.grid([(max_seq_len_q + block_q - 1) // block_q, num_heads, batch]):
        q_end = q_offsets[seq + 1]
        begin = q_offsets[seq] + q_block * block_q
        kv_start = kv_offsets[seq]
        kv_end = kv_offsets[seq + 1]
        for tile_q in hl.tile(begin, torch.minimum(begin + block_q, q_end), block_size=block_q):
            q_tile = q[tile_q, head, :]
            do_tile = dout[tile_q, head, :]
            acc = hl.zeros([tile_q, head_dim], dtype=torch.float32)
            for tile_kv in hl.tile(kv_start, kv_end):
                k_tile = k[tile_kv, head, :]
                s = torch.matmul(q_tile, k_tile.T) * qk_scale
                dp = torch.matmul(do_tile, v[tile_kv, head, :].T)
                ds = dp * activation_grad(s, act)
                acc = torch.addmm(acc, ds.to(k.dtype), k_tile)
            dq[tile_q, head, :] = (acc * qk_scale).to(dq.dtype)
    return dq


@helion.kernel(static_shapes=False, configs=[DKDV_CONFIG])
def gdpa_dkdv_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_seq_len_kv: int,
    qk_scale: float,
    activation: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(``dk``, ``dv``) [total_kv, H, D] in ``k.dtype``: one program per (KV tile, head,
    sequence), a loop over the sequence's Q tiles. Config ``block_sizes`` = [tile_kv, tile_q]."""
    num_heads = hl.specialize(q.size(1))
    head_dim = hl.specialize(q.size(2))
    act = hl.specialize(activation)
    block_kv = hl.register_block_size(16, 256)
    batch = kv_offsets.size(0) - 1
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    for kv_block, head, seq in hl.grid([(max_seq_len_kv + block_kv - 1) // block_kv, num_heads, batch]):
        kv_end = kv_offsets[seq + 1]
        begin = kv_offsets[seq] + kv_block * block_kv
        q_start = q_offsets[seq]
        q_end = q_offsets[seq + 1]
        for tile_kv in hl.tile(begin, torch.minimum(begin + block_kv, kv_end), block_size=block_kv):
            k_tile = k[tile_kv, head, :]
            v_tile = v[tile_kv, head, :]
            dk_acc = hl.zeros([tile_kv, head_dim], dtype=torch.float32)
            dv_acc = hl.zeros([tile_kv, head_dim], dtype=torch.float32)
            for tile_q in hl.tile(q_start, q_end):
                q_tile = q[tile_q, head, :]
                do_tile = dout[tile_q, head, :]
                s = torch.matmul(q_tile, k_tile.T) * qk_scale  # [tile_q, tile_kv]
                p = apply_activation(s, act)
                dv_acc = torch.addmm(dv_acc, p.to(v.dtype).T, do_tile)
                ds = torch.matmul(do_tile, v_tile.T) * activation_grad(s, act)
                dk_acc = torch.addmm(dk_acc, ds.to(q.dtype).T, q_tile)
            dk[tile_kv, head, :] = (dk_acc * qk_scale).to(dk.dtype)
            dv[tile_kv, head, :] = dv_acc.to(dv.dtype)
    return dk, dv


def gdpa_backward_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    qk_scale: float = 1.0,
    activation: str = "fast_gelu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) by autograd of the per-sequence reference, in fp32 (float64 stays float64)."""
    from .gdpa import gdpa_reference

    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    leaves = [t.detach().to(dt).requires_grad_() for t in (q, k, v)]
    out = gdpa_reference(*leaves, q_offsets, kv_offsets, qk_scale, activation)
    return torch.autograd.grad(out, leaves, dout.to(dt), allow_unused=True)


__all__ = ["DKDV_CONFIG", "DQ_CONFIG", "activation_grad", "gdpa_backward_reference",
           "gdpa_dkdv_kernel", "gdpa_dq_kernel"]
