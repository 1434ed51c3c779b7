"""Deferred ("lazy") pre-norm: ``c = rmsnorm(a) @ b`` in one GEMM launch.

Technique 2 of the PyTorch blog "Towards Free Normalization: Fusing Normalization into
GEMM and Attention Kernels" (Meta, July 2026). The RMSNorm scale is one number per row, so

    (a * rstd[:, None]) @ b == (a @ b) * rstd[:, None],   rstd = 1 / sqrt(mean(a**2) + eps)

and the normalised ``a`` never exists: the GEMM runs on the raw ``a`` and its epilogue
scales the fp32 accumulator by ``rstd``.

Where the sum of squares is computed. The blog accumulates ``sum(a_tile**2)`` inside the
GEMM's k-loop. With Triton 3.6 on Hopper (sm_90) that formulation is not safe: a k-loop
load with both a wgmma user and a non-wgmma user is given too few pipeline buffers
(triton-lang/triton#7110, open), and loading the tile twice still raced on H200
(bench/results/nvidia_h200_sm90/pre_norm_variants.md, shared_operand_check.md). So one
program owns a block of ``tile_m`` rows: a k-loop of its own reduces the rows' sum of
squares once (the only user of those loads), then the program walks every N tile of the
rows with a plain GEMM k-loop, whose ``a`` tiles are now L2 hits, and scales each
accumulator by the rows' ``rstd``. Still one launch and one HBM read of ``a``, no load
shared between the MMA and the reduction, and no N tile recomputes the sum.

An elementwise affine weight ``w`` [K] scales columns of ``rmsnorm(a)``, which is the same
as scaling rows of ``b``: ``rmsnorm(a, w) @ b == rmsnorm(a) @ (w[:, None] * b)``. It is
folded into ``b`` once (:func:`helion_kernels.fold_rmsnorm_weight`), never applied in the k-loop.
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch
import torch.nn.functional as F

from ..grads import rms_rstd, rms_x_hat
from ..spec import KernelSpec, Shape, gemm_flops, gemm_min_bytes, gemm_shape, random_gemm_operands, reference_dtype
from .matmul import (
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


# A tiling for two programs per SM, so one program's sum-of-squares loop (loads and adds, no MMA)
# can run beside the other's GEMM k-loops: a 128x128x64 tile with 3 stages needs 96 KB of shared
# memory and 64 accumulator registers per thread on 8 warps. Measured on the H200
# (bench/results/nvidia_h200_sm90/variants/pre_norm_variants_two_per_sm.md): at 65536x256x256 it is
# the fastest row block (1.23x the best plain GEMM, against 1.42-1.50x for the 128x256 tilings, whose one
# program per SM adds about one read of ``a``); at 65536x1024x1024 it is slower (1.50x against
# 1.19x), so it is one seed among the 128x256 ones, not a replacement. A persistent
# tensor-descriptor variant with two programs per SM lost at both shapes and is not a seed.
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


def _baselines(a: torch.Tensor, b: torch.Tensor, eps: float) -> dict:
    """What a user runs without this kernel: a standalone norm, then the cuBLAS GEMM."""
    k = a.shape[1]
    inductor_norm = torch.compile(lambda x: F.rms_norm(x, (k,), eps=eps), dynamic=False)
    out = {
        "cublas_mm": lambda: torch.mm(a, b),
        "inductor_norm": lambda: inductor_norm(a),
        "cublas+inductor_norm": lambda: torch.mm(inductor_norm(a), b),
    }
    if a.device.type != "cuda":  # Liger's kernels are Triton kernels for GPUs
        return out
    try:  # optional dependency: pip install liger-kernel
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
    except Exception:  # absent, or broken against this torch/triton: skip the baseline
        return out
    # Liger's RMSNorm always has a weight; ones make it the un-affine norm.
    liger = LigerRMSNorm(k, eps=eps).to(device=a.device, dtype=a.dtype)
    out["liger_norm"] = lambda: liger(a)
    out["cublas+liger_norm"] = lambda: torch.mm(liger(a), b)
    return out


def _make_args_given_rstd(shape: Shape, dtype: torch.dtype, device, seed: int | None) -> tuple:
    a, b = random_gemm_operands(shape, dtype, device, seed)
    rstd = torch.empty(shape.M, dtype=torch.float32, device=device) if seed is None else rms_rstd(a, EPS)
    return a, b, rstd


def _baselines_given_rstd(a: torch.Tensor, b: torch.Tensor, rstd: torch.Tensor) -> dict:
    """The op's own unfused path with ``rstd`` given (the compiled row scaling, then cuBLAS),
    and the user's usual one (the compiled norm with its statistics, then cuBLAS)."""
    scale = torch.compile(rms_x_hat, dynamic=False)
    out = _baselines(a, b, EPS)
    out.update({"inductor_scale": lambda: scale(a, rstd),
                "cublas+inductor_scale": lambda: torch.mm(scale(a, rstd), b)})
    return out


SPEC = KernelSpec(
    name="rmsnorm_matmul",
    kernel=rmsnorm_matmul_kernel,
    workload="gemm",
    make_args=_make_args,
    key_of=gemm_shape,
    reference=rmsnorm_matmul_reference,
    flops=gemm_flops,
    min_bytes=gemm_min_bytes,
    default_config=row_block_config(GEMM_DEFAULT_CONFIG, 64),
    seed_configs=tuple(row_block_config(g) for g in (
        SEED_TMA_PERSISTENT_128x256, SEED_POINTER_128x256, SEED_TMA_FLAT_128x256,
        SEED_TMA_PERSISTENT_128x128, SEED_POINTER_128x128, SEED_POINTER_64x128,
        SEED_TMA_PERSISTENT_128x256_FLATTENED, SEED_ROW_BLOCK_POINTER_128x128_TWO_PER_SM)),
    baselines=_baselines,
    norm_baseline="inductor_norm",
    unfused_baselines=("cublas+inductor_norm", "cublas+liger_norm"),
    gemm_twin="matmul",
    dispatch_baseline="cublas+inductor_norm",
    technique="deferred pre-norm (technique 2, PyTorch blog 'Towards Free Normalization', 2026)",
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
    flops=gemm_flops,
    min_bytes=gemm_min_bytes,
    default_config=GEMM_DEFAULT_CONFIG,
    seed_configs=GEMM_SEED_CONFIGS,  # the plain GEMM's: the same loops
    same_loops_as=("matmul",),
    baselines=_baselines_given_rstd,
    norm_baseline="inductor_norm",
    # The blog's metric against the whole norm: the statistics' cost in the producer is not
    # timed (no memory traffic there when a residual add or GEMM epilogue emits them).
    unfused_baselines=("cublas+inductor_scale", "cublas+inductor_norm", "cublas+liger_norm"),
    gemm_twin="matmul",
    dispatch_baseline="cublas+inductor_scale",
    technique="deferred pre-norm with the producer's rstd, whose cost is not timed here (technique 2, "
              "PyTorch blog 'Towards Free Normalization', 2026)",
    dynamic_m=True,
)
