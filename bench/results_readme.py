"""Write ``bench/results/README.md`` and the README's headline block from the committed tables.

No result number is copied by hand: every range in ``bench/results/README.md`` and in the
headlines between the ``<!-- results:begin -->`` and ``<!-- results:end -->`` markers of the
top-level ``README.md`` is computed here from the tables under ``bench/results/<gpu>/`` (one
per op and workload; each row records its own run). Each headline names its table, the
baseline as it ran, the timer, the runs per row and the dates, all read from the rows.

    python bench/results_readme.py          # rewrite both
    python bench/results_readme.py --check  # exit 1 if either is out of date (a test runs this)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import pandas as pd

from helion_kernels import results

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
TIMER_WORDS = {"graph": "CUDA-graph replay (GPU time)", "plain": "eager loop (host time included)"}


@dataclasses.dataclass(frozen=True)
class Headline:
    """One line of the README: ``text`` with ``{name}`` fields filled by ``ranges`` (name -> a
    column, a pandas ``eval`` expression, or (either, a row query)), each the min-max over the
    rows of ``tables`` selected by ``where``; ``baseline``: what the compared pipeline ran;
    ``caveat``: what the rows do not say (a soft baseline, a stale table); with ``stale_before``
    (a date), only for a GPU whose rows were all measured before it."""

    technique: str
    tables: tuple[str, ...]
    text: str
    ranges: dict
    baseline: str
    where: str | None = None
    caveat: str | None = None
    stale_before: str | None = None


PRE = "cuBLAS + the faster standalone RMSNorm of the inductor-compiled and Liger's, per row"
POST = "cuBLAS + the faster standalone norm of the inductor-compiled and Liger's, per row"
BLOCK = ("prenorm_block_layernorm_prenorm_rmsnorm", "prenorm_block_rmsnorm_prenorm_rmsnorm")
ATTENTION_CHANGED = ("the attention kernels changed since: fp32 score tiles and a sigmoid-form GELU, 1.4-2.1x "
                     "faster per kernel on an H100 (`nvidia_h100_80gb_hbm3_sm90/variants/gdpa_candidates.md`); "
                     "then the forward's LayerNorm statistics in one pass, 0.94-0.98x the time "
                     "(`nvidia_h100_80gb_hbm3_sm90/before_after_fna_one_pass_stats.md`); stale until re-run")
HEADLINES = [
    Headline(
        "Deferred pre-norm (`rmsnorm_matmul`)", ("rmsnorm_matmul_prenorm_rmsnorm",),
        "as the op runs it ({dispatch}): {dispatched}x the speed of the best unfused pipeline; the fused kernel "
        "alone: {speedup}x, {saved}% of the inductor norm's time saved against cuBLAS + inductor norm, "
        "{floor}x its byte/FLOP floor; the plain Helion GEMM at {gemm}x cuBLAS's time",
        {"dispatched": "dispatched_speedup_vs_best_unfused", "speedup": "speedup_vs_best_unfused",
         "saved": "saved_vs_cublas_inductor_pct", "floor": "fused_over_floor", "gemm": "helion_gemm_vs_cublas"},
        PRE),
    Headline(
        "Pre-norm with the statistics given (`rmsnorm_matmul(..., rstd=)`)", ("rmsnorm_matmul_given_rstd_prenorm_rmsnorm",),
        "the fused kernel at {twin}x the time of the same Helion GEMM alone, {speedup}x the speed of the best "
        "unfused pipeline, {saved}% of the inductor norm's time saved against cuBLAS + inductor norm",
        {"twin": "fused_vs_helion_gemm", "speedup": "speedup_vs_best_unfused", "saved": "saved_vs_cublas_inductor_pct"},
        "cuBLAS + the faster of the compiled RMSNorm, Liger's, and a compiled scaling by the given rstd"),
    Headline(
        "Pre-norm block forward (`add_layernorm_matmul`, `add_rmsnorm_matmul`: add, norm, Linear)", BLOCK,
        "as the op runs it ({dispatch}): {speedup}x the speed of torch.compile of the block (below 1: slower); "
        "at K >= 1024: {big}x",
        {"speedup": "speedup_vs_compiled_block", "big": ("speedup_vs_compiled_block", "K >= 1024")},
        "torch.compile (default mode) of `h = x + r; y = F.linear(norm(h), W)`", where="mode == 'forward'"),
    Headline(
        "Pre-norm block forward + backward", BLOCK,
        "as the op runs it (forward {dispatch}): {speedup}x the speed of torch.compile of the block (below 1: "
        "slower); forward and backward forced fused: {fused}x",
        {"speedup": "speedup_vs_compiled_block", "fused": "fused_speedup_vs_compiled_block"},
        "as above", where="mode == 'training'",
        caveat="the backward ran unfused (no backward entry); the RMSNorm rows ran 8a70126's backward, which summed "
               "the weight's gradient in the norm pass (slower, NOTES.md), replaced since and not re-measured"),
    Headline(
        "Full-row post-norm (`matmul_layernorm`, `matmul_rmsnorm`)",
        ("matmul_layernorm_postnorm_fullrow", "matmul_rmsnorm_postnorm_fullrow"),
        "as the op runs it ({dispatch}): {dispatched}x the speed of the best unfused pipeline; the fused kernel "
        "at N <= 128: {small}x, {saved_small}% of the inductor norm's time saved",
        {"dispatched": "dispatched_speedup_vs_best_unfused", "small": ("speedup_vs_best_unfused", "N <= 128"),
         "saved_small": ("saved_vs_cublas_inductor_pct", "N <= 128")},
        POST),
    Headline(
        "Full-row post-norm in training (the forward also writes the norm's input)",
        ("matmul_layernorm_training_forward_postnorm_fullrow", "matmul_rmsnorm_training_forward_postnorm_fullrow"),
        "the fused kernel at {training}x the speed of the unfused forward writing the same (below 1: slower), "
        "{saved}% of the inductor norm's time saved; without that write: {forward}x. An autograd-recorded call "
        "follows this training decision ({decision})",
        {"training": "speedup_vs_best_unfused", "saved": "saved_vs_cublas_inductor_pct", "forward": "forward_speedup"},
        "cuBLAS writing the GEMM output, then the inductor-compiled norm with its statistics"),
    Headline(
        "Split-N post-norm, row sweep (`matmul_layernorm_split_n`, `matmul_rmsnorm_split_n`)",
        ("matmul_layernorm_split_n_postnorm_split_n", "matmul_rmsnorm_split_n_postnorm_split_n"),
        "as the op runs it ({dispatch}): {dispatched}x the speed of the best unfused pipeline; the fused kernel "
        "alone: {speedup}x (below 1: slower)",
        {"dispatched": "dispatched_speedup_vs_best_unfused", "speedup": "speedup_vs_best_unfused"},
        POST),
    Headline(
        "Norm deferred into the next GEMM (`matmul_rmsnorm_matmul`)", ("matmul_rmsnorm_matmul_postnorm_split_n",),
        "as the op runs it ({dispatch}): {dispatched}x the speed of the best unfused pipeline; the two kernels: "
        "{speedup}x, {saved}% of the inductor norm's time saved",
        {"dispatched": "dispatched_speedup_vs_best_unfused", "speedup": "speedup_vs_best_unfused",
         "saved": "saved_vs_inductor_pct"},
        "cuBLAS -> the faster standalone RMSNorm (inductor-compiled or Liger's) -> cuBLAS"),
    Headline(
        "FlashNormAttention forward (`flash_norm_attention`)", ("flash_norm_attention_flash_norm_attention",),
        "{compiled}x the speed of the unfused block under torch.compile, {gdpa}x that of this package's `gdpa` "
        "between eager norms; {floor}x its byte/FLOP floor",
        {"compiled": "speedup_vs_compiled", "gdpa": "speedup_vs_gdpa+eager_norms", "floor": "fused_over_floor"},
        "the unfused block (norms on the jagged rows, attention on zero-padded copies) compiled with "
        "torch.compile(dynamic=True); `gdpa` with one untuned config between eager norms",
        caveat="soft baselines: the compiled block pads the jagged rows, and runs 1.2-1.7x slower than the same "
               "block eager in the forward + backward table; `gdpa` runs one untuned config; " + ATTENTION_CHANGED),
    Headline(
        "FlashNormAttention forward + backward (`FlashNormAttention`)", ("attention_training_step_flash_norm_attention",),
        "{compiled}x the speed of the unfused block under torch.compile, {eager}x the same block eager, "
        "{gdpa}x `gdpa` (with its backward) between eager norms (below 1: slower)",
        {"compiled": "speedup_vs_compiled", "eager": "unfused_eager_ms / fused_ms", "gdpa": "speedup_vs_gdpa+eager_norms"},
        "as above (soft: padded, one untuned `gdpa` config)", where="timer == 'graph'", caveat=ATTENTION_CHANGED),
    Headline(
        "FlashNormAttention forward + backward, eager loop", ("attention_training_step_flash_norm_attention",),
        "{compiled}x the speed of the unfused block under torch.compile, {gdpa}x `gdpa` between eager norms",
        {"compiled": "speedup_vs_compiled", "gdpa": "speedup_vs_gdpa+eager_norms"},
        "as above", where="timer == 'plain'",
        caveat="measured before the per-call host cost was cut; " + ATTENTION_CHANGED),
    Headline(
        "Training step, forward + backward (`RMSNormLinear`, `LinearLayerNorm`, `LinearRMSNorm`)",
        ("training_step_training",),
        "{speedup}x the speed of torch.compile of the PyTorch pair (the better of the module eager and compiled), "
        "{share}% of the norm's cost removed; the module's forward ran {paths}: where it ran cuBLAS + the "
        "inductor norm, the gain is not fusion",
        {"speedup": "speedup_vs_compiled", "share": "norm_share_removed_pct"},
        "torch.compile (default mode) of the PyTorch norm + nn.Linear pair", where="timer == 'graph'"),
    Headline(
        "Training step, eager loop", ("training_step_training",),
        "{speedup}x the speed of torch.compile of the PyTorch pair (below 1: slower); the module's forward ran "
        "{paths}",
        {"speedup": "speedup_vs_compiled"},
        "torch.compile (default mode) of the PyTorch norm + nn.Linear pair", where="timer == 'plain'", stale_before="2026-12-08",
        caveat="stale: measured 2026-12-01, when the modules ran the fused kernel at rows that now dispatch "
               "unfused and each call cost more host time; re-run with `python bench/training_step.py`"),
]


def _fmt(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.2f}"


def _range(values: pd.Series) -> str:
    values = values.dropna()
    if values.empty:
        return "-"
    lo, hi = values.min(), values.max()
    return _fmt(lo) if _fmt(lo) == _fmt(hi) else f"{_fmt(lo)} to {_fmt(hi)}"


def _counts(values: pd.Series) -> str:
    """``"fused at 14 rows, unfused (cuBLAS + inductor norm) at 16"``: the values and their counts."""
    counts = values.fillna("not recorded").value_counts()
    return ", ".join(f"{v} at {n} row{'s' if n > 1 else ''}" for v, n in counts.items())


def _rows(gpu: str, h: Headline) -> pd.DataFrame:
    df = pd.concat([pd.read_csv(RESULTS / gpu / f"{t}.csv") for t in h.tables], ignore_index=True)
    return df.query(h.where) if h.where else df


def headline(h: Headline, gpu: str) -> str:
    df = _rows(gpu, h)
    fields = {}
    for name, spec in h.ranges.items():
        column, query = spec if isinstance(spec, tuple) else (spec, None)
        rows = df.query(query) if query else df
        fields[name] = _range(rows[column] if column in rows.columns else rows.eval(column))
    for name, column in (("dispatch", "dispatch"), ("paths", "forward_path"), ("decision", "training_decision")):
        if "{" + name + "}" in h.text:
            fields[name] = _counts(df[column]) if column in df.columns else "not recorded"
    tables = ", ".join(f"`{gpu}/{t}.md`" for t in h.tables) + (f" (rows where {h.where})" if h.where else "")
    timers = ", ".join(TIMER_WORDS.get(t, str(t)) for t in sorted(set(df["timer"])))
    runs = "-".join(sorted({str(int(df["repeats"].min())), str(int(df["repeats"].max()))}, key=int))
    orders = ", ".join(sorted(set(df["order"])))
    dates = sorted(str(d)[:10] for d in df["measured_at"])
    when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    stale = h.stale_before is None or dates[-1] < h.stale_before
    caveat = f" **Caveat:** {h.caveat}." if h.caveat and stale else ""
    return (f"- **{h.technique}**: {h.text.format(**fields)} ({len(df)} rows). Baseline as run: {h.baseline}. "
            f"Timer: {timers}, median; runs per row: {runs} (column order: {orders}); measured {when}. "
            f"Table: {tables}.{caveat}")


def ceiling_line(gpu: str) -> list[str]:
    found = results.read_ceilings(RESULTS / gpu)
    if found is None:
        return []
    ref = "reference" in set(pd.read_csv(RESULTS / gpu / "ceilings.csv")["method"])
    return [f"Floors at one copy ceiling of {found.bandwidth_gbps:.0f} GB/s (read + write) and a bf16 GEMM ceiling "
            f"of {found.bf16_tflops:.0f} TFLOP/s" + (" (reference values from an earlier measurement, not yet "
                                                    "re-measured on this card)" if ref else "")
            + f": `{gpu}/ceilings.md`.", ""]


COMPACT = ("layer", "timer", "M", "K", "N", "N2", "H", "max_seq_len_q", "dtype")
SHOWN = ("speedup_vs_best_unfused", "speedup_vs_compiled", "speedup_vs_gdpa+eager_norms", "saved_vs_cublas_inductor_pct",
         "saved_vs_inductor_pct", "dispatch", "dispatched_speedup_vs_best_unfused", "forward_path",
         "norm_share_removed_pct", "fused_over_floor", "check", "repeats")


def _compact(csv: Path) -> str:
    """A table's key columns, its kernel's time and the columns a reader compares, one line a row."""
    df = pd.read_csv(csv)
    kernel = df["kernel"].iloc[0] if "kernel" in df.columns else None
    fused = f"{kernel}_ms" if f"{kernel}_ms" in df.columns else next(
        (c for c in ("fused_ms", "deferred_ms") if c in df.columns), None)
    cols = [c for c in COMPACT if c in df.columns and df[c].nunique() > 1 or c in ("M", "K", "N", "H", "max_seq_len_q")
            and c in df.columns] + ([fused] if fused else []) + [c for c in SHOWN if c in df.columns]
    shown = df[cols].copy()
    shown.insert(len(shown.columns), "measured", df["measured_at"].str[:10])
    for col in shown.select_dtypes("float").columns:
        shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else f"{v:.4g}")
    shown = shown.map(lambda v: v[:37] + "..." if isinstance(v, str) and len(v) > 40 else v)
    return shown.to_markdown(index=False)


def _title(md: Path) -> str:
    first = md.read_text().splitlines()[0] if md.is_file() else ""
    return first.removeprefix("# ").strip()


def results_readme(gpus: list[str]) -> str:
    out = ["# Results", "",
           "Generated by `python bench/results_readme.py` from the tables beside this file; do not edit by hand. "
           "One table per op, workload and GPU (`<gpu>/<op>_<workload>.csv`, its `.md` with every column and the "
           "runs, its plot); a re-run replaces its rows in place, and every row records its date, commit, "
           "command, timer and runs. Shown here per table: the key columns, the kernel's time (ms, median), "
           "`speedup_vs_*` = the alternative's time / the kernel's (above 1: the kernel is faster), "
           "`saved_*_pct` = (t_gemm + t_norm - t_fused) / t_norm (the blog's metric; 100: the norm is free), "
           "`dispatch` = what the op ran, `fused_over_floor` = the kernel's time over max(byte floor, FLOP "
           "floor) at the GPU's ceilings, `check` = the fp32 reference check, `repeats` = runs per row.", ""]
    for gpu in gpus:
        folder = RESULTS / gpu
        out += [f"## {gpu}", "", *ceiling_line(gpu)]
        lines = [headline(h, gpu) for h in HEADLINES if _has(h, gpu)]
        if lines:
            out += ["Headlines:", "", *lines, ""]
        tables = [c for c in sorted(folder.glob("*.csv")) if _is_result_table(c)]
        if tables:
            out += ["### Tables (one per op and workload)", ""]
        for csv in tables:
            rel = csv.relative_to(RESULTS)
            plot = f" · [plot]({rel.with_suffix('.png')})" if csv.with_suffix(".png").is_file() else ""
            out += [f"#### `{csv.stem}`", "", f"[every column and run]({rel.with_suffix('.md')}){plot}", "",
                    _compact(csv), ""]
        others = [c for c in sorted(folder.glob("*.csv")) if not _is_result_table(c)]
        for title, files in (("Diagnostics", others), ("Variants: measured, not shipped (see `bench/NOTES.md`)",
                                                        sorted((folder / "variants").glob("*.csv")))):
            if files:
                out += [f"### {title}", ""] + [f"- [`{c.relative_to(folder).with_suffix('')}`]"
                                              f"({c.relative_to(RESULTS).with_suffix('.md')}): {_title(c.with_suffix('.md'))}"
                                              for c in files] + [""]
    return "\n".join(out)


def _is_result_table(csv: Path) -> bool:
    """A table of an op's benchmark (per-row provenance), not a diagnostic."""
    return csv.stem != results.CEILINGS and "measured_at" in pd.read_csv(csv, nrows=0).columns


