"""Split-N post-norm, the row sweep: a row's N tiles in one program, L2 as the exchange.

What ``matmul_layernorm_split_n`` / ``matmul_rmsnorm_split_n`` run: split-N candidate 4
(technique 3 of the PyTorch blog "Towards Free Normalization: Fusing
Normalization into GEMM and Attention Kernels", Meta, July 2026). The authors split a row's
columns over the CTAs of a thread-block cluster and exchange partial statistics through
distributed shared memory, so no tile is re-read. Helion on Hopper has neither, and the
two earlier candidates (``bench/variants/split_n_candidates.py``: partials + apply kernel,
and one persistent launch with ``hl.barrier()``) pay a whole extra pass over the output (a
second kernel, or a grid barrier after which the tiles are long gone from L2); on the H200
the row sweep is the fastest of the three on 16 of 20 workload rows.

Here one program owns a block of ``tile_m`` rows and walks their N tiles in sequence, with
the GEMM's own tiling (tile_n < N):

1. for each N tile: the k-loop, then the epilogue stores the tile un-normalised and folds
   its statistics into running per-row registers (RMSNorm: the sum of squares; LayerNorm:
   count, mean and sum of squared deviations, merged tile by tile with Chan et al.'s
   pairwise formula, the tile stored centred on its own mean and that mean kept in a
   [M, T] fp32 scratch);
2. the row statistics are final, and the program re-reads its own tiles, which it wrote a
   few microseconds earlier (tile_m x N elements, in L2), normalises and stores them.

Helion orders the two loops with a CTA barrier (``tl.debug_barrier()``) because the second
loads what the first stored. Against cuBLAS + a standalone norm this removes the norm's
DRAM read and, where the dirty lines are still in L2 when they are rewritten, its DRAM
write; what it adds is L2 traffic and the same A block being re-read from L2 for every N
tile. No cross-program synchronisation, so any grid order is valid.

Config ``block_sizes`` = [tile_n, tile_m, tile_k] (tile_n is used by both loops).
"""

from __future__ import annotations

import dataclasses

import helion
import helion.language as hl
import torch

from .. import liger_norm
from . import postnorm_full_row as _full_row
from ..spec import KernelSpec
from .postnorm_full_row import matmul_layernorm_reference, matmul_rmsnorm_reference

__all__ = [
    "SPEC_LAYERNORM",
    "SPEC_RMSNORM",
    "matmul_layernorm_reference",
    "matmul_layernorm_row_sweep_kernel",
    "matmul_rmsnorm_reference",
    "matmul_rmsnorm_row_sweep_kernel",
]


