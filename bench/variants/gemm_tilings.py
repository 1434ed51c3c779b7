"""Hand-picked tilings of the plain Helion GEMM against its registry entry and cuBLAS, at one shape.

Why: at 262144x512x128 the registry's ``matmul`` entry runs 1.08-1.10x cuBLAS in balanced runs,
the one row of the workload tables over the 1.07 aim that two searches (112 and 163 configs)
did not move (``bench/NOTES.md``, twenty-first session). N = 128 makes this GEMM memory-bound
(it reads 268 MB of ``a``, writes 67 MB), so what may matter is how many bytes of ``a`` each SM
keeps in flight and whether the next tile's loads overlap the store: tile_n = N, smaller tile_m,
more pipeline stages, and the flattened persistent loop, which the searches' neighbourhoods
left out. This script times each named tiling, the registry's config and cuBLAS in the balanced
order of the benchmarks (``benchmark.time_columns``: per repeat the columns in order, then
reversed; each a CUDA-graph median on input sets rotated to >= 4x L2), on fresh random bf16
inputs, after checking each tiling's output against an fp32 reference.

    python bench/variants/gemm_tilings.py [--shape 262144,512,128] [--repeats 3] [--tilings NAME ...]

Writes ``bench/results/<gpu>/variants/gemm_tilings_<M>x<K>x<N>.{csv,md}``. Without a CUDA GPU it
lists the tilings and exits.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import helion
import pandas as pd
import torch

from helion_kernels.bench_specs import bench_spec
from helion_kernels import registry, runtime
from helion_kernels.benchmark import RESULTS_DIR, time_columns, write_table
from helion_kernels.techniques import get_spec
from helion_kernels.techniques.gemm.kernels import matmul_kernel
from helion_kernels.spec import Shape
from helion_kernels.timing import input_copies, time_ms
from helion_kernels.workloads import shape_argument

CUBLAS, REGISTRY = "cublas_mm", "registry"


def _tma(bs, warps, stages, flatten=False, per_sm=1, l2=8) -> dict:
    config = {"block_sizes": list(bs), "num_warps": warps, "num_stages": stages, "l2_groupings": [l2],
              "indexing": "tensor_descriptor", "pid_type": "persistent_interleaved"}
    if per_sm != 1:
        config["num_sm_multiplier"] = per_sm
    if flatten:
        config["range_flattens"] = [True]
    return config


# [tile_m, tile_n, tile_k], all persistent tensor-descriptor tilings; "f" = flattened persistent loop
# (the next tile's loads overlap this tile's epilogue), "x2" = two programs per SM.
TILINGS = {
    "tma_128x128x64_w8_s3": _tma((128, 128, 64), 8, 3),
    "tma_128x128x64_w8_s4_f": _tma((128, 128, 64), 8, 4, flatten=True),
    "tma_128x128x64_w4_s5_f": _tma((128, 128, 64), 4, 5, flatten=True),
    "tma_128x128x128_w8_s3_f": _tma((128, 128, 128), 8, 3, flatten=True),
    "tma_64x128x64_w4_s6_f": _tma((64, 128, 64), 4, 6, flatten=True),
    "tma_64x128x128_w4_s4_f": _tma((64, 128, 128), 4, 4, flatten=True),
    "tma_64x128x64_w4_s4_f_x2": _tma((64, 128, 64), 4, 4, flatten=True, per_sm=2),
    "tma_256x128x64_w8_s3_f": _tma((256, 128, 64), 8, 3, flatten=True),
    "tma_256x128x64_w16_s4_f": _tma((256, 128, 64), 16, 4, flatten=True),
    "tma_128x128x64_w8_s4_f_x2": _tma((128, 128, 64), 8, 4, flatten=True, per_sm=2),
}


def _first_line(exc: Exception) -> str:
    text = str(exc).splitlines()
    return f"{type(exc).__name__}: {text[0][:120] if text else ''}"


def columns(shape: Shape, names: list[str], device) -> tuple[dict, dict]:
    """Name -> callables over the rotated input sets (cuBLAS, the registry's config, each tiling),
    and name -> the relative error of its output against fp32 on the first set (None: not checked;
    a tiling that fails to compile or is wrong is left out and its error kept as text)."""
    spec = get_spec("matmul")
    sets = [spec.make_args(shape, torch.bfloat16, device, s)
            for s in range(input_copies(bench_spec(spec.name).min_bytes(shape, torch.bfloat16), device))]
    ref = sets[0][0].float() @ sets[0][1].float()
    cols = {CUBLAS: [lambda a=a: torch.mm(*a) for a in sets],
            REGISTRY: [lambda a=a: runtime.launch(spec, a) for a in sets]}
    errors: dict = {CUBLAS: None, REGISTRY: None}
    for name in names:
        try:  # compile_config: a callable of its own (set_config would re-tile the one bound kernel)
            run = matmul_kernel.bind(sets[0]).compile_config(helion.Config(**TILINGS[name]))
            out = run(*sets[0])
        except Exception as exc:  # noqa: BLE001 - a tiling Helion or Triton refuses is reported, not fatal
            errors[name] = _first_line(exc)
            continue
        err = float(((out.float() - ref).norm() / ref.norm()).item())
        errors[name] = err
        if not err < 1e-2:  # NaN fails too
            continue
        cols[name] = [lambda a=a, k=run: k(*a) for a in sets]
    return cols, errors


def timer_keeping_errors(cols: dict, errors: dict, timer=None):
    """A ``time_columns`` timer that gives NaN where timing a column raises (a launch that fails
    only under graph capture, say) and keeps the error as that column's note, so one failing
    tiling does not lose the others' times."""
    timer = timer or time_ms
    names = {id(fns): name for name, fns in cols.items()}

    def timed(fns) -> float:
        try:
            return timer(fns)
        except Exception as exc:  # noqa: BLE001 - reported in the column's note
            errors[names[id(fns)]] = f"timing failed: {_first_line(exc)}"
            return float("nan")

    return timed


def summarise(shape: Shape, times: dict[str, list[float]], errors: dict, registry_config: str) -> pd.DataFrame:
    """One row per column: median ms, and the median and spread of its per-repeat ratio to cuBLAS."""
    rows = []
    for name, err in errors.items():
        ms = times.get(name)
        if ms and any(math.isnan(t) for t in ms):  # a repeat whose timing failed: no time (see note)
            ms = None
        ratios = [t / c for t, c in zip(ms, times[CUBLAS])] if ms else []
        rows.append({"M": shape.M, "K": shape.K, "N": shape.N, "tiling": name,
                     "config": registry_config if name == REGISTRY else ("" if name == CUBLAS else str(TILINGS[name])),
                     "ms": statistics.median(ms) if ms else None,
                     "vs_cublas": statistics.median(ratios) if ratios else None,
                     "vs_cublas_spread": (max(ratios) - min(ratios)) if ratios else None,
                     "rel_error": err if isinstance(err, float) else None,
                     "note": err if isinstance(err, str) else (
                         "wrong output" if isinstance(err, float) and not err < 1e-2 else "")})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", type=shape_argument, default=Shape(262144, 512, 128), help="M,K,N (default 262144,512,128)")
    p.add_argument("--repeats", type=int, default=3, help="balanced repeats (default %(default)s)")
    p.add_argument("--tilings", nargs="+", choices=list(TILINGS), default=list(TILINGS))
    p.add_argument("--out", type=Path, default=None, help="folder (default: bench/results/<gpu>/variants/)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    shape = args.shape
    label = f"{shape.M}x{shape.K}x{shape.N}"
    if not torch.cuda.is_available():
        print(f"gemm_tilings: no CUDA GPU; would time at {label}: {CUBLAS}, {REGISTRY}, {', '.join(args.tilings)}",
              file=sys.stderr)
        return 0
    device = torch.device("cuda")
    gpu = registry.gpu_key(device)
    spec = get_spec("matmul")
    cols, errors = columns(shape, args.tilings, device)
    registry_config = runtime.resolved_config(spec, spec.make_args(shape, torch.bfloat16, device, 0)).source
    times = time_columns(cols, args.repeats, timer=timer_keeping_errors(cols, errors))
    df = summarise(shape, times, errors, registry_config)
    print(df.to_string(index=False), flush=True)
    subset = args.tilings != list(TILINGS)  # a partial run gets its own file, not the full run's
    stem = (args.out or RESULTS_DIR / gpu / "variants") / (
        f"gemm_tilings_{label}" + (f"_{len(args.tilings)}_of_{len(TILINGS)}" if subset else ""))
    tilings_arg = f" --tilings {' '.join(args.tilings)}" if subset else ""
    write_table(df, stem, f"Hand-picked tilings of the plain Helion GEMM at {label}: {torch.cuda.get_device_name()}", [
        f"command: `python bench/variants/gemm_tilings.py --shape {shape.M},{shape.K},{shape.N} "
        f"--repeats {args.repeats}{tilings_arg}`",
        "bf16, fresh random inputs; cuBLAS `a @ b`, the registry's `matmul` config (`registry`) and each tiling of "
        "`TILINGS` in the script; each output checked against fp32 (rel_error; over 1e-2, or a compile failure, "
        "is not timed: note)",
        "timing: the benchmarks' balanced order (per repeat the columns in order, then reversed, the mean of the "
        "two), each a CUDA-graph median on input sets rotated to >= 4x L2; ms: median over the repeats; "
        "vs_cublas: median over the repeats of the column's time / cuBLAS's in the same repeat (spread: max - min)"])
    print(f"wrote {stem}.csv and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
