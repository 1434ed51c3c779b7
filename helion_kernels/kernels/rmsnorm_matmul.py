"""Deferred ("lazy") pre-norm: ``c = rmsnorm(a) @ b`` in one GEMM.

Technique 2 of the PyTorch blog "Towards Free Normalization: Fusing Normalization into
GEMM and Attention Kernels" (Meta, July 2026). The RMSNorm scale is one number per row, so

    (a * rstd[:, None]) @ b == (a @ b) * rstd[:, None],   rstd = 1 / sqrt(mean(a**2) + eps)

The k-loop accumulates ``a_tile @ b_tile`` on the tensor cores and ``sum(a_tile**2)`` on
the CUDA cores (from a second load of the same tile, an L1/L2 hit: see the kernel's
comment); the epilogue scales the accumulator by ``rsqrt(sum_sq / K + eps)``. Every
program recomputes its rows' sum of squares: redundant work hidden under the MMA instead
of a separate pass over ``a``.

An elementwise affine weight ``w`` [K] scales columns of ``rmsnorm(a)``, which is the same
as scaling rows of ``b``: ``rmsnorm(a, w) @ b == rmsnorm(a) @ (w[:, None] * b)``. It is
folded into ``b`` once (:func:`fold_rmsnorm_weight`), never applied in the k-loop.
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch
import torch.nn.functional as F

from .spec import (
    GEMM_DEFAULT_CONFIG,
    SEED_POINTER_64x128,
    SEED_POINTER_128x128,
    SEED_TMA_PERSISTENT_128x128,
    KernelSpec,
    Shape,
    gemm_flops,
    gemm_min_bytes,
    gemm_shape,
    random_gemm_operands,
    reference_dtype,
)

EPS = 1e-5


@helion.kernel(static_shapes=True)
def rmsnorm_matmul_kernel(
    a: torch.Tensor, b: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rmsnorm(a) @ b`` -> (c [M, N] in ``a.dtype``, rstd [M] fp32); no affine weight."""
    m, k = a.size()
    _, n = b.size()
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        sum_sq = hl.zeros([tile_m], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
            # A second load of the same tile (an L1/L2 hit) feeds the sum of squares, so the
            # MMA operand is used by the MMA alone: with one load shared by both, Triton 3.6
            # on Hopper (sm_90) produced wrong results for many of the fastest tilings.
            a32 = hl.load(a, [tile_m, tile_k], eviction_policy="evict_last").to(torch.float32)
            sum_sq = sum_sq + torch.sum(a32 * a32, dim=1)
        row_rstd = torch.rsqrt(sum_sq / k + eps)
        c[tile_m, tile_n] = (acc * row_rstd[:, None]).to(c.dtype)
        if tile_n.begin == 0:
            rstd[tile_m] = row_rstd
    return c, rstd


def fold_rmsnorm_weight(weight: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Fold an RMSNorm affine weight into the GEMM's right operand: ``weight[:, None] * b``.

    Args:
        weight: [K], the RMSNorm elementwise weight (any float dtype).
        b: [K, N], the GEMM's right operand.

    Returns:
        [K, N] in ``b.dtype``, computed in fp32 and rounded once. Compute it once per
        weight update and pass it as ``b`` with ``weight=None`` to reuse it.
    """
    return (weight.to(torch.float32)[:, None] * b.to(torch.float32)).to(b.dtype)


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
    try:  # optional dependency: pip install liger-kernel
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
    except Exception:  # absent, or broken against this torch/triton: skip the baseline
        return out
    # Liger's RMSNorm always has a weight; ones make it the un-affine norm.
    liger = LigerRMSNorm(k, eps=eps).to(device=a.device, dtype=a.dtype)
    out["liger_norm"] = lambda: liger(a)
    out["cublas+liger_norm"] = lambda: torch.mm(liger(a), b)
    return out


SPEC = KernelSpec(
    name="rmsnorm_matmul",
    kernel=rmsnorm_matmul_kernel,
    make_args=_make_args,
    shape_of=gemm_shape,
    reference=rmsnorm_matmul_reference,
    flops=gemm_flops,
    min_bytes=gemm_min_bytes,
    default_config=GEMM_DEFAULT_CONFIG,
    # Not the TMA 128x256 flat tiling: it gave wrong results with this kernel on H200
    # (bench/results/nvidia_h200_sm90/shared_operand_check.md).
    seed_configs=(SEED_TMA_PERSISTENT_128x128, SEED_POINTER_128x128, SEED_POINTER_64x128),
    baselines=_baselines,
    norm_baseline="inductor_norm",
    unfused_baselines=("cublas+inductor_norm", "cublas+liger_norm"),
    gemm_twin="matmul",
    technique="deferred pre-norm (technique 2, PyTorch blog 'Towards Free Normalization', 2026)",
)
