"""Benchmark a kernel over a workload against the unfused alternatives a user has.

Per shape (CUDA-graph replay, median, input sets rotated past the L2 cache): cuBLAS
``a @ b``, the plain Helion GEMM tuned the same way, the standalone norm (inductor, and
Liger when installed), cuBLAS + norm, and the fused kernel. Reported: latency saved as a
percentage of the inductor norm's latency (the blog's metric, against the Helion GEMM;
and against cuBLAS + inductor norm), speed-up over the best unfused pipeline, relative
error against the fp32 reference (and whether repeated runs agree bit for bit; a failed
check is recorded in the row's ``check`` column), and distance to the byte and FLOP
floors at the ceilings measured in the same run. Results go to ``bench/results/<gpu>/`` as CSV,
markdown and PNG.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import shlex
import sys
from pathlib import Path

import pandas as pd
import torch

from . import ops, registry
from .kernels import get_spec
from .kernels.spec import KernelSpec, Shape
from .timing import Ceilings, input_copies, measure_ceilings, time_ms
from .tuning import versions
from .verify import VerificationError, verify_config
from .workloads import load_workload

RESULTS_DIR = Path(__file__).resolve().parent.parent / "bench" / "results"


def bench_shape(
    spec: KernelSpec, shape: Shape, dtype: torch.dtype, device: torch.device, ceilings: Ceilings
) -> dict:
    """One result row for ``shape``: times in ms, savings in %, floors in ms."""
    torch._dynamo.reset()  # one fresh torch.compile per shape, no recompile limit
    n_sets = input_copies(spec.min_bytes(shape, dtype), device)
    arg_sets = [spec.make_args(shape, dtype, device, seed) for seed in range(n_sets)]
    row: dict = {"M": shape.M, "K": shape.K, "N": shape.N, "dtype": registry.dtype_name(dtype)}

    row["config"] = ops.resolved_config(spec, arg_sets[0]).source
    try:  # a wrong kernel is reported in its row, and the other rows still run
        row["rel_error"] = verify_config(lambda *a: ops.run(spec, a), spec, shape, dtype, device,
                                         seed=n_sets, draws=1)
        row["check"] = "ok"
    except VerificationError as err:
        row["rel_error"] = float("inf")
        row["check"] = f"FAILED: {err}"

    times = {spec.name: time_ms([lambda a=a: ops.run(spec, a) for a in arg_sets])}
    if spec.gemm_twin is not None:
        twin = get_spec(spec.gemm_twin)
        times[f"helion_{twin.name}"] = time_ms([lambda a=a: ops.run(twin, a[:2]) for a in arg_sets])
        row[f"helion_{twin.name}_config"] = ops.resolved_config(twin, arg_sets[0][:2]).source
    baseline_sets = [spec.baselines(*a) for a in arg_sets]
    for name in baseline_sets[0]:
        times[name] = time_ms([b[name] for b in baseline_sets])
    row.update({f"{k}_ms": v for k, v in times.items()})

    fused = times[spec.name]
    if spec.norm_baseline is not None:
        norm = times[spec.norm_baseline]
        gemm = times.get(f"helion_{spec.gemm_twin}")
        if gemm is not None:
            row["saved_vs_helion_gemm_pct"] = 100 * (gemm + norm - fused) / norm
        if "cublas+inductor_norm" in times:
            row["saved_vs_cublas_inductor_pct"] = 100 * (times["cublas+inductor_norm"] - fused) / norm
    unfused = [times[n] for n in spec.unfused_baselines if n in times]
    if unfused:
        row["speedup_vs_best_unfused"] = min(unfused) / fused
    if spec.dispatch_baseline is not None:
        # What the public function runs at this shape: the registry's recorded choice.
        chosen = ops.use_fused(spec, arg_sets[0])
        row["dispatch"] = "fused" if chosen else "unfused"
        row["dispatched_ms"] = fused if chosen else times[spec.dispatch_baseline]
        if unfused:
            row["dispatched_speedup_vs_best_unfused"] = min(unfused) / row["dispatched_ms"]
    row["vs_cublas_mm"] = fused / times["cublas_mm"]
    row["byte_floor_ms"] = spec.min_bytes(shape, dtype) / (ceilings.bandwidth_gbps * 1e9) * 1e3
    row["flop_floor_ms"] = spec.flops(shape) / (ceilings.bf16_tflops * 1e12) * 1e3
    row["fused_over_floor"] = fused / max(row["byte_floor_ms"], row["flop_floor_ms"])
    return row


def run_benchmark(
    spec: KernelSpec, shapes: list[Shape], dtype: torch.dtype, device: torch.device
) -> tuple[pd.DataFrame, dict]:
    """Benchmark every shape with a progress bar; returns the table and its metadata."""
    from rich.progress import track

    ceilings = measure_ceilings(device)
    rows = [
        bench_shape(spec, s, dtype, device, ceilings)
        for s in track(shapes, description=f"bench {spec.name}", transient=True)
    ]
    return pd.DataFrame(rows), run_meta(device, ceilings)


def workload_script_args(description: str, add_arguments=None) -> tuple[argparse.Namespace, pd.DataFrame]:
    """The command line of the ``bench/`` scripts that sweep a GEMM workload table.

    ``--workload`` (default ``postnorm_split_n``), ``--where`` (a pandas query), ``--out``
    (default ``bench/results/<gpu>/``), plus what ``add_arguments(parser)`` adds. Returns
    (args, the selected rows). A bad table or query exits with the usage error, before the
    GPU is looked for; no CUDA GPU exits with status 2.
    """
    p = argparse.ArgumentParser(description=description)
    if add_arguments is not None:
        add_arguments(p)
    p.add_argument("--workload", default="postnorm_split_n", help="a GEMM workload table (M, K, N)")
    p.add_argument("--where", default=None, help="pandas query on the table's M, K, N columns")
    p.add_argument("--out", type=Path, default=None, help="default: bench/results/<gpu>/")
    args = p.parse_args()
    try:
        table = load_workload(args.workload, args.where)
    except ValueError as err:
        p.error(str(err))
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        raise SystemExit(2)
    return args, table


def run_meta(device: torch.device, ceilings: Ceilings, **extra: str) -> dict:
    """Provenance of a benchmark run: GPU, date, the command, versions, measured ceilings,
    how it was timed, and ``extra`` lines (e.g. ``inputs``, ``baselines``)."""
    return {
        "gpu": torch.cuda.get_device_name(device),
        "gpu_key": registry.gpu_key(device),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(shlex.quote(a) for a in ["helion-kernels", *sys.argv[1:]]),
        "versions": {**versions(), "liger-kernel": _version("liger-kernel")},
        "ceilings": {"copy_GBps": round(ceilings.bandwidth_gbps, 1), "bf16_TFLOPs": round(ceilings.bf16_tflops, 1)},
        "timing": "CUDA-graph replay (triton.testing.do_bench_cudagraph), median of 10 replays, "
                  "input sets rotated to >= 4x L2",
        **extra,
    }


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


SAVED_NOTE = ("`saved_vs_*_pct`: latency saved as % of the inductor norm's latency, "
              "(t_gemm + t_norm - t_fused) / t_norm; 100% = the norm is free")


def write_results(df: pd.DataFrame, meta: dict, out_dir: Path, stem: str, plot_fn=None,
                  notes: tuple[str, ...] = (SAVED_NOTE,)) -> list[Path]:
    """``<stem>.csv``, ``<stem>.md`` (table + provenance + ``notes``), ``<stem>.json`` and
    ``<stem>.png`` (drawn by ``plot_fn(df, meta, path)``, default :func:`plot`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.{ext}" for ext in ("csv", "md", "json", "png")]
    df.to_csv(paths[0], index=False, float_format="%.5g")
    header = [
        f"# {stem} on {meta['gpu']}",
        "",
        f"- command: `{meta['command']}`",
        f"- date: {meta['date']}",
        f"- versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}",
        f"- measured ceilings: {meta['ceilings']['copy_GBps']} GB/s copy, "
        f"{meta['ceilings']['bf16_TFLOPs']} bf16 TFLOP/s",
        f"- timing: {meta['timing']}",
        *(f"- {key}: {meta[key]}" for key in ("inputs", "baselines") if key in meta),
        *(f"- {note}" for note in notes),
        "",
    ]
    shown = df.copy()
    for col in shown.select_dtypes("float").columns:  # 4 significant digits, integers kept
        shown[col] = shown[col].map(lambda v: f"{v:.4g}")
    paths[1].write_text("\n".join(header) + "\n" + shown.to_markdown(index=False) + "\n")
    paths[2].write_text(json.dumps(meta, indent=1) + "\n")
    (plot_fn or plot)(df, meta, paths[3])
    return paths


def plot(df: pd.DataFrame, meta: dict, path: Path) -> None:
    """Latency relative to cuBLAS ``a @ b`` per shape, and % of the norm's latency saved."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.M}x{r.K}x{r.N}" for r in df.itertuples()]
    time_cols = [c for c in df.columns if c.endswith("_ms") and "floor" not in c]
    saved_cols = [c for c in df.columns if c.startswith("saved_")]
    fig, axes = plt.subplots(2 if saved_cols else 1, 1, figsize=(max(8, len(df) * 0.9), 9 if saved_cols else 5),
                             squeeze=False)
    rel = df[time_cols].div(df["cublas_mm_ms"], axis=0)
    rel.columns = [c.removesuffix("_ms") for c in time_cols]
    rel.index = labels
    rel.plot.bar(ax=axes[0, 0], width=0.85)
    axes[0, 0].axhline(1.0, color="k", lw=0.8, ls="--")
    axes[0, 0].set_ylim(0, rel.to_numpy().max() * 1.35)  # headroom for the legend
    axes[0, 0].legend(ncol=4, fontsize=8, loc="upper left")
    axes[0, 0].set_ylabel("latency / cuBLAS a@b")
    axes[0, 0].set_title(f"{meta['gpu']}: latency relative to cuBLAS GEMM (lower is better)")
    if saved_cols:
        saved = df[saved_cols].copy()
        saved.index = labels
        saved.plot.bar(ax=axes[1, 0], width=0.8)
        axes[1, 0].axhline(100, color="k", lw=0.8, ls="--", label="norm free")
        axes[1, 0].set_ylabel("% of inductor norm latency saved")
        axes[1, 0].set_title("latency saved (higher is better)")
        axes[1, 0].legend(fontsize=8)
    finish_plot(fig, axes[:, 0], path)


def aim_bars(ax, values: pd.Series, labels: list[str], aim: float, aim_label: str, ylabel: str,
             baseline: float) -> None:
    """Bar chart of one metric per row with its aim (red, dashed) and ``baseline`` (black)."""
    shown = values.to_frame()
    shown.index = labels
    shown.plot.bar(ax=ax, width=0.6, legend=False)
    ax.axhline(aim, color="r", lw=0.8, ls="--", label=aim_label)
    ax.axhline(baseline, color="k", lw=0.8)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)


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
    else "FAILED: ..." (a health check: it reports, it does not raise)."""
    import helion

    try:
        bound = kernel.bind(args)
        # Keys only a CUDA device accepts (e.g. host_tensor_descriptors on sm_90) cannot be
        # generated for the CPU: drop them and say so.
        gpu_only = bound.config_spec.unsupported_config_keys(config.config)
        bound.to_triton_code(helion.Config(**{k: v for k, v in config.config.items() if k not in gpu_only}))
        return "ok" + (f" (without GPU-only {', '.join(gpu_only)})" if gpu_only else "")
    except Exception as err:  # report, do not stop
        return f"FAILED: {type(err).__name__}: {err}"[:120]


def cpu_report(spec: KernelSpec, shapes: list[Shape], dtype: torch.dtype) -> pd.DataFrame:
    """What can be shown without a GPU: per shape and registered GPU, the config a call
    would run with, checked to compile to Triton for that exact shape with this Helion."""
    import helion
    from helion.runtime.ref_mode import RefMode

    # Code generation is what is checked, also when HELION_INTERPRET=1 is set.
    kernel = helion.kernel(spec.kernel.fn, static_shapes=True, ref_mode=RefMode.OFF)
    rows = []
    name = registry.dtype_name(dtype)
    for gpu in registry.known_gpus() or ["(none)"]:
        entries = registry.entries_for(spec.name, gpu) if gpu != "(none)" else {}
        for shape in shapes:
            exact = entries.get((*shape, name))
            entry = exact or registry.nearest_entry(entries, shape, name)
            config = entry.config if entry else spec.default_config
            args = spec.make_args(shape, dtype, "cpu", None)  # uninitialised: codegen only
            codegen = codegen_status(kernel, args, config)
            rows.append({
                "gpu": gpu, "M": shape.M, "K": shape.K, "N": shape.N, "dtype": name,
                "config": "exact" if exact else ("nearest " + str(entry.shape) if entry else "default"),
                "registry_latency_ms": entry.meta.get("latency_ms") if exact else None,
                "triton_codegen": codegen,
            })
    return pd.DataFrame(rows)

