"""Full-row post-norm in training: the forward that also writes what the backward needs.

When autograd records a ``matmul_layernorm`` / ``matmul_rmsnorm`` call, its forward (fused or
not) also writes the norm's input ``h = a @ b`` [M, N] and the fp32 statistics, which the
backward reads (:mod:`helion_kernels.grads`). The fused kernel then stores two [M, N] tensors
instead of one, so the forward benchmark (``helion-kernels bench``, whose kernel stores ``y``
alone) overstates what fusion saves in training. The backward is the same on both paths (it
reads ``h`` and the statistics either way), so this forward decides the training dispatch.

Per row (M, K, N) of a GEMM workload (default ``postnorm_fullrow``), bf16, affine norm
(LayerNorm weight and bias, RMSNorm weight), every column the op's forward as autograd records
it, on the same inputs:

* ``<kernel>``: the fused kernel writing ``y``, the statistics and ``h`` (``fused=True``);
* ``cublas+inductor_norm``: cuBLAS writing ``h``, then the inductor-compiled norm with its
  statistics (``fused=False``): the unfused pipeline the op runs in training;
* ``forward_fused``, ``forward_unfused``: the same two as inference runs them (no ``h`` kept),
  the forward benchmark's case, for comparison;
* ``cublas_mm``, ``inductor_norm``: the unfused pipeline's two parts.

``speedup_vs_best_unfused`` = unfused / fused in training; ``saved_vs_cublas_inductor_pct`` =
(unfused - fused) / inductor_norm, the blog's metric; ``training_decision``: the choice that
``bench/dispatch_from_bench.py --training`` records from the row (the library's 2% margin). Timing: CUDA-graph replay, median,
input sets rotated past the L2 cache; ``--repeats N`` times the columns in order and then
reversed, N times, and reports the medians. Every row is checked against an fp32 reference (y, statistics and h).

    python bench/postnorm_training_forward.py --kernel matmul_layernorm [--workload postnorm_fullrow]
        [--where 'M == 65536'] [--repeats 3]

Then record the decisions in the registry (the entry's ``dispatch_training``, beside its forward
``dispatch``)::

    python bench/dispatch_from_bench.py --training --kernel matmul_layernorm \\
        --csv bench/results/<gpu>/matmul_layernorm_training_forward_postnorm_fullrow.csv

Writes ``bench/results/<gpu>/<kernel>_training_forward_<workload>[_<where>].{csv,md,json,png}``.
"""

from __future__ import annotations

import functools
import shlex
import statistics
import sys
from pathlib import Path

import pandas as pd
import torch

from helion_kernels.bench_specs import bench_spec
from helion_kernels import registry, tuning
from helion_kernels.benchmark import (aim_bars, device_ceilings, finish_plot, row_labels, run_meta, time_columns,
                                      workload_script_args, write_results)
from helion_kernels.cli import positive_int
from helion_kernels.techniques import get_spec
from helion_kernels.techniques import postnorm
from helion_kernels.spec import Shape
from helion_kernels.timing import input_copies
from helion_kernels.verify import VerificationError, check_outputs

KERNELS = {"matmul_layernorm": postnorm._layernorm_eager, "matmul_rmsnorm": postnorm._rmsnorm_eager}
UNFUSED = "cublas+inductor_norm"
NOTES = ("`speedup_vs_best_unfused`: the unfused training forward's time over the fused one's (median of the "
         "per-repeat ratios; `speedup_spread` their max - min)",
         "`saved_vs_cublas_inductor_pct`: (t_unfused - t_fused) / t_inductor_norm, in training",
         "`training_write_ms`: the fused kernel's time with h stored minus without",
         "`training_decision`: what `bench/dispatch_from_bench.py --training` records from the row (fused where "
         "the unfused forward took at least 2% longer)")


def _reference(kernel: str, args: tuple) -> tuple:
    """fp32 (y, [mean,] rstd, h) of the op's training forward."""
    return (*get_spec(kernel).reference(*args), args[0].float() @ args[1].float())


def _forward(kernel: str, args: tuple, fused: bool, keep: bool):
    """The op's eager forward (its dispatch bypassed by ``fused``): ``keep``, as autograd
    records it, returning (y, [mean,] rstd, h); else as inference runs it (y alone)."""
    a, b, weight, bias, eps, layernorm = args
    return KERNELS[kernel](*((a, b, weight, bias, eps) if layernorm else (a, b, weight, eps)), keep, fused, keep)


