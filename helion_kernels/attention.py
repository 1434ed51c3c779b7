"""Autotuning and benchmarking FlashNormAttention over an attention workload table.

The jagged attention kernel is compiled for dynamic sequence totals and specialised on H
and D, so its registry key is (H, D, dtype) (:class:`~.kernels.spec.AttentionShape`), and a
workload row is a sequence-length distribution (:mod:`.workloads`, attention kind).

* :func:`tune_rows`: per distinct (H, D) of the selected rows, Helion's autotuner on the
  row with the longest Q sequences (the rows the technique is for), seeded with the
  kernel's hand-picked tilings, every candidate checked against the fp32 reference; the
  winner is checked again on a fresh draw (and for bit-identical reruns), timed and saved.
* :func:`run_benchmark`: per row, CUDA-graph replay of the fused kernel (as the public
  function runs it), of the unfused block a PyTorch user writes (eager, and under
  ``torch.compile(dynamic=True)``, compiled once per (H, D): jagged totals change every
  batch), and of this package's unfused GDPA kernel between eager norms.

Inputs use affine parameters near 1 (LayerNorm weight and bias, RMSNorm weight) and the
``fast_gelu`` activation, the ads-model block of the PyTorch blog "Towards Free
Normalization" (Meta, 2026).
"""

from __future__ import annotations

import dataclasses
import functools
import time

import helion
import pandas as pd
import torch

from . import ops, registry
from .benchmark import aim_bars, codegen_status, finish_plot, run_meta
from .kernels import flash_norm_attention as fna
from .kernels.gdpa import ACTIVATIONS, jagged_lengths, random_jagged_inputs
from .kernels.spec import AttentionShape
from .timing import Ceilings, input_copies, measure_ceilings, time_ms
from .tuning import TuneOptions, TuneResult, entry_meta, sweep, tuning_kernel
from .verify import check_deterministic, check_outputs

KERNEL = "flash_norm_attention"
EPS = 1e-5
ACTIVATION = "fast_gelu"


@dataclasses.dataclass(frozen=True)
class AttentionRow:
    """One row of an attention workload: B sequences of H heads of width D, Q lengths drawn
    by :func:`~.kernels.gdpa.jagged_lengths` (``fill``, ``seed``), KV all ``seq_len_kv``."""

    batch: int
    H: int
    D: int
    max_seq_len_q: int
    seq_len_kv: int
    fill: float
    seed: int

    @property
    def shape(self) -> AttentionShape:
        return AttentionShape(self.H, self.D)

    def __str__(self) -> str:
        return f"B{self.batch} H{self.H} D{self.D} q<={self.max_seq_len_q} kv{self.seq_len_kv}"

    def q_lengths(self) -> list[int]:
        return jagged_lengths(self.batch, self.max_seq_len_q, self.fill, self.seed)


def rows_of(df: pd.DataFrame) -> list[AttentionRow]:
    """The rows of a loaded attention workload table."""
    return [AttentionRow(int(r.batch), int(r.H), int(r.D), int(r.max_seq_len_q), int(r.seq_len_kv),
                         float(r.fill), int(r.seed)) for r in df.itertuples()]


def make_args(row: AttentionRow, dtype: torch.dtype, device, seed: int) -> tuple:
    """Kernel arguments for ``row``: (q, k, v, q_offsets, kv_offsets, max_seq_len_q,
    ln_weight [H, D], ln_bias, rms_weight, eps, qk_scale, activation index); tensor values drawn from ``seed``
    (the Q lengths from the row's own seed, so every draw has the same lengths)."""
    q, k, v, qo, ko = random_jagged_inputs(row.q_lengths(), [row.seq_len_kv] * row.batch, row.H,
                                           row.D, dtype, device, seed)
    gen = torch.Generator(device=device).manual_seed(seed + 1_000_003)
    params = [(1.0 if i != 1 else 0.0) + 0.1 * torch.randn(row.H, row.D, generator=gen, device=device)
              for i in range(3)]  # ln_weight ~ 1, ln_bias ~ 0, rms_weight ~ 1
    return (q, k, v, qo, ko, row.max_seq_len_q, *(p.to(dtype) for p in params), EPS, 1.0,
            ACTIVATIONS.index(ACTIVATION))


def reference(q, k, v, qo, ko, max_seq_len_q, ln_weight, ln_bias, rms_weight, eps, qk_scale, activation):
    """:func:`~.kernels.flash_norm_attention.flash_norm_attention_reference` on kernel args."""
    return fna.flash_norm_attention_reference(q, k, v, qo, ko, ln_weight, ln_bias, rms_weight,
                                              eps, qk_scale, ACTIVATIONS[activation])


def min_bytes(args: tuple) -> int:
    """Read q, k, v once and write out once."""
    q, k, v = args[:3]
    return q.element_size() * (2 * q.numel() + k.numel() + v.numel())


def flops(row: AttentionRow) -> int:
    """Two GEMMs per head and sequence: 2 * 2 * len_q * len_kv * D * H."""
    return 4 * row.H * row.D * row.seq_len_kv * sum(row.q_lengths())


