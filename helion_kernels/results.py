"""Committed benchmark results: reading the result tables and printing them beside the
registry (the bench side; the ops never import this).

A result table is ``bench/results/<gpu>/<stem>.csv`` with the run's metadata in
``<stem>.json`` (kernel, command, ``date``, versions, ceilings).
"""

from __future__ import annotations

import datetime
import json
import re
import sys
import textwrap
from pathlib import Path

from . import registry
from .bench_specs import bench_spec

_CHECKOUT = Path(__file__).resolve().parent.parent
WIDTH = 120  # what the CPU report is laid out for


def timestamp(text) -> datetime.datetime | None:
    """An entry's ``tuned_at`` or a result file's ``date`` (ISO 8601, ``+00:00`` or ``Z``) as a
    datetime; None where it is missing or not a date."""
    try:
        return datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def result_meta(csv) -> dict:
    """The metadata the benchmark wrote beside a result table (``<stem>.json`` beside
    ``<stem>.csv``: kernel, command, ``date`` for :func:`timestamp`, versions, ...); {} where
    the table has none."""
    path = Path(csv).with_suffix(".json")
    meta = json.loads(path.read_text()) if path.is_file() else {}
    return meta if isinstance(meta, dict) else {}


class ResultTableError(ValueError):
    """A benchmark result table (or the ``.json`` beside it) that cannot be read, or that
    already has a column :func:`result_rows` adds; the message names the file."""


RESULT_COLUMNS = ("kernel", "file", "measured_at")  # what result_rows adds to each row


def result_rows(csvs, skip_unreadable: bool = False):
    """The rows of benchmark result tables (``pandas.DataFrame``), in the order of ``csvs`` (paths,
    or one path), each with three columns added from its table's :func:`result_meta`:
    ``kernel`` (None where the ``.json`` names none), ``file`` (the table's file name) and
    ``measured_at`` (its ``date`` as a UTC timestamp, NaT where undated).

    Raises:
        ResultTableError: a table or its ``.json`` cannot be read (not there, not a file, not
            CSV or JSON, not UTF-8), or the table has a column named like one of those three.
            With ``skip_unreadable`` such a table is named on stderr and left out instead (a
            report goes on).
    """
    import pandas as pd  # only the reports read result tables: keep it off the op's import path

    frames = []
    for csv in [Path(csvs)] if isinstance(csvs, (str, Path)) else map(Path, csvs):
        try:
            try:
                df = pd.read_csv(csv)
                meta = result_meta(csv)
            except (OSError, ValueError) as err:  # pandas' and json's parse errors are ValueErrors
                raise ResultTableError(f"{csv}: {type(err).__name__}: {err}") from err
            clash = [c for c in RESULT_COLUMNS if c in df.columns]
            if clash:
                raise ResultTableError(f"{csv}: already has column(s) {', '.join(clash)}: not a benchmark result table")
        except ResultTableError as err:
            if not skip_unreadable:
                raise
            print(f"left out {csv.name} ({err})", file=sys.stderr)
            continue
        frames.append(df.assign(kernel=meta.get("kernel"), file=csv.name, measured_at=timestamp(meta.get("date"))))
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(RESULT_COLUMNS))
    out["measured_at"] = pd.to_datetime(out["measured_at"], utc=True)
    return out


def newest_rows(rows, key: list[str]):
    """Per ``key`` of result rows (:func:`result_rows`), the row of the newest table: the latest
    ``measured_at``, undated rows counting as oldest, and among equal dates the later row."""
    return rows.sort_values("measured_at", kind="stable", na_position="first").drop_duplicates(key, keep="last")


def natural_key(path: Path) -> list:
    """Sort key: the numbers in a file name by value (``..._M_65536`` before ``..._M_131072``)."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def _committed_summary(df, path: Path, spec) -> str:
    """A committed result table as text that fits :data:`WIDTH` columns: the row, the fused
    kernel's latency, the best unfused pipeline's, the speed-up and the latency saved; for an
    op with a dispatcher, the path it runs and that path's speed-up."""
    import pandas as pd

    from .benchmark import row_labels

    fused_col = next((c for c in df.columns if c.endswith("_ms") and c.startswith(spec.name)), None)
    unfused = [f"{n}_ms" for n in bench_spec(spec.name).unfused_baselines if f"{n}_ms" in df.columns]
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
    file's JSON, :func:`result_meta`): whether the registry entry at exactly its shape
    was tuned after the benchmark ran, so the committed times are not the config a call runs
    there. None where that is not known (no date, no M/K/N/dtype columns). The registry is the
    merged one (a user's own re-tune counts)."""
    date = timestamp(measured)
    if date is None or not {"M", "K", "N", "dtype"} <= set(df.columns):
        return None
    newer = []
    for entry in _exact_entries(df, spec, gpu):
        tuned = timestamp(entry.meta.get("tuned_at")) if entry is not None else None
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


def print_committed(spec, stem: str, workload: str, where: str | None) -> None:
    """The committed GPU results of ``spec``'s kernel on ``workload`` (the rows of ``where``),
    compactly; ``stem``: the file name of exactly this selection."""
    import pandas as pd

    from .benchmark import row_labels

    results = _CHECKOUT / "bench" / "results"
    shown = 0
    for gpu in registry.known_gpus():
        paths = [results / gpu / f"{stem}.csv"]
        if not paths[0].is_file():  # this exact selection if it was benchmarked, else any of the workload
            paths = sorted((results / gpu).glob(f"{spec.name}_{workload}*.csv"), key=natural_key)
        tables = [(path, pd.read_csv(path)) for path in paths]
        note = ""
        if where:  # the files' rows of the selection; all rows of each file only if none has any
            picked = []
            for path, df in tables:
                try:
                    picked.append((path, df.query(where)))
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
            date = result_meta(path).get("date", "")
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
        print("\n" + textwrap.fill(f"No committed GPU results of {spec.name} on the {workload} rows selected; "
                                   "the measured variants and diagnostics are listed in bench/results/README.md.", WIDTH))
