"""Deferred post-norm: ``rms_norm(a @ b, w) @ c`` without ever normalising ``a @ b``.

For the Linear -> RMSNorm -> Linear pattern (a split-N candidate of technique 3 of the
PyTorch blog "Towards Free Normalization", Meta, July 2026). When the norm's only consumer is
the next GEMM, the deferred pre-norm identity (technique 2) moves the normalisation past it::

    rms_norm(x, w) @ c == rstd[:, None] * (x @ (w[:, None] * c)),   x = a @ b

1. producer (:func:`matmul_rmsnorm_partials_kernel`): ``x = a @ b`` un-normalised (its own N
   tiling) and per-row, per-N-tile sums of squares [M, T];
2. consumer (:func:`rmsnorm_scaled_matmul_kernel`): a GEMM on ``x`` and the folded
   ``w[:, None] * c`` whose epilogue sums a row's T partials and scales by ``rstd``.

Against cuBLAS -> standalone RMSNorm -> cuBLAS this drops the norm's pass (a read and a write
of [M, N]); no load feeds both an MMA and a reduction. The normalised activations never
exist, so this applies only when nothing else reads them. The producer's tiling is this op's
registry entry at (M, K, N), the consumer's the plain ``matmul`` entry at (M, N, N2)
(:func:`consumer_config`).
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch
import torch.nn.functional as F

from ...spec import KernelSpec, Shape, gemm_shape, random_gemm_operands, reference_dtype

__all__ = [
    "CONSUMER_DEFAULT_CONFIG",
    "SPEC",
    "consumer_config",
    "matmul_rmsnorm_matmul_reference",
    "matmul_rmsnorm_partials_kernel",
    "rmsnorm_scaled_matmul_kernel",
]


@helion.kernel(static_shapes=True)
def matmul_rmsnorm_partials_kernel(
    a: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The producer: (x = ``a @ b`` [M, N] in ``a.dtype``, partial sums of squares [M, T]
    fp32 of x's T = cdiv(N, tile_n) column tiles). Config ``block_sizes`` = [tile_n, tile_m,
    tile_k]."""
    m, k = a.size()
    n = hl.specialize(b.size(1))
    block_n = hl.register_block_size(helion.next_power_of_2(n))
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    partials = torch.empty([m, helion.cdiv(n, block_n)], dtype=torch.float32, device=a.device)
    for tile_m, tile_n in hl.tile([m, n], block_size=[None, block_n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
        c[tile_m, tile_n] = acc.to(c.dtype)
        partials[tile_m, tile_n.id] = torch.sum(acc * acc, dim=1)  # padded columns are 0
    return c, partials


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


def consumer_config(matmul_config: dict | None) -> helion.Config:
    """The consumer's config from a ``matmul`` registry config (its JSON dict): the tiling,
    warps and stages carry over (the consumer's epilogue has its own loads, so TMA and L2
    grouping settings of the plain GEMM are not reused); None: :data:`CONSUMER_DEFAULT_CONFIG`."""
    if matmul_config is None:
        return CONSUMER_DEFAULT_CONFIG
    return helion.Config(**{key: matmul_config[key] for key in ("block_sizes", "num_warps", "num_stages")
                            if key in matmul_config})


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


def producer_reference(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a @ b`` and its row sums of squares in fp32 (float64 stays float64): what the
    producer's outputs give once its partials are summed over the tiles."""
    x = a.to(reference_dtype(a.dtype)) @ b.to(reference_dtype(a.dtype))
    return x, x.pow(2).sum(dim=1)


def _sum_partials(outputs: tuple) -> tuple:
    """The producer's (x, partials [M, T]) as (x, row sums of squares [M])."""
    x, partials = outputs
    return x, partials.sum(dim=1)


def _make_args(shape: Shape, dtype: torch.dtype, device, seed: int | None) -> tuple:
    return random_gemm_operands(shape, dtype, device, seed)


EPS = 1e-5


# Phase-1 tilings of the split-N kernels ([tile_n, tile_m, tile_k]).
_SEEDS = tuple(
    helion.Config(block_sizes=[tn, tm, 64], num_warps=w, num_stages=st, indexing=ix, pid_type=pid)
    for tn, tm, w, st, ix, pid in ((256, 128, 8, 4, "pointer", "flat"), (128, 128, 4, 4, "pointer", "flat"),
                                   (128, 128, 8, 3, "tensor_descriptor", "flat"), (128, 64, 4, 4, "pointer", "flat"),
                                   (256, 128, 8, 3, "tensor_descriptor", "persistent_interleaved"))
)

# The producer GEMM, tuned and registered under the op's name at (M, K, N); tuning times the
# whole op (both GEMMs, at N2 = K) against the unfused pipeline for the dispatch record.
SPEC = KernelSpec(
    name="matmul_rmsnorm_matmul",
    kernel=matmul_rmsnorm_partials_kernel,
    workload="gemm",
    make_args=_make_args,
    key_of=gemm_shape,
    reference=producer_reference,
    default_config=helion.Config(block_sizes=[64, 64, 32], num_warps=4, num_stages=2),
    seed_configs=_SEEDS,
    compare_outputs=_sum_partials,
    dispatch_baseline="cublas+inductor_norm+cublas",
)
