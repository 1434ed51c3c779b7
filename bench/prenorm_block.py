"""The pre-norm block ``h = x + residual; y = linear(norm(h))``: the package's op against torch.compile.

For each row (M, K, N) of a GEMM workload (default ``prenorm_rmsnorm``), bf16 ``x``,
``residual`` [M, K], Linear weight W [N, K] (no Linear bias), norm weight ~ 1 +- 0.1 (and a
LayerNorm bias ~ 0.1), eps 1e-5, and for ``--norm rmsnorm`` or ``layernorm``, every column
returning ``(y, h)``:

* ``op``: :func:`helion_kernels.add_rmsnorm_matmul` / ``add_layernorm_matmul`` as dispatched
  (``fused=None``: the registry's decision, the ``dispatch`` column); ``op_fused``: ``fused=True``;
  ``op_unfused``: ``fused=False`` (the op's own cuBLAS + compiled passes, forward and backward);
* ``compiled_block``: ``torch.compile`` (default mode) of the PyTorch block, THE baseline;
  ``compiled_pair``: the add eager, then ``torch.compile`` of norm + ``F.linear``;
* ``liger_fused_add_rmsnorm+cublas``: Liger's fused add + RMSNorm, then ``F.linear``
  (RMSNorm only, where liger-kernel is installed);
* ``cublas_mm``: the GEMMs alone, the floor where the add and the norm cost nothing: ``x @ W.t()``
  forward; in training also its dgrad and wgrad.

``--mode forward``: no grad; ``--mode training``: x, residual and the parameters require
grad, one step is the forward and the backward of both outputs against random gradients
(seed 1); default: both, one row each (``mode``). Derived: ``speedup_vs_compiled_block`` =
compiled_block / op, ``fused_speedup_vs_compiled_block`` = compiled_block / op_fused (and
``unfused_...`` with op_unfused),
``norm_share_removed_pct`` = (compiled_block - op) / (compiled_block - cublas_mm) * 100 (100:
the add and the norm are free). ``check``: op's, op_fused's and op_unfused's outputs (and in training every
gradient, at 5e-2) against the float64 PyTorch block, in row chunks (``rel_error``: the largest).

Timer: CUDA-graph replay by default (``--timer plain``: do_bench, host time included), the
same for every column of a row; ``--repeats N``: the columns in order, then reversed, N times.

    python bench/prenorm_block.py [--norm rmsnorm|layernorm] [--mode forward|training]
        [--workload prenorm_rmsnorm] [--where 'M == 65536'] [--timer plain] [--repeats 3] [--out DIR]
    python bench/prenorm_block.py --profile ...   # torch.profiler of op, op_fused, op_unfused, compiled_block

Writes ``bench/results/<gpu>/prenorm_block_<norm>_<workload>.{csv,md,png}`` (a re-run replaces
the rows of its mode, M, K, N and timer).
"""

from __future__ import annotations

import math
import shlex
import statistics
import sys
import warnings
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from helion_kernels import add_layernorm_matmul, add_rmsnorm_matmul, registry, runtime
from helion_kernels.bench_specs import liger_module
from helion_kernels.benchmark import aim_bars, device_ceilings, finish_plot, run_meta, workload_script_args, write_results
from helion_kernels.cli import positive_int
from helion_kernels.verify import check_outputs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from training_step import _time_all, add_timer_argument  # noqa: E402  (one timer for every column of a row)

EPS, DTYPE, CHECK_ROWS, GRAD_TOLERANCE = 1e-5, torch.bfloat16, 16384, 5e-2
MODES = ("forward", "training")


def _norm(norm: str, h, weight, bias):
    k = h.shape[-1]
    return F.rms_norm(h, (k,), weight, EPS) if norm == "rmsnorm" else F.layer_norm(h, (k,), weight, bias, EPS)


def _block(norm: str, x, r, w, weight, bias):
    """The PyTorch block: (y, h)."""
    h = x + r
    return F.linear(_norm(norm, h, weight, bias), w), h


