"""The one small object each fusion strategy exposes to the rest of the package.

Registry, tuning, benchmark and CLI are generic over :class:`KernelSpec`; adding a strategy
means adding one kernel module (``helion_kernels/kernels/``) that builds a spec, one ops
module and, if it needs one, a workload table. This module is the leaf of the package: it
imports neither Helion nor any other module of the package, so everything can read it.

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
    """What the package needs to know about one tunable Helion kernel.

    Attributes:
        name: the public op, registry file and ``--kernel`` name, e.g. ``"rmsnorm_matmul"``.
        kernel: the Helion kernel. Its hard tile constraints are declared inside it.
        workload: ``"gemm"`` or ``"attention"``: which workload tables (and problem type) it
            is tuned and benchmarked on.
        make_args: ``(problem, dtype, device, seed) -> args``: fresh random kernel arguments,
            scaled so the output has unit variance; ``seed=None`` may give uninitialised
            tensors (for code generation only).
        key_of: ``args -> key``, the registry key of a call (:class:`Shape` or
            :class:`AttentionShape`).
        reference: ``*args -> tuple[Tensor, ...]``, the outputs computed in fp32 (float64
            for float64 inputs) with plain PyTorch.
        flops: ``problem -> int``, floating-point operations of the fused op.
        min_bytes: ``(problem, dtype) -> int``, fewest device-memory bytes the op must move.
        default_config: used when the registry holds no config for the GPU.
        seed_configs: hand-picked configs that seed every autotuning run.
        baselines: ``*args -> dict[name, zero-arg callable]``: the unfused alternatives a user
            has (cuBLAS GEMM plus a standalone norm, the compiled PyTorch block, ...).
        unfused_baselines: keys in ``baselines`` of complete unfused pipelines (the
            speed-ups are against these).
        technique: one line naming the technique and its source.
        norm_baseline: key in ``baselines`` of the standalone norm whose latency the "latency
            saved" metric is a percentage of; None: no such metric.
        gemm_twin: name of the plain Helion GEMM spec (the blog's metric compares the fused
            kernel against it); None for kernels without one.
        same_loops_as: names of other specs whose kernels have this one's loop nest and block
            sizes (one's config runs the other): autotuning at a shape also seeds the search
            with their registry entries at exactly that shape (the plain GEMM and the GEMM
            scaled by a given rstd: a 30 s search of one found 3-6% faster configs than the
            other's entry at two M = 131072 rows on the H200, bench/NOTES.md, twenty-second
            session). Declared on both sides.
        checked_baselines: keys in ``baselines`` whose outputs the benchmark also checks
            against the reference (a wrong baseline would make the comparison meaningless).
        plot_relative_to: key in ``baselines`` the benchmark plot divides latencies by.
        aim: speed-up over the best unfused pipeline the plot marks; None: no mark.
        dispatch_baseline: key in ``baselines`` of the unfused pipeline the fused kernel must
            beat to be used at all: tuning times both and records the winner in the registry
            entry, and the public op runs it. None: always fused.
        dispatch_alternatives: keys in ``baselines`` of other unfused pipelines the op can
            run instead of ``dispatch_baseline`` (``"cublas+liger_norm"``: Liger's norm, present
            in ``baselines`` only where liger-kernel is installed): tuning times them too, and
            the entry names the fastest by the dispatch margin as the op's unfused path
            (:func:`~.tuning.dispatch_decision`); the op must be able to run each
            (:mod:`.liger_norm`).
        dispatch_fused: ``(run, args) -> zero-arg callable``: the fused pipeline that tuning
            times against ``dispatch_baseline``, where ``run(*args)`` launches the tuned
            kernel (for an op whose kernel is one of two launches, e.g. the deferred
            post-norm's producer GEMM and its consumer). None: the kernel alone.
        portable_config: ``Config -> Config`` applied before a config is saved and before it
            is used, so that a config tuned at one shape is valid at another.
        fit_config: ``(config, args) -> config`` applied to a config that was not tuned at
            the call's exact shape on this GPU before it is compiled (e.g. fewer pipeline
            stages for a wider whole-row tile). None: used as it is.
        call_config: ``(config, args) -> config`` applied to every config (tuned at this
            shape or not) before it is compiled for a call, for what the call adds to the
            tuned kernel (e.g. an optional output's store slot in ``indexing``).
        smaller_config: ``config -> config | None``, the next smaller program (fewer
            pipeline stages, then smaller tiles) for a config the GPU refused at launch for
            want of shared memory (:func:`~.runtime.launch`); None where there is none.
            None: such a launch fails.
        compare_outputs: ``outputs -> outputs`` applied to the kernel's outputs before they
            are compared with the reference's (e.g. tile partials summed to a row total).
        n_limit: ``(dtype, device) -> int``, the largest N the kernel takes (the full-row
            kernels hold a whole row in one tile); past it the op runs unfused. None: any N.
        dynamic_m: a call at a shape not tuned exactly, with M >= 2, runs a build of the
            kernel with dynamic shapes (``static_shapes=False``), compiled once per config
            rather than once per M, so a new token count costs no compile in the step
            (``bench/variants/dynamic_m.py`` on the H200: the GEMM and pre-norm builds 0-4%
            slower than the static one at the same config, the full-row builds 1-7% at M >=
            65536 and 6-14% at M = 8192, where the kernel takes 5 us). Exactly tuned shapes
            and M = 1 keep the static build (:func:`~.runtime.uses_dynamic_build`).
    """

    name: str
    kernel: "helion.Kernel"
    workload: str
    make_args: Callable[..., tuple]
    key_of: Callable[[tuple], Any]
    reference: Callable[..., tuple[torch.Tensor, ...]]
    flops: Callable[[Problem], int]
    min_bytes: Callable[[Problem, torch.dtype], int]
    default_config: "helion.Config"
    seed_configs: tuple
    baselines: Callable[..., dict[str, Callable[[], object]]]
    unfused_baselines: tuple[str, ...]
    technique: str
    norm_baseline: str | None = None
    gemm_twin: str | None = None
    same_loops_as: tuple[str, ...] = ()
    checked_baselines: tuple[str, ...] = ()
    plot_relative_to: str = "cublas_mm"
    aim: float | None = None
    dispatch_baseline: str | None = None
    dispatch_alternatives: tuple[str, ...] = ()
    dispatch_fused: Callable[[Callable[..., Any], tuple], Callable[[], object]] | None = None
    portable_config: Callable[["helion.Config"], "helion.Config"] | None = None
    fit_config: Callable[["helion.Config", tuple], "helion.Config"] | None = None
    compare_outputs: Callable[[tuple], tuple] | None = None
    call_config: Callable[["helion.Config", tuple], "helion.Config"] | None = None
    smaller_config: Callable[["helion.Config"], "helion.Config | None"] | None = None
    dynamic_m: bool = False
    n_limit: Callable[[torch.dtype, Any], int] | None = None


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
    return dtype.itemsize * (shape.M * shape.K + shape.K * shape.N + shape.M * shape.N)


def gemm_flops(shape: Shape) -> int:
    return 2 * shape.M * shape.K * shape.N


def reference_dtype(dtype: torch.dtype) -> torch.dtype:
    """Precision of a reference computation: float64 stays float64, the rest go to fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
