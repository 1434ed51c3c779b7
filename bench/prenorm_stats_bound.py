"""How much of the RMSNorm's time the deferred pre-norm (``rmsnorm_matmul``) can save when it
computes its own statistics, against what it saves, from the committed benchmarks (no GPU).

The pre-norm ``rmsnorm(a) @ b = diag(rstd) (a * weight) @ b`` needs ``rstd``, the per-row
``1 / sqrt(mean(a^2) + eps)``, before its epilogue. The inductor norm it replaces reads ``a``
and writes the normalised copy: 2 M K bytes-per-element both ways. A kernel that computes the
sum of squares itself reads ``a`` for it from HBM, and where that read takes the whole GPU while
no tensor core works (a statistics pre-pass kernel, with or without programmatic dependent
launch, whose GEMM waits at its entry; one kernel with a grid-wide ``hl.barrier`` between a
statistics loop and the GEMM loop), it saves at most

    (t_cublas + t_norm - t_gemm - t_stats) / t_norm,   t_stats >= M K * 2 bytes / peak HBM rate

of the norm's time against cuBLAS + inductor norm (the issue's measure), even with a free
scaling epilogue: ``bound_two_reads_pct`` with the measured plain Helion GEMM as ``t_gemm``,
``bound_two_reads_cublas_pct`` with a GEMM as fast as cuBLAS. ``t_stats`` is taken at the GPU's
copy ceiling (``bench/results/<gpu>/ceilings.csv``, the rate every floor uses; ``--hbm-tbps``
overrides), the rate the compiled norm reaches, so the bounds are generous. The shipped row-block kernel (each program sums its rows' squares, then runs their
N tiles from L2) is not bound by it, since one SM's statistics loop can overlap other SMs' MMA,
but it measured about that cost (``bench/NOTES.md``); nor is a kernel
whose statistics programs run beside GEMM programs that wait on per-row-block flags, which has
not been built. The in-loop forms sum the squares inside a GEMM k-loop (every N tile's, or the
first N tile's only); a variants run (``variants/pre_norm_variants*.md``) measured their extra time over the
plain GEMM with the same tiling (``in_loop_extra_ms``, at the form and tiling where it ran fastest
with bit-identical reruns at every shape it was run at) where they ran. Beside them: the measured savings of the own-statistics kernel (``own_stats_saved_pct``)
and of the kernel given the producer's ``rstd`` (``given_rstd_saved_pct``,
``rmsnorm_matmul_given_rstd``: a GEMM or residual-add epilogue upstream emits the sums of
squares), each from the newest benchmark of the row.

    python bench/prenorm_stats_bound.py [--gpu nvidia_h200_sm90] [--where 'K >= 1024'] [--hbm-tbps R]

Writes ``bench/results/<gpu>/prenorm_stats_bound.{csv,md,png}``.
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

from helion_kernels import results

ROOT = Path(__file__).resolve().parent.parent
KEY = ["M", "K", "N"]
AIM_PCT = 60.0  # the aim: rmsnorm_matmul saves >= 60% of the inductor norm's time at K >= 1024
BYTES = 2  # bf16


def newest(folder: Path, kernel: str) -> pd.DataFrame:
    """Per (M, K, N), the bf16 row of ``kernel``'s table of the ``prenorm_rmsnorm`` workload in
    ``folder`` (its newest run of the shape), with the table's file name."""
    path = folder / f"{kernel}_prenorm_rmsnorm.csv"
    if not path.is_file():
        return pd.DataFrame()
    rows = results.result_rows([path])
    return results.newest_rows(rows[rows["dtype"] == "bfloat16"] if len(rows) else rows, KEY)


IN_LOOP_VARIANTS = ("in_loop", "first_tile")  # the pre-norm variants' forms that sum squares in a GEMM k-loop


def in_loop_extra(variants_dir: Path) -> pd.DataFrame:
    """Per (M, K, N) of the pre-norm variants' results (every ``pre_norm_variants*.csv`` in
    ``variants_dir``): the in-loop forms' (``IN_LOOP_VARIANTS``) extra ms over the plain GEMM at the
    same tiling in the same run, at the (form, tiling) that ran fastest among those whose draws all
    passed (reference check and bit-identical reruns) at every shape where that form and tiling were
    run: the race is shape-dependent, so a tiling clean at one shape and racy at another is not
    trusted at either."""
    cols = [*KEY, "in_loop_extra_ms", "in_loop_variant", "in_loop_tiling"]
    v = results.result_rows(sorted(variants_dir.glob("pre_norm_variants*.csv")))
    if v.empty:
        return pd.DataFrame(columns=cols)
    v["clean"] = (v.failed_draws == 0) & (v.nondeterministic_draws == 0)
    trusted = v.groupby(["variant", "tiling"]).clean.transform("all")
    forms = v[v.variant.isin(IN_LOOP_VARIANTS) & trusted]
    plain = v[(v.variant == "matmul") & v.clean][[*KEY, "tiling", "file", "ms"]].rename(columns={"ms": "matmul_ms"})
    forms = forms.merge(plain, on=[*KEY, "tiling", "file"])  # the GEMM of the same tiling, same run
    if forms.empty:
        return pd.DataFrame(columns=cols)
    best = forms.sort_values("ms", kind="stable").drop_duplicates(KEY)
    return best.assign(in_loop_extra_ms=best.ms - best.matmul_ms, in_loop_variant=best.variant,
                       in_loop_tiling=best.tiling)[cols]


