"""Full-row post-norm: ``layer_norm(a @ b)`` or ``rms_norm(a @ b)`` in one GEMM launch.

Technique 1 of the PyTorch blog "Towards Free Normalization: Fusing Normalization into GEMM
and Attention Kernels" (Meta, July 2026). If one program owns whole output rows (its tile is
``tile_m`` x N), the row statistics are a reduction over the fp32 accumulator already in
registers after the k-loop: the epilogue takes the mean (LayerNorm) and ``rstd``, normalises,
applies ``weight``/``bias`` and stores the result once. The un-normalised product never goes
to memory.

Row ownership is declared, not hoped for: the N tile is ``hl.register_block_size(Npad,
Npad)`` (Npad the next power of two of N), so no config splits a row. Padded columns of the
accumulator are 0 (masked loads of ``b``), but their deviation from the mean is not: they are
masked out of the variance. The LayerNorm variance is taken from the deviations (two passes
over the register tile), stable when the mean is large against the spread.

The limit: a [tile_m, Npad] fp32 accumulator and a [tile_k, Npad] tile of ``b`` per stage in
shared memory bound N (:func:`~helion_kernels.limits.max_full_row_n`: 2048 for bf16/fp16,
1024 for fp32 on H100/H200); larger N is the split-N technique's.

One kernel for both norms: ``layernorm`` (1 or 0) is specialised, so each norm compiles to
its own code. Config ``block_sizes`` = [N tile (fixed: any value is raised to Npad), tile_m,
tile_k].
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch

from ...limits import MIN_TILE_K, MIN_TILE_M, full_row_shared_memory, max_full_row_n, shared_memory_per_block
from ...spec import KernelSpec, Shape, gemm_shape, random_gemm_operands, reference_dtype

EPS = 1e-5
LAYERNORM, RMSNORM = 1, 0  # the kernels' ``layernorm`` argument


@helion.kernel(static_shapes=True)
def matmul_norm_kernel(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    layernorm: int,
    linear_bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    product: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """``norm(h, (N,), weight, bias, eps)`` of ``h = a @ b [+ linear_bias] [+ residual]``:
    (c [M, N] in ``a.dtype``, mean [M], rstd [M]) for ``layernorm=1``, (c, rstd) for
    ``layernorm=0`` (RMSNorm; ``bias`` must be None); fp32 accumulation and statistics.
    ``linear_bias`` [N] and ``residual`` [M, N] are added to the accumulator before the
    statistics; ``product`` [M, N] receives ``h`` un-normalised (what a backward needs)."""
    m, k = a.size()
    n = hl.specialize(b.size(1))
    ln = hl.specialize(layernorm)
    # min == max: a row is never split over programs, whatever the config says.
    block_n = hl.register_block_size(helion.next_power_of_2(n), helion.next_power_of_2(n))
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    if ln:
        mean = torch.empty([m], dtype=torch.float32, device=a.device)
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m, tile_n in hl.tile([m, n], block_size=[None, block_n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
        # the addends' loads and h's store right after the k-loop's loads (with_call_slots)
        if linear_bias is not None:
            acc = acc + linear_bias[tile_n].to(torch.float32)[None, :]
        if residual is not None:
            acc = acc + residual[tile_m, tile_n].to(torch.float32)
        if product is not None:
            # stored before the statistics: stored last, it kept acc live through the epilogue
            product[tile_m, tile_n] = acc.to(product.dtype)
        if ln:
            row_mean = torch.sum(acc, dim=1) / n  # padded columns of acc are 0
            in_row = (tile_n.index < n)[None, :]
            centered = torch.where(in_row, acc - row_mean[:, None], 0.0)
            var = torch.sum(centered * centered, dim=1) / n
            row_rstd = torch.rsqrt(var + eps)
            y = centered * row_rstd[:, None]
        else:
            in_row = (tile_n.index < n)[None, :]
            sq = torch.where(in_row, acc * acc, 0.0)
            row_rstd = torch.rsqrt(torch.sum(sq, dim=1) / n + eps)
            y = acc * row_rstd[:, None]
        if weight is not None:
            y = y * weight[tile_n].to(torch.float32)[None, :]
        if bias is not None:
            y = y + bias[tile_n].to(torch.float32)[None, :]
        c[tile_m, tile_n] = y.to(c.dtype)
        if ln:
            mean[tile_m] = row_mean
        rstd[tile_m] = row_rstd
    if ln:
        return c, mean, rstd
    return c, rstd


def _reference_h(a, b, linear_bias, residual, dt):
    """``a @ b [+ linear_bias] [+ residual]`` in ``dt``."""
    c = a.to(dt) @ b.to(dt)
    if linear_bias is not None:
        c = c + linear_bias.to(dt)
    return c if residual is None else c + residual.to(dt)


def matmul_norm_reference(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = EPS,
    layernorm: int = LAYERNORM,
    linear_bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    product: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """The kernel's outputs, unfused, in fp32 (float64 stays float64): (y, mean, rstd) for
    LayerNorm, (y, rstd) for RMSNorm."""
    dt = reference_dtype(a.dtype)
    c = _reference_h(a, b, linear_bias, residual, dt)
    if layernorm:
        mean = c.mean(dim=1)
        centered = c - mean[:, None]
        rstd = torch.rsqrt(centered.pow(2).mean(dim=1) + eps)
        y = centered * rstd[:, None]
    else:
        rstd = torch.rsqrt(c.pow(2).mean(dim=1) + eps)
        y = c * rstd[:, None]
    if weight is not None:
        y = y * weight.to(dt)
    if bias is not None:
        y = y + bias.to(dt)
    return (y, mean, rstd) if layernorm else (y, rstd)


def _affine_params(n: int, dtype: torch.dtype, device, seed: int | None, with_bias: bool):
    """weight ~ 1 + 0.1 N(0, 1), bias ~ 0.1 N(0, 1), drawn from ``seed + 1`` on ``device``."""
    if seed is None:
        return (torch.empty(n, dtype=dtype, device=device),
                torch.empty(n, dtype=dtype, device=device) if with_bias else None)
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    weight = 1 + 0.1 * torch.randn(n, generator=gen, device=device, dtype=torch.float32)
    bias = 0.1 * torch.randn(n, generator=gen, device=device, dtype=torch.float32) if with_bias else None
    return weight.to(dtype), None if bias is None else bias.to(dtype)


def norm_args(layernorm: int):
    """``make_args`` of one norm: (a, b, weight, bias, eps, layernorm), the affine norm (bias
    None for RMSNorm), the case tuned and benchmarked."""

    def make_args(shape: Shape, dtype: torch.dtype, device, seed: int | None) -> tuple:
        a, b = random_gemm_operands(shape, dtype, device, seed)
        weight, bias = _affine_params(shape.N, dtype, device, seed, with_bias=bool(layernorm))
        return a, b, weight, bias, EPS, layernorm

    return make_args


# block_sizes = [N tile, tile_m, tile_k]: the N tile's minimum and maximum are both Npad, so
# the 16 written here is raised to Npad at every N (Helion only raises block sizes).
_N_TILE = 16


def portable_config(config: helion.Config) -> helion.Config:
    """``config`` with its N tile reset to the minimum, so Helion raises it to the Npad of
    whatever shape it runs at."""
    return helion.Config(**{**config.config, "block_sizes": [_N_TILE, *config.block_sizes[1:]]})


def fit_shared_memory(config: helion.Config, args: tuple) -> helion.Config:
    """``config`` made to fit one block's shared memory at this call's N (a config tuned at a
    smaller N can need more than the GPU has at this Npad): estimated as
    :func:`~helion_kernels.limits.full_row_shared_memory`, and reduced by
    :func:`smaller_config` until it fits."""
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


FIRST_OPTIONAL = 6  # linear_bias, residual, product


def with_call_slots(config: helion.Config, args: tuple) -> helion.Config:
    """``config`` for a call that passes some of ``linear_bias``, ``residual`` and ``product``.

    The registry's configs are tuned without them, and a per-access ``indexing`` list has one
    slot per load and store in program order: each addend is one more load right after the
    k-loop's two, and the product one more store after those. The added slots are "pointer";
    a single indexing string needs nothing."""
    indexing = config.config.get("indexing")
    present = [isinstance(t, torch.Tensor) for t in args[FIRST_OPTIONAL:FIRST_OPTIONAL + 3]]
    if not isinstance(indexing, list) or not any(present):
        return config
    indexing = [*indexing[:2], *["pointer"] * sum(present), *indexing[2:]]
    return helion.Config(**{**config.config, "indexing": indexing})


# The smallest program, the one max_full_row_n is computed for: fits every N it accepts.
DEFAULT_CONFIG = helion.Config(block_sizes=[_N_TILE, MIN_TILE_M, MIN_TILE_K], num_warps=4, num_stages=1)

# Hopper seeds (64 or 128 rows per program, k-tile 64); one that does not fit at a large N is
# dropped like any seed that does not compile. The last two are the plain GEMM's fastest
# tilings (persistent, tensor descriptors), the last for N <= 128.
SEED_CONFIGS: tuple[helion.Config, ...] = (
    helion.Config(block_sizes=[_N_TILE, 64, 64], num_warps=4, num_stages=3, indexing="pointer"),
    helion.Config(block_sizes=[_N_TILE, 64, 64], num_warps=4, num_stages=2, indexing="tensor_descriptor"),
    helion.Config(block_sizes=[_N_TILE, 128, 64], num_warps=8, num_stages=2, indexing="pointer"),
    helion.Config(block_sizes=[_N_TILE, 128, 64], num_warps=8, num_stages=3, indexing="tensor_descriptor"),
    helion.Config(block_sizes=[_N_TILE, 64, 64], num_warps=8, num_stages=2, indexing="pointer"),
    helion.Config(block_sizes=[_N_TILE, 128, 64], num_warps=8, num_stages=3, indexing="tensor_descriptor",
                  pid_type="persistent_interleaved"),
    helion.Config(block_sizes=[_N_TILE, 128, 64], num_warps=4, num_stages=5, indexing="tensor_descriptor",
                  pid_type="persistent_interleaved", range_flattens=[True]),
)


def _spec(name: str, layernorm: int) -> KernelSpec:
    return KernelSpec(
        name=name,
        kernel=matmul_norm_kernel,
        workload="gemm",
        make_args=norm_args(layernorm),
        key_of=gemm_shape,
        reference=matmul_norm_reference,
        default_config=DEFAULT_CONFIG,
        seed_configs=SEED_CONFIGS,
        dispatch_baseline="cublas+inductor_norm",
        n_limit=max_full_row_n,
        dynamic_m=True,
        portable_config=portable_config,
        fit_config=fit_shared_memory,
        call_config=with_call_slots,
        smaller_config=smaller_config,
    )


SPEC_LAYERNORM = _spec("matmul_layernorm", LAYERNORM)
SPEC_RMSNORM = _spec("matmul_rmsnorm", RMSNORM)
