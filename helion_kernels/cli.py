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
from .kernels import CATALOG, DEPRECATED, canonical_name, get_spec

DTYPES = {name: getattr(torch, name) for name in registry.DTYPE_NAMES}
WIDTH = 120  # what the CPU report is laid out for
_CHECKOUT = Path(__file__).resolve().parent.parent

CPU_LEGEND = """\
Columns: gpu = registry folder (GPU name and architecture); the key columns (M, K, N or H, D)
and dtype = the call; config = where its config comes from: exact (tuned at this key on this
GPU), nearest (tuned at the key in tuned_at, or on another GPU of the same architecture) or
default (nothing tuned: the kernel's conservative config); tuned_ms = the latency recorded
when the exact entry was tuned; build = the kernel build a call compiles (static: for this
exact shape; dynamic: once per config for every M); codegen = ok when Helion generates Triton
code for that config at this key here (else the reason is listed below the table)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="helion-kernels", description=(
        "Tune, benchmark and list the fused GEMM / attention + norm kernels of helion-kernels."))
    sub = p.add_subparsers(dest="command", required=True)
    kernels = ", ".join(CATALOG)

    def common(sp: argparse.ArgumentParser, shape: bool) -> None:
        sp.add_argument("--kernel", required=True, choices=[*CATALOG, *DEPRECATED], metavar="KERNEL",
                        help=f"one of: {kernels}")
        group = sp.add_mutually_exclusive_group(required=True)
        if shape:
            group.add_argument("--shape", help="one GEMM shape M,K,N (GEMM-shaped kernels)")
        group.add_argument("--workload", help=(
            f"a workload table: GEMM ({', '.join(workloads.list_workloads('gemm'))}) or attention "
            f"({', '.join(workloads.list_workloads('attention'))})"))
        sp.add_argument("--where", help="pandas query selecting workload rows, e.g. 'M == 65536' or 'H == 4'")
        sp.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES), help="input dtype (default bfloat16)")

    tune = sub.add_parser("autotune", help=(
        "tune shapes on this GPU and save verified configs in the user registry (attention "
        "kernels: one config per (H, D), tuned on its row with the longest sequences)"))
    common(tune, shape=True)
    tune.add_argument("--effort", default="quick", choices=["quick", "full"],
                      help="Helion's autotune_effort: quick (its LFBO tree search from the seeds, up to 5 "
                           "generations) or full (a longer search) (default quick)")
    tune.add_argument("--budget-seconds", type=positive_int, default=60,
                      help="Helion autotune_budget_seconds per shape (default 60). Helion first times "
                           "the seeds (this package's and its own: 14-17 configs, 20-40 s for the GEMM "
                           "kernels on an H200), so a much smaller budget leaves no time for its search; "
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
        "a shape ran past its budget on an H200, at --effort quick), the rest are reported 'not "
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
                             f"--shape; use --workload (e.g. {args.kernel}) [--where 'H == 4']")
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
    stem = f"{kernel}_{args.workload}{workloads.where_suffix(args.where)}"
    return stem if args.dtype == "bfloat16" else f"{stem}_{args.dtype}"


def _natural(path: Path) -> list:
    """Sort key: the numbers in a file name by value (``..._M_65536`` before ``..._M_131072``)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def _committed_summary(df, path: Path, spec) -> str:
    """A committed result table as text that fits :data:`WIDTH` columns: the row, the fused
    kernel's latency, the best unfused pipeline's, the speed-up and the latency saved; for an
    op with a dispatcher, the path it runs and that path's speed-up."""
    import pandas as pd

    from .benchmark import row_labels

    fused_col = next((c for c in df.columns if c.endswith("_ms") and c.startswith(spec.name)), None)
    unfused = [f"{n}_ms" for n in spec.unfused_baselines if f"{n}_ms" in df.columns]
    if fused_col is None or not unfused:
        return f"(columns not recognised; see {path})"
    out = pd.DataFrame({"row": row_labels(df), "fused_ms": df[fused_col],
                        "best_unfused_ms": df[unfused].min(axis=1)})
    out["speedup"] = out["best_unfused_ms"] / out["fused_ms"]
    if "saved_vs_cublas_inductor_pct" in df.columns:
        out["saved_pct"] = df["saved_vs_cublas_inductor_pct"]
    if {"dispatch", "dispatched_speedup_vs_best_unfused"} <= set(df.columns):
        out["runs"] = df["dispatch"]
        out["runs_speedup"] = df["dispatched_speedup_vs_best_unfused"]
    return out.to_string(index=False, float_format=lambda v: f"{v:.4g}")


