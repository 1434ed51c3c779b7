"""Write ``bench/results/README.md`` and the README's headline block from the committed CSVs.

No result number is copied by hand: every table and range in ``bench/results/README.md``,
and the per-technique headlines between the ``<!-- results:begin -->`` and
``<!-- results:end -->`` markers of the top-level ``README.md``, are computed here from the
CSV files under ``bench/results/<gpu>/`` (the provenance lines come from each file's
``.md``). Run it after committing new results:

    python bench/results_readme.py          # rewrite both
    python bench/results_readme.py --check  # exit 1 if either is out of date (a test runs this)
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

import pandas as pd

from helion_kernels import registry
from helion_kernels import results as result_tables

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"

# Columns a results table does not show (inputs of the row, or what other columns say better).
HIDDEN = {"dtype", "helion_matmul_config", "byte_floor_ms", "flop_floor_ms", "batch", "D", "seq_len_kv",
          "fill", "seed"}


@dataclasses.dataclass(frozen=True)
class Headline:
    """One technique's line: ``text`` with ``{name}`` fields filled by ``ranges`` (name ->
    a column, or a pandas ``eval`` expression of columns, or (either, a row filter)), each
    rendered as min-max over the rows of the csv ``stems`` and of their re-runs (:func:`with_reruns`)."""

    technique: str
    stems: tuple[str, ...]
    text: str
    ranges: dict


HEADLINES = [
    Headline(
        "Deferred pre-norm (`rmsnorm_matmul`)",
        ("rmsnorm_matmul_prenorm_rmsnorm_M_65536", "rmsnorm_matmul_prenorm_rmsnorm_M_131072",
         "rmsnorm_matmul_prenorm_rmsnorm_M_524288"),
        "as dispatched (fused or cuBLAS + inductor norm, per the registry), {dispatched}x the speed of the best "
        "unfused pipeline; the fused kernel: {speedup}x the speed of cuBLAS + the best standalone norm "
        "(inductor or Liger), {saved}% of the inductor norm's time saved against cuBLAS + inductor, "
        "{vs_cublas}x cuBLAS's plain GEMM time; the plain Helion GEMM at {gemm}x cuBLAS (medians of repeated "
        "runs; {rows} rows, M = 65536, 131072 and 524288)",
        {"dispatched": "dispatched_speedup_vs_best_unfused", "speedup": "speedup_vs_best_unfused",
         "saved": "saved_vs_cublas_inductor_pct", "vs_cublas": "vs_cublas_mm", "gemm": "helion_gemm_vs_cublas"}),
    Headline(
        "Full-row post-norm (`matmul_layernorm`, `matmul_rmsnorm`)",
        ("matmul_layernorm_postnorm_fullrow_M_65536", "matmul_layernorm_postnorm_fullrow_M_262144",
         "matmul_rmsnorm_postnorm_fullrow_M_65536", "matmul_rmsnorm_postnorm_fullrow_M_262144"),
        "as dispatched (fused or cuBLAS + inductor norm, per the registry), {dispatched}x the speed of the best "
        "unfused pipeline; the fused kernel at N <= 128: {small}x, {saved_small}% of the inductor norm's time "
        "saved ({rows} rows, both norms, M = 65536 and 262144)",
        {"dispatched": "dispatched_speedup_vs_best_unfused", "small": ("speedup_vs_best_unfused", "N <= 128"),
         "saved_small": ("saved_vs_cublas_inductor_pct", "N <= 128")}),
    Headline(
        "Full-row post-norm in training (the forward also writes the norm's input for the backward)",
        ("matmul_layernorm_training_forward_postnorm_fullrow", "matmul_rmsnorm_training_forward_postnorm_fullrow"),
        "the fused kernel at {training}x the speed of cuBLAS + inductor norm writing the same (below 1: slower), "
        "{saved}% of the inductor norm's time saved; the same runs without that write (inference): {forward}x "
        "({rows} rows, both norms, M = 65536 and 262144). When autograd records a call, the op follows this "
        "training decision",
        {"training": "speedup_vs_best_unfused", "saved": "saved_vs_cublas_inductor_pct",
         "forward": "forward_speedup"}),
    Headline(
        "Split-N post-norm, row sweep (`matmul_layernorm_split_n`, `matmul_rmsnorm_split_n`)",
        ("matmul_layernorm_split_n_postnorm_split_n", "matmul_rmsnorm_split_n_postnorm_split_n"),
        "as dispatched (fused, or cuBLAS + the compiled or Liger norm, per the registry as it stood when "
        "measured), {dispatched}x the speed of the best unfused pipeline; the fused kernel: {speedup}x the "
        "speed of cuBLAS + the best standalone norm (below 1: slower; {rows} rows, both norms, M = 262144, "
        "N up to 4096)",
        {"dispatched": "dispatched_speedup_vs_best_unfused", "speedup": "speedup_vs_best_unfused"}),
    Headline(
        "Norm deferred into the next GEMM (`matmul_rmsnorm_matmul`)", ("matmul_rmsnorm_matmul_postnorm_split_n",),
        "as dispatched (the two kernels or cuBLAS -> compiled RMSNorm -> cuBLAS, per the registry), "
        "{dispatched}x the speed of cuBLAS -> best standalone RMSNorm (inductor or Liger) -> cuBLAS; the two "
        "kernels: {speedup}x, {saved}% of the inductor norm's time saved ({rows} rows, M = 262144)",
        {"dispatched": "dispatched_speedup_vs_best_unfused", "speedup": "speedup_vs_best_unfused",
         "saved": "saved_vs_inductor_pct"}),
    Headline(
        "FlashNormAttention (`flash_norm_attention`)", ("flash_norm_attention_flash_norm_attention",),
        "{compiled}x the speed of the unfused block under torch.compile, {gdpa}x that of this package's "
        "`gdpa` between eager norms ({rows} rows: batch 768, H 2-8, D 128, max Q 256-3000, KV 128)",
        {"compiled": "speedup_vs_compiled", "gdpa": "speedup_vs_gdpa+eager_norms"}),
    Headline(
        "FlashNormAttention forward + backward (`flash_norm_attention`, `FlashNormAttention`), eager loop",
        ("attention_training_step_flash_norm_attention",),
        "{compiled}x the speed of the unfused block under torch.compile, {gdpa}x that of this package's `gdpa` "
        "(with its backward) between eager norms (below 1: slower; plain do_bench, host overhead included; "
        "{rows} rows, as above)",
        {"compiled": "speedup_vs_compiled", "gdpa": "speedup_vs_gdpa+eager_norms"}),
    Headline(
        "FlashNormAttention forward + backward, CUDA-graph replay (GPU time alone)",
        ("attention_training_step_flash_norm_attention_graph",),
        "{compiled}x the speed of the unfused block under torch.compile, {gdpa}x that of `gdpa` between eager "
        "norms ({rows} rows)",
        {"compiled": "speedup_vs_compiled", "gdpa": "speedup_vs_gdpa+eager_norms"}),
    Headline(
        "Training step, forward + backward (`RMSNormLinear`, `LinearLayerNorm`, `LinearRMSNorm`), eager loop",
        ("training_step_training",),
        "{speedup}x the speed of torch.compile of the PyTorch pair (below 1: slower; the best of the module "
        "eager and compiled; plain do_bench, host overhead included), {share}% of the norm's cost removed; peak "
        "memory {memory} MiB against the compiled pair's {compiled_memory} MiB ({rows} rows of the training table)",
        {"speedup": "speedup_vs_compiled", "share": "norm_share_removed_pct", "memory": "fused_peak_mib",
         "compiled_memory": "compiled_peak_mib"}),
    Headline(
        "Training step, CUDA-graph replay (GPU time alone)",
        ("training_step_training_graph",),
        "{speedup}x the speed of torch.compile of the PyTorch pair, every column replayed as a CUDA graph; "
        "{share}% of the norm's cost removed; the module's peak memory under torch.compile {memory}x the "
        "compiled pair's, eager {eager_memory}x ({rows} rows)",
        {"speedup": "speedup_vs_compiled", "share": "norm_share_removed_pct",
         "memory": "fused_compiled_peak_mib / compiled_peak_mib", "eager_memory": "fused_peak_mib / compiled_peak_mib"}),
]


def _fmt(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.2f}"


def _range(values: pd.Series) -> str:
    lo, hi = values.min(), values.max()
    return _fmt(lo) if _fmt(lo) == _fmt(hi) else f"{_fmt(lo)} to {_fmt(hi)}"


def _command_key(csv: Path) -> tuple | None:
    """A result's command (its :func:`result_tables.result_meta`) without its ``--where`` and
    ``--repeats`` (what a re-run of some of its rows changes): the words before the first option,
    and the other options with their values in sorted order; None where the result records no
    command. A ``--where`` value runs to the next ``--`` option, so a command written unquoted
    (``" ".join(sys.argv)``) reads the same."""
    try:
        command = result_tables.result_meta(csv).get("command")
    except (OSError, ValueError):
        return None
    if not isinstance(command, str) or not command.strip():
        return None
    try:
        words = shlex.split(command)
    except ValueError:  # e.g. a where clause written as a Python repr with escaped quotes
        words = command.split()
    head: list[str] = []
    options: list[list[str]] = []
    for word in words:
        if word.startswith("--"):
            options.append(word.split("=", 1))
        elif options:
            options[-1].append(word)
        else:
            head.append(word)
    kept = sorted(tuple(option) for option in options if option[0] not in ("--where", "--repeats"))
    return (tuple(head), tuple(kept))


def with_reruns(gpu: str, stems: tuple[str, ...]) -> tuple[str, ...]:
    """``stems`` and, after them, their re-runs: the other files of the folder whose command is
    one of the stems' but for ``--where`` and ``--repeats`` (whatever their names: a re-run over
    rows of two stems, e.g. both M of a table, is named after its own ``--where``), so a
    benchmark re-run on some rows (after a re-tune, or in another column order) counts in the
    headline without being listed by hand; another timer or kernel is another command."""
    folder = RESULTS / gpu
    keys = {key for stem in stems if (key := _command_key(folder / f"{stem}.csv")) is not None}
    found = [csv.stem for csv in sorted(folder.glob("*.csv"))
             if csv.stem not in stems and _command_key(csv) in keys]
    return (*stems, *found)


def _rows(gpu: str, stems: tuple[str, ...]) -> pd.DataFrame:
    """The result files' rows; where several files timed one kernel at one shape (a re-run of
    some rows after a re-tune), only the newest file's row (the ``.json`` dates). A file whose
    ``.json`` names no kernel (the training steps: their rows are told apart by ``layer``) counts
    as a re-run of the first file's."""
    df = result_tables.result_rows(RESULTS / gpu / f"{stem}.csv" for stem in stems)
    first = df.loc[df["file"] == f"{stems[0]}.csv", "kernel"].dropna()
    df["kernel"] = df["kernel"].fillna(first.iloc[0] if len(first) else stems[0])
    if {"M", "K", "N"} <= set(df.columns):  # GEMM rows: one per kernel, layer, shape and dtype
        df = result_tables.newest_rows(df, ["kernel", *(c for c in ("layer", "M", "K", "N", "dtype") if c in df.columns)])
    return df.drop(columns=["kernel", "file", "measured_at"])