def _op(norm: str, fused: bool | None):
    if norm == "rmsnorm":
        return lambda x, r, w, weight, bias: add_rmsnorm_matmul(x, r, w.t(), weight, EPS, fused=fused)
    return lambda x, r, w, weight, bias: add_layernorm_matmul(x, r, w.t(), weight, bias, EPS, fused=fused)


def _step(fn, leaves: list, grads):
    """``fn()`` (no grad); with ``grads``, also its backward against them, the leaves'
    gradients reset first. Returns ``fn()``'s outputs."""
    def run():
        for t in leaves:
            t.grad = None
        with torch.set_grad_enabled(grads is not None):
            out = fn()
        if grads is not None:
            torch.autograd.backward(out, grads)
        return out
    return run


def _rel_error(norm: str, fn, args: list, grads) -> float:
    """Largest relative error of ``fn(*args)`` = (y, h), and with ``grads`` of every gradient,
    against the float64 block, CHECK_ROWS rows at a time; raises VerificationError."""
    leaves, train = [t for t in args if t is not None], grads is not None
    out = [o.detach() for o in _step(lambda: fn(*args), leaves, grads)()]  # the leaves' grads now fn's
    params = [None if t is None else t.detach().double().requires_grad_(train) for t in args[2:]]
    worst = 0.0
    for i in range(0, args[0].shape[0], CHECK_ROWS):
        x, r = (t.detach()[i:i + CHECK_ROWS].double().requires_grad_(train) for t in args[:2])
        with torch.set_grad_enabled(train):
            ref = _block(norm, x, r, *params)
        worst = max(worst, check_outputs([o[i:i + CHECK_ROWS] for o in out], [t.detach() for t in ref], DTYPE))
        if train:
            torch.autograd.backward(ref, [g[i:i + CHECK_ROWS].double() for g in grads])  # params' grads add up
            got = [t.grad[i:i + CHECK_ROWS] for t in args[:2]]
            worst = max(worst, check_outputs(got, [x.grad, r.grad], DTYPE, GRAD_TOLERANCE))
    if train:
        worst = max(worst, check_outputs([t.grad for t in leaves[2:]], [p.grad for p in params if p is not None],
                                         DTYPE, GRAD_TOLERANCE))
    return worst


def row_steps(norm: str, m: int, k: int, n: int, mode: str, device: str = "cuda"):
    """(steps, args, grads): every column's step on one row's fresh inputs."""
    torch._dynamo.reset()  # one fresh torch.compile per row
    dev, train = torch.device(device), mode == "training"
    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape, scale=1.0, shift=0.0):
        return (shift + scale * torch.randn(*shape, generator=gen, device=dev)).to(DTYPE).requires_grad_(train)

    x, r, w = rand(m, k), rand(m, k), rand(n, k, scale=k ** -0.5)
    weight, bias = rand(k, scale=0.1, shift=1.0), (rand(k, scale=0.1) if norm == "layernorm" else None)
    args = [x, r, w, weight, bias]
    leaves = [t for t in args if t is not None]
    gen.manual_seed(1)
    grads = [torch.randn(m, n, generator=gen, device=dev).to(DTYPE),
             torch.randn(m, k, generator=gen, device=dev).to(DTYPE)] if train else None

    block = torch.compile(lambda *a: _block(norm, *a))
    pair = torch.compile(lambda h, w, weight, bias: F.linear(_norm(norm, h, weight, bias), w))

    def pair_step():  # the add eager, then the compiled norm + Linear
        h = x + r
        return pair(h, w, weight, bias), h

    columns = {"op": lambda: _op(norm, None)(*args), "op_fused": lambda: _op(norm, True)(*args),
               "op_unfused": lambda: _op(norm, False)(*args), "compiled_block": lambda: block(*args),
               "compiled_pair": pair_step}
    steps = {name: _step(fn, leaves, grads) for name, fn in columns.items()}
    liger = liger_module("LigerFusedAddRMSNorm", "fused_add_rms_norm", k, EPS, x, weight=weight) \
        if norm == "rmsnorm" else None
    if liger is not None:
        liger.weight.requires_grad_(train)

        def liger_step():
            normed, h = liger(x, r)
            return F.linear(normed, w), h

        steps["liger_fused_add_rmsnorm+cublas"] = _step(liger_step, [x, r, w, liger.weight], grads)
    xs, ws = x.detach(), w.detach()
    dy = grads[0] if train else None  # training: the forward, dgrad and wgrad GEMMs
    steps["cublas_mm"] = (lambda: (xs @ ws.t(), dy @ ws, dy.t() @ xs)) if train else (lambda: xs @ ws.t())
    return steps, args, grads


