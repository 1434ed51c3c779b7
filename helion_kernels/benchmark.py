"""Benchmark a kernel over a workload against the unfused alternatives a user has; generic
over specs (GEMM-shaped and attention alike).

Per workload row (CUDA-graph replay, median, input sets rotated past the L2 cache): the
fused kernel with its registry config, the plain Helion GEMM tuned the same way (for specs
with a ``gemm_twin``), and every baseline of the spec (cuBLAS ``a @ b``, the standalone norm
compiled by inductor and Liger's when installed, the complete unfused pipelines, or the
unfused attention block eager and compiled). Reported: latency saved as a percentage of the
inductor norm's latency (the blog's metric, against the Helion GEMM and against cuBLAS +
inductor norm), speed-ups over each unfused pipeline and the best of them, relative error
against the fp32 reference (and whether repeated runs agree bit for bit; a failed check is
recorded in the row's ``check`` column), and distance to the byte and FLOP floors at the
ceilings every floor of the GPU reads (``bench/results/<gpu>/ceilings.csv``). Results go to
one table per op and workload, ``bench/results/<gpu>/<op>_<workload>.{csv,md,png}``; a re-run
replaces its rows in place, each row recording its own run.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib.metadata
import math
import shlex
import statistics
import sys
from pathlib import Path

import helion
import pandas as pd
import torch
from helion.runtime.ref_mode import RefMode

from . import registry, runtime
from .bench_specs import bench_spec
from .techniques import get_spec
from .spec import KernelSpec, Problem
from .timing import Ceilings, input_copies, measure_ceilings, time_ms
from .tuning import tuning_problems, versions
from .verify import VerificationError, check_outputs, verify_config
from .workloads import load_workload

# Where results are written and looked up: the checkout's bench/results (the current
# directory's when the package is installed from a wheel).
_CHECKOUT = Path(__file__).resolve().parent.parent
RESULTS_DIR = (_CHECKOUT if (_CHECKOUT / "bench").is_dir() else Path.cwd()) / "bench" / "results"

SAVED_NOTE = ("`saved_vs_*_pct`: latency saved as % of the inductor norm's latency, "
              "(t_gemm + t_norm - t_fused) / t_norm; 100% = the norm is free")
SPEEDUP_NOTE = "`speedup_vs_*`: latency of the alternative / latency of the fused kernel"


# How `time_columns` orders the columns, for the results' metadata (``column_order``).
BALANCED_ORDER = ("each repeat takes the columns in order, then in reverse order; a column's time in the repeat "
                  "is the mean of its two")


def time_columns(columns: dict, repeats: int, timer=None) -> dict[str, list[float]]:
    """Each column's time ``repeats`` times: within each repeat the columns are taken in
    order and then in reverse order, and a column's time for the repeat is the mean of its two
    timings, so that clock drift (a GPU at its power limit) and a column's place in the order
    fall on all columns alike. ``timer(column)`` gives one time in ms; by default the column's
    CUDA-graph median (:func:`time_ms`)."""
    timer = timer or time_ms
    names = list(columns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(repeats):
        first = {name: timer(columns[name]) for name in names}
        second = {name: timer(columns[name]) for name in reversed(names)}
        for name in names:
            times[name].append((first[name] + second[name]) / 2)
    return times


def _ratio(times: dict[str, list[float]], num: str, den: str) -> list[float]:
    """Per repeat, ``num``'s time over ``den``'s (the two timed in the same repeat)."""
    return [a / b for a, b in zip(times[num], times[den])]


def bench_problem(spec: KernelSpec, problem: Problem, dtype: torch.dtype, device: torch.device,
                  ceilings: Ceilings, repeats: int = 1) -> dict:
    """One result row for ``problem``: times in ms, savings in %, speed-ups, floors in ms.

    Every column is timed in ``repeats`` repeats (:func:`time_columns`: the columns in order and
    then reversed, each a CUDA-graph median) and the row holds the medians and the GEMM ratios,
    each the median of its per-repeat ratios:
    ``helion_gemm_vs_cublas`` (the plain Helion GEMM over cuBLAS: the fused kernel's GEMM twin,
    or the kernel itself in the plain GEMM's own benchmark) and ``fused_vs_helion_gemm`` (the
    fused kernel over its twin); with ``repeats`` > 1 also their spread (``_spread``: max - min
    of the per-repeat ratios) and ``repeats``."""
    torch._dynamo.reset()  # one fresh torch.compile per row, no recompile limit
    bench = bench_spec(spec.name)
    n_sets = input_copies(bench.min_bytes(problem, dtype), device)
    arg_sets = [spec.make_args(problem, dtype, device, seed) for seed in range(n_sets)]
    row: dict = {**problem.columns(), "dtype": registry.dtype_name(dtype)}

    row["config"] = runtime.resolved_config(spec, arg_sets[0]).source
    try:  # a wrong kernel is reported in its row, and the other rows still run
        row["rel_error"] = verify_config(lambda *a: runtime.launch(spec, a), spec, problem, dtype,
                                         device, seed=n_sets, draws=1)
        row["check"] = "ok"
    except VerificationError as err:
        row["rel_error"] = float("inf")
        row["check"] = f"FAILED: {err}"

    columns = {spec.name: [functools.partial(runtime.launch, spec, a) for a in arg_sets]}
    if bench.gemm_twin is not None:
        twin = get_spec(bench.gemm_twin)
        columns[f"helion_{twin.name}"] = [functools.partial(runtime.launch, twin, a[:2]) for a in arg_sets]
        row[f"helion_{twin.name}_config"] = runtime.resolved_config(twin, arg_sets[0][:2]).source
    baseline_sets = [bench.baselines(*a) for a in arg_sets]
    if bench.checked_baselines:
        ref = spec.reference(*arg_sets[0])
        for name in bench.checked_baselines:
            try:
                check_outputs(baseline_sets[0][name](), ref, dtype)
                row[f"{name}_check"] = "ok"
            except AssertionError as err:
                row[f"{name}_check"] = f"FAILED: {err}"
        del ref
    for name in baseline_sets[0]:
        columns[name] = [b[name] for b in baseline_sets]
    if bench.dispatch_fused is not None:  # the kernel is one launch of the op: time the whole op too
        columns["fused_op"] = [bench.dispatch_fused(functools.partial(runtime.launch, spec), a) for a in arg_sets]
    repeated = time_columns(columns, repeats)
    times = {name: statistics.median(ts) for name, ts in repeated.items()}
    row.update({f"{k}_ms": v for k, v in times.items()})
    if repeats > 1:
        row["repeats"] = repeats
    twin_column = f"helion_{bench.gemm_twin}" if bench.gemm_twin is not None else None
    # the plain GEMM's own benchmark: the kernel timed is the Helion GEMM the ratio is about
    gemm_column = spec.name if spec.name == "matmul" else twin_column
    for name, num, den in (("helion_gemm_vs_cublas", gemm_column, "cublas_mm"),
                           ("fused_vs_helion_gemm", spec.name, twin_column)):
        if num in repeated and den in repeated:
            ratios = _ratio(repeated, num, den)
            row[name] = statistics.median(ratios)
            if repeats > 1:
                row[f"{name}_spread"] = max(ratios) - min(ratios)

    fused = times[spec.name]
    if bench.norm_baseline is not None:
        norm = times[bench.norm_baseline]
        gemm = times.get(f"helion_{bench.gemm_twin}")
        if gemm is not None:
            row["saved_vs_helion_gemm_pct"] = 100 * (gemm + norm - fused) / norm
        if "cublas+inductor_norm" in times:
            row["saved_vs_cublas_inductor_pct"] = 100 * (times["cublas+inductor_norm"] - fused) / norm
    unfused = {n: times[n] for n in bench.unfused_baselines if n in times}
    for name, t in unfused.items():
        row[f"speedup_vs_{name}"] = t / fused
    if unfused:
        row["speedup_vs_best_unfused"] = min(unfused.values()) / fused
    if spec.dispatch_baseline is not None:
        # What the public op runs at this shape: the registry's recorded choice.
        # (Where the kernel is one launch of the op, the op's time against its unfused pipeline.)
        decision = runtime.decide(spec, arg_sets[0])
        chosen = decision.fused
        # the unfused pipeline the entry names (Liger's norm where it measured faster), where timed
        path = decision.pipeline if bench.dispatch_alternatives else None
        path = path if path in times else spec.dispatch_baseline
        row["dispatch"] = registry.dispatch_text({"choice": "fused" if chosen else "unfused", "unfused": path})
        row["dispatched_ms"] = times.get("fused_op", fused) if chosen else times[path]
        pipelines = unfused if bench.dispatch_fused is None else {spec.dispatch_baseline: times[spec.dispatch_baseline]}
        if pipelines:
            row["dispatched_speedup_vs_best_unfused"] = min(pipelines.values()) / row["dispatched_ms"]
    if "cublas_mm" in times:
        row["vs_cublas_mm"] = fused / times["cublas_mm"]
    row["byte_floor_ms"] = bench.min_bytes(problem, dtype) / (ceilings.bandwidth_gbps * 1e9) * 1e3
    row["flop_floor_ms"] = bench.flops(problem) / (ceilings.bf16_tflops * 1e12) * 1e3
    row["fused_over_floor"] = fused / max(row["byte_floor_ms"], row["flop_floor_ms"])
    return row


def run_benchmark(spec: KernelSpec, problems: list[Problem], dtype: torch.dtype, device: torch.device,
                  repeats: int = 1) -> tuple[pd.DataFrame, dict]:
    """Benchmark every problem with a progress bar; returns the table and its metadata."""
    from rich.progress import track

    ceilings = device_ceilings(device)
    rows = [{"kernel": spec.name, **bench_problem(spec, p, dtype, device, ceilings, repeats)}
            for p in track(problems, description=f"bench {spec.name}", transient=True)]
    bench = bench_spec(spec.name)
    meta = run_meta(device, ceilings, timer="graph", repeats=repeats, kernel=spec.name,
                    relative_to=bench.plot_relative_to, aim=bench.aim)
    return pd.DataFrame(rows), meta


def workload_script_args(description: str, add_arguments=None, default_workload: str = "postnorm_split_n",
                         kind: str = "gemm") -> tuple[argparse.Namespace, pd.DataFrame]:
    """The command line of the ``bench/`` scripts that sweep a workload table of ``kind``
    (``"gemm"``: M, K, N; ``"attention"``: the attention rows).

    ``--workload`` (default ``default_workload``), ``--where`` (a pandas query), ``--out``
    (default ``bench/results/<gpu>/``), plus what ``add_arguments(parser)`` adds. Returns
    (args, the selected rows). A bad table or query exits with the usage error, before the
    GPU is looked for; no CUDA GPU exits with status 2.
    """
    p = argparse.ArgumentParser(description=description)
    if add_arguments is not None:
        add_arguments(p)
    p.add_argument("--workload", default=default_workload, help=f"a {kind} workload table (default %(default)s)")
    p.add_argument("--where", default=None, help="pandas query on the table's columns, e.g. 'M == 65536'")
    p.add_argument("--out", type=Path, default=None, help="default: bench/results/<gpu>/")
    args = p.parse_args()
    try:
        table = load_workload(args.workload, args.where, kind=kind)
    except ValueError as err:
        p.error(str(err))
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        raise SystemExit(2)
    return args, table


def device_ceilings(device: torch.device) -> Ceilings:
    """The ceilings every floor of this GPU is computed at: ``bench/results/<gpu>/ceilings.csv``
    (``python bench/ceilings.py`` measures and commits it); where it is missing, measured now
    (:func:`~helion_kernels.timing.measure_ceilings`) and written there."""
    from . import results

    folder = RESULTS_DIR / registry.gpu_key(device)
    found = results.read_ceilings(folder)
    if found is None:
        found, rows = measure_ceilings(device)
        results.write_ceilings(folder, rows, run_meta(device, found, timer="graph", repeats=1))
        print(f"measured the ceilings of this GPU: {folder / 'ceilings.md'}", file=sys.stderr)
    return found


TIMERS = {"graph": "CUDA-graph replay (triton.testing.do_bench_cudagraph), median of 10 replays",
          "plain": "eager loop, host time included (triton.testing.do_bench), median"}


def run_meta(device: torch.device, ceilings: Ceilings, timer: str, repeats: int, order: str = "balanced",
             **extra) -> dict:
    """What every row of a run records (:data:`~helion_kernels.results.PROVENANCE`: date,
    commit, command, ``timer`` ("graph" or "plain", :data:`TIMERS`), the column ``order``
    ("balanced": :data:`BALANCED_ORDER`, or "one order"), ``repeats``,
    the ceilings its floors use, versions), the GPU, a sentence on the timing for the table's
    notes, and ``extra`` entries (e.g. ``kernel``, ``inputs``, ``baselines``)."""
    from .results import checkout_commit

    timing = TIMERS[timer] + ", input sets rotated to >= 4x L2"
    if repeats > 1:
        timing += f"; every column timed in {repeats} repeats ({BALANCED_ORDER}), the medians reported"
    return {
        "gpu": torch.cuda.get_device_name(device),
        "gpu_key": registry.gpu_key(device),
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": checkout_commit(),
        "command": shlex.join(["helion-kernels", *sys.argv[1:]]),
        "timer": timer,
        "order": order,
        "repeats": repeats,
        "copy_GBps": round(ceilings.bandwidth_gbps, 1),
        "gemm_TFLOPs": round(ceilings.bf16_tflops, 1),
        "versions": ", ".join(f"{k} {v}" for k, v in {**versions(), "liger-kernel": _version("liger-kernel")}.items()),
        "timing": timing,
        **extra,
    }


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def write_results(df: pd.DataFrame, meta: dict, out_dir: Path, stem: str, plot_fn=None,
                  notes: tuple[str, ...] = (SAVED_NOTE, SPEEDUP_NOTE)) -> list[Path]:
    """Merge a run's rows into the table ``<out_dir>/<stem>`` (one per op, workload and GPU;
    :func:`~helion_kernels.results.write_table`: a re-run replaces its rows in place) and
    write its ``.md`` and ``.png`` (drawn by ``plot_fn(table, meta, path)``, default :func:`plot`)."""
    from .results import write_table

    notes = (f"timing: {meta['timing']}", *(f"{key}: {meta[key]}" for key in ("inputs", "baselines") if key in meta),
             *notes)
    return write_table(df, meta, out_dir, stem, f"{stem} on {meta['gpu']}", notes, plot_fn or plot)


def write_table(df: pd.DataFrame, stem: Path, title: str, provenance: list[str]) -> None:
    """``<stem>.csv`` and ``<stem>.md`` (``# title``, the ``provenance`` lines as bullets with
    the package versions added, the table): the record of a diagnostic or variant run."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(f"{stem}.csv", index=False, float_format="%.5g")
    lines = [f"# {title}", "", *(f"- {line}" for line in provenance),
             f"- versions: {', '.join(f'{k} {v}' for k, v in versions().items())}", ""]
    Path(f"{stem}.md").write_text("\n".join(lines) + "\n" + df.to_markdown(index=False, floatfmt=".4g") + "\n")