def headline(h: Headline, gpu: str) -> str:
    stems = with_reruns(gpu, h.stems)
    df = _rows(gpu, stems)
    fields = {"rows": len(df)}
    for name, spec in h.ranges.items():
        column, query = spec if isinstance(spec, tuple) else (spec, None)
        rows = df.query(query) if query else df
        fields[name] = _range(rows[column] if column in rows.columns else rows.eval(column))
    files = ", ".join(f"`{gpu}/{stem}.md`" for stem in stems)
    return f"- **{h.technique}**: {h.text.format(**fields)}. Files: {files}."


def _provenance(md: Path) -> list[str]:
    """The ``- `` lines of a result file's header (command, date, versions, timing, ...)."""
    if not md.is_file():
        return []
    lines = []
    for line in md.read_text().splitlines()[1:]:
        if line.startswith("|"):
            break
        if line.startswith("- "):
            lines.append(line)
    return lines


def _table(csv: Path) -> str:
    df = pd.read_csv(csv)
    shown = df[[c for c in df.columns if c not in HIDDEN]].copy()
    for col in shown.select_dtypes("float").columns:
        shown[col] = shown[col].map(lambda v: "" if pd.isna(v) else f"{v:.4g}")
    # Long failure messages would swamp the table.
    shown = shown.map(lambda v: v[:57] + "..." if isinstance(v, str) and len(v) > 60 else v)
    return shown.to_markdown(index=False)


