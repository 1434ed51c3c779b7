"""How close the Helion GEMM is to cuBLAS, and each fused kernel to the Helion GEMM, on every
row of the GEMM workload tables, from the committed benchmarks (no GPU needed).

The fused kernels' benchmarks (``helion-kernels bench --repeats N``) time the plain Helion
``matmul`` beside cuBLAS at each row and report ``helion_gemm_vs_cublas`` (median over the
repeats) and the fused kernel's ``fused_vs_helion_gemm``; ``bench --kernel matmul`` times the
plain GEMM by itself beside cuBLAS. This script gathers, per (M, K, N) of the tables
``prenorm_rmsnorm``, ``postnorm_fullrow``, ``postnorm_split_n`` and ``training``, the newest such
measurement and every run since the row's ``matmul`` registry entry was tuned (several kernels'
benchmarks time the same GEMM), checks the median of the runs beside a fused kernel against the
aim (the Helion GEMM within 1.07x cuBLAS at K >= 512, 1.15x below: one run of a few repeats
cannot tell 1.05 from 1.07, the runs together can), and says where the newest measurement is
older than the row's entry (re-tuned since: re-bench it) or missing.

Which runs judge a row: the runs whose columns were taken in order and then reversed within each
repeat (a row's ``order`` is "balanced"; every benchmark since 2026-12-04) where the row has any, alone or beside a fused kernel alike: the place of a column in
the order moved the same GEMM by 1.00-1.09x cuBLAS on the H200, and the balanced order cancels
it (``bench/variants/gemm_timing_context.py``). Where a row has only runs timed in one order,
the runs beside a fused kernel judge it as before, and the runs of the GEMM by itself (which
read lower, the GEMM timed first) only where there are no others.

    python bench/gemm_ceiling.py [--gpu nvidia_h200_sm90]

Writes ``bench/results/<gpu>/gemm_ceiling.{csv,md,png}``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from helion_kernels import registry  # noqa: E402
from helion_kernels import results as result_tables

ROOT = Path(__file__).resolve().parent.parent
TABLES = ("prenorm_rmsnorm", "postnorm_fullrow", "postnorm_split_n", "training")
KEY = ["M", "K", "N"]


def aim(k: int) -> float:
    """The issue's aim for the Helion GEMM over cuBLAS: 1.07 at K >= 512, 1.15 below."""
    return 1.07 if k >= 512 else 1.15


COLUMNS = [*KEY, "kernel", "helion_gemm_vs_cublas", "helion_gemm_vs_cublas_spread", "fused_vs_helion_gemm",
           "repeats", "balanced", "file", "measured_at"]


# the reports written beside the benchmarks' tables (not benchmarks themselves)
REPORTS = ("gemm_ceiling", "tuning_report", "prenorm_stats_bound", "ceilings")


def measurements(folder: Path) -> pd.DataFrame:
    """Every bf16 benchmark row of ``folder`` that timed the plain Helion GEMM beside cuBLAS:
    the benchmarked kernel, the ratios, whether the columns were timed in a balanced order (the
    row's ``order``), the table and the row's date."""
    frames = []
    for csv in sorted(folder.glob("*.csv")):
        if csv.stem in REPORTS:
            continue
        df = result_tables.result_rows([csv], skip_unreadable=True)  # a stray or half-written file is named, left out
        if df.empty or not {"dtype", *KEY} <= set(df.columns):
            continue
        # the bench writes the kernel's own timing column first, before the baselines
        kernel = df["kernel"].dropna().iloc[0] if df["kernel"].notna().any() else next(
            c[:-3] for c in df.columns if c.endswith("_ms"))
        # the Helion GEMM's column: its twin beside a fused kernel, or the plain GEMM's own benchmark
        gemm_ms = "matmul_ms" if kernel == "matmul" else "helion_matmul_ms"
        if "helion_gemm_vs_cublas" not in df and not {gemm_ms, "cublas_mm_ms"} <= set(df.columns):
            continue
        balanced = df["order"].eq("balanced") if "order" in df else False
        df = df.assign(kernel=df["kernel"].fillna(kernel), balanced=balanced)[df["dtype"] == "bfloat16"]
        if "repeats" not in df:
            df["repeats"] = 1
        if "helion_gemm_vs_cublas" not in df:  # from before the bench wrote the ratio: the medians' ratio
            df["helion_gemm_vs_cublas"] = df[gemm_ms] / df["cublas_mm_ms"]
            if kernel != "matmul" and f"{kernel}_ms" in df:
                df["fused_vs_helion_gemm"] = df[f"{kernel}_ms"] / df["helion_matmul_ms"]
        frames.append(df.reindex(columns=COLUMNS))
    if not frames:
        return pd.DataFrame(columns=COLUMNS)
    out = pd.concat(frames, ignore_index=True)
    out["measured_at"] = pd.to_datetime(out["measured_at"], utc=True)
    return out


