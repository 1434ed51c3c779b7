"""The plain Helion GEMM ``c = a @ b``: the fused kernels' GEMM without the norm, tuned and
registered like them, so that the blog's "latency saved against the Helion GEMM" compares
like with like. Structure as Helion's ``examples/matmul.py``; its seed tilings seed every
GEMM-shaped search."""

from __future__ import annotations

import helion
import helion.language as hl
import torch

from ...spec import KernelSpec, Shape, gemm_shape, random_gemm_operands, reference_dtype

# Hopper tilings that seed every GEMM-shaped search (one that does not compile at a shape is
# dropped by the autotuner). bench/NOTES.md records which won where.
SEED_TMA_PERSISTENT_128x256 = helion.Config(
    block_sizes=[128, 256, 64], num_warps=8, num_stages=3, indexing="tensor_descriptor",
    pid_type="persistent_interleaved", l2_groupings=[8])
SEED_TMA_PERSISTENT_128x128 = helion.Config(
    block_sizes=[128, 128, 64], num_warps=8, num_stages=3, indexing="tensor_descriptor",
    pid_type="persistent_interleaved", l2_groupings=[8])
SEED_TMA_FLAT_128x256 = helion.Config(
    block_sizes=[128, 256, 64], num_warps=8, num_stages=3, indexing="tensor_descriptor",
    l2_groupings=[8])
SEED_POINTER_128x128 = helion.Config(
    block_sizes=[128, 128, 64], num_warps=4, num_stages=4, indexing="pointer", l2_groupings=[8])
SEED_POINTER_128x256 = helion.Config(
    block_sizes=[128, 256, 64], num_warps=8, num_stages=4, indexing="pointer", l2_groupings=[2])
SEED_POINTER_64x128 = helion.Config(
    block_sizes=[64, 128, 64], num_warps=4, num_stages=4, indexing="pointer", l2_groupings=[4])
# The persistent tile loop flattened into the k-loop: the next tile's loads overlap this
# tile's epilogue.
SEED_TMA_PERSISTENT_128x256_FLATTENED = helion.Config(
    block_sizes=[128, 256, 64], num_warps=8, num_stages=3, indexing="tensor_descriptor",
    pid_type="persistent_interleaved", l2_groupings=[8], range_flattens=[True])
# tile_n = 128, four warps, five stages, flattened: for memory-bound N = 128.
SEED_TMA_PERSISTENT_128x128_W4_S5_FLATTENED = helion.Config(
    block_sizes=[128, 128, 64], num_warps=4, num_stages=5, indexing="tensor_descriptor",
    pid_type="persistent_interleaved", l2_groupings=[8], range_flattens=[True])
GEMM_SEED_CONFIGS: tuple[helion.Config, ...] = (
    SEED_TMA_PERSISTENT_128x256, SEED_POINTER_128x256, SEED_TMA_PERSISTENT_128x128, SEED_TMA_FLAT_128x256, SEED_POINTER_128x128,
    SEED_POINTER_64x128, SEED_TMA_PERSISTENT_128x256_FLATTENED, SEED_TMA_PERSISTENT_128x128_W4_S5_FLATTENED,
)

# A small, conservative tiling that compiles for any shape on any CUDA GPU.
GEMM_DEFAULT_CONFIG = helion.Config(block_sizes=[64, 64, 32], num_warps=4, num_stages=3)


@helion.kernel(static_shapes=True)
def matmul_kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a`` [M, K] @ ``b`` [K, N] -> [M, N] in ``a.dtype``, fp32 accumulation."""
    m, k = a.size()
    _, n = b.size()
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
        c[tile_m, tile_n] = acc.to(c.dtype)
    return c


def matmul_reference(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor]:
    """``a @ b`` in fp32 (float64 for float64 inputs)."""
    dt = reference_dtype(a.dtype)
    return (a.to(dt) @ b.to(dt),)


def _make_args(shape: Shape, dtype: torch.dtype, device, seed: int | None) -> tuple:
    return random_gemm_operands(shape, dtype, device, seed)


SPEC = KernelSpec(
    name="matmul",
    kernel=matmul_kernel,
    workload="gemm",
    make_args=_make_args,
    key_of=gemm_shape,
    reference=matmul_reference,
    default_config=GEMM_DEFAULT_CONFIG,
    seed_configs=GEMM_SEED_CONFIGS,
    same_loops_as=("rmsnorm_matmul_given_rstd", "layernorm_matmul_given_stats"),  # its loops, an epilogue
    dynamic_m=True,
)