def _fused_ms(df: pd.DataFrame) -> str | None:
    """The fused op's latency column: the first ``*_ms`` column of a result file."""
    return next((c for c in df.columns if c.endswith("_ms")), None)


def _against_committed(check: Path, gpu_dir: Path) -> str:
    """A spot check's fused latency next to the committed full-table run of the same rows."""
    full = [p for p in gpu_dir.glob("*.csv") if check.stem.startswith(p.stem + "_")]
    if not full:
        return ""
    source = max(full, key=lambda p: len(p.stem))
    now, then = pd.read_csv(check), pd.read_csv(source)
    keys = [c for c in ("M", "K", "N", "N2", "H", "max_seq_len_q") if c in now.columns and c in then.columns]
    if not keys or _fused_ms(now) is None or _fused_ms(then) is None:
        return f"(An earlier run of `{source.stem}`.)"
    both = now[keys + [_fused_ms(now)]].rename(columns={_fused_ms(now): "now"}).merge(
        then[keys + [_fused_ms(then)]].rename(columns={_fused_ms(then): "then"}), on=keys)
    return " ".join(
        f"Against the committed `{source.stem}` at {'x'.join(str(r[k]) for k in keys)}: {r['now']:.4g} ms now, "
        f"{r['then']:.4g} ms then ({r['now'] / r['then']:.3f}x)." for r in both.to_dict("records"))


