"""Which formulation of ``rmsnorm(a) @ b`` is correct and fast on this GPU?

The in-loop formulation (the sum of squares accumulated in the GEMM's k-loop) raced on H200
with Triton 3.6 (bench/NOTES.md). This script compares, per shape and per tiling, on fresh
random inputs (``DRAWS`` reference checks plus ``REPEATS`` bit-identical reruns each):

* ``in_loop``: the previously shipped kernel (two loads of ``a`` in one k-loop);
* ``first_tile``: one program per block of rows walks every N tile; only the first N tile's
  k-loop also sums squares, from a load of its own whose mask (true only in that tile) keeps
  the compiler from merging it with the MMA's load of the same tile, so no load feeds both an
  MMA and a reduction; the later N tiles reuse the rows' rstd. The sum rides in a k-loop that
  runs MMAs, where ``row_block`` gives it a loop of its own;
* ``row_block``: one program per block of rows; a k-loop of its own computes the rows' sum
  of squares once, then the program walks every N tile of those rows with a plain GEMM
  k-loop and scales the accumulator in the epilogue (no load feeds both an MMA and a
  reduction, and no N tile recomputes the sum);
* ``prepass``: a row-statistics kernel writes rstd [M], then a GEMM scales its epilogue by it;
* ``scale_only``: the consumer of a block whose producer (a GEMM or residual-add epilogue, as
  in ``matmul_rmsnorm_matmul``) already wrote the rows' statistics: the GEMM scales its
  epilogue by a given rstd, nothing else (``scale_only - matmul`` is what the norm then costs;
  shipped as ``rmsnorm_matmul(..., rstd=)``);
* ``matmul``: the plain Helion GEMM (control and floor for the fused variants).

(The in-loop sum from the MMA's own tile, one load feeding both, is ``single_load`` in
``shared_operand_check.py``: wrong on 6 of 8 tilings on the H200.)

Usage (CUDA machine):
``python bench/variants/pre_norm_variants.py OUT.csv [--variants first_tile row_block matmul]
[--tilings ptr_128x256x64_w8_s4 ...] [--shapes 65536x1024x1024 ...] [--draws 2]``.
"""

from __future__ import annotations

import sys
import time

import helion
import helion.language as hl
import pandas as pd
import torch

# The rows' fp32 rstd of rmsnorm(a), as a producer's epilogue would write it.
from helion_kernels.autograd import rms_rstd as rstd_reference
from helion_kernels.techniques.gemm.kernels import matmul_kernel, matmul_reference
from helion_kernels.techniques.prenorm.kernels import rmsnorm_matmul_reference
# The shipped kernel is the row-block variant. The in-loop variant is the one shipped before
# (kept here, as the thing being compared against).
from helion_kernels.techniques.prenorm.kernels import rmsnorm_matmul_kernel as row_block_kernel
from helion_kernels.techniques.prenorm.kernels import row_block_config
# The prepass and scale_only variants' GEMM: the kernel rmsnorm_matmul(..., rstd=) runs.
from helion_kernels.techniques.prenorm.kernels import rmsnorm_matmul_given_rstd_kernel as row_scale_kernel
from helion_kernels.spec import Shape, random_gemm_operands
from helion_kernels.timing import time_ms
from helion_kernels.verify import VerificationError, check_deterministic, check_outputs
from helion_kernels.workloads import shape_argument

DRAWS = 2
REPEATS = 30


