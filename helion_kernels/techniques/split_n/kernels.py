"""Split-N post-norm, the row sweep: a row's N tiles in one program, L2 as the exchange.

Technique 3 of the PyTorch blog "Towards Free Normalization: Fusing Normalization into GEMM
and Attention Kernels" (Meta, July 2026) splits a row's columns over the CTAs of a cluster
and exchanges partial statistics through distributed shared memory; Helion on Hopper has
neither. Here one program owns a block of ``tile_m`` rows and keeps the GEMM's own N tiling
(tile_n < N):

1. for each N tile: the k-loop, then the epilogue stores the tile un-normalised and folds
   its statistics into running per-row registers (RMSNorm: the sum of squares; LayerNorm:
   count, mean and sum of squared deviations merged tile by tile with Chan et al.'s formula,
   the tile stored centred on its own mean, that mean kept in an [M, T] fp32 scratch);
2. the row statistics are final, and the program re-reads its own tiles (just written, in
   L2), normalises and stores them. Helion orders the two loops with a CTA barrier.

Against cuBLAS + a standalone norm this removes the norm's DRAM read and, where the lines are
still in L2, its write; it adds L2 traffic and re-reads of the A block per N tile.
One kernel for both norms (``layernorm`` 1 or 0, specialised). Config ``block_sizes`` =
[tile_n, tile_m, tile_k].
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch

from ...spec import KernelSpec, gemm_shape
from ..postnorm.kernels import LAYERNORM, RMSNORM, matmul_norm_reference, norm_args


@helion.kernel(static_shapes=True)
def matmul_norm_row_sweep_kernel(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    layernorm: int,
) -> tuple[torch.Tensor, ...]:
    """``norm(a @ b, (N,), weight, bias, eps)``: (y [M, N] in ``a.dtype``, mean [M], rstd [M]
    fp32) for ``layernorm=1``, (y, rstd) for ``layernorm=0`` (``bias`` None); a program per
    ``tile_m`` rows sweeping their N tiles twice."""
    m, k = a.size()
    n = hl.specialize(b.size(1))
    ln = hl.specialize(layernorm)
    block_n = hl.register_block_size(n)
    y = torch.empty([m, n], dtype=a.dtype, device=a.device)
    if ln:
        tile_means = torch.empty([m, helion.cdiv(n, block_n)], dtype=torch.float32, device=a.device)
        mean = torch.empty([m], dtype=torch.float32, device=a.device)
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m in hl.tile(m):
        if ln:
            count = hl.zeros([tile_m], dtype=torch.float32)
            row_mean = hl.zeros([tile_m], dtype=torch.float32)
            m2 = hl.zeros([tile_m], dtype=torch.float32)
        else:
            sum_sq = hl.zeros([tile_m], dtype=torch.float32)
        for tile_n in hl.tile(n, block_size=block_n):
            acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(k):
                acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
            if ln:
                in_row = (tile_n.index < n)[None, :]
                tile_count = torch.sum(in_row.to(torch.float32), dim=1)  # [1]: the tile's real columns
                tile_mean = torch.sum(acc, dim=1) / tile_count  # padded columns of acc are 0
                centred = torch.where(in_row, acc - tile_mean[:, None], 0.0)
                y[tile_m, tile_n] = centred.to(y.dtype)
                tile_means[tile_m, tile_n.id] = tile_mean
                # Chan et al.: merge (count, row_mean, m2) with the tile's. delta * (delta * w),
                # not delta * delta * w: on the first tile w = 0 and delta**2 can overflow (inf * 0).
                total = count + tile_count
                delta = tile_mean - row_mean
                row_mean = row_mean + delta * (tile_count / total)
                m2 = m2 + torch.sum(centred * centred, dim=1) + delta * (delta * (count * tile_count / total))
                count = total
            else:
                y[tile_m, tile_n] = acc.to(y.dtype)
                sum_sq = sum_sq + torch.sum(acc * acc, dim=1)  # padded columns of acc are 0
        row_rstd = torch.rsqrt((m2 if ln else sum_sq) / n + eps)
        for tile_n in hl.tile(n, block_size=block_n):
            if ln:
                shift = tile_means[tile_m, tile_n.id] - row_mean
                out = (y[tile_m, tile_n].to(torch.float32) + shift[:, None]) * row_rstd[:, None]
            else:
                out = y[tile_m, tile_n].to(torch.float32) * row_rstd[:, None]
            if weight is not None:
                out = out * weight[tile_n].to(torch.float32)[None, :]
            if bias is not None:
                out = out + bias[tile_n].to(torch.float32)[None, :]
            y[tile_m, tile_n] = out.to(y.dtype)
        if ln:
            mean[tile_m] = row_mean
        rstd[tile_m] = row_rstd
    if ln:
        return y, mean, rstd
    return y, rstd


# Hopper tilings [tile_n, tile_m, tile_k]: the plain GEMM's, and smaller row blocks (a
# program's re-read tiles and A block must stay in L2 beside those of the resident programs).
_SEEDS = tuple(
    helion.Config(block_sizes=[tn, tm, 64], num_warps=w, num_stages=st, indexing=ix, pid_type=pid)
    for tm, tn, w, st, ix, pid in ((128, 256, 8, 3, "pointer", "flat"), (128, 128, 8, 4, "pointer", "flat"),
                                   (64, 256, 4, 4, "pointer", "flat"), (128, 128, 4, 4, "tensor_descriptor", "flat"),
                                   (64, 128, 4, 4, "pointer", "flat"),
                                   (128, 256, 8, 3, "tensor_descriptor", "persistent_interleaved"))
)
_DEFAULT = helion.Config(block_sizes=[64, 64, 32], num_warps=4, num_stages=2)


def _spec(name: str, layernorm: int) -> KernelSpec:
    return KernelSpec(
        name=name,
        kernel=matmul_norm_row_sweep_kernel,
        workload="gemm",
        make_args=norm_args(layernorm),
        key_of=gemm_shape,
        reference=matmul_norm_reference,
        default_config=_DEFAULT,
        seed_configs=_SEEDS,
        dispatch_baseline="cublas+inductor_norm",
    )


SPEC_LAYERNORM = _spec("matmul_layernorm_split_n", LAYERNORM)
SPEC_RMSNORM = _spec("matmul_rmsnorm_split_n", RMSNORM)
