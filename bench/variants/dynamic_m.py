"""New token counts M: what a call at an M the kernel was not compiled for costs, static vs dynamic M.

Why: every GEMM-shaped kernel is compiled with ``static_shapes=True``, so a training batch with
a new token count M compiles a kernel inside the step. This variant compiles the same kernel
functions (``--kernels``: any GEMM-shaped kernel with a registry entry at M = 65536 and the
given K, N) with ``static_shapes=False`` and measures, at each M of a list (that entry's config
throughout):

* ``first_call_s``: wall time of the first call at that M (bind, compile if needed, run, sync),
  static and dynamic, the M's visited in order (the dynamic kernel compiles at the first only);
* ``ms``: CUDA-graph median of the compiled call, static and dynamic, and cuBLAS's ``torch.mm``;
* with ``--seeds``, every hand-picked seed of the kernel timed on the dynamic kernel at each M
  (compiled once for all M), so ``tuned_vs_best_seed`` bounds what the M = 65536 config loses
  at another M.

    python bench/variants/dynamic_m.py [--kn 1024,1024] [--kernels matmul rmsnorm_matmul]
        [--seeds matmul] [--ms 8192 30000 65536 65537 131072 262144]

Writes ``bench/results/<gpu>/variants/dynamic_m_K<K>_N<N>.{csv,md}``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import helion
import pandas as pd
import torch

from helion_kernels import registry
from helion_kernels.benchmark import write_table
from helion_kernels.techniques import get_spec
from helion_kernels.spec import Shape
from helion_kernels.timing import time_ms

TUNED_M = 65536


def _first_call(kernel, args, config) -> tuple[float, object]:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    compiled = kernel.bind(args).compile_config(config)
    compiled(*args)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, compiled


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kn", default="1024,1024", help="K,N of the GEMM (a tuned M = 65536 entry must exist)")
    p.add_argument("--ms", nargs="+", type=int, default=[8192, 30000, 65536, 65537, 131072, 262144],
                   help="the M's, in the order their first calls are timed (default %(default)s)")
    p.add_argument("--kernels", nargs="+", default=["matmul", "rmsnorm_matmul"],
                   help="GEMM-shaped kernels to measure (default %(default)s)")
    p.add_argument("--seeds", nargs="*", default=["matmul"],
                   help="kernels whose seeds are also timed at every M (default %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="folder (default: bench/results/<gpu>/variants/)")
    args = p.parse_args()
    k, n = (int(x) for x in args.kn.split(","))
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    gpu = registry.gpu_key(device)
    rows = []
    for spec in map(get_spec, args.kernels):
        entry = registry.entries_for(spec.name, gpu).get((TUNED_M, k, n, "bfloat16"))
        if entry is None:
            print(f"{spec.name}: no entry at {TUNED_M}x{k}x{n} on {gpu}; skipped", flush=True)
            continue
        tuned = helion.Config(**entry.config)
        static = spec.kernel  # static_shapes=True, as shipped
        dynamic = helion.kernel(spec.kernel.fn, static_shapes=False)
        seeds = spec.seed_configs if spec.name in args.seeds else ()
        for m in args.ms:
            call = spec.make_args(Shape(m, k, n), torch.bfloat16, device, m)
            a, b = call[0], call[1]
            row = {"kernel": spec.name, "M": m, "K": k, "N": n, "cublas_mm_ms": time_ms(lambda: torch.mm(a, b))}
            for name, kernel in (("static", static), ("dynamic", dynamic)):
                row[f"{name}_first_call_s"], compiled = _first_call(kernel, call, tuned)
                row[f"{name}_ms"] = time_ms(lambda: compiled(*call))
            seed_ms = []
            for cfg in seeds:
                try:
                    compiled = dynamic.bind(call).compile_config(cfg)
                    seed_ms.append(time_ms(lambda: compiled(*call)))
                except Exception as err:  # a seed that does not compile at this shape
                    print(f"  seed {cfg} failed: {type(err).__name__}", flush=True)
            if seed_ms:
                row["best_seed_dynamic_ms"] = min(seed_ms)
                row["tuned_vs_best_seed"] = row["dynamic_ms"] / min(seed_ms)
            row["dynamic_vs_static"] = row["dynamic_ms"] / row["static_ms"]
            row["static_vs_cublas"] = row["static_ms"] / row["cublas_mm_ms"]
            rows.append(row)
            print({key: round(v, 4) if isinstance(v, float) else v for key, v in row.items()}, flush=True)
            del a, b, call
    df = pd.DataFrame(rows)
    folder = args.out or Path(__file__).resolve().parent.parent / "results" / gpu / "variants"
    stem = folder / f"dynamic_m_K{k}_N{n}"
    write_table(df, stem, f"New M: static vs dynamic-M kernels on {torch.cuda.get_device_name(device)}", [
        f"command: `python bench/variants/{Path(__file__).name} --kn {args.kn} --kernels {' '.join(args.kernels)}"
        f" --seeds {' '.join(args.seeds)} --ms {' '.join(map(str, args.ms))}`",
        f"bf16; every kernel runs the registry config tuned at M = {TUNED_M} (seeds timed for: "
        f"{', '.join(args.seeds) or 'none'})",
        "first_call_s: wall seconds of the first call at that M, in the order of the table "
        "(the dynamic kernel compiles at its first M only); ms: CUDA-graph replay, median"])
    print(f"wrote {stem}.csv/.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