# The GEMM loop and the LayerNorm tile statistics repeat those of .postnorm_full_row: Helion
# 1.5 inlines helper functions, but not ones that index or slice (``x[:, None]``,
# ``weight[tile]``), so the shared pieces cannot be factored out yet.
@helion.kernel(static_shapes=True)
def matmul_layernorm_row_sweep_kernel(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``layer_norm(a @ b, (N,), weight, bias, eps)`` -> (y [M, N] in ``a.dtype``, mean [M],
    rstd [M] fp32), a program per ``tile_m`` rows sweeping their N tiles twice.

    Config ``block_sizes`` = [tile_n, tile_m, tile_k].
    """
    m, k = a.size()
    n = hl.specialize(b.size(1))
    block_n = hl.register_block_size(n)
    y = torch.empty([m, n], dtype=a.dtype, device=a.device)
    tile_means = torch.empty([m, helion.cdiv(n, block_n)], dtype=torch.float32, device=a.device)
    mean = torch.empty([m], dtype=torch.float32, device=a.device)
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m in hl.tile(m):
        count = hl.zeros([tile_m], dtype=torch.float32)
        row_mean = hl.zeros([tile_m], dtype=torch.float32)
        m2 = hl.zeros([tile_m], dtype=torch.float32)
        for tile_n in hl.tile(n, block_size=block_n):
            acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(k):
                acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
            in_row = (tile_n.index < n)[None, :]
            tile_count = torch.sum(in_row.to(torch.float32), dim=1)  # [1]: the tile's real columns
            tile_mean = torch.sum(acc, dim=1) / tile_count  # padded columns of acc are 0
            centred = torch.where(in_row, acc - tile_mean[:, None], 0.0)
            y[tile_m, tile_n] = centred.to(y.dtype)
            tile_means[tile_m, tile_n.id] = tile_mean
            # Chan et al.: merge (count, row_mean, m2) with the tile's (tile_count, tile_mean, M2).
            # delta * (delta * w), not delta * delta * w: on the first tile w = 0 and delta is
            # the tile mean, whose square overflows fp32 past 1.8e19 (inf * 0 = NaN).
            total = count + tile_count
            delta = tile_mean - row_mean
            row_mean = row_mean + delta * (tile_count / total)
            m2 = m2 + torch.sum(centred * centred, dim=1) + delta * (delta * (count * tile_count / total))
            count = total
        row_rstd = torch.rsqrt(m2 / n + eps)
        for tile_n in hl.tile(n, block_size=block_n):
            shift = tile_means[tile_m, tile_n.id] - row_mean
            out = (y[tile_m, tile_n].to(torch.float32) + shift[:, None]) * row_rstd[:, None]
            if weight is not None:
                out = out * weight[tile_n].to(torch.float32)[None, :]
            if bias is not None:
                out = out + bias[tile_n].to(torch.float32)[None, :]
            y[tile_m, tile_n] = out.to(y.dtype)
        mean[tile_m] = row_mean
        rstd[tile_m] = row_rstd
    return y, mean, rstd


@helion.kernel(static_shapes=True)
def matmul_rmsnorm_row_sweep_kernel(
    a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rms_norm(a @ b, (N,), weight, eps)`` -> (y [M, N] in ``a.dtype``, rstd [M] fp32),
    a program per ``tile_m`` rows sweeping their N tiles twice.

    Config ``block_sizes`` = [tile_n, tile_m, tile_k].
    """
    m, k = a.size()
    n = hl.specialize(b.size(1))
    block_n = hl.register_block_size(n)
    y = torch.empty([m, n], dtype=a.dtype, device=a.device)
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m in hl.tile(m):
        sum_sq = hl.zeros([tile_m], dtype=torch.float32)
        for tile_n in hl.tile(n, block_size=block_n):
            acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(k):
                acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
            y[tile_m, tile_n] = acc.to(y.dtype)
            sum_sq = sum_sq + torch.sum(acc * acc, dim=1)  # padded columns of acc are 0
        row_rstd = torch.rsqrt(sum_sq / n + eps)
        for tile_n in hl.tile(n, block_size=block_n):
            out = y[tile_m, tile_n].to(torch.float32) * row_rstd[:, None]
            if weight is not None:
                out = out * weight[tile_n].to(torch.float32)[None, :]
            y[tile_m, tile_n] = out.to(y.dtype)
        rstd[tile_m] = row_rstd
    return y, rstd


# Hopper tilings [tile_n, tile_m, tile_k]: the plain GEMM's shapes, and smaller row blocks
# (the re-read tiles and the A block of a program must stay in L2 next to those of the
# ~132-264 resident programs).
_SEEDS = tuple(
    helion.Config(block_sizes=[tn, tm, 64], num_warps=w, num_stages=st, indexing=ix, pid_type=pid)
    for tm, tn, w, st, ix, pid in ((128, 256, 8, 3, "pointer", "flat"), (128, 128, 8, 4, "pointer", "flat"),
                                   (64, 256, 4, 4, "pointer", "flat"), (128, 128, 4, 4, "tensor_descriptor", "flat"),
                                   (64, 128, 4, 4, "pointer", "flat"),
                                   (128, 256, 8, 3, "tensor_descriptor", "persistent_interleaved"))
)
_TECHNIQUE = ("split-N post-norm, one program sweeping a row block's N tiles with L2 as the "
              "exchange (technique 3, PyTorch blog 'Towards Free Normalization', 2026)")
_DEFAULT = helion.Config(block_sizes=[64, 64, 32], num_warps=4, num_stages=2)


def _spec(base: KernelSpec, name: str, kernel: helion.Kernel) -> KernelSpec:
    """The full-row spec ``base`` (same arguments, reference and baselines) for ``kernel``."""
    return dataclasses.replace(base, name=name, kernel=kernel, default_config=_DEFAULT,
                               seed_configs=_SEEDS, technique=_TECHNIQUE, portable_config=None,
                               fit_config=None, call_config=None, n_limit=None,
                               dynamic_m=False,  # its dynamic build is not measured
                               # the op's unfused path can run Liger's norm
                               dispatch_alternatives=(liger_norm.PIPELINE,))


SPEC_LAYERNORM = _spec(_full_row.SPEC_LAYERNORM, "matmul_layernorm_split_n",
                       matmul_layernorm_row_sweep_kernel)
SPEC_RMSNORM = _spec(_full_row.SPEC_RMSNORM, "matmul_rmsnorm_split_n", matmul_rmsnorm_row_sweep_kernel)