def _retuned_since(df, measured, spec, gpu: str) -> list[bool] | None:
    """Per row of a committed result table measured at ``measured`` (the ``date`` of the
    file's JSON, :func:`registry.result_meta`): whether the registry entry at exactly its shape
    was tuned after the benchmark ran, so the committed times are not the config a call runs
    there. None where that is not known (no date, no M/K/N/dtype columns). The registry is the
    merged one (a user's own re-tune counts)."""
    date = registry.timestamp(measured)
    if date is None or not {"M", "K", "N", "dtype"} <= set(df.columns):
        return None
    newer = []
    for entry in _exact_entries(df, spec, gpu):
        tuned = registry.timestamp(entry.meta.get("tuned_at")) if entry is not None else None
        newer.append(tuned is not None and tuned > date)
    return newer


def _exact_entries(df, spec, gpu: str) -> list:
    """Per row of a result table with M, K, N and dtype columns: the registry entry (merged
    layers) at exactly that key, None where there is none or the row has no shape."""
    entries = registry.entries_for(spec.name, gpu)
    found = []
    for r in df.itertuples():
        try:
            found.append(entries.get((int(r.M), int(r.K), int(r.N), r.dtype)))
        except (TypeError, ValueError):  # a row without a shape
            found.append(None)
    return found


def _decisions_changed(df, spec, gpu: str) -> list[str]:
    """Rows of a committed result table whose recorded path (``dispatch``) is not the one the
    registry's exact entry names today: ``"<row>: then <path>, now <path>"``."""
    from .benchmark import row_labels

    if "dispatch" not in df.columns or not {"M", "K", "N", "dtype"} <= set(df.columns):
        return []
    out = []
    for label, then, entry in zip(row_labels(df), df["dispatch"], _exact_entries(df, spec, gpu)):
        record = entry.meta.get("dispatch") if entry is not None else None
        if record and isinstance(then, str) and registry.dispatch_text(record) != then:
            out.append(f"{label}: then {then}, now {registry.dispatch_text(record)}")
    return out


def _print_committed(args: argparse.Namespace, spec) -> None:
    """The committed GPU results of this kernel and workload, compactly."""
    import pandas as pd

    from .benchmark import row_labels

    results = _CHECKOUT / "bench" / "results"
    shown = 0
    for gpu in registry.known_gpus():
        paths = [results / gpu / f"{_stem(args, spec.name)}.csv"]
        if not paths[0].is_file():  # this exact selection if it was benchmarked, else any of the workload
            paths = sorted((results / gpu).glob(f"{spec.name}_{args.workload}*.csv"), key=_natural)
        tables = [(path, pd.read_csv(path)) for path in paths]
        note = ""
        if args.where:  # the files' rows of the selection; all rows of each file only if none has any
            picked = []
            for path, df in tables:
                try:
                    picked.append((path, df.query(args.where)))
                except Exception:  # a column the file lacks
                    picked.append((path, df.iloc[:0]))
            if any(len(df) for _, df in picked):
                tables = [(path, df) for path, df in picked if len(df)]
            else:
                note = "No committed row matches --where; all rows shown:"
        for path, df in tables:
            shown += 1
            table = _committed_summary(df, path, spec)
            saved = ("; saved_pct = % of the inductor norm's latency saved against cuBLAS + inductor norm"
                     if "saved_pct" in table else "")
            if "runs_speedup" in table:
                saved += ("; runs = the path the op took when this was measured (the registry's decision then), "
                          "runs_speedup = best_unfused_ms / its time")
            dtypes = ", ".join(sorted(set(df["dtype"]))) if "dtype" in df.columns else "dtype not recorded"
            date = registry.result_meta(path).get("date", "")
            print("\n" + textwrap.fill(
                f"Committed results measured on {gpu} ({dtypes}{', ' + date[:16] if date else ''}): "
                f"{path.relative_to(_CHECKOUT)} (full table: "
                f"{path.with_suffix('.md').name}). fused_ms = this kernel, best_unfused_ms = the fastest "
                f"unfused pipeline, speedup = best_unfused_ms / fused_ms{saved}.", WIDTH) + "\n")
            if note:
                print(note)
            print(table)
            changed = _decisions_changed(df, spec, gpu)
            if changed:
                print("\n" + textwrap.fill(
                    "The registry's decision has changed since this benchmark at: " + "; ".join(changed)
                    + " (the registry was updated after this run: a re-tune, or a decision re-derived from "
                    "these medians by bench/dispatch_from_bench.py).", WIDTH))
            retuned = _retuned_since(df, date, spec, gpu)
            if retuned is not None and any(retuned):
                rows = [label for label, newer in zip(row_labels(df), retuned) if newer]
                print("\n" + textwrap.fill(
                    f"Re-tuned since this benchmark ({date[:10]}): {', '.join(rows)}. The registry's "
                    "config and fused/unfused decision there are newer than these times (see the tuning "
                    f"report, bench/results/{gpu}/tuning_report.md); a benchmark on a GPU measures them.", WIDTH))
    if not shown:
        print("\n" + textwrap.fill(f"No committed GPU results of {spec.name} on the {args.workload} rows selected; "
                                   "the measured variants and diagnostics are listed in bench/results/README.md.", WIDTH))


