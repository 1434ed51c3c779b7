"""Deferred ("lazy") pre-norm: ``c = rmsnorm(a) @ b`` in one GEMM launch, and its backward.

Technique 2 of the PyTorch blog "Towards Free Normalization: Fusing Normalization into
GEMM and Attention Kernels" (Meta, July 2026). The RMSNorm scale is one number per row, so

    (a * rstd[:, None]) @ b == (a @ b) * rstd[:, None],   rstd = 1 / sqrt(mean(a**2) + eps)

and the normalised ``a`` never exists: the GEMM runs on the raw ``a`` and its epilogue
scales the fp32 accumulator by ``rstd``.

Where the sum of squares is computed. The blog accumulates ``sum(a_tile**2)`` inside the
GEMM's k-loop; with Triton 3.6 on Hopper a k-loop load feeding both a wgmma and another user
gets too few pipeline buffers (triton-lang/triton#7110) and races. So one program owns a
block of ``tile_m`` rows: a k-loop of its own reduces the rows' sum of squares, then the
program walks the rows' N tiles with a plain GEMM k-loop (``a`` now from L2) and scales each
accumulator by ``rstd``. One launch, one HBM read of ``a``, no load shared by MMA and
reduction.

An elementwise affine weight ``w`` [K] scales columns of ``rmsnorm(a)``, which is the same
as scaling rows of ``b``: ``rmsnorm(a, w) @ b == rmsnorm(a) @ (w[:, None] * b)``. It is
folded into ``b`` once (:func:`helion_kernels.fold_rmsnorm_weight`), never applied in the k-loop.
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch

from ...autograd import rms_rstd
from ...spec import KernelSpec, Shape, gemm_shape, random_gemm_operands, reference_dtype
from ..gemm.kernels import (
    GEMM_DEFAULT_CONFIG,
    GEMM_SEED_CONFIGS,
    SEED_POINTER_64x128,
    SEED_POINTER_128x128,
    SEED_POINTER_128x256,
    SEED_TMA_FLAT_128x256,
    SEED_TMA_PERSISTENT_128x128,
    SEED_TMA_PERSISTENT_128x256,
    SEED_TMA_PERSISTENT_128x256_FLATTENED,
)

EPS = 1e-5
# k-tile of the sum-of-squares loop in the seed and default configs (tunable).
STATS_TILE_K = 128


@helion.kernel(static_shapes=True)
def rmsnorm_matmul_kernel(
    a: torch.Tensor, b: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rmsnorm(a) @ b`` -> (c [M, N] in ``a.dtype``, rstd [M] fp32); no affine weight.

    Config ``block_sizes`` = [tile_m, tile_k of the sum-of-squares loop, tile_n, tile_k of
    the GEMM loop].
    """
    m, k = a.size()
    _, n = b.size()
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m in hl.tile(m):
        sum_sq = hl.zeros([tile_m], dtype=torch.float32)
        for tile_k in hl.tile(k):
            a32 = a[tile_m, tile_k].to(torch.float32)
            sum_sq = sum_sq + torch.sum(a32 * a32, dim=1)
        row_rstd = torch.rsqrt(sum_sq / k + eps)
        rstd[tile_m] = row_rstd
        for tile_n in hl.tile(n):
            acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(k):
                acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
            c[tile_m, tile_n] = (acc * row_rstd[:, None]).to(c.dtype)
    return c, rstd


# Two programs per SM (96 KB of shared memory each), so one program's sum-of-squares loop runs
# beside the other's GEMM k-loops: the fastest row block at small K and N.
SEED_ROW_BLOCK_POINTER_128x128_TWO_PER_SM = helion.Config(
    block_sizes=[128, 128, 64], num_warps=8, num_stages=3, indexing="pointer")


def row_block_config(gemm: helion.Config, stats_tile_k: int = STATS_TILE_K) -> helion.Config:
    """This kernel's config for a GEMM tiling ``[tile_m, tile_n, tile_k]`` (its grid is 1-D,
    so the GEMM's L2 grouping does not apply)."""
    tm, tn, tk = gemm.block_sizes
    rest = {key: val for key, val in gemm.config.items()
            if key not in ("block_sizes", "l2_groupings")}
    return helion.Config(block_sizes=[tm, stats_tile_k, tn, tk], **rest)


