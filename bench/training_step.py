"""Forward + backward of one layer: the fused module against what a user runs today.

For each row (layer, M, K, N) of a training workload (default ``training``), bf16 inputs,
parameters and output gradient, ``x`` requiring grad (a layer inside a network), the same
timer for every column of a row: ``--timer plain`` (default) is ``triton.testing.do_bench``,
median, not graph-captured (what an eager training loop sees, host overhead included);
``--timer graph`` replays each step as a CUDA graph (``triton.testing.do_bench_cudagraph``,
median: GPU time alone, what a loop that captures its step sees). A row where any column
cannot be captured is timed plain for every column, and its ``timer`` column says so.

* ``gemms``: the layer's three cuBLAS GEMMs alone (forward, dgrad, wgrad): the floor where
  the norm costs nothing; ``helion_gemms``: the same three as this package's Helion GEMM;
* ``eager``, ``compiled``: the PyTorch pair (``nn.RMSNorm``/``nn.LayerNorm`` + ``nn.Linear``),
  eager and under ``torch.compile`` (default mode); ``liger``: Liger's norm + ``nn.Linear``
  (when liger-kernel is installed);
* ``fused``, ``fused_compiled``: this package's module, eager and under ``torch.compile``.

Also: peak memory of one step above what was allocated before it (``fused_peak_mib``: the
module eager, ``fused_compiled_peak_mib``: under ``torch.compile``, ``compiled_peak_mib``: the
compiled pair; an eager autograd node keeps what it saved until its whole backward returns,
a compiled backward frees each saved tensor after its last use), the share of the norm's cost removed,
``(compiled - fused) / (compiled - gemms)``, and each output gradient checked against the
compiled pair's.

    python bench/training_step.py [--where "layer == 'linear_layernorm'"] [--timer graph] [--bias] [--repeats N] [--out DIR]

``--repeats N``: every column timed in N repeats, each taking the columns in order and then in
reverse order (clock drift and a column's place fall on all alike); the medians are reported,
with ``speedup_vs_compiled_spread`` (max - min of the per-repeat ratio).

``--bias``: the Linear has a bias (added inside the post-norm kernels). Writes
``training_step_<workload>[_bias][_graph][_<where>].{csv,md,json,png}`` to
``bench/results/<gpu>/``.
"""

from __future__ import annotations

import argparse
import statistics
import shlex
import sys
import warnings
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from helion_kernels import LinearLayerNorm, LinearRMSNorm, RMSNormLinear, matmul, registry
from helion_kernels.benchmark import (aim_bars, device_ceilings, finish_plot, run_meta, time_columns,
                                      workload_script_args, write_results)
from helion_kernels.cli import positive_int
from helion_kernels.verify import check_outputs

NORMS = {"rmsnorm_linear": nn.RMSNorm, "linear_layernorm": nn.LayerNorm, "linear_rmsnorm": nn.RMSNorm}
MODULES = {"rmsnorm_linear": RMSNormLinear, "linear_layernorm": LinearLayerNorm, "linear_rmsnorm": LinearRMSNorm}


def _pair(layer: str, k: int, n: int, bias: bool = False) -> nn.Module:
    if layer == "rmsnorm_linear":
        return nn.Sequential(nn.RMSNorm(k, eps=1e-5), nn.Linear(k, n, bias=bias))
    return nn.Sequential(nn.Linear(k, n, bias=bias), NORMS[layer](n, eps=1e-5))


def _fused(layer: str, pair: nn.Sequential) -> nn.Module:
    norm, linear = (pair[0], pair[1]) if layer == "rmsnorm_linear" else (pair[1], pair[0])
    return MODULES[layer].from_modules(norm, linear)


def _liger(layer: str, pair: nn.Sequential) -> nn.Module | None:
    try:
        from liger_kernel.transformers import LigerLayerNorm, LigerRMSNorm
    except Exception:  # optional dependency, or broken against this torch/triton
        return None
    norm = pair[0] if layer == "rmsnorm_linear" else pair[1]
    liger = (LigerLayerNorm if layer == "linear_layernorm" else LigerRMSNorm)(norm.normalized_shape[0], eps=1e-5)
    liger = liger.to(norm.weight.device, norm.weight.dtype)
    with torch.no_grad():
        liger.weight.copy_(norm.weight)
        if getattr(norm, "bias", None) is not None and getattr(liger, "bias", None) is not None:
            liger.bias.copy_(norm.bias)
    return nn.Sequential(liger, pair[1]) if layer == "rmsnorm_linear" else nn.Sequential(pair[0], liger)


def _step(model, x, dy):
    def run():
        x.grad = None
        for p in model.parameters():
            p.grad = None
        model(x).backward(dy)
    return run


