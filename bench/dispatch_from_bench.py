"""Record a dispatching op's fused-or-unfused decision from a benchmark CSV.

Tuning times the fused kernel and each unfused pipeline once, in one pass. The benchmark
(``helion-kernels bench --repeats N``) times them N times and reports medians, so where both
exist its numbers are the better evidence. This script applies the library's own rule
(:func:`helion_kernels.tuning.dispatch_decision`, the 2% margin) to the pipelines the kernel's
spec names (``dispatch_baseline``, ``dispatch_alternatives``; the whole op where the spec times
the op, ``dispatch_fused``) and rewrites the ``dispatch`` record of every registry entry the CSV
has a row for, keeping the entry's config and every other entry of the file.

    python bench/dispatch_from_bench.py --kernel matmul_layernorm_split_n \\
        --csv bench/results/nvidia_h200_sm90/matmul_layernorm_split_n_postnorm_split_n.csv

With ``--training`` it reads the table of ``bench/postnorm_training_forward.py`` (the full-row
ops' forward as autograd records it, writing the norm's input for the backward) and rewrites
the entries' ``dispatch_training`` record instead, which the ops follow when autograd records
the call::

    python bench/dispatch_from_bench.py --training --kernel matmul_layernorm \\
        --csv bench/results/nvidia_h200_sm90/matmul_layernorm_training_forward_postnorm_fullrow.csv

It writes the checkout's committed registry (``configs/``) unless ``--registry`` names another
root. Rows without an entry, rows whose fused kernel failed its check, rows with a missing
time and rows whose entry was tuned after the benchmark ran (it timed the previous config) are
reported and skipped; it exits 1 if no row was recorded. Re-tuning an entry records a new
forward decision from tuning's own timing and carries its training record over from the config
it replaced (``tuning.carried_training_record``); run this again after re-running the benchmark. Given several
benchmark files of one kernel, run it on them oldest first, so that each row ends with the
newest measurement's decision (``tests/test_dispatch_from_bench.py`` checks the committed
registry for that).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from pathlib import Path

import pandas as pd

from helion_kernels.bench_specs import bench_spec
from helion_kernels import registry, tuning
from helion_kernels import results
from helion_kernels.techniques import get_spec

ROOT = Path(__file__).resolve().parent.parent
TRAINING_COLUMN = "forward_fused_ms"  # only bench/postnorm_training_forward.py's tables have it
TRAINING_KERNELS = ("matmul_layernorm", "matmul_rmsnorm")  # the ops that read a training record


def decisions(frame: pd.DataFrame, kernel: str) -> pd.DataFrame:
    """One dispatch record per usable benchmark row (columns M, K, N, dtype, record, skipped:
    the reason a row has no record, "" where it has one).

    Raises:
        SystemExit: the kernel does not dispatch, or the CSV lacks its columns.
    """
    spec = get_spec(kernel)
    if spec.dispatch_baseline is None:
        raise SystemExit(f"{kernel} has no dispatcher (its spec names no dispatch_baseline)")
    if spec.workload != "gemm":
        raise SystemExit(f"{kernel} is an {spec.workload} kernel: its dispatch record comes from tuning "
                         f"(helion-kernels autotune --kernel {kernel} --workload ...), not from a benchmark table")
    fused = "fused_op_ms" if bench_spec(spec.name).dispatch_fused is not None else f"{kernel}_ms"
    default = spec.dispatch_baseline
    missing = {fused, f"{default}_ms", "M", "K", "N", "dtype"} - set(frame.columns)
    if missing:
        raise SystemExit(f"the CSV lacks the columns {sorted(missing)}; is it {kernel}'s benchmark?")
    present = [a for a in bench_spec(spec.name).dispatch_alternatives if f"{a}_ms" in frame.columns]
    records, skipped = [], []
    for row in frame.to_dict("records"):
        times = (row[fused], row[f"{default}_ms"])
        if "check" in row and row["check"] != "ok":
            records.append(None), skipped.append(f"the fused kernel's check: {row['check']}"[:120])
        elif any(not isinstance(t, (int, float)) or math.isnan(t) for t in times):
            records.append(None), skipped.append("a missing time")
        else:
            alternatives = {a: float(row[f"{a}_ms"]) for a in present if pd.notna(row[f"{a}_ms"])}
            records.append(tuning.dispatch_decision(float(times[0]), float(times[1]), default, alternatives))
            skipped.append("")
    dates = frame["measured_at"] if "measured_at" in frame.columns else None
    return frame[["M", "K", "N", "dtype"]].assign(record=records, skipped=skipped, measured_at=dates,
                                                  repeats=frame["repeats"] if "repeats" in frame.columns else 1)


def _shown(path: Path) -> str:
    """``path`` relative to the checkout where it lies inside it (what the registry records)."""
    path = path.resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.as_posix()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split()) + " The rule: the fused kernel runs where every "
        "unfused pipeline took at least 2% longer; another pipeline replaces the compiled norm where that "
        "took at least 2% longer than it.")
    parser.add_argument("--kernel", required=True, help="the op's registry name, e.g. matmul_layernorm_split_n")
    parser.add_argument("--csv", required=True, type=Path, help="the benchmark's CSV (helion-kernels bench)")
    parser.add_argument("--gpu", default=None, help="registry GPU key (default: the CSV's folder name)")
    parser.add_argument("--registry", type=Path, default=ROOT / "configs",
                        help="registry root to rewrite (default: the checkout's configs/)")
    parser.add_argument("--training", action="store_true",
                        help=f"the CSV is bench/postnorm_training_forward.py's: write the entries' "
                             f"{registry.TRAINING_DISPATCH} record, not their forward dispatch")
    args = parser.parse_args(argv)

    try:
        args.kernel = get_spec(args.kernel).name  # an old name: the op's current one
    except ValueError as err:
        raise SystemExit(str(err)) from None
    if not args.csv.is_file():
        parser.error(f"--csv {args.csv}: no such file")
    frame = pd.read_csv(args.csv)
    if args.training and args.kernel not in TRAINING_KERNELS:
        raise SystemExit(f"--training: only {' and '.join(TRAINING_KERNELS)} follow a training decision")
    if args.training and TRAINING_COLUMN not in frame.columns:
        raise SystemExit(f"{args.csv} is not a table of bench/postnorm_training_forward.py, which --training reads")
    if not args.training and TRAINING_COLUMN in frame.columns:
        raise SystemExit(f"{args.csv} is a table of bench/postnorm_training_forward.py: pass --training")
    field = registry.TRAINING_DISPATCH if args.training else "dispatch"
    table = decisions(frame, args.kernel)  # the kernel and the CSV's columns checked first

    gpu = args.gpu or args.csv.resolve().parent.name
    os.environ[registry.ENV_CONFIG_DIR] = str(args.registry)  # save_entry writes this root
    path = registry.registry_path(args.kernel, gpu)
    entries = registry.load_entries(path)
    if not entries:
        known = ", ".join(p.name for p in sorted(args.registry.iterdir()) if any(p.glob("*.json"))) \
            if args.registry.is_dir() else ""
        print(f"no {args.kernel} entries in {path}; GPU keys there: {known or 'none'} (--gpu)", file=sys.stderr)
        return 1

    recorded = 0
    for row in table.itertuples(index=False):
        when = row.measured_at if isinstance(row.measured_at, str) else ""  # each row records its own run
        repeats = int(row.repeats) if pd.notna(row.repeats) else 1
        source = f"{_shown(args.csv)} (CUDA-graph medians of {repeats} repeat(s){', ' + when if when else ''})"
        measured_at = results.timestamp(when)
        key = (int(row.M), int(row.K), int(row.N), str(row.dtype))
        entry = entries.get(key)
        if entry is None or row.record is None:
            print(f"skipped {key}: {row.skipped or 'no registry entry'}")
            continue
        tuned = entry.meta.get("tuned_at", "")
        tuned_at = results.timestamp(tuned)
        if tuned_at and measured_at and tuned_at > measured_at:
            if not args.training:
                keeps = "the entry keeps its tuning's decision"
            elif field in entry.meta:
                keeps = "the entry keeps its current training record"
            else:
                keeps = "training calls follow the entry's forward decision"
            print(f"skipped {key}: the entry was tuned ({tuned}) after this benchmark ran ({when}), which "
                  f"timed the previous config; {keeps} (re-run the benchmark)")
            continue
        old = entry.meta.get(field, {})
        record = {**row.record, "source": source}
        registry.save_entry(args.kernel, gpu, dataclasses.replace(entry, meta={**entry.meta, field: record}))
        recorded += 1
        before = registry.dispatch_text(old) if old else "-"
        times = ", ".join(f"{name} {ms:.4g}" for name, ms in record.get("unfused_timed_ms",
                                                                       {record["unfused"]: record["unfused_ms"]}).items())
        print(f"{'x'.join(map(str, key[:3]))} {key[3]}{' training' if args.training else ''}: {before} -> {registry.dispatch_text(record)} "
              f"(fused {record['fused_ms']:.4g} ms; {times} ms; margin {record['margin']})")
    print(f"{recorded} record(s) written to {path}")
    return 0 if recorded else 1


if __name__ == "__main__":
    raise SystemExit(main())