def _tuning_row(rows: list[AttentionRow]) -> dict[AttentionShape, AttentionRow]:
    """Per (H, D): the selected row with the longest Q sequences."""
    out: dict[AttentionShape, AttentionRow] = {}
    for row in rows:
        if row.shape not in out or row.max_seq_len_q > out[row.shape].max_seq_len_q:
            out[row.shape] = row
    return out


def tune_row(row: AttentionRow, dtype: torch.dtype, options: TuneOptions, device: torch.device,
             progress_bar: bool = False) -> TuneResult:
    """Tune the fused kernel for ``row``'s (H, D) on ``row``'s sequence lengths and save it.

    Raises:
        VerificationError: the winner fails a fresh draw or repeated runs differ.
    """
    if device.type != "cuda":
        raise ValueError(f"autotuning needs a CUDA device, got {device}")
    gpu, name = registry.gpu_key(device), registry.dtype_name(dtype)
    entries = registry.entries_for(KERNEL, gpu)
    if not options.force and (*row.shape, name) in entries:
        return TuneResult(row.shape, "skipped", 0.0, "already in the registry (--force re-tunes)")
    near = registry.nearest_entry(entries, row.shape, name)
    t0 = time.perf_counter()
    kernel = tuning_kernel(fna.flash_norm_attention_kernel, ([near.config] if near else []) + list(fna.SEED_CONFIGS),
                           reference, dtype, options, progress_bar)
    args = make_args(row, dtype, device, options.seed)
    bound = kernel.bind(args)
    config = bound.autotune(args, force=options.force)
    tune_seconds = time.perf_counter() - t0
    fresh = make_args(row, dtype, device, options.seed + 1)
    rel_error = check_outputs(bound(*fresh), reference(*fresh), dtype)
    check_deterministic(lambda: bound(*fresh))
    latency = time_ms(lambda: bound(*args))
    entry = registry.Entry(row.shape, name, config, meta=entry_meta(
        latency, rel_error, options, tune_seconds, near,
        tuned_on={**dataclasses.asdict(row), "activation": ACTIVATION, "affine": True}))
    registry.save_entry(KERNEL, gpu, entry, gpu_name=torch.cuda.get_device_name(device))
    return TuneResult(row.shape, "tuned", time.perf_counter() - t0,
                      f"{latency:.4f} ms on {row}, rel. error {rel_error:.2e}, tuned in {tune_seconds:.0f} s",
                      entry)


def tune_rows(rows: list[AttentionRow], dtype: torch.dtype, options: TuneOptions,
              device: torch.device) -> list[TuneResult]:
    """:func:`tune_row` for each distinct (H, D) of ``rows`` (on its longest-Q row), with a
    progress bar; a failing (H, D) does not stop the rest."""
    picked = _tuning_row(rows)
    return sweep(f"autotune {KERNEL}", [(shape, str(row)) for shape, row in picked.items()],
                 lambda shape: tune_row(picked[shape], dtype, options, device))


def _gdpa_eager_norms(q, k, v, qo, ko, max_q, max_kv, ln_w, ln_b, rms_w, eps, activation):
    """This package's unfused GDPA kernel between eager PyTorch norms and residuals."""
    return fna.norm_block(
        q, lambda ln: ops.gdpa(ln, k, v, qo, ko, max_q, max_kv, activation, validate=False),
        ln_w, ln_b, rms_w, eps)


def bench_row(row: AttentionRow, dtype: torch.dtype, device: torch.device, ceilings: Ceilings,
              compiled) -> dict:
    """One result row: times in ms of the fused kernel and the unfused alternatives."""
    first = make_args(row, dtype, device, 0)
    arg_sets = [first] + [make_args(row, dtype, device, s)
                          for s in range(1, input_copies(min_bytes(first), device))]
    out = {**dataclasses.asdict(row), "dtype": registry.dtype_name(dtype),
           "total_q": int(first[0].shape[0])}
    out["config"] = registry.resolve(KERNEL, fna.DEFAULT_CONFIG, row.shape, dtype,
                                     registry.gpu_key(device)).source

    def call(fn, a, flat_params: bool):
        q, k, v, qo, ko, _, lw, lb, rw, eps = a[:10]
        if flat_params:  # the user's block takes [H * D] parameters
            lw, lb, rw = (p.reshape(-1) for p in (lw, lb, rw))
        return fn(q, k, v, qo, ko, row.max_seq_len_q, row.seq_len_kv, lw, lb, rw, eps,
                  activation=ACTIVATION)

    fused = functools.partial(call, functools.partial(ops.flash_norm_attention, validate=False),
                              flat_params=False)
    candidates = {
        KERNEL: fused,
        "unfused_eager": functools.partial(call, fna.unfused_block, flat_params=True),
        "unfused_compiled": functools.partial(call, compiled, flat_params=True),
        "gdpa+eager_norms": functools.partial(call, _gdpa_eager_norms, flat_params=True),
    }
    ref = reference(*first)
    for name in (KERNEL, "unfused_compiled"):
        try:
            out[f"{name}_rel_error"] = check_outputs(candidates[name](first), ref, dtype)
            out[f"{name}_check"] = "ok"
        except AssertionError as err:  # reported in the row; the other rows still run
            out[f"{name}_rel_error"] = float("inf")
            out[f"{name}_check"] = f"FAILED: {err}"
    del ref
    times = {name: time_ms([functools.partial(fn, a) for a in arg_sets]) for name, fn in candidates.items()}
    out.update({f"{k}_ms": v for k, v in times.items()})
    fused_ms = times[KERNEL]
    out["speedup_vs_compiled"] = times["unfused_compiled"] / fused_ms
    out["speedup_vs_eager"] = times["unfused_eager"] / fused_ms
    out["speedup_vs_gdpa+eager_norms"] = times["gdpa+eager_norms"] / fused_ms
    out["byte_floor_ms"] = min_bytes(first) / (ceilings.bandwidth_gbps * 1e9) * 1e3
    out["flop_floor_ms"] = flops(row) / (ceilings.bf16_tflops * 1e12) * 1e3
    out["fused_over_floor"] = fused_ms / max(out["byte_floor_ms"], out["flop_floor_ms"])
    return out