def _peak_mib(fn) -> float:
    fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _paths(layer: str, fused: nn.Module, x: torch.Tensor) -> tuple[str, str]:
    """(forward path, backward path) the fused module takes at this shape, as the ops decide."""
    from helion_kernels import runtime
    from helion_kernels.techniques.postnorm import kernels as postnorm_full_row
    from helion_kernels.techniques.prenorm import kernels as prenorm

    w = fused.linear.weight.detach()
    if layer == "rmsnorm_linear":
        args = (x.detach(), w.t(), 1e-5)
        forward, backward = runtime.decide(prenorm.SPEC, args).fused, runtime.decide(prenorm.SPEC_BACKWARD, args).fused
        if not forward:  # the backward keeps the unfused forward's x_hat
            return ("inductor norm + cuBLAS",
                    "inductor norm backward (writes dA only) + cuBLAS GEMMs (wgrad on the kept x_hat)")
        return "fused kernel", ("fused dgrad kernel + cuBLAS wgrad" if backward else
                                "cuBLAS GEMMs + inductor norm backward (writes x_hat)")
    spec = postnorm_full_row.SPEC_LAYERNORM if layer == "linear_layernorm" else postnorm_full_row.SPEC_RMSNORM
    params = (fused.norm.weight, fused.norm.bias) if layer == "linear_layernorm" else (fused.norm.weight,)
    forward = runtime.decide(spec, (x.detach(), w.t(), *params, 1e-5), training=True).fused  # autograd records it
    return (("fused kernel" if forward else "cuBLAS + inductor norm") + " (writes the norm input)",
            "inductor norm backward on the kept norm input + cuBLAS GEMMs")


def _time_all(steps: dict, timer: str, repeats: int = 1) -> tuple[dict[str, list[float]], str]:
    """(each column's median ms of every repeat, the timer used): every column by CUDA-graph
    replay, or, when ``timer`` is "plain" or any column cannot be captured, every column by
    plain do_bench; the columns in order and reversed within each repeat (:func:`time_columns`)."""
    from triton.testing import do_bench, do_bench_cudagraph

    def timed(bench) -> dict[str, list[float]]:
        return time_columns(steps, repeats, lambda fn: bench(fn, return_mode="median"))

    if timer == "graph":
        try:
            return timed(do_bench_cudagraph), "graph"
        except Exception as err:  # a column that cannot be captured: time the whole row plain
            torch.cuda.synchronize()
            print(f"  CUDA-graph capture failed ({type(err).__name__}: {str(err)[:200]}); timing this row plain",
                  flush=True)
    return timed(do_bench), "plain"


def bench_row(layer: str, m: int, k: int, n: int, timer: str = "plain", bias: bool = False,
              repeats: int = 1) -> dict:
    torch._dynamo.reset()
    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    pair = _pair(layer, k, n, bias).to(dev, dt)
    with torch.no_grad():
        for p in pair.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(m, k, device=dev, dtype=dt, requires_grad=True)
    dy = torch.randn(m, n, device=dev, dtype=dt)
    weight = pair[1].weight if layer == "rmsnorm_linear" else pair[0].weight  # [N, K]
    xs, w = x.detach(), weight.detach()
    gemm_inputs = (xs, w.t().contiguous(), dy, w.contiguous(), dy.t().contiguous(), xs)

    def gemms(mm):
        return lambda: (mm(gemm_inputs[0], gemm_inputs[1]), mm(gemm_inputs[2], gemm_inputs[3]),
                        mm(gemm_inputs[4], gemm_inputs[5]))

    steps = {"gemms": gemms(torch.mm), "helion_gemms": gemms(matmul),
             "eager": _step(pair, x, dy), "compiled": _step(torch.compile(pair), x, dy)}
    liger = _liger(layer, pair)
    if liger is not None:
        steps["liger"] = _step(liger, x, dy)
    fused = _fused(layer, pair)
    steps["fused"] = _step(fused, x, dy)
    steps["fused_compiled"] = _step(torch.compile(fused), x, dy)

    row = {"layer": layer, "M": m, "K": k, "N": n}
    row["forward_path"], row["backward_path"] = _paths(layer, fused, x)
    # Correctness: every gradient of the fused step against the compiled pair's.
    steps["compiled"]()
    expected = [x.grad.clone(), *(p.grad.clone() for p in pair.parameters())]
    for name in ("fused", "fused_compiled"):
        steps[name]()
        got = [x.grad, *(p.grad for p in pair.parameters())]
        try:
            row[f"{name}_grad_rel_error"] = max(check_outputs(g, e.float(), dt, tolerance=5e-2) for g, e in zip(got, expected))
            row[f"{name}_check"] = "ok"
        except AssertionError as err:
            row[f"{name}_grad_rel_error"], row[f"{name}_check"] = float("inf"), f"FAILED: {err}"
    repeated, row["timer"] = _time_all(steps, timer, repeats)
    row.update({f"{name}_ms": statistics.median(ts) for name, ts in repeated.items()})
    row["fused_peak_mib"] = _peak_mib(steps["fused"])
    row["fused_compiled_peak_mib"] = _peak_mib(steps["fused_compiled"])
    row["compiled_peak_mib"] = _peak_mib(steps["compiled"])
    best = min(row["fused_ms"], row["fused_compiled_ms"])
    norm_cost = row["compiled_ms"] - row["gemms_ms"]
    row["norm_share_removed_pct"] = 100 * (row["compiled_ms"] - best) / norm_cost if norm_cost > 0 else float("nan")
    row["speedup_vs_compiled"] = row["compiled_ms"] / best
    if repeats > 1:  # the same ratio per repeat (columns timed in the same repeat): its spread
        per_repeat = [c / min(f, fc) for c, f, fc in
                      zip(repeated["compiled"], repeated["fused"], repeated["fused_compiled"])]
        row["repeats"], row["speedup_vs_compiled_spread"] = repeats, max(per_repeat) - min(per_repeat)
    row["fused_over_helion_gemms"] = best / row["helion_gemms_ms"]
    return row


