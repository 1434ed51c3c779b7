"""Measure this GPU's copy and bf16 GEMM ceilings and recompute every floor of its tables.

A floor computed at a low copy figure flatters the kernel it judges: one ``copy_`` of 1 GiB
timed by ``do_bench_cudagraph`` reads well below what a compiled norm moves on the same card.
:func:`helion_kernels.timing.measure_ceilings` times ``copy_`` and a compiled ``x * 2`` at
several sizes and cuBLAS bf16 GEMMs, each by CUDA-graph replay, bytes read and written both
counted, and keeps the best. The result replaces ``bench/results/<gpu>/ceilings.{csv,md}``
(the one ceiling every floor of that GPU reads), and every table's ``byte_floor_ms``,
``flop_floor_ms`` and ``fused_over_floor`` is recomputed at it.

    python bench/ceilings.py [--out DIR] [--calls 20] [--replays 15]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results/<gpu>/")
    parser.add_argument("--calls", type=int, default=20, help="calls per CUDA graph (default %(default)s)")
    parser.add_argument("--replays", type=int, default=15, help="graph replays, median kept (default %(default)s)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    from helion_kernels import registry, results
    from helion_kernels.benchmark import run_meta
    from helion_kernels.timing import measure_ceilings

    device = torch.device("cuda")
    ceilings, rows = measure_ceilings(device, args.calls, args.replays)
    meta = run_meta(device, ceilings, timer="graph", repeats=1)
    meta["command"] = shlex.join(["python", "bench/ceilings.py", *(argv if argv is not None else sys.argv[1:])])
    out = args.out or ROOT / "bench" / "results" / registry.gpu_key(device)
    paths = results.write_ceilings(out, rows, meta)
    changed = results.refloor_tables(out, ceilings)
    print(paths[1].read_text())
    print(f"copy {ceilings.bandwidth_gbps:.0f} GB/s, bf16 GEMM {ceilings.bf16_tflops:.0f} TFLOP/s; floors recomputed "
          f"in {len(changed)} tables of {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
