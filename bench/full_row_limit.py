"""How large can N get for the full-row post-norm kernels on this GPU?

``max_full_row_n`` derives the limit from shared memory for the smallest program
(tile_m 16, tile_k 16, one stage). This script runs ``matmul_layernorm`` with that program
and with two larger ones at N = 512 .. 4096 (past the derived limit too, by calling the
Helion kernel directly), checks each against the fp32 reference, times it, and times cuBLAS +
the inductor LayerNorm beside it. Usage (CUDA machine):
``python bench/full_row_limit.py OUT.csv``.
"""

from __future__ import annotations

import sys

import helion
import pandas as pd
import torch

from helion_kernels.bench_specs import bench_spec
from helion_kernels.limits import max_full_row_n
from helion_kernels.techniques.postnorm.kernels import DEFAULT_CONFIG, SPEC_LAYERNORM
from helion_kernels.spec import Shape
from helion_kernels.timing import time_ms
from helion_kernels.verify import check_outputs

CONFIGS = {
    "16x16_w4_s1 (smallest)": DEFAULT_CONFIG,
    "64x32_w4_s2": helion.Config(block_sizes=[16, 64, 32], num_warps=4, num_stages=2),
    "64x64_w8_s2": helion.Config(block_sizes=[16, 64, 64], num_warps=8, num_stages=2),
}


def main(out_csv: str, m: int = 65536, k: int = 1024) -> pd.DataFrame:
    rows = []
    limit = max_full_row_n(torch.bfloat16, torch.device("cuda"))
    for n in (512, 1024, 2048, 4096):
        shape = Shape(m, k, n)
        args = SPEC_LAYERNORM.make_args(shape, torch.bfloat16, "cuda", 0)
        unfused = time_ms(bench_spec(SPEC_LAYERNORM.name).baselines(*args)["cublas+inductor_norm"])
        for name, cfg in CONFIGS.items():
            row = {"M": m, "K": k, "N": n, "derived_limit": limit, "config": name,
                   "cublas+inductor_norm_ms": round(unfused, 5)}
            try:
                bound = SPEC_LAYERNORM.kernel.bind(args)  # the kernel, past the ops' N limit too
                bound.set_config(cfg)
                row["rel_error"] = check_outputs(bound(*args), SPEC_LAYERNORM.reference(*args), torch.bfloat16)
                row["fused_ms"] = round(time_ms(lambda: bound(*args)), 5)
                row["status"] = "ok"
            except Exception as err:  # out of resources, compile failure, wrong result
                row["status"] = f"{type(err).__name__}: {err}"[:120]
            rows.append(row)
            print(row, flush=True)
            pd.DataFrame(rows).to_csv(out_csv, index=False)
    return pd.DataFrame(rows)


if __name__ == "__main__":
    main(sys.argv[1])