@helion.kernel(static_shapes=True)
def in_loop_kernel(a: torch.Tensor, b: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = a.size()
    _, n = b.size()
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        sum_sq = hl.zeros([tile_m], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
            a32 = hl.load(a, [tile_m, tile_k], eviction_policy="evict_last").to(torch.float32)
            sum_sq = sum_sq + torch.sum(a32 * a32, dim=1)
        row_rstd = torch.rsqrt(sum_sq / k + eps)
        c[tile_m, tile_n] = (acc * row_rstd[:, None]).to(c.dtype)
        if tile_n.begin == 0:
            rstd[tile_m] = row_rstd
    return c, rstd


@helion.kernel(static_shapes=True)
def first_tile_kernel(a: torch.Tensor, b: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = a.size()
    _, n = b.size()
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m in hl.tile(m):
        sum_sq = hl.zeros([tile_m], dtype=torch.float32)
        for tile_n in hl.tile(n):
            acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(k):
                acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
                # A load of its own, masked off past the first N tile (no memory traffic there,
                # zeros added): the mask is a tensor so that reference mode takes it too.
                first = (tile_k.index[None, :] >= 0) & (tile_n.begin == 0)
                a32 = hl.load(a, [tile_m, tile_k], extra_mask=first).to(torch.float32)
                sum_sq = sum_sq + torch.sum(a32 * a32, dim=1)
            row_rstd = torch.rsqrt(sum_sq / k + eps)
            c[tile_m, tile_n] = (acc * row_rstd[:, None]).to(c.dtype)
            rstd[tile_m] = row_rstd
    return c, rstd


def first_tile_config(gemm: helion.Config) -> helion.Config:
    """The first-tile kernel's config for a GEMM tiling (a 1-D grid: no L2 grouping)."""
    return helion.Config(**{key: val for key, val in gemm.config.items() if key != "l2_groupings"})


@helion.kernel(static_shapes=True)
def rstd_kernel(a: torch.Tensor, eps: float) -> torch.Tensor:
    m, k = a.size()
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m in hl.tile(m):
        sum_sq = hl.zeros([tile_m], dtype=torch.float32)
        for tile_k in hl.tile(k):
            a32 = a[tile_m, tile_k].to(torch.float32)
            sum_sq = sum_sq + torch.sum(a32 * a32, dim=1)
        rstd[tile_m] = torch.rsqrt(sum_sq / k + eps)
    return rstd


def _gemm(bs, warps, stages, indexing="pointer", l2=8, pid="flat", per_sm=1) -> dict:
    extra = {"num_sm_multiplier": per_sm} if per_sm != 1 else {}
    return dict(block_sizes=bs, num_warps=warps, num_stages=stages, indexing=indexing,
                l2_groupings=[l2], pid_type=pid, **extra)


# GEMM tilings [tile_m, tile_n, tile_k]: the tuned matmul's, and the fused kernel's seeds.
TILINGS = {
    "ptr_128x256x64_w8_s4": _gemm([128, 256, 64], 8, 4, l2=2),
    "ptr_128x128x64_w4_s4": _gemm([128, 128, 64], 4, 4),
    "ptr_64x128x64_w4_s4": _gemm([64, 128, 64], 4, 4, l2=4),
    "tma_128x128x64_w8_s3_pers": _gemm([128, 128, 64], 8, 3, "tensor_descriptor", 8,
                                        "persistent_interleaved"),
    "tma_128x256x64_w8_s3": _gemm([128, 256, 64], 8, 3, "tensor_descriptor"),
    "tma_128x256x64_w8_s3_pers": _gemm([128, 256, 64], 8, 3, "tensor_descriptor", 8,
                                        "persistent_interleaved"),
    # two programs per SM (96 KB of operand tiles each): one's statistics loop beside the other's
    # MMAs (the pointer one is the rmsnorm_matmul seed SEED_ROW_BLOCK_POINTER_128x128_TWO_PER_SM;
    # results: bench/results/nvidia_h200_sm90/variants/pre_norm_variants_two_per_sm.md)
    "ptr_128x128x64_w8_s3": _gemm([128, 128, 64], 8, 3),
    "tma_128x128x64_w8_s3_pers_x2": _gemm([128, 128, 64], 8, 3, "tensor_descriptor", 8,
                                           "persistent_interleaved", per_sm=2),
}
# Row-statistics loop tilings [tile_m, tile_k] for row_block / prepass.
STATS_K = 128


def _variants(shape: Shape):
    """(variant, tiling, build) where build(args) -> callable running it on those args."""
    out = []
    for name, g in TILINGS.items():
        def in_loop(args, g=g):
            bound = in_loop_kernel.bind(args)
            bound.set_config(helion.Config(**g))
            return lambda: bound(*args)

        def first_tile(args, g=g):
            bound = first_tile_kernel.bind(args)
            bound.set_config(first_tile_config(helion.Config(**g)))
            return lambda: bound(*args)

        def row_block(args, g=g):
            bound = row_block_kernel.bind(args)
            bound.set_config(row_block_config(helion.Config(**g), STATS_K))
            return lambda: bound(*args)

        def prepass(args, g=g):
            a, b, eps = args
            rs = rstd_kernel.bind((a, eps))
            rs.set_config(helion.Config(block_sizes=[32, STATS_K], num_warps=4, num_stages=2))
            mm = row_scale_kernel.bind((a, b, torch.empty(a.shape[0], device=a.device)))
            mm.set_config(helion.Config(**g))

            def run():
                r = rs(a, eps)
                return mm(a, b, r), r
            return run

        def scale_only(args, g=g):
            a, b, eps = args
            rstd = rstd_reference(a, eps)  # written by the producer's epilogue, outside the timing
            mm = row_scale_kernel.bind((a, b, rstd))
            mm.set_config(helion.Config(**g))
            return lambda: (mm(a, b, rstd), rstd)

        def matmul(args, g=g):
            bound = matmul_kernel.bind(args[:2])
            bound.set_config(helion.Config(**g))
            return lambda: bound(*args[:2])

        out += [("in_loop", name, in_loop), ("first_tile", name, first_tile), ("row_block", name, row_block),
                ("prepass", name, prepass), ("scale_only", name, scale_only), ("matmul", name, matmul)]
    return out


def main(out_csv: str, shapes=(Shape(65536, 256, 256), Shape(65536, 1024, 1024)), variants=None,
         tilings=None, draws: int = DRAWS) -> pd.DataFrame:
    if draws < 1:
        raise ValueError(f"draws must be at least 1, got {draws}")
    rows = []
    for shape in shapes:
        for variant, tiling, build in _variants(shape):
            if (variants and variant not in variants) or (tilings and tiling not in tilings):
                continue
            t0 = time.time()
            failed, nondet, note, ms = 0, 0, "", float("nan")
            ref_fn = matmul_reference if variant == "matmul" else rmsnorm_matmul_reference
            try:
                for seed in range(draws):
                    args = (*random_gemm_operands(shape, torch.bfloat16, "cuda", seed), 1e-5)
                    run = build(args)
                    ref = ref_fn(*(args[:2] if variant == "matmul" else args))
                    try:
                        check_outputs(run(), ref, torch.bfloat16)
                    except VerificationError as err:
                        failed, note = failed + 1, str(err)[:100]
                    try:
                        check_deterministic(run, repeats=REPEATS)
                    except VerificationError as err:
                        nondet, note = nondet + 1, str(err)[:100]
                ms = time_ms(run)
            except Exception as err:  # a config that does not compile is a result too
                failed, note = -1, f"{type(err).__name__}: {err}"[:100]
            rows.append({"M": shape.M, "K": shape.K, "N": shape.N, "variant": variant,
                         "tiling": tiling, "failed_draws": failed, "nondeterministic_draws": nondet,
                         "draws": draws, "repeats": REPEATS, "ms": round(ms, 5),
                         "wall_s": round(time.time() - t0, 1), "note": note})
            print(rows[-1], flush=True)
            pd.DataFrame(rows).to_csv(out_csv, index=False)
    df = pd.DataFrame(rows)
    print(df.drop(columns="note").to_string(index=False))
    return df


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_csv")
    ap.add_argument("--variants", nargs="+", default=None,
                    choices=["in_loop", "first_tile", "row_block", "prepass", "scale_only", "matmul"])
    ap.add_argument("--tilings", nargs="+", default=None, choices=list(TILINGS))
    ap.add_argument("--shapes", nargs="+", type=shape_argument, default=[Shape(65536, 256, 256), Shape(65536, 1024, 1024)],
                    metavar="MxKxN")
    ap.add_argument("--draws", type=int, default=DRAWS, help="fresh random inputs per (shape, variant, tiling)")
    cli = ap.parse_args()
    if cli.draws < 1:
        ap.error("--draws must be at least 1")
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    main(cli.out_csv, shapes=cli.shapes, variants=cli.variants,
         tilings=cli.tilings, draws=cli.draws)
