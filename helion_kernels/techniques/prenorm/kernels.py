"""Deferred ("lazy") pre-norm: ``c = norm(a) @ b`` in one GEMM launch, and its backward.

Technique 2 of the PyTorch blog "Towards Free Normalization: Fusing Normalization into
GEMM and Attention Kernels" (Meta, July 2026). A norm's statistics are numbers per row, so

    RMSNorm:   (a * rstd[:, None]) @ b == (a @ b) * rstd[:, None]
    LayerNorm: ((a - mean[:, None]) * rstd[:, None]) @ b == rstd[:, None] * (a @ b - mean[:, None] * colsum(b))

and the normalised ``a`` never exists: the GEMM runs on the raw ``a`` and its epilogue
applies the statistics. ``colsum(b)`` is summed over the very ``b`` the MMA reads. Where the
MMA itself rounds (fp32 inputs run on TF32), a row far from zero mean would lose its
deviations in ``a @ b``, so there the mean comes off each ``a`` tile before the MMA instead.

Where the statistics come from. Computed here: one program owns a block of ``tile_m`` rows,
reduces their statistics in a k-loop of its own (LayerNorm: count, mean and squared
deviations merged tile by tile, Chan et al.), then walks the rows' N tiles with a plain GEMM
k-loop (``a`` now from L2). The blog sums inside the GEMM's k-loop; with Triton 3.6 on Hopper
a load feeding both a wgmma and another user gets too few pipeline buffers
(triton-lang/triton#7110) and races. Given by the producer of ``a`` (a residual add writing
``h = x + residual`` and its rows' statistics in the same pass): the kernel is the plain GEMM
with that epilogue.

An elementwise affine weight ``w`` [K] scales columns of ``norm(a)``, i.e. rows of ``b``: it
is folded into ``b`` once (:func:`helion_kernels.fold_rmsnorm_weight`); a LayerNorm bias
``beta`` [K] enters as the row vector ``beta @ b`` added in the epilogue.
"""

from __future__ import annotations

import dataclasses

import helion
import helion.language as hl
import torch

