"""Deferred post-norm (split-N candidate 3): time ``rms_norm(a @ b, w) @ c`` end to end.

For each row (M, K, N) of a GEMM workload (default: the split-N table), with the consumer
projecting back to N2 = K (Linear K -> N, RMSNorm over N, Linear N -> K):

- ``deferred``: :func:`helion_kernels.matmul_rmsnorm_matmul` with ``fused=True`` (partials
  GEMM, then the GEMM whose epilogue applies rstd; the RMSNorm weight folded into ``c`` once,
  outside the timing, as a user with a fixed weight does);
- ``dispatched``: the same op as called (``fused=None``): the two kernels or cuBLAS, the
  compiled norm and cuBLAS, as the registry decided (column ``dispatch``);
- ``cublas+inductor_norm+cublas`` and ``cublas+liger_norm+cublas``: what a user runs
  without it; ``cublas+cublas``: the two GEMMs alone (the norm made free).

``saved_vs_inductor_pct`` = (t_unfused_inductor - t_deferred) / t_inductor_norm, the blog's
metric: 100% means the norm costs nothing. Every row is checked against an fp32 reference.

    python bench/postnorm_deferred.py [--workload postnorm_split_n] [--where 'K == 512']

Run it from the checkout installed with ``pip install -e .`` (it imports ``helion_kernels``).

Writes ``bench/results/<gpu>/matmul_rmsnorm_matmul_<workload>[_<where>].{csv,md,json,png}`` (a
``--where`` run is named after its clause, so it never replaces the whole table).
"""

from __future__ import annotations

import functools
import shlex
import sys
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from helion_kernels import fold_rmsnorm_weight, matmul_rmsnorm_matmul, registry, runtime
from helion_kernels.benchmark import aim_bars, device_ceilings, finish_plot, run_meta, workload_script_args, write_results
from helion_kernels.techniques.deferred.kernels import SPEC, matmul_rmsnorm_matmul_reference
from helion_kernels.bench_specs import liger_module as _liger
from helion_kernels.timing import input_copies, time_ms
from helion_kernels.verify import check_outputs

EPS = 1e-5


def operands(m: int, k: int, n: int, dtype: torch.dtype, device, seed: int) -> tuple:
    """a [M, K], b [K, N], c [N, K], RMSNorm weight [N] ~ 1."""
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(m, k, generator=gen, device=device).to(dtype)
    b = (torch.randn(k, n, generator=gen, device=device) / k**0.5).to(dtype)
    c = (torch.randn(n, k, generator=gen, device=device) / n**0.5).to(dtype)
    w = (1.0 + 0.1 * torch.randn(n, generator=gen, device=device)).to(dtype)
    return a, b, c, w


