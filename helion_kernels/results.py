"""Committed benchmark results (the bench side; the ops never import this): one table per
op, workload and GPU, written and read here, and printed beside the registry.

A table is ``bench/results/<gpu>/<op>_<workload>.csv`` (with its ``.md`` and plot). Each row
carries its own provenance (:data:`PROVENANCE`: when, at which commit, by which command, with
which timer, column order and repeats, and the ceilings its floors used); a re-run replaces its
rows in place (:func:`write_table`), so any row's current number is in one file.
"""

from __future__ import annotations

import datetime
import math
import subprocess
import sys
from pathlib import Path

from . import registry
from .bench_specs import bench_spec

_CHECKOUT = Path(__file__).resolve().parent.parent

# What every row records of the run that measured it.
PROVENANCE = ("measured_at", "commit", "command", "timer", "order", "repeats", "copy_GBps", "gemm_TFLOPs", "versions")
# The columns that name a row (those a table has): a re-run replaces the rows with the same values.
KEY_COLUMNS = ("kernel", "layer", "mode", "bias", "timer", "lr", "M", "K", "N", "N2", "batch", "H", "D",
               "max_seq_len_q", "seq_len_kv", "fill", "seed", "dtype")


def timestamp(text) -> datetime.datetime | None:
    """An entry's ``tuned_at`` or a result's ``measured_at`` / ``date`` (ISO 8601, ``+00:00``
    or ``Z``) as a datetime; None where it is missing or not a date."""
    try:
        return datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


class ResultTableError(ValueError):
    """A benchmark result table that cannot be read; the message names the file."""


RESULT_COLUMNS = ("kernel", "file", "measured_at")  # what result_rows gives every row


def result_rows(csvs, skip_unreadable: bool = False):
    """The rows of result tables (``pandas.DataFrame``), in the order of ``csvs`` (paths, or one
    path), each with ``kernel`` (None where the table has none), ``measured_at`` (a UTC
    timestamp, NaT where undated) and ``file`` (the table's file name).

    Raises:
        ResultTableError: a table cannot be read, or has a ``file`` column. With
            ``skip_unreadable`` such a table is named on stderr and left out instead.
    """
    import pandas as pd  # only the reports read result tables: keep it off the op's import path

    frames = []
    for csv in [Path(csvs)] if isinstance(csvs, (str, Path)) else map(Path, csvs):
        try:
            try:
                df = pd.read_csv(csv)
            except (OSError, ValueError) as err:  # pandas' parse errors are ValueErrors
                raise ResultTableError(f"{csv}: {type(err).__name__}: {err}") from err
            if "file" in df.columns:
                raise ResultTableError(f"{csv}: already has a column 'file': not a benchmark result table")
        except ResultTableError as err:
            if not skip_unreadable:
                raise
            print(f"left out {csv.name} ({err})", file=sys.stderr)
            continue
        if "kernel" not in df.columns:
            df = df.assign(kernel=None)
        if "measured_at" not in df.columns:
            df = df.assign(measured_at=None)
        frames.append(df.assign(file=csv.name))
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(RESULT_COLUMNS))
    out["measured_at"] = pd.to_datetime(out["measured_at"], utc=True, format="ISO8601")
    return out


def newest_rows(rows, key: list[str]):
    """Per ``key`` of result rows (:func:`result_rows`), the row of the newest run: the latest
    ``measured_at``, undated rows counting as oldest, and among equal dates the later row."""
    return rows.sort_values("measured_at", kind="stable", na_position="first").drop_duplicates(key, keep="last")


def row_key(df) -> list[str]:
    """The columns that name a row of ``df`` (:data:`KEY_COLUMNS` it has)."""
    return [c for c in KEY_COLUMNS if c in df.columns]


