"""What a config tuned at one GEMM shape loses at a neighbouring shape (M, K or N changed).

Why: an untuned shape runs the nearest registry entry's config (``registry.nearest_entry``),
so the distance that picks it should weigh each of M, K and N by what a config tuned there
loses when that dimension changes. For every workload row this script times, at the row's
shape, the config of every registry entry of the kernel within ``--max-distance`` factors of 2
(the plain sum of |log2| ratios of M, K and N: this measures what the nearest-shape rule's
weights should be, so it does not use them) and the row's own entry, each as a call would
fit it (``runtime.resolve_entry``) on the static build, all as the static kernel a call would
compile (fresh random bf16 inputs, CUDA-graph medians). ``vs_own`` is a neighbour's time
over the row's own config's time (no own entry: over the best candidate's); ``d_M``, ``d_K``
and ``d_N`` say which dimension differs and by how many factors of 2.

    python bench/variants/config_transfer.py --kernel matmul --workload prenorm_rmsnorm [--where 'M == 65536']

Writes ``bench/results/<gpu>/variants/config_transfer_<kernel>_<workload>[_<where>].{csv,md}`` and prints
the median and worst ``vs_own`` per changed dimension.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd
import torch

from helion_kernels import registry, runtime, workloads
from helion_kernels.benchmark import RESULTS_DIR, write_table
from helion_kernels.techniques import get_spec
from helion_kernels.timing import time_ms


def _log2_ratio(a: int, b: int) -> float:
    return round(math.log2(a / b), 3)


# Neighbours in plain factors of 2: this measures what the nearest-shape rule's weights should be.
UNWEIGHTED = (1.0, 1.0, 1.0)


def transfer_table(rows: list[dict]) -> pd.DataFrame:
    """The timed (row, entry) pairs with ``vs_own`` (time over the row's own entry's time, or
    over the best candidate's where the row has no entry), ``own_entry`` and ``changed`` (which
    of M, K, N differ between the entry and the row, "own" for the row's own entry)."""
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    keys = list(zip(df.M, df.K, df.N))
    own = df[(df.d_M == 0) & (df.d_K == 0) & (df.d_N == 0)].set_index(["M", "K", "N"]).ms
    best = df.groupby(["M", "K", "N"]).ms.min()
    ref = pd.Series([own.get(k, best[k]) for k in keys], index=df.index)
    df["vs_own"] = (df.ms / ref).round(4)
    df["own_entry"] = [k in own.index for k in keys]
    changed = df[["d_M", "d_K", "d_N"]].ne(0)
    df["changed"] = ["+".join(d[2:] for d in changed.columns if r[d]) or "own" for _, r in changed.iterrows()]
    return df


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="example: python bench/variants/config_transfer.py --kernel matmul "
                                       "--workload prenorm_rmsnorm --where 'M == 65536'")
    p.add_argument("--kernel", default="matmul", help="a GEMM-shaped kernel with registry entries (default %(default)s)")
    p.add_argument("--workload", default="prenorm_rmsnorm",
                   help="GEMM workload table, the target shapes (default %(default)s)")
    p.add_argument("--where", default=None, help="pandas query selecting rows")
    p.add_argument("--max-distance", type=float, default=1.0,
                   help="largest sum of |log2| ratios of M, K and N between an entry and a row, unweighted "
                        "(default %(default)s: one factor of 2 in one dimension)")
    p.add_argument("--out", type=Path, default=None, help="folder (default: bench/results/<gpu>/variants/)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("config_transfer: needs a CUDA GPU", file=sys.stderr)
        return 2
    import helion  # seconds to import: after the arguments are checked
    device = torch.device("cuda")
    gpu = registry.gpu_key(device)
    spec = get_spec(args.kernel)
    entries = {k: e for k, e in registry.entries_for(spec.name, gpu).items() if e.dtype == "bfloat16"}
    if not entries:
        print(f"config_transfer: no bfloat16 entries of {spec.name} on {gpu}", file=sys.stderr)
        return 2
    table = workloads.load_workload(args.workload, args.where, kind="gemm")
    rows = []
    for problem in workloads.problems(table, "gemm"):
        shape = problem.key
        near = [e for e in entries.values() if registry.shape_distance(e.shape, shape, UNWEIGHTED) <= args.max_distance]
        if len(near) < 2 and shape not in {e.shape for e in near}:
            continue
        call = spec.make_args(problem, torch.bfloat16, device, 0)
        for entry in sorted(near, key=lambda e: registry.shape_distance(e.shape, shape, UNWEIGHTED)):
            kernel = helion.kernel(spec.kernel.fn, static_shapes=True)
            bound = kernel.bind(call)
            try:
                source = "exact" if entry.shape == shape else "nearest"
                bound.set_config(runtime.resolve_entry(spec, registry.Lookup(source, entry, gpu), call))
                ms = time_ms(lambda: bound(*call))
                note = ""
            except Exception as err:  # a config illegal at this shape is a result too
                ms, note = float("nan"), f"{type(err).__name__}: {err}"[:80]
            rows.append({"M": shape.M, "K": shape.K, "N": shape.N, "config_from": str(entry.shape),
                         "d_M": _log2_ratio(entry.shape.M, shape.M), "d_K": _log2_ratio(entry.shape.K, shape.K),
                         "d_N": _log2_ratio(entry.shape.N, shape.N), "ms": ms, "note": note})
            print(rows[-1], flush=True)
    df = transfer_table(rows)
    if df.empty:
        print("config_transfer: no row has a tuned neighbour", file=sys.stderr)
        return 2
    # The rows selected name the file (the first run, of 'M == 65536', kept the name without them).
    suffix = workloads.where_suffix(args.where)
    out = (args.out or RESULTS_DIR / gpu / "variants") / f"config_transfer_{spec.name}_{args.workload}{suffix}"
    where = f" --where '{args.where}'" if args.where else ""
    write_table(df, out, f"A config tuned at one shape, timed at its neighbours: {spec.name} on {torch.cuda.get_device_name()}",
                [f"command: `python bench/variants/config_transfer.py --kernel {spec.name} --workload {args.workload}{where} "
                 f"--max-distance {args.max_distance}`",
                 "bf16, static kernels as a call compiles them, CUDA-graph medians",
                 "vs_own: time over the row's own entry's config (no own entry: over the best candidate's)"])
    summary = df[df.changed != "own"].groupby("changed").vs_own.agg(["count", "median", "max"])
    print(summary.to_string())
    print(f"wrote {out}.csv and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