def bench_row(m: int, k: int, n: int, dtype: torch.dtype, device) -> dict:
    first = operands(m, k, n, dtype, device, 0)
    per_set = sum(t.numel() * t.element_size() for t in first) + 2 * m * n * first[0].element_size()
    sets = [first] + [operands(m, k, n, dtype, device, s) for s in range(1, input_copies(per_set, device))]
    folded = [(a, b, fold_rmsnorm_weight(w, c)) for a, b, c, w in sets]
    inductor_norm = torch.compile(lambda x, w: F.rms_norm(x, (n,), w, EPS), dynamic=False)
    liger = _liger("LigerRMSNorm", "rms_norm", n, EPS, first[0], weight=first[3])
    out = {"M": m, "K": k, "N": n, "N2": k, "dtype": registry.dtype_name(dtype)}
    a, b, c, w = first
    ref = matmul_rmsnorm_matmul_reference(a, b, c, w, EPS)
    out["rel_error"] = check_outputs(matmul_rmsnorm_matmul(a, b, c, w, EPS, fused=True), ref, dtype)
    del ref
    out["dispatch"] = "fused" if runtime.decide(SPEC, (a, b)).fused else "unfused"
    candidates = {
        "deferred": [functools.partial(matmul_rmsnorm_matmul, a_, b_, cf, None, EPS, fused=True)
                     for a_, b_, cf in folded],
        "dispatched": [functools.partial(matmul_rmsnorm_matmul, a_, b_, cf, None, EPS) for a_, b_, cf in folded],
        "cublas+cublas": [functools.partial(lambda a_, b_, c_: torch.mm(torch.mm(a_, b_), c_), a_, b_, c_)
                          for a_, b_, c_, _ in sets],
        "inductor_norm": [functools.partial(inductor_norm, torch.mm(a_, b_), w_) for a_, b_, _, w_ in sets],
        "cublas+inductor_norm+cublas": [
            functools.partial(lambda a_, b_, c_, w_: torch.mm(inductor_norm(torch.mm(a_, b_), w_), c_), *s)
            for s in sets],
    }
    if liger is not None:
        candidates["cublas+liger_norm+cublas"] = [
            functools.partial(lambda a_, b_, c_: torch.mm(liger(torch.mm(a_, b_)), c_), a_, b_, c_)
            for a_, b_, c_, _ in sets]
    times = {name: time_ms(fns) for name, fns in candidates.items()}
    out.update({f"{name}_ms": t for name, t in times.items()})
    best = min(t for name, t in times.items() if name.endswith("+cublas") and "norm" in name)
    out["saved_vs_inductor_pct"] = 100 * (times["cublas+inductor_norm+cublas"] - times["deferred"]) / times["inductor_norm"]
    out["speedup_vs_best_unfused"] = best / times["deferred"]
    out["dispatched_speedup_vs_best_unfused"] = best / times["dispatched"]
    out["deferred_over_two_gemms"] = times["deferred"] / times["cublas+cublas"]
    return out


def plot(df: pd.DataFrame, meta: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.K}x{r.N}" for r in df.itertuples()]
    cols = [c for c in df.columns if c.endswith("_ms") and c != "inductor_norm_ms"]
    rel = df[cols].div(df["cublas+cublas_ms"], axis=0)
    rel.columns = [c.removesuffix("_ms") for c in cols]
    rel.index = labels
    fig, axes = plt.subplots(2, 1, figsize=(max(8, len(df) * 0.9), 8))
    rel.plot.bar(ax=axes[0], width=0.85)
    axes[0].axhline(1.0, color="k", lw=0.8, ls="--")
    axes[0].set_ylabel("latency / two cuBLAS GEMMs")
    axes[0].set_title(f"{meta['gpu']}: rms_norm(a @ b) @ c, M = {df.M.iloc[0]}, K x N (lower is better)")
    axes[0].legend(fontsize=8)
    aim_bars(axes[1], df["saved_vs_inductor_pct"], labels, 50, "aim: 50%",
             "% of the inductor norm's time saved", baseline=0)
    finish_plot(fig, axes, path)


def main() -> int:
    args, table = workload_script_args(__doc__.splitlines()[0])
    device = torch.device("cuda")
    ceilings = device_ceilings(device)
    rows = []
    for r in table.itertuples():
        rows.append(bench_row(int(r.M), int(r.K), int(r.N), torch.bfloat16, device))
        print(rows[-1], flush=True)
    meta = run_meta(device, ceilings, timer="graph", repeats=1, order="one order",
                    inputs="bf16, RMSNorm weight ~ 1 folded into c, eps 1e-5, N2 = K",
                    baselines="cuBLAS GEMM, inductor (torch.compile) or Liger RMSNorm, cuBLAS GEMM")
    meta["command"] = shlex.join(["python", "bench/postnorm_deferred.py", *sys.argv[1:]])  # quoted: re-runnable
    out_dir = args.out or Path(__file__).resolve().parent / "results" / meta["gpu_key"]
    paths = write_results(pd.DataFrame(rows), meta, out_dir, f"matmul_rmsnorm_matmul_{args.workload}", plot,
                          notes=("`saved_vs_inductor_pct`: (t_cublas+inductor_norm+cublas - t_deferred) / "
                                 "t_inductor_norm; 100% = the norm is free",))
    print("wrote " + ", ".join(str(x) for x in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
