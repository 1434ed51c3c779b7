"""The plain Helion GEMM with its epilogue stored in sub-tiles (Helion's ``epilogue_subtile``),
against the registry's config and cuBLAS, at the rows where it sits above 1.07x cuBLAS.

Why: at M = 262144 and K * N >= 2^20 the tuned ``matmul`` (a persistent tensor-descriptor
128x256x64 tiling, 8 warps, 3 stages) runs at 1.07-1.10x cuBLAS over every benchmark run since
tuning (``bench/results/<gpu>/gemm_ceiling.md``). Its epilogue stages the whole 128x256 output
tile (64 KiB in bf16) in shared memory, which leaves room for 3 stages of A and B tiles, not 4.
Storing the tile in halves or quarters (the split, convert and store per piece of Triton's
persistent TMA matmul tutorial) frees 32-48 KiB. Helion 1.5 generates that code for an explicit
``epilogue_subtile`` on any GPU, but its search offers the knob only on sm_100 and later, so on
Hopper the autotuner never tries it. This script times, per row: cuBLAS, the row's registry
config, and that config with ``epilogue_subtile`` 2 or 4 and 3 or 4 stages (the output stored
through a tensor descriptor, which subtiled stores need); every variant's output is checked
against an fp32 ``a @ b`` first.

    python bench/variants/gemm_epilogue_subtile.py [--workload postnorm_split_n]
        [--where 'M == 262144 and K * N >= 1048576'] [--repeats 5]

Writes ``bench/results/<gpu>/variants/gemm_epilogue_subtile_<workload>[_<where>].{csv,md}``.
Without a CUDA GPU it only checks that Helion generates code for every variant.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pandas as pd
import torch

from helion_kernels.bench_specs import bench_spec
from helion_kernels import registry, runtime, workloads
from helion_kernels import results
from helion_kernels.benchmark import RESULTS_DIR, codegen_status, time_columns, write_table
from helion_kernels.techniques import get_spec
from helion_kernels.timing import input_copies

# (label, changes to the row's own config); the store's indexing is set to tensor_descriptor
VARIANTS = (
    ("entry", {}),
    ("subtile2", {"epilogue_subtile": 2}),
    ("subtile2_s4", {"epilogue_subtile": 2, "num_stages": 4}),
    ("subtile4_s4", {"epilogue_subtile": 4, "num_stages": 4}),
)
# bf16 output of an fp32-accumulated GEMM against the fp32 product: a wrong store is O(1)
MAX_REL_ERROR = 1e-2


def variant_config(base: dict, changes: dict):
    """``base`` (a registry config as a dict) with ``changes``; a subtiled variant stores its
    output through a tensor descriptor (the last access of ``matmul``'s kernel)."""
    import helion

    config = {**base, **changes}
    indexing = config.get("indexing", "pointer")
    if "epilogue_subtile" in changes and indexing != "tensor_descriptor":
        accesses = indexing if isinstance(indexing, list) else [indexing] * 3  # a load of a, of b, the store
        config["indexing"] = [*accesses[:-1], "tensor_descriptor"]
    return helion.Config(**config)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="postnorm_split_n", help="GEMM workload table (default %(default)s)")
    p.add_argument("--where", default="M == 262144 and K * N >= 1048576",
                   help="pandas query selecting rows (default %(default)r)")
    p.add_argument("--repeats", type=int, default=5,
                   help="time every column in this many repeats, the columns in order and reversed (default %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="folder (default: bench/results/<gpu>/variants/)")
    args = p.parse_args()
    import helion  # seconds to import: after the arguments are checked

    spec = get_spec("matmul")
    table = workloads.load_workload(args.workload, args.where, kind="gemm")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    gpu = registry.gpu_key(device) if cuda else "nvidia_h200_sm90"
    problems = {(pr.M, pr.K, pr.N): pr for pr in workloads.problems(table, "gemm")}
    rows, bounds = [], {}  # bounds: (M, K, N, variant) -> the bound kernel, for the variants that ran correctly
    for problem in problems.values():
        found = registry.lookup(spec.name, problem, "bfloat16", gpu, warn=False)
        # without a GPU: uninitialised CPU tensors, code generation only
        call = spec.make_args(problem if cuda else problem.for_codegen(), torch.bfloat16, device, 0 if cuda else None)
        base = dict(runtime.resolve_entry(spec, found, call).config)
        for label, changes in VARIANTS:
            config = variant_config(base, changes)
            kernel = helion.kernel(spec.kernel.fn, static_shapes=True)  # one per variant: one config each
            row = {"M": problem.M, "K": problem.K, "N": problem.N, "variant": label, "config_from": found.source,
                   "num_stages": config.config.get("num_stages"), "epilogue_subtile": changes.get("epilogue_subtile"),
                   "note": ""}
            try:
                if not cuda:
                    status = codegen_status(kernel, call, config)
                    row["note"] = "code generated (no GPU: not run)" if status == "ok" else status
                else:
                    bound = kernel.bind(call)
                    bound.set_config(config)
                    ref = call[0].float() @ call[1].float()
                    err = float((bound(*call).float() - ref).abs().max() / ref.abs().max())
                    row["rel_error"] = err
                    if not err <= MAX_REL_ERROR:  # NaN fails too
                        raise AssertionError(f"rel. error {err:.2e} > {MAX_REL_ERROR}")
                    bounds[(problem.M, problem.K, problem.N, label)] = bound
            except Exception as exc:  # a variant that does not compile or fit is a result too
                row["note"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:120]
            rows.append(row)
            print(row, flush=True)
    if not cuda:
        print(pd.DataFrame(rows).to_string(index=False))
        print("gemm_epilogue_subtile: no CUDA GPU; checked code generation only", file=sys.stderr)
        return 0

    # Timing: per row, the columns in order then reversed within each repeat, on rotated input sets (>= 4x L2)
    df = pd.DataFrame(rows)
    results = []
    for (m, k, n), group in df.groupby(["M", "K", "N"], sort=False):
        problem = problems[(m, k, n)]
        sets = [spec.make_args(problem, torch.bfloat16, device, s) for s in range(input_copies(
            bench_spec(spec.name).min_bytes(problem, torch.bfloat16), device))]
        columns = {"cublas": [lambda a=a, b=b: torch.mm(a, b) for a, b in sets]}
        for r in group.itertuples():
            if (bound := bounds.get((m, k, n, r.variant))) is not None:
                columns[r.variant] = [lambda a=a, b=b, f=bound: f(a, b) for a, b in sets]
        times = time_columns(columns, args.repeats)
        cublas = statistics.median(times["cublas"])
        entry = statistics.median(times["entry"]) if times.get("entry") else float("nan")
        for r in group.itertuples():
            t = times.get(r.variant)
            ratios = [x / c for x, c in zip(t, times["cublas"])] if t else []
            results.append({
                "M": m, "K": k, "N": n, "variant": r.variant, "num_stages": r.num_stages,
                "epilogue_subtile": r.epilogue_subtile, "ms": statistics.median(t) if t else float("nan"),
                "cublas_ms": cublas, "vs_cublas": statistics.median(ratios) if ratios else float("nan"),
                "vs_cublas_spread": (max(ratios) - min(ratios)) if ratios else float("nan"),
                "vs_entry": (statistics.median(t) / entry) if t else float("nan"),
                "rel_error": getattr(r, "rel_error", float("nan")), "note": r.note})
        print(pd.DataFrame(results[-len(group):]).to_string(index=False), flush=True)

    out_df = pd.DataFrame(results)
    suffix = workloads.where_suffix(args.where)
    stem = (args.out or RESULTS_DIR / gpu / "variants") / f"gemm_epilogue_subtile_{args.workload}{suffix}"
    write_table(out_df, stem, f"The plain Helion GEMM with a sub-tiled epilogue: {torch.cuda.get_device_name()}",
                [f"command: `python bench/variants/gemm_epilogue_subtile.py --workload {args.workload} "
                 f"--where '{args.where}' --repeats {args.repeats}`",
                 "bf16, static kernels, CUDA-graph medians (do_bench_cudagraph) on input sets rotated to >= 4x L2; "
                 "every column timed twice per repeat, the columns in order and then reversed; medians over the repeats",
                 "entry: the row's registry config (config_from); subtileS[_s4]: that config with "
                 "epilogue_subtile S (and 4 stages), the output stored through a tensor descriptor",
                 "vs_cublas: median over the repeats of time / cuBLAS time (spread: max - min); vs_entry: median "
                 "time over the entry's median time; rel_error: max |c - a @ b| / max |a @ b| against fp32"])
    print(f"wrote {stem}.csv and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