def checkout_commit() -> str:
    """The checkout's short commit hash (``+`` where its package has uncommitted changes);
    "unknown" outside a git checkout."""
    def git(*args):
        done = subprocess.run(["git", "-C", str(_CHECKOUT), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown"
    return commit + ("+" if git("status", "--porcelain", "--", "helion_kernels", "configs") else "")


def with_provenance(df, meta: dict):
    """``df`` with the :data:`PROVENANCE` columns of the run ``meta`` describes (its keys of
    those names) where a row has none of its own."""
    df = df.copy()
    for column in PROVENANCE:
        value = meta.get(column)
        if column not in df.columns:
            df[column] = value
        elif value is not None:
            df[column] = df[column].where(df[column].notna(), value)
    return df


def merge_rows(old, new):
    """``old`` with the rows of ``new`` in place of those they name (:func:`row_key`), new
    keys appended; the order of ``old``, then of ``new``."""
    import pandas as pd

    if old is None or old.empty:
        return new.reset_index(drop=True)
    key = [c for c in row_key(new) if c in old.columns]
    both = pd.concat([old.assign(_new=False), new.assign(_new=True)], ignore_index=True)
    if not key:
        return new.reset_index(drop=True)
    both["_key"] = both[key].astype(str).agg("|".join, axis=1)
    first = both.drop_duplicates("_key", keep="first").set_index("_key").index
    latest = both.drop_duplicates("_key", keep="last").set_index("_key")
    return latest.loc[first].drop(columns=["_new"]).reset_index(drop=True)


def write_table(df, meta: dict, out_dir: Path, stem: str, title: str, notes: tuple[str, ...] = (),
                plot_fn=None) -> list[Path]:
    """Merge the run's rows ``df`` (their provenance from ``meta``, :func:`with_provenance`)
    into ``<out_dir>/<stem>.csv`` in place (:func:`merge_rows`), and write the whole table's
    ``.md`` (``title``, ``notes``, the runs it holds, the rows) and, with
    ``plot_fn(table, meta, path)``, its ``.png``. The file is replaced whole (written beside
    it, then renamed), so an interrupted run leaves the old table."""
    import pandas as pd

    out_dir.mkdir(parents=True, exist_ok=True)
    csv = out_dir / f"{stem}.csv"
    old = pd.read_csv(csv) if csv.is_file() else None
    table = merge_rows(old, with_provenance(df, meta))
    paths = [csv, out_dir / f"{stem}.md"]
    _replace(csv, table.to_csv(index=False, float_format="%.5g"))
    _replace(paths[1], table_markdown(table, title, notes))
    if plot_fn is not None:
        paths.append(out_dir / f"{stem}.png")
        plot_fn(table, meta, paths[2])
    return paths


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def table_markdown(table, title: str, notes: tuple[str, ...] = ()) -> str:
    """A result table as Markdown: ``title``, ``notes``, its runs (date, commit, timer, order,
    repeats, command, versions, ceilings: one line each, numbered) and the table, each row
    naming its run."""
    import pandas as pd

    runs_cols = [c for c in PROVENANCE if c in table.columns]
    runs = table[runs_cols].astype(str).drop_duplicates().reset_index(drop=True)
    run_of = table[runs_cols].astype(str).agg("|".join, axis=1).map(
        {v: i + 1 for i, v in enumerate(runs.agg("|".join, axis=1))})
    lines = [f"# {title}", "", *(f"- {note}" for note in notes), "", "Runs (each row names its run):", ""]
    for i, run in runs.iterrows():
        r = {k: v for k, v in run.to_dict().items() if v not in ("", "nan", "None")}
        parts = [r.get("measured_at", "undated")[:16], f"commit {r['commit']}" if "commit" in r else "",
                 f"timer {r['timer']} ({r.get('order', '?')}, {r.get('repeats', '?')} repeat(s))" if "timer" in r else "",
                 f"floors at {r['copy_GBps']} GB/s copy and {r['gemm_TFLOPs']} TFLOP/s bf16"
                 if "copy_GBps" in r and "gemm_TFLOPs" in r else "",
                 f"`{r['command']}`" if "command" in r else "", f"({r['versions']})" if "versions" in r else ""]
        lines.append(f"{i + 1}. " + ", ".join(p for p in parts if p))
    shown = table.drop(columns=runs_cols).assign(run=run_of.values)
    for col in shown.select_dtypes("float").columns:  # 4 significant digits, integers kept
        shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else f"{v:.4g}")
    shown = shown.map(lambda v: v[:57] + "..." if isinstance(v, str) and len(v) > 60 else v)
    return "\n".join(lines + ["", shown.to_markdown(index=False), ""])


CEILINGS = "ceilings"  # bench/results/<gpu>/ceilings.csv: the ceilings every floor of that GPU reads
FLOOR_COLUMNS = ("byte_floor_ms", "flop_floor_ms", "fused_over_floor")


def read_ceilings(gpu_dir: Path):
    """The ceilings every floor of one GPU reads (:class:`~helion_kernels.timing.Ceilings`):
    the best ``copy`` and ``bf16_gemm`` rates of ``<gpu_dir>/ceilings.csv``; None where the file
    is missing or lacks either."""
    import pandas as pd

    from .timing import Ceilings

    path = Path(gpu_dir) / f"{CEILINGS}.csv"
    if not path.is_file():
        return None
    df = pd.read_csv(path)
    best = df.groupby("kind")["rate"].max()
    if not {"copy", "bf16_gemm"} <= set(best.index):
        return None
    return Ceilings(bandwidth_gbps=float(best["copy"]), bf16_tflops=float(best["bf16_gemm"]))


def write_ceilings(gpu_dir: Path, rows: list[dict], meta: dict, notes: tuple[str, ...] = ()) -> list[Path]:
    """``<gpu_dir>/ceilings.{csv,md}``: the measurements ``rows`` (``kind``, ``method``,
    ``size``, ``ms``, ``rate``, ``note``) replace the file whole; the best of each kind is the
    ceiling (:func:`read_ceilings`); ``notes`` go to the ``.md``."""
    import pandas as pd

    df = with_provenance(pd.DataFrame(rows), {k: v for k, v in meta.items() if k not in ("copy_GBps", "gemm_TFLOPs")})
    df = df.drop(columns=["copy_GBps", "gemm_TFLOPs", "order", "repeats"], errors="ignore")
    gpu_dir.mkdir(parents=True, exist_ok=True)
    paths = [gpu_dir / f"{CEILINGS}.csv", gpu_dir / f"{CEILINGS}.md"]
    _replace(paths[0], df.to_csv(index=False, float_format="%.5g"))
    best = df.groupby("kind")["rate"].max()
    notes = (f"copy ceiling {best.get('copy', float('nan')):.0f} GB/s (bytes read + written), bf16 GEMM ceiling "
             f"{best.get('bf16_gemm', float('nan')):.0f} TFLOP/s: the best row of each kind; every "
             "`byte_floor_ms` / `flop_floor_ms` of this GPU's tables is computed at these", *notes)
    _replace(paths[1], table_markdown(df, f"Ceilings of {meta.get('gpu', gpu_dir.name)}", notes))
    return paths


def refloor(table, ceilings):
    """``table`` with its floor columns (:data:`FLOOR_COLUMNS`) recomputed at ``ceilings`` from
    the ones each row was computed at (its ``copy_GBps`` / ``gemm_TFLOPs``): a floor is bytes
    (or FLOPs) over a rate, so it scales by old rate / new rate; ``fused_over_floor`` is the
    row's ``<kernel>_ms`` over the larger floor."""
    if not set(FLOOR_COLUMNS) <= set(table.columns):
        return table
    t = table.copy()
    t["byte_floor_ms"] = t["byte_floor_ms"] * t["copy_GBps"] / ceilings.bandwidth_gbps
    t["flop_floor_ms"] = t["flop_floor_ms"] * t["gemm_TFLOPs"] / ceilings.bf16_tflops
    fused = [row.get(f"{row['kernel']}_ms") for _, row in t.iterrows()]
    t["fused_over_floor"] = [f / max(b, g) for f, b, g in zip(fused, t["byte_floor_ms"], t["flop_floor_ms"])]
    t["copy_GBps"] = round(ceilings.bandwidth_gbps, 1)
    t["gemm_TFLOPs"] = round(ceilings.bf16_tflops, 1)
    return t


def refloor_tables(gpu_dir: Path, ceilings) -> list[Path]:
    """Recompute the floors of every result table in ``gpu_dir`` at ``ceilings`` (:func:`refloor`),
    rewriting the ``.csv`` and the table of its ``.md``; the tables changed."""
    import pandas as pd

    changed = []
    for csv in sorted(Path(gpu_dir).glob("*.csv")):
        table = pd.read_csv(csv)
        if not set(FLOOR_COLUMNS) <= set(table.columns) or "copy_GBps" not in table.columns:
            continue
        table = refloor(table, ceilings)
        _replace(csv, table.to_csv(index=False, float_format="%.5g"))
        md = csv.with_suffix(".md")
        if md.is_file():  # keep the title and notes, re-render the runs and rows
            head = md.read_text().split("\nRuns (each row names its run):")[0].splitlines()
            title = head[0].removeprefix("# ") if head else csv.stem
            notes = tuple(line.removeprefix("- ") for line in head[1:] if line.startswith("- "))
            _replace(md, table_markdown(table, title, notes))
        changed.append(csv)
    return changed


def table_path(gpu: str, kernel: str, workload: str) -> Path:
    """The committed table of ``kernel`` on ``workload`` measured on ``gpu``."""
    return _CHECKOUT / "bench" / "results" / gpu / f"{kernel}_{workload}.csv"


COMMITTED_COLUMNS = ("fused_ms", "best_unfused_ms", "speedup", "saved_pct", "measured")


def committed(spec, workload: str, gpu: str):
    """The committed GPU results of ``spec``'s kernel on ``workload`` measured on ``gpu``, one
    row per shape: its key columns and dtype, ``fused_ms`` (the kernel), ``best_unfused_ms``
    (the fastest unfused pipeline), ``speedup`` (their ratio), ``saved_pct`` (latency saved as %
    of the inductor norm's, against cuBLAS + inductor norm, where measured) and ``measured``
    (the row's date, ``*`` where the registry entry at exactly that shape was re-tuned or its
    fused/unfused decision changed since). None where there is no such table."""
    import pandas as pd

    path = table_path(gpu, spec.name, workload)
    if not path.is_file():
        return None
    df = pd.read_csv(path)
    fused = f"{spec.name}_ms"
    unfused = [f"{n}_ms" for n in bench_spec(spec.name).unfused_baselines if f"{n}_ms" in df.columns]
    if fused not in df.columns or not unfused:
        return None
    key = [c for c in ("M", "K", "N", "H", "D", "max_seq_len_q", "dtype") if c in df.columns]
    out = df[key].copy()
    out["fused_ms"] = df[fused]
    out["best_unfused_ms"] = df[unfused].min(axis=1)
    out["speedup"] = out["best_unfused_ms"] / out["fused_ms"]
    out["saved_pct"] = df.get("saved_vs_cublas_inductor_pct", math.nan)
    dates = pd.to_datetime(df["measured_at"], utc=True, format="ISO8601")
    stale = _stale(df, dates, spec, gpu)
    out["measured"] = [f"{d:%Y-%m-%d}{'*' if s else ''}" for d, s in zip(dates, stale)]
    return out


def _stale(df, dates, spec, gpu: str) -> list[bool]:
    """Per row: whether the registry entry at exactly its shape was tuned after the row was
    measured, or now records another fused/unfused decision than the row's ``dispatch``."""
    if not {"M", "K", "N", "dtype"} <= set(df.columns):
        return [False] * len(df)
    entries = registry.entries_for(spec.name, gpu)
    out = []
    for r, date in zip(df.itertuples(), dates):
        entry = entries.get((int(r.M), int(r.K), int(r.N), r.dtype))
        if entry is None:
            out.append(False)
            continue
        tuned = timestamp(entry.meta.get("tuned_at"))
        record = entry.meta.get("dispatch")
        then = getattr(r, "dispatch", None)
        out.append((tuned is not None and tuned > date)
                   or bool(record and isinstance(then, str) and registry.dispatch_text(record) != then))
    return out


COMMITTED_LEGEND = (
    "Committed GPU results ({table}, the newest row per shape; timer and runs per row there): fused_ms = "
    "this kernel, unfused_ms = the fastest unfused pipeline, speedup = unfused_ms / fused_ms, "
    "saved_pct = latency saved as % of the inductor norm's against cuBLAS + inductor norm; measured: the row's "
    "date, * where the registry entry there was re-tuned or changed its decision since.")