def report(folder: Path, where: str, hbm_tbps: float) -> pd.DataFrame:
    own = newest(folder, "rmsnorm_matmul")
    if own.empty:
        return pd.DataFrame()
    own = own.query(where) if where else own
    out = own[KEY].assign(norm_ms=own.inductor_norm_ms, cublas_ms=own.cublas_mm_ms, helion_gemm_ms=own.helion_matmul_ms)
    out["stats_floor_ms"] = out.M * out.K * BYTES / (hbm_tbps * 1e12) * 1e3
    out["stats_floor_over_norm"] = out.stats_floor_ms / out.norm_ms
    saved = lambda gemm, extra: 100 * (out.cublas_ms + out.norm_ms - gemm - extra) / out.norm_ms  # noqa: E731
    out["bound_two_reads_pct"] = saved(out.helion_gemm_ms, out.stats_floor_ms)
    out["bound_two_reads_cublas_pct"] = saved(out.cublas_ms, out.stats_floor_ms)
    loop = in_loop_extra(folder / "variants")
    out = out.merge(loop, on=KEY, how="left")  # a left merge keeps the rows in `own`'s order
    out["in_loop_saved_pct"] = saved(out.helion_gemm_ms, out.in_loop_extra_ms)
    out["own_stats_saved_pct"] = own["saved_vs_cublas_inductor_pct"].values
    out["own_stats_file"] = own["file"].values
    given = newest(folder, "rmsnorm_matmul_given_rstd").reindex(columns=[*KEY, "saved_vs_cublas_inductor_pct", "file"])
    given = given.rename(columns={"saved_vs_cublas_inductor_pct": "given_rstd_saved_pct", "file": "given_rstd_file"})
    out = out.merge(given.astype({k: "int64" for k in KEY}), on=KEY, how="left")
    text = ["in_loop_variant", "in_loop_tiling", "given_rstd_file"]
    out[text] = out[text].fillna("")
    out["aim_pct"] = AIM_PCT
    out["two_reads_can_meet_aim"] = out.bound_two_reads_cublas_pct >= AIM_PCT
    return out.sort_values(KEY, ignore_index=True)