def bench_row(norm: str, m: int, k: int, n: int, mode: str, timer: str = "graph", repeats: int = 1,
              device: str = "cuda") -> dict:
    steps, args, grads = row_steps(norm, m, k, n, mode, device)
    xs, ws = args[0].detach(), args[2].detach()
    from helion_kernels.techniques.prenorm import kernels as prenorm

    spec = prenorm.SPEC_GIVEN_RSTD if norm == "rmsnorm" else prenorm.SPEC_LAYERNORM_GIVEN
    fused = runtime.decide(spec, (xs, ws.t()), None).fused  # the op's forward path (fused=None)
    row = {"mode": mode, "M": m, "K": k, "N": n,
           "dtype": registry.dtype_name(DTYPE), "dispatch": "fused" if fused else "unfused"}
    row["rel_error"], row["check"] = 0.0, "ok"
    for name, forced in (("op", None), ("op_fused", True), ("op_unfused", False)):
        try:
            row["rel_error"] = max(row["rel_error"], _rel_error(norm, _op(norm, forced), args, grads))
        except AssertionError as err:  # VerificationError
            row["rel_error"], row["check"] = float("inf"), f"FAILED: {name}: {err}"
            break
    for step in steps.values():  # compiles, and a column that fails does so before the timing
        step()
    repeated, row["timer"] = _time_all(steps, timer, repeats)
    times = {name: statistics.median(ts) for name, ts in repeated.items()}
    row.update({f"{name}_ms": t for name, t in times.items()})
    row["repeats"] = repeats
    row["speedup_vs_compiled_block"] = times["compiled_block"] / times["op"]
    row["fused_speedup_vs_compiled_block"] = times["compiled_block"] / times["op_fused"]
    row["unfused_speedup_vs_compiled_block"] = times["compiled_block"] / times["op_unfused"]
    if repeats > 1:  # the ratio per repeat (both columns timed in the same repeat): its spread
        ratios = [c / o for c, o in zip(repeated["compiled_block"], repeated["op"])]
        row["speedup_vs_compiled_block_spread"] = max(ratios) - min(ratios)
    cost = times["compiled_block"] - times["cublas_mm"]  # what the add and the norm cost the block
    row["norm_share_removed_pct"] = 100 * (times["compiled_block"] - times["op"]) / cost if cost > 0 else math.nan
    return row