def bench_row(kernel: str, shape: Shape, dtype: torch.dtype, device: torch.device, repeats: int) -> dict:
    spec = get_spec(kernel)
    torch._dynamo.reset()  # one fresh torch.compile per row
    per_set = bench_spec(spec.name).min_bytes(shape, dtype) + shape.M * shape.N * dtype.itemsize  # + h
    arg_sets = [spec.make_args(shape, dtype, device, seed) for seed in range(input_copies(per_set, device))]
    row: dict = {**shape._asdict(), "dtype": registry.dtype_name(dtype)}
    ref = _reference(kernel, arg_sets[0])
    try:
        row["rel_error"] = max(check_outputs(_forward(kernel, arg_sets[0], fused, True), ref, dtype)
                               for fused in (True, False))
        row["check"] = "ok"
    except VerificationError as err:
        row["rel_error"], row["check"] = float("inf"), f"FAILED: {err}"
    del ref
    columns = {
        kernel: [functools.partial(_forward, kernel, a, True, True) for a in arg_sets],
        UNFUSED: [functools.partial(_forward, kernel, a, False, True) for a in arg_sets],
        "forward_fused": [functools.partial(_forward, kernel, a, True, False) for a in arg_sets],
        "forward_unfused": [functools.partial(_forward, kernel, a, False, False) for a in arg_sets],
        "cublas_mm": [functools.partial(torch.mm, a[0], a[1]) for a in arg_sets],
    }
    products = [torch.mm(a[0], a[1]) for a in arg_sets]
    norm = postnorm._layer_norm_stats if kernel == "matmul_layernorm" else postnorm._rms_norm_stats
    columns["inductor_norm"] = [functools.partial(postnorm._unfused_norm, norm, h, *(a[2:5] if a[5] else a[2:5:2]))
                                for h, a in zip(products, arg_sets)]
    repeated = time_columns(columns, repeats)
    times = {name: statistics.median(ts) for name, ts in repeated.items()}
    row.update({f"{name}_ms": t for name, t in times.items()})
    row["repeats"] = repeats
    ratios = [u / f for u, f in zip(repeated[UNFUSED], repeated[kernel])]
    row["speedup_vs_best_unfused"] = statistics.median(ratios)
    row["speedup_spread"] = max(ratios) - min(ratios)
    row["forward_speedup"] = times["forward_unfused"] / times["forward_fused"]
    row["saved_vs_cublas_inductor_pct"] = 100 * (times[UNFUSED] - times[kernel]) / times["inductor_norm"]
    row["training_write_ms"] = times[kernel] - times["forward_fused"]  # what storing h costs the kernel
    # the decision dispatch_from_bench --training records from this row (the library's 2% margin)
    row["training_decision"] = tuning.dispatch_decision(times[kernel], times[UNFUSED], UNFUSED, {})["choice"]
    return row


def plot(df: pd.DataFrame, meta: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = row_labels(df)
    fig, axes = plt.subplots(2, 1, figsize=(max(8, len(df) * 0.9), 8))
    speed = df[["forward_speedup", "speedup_vs_best_unfused"]].rename(
        columns={"forward_speedup": "inference (y only)", "speedup_vs_best_unfused": "training (y and h)"})
    speed.index = labels
    speed.plot.bar(ax=axes[0], width=0.8)
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[0].axhline(1.02, color="r", lw=0.8, ls="--", label="fused runs above 1.02")
    axes[0].set_ylabel("unfused / fused forward")
    axes[0].set_title(f"{meta['gpu']}: {meta['kernel']}, cuBLAS + inductor norm over the fused kernel "
                      "(higher favours fusion)")
    axes[0].legend(fontsize=8)
    aim_bars(axes[1], df["saved_vs_cublas_inductor_pct"], labels, None, None,
             "% of the inductor norm's time saved in training", baseline=0)
    finish_plot(fig, axes, path)


def main() -> int:
    def add(p):
        p.add_argument("--kernel", required=True, choices=sorted(KERNELS))
        p.add_argument("--repeats", type=positive_int, default=3,
                       help="repeats, each timing the columns in order, then reversed (default 3)")

    args, table = workload_script_args(__doc__.splitlines()[0], add, default_workload="postnorm_fullrow")
    device = torch.device("cuda")
    ceilings = device_ceilings(device)
    limit = get_spec(args.kernel).n_limit(torch.bfloat16, device)
    rows = []
    for r in table.itertuples():
        if int(r.N) > limit:
            print(f"skipped {r.M}x{r.K}x{r.N}: N past the full-row limit {limit}", flush=True)
            continue
        shape = Shape(int(r.M), int(r.K), int(r.N))
        try:  # a failing row is reported in the table, and the other rows still run
            rows.append(bench_row(args.kernel, shape, torch.bfloat16, device, args.repeats))
        except Exception as err:
            rows.append({**shape._asdict(), "dtype": "bfloat16", "check": f"FAILED: {type(err).__name__}: {err}"[:200]})
        print({k: rows[-1].get(k) for k in ("M", "K", "N", "speedup_vs_best_unfused", "forward_speedup", "check")},
              flush=True)
    meta = run_meta(device, ceilings, timer="graph", repeats=args.repeats, kernel=args.kernel,
                    inputs="bf16, affine norm (LayerNorm weight and bias, RMSNorm weight), eps 1e-5",
                    baselines="cuBLAS GEMM writing h, then the inductor-compiled norm with its statistics")
    meta["command"] = shlex.join(["python", "bench/postnorm_training_forward.py", *sys.argv[1:]])  # quoted: re-runnable
    out_dir = args.out or Path(__file__).resolve().parent / "results" / meta["gpu_key"]
    stem = f"{args.kernel}_training_forward_{args.workload}"
    paths = write_results(pd.DataFrame(rows), meta, out_dir, stem, plot, notes=NOTES)
    print("wrote " + ", ".join(str(x) for x in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
