"""Full-row post-norm: ``c = layer_norm(a @ b)`` or ``rms_norm(a @ b)`` in one GEMM launch.

Technique 1 of the PyTorch blog "Towards Free Normalization: Fusing Normalization into
GEMM and Attention Kernels" (Meta, July 2026). A norm over the last dimension N of a GEMM
output needs statistics of a whole output row. If one program owns whole rows, i.e. its
output tile is ``tile_m`` x N, those statistics are a reduction over the fp32 accumulator
that is already in registers after the k-loop: the epilogue computes the row mean (LayerNorm
only) and ``rstd``, normalises, applies the elementwise ``weight``/``bias`` and stores the
result once. The un-normalised GEMM output never goes to HBM and is never read back, which
is what the standalone norm after a cuBLAS GEMM costs.

Row ownership. The N tile is declared with ``hl.register_block_size(Npad, Npad)`` where
``Npad`` is the next power of two of N: its minimum equals its maximum, so no config the
autotuner (or a user) can produce splits a row over programs (Helion raises a smaller
value to the minimum). Only ``tile_m``, ``tile_k``, warps, stages and indexing are tuned.
When N is not a power of two, the padded columns of the accumulator are zero (masked
loads of ``b``) but their deviation from the mean is not, so they are masked out of the
variance explicitly. Statistics are fp32; the LayerNorm variance is the mean of squared
deviations from the row mean (two passes over the register tile, stable when the row mean
is large against its spread).

The limit. A program holds a [tile_m, Npad] fp32 accumulator and, per k step, a
[tile_k, Npad] tile of ``b`` in shared memory, so N is bounded by the GPU's shared memory
per block: :func:`.limits.max_full_row_n` (2048 for bf16/fp16 and 1024 for fp32 on H100/H200).
Larger N needs the split-N strategy (technique 3 of the blog), where several programs
share a row and the statistics are combined across them.

Config ``block_sizes`` = [N tile (fixed: any value is raised to Npad), tile_m, tile_k].
"""

from __future__ import annotations

import dataclasses
import functools

import helion
import helion.language as hl
import torch
import torch.nn.functional as F

from .. import liger_norm
from ..spec import (
    KernelSpec,
    Shape,
    gemm_flops,
    gemm_min_bytes,
    gemm_shape,
    random_gemm_operands,
    reference_dtype,
)
from .limits import MIN_TILE_K, MIN_TILE_M, full_row_shared_memory, max_full_row_n, shared_memory_per_block

EPS = 1e-5