def _cpu_bench(args: argparse.Namespace, spec, problems: list) -> int:
    from .benchmark import cpu_report

    dtype = DTYPES[args.dtype]
    print(textwrap.fill(
        f"No CUDA GPU found: timings need a CUDA GPU (so nothing is written{' to ' + str(args.out) if args.out else ''}). "
        f"Checking instead, for every registry key of the workload and every GPU in the registry, which config "
        f"{spec.name} would run with and that Helion generates Triton code for it here.", WIDTH) + "\n")
    report = cpu_report(spec, problems, dtype)
    failed = report[report["codegen"] != "ok"]
    shown = report.assign(codegen=report["codegen"].where(report["codegen"] == "ok", "FAILED"))
    print(shown.to_string(index=False, na_rep="-"))
    print("\n" + CPU_LEGEND)
    if "runs" in report.columns:
        from . import liger_norm

        here = ("" if torch.cuda.is_available() and liger_norm.available(torch.device("cuda"), 1)
                else " Liger's norm cannot run on this machine (no CUDA GPU or no liger-kernel): here the "
                     "compiled norm would run instead.")
        print(textwrap.fill("runs = what the op runs at that row: the fused kernel, or its unfused pipeline "
                            "(the registry's recorded choice, or N past the full-row limit; \"training:\" the choice when autograd "
                            "records the call, where it was measured apart; *: measured before the entry's last "
                            "re-tune, with the config it had then); unfused (Liger norm) = "
                            "cuBLAS + Liger's norm, where liger-kernel is installed (else the compiled norm)." + here,
                            WIDTH))
    if len(report) < len(problems) * max(1, len(registry.known_gpus())):
        fields = type(problems[0].key)._fields
        why = ("rows that share a key are listed once" if "M" in fields
               else "not by the sequence lengths")  # an attention key (H, D)
        print(textwrap.fill(f"One row per registry key: {spec.name}'s configs are keyed by "
                            f"{', '.join(fields)}; {why}.", WIDTH))
    for row in failed.itertuples():
        print(textwrap.fill(f"FAILED {row.gpu} {dict(row._asdict())}: {row.codegen}", WIDTH,
                            subsequent_indent="  "))
    _print_committed(args, spec)
    print(f"\n{len(report) - len(failed)} of {len(report)} configs compile. "
          "Numerical CPU checks: see the README's test command.")
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
        print(f"  {name:26} {entry.technique}")
    for old, new in DEPRECATED.items():
        print(f"  {old:26} deprecated name of {new}")
    print("workloads:")
    for kind in workloads.KINDS:
        for name in workloads.list_workloads(kind):
            try:  # one bad table of the user's is reported, and the listing goes on
                mine = ", your table in place of the shipped one" if workloads.replaces_shipped(name, kind) else ""
                print(f"  {name:26} {len(workloads.load_workload(name, kind=kind))} rows ({kind}{mine})")
            except ValueError as err:
                print(f"  {name:26} unusable ({kind}): {err}")
    print(f"registry (user: {registry.user_dir()}; shipped: {registry.shipped_dir()}):")
    gpus = registry.known_gpus()
    width = max([24, *map(len, gpus)])
    for gpu in gpus:
        for name in CATALOG:
            try:  # one corrupt file is reported, and the listing goes on
                layers = registry.entries_by_layer(name, gpu)
                merged = registry.merge_layers(layers)
            except registry.RegistryError as err:
                print(f"  {gpu:{width}} {name:26} unusable: {err}")
                continue
            if merged:
                print(f"  {gpu:{width}} {name:26} {_count(len(merged), 'entry', 'entries')}{_layers(layers)}")
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


def main(argv: list[str] | None = None) -> int:
    try:  # the parser lists the workload tables, which reads the user registry folder
        parser = _parser()
    except registry.RegistryError as err:
        print(f"helion-kernels: error: {err}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
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