def plot(df: pd.DataFrame, meta: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    col = "speedup_vs_compiled_block"
    speedup = df.reindex(columns=[col])[col].astype(float)
    labels = [f"{r.M}x{r.K}x{r.N} {r.mode}" for r in df.itertuples()]
    fig, ax = plt.subplots(figsize=(max(8, len(df) * 0.6), 5))
    aim_bars(ax, speedup, labels, 1.05, "aim 1.05x", "speed-up over torch.compile of the block", baseline=1.0)
    ax.set_title(f"{meta['gpu']}: pre-norm block, {meta['norm']} (higher is better)")
    if speedup.notna().any():  # the ratios lie near 1: start the axis below the lowest
        ax.set_ylim(bottom=min(0.8, 0.95 * speedup.min()))
    ax.bar_label(ax.containers[0], fmt="%.3f", fontsize=7)
    finish_plot(fig, [ax], path)


def main() -> int:
    def arguments(p):
        p.add_argument("--norm", choices=("rmsnorm", "layernorm"), default="rmsnorm", help="default %(default)s")
        p.add_argument("--mode", choices=MODES, default=None, help="forward or training (default: both, a row each)")
        add_timer_argument(p)
        p.set_defaults(timer="graph")
        p.add_argument("--repeats", type=positive_int, default=1,
                       help="repeats, each timing the columns in order, then reversed; the medians (default 1)")
        p.add_argument("--profile", action="store_true",
                       help="instead of timing: torch.profiler of the op and the compiled block on each row "
                            "(host time per step, GPU kernels), printed, nothing written")

    args, table = workload_script_args(__doc__.splitlines()[0], arguments, default_workload="prenorm_rmsnorm")
    warnings.simplefilter("ignore", registry.ConfigFallbackWarning)
    device = torch.device("cuda")
    if args.profile:
        from profile_training_step import profile  # the training bench's profiler

        for r in table.itertuples():
            for mode in [args.mode] if args.mode else MODES:
                steps = row_steps(args.norm, int(r.M), int(r.K), int(r.N), mode)[0]
                for name in ("op", "op_fused", "op_unfused", "compiled_block"):
                    profile(f"{name} {args.norm} {mode} {r.M}x{r.K}x{r.N}", steps[name])
        return 0
    ceilings = device_ceilings(device)
    rows = []
    for r in table.itertuples():
        for mode in [args.mode] if args.mode else MODES:
            shape = {"M": int(r.M), "K": int(r.K), "N": int(r.N)}
            try:  # a failing row is reported in the table, and the other rows still run
                rows.append(bench_row(args.norm, *shape.values(), mode, args.timer, args.repeats))
            except Exception as err:
                rows.append({"mode": mode, **shape, "dtype": "bfloat16",
                             "timer": args.timer, "check": f"FAILED: {type(err).__name__}: {err}"[:300]})
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    df = pd.DataFrame(rows)
    meta = run_meta(device, ceilings, timer=args.timer, repeats=args.repeats, norm=args.norm,
                    inputs="bf16 x, residual, W [N, K] (no Linear bias), norm weight ~ 1 +- 0.1 (LayerNorm bias "
                           "~ 0.1), eps 1e-5; training: all require grad, random gradients of y and h",
                    baselines="compiled_block: torch.compile (default mode) of h = x + r; y = F.linear(norm(h), W); "
                              "compiled_pair: the add eager, norm + F.linear compiled; Liger's fused add + RMSNorm "
                              "then F.linear; cublas_mm: the GEMMs alone (training: forward, dgrad, wgrad)")
    meta["timing"] = ("every column of a row by the row's timer (graph: CUDA-graph replay, do_bench_cudagraph; "
                      "plain: do_bench, host time included; a row that cannot be captured is timed plain), median"
                      + (f"; {args.repeats} repeats in balanced order, the medians" if args.repeats > 1 else ""))
    meta["command"] = shlex.join(["python", "bench/prenorm_block.py", *sys.argv[1:]])
    out = args.out or Path(__file__).resolve().parent / "results" / meta["gpu_key"]
    paths = write_results(df, meta, out, f"prenorm_block_{args.norm}_{args.workload}", plot, notes=(
        "`speedup_vs_compiled_block` = compiled_block_ms / op_ms; `fused_speedup_vs_compiled_block` with op_fused_ms, "
        "`unfused_speedup_vs_compiled_block` with op_unfused_ms",
        "`norm_share_removed_pct` = (compiled_block - op) / (compiled_block - cublas_mm): 100 = add and norm free"))
    print("wrote " + ", ".join(map(str, paths)))
    return 1 if (df["check"] != "ok").any() else 0


if __name__ == "__main__":
    sys.exit(main())