def run_benchmark(rows: list[AttentionRow], dtype: torch.dtype, device: torch.device
                  ) -> tuple[pd.DataFrame, dict]:
    """Benchmark every row with a progress bar; returns the table and its metadata."""
    from rich.progress import track

    ceilings = measure_ceilings(device)
    compiled, compiled_for = None, None
    results = []
    for row in track(rows, description=f"bench {KERNEL}", transient=True):
        if compiled_for != row.shape:  # one dynamic-shape compile per (H, D)
            torch._dynamo.reset()
            compiled, compiled_for = torch.compile(fna.unfused_block, dynamic=True), row.shape
        results.append(bench_row(row, dtype, device, ceilings, compiled))
    meta = run_meta(
        device, ceilings,
        inputs=f"activation {ACTIVATION}, affine LayerNorm and RMSNorm, eps {EPS}, qk_scale 1",
        baselines="unfused_eager / unfused_compiled: helion_kernels.kernels.flash_norm_attention."
                  "unfused_block (norms on jagged rows, attention on zero-padded copies), eager and "
                  "torch.compile(dynamic=True) compiled once per (H, D); gdpa+eager_norms: this "
                  "package's unfused GDPA kernel (fixed config) between eager norms",
    )
    return pd.DataFrame(results), meta


def plot(df: pd.DataFrame, meta: dict, path) -> None:
    """Latency relative to the compiled unfused block per row, and the fused speed-up."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"H{r.H} q<={r.max_seq_len_q}" for r in df.itertuples()]
    time_cols = [c for c in df.columns if c.endswith("_ms") and "floor" not in c]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, len(df) * 0.8), 9))
    rel = df[time_cols].div(df["unfused_compiled_ms"], axis=0)
    rel.columns = [c.removesuffix("_ms") for c in time_cols]
    rel.index = labels
    rel.plot.bar(ax=axes[0], width=0.85)
    axes[0].axhline(1.0, color="k", lw=0.8, ls="--")
    axes[0].set_ylabel("latency / compiled unfused block")
    axes[0].set_title(f"{meta['gpu']}: FlashNormAttention forward (lower is better)")
    axes[0].legend(fontsize=8, ncol=4, loc="upper left")
    axes[0].set_ylim(0, rel.to_numpy().max() * 1.3)
    aim_bars(axes[1], df["speedup_vs_compiled"], labels, 1.35, "aim: 1.35x",
             "speed-up over compiled unfused", baseline=1.0)
    finish_plot(fig, axes, path)


def cpu_report(rows: list[AttentionRow], dtype: torch.dtype) -> pd.DataFrame:
    """Without a GPU: per registered GPU and (H, D), the config a call would use, checked to
    generate Triton code with the installed Helion."""
    from helion.runtime.ref_mode import RefMode

    kernel = helion.kernel(fna.flash_norm_attention_kernel.fn, static_shapes=False, ref_mode=RefMode.OFF)
    name = registry.dtype_name(dtype)
    report = []
    for gpu in registry.known_gpus() or ["(none)"]:
        entries = registry.entries_for(KERNEL, gpu) if gpu != "(none)" else {}
        for row in _tuning_row(rows).values():
            exact = entries.get((*row.shape, name))
            entry = exact or registry.nearest_entry(entries, row.shape, name)
            config = entry.config if entry else fna.DEFAULT_CONFIG
            small = dataclasses.replace(row, batch=2, max_seq_len_q=16)  # codegen only
            args = make_args(small, dtype, "cpu", 0)
            codegen = codegen_status(kernel, args, config)
            report.append({"gpu": gpu, "H": row.H, "D": row.D, "dtype": name,
                           "config": "exact" if exact else ("nearest " + str(entry.shape) if entry else "default"),
                           "registry_latency_ms": entry.meta.get("latency_ms") if exact else None,
                           "triton_codegen": codegen})
    return pd.DataFrame(report)
