"""Command line: ``helion-kernels {autotune,bench,list}`` (also ``python -m helion_kernels``).

Only argument parsing and printing live here; the work is in :mod:`.tuning` and
:mod:`.benchmark`, generic over every kernel's spec. Those (and Helion) are imported by the
command that needs them, after its arguments are checked, so ``--help``, ``list`` and a
mistyped argument answer fast.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
import textwrap
import time
import warnings
from pathlib import Path

import torch

from . import registry, workloads
from .techniques import CATALOG, DEPRECATED, canonical_name, get_spec
from .spec import ATTENTION_WORKLOAD

DTYPES = {name: getattr(torch, name) for name in registry.DTYPE_NAMES}
WIDTH = 120  # what the CPU report is laid out for
_CHECKOUT = Path(__file__).resolve().parent.parent

CPU_LEGEND = (
    "config = where the row's config comes from: exact (tuned at this key on this GPU), nearest (tuned at "
    "tuned_at, or on another GPU of the same architecture) or default (nothing tuned); build = the kernel build a "
    "call compiles (static: this exact shape; dynamic: once per config for every M); codegen = ok when Helion "
    "generates Triton code for that config here (else the reason is listed below).")
RUNS_LEGEND = (
    "runs = what the op runs there: the fused kernel or its unfused pipeline (the registry's recorded choice, or N "
    "past the full-row limit; \"training:\" the choice when autograd records the call; *: measured with the config "
    "the entry had before its last re-tune); unfused (Liger norm) = cuBLAS + Liger's norm where liger-kernel runs, "
    "else the compiled norm.")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="helion-kernels", description=(
        "Tune, benchmark and list the fused GEMM / attention + norm kernels of helion-kernels."))
    sub = p.add_subparsers(dest="command", required=True)
    ops = [name for name, entry in CATALOG.items() if entry.public]
    inside = [f"{name} ({entry.technique.split(':')[0]})" for name, entry in CATALOG.items() if not entry.public]

    def common(sp: argparse.ArgumentParser, shape: bool) -> None:
        sp.add_argument("--kernel", required=True, choices=_KernelChoices([*ops, *(n for n in CATALOG if n not in ops)]),
                        metavar="KERNEL", help=f"an op: {', '.join(ops)}; or a kernel an op runs inside it: "
                                               f"{'; '.join(inside)}")
        group = sp.add_mutually_exclusive_group(required=True)
        if shape:
            group.add_argument("--shape", help="one GEMM shape M,K,N (GEMM-shaped kernels)")
        group.add_argument("--workload", help=(
            f"a workload table: GEMM ({', '.join(workloads.list_workloads('gemm'))}) or attention "
            f"({', '.join(workloads.list_workloads('attention'))})"))
        sp.add_argument("--where", help="pandas query selecting workload rows, e.g. 'M == 65536' or 'H == 4'")
        sp.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES), help="input dtype (default bfloat16)")

    tune_help = ("tune shapes on this GPU and save verified configs in the user registry (attention "
                 "kernels: one config per (H, D), tuned on its row with the longest sequences)")
    tune = sub.add_parser("autotune", help=tune_help, description=(
        tune_help[0].upper() + tune_help[1:] + ". Each config is checked against an fp32 reference and for "
        "bit-identical reruns before it is saved; a rerun skips the shapes already saved."))
    common(tune, shape=True)
    tune.add_argument("--effort", default="quick", choices=["quick", "full"],
                      help="Helion's autotune_effort: quick (its LFBO tree search from the seeds, up to 5 "
                           "generations) or full (a longer search) (default quick)")
    tune.add_argument("--budget-seconds", type=positive_int, default=60,
                      help="Helion autotune_budget_seconds per shape (default 60). Helion first times "
                           "the seeds (this package's and its own: 14-17 configs, tens of seconds for the "
                           "GEMM kernels), so a much smaller budget leaves no time for its search; "
                           "the line printed per shape gives how many configs it timed")
    tune.add_argument("--no-compiler-seeds", dest="compiler_seeds", action="store_false", help=(
        "leave Helion's own compiler seeds out of the first population (its "
        "disable_autotuner_heuristics), so about half as many configs are timed before the search "
        "starts: this package's seeds, Helion's default and its cached configs (experimental: not "
        "yet compared with the default on a GPU)"))
    again = tune.add_mutually_exclusive_group()
    again.add_argument("--force", action="store_true", help="re-tune shapes already in the registry")
    again.add_argument("--retune-before", type=date_arg, metavar="YYYY-MM-DD", help=(
        "re-tune the entries tuned before this date (UTC, as the registry's tuned_at) and tune the "
        "missing ones; entries from this date on are kept, so a re-tune that was stopped resumes "
        "where it stopped"))
    tune.add_argument("--time-limit", type=positive_int, metavar="SECONDS", help=(
        "end the sweep within this many seconds of the command's start (a batch job's limit, less "
        "Python's and torch's start-up): a shape starts only while its budget + 50 s remain (the most "
        "a shape ran past its budget, at --effort quick), the rest are reported 'not "
        "started' and the command exits 3; the same command later tunes them and skips the finished "
        "ones. A limit below budget + 50 s is refused"))
    tune.add_argument("--seed", type=int, default=0, help="random seed of inputs and search")
    tune.add_argument("--gpus", default="1", type=_gpus_value, help=(
        "tune on this many GPUs at once (a count, or 'all'): one worker process per GPU takes the "
        "next shape from one queue, the largest first (default 1: in this process)"))

    bench = sub.add_parser("bench", help="time a kernel over a workload against the unfused baselines", description=(
        "Time a kernel over a workload's rows against the unfused baselines (cuBLAS + the compiled "
        "norm, and Liger's norm where installed), as CUDA-graph medians, and write "
        "<kernel>_<workload>[_<the --where in words>].{csv,md,json,png} under --out. Without a CUDA GPU nothing is "
        "timed: it checks, per row, which registry config a call would use and that Helion generates "
        "code for it, then prints the committed results."))
    common(bench, shape=False)
    bench.add_argument("--out", type=Path, default=None, help="results folder (default bench/results/<gpu>/)")
    bench.add_argument("--repeats", type=positive_int, default=1, help=(
        "time every column in this many repeats (each repeat takes the columns in order, then reversed, "
        "each a CUDA-graph median) and report the medians, and the GEMM ratios with their spread over "
        "the repeats (default 1)"))

    sub.add_parser("list", help="kernels, workloads and registry coverage")
    return p


class _KernelChoices(list):
    """The --kernel names argparse lists; an old name (:data:`~.techniques.DEPRECATED`) is
    accepted too, with a note, but not offered."""

    def __contains__(self, name) -> bool:
        return super().__contains__(name) or name in DEPRECATED


def positive_int(value: str) -> int:
    """A positive integer (an argparse ``type``)."""
    if not (value.isdigit() and int(value) > 0):
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return int(value)


def date_arg(value: str) -> datetime.date:
    """A YYYY-MM-DD date (an argparse ``type``; Python 3.11's other ISO forms are refused too)."""
    try:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            raise ValueError(value)
        return datetime.date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {value!r}") from None


def _gpus_value(value: str) -> str:
    """``--gpus`` checked for its form (a positive count or "all") when the arguments are read;
    against the machine's GPUs later (:func:`~.parallel.parse_gpus`)."""
    if value != "all" and not (value.isdigit() and int(value) > 0):
        raise argparse.ArgumentTypeError(f"must be a positive integer or 'all', got {value!r}")
    return value


def _problems(args: argparse.Namespace) -> list:
    """The rows to tune or benchmark: ``--shape`` or ``--workload`` [``--where``], checked
    against the kernel's workload kind (read off the catalog: Helion is not imported yet)."""
    kind = CATALOG[args.kernel].workload
    if getattr(args, "shape", None):
        if kind != "gemm":
            raise ValueError(f"{args.kernel} is tuned on {kind} workload rows (sequence lengths), not "
                             f"--shape; use --workload {ATTENTION_WORKLOAD} [--where 'H == 4']")
        if args.where:
            raise ValueError("--where applies to --workload, not --shape")
        return [workloads.parse_shape(args.shape)]
    table = workloads.load_workload(args.workload, args.where, kind=kind)
    return workloads.problems(table, kind)


def _cmd_autotune(args: argparse.Namespace) -> int:
    started = time.time()  # --time-limit counts from here, before Helion's import
    problems = _problems(args)
    if not torch.cuda.is_available():
        print("helion-kernels autotune: autotuning times kernels on a CUDA GPU and none was found.",
              file=sys.stderr)
        return 2
    from .tuning import OVERSHOOT_SECONDS, TuneOptions, tune

    from .parallel import parse_gpus

    try:
        gpus = parse_gpus(args.gpus, torch.cuda.device_count())
    except ValueError as err:
        print(f"helion-kernels autotune: {err}", file=sys.stderr)
        return 2
    if args.time_limit is not None and args.time_limit < args.budget_seconds + OVERSHOOT_SECONDS:
        print(f"helion-kernels autotune: --time-limit {args.time_limit} s leaves no time for one shape: "
              f"a shape can take its {args.budget_seconds} s budget + {OVERSHOOT_SECONDS} s", file=sys.stderr)
        return 2
    spec = get_spec(args.kernel)
    if (_CHECKOUT / "autotune_cache").is_dir():  # a source checkout keeps Helion's cache there
        os.environ.setdefault("HELION_CACHE_DIR", str(_CHECKOUT / "autotune_cache"))
    options = TuneOptions(effort=args.effort, budget_seconds=args.budget_seconds, force=args.force, seed=args.seed,
                          compiler_seeds=args.compiler_seeds, retune_before=args.retune_before,
                          deadline=None if args.time_limit is None else started + args.time_limit)
    results = tune(spec, problems, DTYPES[args.dtype], options, torch.device("cuda"), gpus)
    counts = {s: sum(r.status == s for r in results) for s in ("tuned", "skipped", "not started", "failed")}
    path = registry.registry_path(spec.name, registry.gpu_key("cuda"))
    late = f", {counts['not started']} not started (--time-limit; run the command again)" if counts["not started"] else ""
    print(f"{counts['tuned']} tuned, {counts['skipped']} skipped{late}, {counts['failed']} failed; registry: {path}")
    return 1 if counts["failed"] else 3 if counts["not started"] else 0


def _stem(args: argparse.Namespace, kernel: str) -> str:
    """The one table of ``kernel`` on the workload (every dtype and --where selection in it)."""
    return f"{kernel}_{args.workload}"


def _cpu_bench(args: argparse.Namespace, spec, problems: list) -> int:
    import pandas as pd

    from . import results
    from .benchmark import cpu_report

    report = cpu_report(spec, problems, DTYPES[args.dtype])
    failed = report[report["codegen"] != "ok"]
    report["codegen"] = report["codegen"].where(report["codegen"] == "ok", "FAILED")
    key = [c for c in report.columns if c in type(problems[0].key)._fields] + ["dtype"]
    tables = []
    for gpu, rows in report.groupby("gpu", sort=False):
        found = results.committed(spec, args.workload, gpu)
        if found is not None:
            rows = rows.merge(found, on=[c for c in key if c in found.columns], how="left")
        tables.append(rows)
    shown = pd.concat(tables, ignore_index=True).drop(columns=["tuned_ms"]).dropna(axis=1, how="all")
    if (shown["config"] == "exact").all():
        shown = shown.drop(columns=["tuned_at"])
    gpus = list(dict.fromkeys(shown["gpu"]))
    shown = shown.drop(columns=["gpu", "dtype"] if len(gpus) == 1 else ["dtype"])
    extra = [c for c in ("max_seq_len_q",) if c in shown.columns]  # a committed row's key beyond the registry's
    shown = shown[[*[c for c in key if c in shown.columns], *extra,
                   *[c for c in shown.columns if c not in key and c not in extra]]]
    shown = shown.rename(columns={"best_unfused_ms": "unfused_ms"})
    print(textwrap.fill(
        f"No CUDA GPU found: nothing is timed or written. Per registry key of the {args.workload} rows "
        f"({args.dtype}, {len(problems)} row{'s' if len(problems) > 1 else ''}) on {', '.join(gpus)}: the config "
        f"{spec.name} would run with, whether Helion generates its Triton code here, and the committed GPU "
        "result.", WIDTH) + "\n")
    print(shown.to_string(index=False, na_rep="-", float_format=lambda v: f"{v:.4g}"))
    print()
    tables = ", ".join(f"bench/results/{g}/{_stem(args, spec.name)}.csv" for g in gpus
                       if results.table_path(g, spec.name, args.workload).is_file())  # GPUs with results
    for text in (CPU_LEGEND, RUNS_LEGEND if "runs" in shown.columns else "",
                 results.COMMITTED_LEGEND.format(table=tables) if "fused_ms" in shown.columns
                 else f"No committed GPU results of {spec.name} on {args.workload}."):
        if text:
            print(textwrap.fill(text, WIDTH))
    for row in failed.itertuples():
        print(textwrap.fill(f"FAILED {row.gpu} {dict(row._asdict())}: {row.codegen}", WIDTH, subsequent_indent="  "))
    print(f"{len(report) - len(failed)} of {len(report)} configs compile. Numerical CPU checks: the README's test command.")
    return 1 if len(failed) else 0


def _cmd_bench(args: argparse.Namespace) -> int:
    problems = _problems(args)
    spec = get_spec(args.kernel)
    if not torch.cuda.is_available():
        if args.repeats > 1:
            print("(no GPU: nothing is timed, so --repeats does not apply)")
        return _cpu_bench(args, spec, problems)
    from .benchmark import RESULTS_DIR, run_benchmark, write_results

    df, meta = run_benchmark(spec, problems, DTYPES[args.dtype], torch.device("cuda"), args.repeats)
    out_dir = args.out or RESULTS_DIR / meta["gpu_key"]
    paths = write_results(df, meta, out_dir, _stem(args, spec.name))
    cols = [c for c in df.columns if c in ("M", "K", "N", "H", "max_seq_len_q", "config", "check")
            or c in (f"{spec.name}_ms", "speedup_vs_best_unfused", "saved_vs_cublas_inductor_pct",
                     "dispatch", "fused_over_floor", "rel_error")]
    print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print("\nwrote " + ", ".join(str(p) for p in paths))
    checks = [c for c in df.columns if c == "check" or c.endswith("_check")]
    bad = df[(df[checks] != "ok").any(axis=1)]
    for row in bad.to_dict("records"):
        print(f"WRONG RESULTS at {', '.join(f'{c}={row[c]}' for c in df.columns[:3])}: "
              f"{'; '.join(f'{c}: {row[c]}' for c in checks if row[c] != 'ok')}", file=sys.stderr)
    return 1 if len(bad) else 0


def _cmd_list(args: argparse.Namespace) -> int:
    print("kernels (op = registry file = --kernel):")
    for name, entry in CATALOG.items():
        print(f"  {name:28} {entry.technique}")
    for old, new in DEPRECATED.items():
        print(f"  {old:28} deprecated name of {new}")
    print("workloads:")
    for kind in workloads.KINDS:
        for name in workloads.list_workloads(kind):
            try:  # one bad table of the user's is reported, and the listing goes on
                mine = ", your table in place of the shipped one" if workloads.replaces_shipped(name, kind) else ""
                print(f"  {name:28} {len(workloads.load_workload(name, kind=kind))} rows ({kind}{mine})")
            except ValueError as err:
                print(f"  {name:28} unusable ({kind}): {err}")
    print(f"registry (user: {registry.user_dir()}; shipped: {registry.shipped_dir()}):")
    gpus = registry.known_gpus()
    width = max([24, *map(len, gpus)])
    for gpu in gpus:
        for name in CATALOG:
            try:  # one corrupt file is reported, and the listing goes on
                layers = registry.entries_by_layer(name, gpu)
                merged = registry.merge_layers(layers)
            except registry.RegistryError as err:
                print(f"  {gpu:{width}} {name:28} unusable: {err}")
                continue
            if merged:
                print(f"  {gpu:{width}} {name:28} {_count(len(merged), 'entry', 'entries')}{_layers(layers)}")
        for path in registry.unknown_files(gpu, CATALOG):
            hint = f"; its op is now {DEPRECATED[path.stem]}" if path.stem in DEPRECATED else ""
            print(f"  {gpu:{width}} {path.name}: no op of this name{hint}; ignored")
    return 0


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _layers(layers: dict) -> str:
    """Where a kernel's entries come from, when the two registry layers are separate folders."""
    if "shipped" not in layers:  # both layers are one folder
        return ""
    user, shipped = layers["user"], layers["shipped"]
    if not user:
        return " (shipped)"
    replacing = len(user.keys() & shipped.keys())
    mine = f"{len(user)} yours" + (f", {replacing} replacing shipped ones" if replacing else "")
    return f" ({mine}; {len(shipped)} shipped)" if shipped else " (all yours)"


def _shape_value_joined(argv: list[str]) -> list[str]:
    """``--shape -4,5,5`` as ``--shape=-4,5,5``: argparse takes a value that starts with "-"
    for an option, which would hide the shape's own error message."""
    argv = list(argv)
    for i, arg in enumerate(argv[:-1]):
        if arg == "--shape" and argv[i + 1].startswith("-"):
            argv[i:i + 2] = [f"--shape={argv[i + 1]}"]
            break
    return argv


def main(argv: list[str] | None = None) -> int:
    try:  # the parser lists the workload tables, which reads the user registry folder
        parser = _parser()
    except registry.RegistryError as err:
        print(f"helion-kernels: error: {err}", file=sys.stderr)
        return 2
    args = parser.parse_args(_shape_value_joined(sys.argv[1:] if argv is None else argv))
    handler = {"autotune": _cmd_autotune, "bench": _cmd_bench, "list": _cmd_list}[args.command]
    try:
        if getattr(args, "kernel", None):
            with warnings.catch_warnings(record=True) as notes:
                warnings.simplefilter("always", FutureWarning)
                args.kernel = canonical_name(args.kernel)
            for note in notes:  # a deprecated name: one line, not a warning that prints a line of this file
                print(f"helion-kernels {args.command}: note: {note.message}", file=sys.stderr)
        return handler(args)
    except (ValueError, registry.RegistryError) as err:
        print(f"helion-kernels {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (``| head``): not an error of ours
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
