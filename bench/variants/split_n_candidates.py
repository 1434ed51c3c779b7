"""Measured, not shipped: split-N candidates 1 and 2, two kernels and one persistent launch.

Run on a CUDA machine from the checkout (it benchmarks both candidates against the unfused
pipelines over a GEMM workload, with the tilings tuned for the persistent kernel on the H200,
``bench/variants/configs/``)::

    python bench/variants/split_n_candidates.py --norm layernorm [--where 'K == 512']

Writes ``bench/results/<gpu>/variants/matmul_<norm>_persistent_<workload>.{csv,md,json,png}``.
The public split-N ops run the row sweep (:mod:`helion_kernels.techniques.split_n.kernels`),
which measured faster on 16 of the 20 rows of ``postnorm_split_n``.

Split-N post-norm: ``layer_norm(a @ b)`` / ``rms_norm(a @ b)`` when no program can hold a row.

Technique 3 of the PyTorch blog "Towards Free Normalization: Fusing Normalization into
GEMM and Attention Kernels" (Meta, July 2026). For large N the GEMM keeps its own tiling
(tile_n < N), so a row's statistics are spread over N / tile_n programs. The authors
exchange per-row partial statistics between the CTAs of a thread-block cluster through
distributed shared memory; Helion on Hopper has no cluster/DSMEM API, so the partials go
through global memory (a few bytes per row and tile, next to the tile itself):

* each GEMM program reduces its fp32 accumulator tile to per-row partials and writes the
  tile: for LayerNorm (count, tile mean, sum of squared deviations from the tile mean) and
  the tile **centred on its own mean** (small numbers, so rounding it to bf16 loses nothing
  even when a row's mean is large against its spread); for RMSNorm the sum of squares and
  the raw tile;
* a second phase combines a row's partials (Chan et al.'s pairwise formula for the
  variance, exact in any order: ``M2 = sum_j M2_j + cnt_j * (mean_j - mean)**2``) and
  normalises the tile in place, adding back ``mean_j - mean`` for LayerNorm.

Two ways to run the phases, both here:

1. two kernels, ``*_partials_kernel`` then ``*_apply_kernel`` (:func:`layernorm_two_kernels`,
   :func:`rmsnorm_two_kernels`): the apply kernel walks the N tiles of the GEMM's tiling
   (its ``tile_width`` argument), re-reading each tile, from L2 where it is still there;
2. one persistent launch, ``matmul_*_split_n_kernel``: phase 1, ``hl.barrier()`` (a
   grid-wide barrier between the top-level loops), phase 2. It saves a launch and the
   host round trip; the tile is re-read after *all* of phase 1 has finished.

The un-normalised tile still makes one round trip through memory, which the full-row
strategy avoids; what split-N saves against cuBLAS + a standalone norm is the norm's own
statistics pass and a launch.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import helion
import helion.language as hl
import torch

# This variant's tuned configs form the user registry layer (the shipped one stays below it).
os.environ.setdefault("HELION_KERNELS_CONFIG_DIR", str(Path(__file__).resolve().parent / "configs"))

from helion_kernels import registry  # noqa: E402
from helion_kernels.bench_specs import BENCH_SPECS, bench_spec  # noqa: E402
from helion_kernels.techniques.deferred.kernels import matmul_rmsnorm_partials_kernel  # noqa: E402
from helion_kernels.techniques.postnorm.kernels import LAYERNORM, RMSNORM, matmul_norm_reference, norm_args  # noqa: E402
from helion_kernels.spec import KernelSpec, gemm_shape  # noqa: E402


def matmul_layernorm_reference(a, b, weight=None, bias=None, eps=1e-5):
    return matmul_norm_reference(a, b, weight, bias, eps, LAYERNORM)


def matmul_rmsnorm_reference(a, b, weight=None, eps=1e-5):
    return matmul_norm_reference(a, b, weight, None, eps, RMSNORM)


def _layernorm_args(shape, dtype, device, seed) -> tuple:
    """(a, b, weight, bias, eps): the shipped spec's arguments without the norm flag."""
    return norm_args(LAYERNORM)(shape, dtype, device, seed)[:5]


def _rmsnorm_args(shape, dtype, device, seed) -> tuple:
    """(a, b, weight, eps)."""
    a, b, weight, _, eps, _ = norm_args(RMSNORM)(shape, dtype, device, seed)
    return a, b, weight, eps

