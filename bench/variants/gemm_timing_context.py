"""Does the plain Helion GEMM's ratio to cuBLAS depend on what is timed around it?

Why: at M = 262144 the same Helion GEMM, with the same config and operands, reads a different
ratio to cuBLAS depending on the columns timed around it (on the H200, 1.002-1.016x with the GEMM
first and 1.076-1.088x with cuBLAS first: ``bench/NOTES.md``, "How the numbers were taken";
``bench/results/nvidia_h200_sm90/variants/gemm_timing_context.md``). The benchmarks therefore
balance the column order; what causes the effect, and whether other GPUs show it, is open.
``bench/gemm_ceiling.py`` judges the GEMM aim by the runs beside a fused kernel, so which reading
is the GEMM's own matters. This script times, per row and in one process, the GEMM and cuBLAS
inside several column orders ("contexts"); each repeat takes every context in turn, and every
column is a CUDA-graph median on rotated inputs:

- ``pair``: GEMM, cuBLAS (as ``bench --kernel matmul``)
- ``pair_reversed``: cuBLAS, GEMM
- ``fused_bench``: the RMSNorm split-N benchmark's columns, in its order
- ``after_norm``: compiled norm, GEMM, compiled norm, cuBLAS (each GEMM after a memory-bound
  column)

    python bench/variants/gemm_timing_context.py [--workload postnorm_split_n]
        [--where 'M == 262144 and K * N >= 1048576'] [--repeats 5]

Writes ``bench/results/<gpu>/variants/gemm_timing_context_<workload>[_<where>].{csv,md,png}``.
Without a CUDA GPU it lists the rows and contexts and exits.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pandas as pd
import torch

from helion_kernels.bench_specs import bench_spec
from helion_kernels import runtime, workloads
from helion_kernels.benchmark import RESULTS_DIR, write_table
from helion_kernels.techniques import get_spec
from helion_kernels.timing import input_copies, time_ms

FUSED = "matmul_rmsnorm_split_n"  # the fused benchmark whose columns the fused_bench context replays
GEMM, CUBLAS = "gemm", "cublas_mm"


def contexts(baseline_names: list[str]) -> dict[str, list[str]]:
    """Context name -> its columns in order (``fused``: the fused kernel; ``gemm``: the plain
    Helion GEMM; the other names are the fused spec's baselines)."""
    return {
        "pair": [GEMM, CUBLAS],
        "pair_reversed": [CUBLAS, GEMM],
        "fused_bench": ["fused", GEMM, *baseline_names],
        "after_norm": ["inductor_norm", GEMM, "inductor_norm", CUBLAS],
    }


def measure(problem, device: torch.device, repeats: int, timer=time_ms) -> pd.DataFrame:
    """One row per (context, repeat): the GEMM's and cuBLAS's times (ms) in that context."""
    fused, gemm = get_spec(FUSED), get_spec("matmul")
    sets = [fused.make_args(problem, torch.bfloat16, device, s)
            for s in range(input_copies(bench_spec(fused.name).min_bytes(problem, torch.bfloat16), device))]
    baselines = [bench_spec(fused.name).baselines(*args) for args in sets]
    columns = {"fused": [lambda a=args: runtime.launch(fused, a) for args in sets],
               GEMM: [lambda a=args: runtime.launch(gemm, a[:2]) for args in sets]}
    for name in baselines[0]:
        columns[name] = [b[name] for b in baselines]
    plan = contexts(list(baselines[0]))
    rows = []
    for repeat in range(repeats):
        for context, order in plan.items():
            times = {}
            for name in order:
                ms = timer(columns[name])
                times.setdefault(name, ms)  # a column named twice (after_norm's norm): its first time
            rows.append({"context": context, "repeat": repeat, "gemm_ms": times[GEMM], "cublas_ms": times[CUBLAS]})
    return pd.DataFrame(rows)


def summarise(problem, runs: pd.DataFrame) -> pd.DataFrame:
    """Per context: median times, and the median and spread of the per-repeat GEMM / cuBLAS ratio."""
    out = []
    for context, g in runs.groupby("context", sort=False):
        ratios = (g.gemm_ms / g.cublas_ms).tolist()
        out.append({"M": problem.M, "K": problem.K, "N": problem.N, "context": context,
                    "gemm_ms": statistics.median(g.gemm_ms), "cublas_ms": statistics.median(g.cublas_ms),
                    "vs_cublas": statistics.median(ratios), "vs_cublas_spread": max(ratios) - min(ratios),
                    "repeats": len(g)})
    return pd.DataFrame(out)


def plot(df: pd.DataFrame, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wide = df.assign(row=[f"{r.M}x{r.K}x{r.N}" for r in df.itertuples()])
    ratio = wide.pivot(index="row", columns="context", values="vs_cublas").reindex(wide.row.unique())
    spread = wide.pivot(index="row", columns="context", values="vs_cublas_spread").reindex(ratio.index)
    order = [c for c in wide.context.unique()]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 * len(ratio)), 4.5))
    ratio[order].plot.bar(ax=ax, yerr=spread[order] / 2, capsize=2, width=0.8)
    ax.axhline(1.07, color="black", linewidth=1, label="aim (1.07)")
    ax.axhline(1.0, color="black", linewidth=0.5, linestyle=":")
    ax.set_ylim(min(0.9, ratio.min().min() - 0.03), max(1.15, ratio.max().max() + 0.03))
    ax.set_ylabel("Helion GEMM time / cuBLAS time")
    ax.set_xlabel("")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="postnorm_split_n", help="GEMM workload table (default %(default)s)")
    p.add_argument("--where", default="M == 262144 and K * N >= 1048576",
                   help="pandas query selecting rows (default %(default)r)")
    p.add_argument("--repeats", type=int, default=5,
                   help="take every context this many times, the contexts in turn (default %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="folder (default: bench/results/<gpu>/variants/)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    problems = workloads.problems(workloads.load_workload(args.workload, args.where, kind="gemm"), "gemm")
    names = list(contexts(["<the fused spec's baselines>"]))
    if not torch.cuda.is_available():
        print(f"gemm_timing_context: no CUDA GPU; would time {len(problems)} row{'s' * (len(problems) != 1)} "
              f"({', '.join(f'{q.M}x{q.K}x{q.N}' for q in problems)}) in the contexts {', '.join(names)}",
              file=sys.stderr)
        return 0
    from helion_kernels import registry

    device = torch.device("cuda")
    gpu = registry.gpu_key(device)
    frames = []
    for problem in problems:
        torch._dynamo.reset()  # one fresh torch.compile per row, as the benchmark does
        frames.append(summarise(problem, measure(problem, device, args.repeats)))
        print(frames[-1].to_string(index=False), flush=True)
    df = pd.concat(frames, ignore_index=True)
    stem = (args.out or RESULTS_DIR / gpu / "variants") / (
        f"gemm_timing_context_{args.workload}{workloads.where_suffix(args.where)}")
    title = f"The plain Helion GEMM over cuBLAS in four column orders: {torch.cuda.get_device_name()}"
    write_table(df, stem, title, [
        f"command: `python bench/variants/gemm_timing_context.py --workload {args.workload} --where '{args.where}' "
        f"--repeats {args.repeats}`",
        "bf16; the registry's `matmul` config (gemm) and cuBLAS `a @ b`, each a CUDA-graph median on input sets "
        "rotated to >= 4x L2; per repeat every context in turn, every column of a context in its order",
        f"contexts: pair (gemm, cuBLAS); pair_reversed (cuBLAS, gemm); fused_bench ({FUSED}'s benchmark columns "
        "in its order: the fused kernel, gemm, its baselines); after_norm (compiled norm, gemm, compiled norm, "
        "cuBLAS)",
        "vs_cublas: median over the repeats of gemm / cuBLAS within the same context and repeat (spread: max - "
        "min); gemm_ms, cublas_ms: median times"])
    plot(df, Path(f"{stem}.png"), title)
    print(f"wrote {stem}.csv, .md and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