def plot(df: pd.DataFrame, path: Path, gpu: str) -> None:
    labels = [f"{r.M}x{r.K}x{r.N}" for r in df.itertuples()]
    bars = {"bound, pre-pass read of a, GEMM = cuBLAS": ("bound_two_reads_cublas_pct", "tab:grey"),
            "bound, pre-pass read of a, Helion GEMM": ("bound_two_reads_pct", "silver"),
            "measured, own statistics (shipped)": ("own_stats_saved_pct", "tab:red"),
            "measured, rstd given by the producer": ("given_rstd_saved_pct", "tab:green")}
    fig, ax = plt.subplots(figsize=(max(6.5, 1.1 * len(df)), 5.6))
    width = 0.8 / len(bars)
    for i, (label, (column, colour)) in enumerate(bars.items()):
        ax.bar([x + (i - (len(bars) - 1) / 2) * width for x in range(len(df))], df[column], width, color=colour,
               label=label)
    loop = df.dropna(subset=["in_loop_saved_pct"])
    if not loop.empty:
        ax.scatter(loop.index, loop.in_loop_saved_pct, marker="x", color="tab:purple", zorder=3,
                   label="in-loop form, from its measured extra time (deterministic tiling)")
    ax.axhline(AIM_PCT, color="black", linewidth=1, label=f"aim ({AIM_PCT:.0f}%)")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_xticks(range(len(df)), labels, fontsize=8, rotation=30, ha="right")
    ax.set_ylabel("latency saved, % of the inductor norm's time\n(against cuBLAS + inductor norm)")
    ax.set_title(f"Pre-norm RMSNorm + GEMM: what computing rstd in the kernel can save ({gpu}, bf16)", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--gpu", default="nvidia_h200_sm90", help="registry GPU key (default %(default)s)")
    p.add_argument("--where", default="K >= 1024", help="pandas query on M, K, N (default %(default)r)")
    p.add_argument("--hbm-tbps", type=float, default=None,
                   help="read rate in TB/s for the statistics' floor (default: the GPU's copy ceiling, ceilings.csv)")
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "results",
                   help="results root, the folder above the GPU folders (default: the checkout's bench/results)")
    p.add_argument("--out", type=Path, default=None, help="folder (default bench/results/<gpu>/)")
    args = p.parse_args(argv)
    folder = args.results / args.gpu
    ceilings = results.read_ceilings(folder)
    default_tbps = ceilings.bandwidth_gbps / 1e3 if ceilings is not None else None
    if args.hbm_tbps is None:
        if default_tbps is None:
            p.error(f"{folder} has no ceilings.csv: pass --hbm-tbps")
        args.hbm_tbps = default_tbps
    if not (math.isfinite(args.hbm_tbps) and args.hbm_tbps > 0):
        p.error("--hbm-tbps must be a positive, finite number")
    try:
        df = report(folder, args.where, args.hbm_tbps)
    except results.ResultTableError as err:  # a ValueError too: not the --where's fault
        p.error(f"a result table cannot be read: {err}")
    except (pd.errors.UndefinedVariableError, SyntaxError, ValueError) as err:
        p.error(f"--where {args.where!r}: {err}")
    if df.empty:
        p.error(f"no rmsnorm_matmul benchmark of the prenorm_rmsnorm table in {folder} matches {args.where!r}")
    out = args.out or folder
    if out.exists() and not out.is_dir():
        p.error(f"--out {out} is a file, not a folder")
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "prenorm_stats_bound.csv", index=False, float_format="%.5g")
    committed = args.results.resolve() == (ROOT / "bench" / "results").resolve()
    command = "python bench/prenorm_stats_bound.py" + "".join(
        f" {flag} {value!r}" if flag == "--where" else f" {flag} {value}"
        for flag, value, default in (("--gpu", args.gpu, "nvidia_h200_sm90"), ("--where", args.where, "K >= 1024"),
                                     ("--hbm-tbps", args.hbm_tbps, default_tbps), ("--results", args.results, None))
        if value != default and not (flag == "--results" and committed))
    meets = df[df.two_reads_can_meet_aim]
    (out / "prenorm_stats_bound.md").write_text("\n".join([
        f"# The deferred pre-norm's own statistics: the most they let it save ({args.gpu})", "",
        f"- command: `{command}`" + (" (from the committed benchmarks)" if committed else ""),
        "- norm_ms, cublas_ms, helion_gemm_ms: the inductor norm, cuBLAS and the plain Helion GEMM in the newest"
        " `rmsnorm_matmul` benchmark of the row (`own_stats_file`); stats_floor_ms: reading `a` (M x K bf16) once"
        f" at {args.hbm_tbps:g} TB/s" + (" (the GPU's copy ceiling, `ceilings.md`)" if args.hbm_tbps == default_tbps
        else "") + "; stats_floor_over_norm: that over the norm's time",
        "- bound_two_reads_pct: (cublas + norm - helion_gemm - stats_floor) / norm, the most a kernel can save"
        " against cuBLAS + inductor norm, with a free scaling epilogue, when it reads `a` for its statistics with"
        " the whole GPU and no MMA running (a pre-pass kernel, or a grid-wide barrier between a statistics loop and"
        " the GEMM loop); bound_two_reads_cublas_pct: the same with a GEMM as fast as cuBLAS. The shipped row-block"
        " kernel, whose statistics loop on one SM can overlap MMA on others, is not bound by it but measured about"
        " that cost (bench/NOTES.md)",
        "- in_loop_extra_ms: the in-loop forms (the sum of squares in a GEMM k-loop: `in_loop`, every N tile from a"
        " second load of the `a` tile; `first_tile`, the first N tile only, from a masked load of its own) over the"
        " plain GEMM at the same tiling in the same run, at the form and tiling (`in_loop_variant`, `in_loop_tiling`)"
        " that ran fastest among those whose draws passed the reference check and bit-identical reruns at every shape"
        " where they were run (`variants/pre_norm_variants*.md`; blank where not measured); in_loop_saved_pct: what"
        " that extra time leaves of the saving",
        "- own_stats_saved_pct, given_rstd_saved_pct: measured savings of `rmsnorm_matmul` (its own statistics)"
        " and of `rmsnorm_matmul_given_rstd` (the producer's rstd), newest benchmark of each",
        f"- rows: {len(df)}; rows where a pre-pass read of `a` could meet the {AIM_PCT:.0f}% aim even with a GEMM"
        f" as fast as cuBLAS: {len(meets)}"
        + (f" ({', '.join(f'{r.M}x{r.K}x{r.N}' for r in meets.itertuples())})" if len(meets) else ""),
        "", "![prenorm_stats_bound](prenorm_stats_bound.png)", "",
        # None, not NaN, is what tabulate leaves blank
        df.astype(object).where(df.notna(), None).to_markdown(index=False, floatfmt=".4g", missingval=""), ""]))
    plot(df, out / "prenorm_stats_bound.png", args.gpu)
    print(f"{len(df)} rows, {len(meets)} where a pre-pass read of a could meet the aim -> "
          f"{out / 'prenorm_stats_bound.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