def plot(df: pd.DataFrame, meta: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.layer} {r.M}x{r.K}x{r.N}" for r in df.itertuples()]
    cols = [c for c in df.columns if c.endswith("_ms")]
    rel = df[cols].div(df["gemms_ms"], axis=0)
    rel.columns = [c.removesuffix("_ms") for c in cols]
    rel.index = labels
    fig, axes = plt.subplots(2, 1, figsize=(max(8, len(df) * 1.6), 9))
    rel.plot.bar(ax=axes[0], width=0.85)
    axes[0].axhline(1.0, color="k", lw=0.8, ls="--")
    axes[0].set_yscale("log")  # the host-bound small rows are 10-40x the GEMMs
    axes[0].set_ylabel("step time / cuBLAS GEMMs")
    axes[0].set_title(f"{meta['gpu']}: one training step of the layer (lower is better)")
    axes[0].legend(fontsize=8, ncol=4)
    aim_bars(axes[1], df["speedup_vs_compiled"], labels, 1.0, "torch.compile of the pair",
             "speed-up over torch.compile (best fused)", baseline=1.0)
    # the ratios lie near 1: start the axis below the lowest and print each bar's value
    axes[1].set_ylim(bottom=min(0.8, 0.95 * float(df["speedup_vs_compiled"].min())))
    axes[1].bar_label(axes[1].containers[0], fmt="%.3f", fontsize=8)
    finish_plot(fig, axes, path)


def add_timer_argument(p: argparse.ArgumentParser) -> None:
    """``--timer``: the timer of every column (:func:`_time_all`)."""
    p.add_argument("--timer", choices=["plain", "graph"], default="plain",
                   help="plain do_bench (host overhead included) or CUDA-graph replay (GPU time)")


def main() -> int:
    def arguments(p):
        add_timer_argument(p)
        p.add_argument("--bias", action="store_true", help="Linear with a bias (default: without)")
        p.add_argument("--repeats", type=positive_int, default=1,
                       help="repeats, each timing the columns in order, then reversed; the medians reported "
                            "(default 1)")

    args, table = workload_script_args(__doc__.splitlines()[0], arguments, default_workload="training")
    warnings.simplefilter("ignore", registry.ConfigFallbackWarning)
    device = torch.device("cuda")
    ceilings = device_ceilings(device)
    rows = []
    for r in table.to_dict("records"):
        rows.append({**bench_row(r["layer"], int(r["M"]), int(r["K"]), int(r["N"]), args.timer, args.bias,
                                 args.repeats), "bias": args.bias})
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    df = pd.DataFrame(rows)
    meta = run_meta(device, ceilings, timer=args.timer, repeats=args.repeats,
                    inputs="bf16 inputs, parameters (affine ~ 1 +- 0.1) and output gradient; x requires grad; "
                           "Linear with a bias where the bias column says so",
                    baselines="gemms/helion_gemms: the layer's forward, dgrad and wgrad GEMMs alone; eager / "
                              "compiled (torch.compile default mode) PyTorch pair; liger: Liger's norm + nn.Linear")
    meta["timing"] = ("every column of a row by the row's timer (graph: CUDA-graph replay, do_bench_cudagraph; "
                      "plain: an eager loop, do_bench, host time included; a graph run falls back to plain for a "
                      "row that cannot be captured), median" + (f"; {args.repeats} repeats in balanced order, "
                      "the medians and speedup_vs_compiled's spread (max - min)" if args.repeats > 1 else ""))
    meta["command"] = shlex.join(["python", "bench/training_step.py", *sys.argv[1:]])
    out = args.out or Path(__file__).resolve().parent / "results" / meta["gpu_key"]
    paths = write_results(df, meta, out, f"training_step_{args.workload}", plot, notes=(
        "`norm_share_removed_pct` = (compiled - best fused) / (compiled - gemms): 100 = the norm is free",))
    print("wrote " + ", ".join(map(str, paths)))
    return 1 if (df[[c for c in df.columns if c.endswith("_check")]] != "ok").any().any() else 0


if __name__ == "__main__":
    sys.exit(main())
