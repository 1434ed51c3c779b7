"""What running and tuning a kernel needs: :class:`KernelSpec`, and the problem types.

Registry, runtime and tuning are generic over specs. The leaf of the package: it imports
neither Helion nor any other module of the package.

Two kinds of problem, told apart by ``KernelSpec.workload``:

* ``"gemm"``: a workload row is a :class:`Shape` (M, K, N), which is also the registry key;
* ``"attention"``: a workload row is an :class:`AttentionRow` (a jagged batch), whose
  registry key is :class:`AttentionShape` (H, D): the jagged kernels are compiled for
  dynamic sequence totals, so their configs depend on H and D only.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import torch

if TYPE_CHECKING:  # Helion is imported by the kernel modules only (it takes seconds)
    import helion


class Shape(NamedTuple):
    """A GEMM problem size: ``a`` is [M, K], ``b`` is [K, N], the output [M, N]."""

    M: int
    K: int
    N: int

    def __str__(self) -> str:
        return f"{self.M}x{self.K}x{self.N}"

    @property
    def key(self) -> "Shape":
        """Registry key: the shape itself."""
        return self

    def columns(self) -> dict:
        """The columns a result row gets for this problem."""
        return self._asdict()

    def for_codegen(self) -> "Shape":
        """The problem to generate code for (static shapes: the shape itself)."""
        return self


# The attention table (configs/attention_workloads/) every attention kernel is tuned on.
ATTENTION_WORKLOAD = "flash_norm_attention"


class AttentionShape(NamedTuple):
    """Registry key of the jagged attention kernels: heads H and head_dim D."""

    H: int
    D: int

    def __str__(self) -> str:
        return f"H{self.H}xD{self.D}"


@dataclasses.dataclass(frozen=True)
class AttentionRow:
    """One row of an attention workload: ``batch`` sequences of H heads of width D, Q lengths
    drawn by :func:`jagged_lengths` (``fill``, ``seed``), every KV sequence ``seq_len_kv`` rows."""

    batch: int
    H: int
    D: int
    max_seq_len_q: int
    seq_len_kv: int
    fill: float
    seed: int

    @property
    def key(self) -> AttentionShape:
        return AttentionShape(self.H, self.D)

    def __str__(self) -> str:
        return f"H{self.H} D{self.D} q<={self.max_seq_len_q}"

    def q_lengths(self) -> list[int]:
        return jagged_lengths(self.batch, self.max_seq_len_q, self.fill, self.seed)

    def columns(self) -> dict:
        return {**dataclasses.asdict(self), "total_q": sum(self.q_lengths())}

    def for_codegen(self) -> "AttentionRow":
        """A small batch of the same (H, D): the kernels are compiled for dynamic lengths."""
        return dataclasses.replace(self, batch=2, max_seq_len_q=16)


def jagged_lengths(batch: int, max_len: int, fill: float = 0.5, seed: int = 0) -> list[int]:
    """``batch`` sequence lengths drawn uniformly from [0, 2 * fill * max_len] (clipped to
    max_len), so the average fill is ``fill`` for fill <= 0.5; reproducible from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    upper = min(max_len, round(2 * fill * max_len))
    return torch.randint(0, upper + 1, (batch,), generator=gen).tolist()


Problem = Any  # Shape or AttentionRow: has .key, .columns(), .for_codegen()


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """What running and tuning one Helion kernel needs (what measuring it needs is its
    :class:`~.bench_specs.BenchSpec`).

    Attributes:
        name: the registry file and ``--kernel`` name, e.g. ``"rmsnorm_matmul"``.
        kernel: the Helion kernel; its hard tile constraints are declared inside it.
        workload: ``"gemm"`` or ``"attention"``: which workload tables it is tuned on.
        make_args: ``(problem, dtype, device, seed) -> args``: fresh random kernel arguments,
            scaled so the output has unit variance; ``seed=None`` may give uninitialised
            tensors (for code generation only).
        key_of: ``args -> key``, the registry key of a call.
        reference: ``*args -> tuple[Tensor, ...]``, the outputs in fp32 (float64 for
            float64 inputs) with plain PyTorch.
        default_config: used when the registry holds no config for the GPU.
        seed_configs: hand-picked configs that seed every autotuning run.
        dispatch_baseline: the name of the unfused pipeline the fused kernel must beat to
            run at all (:func:`~.runtime.decide` reads the registry's record of that race);
            None: always fused.
        same_loops_as: specs whose kernels have this one's loop nest (one's config runs the
            other): tuning at a shape also seeds the search with their entries there.
        portable_config: ``Config -> Config`` applied before a config is saved or used, so
            that a config tuned at one shape is valid at another.
        fit_config: ``(config, args) -> config`` for a config not tuned at the call's exact
            shape on this GPU (e.g. fewer stages for a wider whole-row tile).
        call_config: ``(config, args) -> config`` for what a call adds to the tuned kernel
            (e.g. an optional output's store slot in ``indexing``).
        smaller_config: ``config -> config | None``, the next smaller program for a config
            the GPU refused at launch for want of shared memory (:func:`~.runtime.launch`).
        compare_outputs: ``outputs -> outputs`` before they are compared with the reference.
        n_limit: ``(dtype, device) -> int``, the largest N the kernel takes; past it the op
            runs unfused. None: any N.
        dynamic_m: a call at a shape not tuned exactly, with M >= 2, runs the kernel's
            dynamic-shape build (compiled once per config, not once per M).
        warn_default: warn where the registry has no entry and the default runs; False for a
            kernel whose default is what its op ran before it could be tuned.
    """

    name: str
    kernel: "helion.Kernel"
    workload: str
    make_args: Callable[..., tuple]
    key_of: Callable[[tuple], Any]
    reference: Callable[..., tuple[torch.Tensor, ...]]
    default_config: "helion.Config"
    seed_configs: tuple
    dispatch_baseline: str | None = None
    same_loops_as: tuple[str, ...] = ()
    portable_config: Callable[["helion.Config"], "helion.Config"] | None = None
    fit_config: Callable[["helion.Config", tuple], "helion.Config"] | None = None
    call_config: Callable[["helion.Config", tuple], "helion.Config"] | None = None
    smaller_config: Callable[["helion.Config"], "helion.Config | None"] | None = None
    compare_outputs: Callable[[tuple], tuple] | None = None
    n_limit: Callable[[torch.dtype, Any], int] | None = None
    dynamic_m: bool = False
    warn_default: bool = True


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


def reference_dtype(dtype: torch.dtype) -> torch.dtype:
    """Precision of a reference computation: float64 stays float64, the rest go to fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
