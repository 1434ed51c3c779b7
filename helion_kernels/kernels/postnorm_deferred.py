"""Deferred post-norm: ``rms_norm(a @ b, w) @ c`` without ever normalising ``a @ b``.

Candidate 3 of the split-N post-norm (technique 3 of the PyTorch blog "Towards Free
Normalization: Fusing Normalization into GEMM and Attention Kernels", Meta, July 2026), for
the Linear -> RMSNorm -> Linear pattern. When the norm's only consumer is the next GEMM, the
deferred pre-norm identity (technique 2, :mod:`.rmsnorm_matmul`) moves the normalisation
past it::

    rms_norm(x, w) @ c == rstd[:, None] * (x @ (w[:, None] * c)),   x = a @ b

and ``rstd`` comes from the split-N partials the producer GEMM already writes:

1. producer: :func:`.postnorm_split_n.matmul_rmsnorm_partials_kernel` writes
   ``x = a @ b`` un-normalised (any N, its own N tiling) and per-row, per-N-tile sums of
   squares [M, T];
2. consumer: :func:`rmsnorm_scaled_matmul_kernel`, a plain GEMM on ``x`` and the folded
   ``w[:, None] * c`` whose epilogue sums a row's T partials and scales the accumulator by
   ``rstd``.

Against cuBLAS GEMM -> standalone RMSNorm -> cuBLAS GEMM this drops the norm's whole pass
(a read and a write of [M, N]); what is added is the partials (T floats per row) and the
fold of ``w`` into ``c`` (once per weight update). No load feeds both an MMA and a
reduction (the Hopper hazard of :mod:`.rmsnorm_matmul`): the consumer's only extra load is
the [tile_m, T] partials block in its epilogue. The normalised activations never exist, so
this applies only when nothing else (a residual, a second consumer) reads them.
LayerNorm's version needs the tile centred per N tile (as the split-N LayerNorm stores it)
and a rank-T correction in the consumer's epilogue; not written yet.
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch
import torch.nn.functional as F

from .spec import reference_dtype

__all__ = ["CONSUMER_DEFAULT_CONFIG", "matmul_rmsnorm_matmul_reference", "rmsnorm_scaled_matmul_kernel"]


@helion.kernel(static_shapes=True)
def rmsnorm_scaled_matmul_kernel(
    x: torch.Tensor, c: torch.Tensor, partials: torch.Tensor, eps: float
) -> torch.Tensor:
    """``rms_norm(x) @ c`` as ``rstd[:, None] * (x @ c)``, ``rstd`` from split-N partials.

    Args:
        x: [M, N] un-normalised activations (the producer GEMM's output).
        c: [N, N2] consumer weight, the RMSNorm weight already folded in.
        partials: [M, T] fp32, row sums of squares of x's T column tiles (their sum over T
            is the row's sum of squares over N).
        eps: added to the mean square.

    Returns [M, N2] in ``x.dtype``. Config ``block_sizes`` = [tile_m, tile_n, tile_k], the
    layout of :func:`.matmul.matmul_kernel`.
    """
    m, n = x.size()
    n2 = c.size(1)
    out = torch.empty([m, n2], dtype=x.dtype, device=x.device)
    for tile_m, tile_n in hl.tile([m, n2]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(n):
            acc = torch.addmm(acc, x[tile_m, tile_k], c[tile_k, tile_n])
        rstd = torch.rsqrt(torch.sum(partials[tile_m, :], dim=1) / n + eps)
        out[tile_m, tile_n] = (acc * rstd[:, None]).to(out.dtype)
    return out


# A GEMM tiling without TMA, so it fits any shape; the registry's `matmul` entries are used
# when the consumer's shape has one (only their tiling, warps and stages carry over).
CONSUMER_DEFAULT_CONFIG = helion.Config(block_sizes=[128, 128, 64], num_warps=8, num_stages=3)


def matmul_rmsnorm_matmul_reference(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``rms_norm(a @ b, (N,), weight, eps) @ c`` in fp32 (float64 stays float64)."""
    dt = reference_dtype(a.dtype)
    x = a.to(dt) @ b.to(dt)
    y = F.rms_norm(x, (x.shape[1],), None if weight is None else weight.to(dt), eps)
    return y @ c.to(dt)