def results_readme(gpus: list[str]) -> str:
    out = ["# Results", "",
           "Generated by `python bench/results_readme.py` from the CSV files beside this one; do not edit by "
           "hand. Each section is one result file: its provenance (the command that made it, date, versions, "
           "how it was timed), its table and, where there is one, its plot. Columns: `*_ms` latencies "
           "(median, CUDA-graph replay unless the file says otherwise); `speedup_vs_*` = alternative / fused "
           "(above 1: the fused kernel is faster); `saved_vs_*_pct` = (t_gemm + t_norm - t_fused) / t_norm, "
           "the blog's metric (100: the norm is free); `vs_cublas_mm` = fused / cuBLAS GEMM; "
           "`fused_over_floor` = fused / max(byte floor, FLOP floor) at the ceilings measured in the same run; "
           "`config` = where the config came from (exact, nearest, default); `check` = the fp32 reference "
           "check and bit-identical reruns.", ""]
    for gpu in gpus:
        out += [f"## {gpu}", ""]
        lines = [headline(h, gpu) for h in HEADLINES if _has(h, gpu)] + startup_lines(gpu)
        if lines:
            out += ["Headlines:", "", *lines, ""]
        for folder, title in ((RESULTS / gpu, "The shipped ops and package"),
                              (RESULTS / gpu / "variants", "Measured, not shipped"),
                              (RESULTS / gpu / "checks", "Checks: rows re-measured after a change, earlier runs")):
            csvs = sorted(folder.glob("*.csv"))
            if not csvs:
                continue
            out += [f"### {title}", ""]
            for csv in csvs:
                rel = csv.relative_to(RESULTS)
                out += [f"#### `{rel.with_suffix('')}`", ""] + _provenance(csv.with_suffix(".md")) + [""]
                out += [_table(csv), ""]
                if folder.name == "checks" and _against_committed(csv, RESULTS / gpu):
                    out += [_against_committed(csv, RESULTS / gpu), ""]
                if csv.with_suffix(".png").is_file():
                    out += [f"![{csv.stem}]({rel.with_suffix('.png')})", ""]
    return "\n".join(out)


def _has(h: Headline, gpu: str) -> bool:
    return all((RESULTS / gpu / f"{stem}.csv").is_file() for stem in h.stems)


def startup_lines(gpu: str) -> list[str]:
    """Start-up and host cost, from ``startup_and_overhead.csv`` when the GPU has one."""
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
            f"compilation included). File: `{gpu}/startup_and_overhead.md`."]


def readme_block(gpus: list[str]) -> str:
    lines = [BEGIN, "<!-- generated by bench/results_readme.py from bench/results/*/*.csv -->"]
    for gpu in gpus:
        found = [headline(h, gpu) for h in HEADLINES if _has(h, gpu)] + startup_lines(gpu)
        if found:
            lines += [f"Measured on {gpu} (bf16; details, every table and plot: `bench/results/README.md`):", "",
                      *found]
    return "\n".join(lines + [END])


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