@helion.kernel(static_shapes=True)
def matmul_layernorm_kernel(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    linear_bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    product: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``layer_norm(h, (N,), weight, bias, eps)`` of ``h = a @ b [+ linear_bias] [+ residual]``
    -> (c [M, N] in ``a.dtype``, mean [M] fp32, rstd [M] fp32); fp32 accumulation and
    statistics. ``linear_bias`` [N] (a Linear's bias) and ``residual`` [M, N] are added to the
    fp32 accumulator before the statistics (a post-LN block, ``norm(x + linear(h))``).
    ``product``: an optional [M, N] buffer that receives ``h`` un-normalised, in its dtype
    (what a backward needs).

    Config ``block_sizes`` = [N tile (fixed to Npad), tile_m, tile_k].
    """
    m, k = a.size()
    n = hl.specialize(b.size(1))
    # min == max: a row is never split over programs, whatever the config says.
    block_n = hl.register_block_size(helion.next_power_of_2(n), helion.next_power_of_2(n))
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    mean = torch.empty([m], dtype=torch.float32, device=a.device)
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m, tile_n in hl.tile([m, n], block_size=[None, block_n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
        # Loads of the optional addends, then the store of h, come right after the k-loop's
        # two loads (their indexing slots are inserted there: with_call_slots).
        if linear_bias is not None:
            acc = acc + linear_bias[tile_n].to(torch.float32)[None, :]
        if residual is not None:
            acc = acc + residual[tile_m, tile_n].to(torch.float32)
        if product is not None:
            # h stored before the statistics (its slot follows the addends': with_call_slots).
            # Stored last, it kept acc live beside centered and y through the epilogue and cost
            # the H200 2.8-4.2x as much at 256 <= N <= 512 (bench/variants/fullrow_product_store.py).
            product[tile_m, tile_n] = acc.to(product.dtype)
        # Padded columns of acc are 0 (masked loads), so the plain sum is the sum over the
        # N real columns.
        row_mean = torch.sum(acc, dim=1) / n
        # ... but acc - mean is not 0 there: mask it out of the variance.
        in_row = (tile_n.index < n)[None, :]
        centered = torch.where(in_row, acc - row_mean[:, None], 0.0)
        var = torch.sum(centered * centered, dim=1) / n
        row_rstd = torch.rsqrt(var + eps)
        y = centered * row_rstd[:, None]
        if weight is not None:
            y = y * weight[tile_n].to(torch.float32)[None, :]
        if bias is not None:
            y = y + bias[tile_n].to(torch.float32)[None, :]
        c[tile_m, tile_n] = y.to(c.dtype)
        mean[tile_m] = row_mean
        rstd[tile_m] = row_rstd
    return c, mean, rstd


@helion.kernel(static_shapes=True)
def matmul_rmsnorm_kernel(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    linear_bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    product: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rms_norm(h, (N,), weight, eps)`` of ``h = a @ b [+ linear_bias] [+ residual]`` ->
    (c [M, N] in ``a.dtype``, rstd [M] fp32); fp32 accumulation and statistics; the optional
    addends and ``product`` as in :func:`matmul_layernorm_kernel`.

    Config ``block_sizes`` = [N tile (fixed to Npad), tile_m, tile_k].
    """
    m, k = a.size()
    n = hl.specialize(b.size(1))
    # min == max: a row is never split over programs, whatever the config says.
    block_n = hl.register_block_size(helion.next_power_of_2(n), helion.next_power_of_2(n))
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m, tile_n in hl.tile([m, n], block_size=[None, block_n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
        if linear_bias is not None:
            acc = acc + linear_bias[tile_n].to(torch.float32)[None, :]
        if residual is not None:
            acc = acc + residual[tile_m, tile_n].to(torch.float32)
        if product is not None:  # before the statistics, as in matmul_layernorm_kernel
            product[tile_m, tile_n] = acc.to(product.dtype)
        # Padded columns of acc are 0 (masked loads), and so are their squares; the
        # explicit mask keeps that true whatever the loads' padding value.
        in_row = (tile_n.index < n)[None, :]
        sq = torch.where(in_row, acc * acc, 0.0)
        row_rstd = torch.rsqrt(torch.sum(sq, dim=1) / n + eps)
        y = acc * row_rstd[:, None]
        if weight is not None:
            y = y * weight[tile_n].to(torch.float32)[None, :]
        c[tile_m, tile_n] = y.to(c.dtype)
        rstd[tile_m] = row_rstd
    return c, rstd


def _reference_h(a, b, linear_bias, residual, dt):
    """``a @ b [+ linear_bias] [+ residual]`` in ``dt``."""
    c = a.to(dt) @ b.to(dt)
    if linear_bias is not None:
        c = c + linear_bias.to(dt)
    return c if residual is None else c + residual.to(dt)


def matmul_layernorm_reference(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = EPS,
    linear_bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unfused ``layer_norm(a @ b [+ linear_bias] [+ residual])``, its row mean and rstd, in
    fp32 (float64 stays float64)."""
    dt = reference_dtype(a.dtype)
    c = _reference_h(a, b, linear_bias, residual, dt)
    mean = c.mean(dim=1)
    centered = c - mean[:, None]
    rstd = torch.rsqrt(centered.pow(2).mean(dim=1) + eps)
    y = centered * rstd[:, None]
    if weight is not None:
        y = y * weight.to(dt)
    if bias is not None:
        y = y + bias.to(dt)
    return y, mean, rstd


def matmul_rmsnorm_reference(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = EPS,
    linear_bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unfused ``rms_norm(a @ b [+ linear_bias] [+ residual])`` and its row rstd in fp32
    (float64 stays float64)."""
    dt = reference_dtype(a.dtype)
    c = _reference_h(a, b, linear_bias, residual, dt)
    rstd = torch.rsqrt(c.pow(2).mean(dim=1) + eps)
    y = c * rstd[:, None]
    if weight is not None:
        y = y * weight.to(dt)
    return y, rstd


def _affine_params(
    n: int, dtype: torch.dtype, device, seed: int | None, with_bias: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """weight ~ 1 + 0.1 N(0, 1), bias ~ 0.1 N(0, 1), drawn from ``seed + 1`` on ``device``."""
    if seed is None:
        return (torch.empty(n, dtype=dtype, device=device),
                torch.empty(n, dtype=dtype, device=device) if with_bias else None)
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    weight = 1 + 0.1 * torch.randn(n, generator=gen, device=device, dtype=torch.float32)
    bias = 0.1 * torch.randn(n, generator=gen, device=device, dtype=torch.float32) if with_bias else None
    return weight.to(dtype), None if bias is None else bias.to(dtype)


def _make_args_layernorm(shape: Shape, dtype: torch.dtype, device, seed: int | None) -> tuple:
    """(a, b, weight, bias, eps): the affine LayerNorm, the case tuned and benchmarked."""
    a, b = random_gemm_operands(shape, dtype, device, seed)
    weight, bias = _affine_params(shape.N, dtype, device, seed, with_bias=True)
    return a, b, weight, bias, EPS


def _make_args_rmsnorm(shape: Shape, dtype: torch.dtype, device, seed: int | None) -> tuple:
    """(a, b, weight, eps): the affine RMSNorm, the case tuned and benchmarked."""
    a, b = random_gemm_operands(shape, dtype, device, seed)
    weight, _ = _affine_params(shape.N, dtype, device, seed, with_bias=False)
    return a, b, weight, EPS


def _unfused(a: torch.Tensor, b: torch.Tensor, norm, liger) -> dict:
    """What a user runs without this kernel: the cuBLAS GEMM, then a standalone norm
    (``norm``: x -> y, compiled by inductor here; ``liger``: x -> y by Liger's norm, or None)."""
    c0 = torch.mm(a, b)
    inductor_norm = torch.compile(norm, dynamic=False)
    out = {
        "cublas_mm": lambda: torch.mm(a, b),
        "inductor_norm": lambda: inductor_norm(c0),
        "cublas+inductor_norm": lambda: inductor_norm(torch.mm(a, b)),
    }
    if liger is not None:
        out["liger_norm"] = lambda: liger(c0)
        out[liger_norm.PIPELINE] = lambda: liger(torch.mm(a, b))
    return out


def _liger(class_name: str, module: str, n: int, eps: float, like: torch.Tensor, **params):
    """Liger's norm module with these affine parameters, or None when liger-kernel is not
    installed (optional dependency: pip install liger-kernel) or does not import, or the
    tensors are not on a CUDA device (Liger's kernels are Triton kernels for GPUs)."""
    if like.device.type != "cuda":
        return None
    try:
        cls = getattr(__import__(f"liger_kernel.transformers.{module}", fromlist=[class_name]), class_name)
    except Exception:  # absent, or broken against this torch/triton: skip the baseline
        return None
    norm = cls(n, eps=eps).to(device=like.device, dtype=like.dtype)
    with torch.no_grad():
        for name, value in params.items():
            if value is None:
                getattr(norm, name).zero_()
            else:
                getattr(norm, name).copy_(value)
    return norm


# The Liger baselines are the functions the split-N ops' unfused path runs (liger_norm: the
# forward kernels of LigerLayerNorm / LigerRMSNorm, RMSNorm in Liger's fp32 "gemma" casting
# mode), so that tuning times the pipeline the op then runs. (Before 2026-12-02, the
# benchmarks timed the Liger modules: the same LayerNorm kernel, RMSNorm in "llama" mode.)
def _baselines_layernorm(
    a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None,
    bias: torch.Tensor | None, eps: float,
) -> dict:
    n = b.shape[1]
    liger = (lambda x: liger_norm.layer_norm(x, weight, bias, eps)[0]) if liger_norm.available(a.device, n) else None
    return _unfused(a, b, lambda x: F.layer_norm(x, (n,), weight, bias, eps), liger)


def _baselines_rmsnorm(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None, eps: float) -> dict:
    n = b.shape[1]
    liger = (lambda x: liger_norm.rms_norm(x, weight, eps)[0]) if liger_norm.available(a.device, n) else None
    return _unfused(a, b, lambda x: F.rms_norm(x, (n,), weight, eps), liger)


# block_sizes = [N tile, tile_m, tile_k]. The N tile's minimum and maximum are both Npad,
# so the 16 written here is raised to Npad at every N: one config serves every N. (A
# larger value than Npad would not be lowered: Helion only raises block sizes to their
# minimum; configs tuned at one N carry that N's Npad.)
_N_TILE = 16

def portable_config(config: helion.Config) -> helion.Config:
    """``config`` with its N tile reset to the minimum, so Helion raises it to the Npad of
    whatever shape it runs at (a config tuned at N = 512 would otherwise keep a 512-wide
    tile at N = 64)."""
    return helion.Config(**{**config.config, "block_sizes": [_N_TILE, *config.block_sizes[1:]]})


def fit_shared_memory(config: helion.Config, args: tuple) -> helion.Config:
    """``config`` made to fit one block's shared memory at this call's N.

    A config tuned at a smaller N (the registry's nearest shape) can need more shared memory
    than the GPU has at this call's Npad: seen on the H200, a 64 x 64, 3-stage tiling tuned
    at 65536x256x256 asked for 417792 bytes at N = 1000. Estimated as in :func:`.limits.max_full_row_n`
    (:func:`.limits.full_row_shared_memory`), and reduced in this order until it fits: stages down to
    1, tile_k down to 16, tile_m down to 16 (which :func:`.limits.max_full_row_n` guarantees fits).
    """
    a, b = args[0], args[1]
    npad = helion.next_power_of_2(int(b.shape[1]))
    item = a.element_size()
    smem = shared_memory_per_block(a.device if a.is_cuda else None)
    fitted = config
    while full_row_shared_memory(fitted.num_stages, *fitted.block_sizes[1:], npad, item) > smem:
        smaller = smaller_config(fitted)
        if smaller is None:
            break
        fitted = smaller
    return fitted


def smaller_config(config: helion.Config) -> helion.Config | None:
    """The next smaller full-row program: one pipeline stage fewer, else tile_k halved (down
    to 16), else tile_m halved (down to 16); None at (1 stage, 16, 16)."""
    _, tile_m, tile_k = config.block_sizes
    stages = config.num_stages
    if stages <= 1 and tile_m <= MIN_TILE_M and tile_k <= MIN_TILE_K:
        return None
    if stages > 1:
        return helion.Config(**{**config.config, "num_stages": stages - 1})
    block_sizes = ([config.block_sizes[0], tile_m, tile_k // 2] if tile_k > MIN_TILE_K
                   else [config.block_sizes[0], tile_m // 2, tile_k])
    return helion.Config(**{**config.config, "block_sizes": block_sizes})


def with_call_slots(config: helion.Config, args: tuple, first_optional: int) -> helion.Config:
    """``config`` for a call that passes some of the optional tensors ``linear_bias``,
    ``residual`` and ``product`` (at ``args[first_optional:]``, in that order).

    The registry's configs are tuned without them, and a per-access ``indexing`` list has one
    slot per load and store in program order: each addend is one more load right after the
    k-loop's two, and the product one more store right after those (slots 2 to 4, in the
    order linear_bias, residual, product). The added slots are "pointer" (on the H200, h
    stored with c's indexing instead was no faster: bench/variants/fullrow_product_store.py);
    a single indexing string needs nothing.
    """
    indexing = config.config.get("indexing")
    present = [isinstance(t, torch.Tensor) for t in args[first_optional:first_optional + 3]]
    if not isinstance(indexing, list) or not any(present):
        return config
    indexing = [*indexing[:2], *["pointer"] * sum(present), *indexing[2:]]
    return helion.Config(**{**config.config, "indexing": indexing})


# The smallest program, the one max_full_row_n is computed for: fits every N it accepts.
DEFAULT_CONFIG = helion.Config(
    block_sizes=[_N_TILE, MIN_TILE_M, MIN_TILE_K], num_warps=4, num_stages=1)

# Hopper-friendly seeds (64 or 128 rows per program, k-tile 64). Those that do not fit
# at a large N are dropped by the autotuner like any seed that does not compile.
SEED_CONFIGS: tuple[helion.Config, ...] = (
    helion.Config(block_sizes=[_N_TILE, 64, 64], num_warps=4, num_stages=3, indexing="pointer"),
    helion.Config(block_sizes=[_N_TILE, 64, 64], num_warps=4, num_stages=2,
                  indexing="tensor_descriptor"),
    helion.Config(block_sizes=[_N_TILE, 128, 64], num_warps=8, num_stages=2, indexing="pointer"),
    helion.Config(block_sizes=[_N_TILE, 128, 64], num_warps=8, num_stages=3,
                  indexing="tensor_descriptor"),
    helion.Config(block_sizes=[_N_TILE, 64, 64], num_warps=8, num_stages=2, indexing="pointer"),
    # The plain GEMM's fastest tiling on the H200 (persistent, tensor descriptors), for N <= 256.
    helion.Config(block_sizes=[_N_TILE, 128, 64], num_warps=8, num_stages=3, indexing="tensor_descriptor",
                  pid_type="persistent_interleaved"),
    # The plain GEMM's fastest tiling at 262144x512x128 (memory-bound N = 128: four warps, five
    # stages, the next tile's loads overlapping this tile's epilogue); too much shared memory for N > 128.
    helion.Config(block_sizes=[_N_TILE, 128, 64], num_warps=4, num_stages=5, indexing="tensor_descriptor",
                  pid_type="persistent_interleaved", range_flattens=[True]),
)

_TECHNIQUE = ("full-row post-norm (technique 1, PyTorch blog 'Towards Free Normalization', "
              "2026)")

SPEC_LAYERNORM = KernelSpec(
    name="matmul_layernorm",
    kernel=matmul_layernorm_kernel,
    workload="gemm",
    make_args=_make_args_layernorm,
    key_of=gemm_shape,
    reference=matmul_layernorm_reference,
    flops=gemm_flops,  # the norm's O(M N) FLOPs are negligible next to 2 M K N
    min_bytes=gemm_min_bytes,
    default_config=DEFAULT_CONFIG,
    seed_configs=SEED_CONFIGS,
    baselines=_baselines_layernorm,
    unfused_baselines=("cublas+inductor_norm", "cublas+liger_norm"),
    technique=_TECHNIQUE,
    norm_baseline="inductor_norm",
    gemm_twin="matmul",
    dispatch_baseline="cublas+inductor_norm",
    n_limit=max_full_row_n,
    dynamic_m=True,
    portable_config=portable_config,
    fit_config=fit_shared_memory,
    call_config=functools.partial(with_call_slots, first_optional=5),
    smaller_config=smaller_config,
)

SPEC_RMSNORM = dataclasses.replace(
    SPEC_LAYERNORM,
    name="matmul_rmsnorm",
    kernel=matmul_rmsnorm_kernel,
    make_args=_make_args_rmsnorm,
    reference=matmul_rmsnorm_reference,
    baselines=_baselines_rmsnorm,
    call_config=functools.partial(with_call_slots, first_optional=4),
)