from ...autograd import col_sums, colsum_for, rms_rstd
from ...spec import KernelSpec, Shape, gemm_shape, random_gemm_operands, reference_dtype
from ..postnorm.kernels import LAYERNORM, RMSNORM
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
def prenorm_matmul_kernel(
    a: torch.Tensor,
    b: torch.Tensor,
    eps: float,
    layernorm: int,
    colsum: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """``norm(a) @ b [+ beta]`` with the rows' statistics computed here: (c [M, N] in
    ``a.dtype``, rstd [M] fp32) for ``layernorm=0`` (RMSNorm), (c, mean, rstd) for
    ``layernorm=1``. The GEMM runs on the raw ``a``; LayerNorm's mean comes off in the
    epilogue as ``mean * colsum`` (``colsum`` [N] fp32: the column sums of the very ``b`` the
    MMA reads) or, with ``colsum`` None (fp32 inputs, whose MMA rounds to TF32), off each
    ``a`` tile before the MMA. ``beta`` [N] fp32 (a folded LayerNorm bias, ``bias @ b``) is
    added last. Config ``block_sizes`` = [tile_m, tile_k of the statistics loop, tile_n,
    tile_k of the GEMM loop]."""
    m, k = a.size()
    _, n = b.size()
    ln = hl.specialize(layernorm)
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    if ln:
        mean = torch.empty([m], dtype=torch.float32, device=a.device)
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m in hl.tile(m):
        if ln:
            count = hl.zeros([tile_m], dtype=torch.float32)
            row_mean = hl.zeros([tile_m], dtype=torch.float32)
            m2 = hl.zeros([tile_m], dtype=torch.float32)
        else:
            sum_sq = hl.zeros([tile_m], dtype=torch.float32)
        for tile_k in hl.tile(k):
            a32 = a[tile_m, tile_k].to(torch.float32)
            if ln:
                in_row = (tile_k.index < k)[None, :]
                tile_count = torch.sum(in_row.to(torch.float32), dim=1)
                tile_mean = torch.sum(a32, dim=1) / tile_count  # padded columns load as 0
                centred = torch.where(in_row, a32 - tile_mean[:, None], 0.0)
                # Chan et al.'s merge; delta * (delta * w): on the first tile w = 0
                total = count + tile_count
                delta = tile_mean - row_mean
                row_mean = row_mean + delta * (tile_count / total)
                m2 = m2 + torch.sum(centred * centred, dim=1) + delta * (delta * (count * tile_count / total))
                count = total
            else:
                sum_sq = sum_sq + torch.sum(a32 * a32, dim=1)
        if ln:
            row_rstd = torch.rsqrt(m2 / k + eps)
            mean[tile_m] = row_mean
            # another name for the GEMM loops: Helion's inter-loop barrier check goes by names,
            # and row_mean is the statistics loop's
            row_shift = row_mean
        else:
            row_rstd = torch.rsqrt(sum_sq / k + eps)
        rstd[tile_m] = row_rstd
        for tile_n in hl.tile(n):
            acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(k):
                if ln:
                    if colsum is None:  # the mean off each tile, before the MMA
                        shifted = (a[tile_m, tile_k].to(torch.float32) - row_shift[:, None]).to(a.dtype)
                        acc = torch.addmm(acc, shifted, b[tile_k, tile_n])
                    else:
                        acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
                else:
                    acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
            if ln:
                if colsum is not None:  # the mean off in the epilogue
                    acc = acc - row_shift[:, None] * colsum[tile_n][None, :]
            out = acc * row_rstd[:, None]
            if beta is not None:
                out = out + beta[tile_n][None, :]
            c[tile_m, tile_n] = out.to(c.dtype)
    if ln:
        return c, mean, rstd
    return c, rstd


@helion.kernel(static_shapes=True)
def prenorm_matmul_given_stats_kernel(
    a: torch.Tensor,
    b: torch.Tensor,
    rstd: torch.Tensor,
    mean: torch.Tensor | None = None,
    colsum: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
) -> torch.Tensor:
    """``norm(a) @ b [+ beta]`` with the rows' statistics given by the producer of ``a``
    (``rstd`` [M] fp32; LayerNorm: also ``mean`` [M] fp32): c [M, N] in ``a.dtype``. Without
    ``mean`` (RMSNorm) the epilogue scales the fp32 accumulator by ``rstd``; with it the mean
    comes off as in :func:`prenorm_matmul_kernel` (``colsum`` given: in the epilogue; None:
    off each ``a`` tile). Config ``block_sizes`` = [tile_m, tile_n, tile_k], as the plain
    GEMM's."""
    m, k = a.size()
    _, n = b.size()
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            if mean is not None:
                if colsum is None:  # the mean off each tile, before the MMA
                    shifted = (a[tile_m, tile_k].to(torch.float32) - mean[tile_m][:, None]).to(a.dtype)
                    acc = torch.addmm(acc, shifted, b[tile_k, tile_n])
                else:
                    acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
            else:
                acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
        if mean is not None:
            if colsum is not None:  # the mean off in the epilogue
                acc = acc - mean[tile_m][:, None] * colsum[tile_n][None, :]
        out = acc * rstd[tile_m][:, None]
        if beta is not None:
            out = out + beta[tile_n][None, :]
        c[tile_m, tile_n] = out.to(c.dtype)
    return c


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


def prenorm_matmul_reference(a: torch.Tensor, b: torch.Tensor, eps: float = EPS, layernorm: int = RMSNORM,
                             colsum: torch.Tensor | None = None, beta: torch.Tensor | None = None) -> tuple:
    """:func:`prenorm_matmul_kernel`'s outputs with plain PyTorch in fp32 (float64 stays
    float64): ``(c, rstd)`` or ``(c, mean, rstd)``; ``colsum`` plays no part (it is exact)."""
    dt = reference_dtype(a.dtype)
    a32 = a.to(dt)
    if layernorm:
        mean = a32.mean(dim=1)
        rstd = torch.rsqrt((a32 - mean[:, None]).pow(2).mean(dim=1) + eps)
        normed = (a32 - mean[:, None]) * rstd[:, None]
    else:
        rstd = torch.rsqrt(a32.pow(2).mean(dim=1) + eps)
        normed = a32 * rstd[:, None]
    c = normed @ b.to(dt)
    if beta is not None:
        c = c + beta.to(dt)
    return (c, mean, rstd) if layernorm else (c, rstd)


def prenorm_matmul_given_stats_reference(a: torch.Tensor, b: torch.Tensor, rstd: torch.Tensor,
                                         mean: torch.Tensor | None = None, colsum: torch.Tensor | None = None,
                                         beta: torch.Tensor | None = None) -> tuple[torch.Tensor]:
    """``((a - mean) * rstd) @ b [+ beta]`` in fp32 (float64 stays float64)."""
    dt = reference_dtype(a.dtype)
    x = a.to(dt) if mean is None else a.to(dt) - mean.to(dt)[:, None]
    c = (x * rstd.to(dt)[:, None]) @ b.to(dt)
    return (c if beta is None else c + beta.to(dt),)


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


def _layernorm_extras(b: torch.Tensor, seed: int | None) -> tuple:
    """(colsum, beta) for a LayerNorm kernel's random arguments: a folded bias ~ N(0, 1)."""
    if seed is None:
        return colsum_for(b), torch.empty(b.shape[1], dtype=torch.float32, device=b.device)
    gen = torch.Generator(device=b.device).manual_seed(seed + 2)
    return colsum_for(b), torch.randn(b.shape[1], generator=gen, device=b.device, dtype=torch.float32)


def _make_args(layernorm: int):
    def make(shape: Shape, dtype: torch.dtype, device, seed: int | None) -> tuple:
        a, b = random_gemm_operands(shape, dtype, device, seed)
        if not layernorm:
            return a, b, EPS, RMSNORM
        if seed is not None:  # rows off zero mean: what the epilogue's mean correction is for
            a = (a.float() + 3.0).to(dtype)
        return (a, b, EPS, LAYERNORM, *_layernorm_extras(b, seed))
    return make


def _make_args_given(layernorm: int):
    def make(shape: Shape, dtype: torch.dtype, device, seed: int | None) -> tuple:
        a, b, eps, _, *extras = _make_args(layernorm)(shape, dtype, device, seed)
        if seed is None:
            stats = [torch.empty(shape.M, dtype=torch.float32, device=device) for _ in range(1 + layernorm)]
        elif layernorm:
            mean = a.float().mean(dim=1)
            stats = [torch.rsqrt((a.float() - mean[:, None]).pow(2).mean(dim=1) + eps), mean]
        else:
            stats = [rms_rstd(a, eps)]
        return (a, b, *stats, *extras)
    return make


_ROW_BLOCK_SEEDS = tuple(row_block_config(g) for g in (
    SEED_TMA_PERSISTENT_128x256, SEED_POINTER_128x256, SEED_TMA_FLAT_128x256,
    SEED_TMA_PERSISTENT_128x128, SEED_POINTER_128x128, SEED_POINTER_64x128,
    SEED_TMA_PERSISTENT_128x256_FLATTENED, SEED_ROW_BLOCK_POINTER_128x128_TWO_PER_SM))

SPEC = KernelSpec(
    name="rmsnorm_matmul",
    kernel=prenorm_matmul_kernel,
    workload="gemm",
    make_args=_make_args(RMSNORM),
    key_of=gemm_shape,
    reference=prenorm_matmul_reference,
    default_config=row_block_config(GEMM_DEFAULT_CONFIG, 64),
    seed_configs=_ROW_BLOCK_SEEDS,
    dispatch_baseline="cublas+inductor_norm",
    same_loops_as=("layernorm_matmul",),  # one kernel, the norm a flag: each norm's configs seed the other's
    dynamic_m=True,
)
SPEC_LAYERNORM = dataclasses.replace(SPEC, name="layernorm_matmul", make_args=_make_args(LAYERNORM),
                                     same_loops_as=("rmsnorm_matmul",))

# The same technique for a producer that already wrote the statistics (``rstd=``, ``mean=``, the
# residual-add ops): the plain GEMM's loops, so the GEMM's configs seed its search.
SPEC_GIVEN_RSTD = KernelSpec(
    name="rmsnorm_matmul_given_rstd",
    kernel=prenorm_matmul_given_stats_kernel,
    workload="gemm",
    make_args=_make_args_given(RMSNORM),
    key_of=gemm_shape,
    reference=prenorm_matmul_given_stats_reference,
    default_config=GEMM_DEFAULT_CONFIG,
    seed_configs=GEMM_SEED_CONFIGS,
    same_loops_as=("matmul", "layernorm_matmul_given_stats"),
    dispatch_baseline="cublas+inductor_scale",
    dynamic_m=True,
)
SPEC_LAYERNORM_GIVEN = dataclasses.replace(
    SPEC_GIVEN_RSTD, name="layernorm_matmul_given_stats", make_args=_make_args_given(LAYERNORM),
    same_loops_as=("matmul", "rmsnorm_matmul_given_rstd"))


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


# --- backward, the row terms from the forward's output --------------------------------------
#
# With x_hat the normalised a, b the GEMM's right operand (affine weight folded in) and
# c = x_hat @ b + beta: dx_hat = dc @ b^T, and the norm's backward needs per row
# s2 = sum_k dx_hat * x_hat = sum_n dc * (c - beta) and, for LayerNorm, s1 = sum_k dx_hat =
# dc @ colsum(b): neither needs a whole row of K, so the dgrad GEMM is a plain 2-D tiling whose
# epilogue writes da = rstd * (dx_hat - (s1 + x_hat * s2) / K) (and x_hat, for the wgrad). The
# row terms cost keeping c and one pass over dc and c.

@helion.kernel(static_shapes=True)
def prenorm_dgrad_kernel(
    a: torch.Tensor,
    b: torch.Tensor,
    dc: torch.Tensor,
    rstd: torch.Tensor,
    s2: torch.Tensor,
    mean: torch.Tensor | None = None,
    s1: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(da [M, K], x_hat [M, K]), both in ``a.dtype``, of ``c = norm(a) @ b`` for the output
    gradient ``dc`` [M, N], given the rows' ``rstd``, ``s2`` and (LayerNorm) ``mean``, ``s1``
    [M] fp32 (see above). Config ``block_sizes`` = [tile_m, tile_k, tile_n]."""
    m, k = a.size()
    n = b.size(1)
    da = torch.empty_like(a)
    x_hat = torch.empty_like(a)
    for tile_m, tile_k in hl.tile([m, k]):
        acc = hl.zeros([tile_m, tile_k], dtype=torch.float32)
        for tile_n in hl.tile(n):
            acc = torch.addmm(acc, dc[tile_m, tile_n], b[tile_k, tile_n].T)
        row_rstd = rstd[tile_m]
        if mean is not None:
            xh = (a[tile_m, tile_k].to(torch.float32) - mean[tile_m][:, None]) * row_rstd[:, None]
        else:
            xh = a[tile_m, tile_k].to(torch.float32) * row_rstd[:, None]
        fix = xh * (s2[tile_m] / k)[:, None]
        if s1 is not None:
            fix = fix + (s1[tile_m] / k)[:, None]
        da[tile_m, tile_k] = (row_rstd[:, None] * (acc - fix)).to(da.dtype)
        x_hat[tile_m, tile_k] = xh.to(x_hat.dtype)
    return da, x_hat


def prenorm_dgrad_reference(a, b, dc, rstd, s2, mean=None, s1=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(da, x_hat) of the kernel in fp32 (float64 stays float64), from the norm's backward over
    whole rows (not from ``s1``, ``s2``)."""
    dt = reference_dtype(a.dtype)
    x = a.to(dt) if mean is None else a.to(dt) - mean.to(dt)[:, None]
    x_hat = x * rstd.to(dt)[:, None]
    dx_hat = dc.to(dt) @ b.to(dt).t()
    fix = x_hat * (dx_hat * x_hat).mean(dim=1, keepdim=True)
    if mean is not None:
        fix = fix + dx_hat.mean(dim=1, keepdim=True)
    return rstd.to(dt)[:, None] * (dx_hat - fix), x_hat


def row_terms(dc: torch.Tensor, c: torch.Tensor, beta: torch.Tensor | None, colsum: torch.Tensor | None):
    """(s2, s1) [M] fp32 of :func:`prenorm_dgrad_kernel` from the output gradient and the
    forward's output: ``s2 = sum_n dc * (c - beta)``, ``s1 = dc @ colsum`` (None without
    ``colsum``: RMSNorm)."""
    dc32, c32 = dc.float(), c.float()
    s2 = (dc32 * (c32 if beta is None else c32 - beta)).sum(dim=1)
    return s2, (None if colsum is None else dc32 @ colsum.to(dc32.dtype))


def _make_args_dgrad(shape: Shape, dtype: torch.dtype, device, seed: int | None) -> tuple:
    """(a, b, dc, rstd, s2, mean, s1) of a LayerNorm pre-norm: its forward's operands and
    statistics, a unit-variance output gradient, the row terms from the forward's output."""
    a, b, eps, _, colsum, beta = _make_args(LAYERNORM)(shape, dtype, device, seed)
    if seed is None:
        stats = [torch.empty(shape.M, dtype=torch.float32, device=a.device) for _ in range(4)]
        return a, b, a.new_empty(shape.M, shape.N), *stats
    gen = torch.Generator(device=a.device).manual_seed(seed + 1)
    dc = torch.randn(shape.M, shape.N, generator=gen, device=a.device, dtype=torch.float32).to(dtype)
    c, mean, rstd = prenorm_matmul_reference(a, b, eps, LAYERNORM, colsum, beta)
    s2, s1 = row_terms(dc, c.to(dtype), beta, col_sums(b))
    return a, b, dc, rstd.float(), s2, mean.float(), s1


SPEC_LAYERNORM_BACKWARD = KernelSpec(
    name="layernorm_matmul_backward",
    kernel=prenorm_dgrad_kernel,
    workload="gemm",
    make_args=_make_args_dgrad,
    key_of=gemm_shape,
    reference=prenorm_dgrad_reference,
    default_config=helion.Config(block_sizes=[64, 64, 64], num_warps=4, num_stages=2),
    seed_configs=GEMM_SEED_CONFIGS,  # a GEMM's tiling over (M, K), its k-loop over N
    dispatch_baseline="cublas+inductor_norm_backward",
)
