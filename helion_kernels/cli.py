"""Command line: ``helion-kernels {autotune,bench,list}`` (also ``python -m helion_kernels``).

Only argument parsing and printing live here; the work is in :mod:`.tuning` and
:mod:`.benchmark` (GEMM-shaped kernels, keyed by M, K, N) and :mod:`.attention`
(``flash_norm_attention``, keyed by H, D, with attention workloads).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import torch

from . import registry, workloads
from .kernels import SPECS, get_spec

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
AUTOTUNE_CACHE = Path(__file__).resolve().parent.parent / "autotune_cache"
SUMMARY_COLUMNS = [
    "M", "K", "N", "config", "check", "{kernel}_ms", "cublas_mm_ms", "helion_matmul_ms", "inductor_norm_ms",
    "cublas+inductor_norm_ms", "cublas+liger_norm_ms", "saved_vs_helion_gemm_pct",
    "saved_vs_cublas_inductor_pct", "speedup_vs_best_unfused", "fused_over_floor", "rel_error",
]
ATTENTION_SUMMARY_COLUMNS = [
    "H", "max_seq_len_q", "total_q", "config", "flash_norm_attention_check", "flash_norm_attention_ms",
    "unfused_compiled_ms", "unfused_eager_ms", "gdpa+eager_norms_ms", "speedup_vs_compiled",
    "fused_over_floor", "flash_norm_attention_rel_error",
]
ATTENTION_KERNEL = "flash_norm_attention"
SPEEDUP_NOTE = ("`speedup_vs_*`: latency of the alternative / latency of the fused kernel; the "
                "target is >= 1.35 against the compiled unfused block on the long-Q rows (the blog's "
                "best forward result)")


def _is_attention(kernel: str) -> bool:
    return kernel == ATTENTION_KERNEL


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="helion-kernels", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser, shape: bool) -> None:
        sp.add_argument("--kernel", required=True, choices=sorted([*SPECS, ATTENTION_KERNEL]))
        group = sp.add_mutually_exclusive_group(required=True)
        if shape:
            group.add_argument("--shape", help="one shape M,K,N (GEMM-shaped kernels)")
        group.add_argument("--workload", help=(
            f"a table under configs/workloads ({', '.join(workloads.list_workloads())}), or for "
            f"{ATTENTION_KERNEL} under configs/attention_workloads "
            f"({', '.join(workloads.list_workloads('attention'))})"))
        sp.add_argument("--where", help="pandas query selecting workload rows, e.g. 'M == 65536' or 'H == 4'")
        sp.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))

    tune = sub.add_parser("autotune", help=(
        "tune shapes on this GPU and save verified configs in the registry (flash_norm_attention: "
        "one config per (H, D), tuned on the selected row with the longest Q)"))
    common(tune, shape=True)
    tune.add_argument("--effort", default="quick", choices=["quick", "full"], help="Helion autotune_effort")
    tune.add_argument("--budget-seconds", type=int, default=60,
                      help="Helion autotune_budget_seconds per shape (default 60)")
    tune.add_argument("--force", action="store_true", help="re-tune shapes already in the registry")
    tune.add_argument("--seed", type=int, default=0, help="random seed of inputs and search")

    bench = sub.add_parser("bench", help="time a kernel over a workload against the unfused baselines")
    common(bench, shape=False)
    bench.add_argument("--out", type=Path, default=None,
                       help="results folder (default bench/results/<gpu>/)")

    sub.add_parser("list", help="kernels, workloads and registry coverage")
    return p


def _shapes(args: argparse.Namespace) -> list:
    if getattr(args, "shape", None):
        if args.where:
            raise ValueError("--where applies to --workload, not --shape")
        return [workloads.parse_shape(args.shape)]
    return workloads.shapes(workloads.load_workload(args.workload, args.where))


def _attention_rows(args: argparse.Namespace) -> list:
    from .attention import rows_of

    if getattr(args, "shape", None):
        raise ValueError(f"{ATTENTION_KERNEL} is tuned on workload rows (sequence lengths), not "
                         f"--shape; use --workload {ATTENTION_KERNEL} [--where 'H == 4']")
    return rows_of(workloads.load_workload(args.workload, args.where, kind="attention"))


def _cmd_autotune(args: argparse.Namespace) -> int:
    from .tuning import TuneOptions, tune_shapes

    options = TuneOptions(effort=args.effort, budget_seconds=args.budget_seconds,
                          force=args.force, seed=args.seed)
    if _is_attention(args.kernel):
        rows, name = _attention_rows(args), args.kernel
    else:
        spec = get_spec(args.kernel)
        shapes, name = _shapes(args), spec.name
    if not torch.cuda.is_available():
        print("helion-kernels autotune: autotuning times kernels on a CUDA GPU and none was found.",
              file=sys.stderr)
        return 2
    os.environ.setdefault("HELION_CACHE_DIR", str(AUTOTUNE_CACHE))
    if _is_attention(args.kernel):
        from .attention import tune_rows

        results = tune_rows(rows, DTYPES[args.dtype], options, torch.device("cuda"))
    else:
        results = tune_shapes(spec, shapes, DTYPES[args.dtype], options, torch.device("cuda"))
    counts = {s: sum(r.status == s for r in results) for s in ("tuned", "skipped", "failed")}
    path = registry.registry_path(name, registry.gpu_key("cuda"))
    print(f"{counts['tuned']} tuned, {counts['skipped']} skipped, {counts['failed']} failed; registry: {path}")
    return 1 if counts["failed"] else 0


def _stem(args: argparse.Namespace) -> str:
    stem = f"{args.kernel}_{args.workload}"
    if args.where:
        stem += "_" + re.sub(r"[^A-Za-z0-9]+", "_", args.where).strip("_")
    return stem if args.dtype == "bfloat16" else f"{stem}_{args.dtype}"


def _print_committed(args: argparse.Namespace, name: str) -> None:
    from .benchmark import RESULTS_DIR

    for gpu in registry.known_gpus():
        # this exact selection if it was benchmarked, else any benchmark of the workload
        committed = [RESULTS_DIR / gpu / f"{_stem(args)}.md"]
        if not committed[0].is_file():
            committed = sorted((RESULTS_DIR / gpu).glob(f"{name}_{args.workload}*.md"))
        for path in committed:
            print(f"\nCommitted results measured on {gpu} ({path}):\n")
            print(path.read_text())


def _cmd_bench_attention(args: argparse.Namespace) -> int:
    from . import attention
    from .benchmark import RESULTS_DIR, write_results

    rows, dtype = _attention_rows(args), DTYPES[args.dtype]
    if not torch.cuda.is_available():
        print(f"No CUDA GPU found: timings need a CUDA GPU. Checking instead, for every (H, D) of "
              f"the workload and every GPU in the registry, which config {ATTENTION_KERNEL} would "
              "run with and that it compiles to Triton with this Helion.\n")
        report = attention.cpu_report(rows, dtype)
        print(report.to_string(index=False))
        _print_committed(args, ATTENTION_KERNEL)
        failed = report["triton_codegen"].str.startswith("FAILED").sum()
        print(f"\n{len(report) - failed} of {len(report)} configs compile.")
        return 1 if failed else 0
    df, meta = attention.run_benchmark(rows, dtype, torch.device("cuda"))
    out_dir = args.out or RESULTS_DIR / meta["gpu_key"]
    paths = write_results(df, meta, out_dir, _stem(args), plot_fn=attention.plot, notes=(SPEEDUP_NOTE,))
    print(df[[c for c in ATTENTION_SUMMARY_COLUMNS if c in df.columns]].to_string(
        index=False, float_format=lambda v: f"{v:.4g}"))
    print("\nwrote " + ", ".join(str(p) for p in paths))
    bad = df[(df["flash_norm_attention_check"] != "ok") | (df["unfused_compiled_check"] != "ok")]
    for row in bad.itertuples():
        print(f"WRONG RESULTS at H={row.H} max_seq_len_q={row.max_seq_len_q}: "
              f"{row.flash_norm_attention_check}; compiled baseline: {row.unfused_compiled_check}",
              file=sys.stderr)
    return 1 if len(bad) else 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from .benchmark import RESULTS_DIR, cpu_report, run_benchmark, write_results

    if _is_attention(args.kernel):
        return _cmd_bench_attention(args)
    spec = get_spec(args.kernel)
    shapes = _shapes(args)
    dtype = DTYPES[args.dtype]
    if not torch.cuda.is_available():
        print("No CUDA GPU found: timings need a CUDA GPU. Checking instead, for every shape of "
              f"the workload and every GPU in the registry, which config {spec.name} would run "
              "with and that it compiles to Triton for that exact shape with this Helion.\n")
        report = cpu_report(spec, shapes, dtype)
        print(report.to_string(index=False))
        _print_committed(args, spec.name)
        failed = report["triton_codegen"].str.startswith("FAILED").sum()
        print(f"\n{len(report) - failed} of {len(report)} configs compile. "
              "Numerical CPU checks: see the README's test command.")
        return 1 if failed else 0
    df, meta = run_benchmark(spec, shapes, dtype, torch.device("cuda"))
    out_dir = args.out or RESULTS_DIR / meta["gpu_key"]
    paths = write_results(df, meta, out_dir, _stem(args))
    cols = [c.format(kernel=spec.name) for c in SUMMARY_COLUMNS]
    print(df[[c for c in cols if c in df.columns]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print("\nwrote " + ", ".join(str(p) for p in paths))
    failed = df[df["check"] != "ok"]
    for row in failed.itertuples():
        print(f"WRONG RESULTS at {row.M}x{row.K}x{row.N}: {row.check}", file=sys.stderr)
    return 1 if len(failed) else 0


def _cmd_list(args: argparse.Namespace) -> int:
    print("kernels:")
    for spec in SPECS.values():
        print(f"  {spec.name:24} {spec.technique}")
    print(f"  {ATTENTION_KERNEL:24} FlashNormAttention on jagged GDPA (technique 4, PyTorch blog "
          "'Towards Free Normalization', 2026)")
    print("workloads:")
    for kind in ("gemm", "attention"):
        for name in workloads.list_workloads(kind):
            print(f"  {name:24} {len(workloads.load_workload(name, kind=kind))} rows ({kind})")
    print(f"registry ({registry.config_dir()}):")
    for gpu in registry.known_gpus():
        for name in [*SPECS, ATTENTION_KERNEL]:
            entries = registry.entries_for(name, gpu)
            if entries:
                print(f"  {gpu:24} {name:24} {len(entries)} {'(H, D)' if _is_attention(name) else 'shapes'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = {"autotune": _cmd_autotune, "bench": _cmd_bench, "list": _cmd_list}[args.command]
    try:
        return handler(args)
    except (ValueError, registry.RegistryError) as err:
        print(f"helion-kernels {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