def _has(h: Headline, gpu: str) -> bool:
    """Whether the GPU has the headline's tables and a row its ``where`` selects."""
    return all((RESULTS / gpu / f"{t}.csv").is_file() for t in h.tables) and not _rows(gpu, h).empty


def startup_lines(gpu: str) -> list[str]:
    """Start-up cost, from ``startup_and_overhead.csv`` when the GPU has one."""
    path = RESULTS / gpu / "startup_and_overhead.csv"
    if not path.is_file():
        return []
    df = pd.read_csv(path).set_index("measure")
    now, before = df["this checkout"], df["baseline"]
    helion = now["[process 3] import helion after CUDA init, just before the first call (s)"]
    return [f"- **Start-up**: `import helion_kernels` adds {_fmt(now['import helion_kernels after torch (s)'])} s to "
            f"`import torch` ({_fmt(before['import helion_kernels after torch (s)'])} s before Helion's import was "
            f"deferred); the first call of a tuned op took {_fmt(now['first call, rmsnorm_matmul 65536x1024x1024 (s)'])} s "
            f"in a fresh process, almost all of it Helion's own import (in another process importing Helion "
            f"took {_fmt(helion)} s and the first call after it {_fmt(now['[process 3] first call (s)'])} s, "
            f"compilation included). One run, 2026-12-01. Table: `{gpu}/startup_and_overhead.md`."]


def readme_block(gpus: list[str]) -> str:
    lines = [BEGIN, "<!-- generated by bench/results_readme.py from bench/results/*/*.csv -->"]
    for gpu in gpus:
        found = [headline(h, gpu) for h in HEADLINES if _has(h, gpu)] + startup_lines(gpu)
        if found:
            lines += [f"Measured on {gpu} (bf16; every table and plot: `bench/results/README.md`). "
                      + "".join(ceiling_line(gpu)[:1]), "", *found, ""]
    return "\n".join(lines[:-1] + [END])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if a generated file is out of date")
    args = p.parse_args()
    gpus = sorted(d.name for d in RESULTS.iterdir() if d.is_dir())
    readme = ROOT / "README.md"
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        print(f"{readme}: no {BEGIN} ... {END} block", file=sys.stderr)
        return 1
    head, rest = text.split(BEGIN, 1)
    new_readme = head + readme_block(gpus) + rest.split(END, 1)[1]
    outputs = {RESULTS / "README.md": results_readme(gpus) + "\n", readme: new_readme}
    stale = [path for path, content in outputs.items() if not path.is_file() or path.read_text() != content]
    if args.check:
        for path in stale:
            print(f"{path} is out of date: run python bench/results_readme.py", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(outputs[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