def row_labels(df: pd.DataFrame) -> list[str]:
    """One label per result row: ``MxKxN``, or ``H<h> q<=<max_seq_len_q>`` for attention."""
    if {"M", "K", "N"} <= set(df.columns):
        return [f"{r.M}x{r.K}x{r.N}" for r in df.itertuples()]
    return [f"H{r.H} q<={r.max_seq_len_q}" for r in df.itertuples()]


def plot(df: pd.DataFrame, meta: dict, path: Path) -> None:
    """Latency relative to ``meta["relative_to"]`` (default cuBLAS ``a @ b``) per row, and
    below it the % of the norm's latency saved (when measured) or the speed-up over the best
    unfused pipeline with ``meta["aim"]``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = row_labels(df)
    relative_to = meta.get("relative_to") or "cublas_mm"
    time_cols = [c for c in df.columns if c.endswith("_ms") and "floor" not in c]
    saved_cols = [c for c in df.columns if c.startswith("saved_")]
    second = bool(saved_cols) or "speedup_vs_best_unfused" in df.columns
    fig, axes = plt.subplots(2 if second else 1, 1, figsize=(max(8, len(df) * 0.9), 9 if second else 5),
                             squeeze=False)
    rel = df[time_cols].div(df[f"{relative_to}_ms"], axis=0)
    rel.columns = [c.removesuffix("_ms") for c in time_cols]
    rel.index = labels
    rel.plot.bar(ax=axes[0, 0], width=0.85)
    axes[0, 0].axhline(1.0, color="k", lw=0.8, ls="--")
    axes[0, 0].set_ylim(0, rel.to_numpy().max() * 1.35)  # headroom for the legend
    axes[0, 0].legend(ncol=4, fontsize=8, loc="upper left")
    axes[0, 0].set_ylabel(f"latency / {relative_to}")
    axes[0, 0].set_title(f"{meta['gpu']}: latency relative to {relative_to} (lower is better)")
    if saved_cols:
        saved = df[saved_cols].copy()
        saved.index = labels
        saved.plot.bar(ax=axes[1, 0], width=0.8)
        axes[1, 0].axhline(100, color="k", lw=0.8, ls="--", label="norm free")
        axes[1, 0].set_ylabel("% of inductor norm latency saved")
        axes[1, 0].set_title("latency saved (higher is better)")
        axes[1, 0].legend(fontsize=8)
    elif second:
        aim = meta.get("aim")
        aim_bars(axes[1, 0], df["speedup_vs_best_unfused"], labels, aim,
                 f"aim: {aim}x" if aim else None, "speed-up over the best unfused", baseline=1.0)
    finish_plot(fig, axes[:, 0], path)


def aim_bars(ax, values: pd.Series, labels: list[str], aim: float | None, aim_label: str | None,
             ylabel: str, baseline: float) -> None:
    """Bar chart of one metric per row with its aim (red, dashed; None: no aim) and
    ``baseline`` (black)."""
    shown = values.to_frame()
    shown.index = labels
    shown.plot.bar(ax=ax, width=0.6, legend=False)
    ax.axhline(baseline, color="k", lw=0.8)
    if aim is not None:  # drawn over the baseline, which it may equal
        ax.axhline(aim, color="r", lw=1.2, ls="--", label=aim_label)
        ax.legend(fontsize=8)
    ax.set_ylabel(ylabel)


def finish_plot(fig, axes, path: Path) -> None:
    """Slant the per-row x labels of ``axes``, save ``fig`` to ``path`` and close it."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.tick_params(axis="x", rotation=45)
        for lab in ax.get_xticklabels():
            lab.set_ha("right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def codegen_status(kernel, args: tuple, config) -> str:
    """"ok" if ``kernel`` generates Triton code for ``config`` at ``args`` on this machine,
    else "FAILED: ..." (a health check: it reports, it does not raise). Keys only a CUDA
    device accepts (e.g. host_tensor_descriptors on sm_90) are left out for the CPU."""
    try:
        bound = kernel.bind(args)
        gpu_only = bound.config_spec.unsupported_config_keys(config.config)
        bound.to_triton_code(helion.Config(**{k: v for k, v in config.config.items() if k not in gpu_only}))
        return "ok"
    except Exception as err:  # report, do not stop
        return f"FAILED: {type(err).__name__}: {err}"


def cpu_report(spec: KernelSpec, problems: list[Problem], dtype: torch.dtype) -> pd.DataFrame:
    """What can be shown without a GPU: per registry key of ``problems`` and per GPU with
    entries of this kernel (else every GPU in the registry), the config a call would run with
    (:func:`~.registry.lookup`), checked to
    generate Triton code for that problem with the installed Helion."""
    # Code generation is what is checked, also when HELION_INTERPRET=1 is set, with the build
    # a call would run: the static one, or for a dynamic_m spec at a shape not tuned exactly
    # the dynamic-shape one (runtime.dynamic_build).
    kernels = {static: helion.kernel(spec.kernel.fn, static_shapes=static, ref_mode=RefMode.OFF)
               for static in (spec.kernel.settings.static_shapes, False)}
    name = registry.dtype_name(dtype)
    rows = []
    known = registry.known_gpus()
    for gpu in [g for g in known if registry.entries_for(spec.name, g)] or known or ["(none)"]:
        for key, problem in tuning_problems(spec, problems).items():
            args = spec.make_args(problem.for_codegen(), dtype, "cpu", None)  # uninitialised: codegen only
            found = registry.lookup(spec.name, key, name, gpu, warn=False)
            resolved = runtime.resolve_entry(spec, found, args)
            row = {
                "gpu": gpu, **key._asdict(), "dtype": name, "config": found.source,
                "tuned_at": "-" if found.entry is None else str(found.entry.shape),
                "tuned_ms": found.entry.meta.get("latency_ms", math.nan) if found.source == "exact" else math.nan,
            }
            static = spec.kernel.settings.static_shapes and not runtime.uses_dynamic_build(spec, args, found.source)
            row["build"] = "static" if static else "dynamic"
            if spec.dispatch_baseline is not None:
                row["runs"] = _dispatch(spec, key, dtype, found)
            row["codegen"] = codegen_status(kernels[static], args, resolved)
            rows.append(row)
    return pd.DataFrame(rows)


def _dispatch(spec: KernelSpec, shape, dtype: torch.dtype, found: registry.Lookup) -> str:
    """What a GEMM + norm op runs at ``shape`` by the registry (:func:`~.runtime.registry_decision`,
    without a device: the default shared memory for the full-row N limit)."""
    limit = spec.n_limit(dtype, "cpu") if spec.n_limit is not None else None
    if limit is not None and shape.N > limit:
        return f"unfused (N > {limit})"
    if found.entry is None:
        return "unfused (no entry)"
    text = registry.dispatch_text(runtime.registry_decision(spec, found, shape).record)
    training = found.entry.meta.get(registry.TRAINING_DISPATCH)
    if training is None:
        return text
    carried = "*" if registry.MEASURED_CONFIG in training else ""  # measured with the replaced config
    return f"{text}; training: {registry.dispatch_text(runtime.registry_decision(spec, found, shape, True).record)}{carried}"