EPS = 1e-5
# Memory-bound apply phase: rows per program (and, for RMSNorm, its own N tile).
APPLY_CONFIG = helion.Config(block_sizes=[8], num_warps=4, num_stages=1)
RMS_APPLY_CONFIG = helion.Config(block_sizes=[8, 256], num_warps=4, num_stages=1)

__all__ = [
    "APPLY_CONFIG",
    "RMS_APPLY_CONFIG",
    "SPEC_LAYERNORM",
    "SPEC_RMSNORM",
    "gemm_tile_width",
    "layernorm_apply_kernel",
    "layernorm_two_kernels",
    "matmul_layernorm_partials_kernel",
    "matmul_layernorm_reference",
    "matmul_layernorm_split_n_kernel",
    "matmul_rmsnorm_partials_kernel",
    "matmul_rmsnorm_reference",
    "matmul_rmsnorm_split_n_kernel",
    "rmsnorm_apply_kernel",
    "rmsnorm_two_kernels",
]


@helion.kernel(static_shapes=True)
def matmul_layernorm_partials_kernel(
    a: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Phase 1 for LayerNorm: ``a @ b`` tiles centred on their row means, and partials.

    Returns (c_centred [M, N] in ``a.dtype``, partials [M, T, 3] fp32 with T = cdiv(N,
    tile_n) and, per row and tile, (column count, mean, sum of squared deviations)).
    Config ``block_sizes`` = [tile_n, tile_m, tile_k].
    """
    m, k = a.size()
    n = hl.specialize(b.size(1))
    block_n = hl.register_block_size(helion.next_power_of_2(n))
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    partials = torch.empty([m, helion.cdiv(n, block_n), 3], dtype=torch.float32, device=a.device)
    for tile_m, tile_n in hl.tile([m, n], block_size=[None, block_n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
        in_row = (tile_n.index < n)[None, :]
        count = torch.sum(in_row.to(torch.float32), dim=1)  # [1]: the tile's real columns
        tile_mean = torch.sum(acc, dim=1) / count  # padded columns of acc are 0
        centred = torch.where(in_row, acc - tile_mean[:, None], 0.0)
        c[tile_m, tile_n] = centred.to(c.dtype)
        partials[tile_m, tile_n.id, 0] = tile_mean * 0.0 + count
        partials[tile_m, tile_n.id, 1] = tile_mean
        partials[tile_m, tile_n.id, 2] = torch.sum(centred * centred, dim=1)
    return c, partials


@helion.kernel(static_shapes=True)
def layernorm_apply_kernel(
    c: torch.Tensor,
    partials: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    tile_width: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Phase 2 for LayerNorm: combine the partials, normalise ``c`` in place.

    ``c`` and ``partials`` come from :func:`matmul_layernorm_partials_kernel` run with
    tile_n = ``tile_width``. Returns (y = ``c`` normalised, mean [M], rstd [M] fp32).
    Config ``block_sizes`` = [rows per program].
    """
    m, n = c.size()
    width = hl.specialize(tile_width)
    mean = torch.empty([m], dtype=torch.float32, device=c.device)
    rstd = torch.empty([m], dtype=torch.float32, device=c.device)
    for tile_m in hl.tile(m):
        count = partials[tile_m, :, 0]
        tile_means = partials[tile_m, :, 1]
        row_mean = torch.sum(count * tile_means, dim=1) / n
        spread = tile_means - row_mean[:, None]
        m2 = torch.sum(partials[tile_m, :, 2] + count * spread * spread, dim=1)
        row_rstd = torch.rsqrt(m2 / n + eps)
        for tile_n in hl.tile(n, block_size=width):
            shift = partials[tile_m, tile_n.id, 1] - row_mean
            y = (c[tile_m, tile_n].to(torch.float32) + shift[:, None]) * row_rstd[:, None]
            if weight is not None:
                y = y * weight[tile_n].to(torch.float32)[None, :]
            if bias is not None:
                y = y + bias[tile_n].to(torch.float32)[None, :]
            c[tile_m, tile_n] = y.to(c.dtype)
        mean[tile_m] = row_mean
        rstd[tile_m] = row_rstd
    return c, mean, rstd


# The persistent kernels repeat the phase bodies of the two-kernel pair: Helion 1.5 inlines
# helper functions, but not ones that index or slice (``x[:, None]``, ``weight[tile]``), so
# the shared pieces cannot be factored out yet.
@helion.kernel(static_shapes=True)
def matmul_layernorm_split_n_kernel(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both phases in one persistent launch, a grid-wide ``hl.barrier()`` between them.

    Returns (y [M, N] in ``a.dtype``, mean [M], rstd [M] fp32); the partials [M, T, 3]
    are scratch.
    Config ``block_sizes`` = [tile_n, tile_m, tile_k, rows per program in phase 2].
    """
    m, k = a.size()
    n = hl.specialize(b.size(1))
    block_n = hl.register_block_size(helion.next_power_of_2(n))
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    partials = torch.empty([m, helion.cdiv(n, block_n), 3], dtype=torch.float32, device=a.device)
    mean = torch.empty([m], dtype=torch.float32, device=a.device)
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m, tile_n in hl.tile([m, n], block_size=[None, block_n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
        in_row = (tile_n.index < n)[None, :]
        count = torch.sum(in_row.to(torch.float32), dim=1)
        tile_mean = torch.sum(acc, dim=1) / count
        centred = torch.where(in_row, acc - tile_mean[:, None], 0.0)
        c[tile_m, tile_n] = centred.to(c.dtype)
        partials[tile_m, tile_n.id, 0] = tile_mean * 0.0 + count
        partials[tile_m, tile_n.id, 1] = tile_mean
        partials[tile_m, tile_n.id, 2] = torch.sum(centred * centred, dim=1)
    hl.barrier()
    for tile_r in hl.tile(m):
        count = partials[tile_r, :, 0]
        tile_means = partials[tile_r, :, 1]
        row_mean = torch.sum(count * tile_means, dim=1) / n
        spread = tile_means - row_mean[:, None]
        m2 = torch.sum(partials[tile_r, :, 2] + count * spread * spread, dim=1)
        row_rstd = torch.rsqrt(m2 / n + eps)
        for tile_c in hl.tile(n, block_size=block_n):
            shift = partials[tile_r, tile_c.id, 1] - row_mean
            y = (c[tile_r, tile_c].to(torch.float32) + shift[:, None]) * row_rstd[:, None]
            if weight is not None:
                y = y * weight[tile_c].to(torch.float32)[None, :]
            if bias is not None:
                y = y + bias[tile_c].to(torch.float32)[None, :]
            c[tile_r, tile_c] = y.to(c.dtype)
        mean[tile_r] = row_mean
        rstd[tile_r] = row_rstd
    return c, mean, rstd


@helion.kernel(static_shapes=True)
def rmsnorm_apply_kernel(
    c: torch.Tensor, partials: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Phase 2 for RMSNorm: (y = ``c`` normalised in place, rstd [M] fp32).
    Config ``block_sizes`` = [rows per program, tile_n]."""
    m, n = c.size()
    rstd = torch.empty([m], dtype=torch.float32, device=c.device)
    for tile_m in hl.tile(m):
        row_rstd = torch.rsqrt(torch.sum(partials[tile_m, :], dim=1) / n + eps)
        for tile_n in hl.tile(n):
            y = c[tile_m, tile_n].to(torch.float32) * row_rstd[:, None]
            if weight is not None:
                y = y * weight[tile_n].to(torch.float32)[None, :]
            c[tile_m, tile_n] = y.to(c.dtype)
        rstd[tile_m] = row_rstd
    return c, rstd


@helion.kernel(static_shapes=True)
def matmul_rmsnorm_split_n_kernel(
    a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both RMSNorm phases in one persistent launch with ``hl.barrier()`` between them.

    Returns (y [M, N] in ``a.dtype``, rstd [M] fp32); the partials [M, T] are scratch.
    Config ``block_sizes`` = [tile_n, tile_m, tile_k, rows per program in phase 2,
    tile_n of phase 2].
    """
    m, k = a.size()
    n = hl.specialize(b.size(1))
    block_n = hl.register_block_size(helion.next_power_of_2(n))
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    partials = torch.empty([m, helion.cdiv(n, block_n)], dtype=torch.float32, device=a.device)
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m, tile_n in hl.tile([m, n], block_size=[None, block_n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
        c[tile_m, tile_n] = acc.to(c.dtype)
        partials[tile_m, tile_n.id] = torch.sum(acc * acc, dim=1)
    hl.barrier()
    for tile_r in hl.tile(m):
        row_rstd = torch.rsqrt(torch.sum(partials[tile_r, :], dim=1) / n + eps)
        for tile_c in hl.tile(n):
            y = c[tile_r, tile_c].to(torch.float32) * row_rstd[:, None]
            if weight is not None:
                y = y * weight[tile_c].to(torch.float32)[None, :]
            c[tile_r, tile_c] = y.to(c.dtype)
        rstd[tile_r] = row_rstd
    return c, rstd


def gemm_tile_width(n: int, num_tiles: int) -> int:
    """The N tile the partials kernel ran with, from N and its number of tiles T.

    Helion's block sizes are powers of two, and for T >= 2, cdiv(N, W) strictly decreases
    as the power of two W doubles, so W = next_power_of_2(cdiv(N, T)) is the only one;
    for T = 1 any W >= N gives one tile, and so does this one.
    """
    return helion.next_power_of_2(-(-n // num_tiles))


def _bound(kernel, args: tuple, config: helion.Config | None):
    bound = kernel.bind(args)
    if config is not None:
        bound.set_config(config)
    return bound


def layernorm_two_kernels(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = EPS,
    gemm_config: helion.Config | None = None,
    apply_config: helion.Config | None = APPLY_CONFIG,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Candidate 1 for LayerNorm: partials kernel, then apply kernel.

    Args:
        a: [M, K], b: [K, N] (bf16, fp16 or fp32, one device); weight, bias: [N] or None.
        gemm_config: config of :func:`matmul_layernorm_partials_kernel`
            (``block_sizes`` = [tile_n, tile_m, tile_k]); None: Helion's default for it
            (reference mode needs None).
        apply_config: config of :func:`layernorm_apply_kernel` (None in reference mode).

    Returns:
        (y [M, N] in ``a.dtype``, mean [M], rstd [M] fp32).
    """
    gemm = _bound(matmul_layernorm_partials_kernel, (a, b), gemm_config)
    c, partials = gemm(a, b)
    args = (c, partials, weight, bias, float(eps), gemm_tile_width(b.shape[1], partials.shape[1]))
    return _bound(layernorm_apply_kernel, args, apply_config)(*args)


def rmsnorm_two_kernels(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = EPS,
    gemm_config: helion.Config | None = None,
    apply_config: helion.Config | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate 1 for RMSNorm: partials kernel, then apply kernel.

    Same arguments as :func:`layernorm_two_kernels` without ``bias``; ``apply_config``'s
    ``block_sizes`` = [rows per program, tile_n]. Returns (y [M, N], rstd [M] fp32).
    """
    c, partials = _bound(matmul_rmsnorm_partials_kernel, (a, b), gemm_config)(a, b)
    args = (c, partials, weight, float(eps))
    return _bound(rmsnorm_apply_kernel, args, apply_config)(*args)


# Hopper GEMM tilings for phase 1 (block_sizes [tile_n, tile_m, tile_k, phase-2 rows, ...]).
# reduction_loops=[None]: phase 2 reduces a row's T = cdiv(N, tile_n) partials in one
# next_pow2(T)-wide block. T is symbolic to Helion, whose default for large M is a
# 4096-wide masked loop per row tile (what the first H200 tuning ran, see bench/NOTES.md).
_ONE_BLOCK = {"reduction_loops": [None]}
_SEEDS_LN = tuple(
    helion.Config(block_sizes=[tn, tm, 64, 8], num_warps=w, num_stages=st, indexing=ix, **_ONE_BLOCK)
    for tn, tm, w, st, ix in ((256, 128, 8, 4, "pointer"), (128, 128, 4, 4, "pointer"),
                              (128, 128, 8, 3, "tensor_descriptor"), (128, 64, 4, 4, "pointer"))
)
_SEEDS_RMS = tuple(
    helion.Config(**{**cfg.config, "block_sizes": [*cfg.block_sizes, 256]}) for cfg in _SEEDS_LN
)

_TECHNIQUE = ("split-N post-norm, one persistent launch with a grid barrier (technique 3, "
              "PyTorch blog 'Towards Free Normalization', 2026)")

def phase1_config(persistent: dict) -> helion.Config:
    """The phase-1 (partials kernel) part of a persistent kernel's config (its JSON dict): the
    GEMM tiling, warps, stages, indexing and L2 grouping; not the persistent pid_type, nor
    the phase-2 ``reduction_loops``, which the partials kernel has none of (Helion refuses it)."""
    keep = ("num_warps", "num_stages", "indexing", "l2_groupings")
    return helion.Config(block_sizes=persistent["block_sizes"][:3],
                         **{key: persistent[key] for key in keep if key in persistent})


def _phase1_config(spec: KernelSpec, args: tuple) -> helion.Config:
    """The registered persistent config's phase-1 tiling, for the two-kernel candidate."""
    found = registry.lookup(spec.name, spec.key_of(args), args[0].dtype, registry.gpu_key(args[0].device))
    return phase1_config(spec.default_config.config if found.entry is None else found.entry.config)


def _baselines_layernorm(a, b, weight, bias, eps) -> dict:
    """The unfused pipelines, plus candidate 1 (two kernels) with the persistent candidate's
    registered phase-1 tiling, so the benchmark times both candidates side by side."""
    out = bench_spec("matmul_layernorm").baselines(a, b, weight, bias, eps, LAYERNORM)
    gemm = _phase1_config(SPEC_LAYERNORM, (a, b, weight, bias, eps))
    out["two_kernels"] = lambda: layernorm_two_kernels(a, b, weight, bias, eps, gemm, APPLY_CONFIG)
    return out


def _baselines_rmsnorm(a, b, weight, eps) -> dict:
    out = bench_spec("matmul_rmsnorm").baselines(a, b, weight, None, eps, RMSNORM)
    gemm = _phase1_config(SPEC_RMSNORM, (a, b, weight, eps))
    out["two_kernels"] = lambda: rmsnorm_two_kernels(a, b, weight, eps, gemm, RMS_APPLY_CONFIG)
    return out


# The persistent variant is the tunable, registrable one (outputs equal the reference's).
# The two-kernel variant runs the partials kernel with the persistent variant's phase-1
# tiling and the apply kernel with APPLY_CONFIG; the benchmark times it as "two_kernels".
SPEC_LAYERNORM = KernelSpec(
    name="matmul_layernorm_persistent",
    kernel=matmul_layernorm_split_n_kernel,
    workload="gemm",
    make_args=_layernorm_args,
    key_of=gemm_shape,
    reference=matmul_layernorm_reference,
    default_config=helion.Config(block_sizes=[64, 64, 32, 8], num_warps=4, num_stages=2, **_ONE_BLOCK),
    seed_configs=_SEEDS_LN,
)
SPEC_RMSNORM = dataclasses.replace(
    SPEC_LAYERNORM,
    name="matmul_rmsnorm_persistent",
    kernel=matmul_rmsnorm_split_n_kernel,
    make_args=_rmsnorm_args,
    reference=matmul_rmsnorm_reference,
    default_config=helion.Config(block_sizes=[64, 64, 32, 8, 128], num_warps=4, num_stages=2, **_ONE_BLOCK),
    seed_configs=_SEEDS_RMS,
)
BENCH_SPECS[SPEC_LAYERNORM.name] = dataclasses.replace(bench_spec("matmul_layernorm"), technique=_TECHNIQUE,
                                                       baselines=_baselines_layernorm)
BENCH_SPECS[SPEC_RMSNORM.name] = dataclasses.replace(bench_spec("matmul_rmsnorm"), technique=_TECHNIQUE,
                                                     baselines=_baselines_rmsnorm)


def main() -> int:
    from helion_kernels.benchmark import RESULTS_DIR, run_benchmark, workload_script_args, write_results
    from helion_kernels.workloads import problems

    args, table = workload_script_args(
        "Benchmark split-N candidates 1 (two kernels) and 2 (persistent launch)",
        lambda p: p.add_argument("--norm", choices=["layernorm", "rmsnorm"], default="layernorm"))
    spec = SPEC_LAYERNORM if args.norm == "layernorm" else SPEC_RMSNORM
    df, meta = run_benchmark(spec, problems(table), torch.bfloat16, torch.device("cuda"))
    stem = f"{spec.name}_{args.workload}" + (f"_{args.where}" if args.where else "")
    out = args.out or RESULTS_DIR / meta["gpu_key"] / "variants"
    print("wrote", ", ".join(map(str, write_results(df, meta, out, "".join(c if c.isalnum() else "_" for c in stem)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