@helion.kernel(static_shapes=True)
def rmsnorm_matmul_given_rstd_kernel(a: torch.Tensor, b: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """``(a @ b) * rstd[:, None]`` -> c [M, N] in ``a.dtype``: the deferred pre-norm when the
    producer of ``a`` (a residual add, a GEMM epilogue) already wrote its rows' ``rstd`` [M]
    fp32, so the GEMM only scales its fp32 accumulator in the epilogue. Config
    ``block_sizes`` = [tile_m, tile_n, tile_k], as the plain GEMM's."""
    m, k = a.size()
    _, n = b.size()
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
        c[tile_m, tile_n] = (acc * rstd[tile_m][:, None]).to(c.dtype)
    return c


def rmsnorm_matmul_given_rstd_reference(a: torch.Tensor, b: torch.Tensor, rstd: torch.Tensor) -> tuple[torch.Tensor]:
    """``(a * rstd[:, None]) @ b`` in fp32 (float64 stays float64)."""
    dt = reference_dtype(a.dtype)
    return ((a.to(dt) * rstd.to(dt)[:, None]) @ b.to(dt),)


def rmsnorm_matmul_reference(
    a: torch.Tensor,
    b: torch.Tensor,
    eps: float = EPS,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unfused ``rmsnorm(a, weight, eps) @ b`` and ``rstd`` in fp32 (float64 stays float64)."""
    dt = reference_dtype(a.dtype)
    a32 = a.to(dt)
    rstd = torch.rsqrt(a32.pow(2).mean(dim=1) + eps)
    normed = a32 * rstd[:, None]
    if weight is not None:
        normed = normed * weight.to(dt)
    return normed @ b.to(dt), rstd


def _make_args(shape: Shape, dtype: torch.dtype, device, seed: int | None) -> tuple:
    a, b = random_gemm_operands(shape, dtype, device, seed)
    return a, b, EPS


def _make_args_given_rstd(shape: Shape, dtype: torch.dtype, device, seed: int | None) -> tuple:
    a, b = random_gemm_operands(shape, dtype, device, seed)
    rstd = torch.empty(shape.M, dtype=torch.float32, device=device) if seed is None else rms_rstd(a, EPS)
    return a, b, rstd


SPEC = KernelSpec(
    name="rmsnorm_matmul",
    kernel=rmsnorm_matmul_kernel,
    workload="gemm",
    make_args=_make_args,
    key_of=gemm_shape,
    reference=rmsnorm_matmul_reference,
    default_config=row_block_config(GEMM_DEFAULT_CONFIG, 64),
    seed_configs=tuple(row_block_config(g) for g in (
        SEED_TMA_PERSISTENT_128x256, SEED_POINTER_128x256, SEED_TMA_FLAT_128x256,
        SEED_TMA_PERSISTENT_128x128, SEED_POINTER_128x128, SEED_POINTER_64x128,
        SEED_TMA_PERSISTENT_128x256_FLATTENED, SEED_ROW_BLOCK_POINTER_128x128_TWO_PER_SM)),
    dispatch_baseline="cublas+inductor_norm",
    dynamic_m=True,
)

# The same technique for a producer that already wrote rstd (``rmsnorm_matmul(..., rstd=)``).
SPEC_GIVEN_RSTD = KernelSpec(
    name="rmsnorm_matmul_given_rstd",
    kernel=rmsnorm_matmul_given_rstd_kernel,
    workload="gemm",
    make_args=_make_args_given_rstd,
    key_of=gemm_shape,
    reference=rmsnorm_matmul_given_rstd_reference,
    default_config=GEMM_DEFAULT_CONFIG,
    seed_configs=GEMM_SEED_CONFIGS,  # the plain GEMM's: the same loops
    same_loops_as=("matmul",),
    dispatch_baseline="cublas+inductor_scale",
    dynamic_m=True,
)


# --- backward: the dgrad GEMM with the RMSNorm backward in its epilogue -------------------
#
# With x_hat = a * rstd and b the GEMM's right operand (the norm weight folded in):
# dx_hat = dc @ b^T (the dgrad GEMM), da = rstd * (dx_hat - x_hat * s / K) with the row sum
# s = sum_k dx_hat * x_hat, db = x_hat^T @ dc (the wgrad, cuBLAS). One program owns a block of
# tile_m rows: it walks the K tiles, each a GEMM over N, accumulates s from the accumulator in
# each epilogue and writes dx_hat (into da's storage) and x_hat; a second loop over the same
# rows' K tiles (L2 hits) applies rstd * (dx_hat - x_hat * s / K) in place. Config
# block_sizes = [tile_m, tile_k of the dgrad GEMM, tile_n of its N loop, tile_k of the fix-up].

@helion.kernel(static_shapes=True)
def rmsnorm_matmul_dgrad_kernel(
    a: torch.Tensor, b: torch.Tensor, dc: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(da [M, K], x_hat [M, K]), both in ``a.dtype``, of ``c = (a * rstd[:, None]) @ b``
    for the output gradient ``dc`` [M, N]; fp32 accumulation and row sums."""
    m, k = a.size()
    n = b.size(1)
    da = torch.empty_like(a)
    x_hat = torch.empty_like(a)
    for tile_m in hl.tile(m):
        row_rstd = rstd[tile_m]
        s = hl.zeros([tile_m], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = hl.zeros([tile_m, tile_k], dtype=torch.float32)
            for tile_n in hl.tile(n):
                acc = torch.addmm(acc, dc[tile_m, tile_n], b[tile_k, tile_n].T)
            xh = a[tile_m, tile_k].to(torch.float32) * row_rstd[:, None]
            s = s + torch.sum(acc * xh, dim=1)
            da[tile_m, tile_k] = acc.to(da.dtype)  # dx_hat for now; fixed up below
            x_hat[tile_m, tile_k] = xh.to(x_hat.dtype)
        mean_dot = s / k
        for tile_k in hl.tile(k):
            dxh = da[tile_m, tile_k].to(torch.float32)
            xh = a[tile_m, tile_k].to(torch.float32) * row_rstd[:, None]
            da[tile_m, tile_k] = (row_rstd[:, None] * (dxh - xh * mean_dot[:, None])).to(da.dtype)
    return da, x_hat


def rmsnorm_matmul_dgrad_reference(
    a: torch.Tensor, b: torch.Tensor, dc: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(da, x_hat) of the kernel in fp32 (float64 stays float64), from the same formula."""
    dt = reference_dtype(a.dtype)
    x_hat = a.to(dt) * rstd.to(dt)[:, None]
    dx_hat = dc.to(dt) @ b.to(dt).t()
    s = (dx_hat * x_hat).mean(dim=1, keepdim=True)
    return rstd.to(dt)[:, None] * (dx_hat - x_hat * s), x_hat


def _make_args_backward(shape: Shape, dtype: torch.dtype, device, seed: int | None) -> tuple:
    """(a, b, dc, rstd): the forward's operands, a unit-variance output gradient and the
    forward's rstd."""
    a, b = random_gemm_operands(shape, dtype, device, seed)
    if seed is None:
        return a, b, a.new_empty(shape.M, shape.N), torch.empty(shape.M, dtype=torch.float32, device=a.device)
    gen = torch.Generator(device=a.device).manual_seed(seed + 1)
    dc = torch.randn(shape.M, shape.N, generator=gen, device=a.device, dtype=torch.float32).to(dtype)
    rstd = torch.rsqrt(a.to(reference_dtype(dtype)).pow(2).mean(dim=1) + EPS).float()
    return a, b, dc, rstd


def _config(tm: int, tk: int, tn: int, warps: int, stages: int, indexing: str = "pointer",
            pid_type: str = "flat") -> helion.Config:
    return helion.Config(block_sizes=[tm, tk, tn, 128], num_warps=warps, num_stages=stages, indexing=indexing,
                         pid_type=pid_type)


SPEC_BACKWARD = KernelSpec(
    name="rmsnorm_matmul_backward",
    kernel=rmsnorm_matmul_dgrad_kernel,
    workload="gemm",
    make_args=_make_args_backward,
    key_of=gemm_shape,
    reference=rmsnorm_matmul_dgrad_reference,
    default_config=helion.Config(block_sizes=[64, 64, 64, 64], num_warps=4, num_stages=2),
    seed_configs=(
        _config(128, 128, 64, 8, 3),
        _config(128, 256, 64, 8, 3),
        _config(128, 128, 64, 8, 3, "tensor_descriptor"),
        _config(64, 128, 64, 4, 4),
        _config(64, 256, 64, 8, 3),
        _config(128, 256, 64, 8, 3, "tensor_descriptor", "persistent_interleaved"),
    ),
    dispatch_baseline="cublas+inductor_norm_backward",
)
