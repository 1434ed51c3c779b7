"""The one small object each fusion strategy exposes to the rest of the package.

Registry, tuning, benchmark and CLI code are generic over :class:`KernelSpec`; adding a
strategy means adding one module under ``helion_kernels/kernels/`` that builds a spec.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import helion
import torch


class Shape(NamedTuple):
    """A GEMM problem size: ``a`` is [M, K], ``b`` is [K, N], the output [M, N]."""

    M: int
    K: int
    N: int

    def __str__(self) -> str:
        return f"{self.M}x{self.K}x{self.N}"


class AttentionShape(NamedTuple):
    """Registry key of the jagged attention kernels: heads H and head_dim D.

    Their configs do not depend on the sequence lengths (total_q changes every batch, so
    the kernels are compiled for dynamic lengths and specialised on H and D only).
    """

    H: int
    D: int

    def __str__(self) -> str:
        return f"H{self.H}xD{self.D}"


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """What the package needs to know about one Helion kernel.

    Attributes:
        name: registry and CLI name, e.g. ``"rmsnorm_matmul"``.
        kernel: the Helion kernel. Its hard tile constraints are declared inside it.
        make_args: ``(shape, dtype, device, seed) -> args``: fresh random kernel arguments
            for a workload row, scaled so the output has unit variance; with
            ``seed=None``, uninitialised tensors (for compiling or code generation only).
        shape_of: ``args -> Shape``, the registry key of a call.
        reference: ``*args -> tuple[Tensor, ...]``, the same outputs computed in fp32
            (float64 for float64 inputs) with plain PyTorch.
        flops: ``Shape -> int``, floating-point operations of the fused op.
        min_bytes: ``(Shape, dtype) -> int``, fewest device-memory bytes the op must move
            (each input read once, each output written once).
        default_config: used when the registry holds no config at all for a GPU.
        seed_configs: hand-picked configs that seed every autotuning run.
        baselines: ``*args -> dict[name, zero-arg callable]``: the unfused alternatives a
            user has (cuBLAS GEMM plus a standalone norm, ...), for the benchmark.
        norm_baseline: key in ``baselines`` of the standalone norm whose latency the
            "latency saved" metric is a percentage of; None for kernels without a norm.
        unfused_baselines: keys in ``baselines`` of complete unfused pipelines.
        gemm_twin: name of the plain Helion GEMM spec tuned the same way (the blog's
            metric compares the fused kernel against it); None for the GEMM itself.
        technique: one line naming the technique and its source.
        dispatch_baseline: key in ``baselines`` of the unfused pipeline the fused kernel
            must beat to be used at all: tuning times both and records the choice in the
            registry entry, and the public function runs whichever won (None: always fused).
        portable_config: ``Config -> Config`` applied to a config before it is saved and
            before it is used, so that a config tuned at one shape is valid at another
            (e.g. the full-row kernels reset their whole-row N tile, which Helion raises to
            each shape's minimum). None: configs are used as they are.
        fit_config: ``(config, args) -> config`` applied to a config that was *not* tuned at
            the call's exact shape (the nearest shape's, or the default) before it is
            compiled, so that it fits the call's shape on its device (e.g. fewer pipeline
            stages for a wider whole-row tile). None: used as it is.
    """

    name: str
    kernel: helion.Kernel
    make_args: Callable[[Shape, torch.dtype, torch.device, int | None], tuple]
    shape_of: Callable[[tuple], Shape]
    reference: Callable[..., tuple[torch.Tensor, ...]]
    flops: Callable[[Shape], int]
    min_bytes: Callable[[Shape, torch.dtype], int]
    default_config: helion.Config
    seed_configs: tuple[helion.Config, ...]
    baselines: Callable[..., dict[str, Callable[[], object]]]
    norm_baseline: str | None
    unfused_baselines: tuple[str, ...]
    gemm_twin: str | None
    technique: str
    dispatch_baseline: str | None = None
    portable_config: Callable[[helion.Config], helion.Config] | None = None
    fit_config: Callable[[helion.Config, tuple], helion.Config] | None = None


def random_gemm_operands(
    shape: Shape, dtype: torch.dtype, device: torch.device | str, seed: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ``a`` [M, K] ~ N(0, 1) and ``b`` [K, N] ~ N(0, 1/K), drawn from ``seed``.

    Scaling ``b`` by 1/sqrt(K) keeps ``rmsnorm(a) @ b`` and ``a @ b`` at unit variance, so
    absolute and relative tolerances mean the same thing at every K. ``seed=None`` gives
    uninitialised tensors, for compiling only.
    """
    if seed is None:
        return (torch.empty(shape.M, shape.K, dtype=dtype, device=device),
                torch.empty(shape.K, shape.N, dtype=dtype, device=device))
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(shape.M, shape.K, generator=gen, device=device, dtype=torch.float32)
    b = torch.randn(shape.K, shape.N, generator=gen, device=device, dtype=torch.float32)
    return a.to(dtype), (b * shape.K**-0.5).to(dtype)


def gemm_shape(args: tuple) -> Shape:
    """The (M, K, N) of a call whose first two arguments are ``a`` [M, K], ``b`` [K, N]."""
    a, b = args[0], args[1]
    return Shape(int(a.shape[0]), int(a.shape[1]), int(b.shape[1]))


def gemm_min_bytes(shape: Shape, dtype: torch.dtype) -> int:
    """Read ``a`` and ``b`` once, write ``c`` once."""
    item = torch.empty((), dtype=dtype).element_size()
    return item * (shape.M * shape.K + shape.K * shape.N + shape.M * shape.N)


def gemm_flops(shape: Shape) -> int:
    return 2 * shape.M * shape.K * shape.N


def reference_dtype(dtype: torch.dtype) -> torch.dtype:
    """Precision of a reference computation: float64 stays float64, the rest go to fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# Hopper-friendly GEMM tilings that seed every search (each is checked for legality by
# Helion at the shape; a seed that does not compile is simply dropped by the autotuner).
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
GEMM_SEED_CONFIGS: tuple[helion.Config, ...] = (
    SEED_POINTER_128x256, SEED_TMA_PERSISTENT_128x128, SEED_TMA_FLAT_128x256, SEED_POINTER_128x128,
    SEED_POINTER_64x128,
)

# A small, conservative tiling that compiles for any shape on any CUDA GPU.
GEMM_DEFAULT_CONFIG = helion.Config(block_sizes=[64, 64, 32], num_warps=4, num_stages=3)