def report(gpu: str, results: Path, configs: Path) -> pd.DataFrame:
    """One row per (M, K, N) of the workload tables under ``configs`` (the committed ones by
    default, not a user's own), with the newest measurement of each ratio."""
    rows = pd.concat([pd.read_csv(configs / "workloads" / f"{t}.csv", comment="#", skipinitialspace=True)[KEY]
                      .assign(table=t) for t in TABLES], ignore_index=True)
    shapes = rows.groupby(KEY, sort=False)["table"].agg(lambda t: ", ".join(dict.fromkeys(t))).reset_index()

    found = measurements(results / gpu)
    timed = found.dropna(subset=["helion_gemm_vs_cublas"])
    gemm = result_tables.newest_rows(timed, KEY)[
        [*KEY, "helion_gemm_vs_cublas", "helion_gemm_vs_cublas_spread", "repeats", "file", "measured_at"]]
    fused = (result_tables.newest_rows(found.dropna(subset=["fused_vs_helion_gemm"]), [*KEY, "kernel"])
             .pivot(index=KEY, columns="kernel", values="fused_vs_helion_gemm")
             .add_suffix("_vs_helion_gemm").reset_index())
    entries = registry.load_entries(configs / gpu / "matmul.json")
    tuned = {key[:3]: result_tables.timestamp(entry.meta.get("tuned_at"))
             for key, entry in entries.items() if key[3] == "bfloat16"}
    # every dated run since the row's own entry was tuned (all dated runs where it has none)
    since = pd.Series([tuned.get(tuple(k)) for k in timed[KEY].itertuples(index=False)], index=timed.index,
                      dtype="datetime64[ns, UTC]")
    recent = timed[timed.measured_at.notna() & (since.isna() | (timed.measured_at >= since))]
    # Timed in one order, the GEMM's place decides its ratio: the plain GEMM's own benchmark
    # (it first, then cuBLAS) reads lower than a fused kernel's (cuBLAS after the GEMM and the
    # fused kernel), by 0.03-0.08 at M = 262144 (bench/NOTES.md). The runs in a balanced order judge a row where it has any; otherwise the runs
    # beside a fused kernel, and the alone runs only where there are no others (extra alone runs
    # must not be able to turn a miss into a meet).
    in_balanced_order = recent.balanced.astype(bool)
    balanced = (recent[in_balanced_order].groupby(KEY)["helion_gemm_vs_cublas"]
                .agg(balanced_runs="count", balanced_median="median", balanced_min="min", balanced_max="max")
                .reset_index())
    one_order = recent[~in_balanced_order]
    alone_run = one_order.kernel == "matmul"
    runs = (one_order[~alone_run].groupby(KEY)["helion_gemm_vs_cublas"]
            .agg(runs="count", runs_median="median", runs_min="min", runs_max="max").reset_index())
    alone = (one_order[alone_run].groupby(KEY)["helion_gemm_vs_cublas"]
             .agg(alone_runs="count", alone_median="median").reset_index())
    out = (shapes.merge(gemm, on=KEY, how="left").merge(balanced, on=KEY, how="left")
           .merge(runs, on=KEY, how="left").merge(alone, on=KEY, how="left"))
    for count in ("balanced_runs", "runs", "alone_runs"):
        out[count] = out[count].fillna(0).astype(int)
    if len(fused):
        out = out.merge(fused, on=KEY, how="left")
    out["aim"] = out["K"].map(aim)

    def status(r) -> str:
        if pd.isna(r.helion_gemm_vs_cublas):
            return "not measured"
        if pd.isna(r.measured_at):
            return "date unknown"
        entry_tuned = tuned.get((r.M, r.K, r.N))
        if entry_tuned is not None and entry_tuned > r.measured_at:
            return "re-tuned since"
        return "meets" if r.judged <= r.aim else "misses"

    # the first group with runs judges the row: (name, its run count, its median)
    groups = (("balanced", "balanced_runs", "balanced_median"), ("beside fused", "runs", "runs_median"),
              ("alone", "alone_runs", "alone_median"))
    judging = [next((g for g in groups if r[g[1]]), ("", None, None)) for _, r in out.iterrows()]
    out["judged_by"] = [name for name, _, _ in judging]
    out["judged"] = [r[median] if median else math.nan for (_, _, median), (_, r) in zip(judging, out.iterrows())]
    out["status"] = out.apply(status, axis=1)
    out["measured_at"] = [t.isoformat() if pd.notna(t) else "" for t in out["measured_at"]]
    out["file"] = out["file"].fillna("")
    out["matmul_entry"] = ["exact" if tuple(k) in tuned else "nearest" if tuned else "none"
                           for k in out[KEY].itertuples(index=False)]
    return out


def plot(df: pd.DataFrame, path: Path, gpu: str) -> None:
    measured = df.dropna(subset=["helion_gemm_vs_cublas"]).reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.32 * len(measured)), 4.8))
    colours = {"meets": "tab:green", "misses": "tab:red", "re-tuned since": "tab:grey", "date unknown": "tab:olive"}
    for state, colour in colours.items():
        part = measured[measured.status == state]
        if part.empty:
            continue
        value = part.judged.fillna(part.helion_gemm_vs_cublas)
        by_balanced = part.judged_by == "balanced"
        low = part.balanced_min.where(by_balanced, part.runs_min).fillna(value)
        high = part.balanced_max.where(by_balanced, part.runs_max).fillna(value)
        ax.bar(part.index, value, color=colour, label=state)
        ax.errorbar(part.index, value, yerr=[value - low, high - value], fmt="none", ecolor="black", elinewidth=0.8,
                    capsize=2)
    # the one-order medians as markers where the bar is not theirs already
    by_balanced = measured[measured.judged_by == "balanced"]
    for shown, column, marker, colour, label in (
            (by_balanced, "runs_median", "v", "tab:orange", "one order, beside a fused kernel"),
            (measured, "alone_median", "D", "tab:blue", "one order, timed alone")):
        shown = shown.dropna(subset=[column])
        if not shown.empty:
            ax.scatter(shown.index, shown[column], marker=marker, color=colour, edgecolors="white",
                       linewidths=0.5, s=22, zorder=3, label=f"{label} (median)")
    ax.step(measured.index, measured["aim"], where="mid", color="black", linewidth=1, label="aim")
    ax.axhline(1.0, color="black", linewidth=0.5, linestyle=":")
    ax.set_xticks(measured.index, [f"{r.M}x{r.K}x{r.N}" for r in measured.itertuples()], rotation=90, fontsize=7)
    lowest = measured[["helion_gemm_vs_cublas", "runs_min", "balanced_min", "alone_median"]].min().min()
    highest = measured[["helion_gemm_vs_cublas", "runs_max", "balanced_max"]].max().max()
    ax.set_ylim(min(0.8, math.floor((lowest - 0.02) * 20) / 20), max(1.3, highest + 0.05))
    ax.set_ylabel("Helion matmul time / cuBLAS time")
    ax.set_title(f"Plain Helion GEMM against cuBLAS: median of the judging runs since tuning (balanced column order "
                 f"where timed so), min to max ({gpu}, bf16)",
                 fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _paths(args) -> str:
    """The --results and --configs given, where they are not the checkout's (for the command line)."""
    given = [(flag, path) for flag, path, default in (("--results", args.results, ROOT / "bench" / "results"),
                                                      ("--configs", args.configs, ROOT / "configs"))
             if path.resolve() != default.resolve()]
    return "".join(f" {flag} {path}" for flag, path in given)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--gpu", default="nvidia_h200_sm90", help="registry GPU key (default %(default)s)")
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "results",
                   help="results root, the folder above the GPU folders (default: the checkout's bench/results)")
    p.add_argument("--configs", type=Path, default=ROOT / "configs", help="registry root (default: the checkout's)")
    p.add_argument("--out", type=Path, default=None, help="folder (default bench/results/<gpu>/)")
    args = p.parse_args(argv)
    folder = args.results / args.gpu
    if not folder.is_dir() or not any(folder.glob("*.csv")):
        found = sorted(d.name for d in args.results.iterdir() if d.is_dir()) if args.results.is_dir() else []
        p.error(f"no benchmark results in {folder}" + (f"; the folders there: {', '.join(found)}" if found else
                                                        f" (--results is the folder above the GPU folders)"))
    if not (args.configs / "workloads").is_dir():
        p.error(f"{args.configs} has no workloads/ folder (--configs is a registry root, e.g. the checkout's configs/)")
    out = args.out or folder
    if out.exists() and not out.is_dir():
        p.error(f"--out {out} is a file, not a folder")
    df = report(args.gpu, args.results, args.configs)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "gemm_ceiling.csv", index=False)
    counts = df["status"].value_counts().reindex(
        ["meets", "misses", "re-tuned since", "date unknown", "not measured"], fill_value=0)
    paths = _paths(args)
    (out / "gemm_ceiling.md").write_text("\n".join([
        f"# The Helion GEMM against cuBLAS on every workload row ({args.gpu})", "",
        f"- command: `python bench/gemm_ceiling.py --gpu {args.gpu}{paths}`"
        + ("" if paths else " (from the committed benchmarks and registry)"),
        "- helion_gemm_vs_cublas: the plain Helion `matmul`'s time over cuBLAS's in the newest benchmark that timed"
        " the row (`file`: its table, one per op and workload, holding each shape's newest run; `measured_at`; a fused kernel's benchmark, which times the GEMM as its twin, or `matmul`'s"
        " own; medians over `repeats`, spread = max - min over them; from the two times where a run predates the"
        " ratio columns); aim: 1.07 at K >= 512, 1.15 below",
        "- runs since the row's own `matmul` entry was tuned (all of them where it has none; each run's value is its"
        " median over its repeats; several kernels' benchmarks time the same GEMM, and one run cannot tell 1.05 from"
        " 1.07), in three groups: `balanced_runs` (`balanced_median`, `_min`, `_max`), the runs that took the columns"
        " in order and then reversed within each repeat, beside a fused kernel or alone; `runs` (`runs_median`,"
        " `runs_min`, `runs_max`), the runs of the fused kernels' benchmarks in one order; `alone_runs`"
        " (`alone_median`), the runs in one order of the GEMM by itself (`helion-kernels bench --kernel matmul`: it,"
        " then cuBLAS). Timed in one order, the place of a column moved the same GEMM by 1.00-1.09x cuBLAS at"
        " M = 262144 (bench/NOTES.md), so the groups are not mixed",
        "- judged_by, judged: the group that judges the row and its median: balanced where the row has such runs,"
        " else beside fused, else alone. status: meets / misses the aim by `judged`; re-tuned since: the row's own"
        " `matmul` entry is newer than the measurement (re-bench it); not measured: no benchmark timed the Helion"
        " GEMM there; date unknown: the row has no date. matmul_entry: exact where the registry holds the row's own `matmul` entry,"
        " nearest where the GEMM runs another shape's config (a re-tune of that neighbour is not seen here:"
        " the bench's `helion_matmul_config` column says which config a measurement ran)",
        "- `<kernel>_vs_helion_gemm`: that fused kernel's time over the plain Helion GEMM's in the newest benchmark"
        " of that kernel at the row, which can be older than the row's GEMM ratio (another kernel's benchmark)"
        " and than the row's registry entries",
        f"- rows: {len(df)}; " + ", ".join(f"{state}: {n}" for state, n in counts.items()),
        "", f"![gemm_ceiling](gemm_ceiling.png)", "",
        df.to_markdown(index=False, floatfmt=".4g"), ""]))
    plot(df, out / "gemm_ceiling.png", args.gpu)
    print(", ".join(f"{state}: {n}" for state, n in counts.items()), f"-> {out / 'gemm_ceiling.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
