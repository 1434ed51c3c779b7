"""Does a tiling compute ``rmsnorm(a) @ b`` correctly on this GPU? One load vs two.

The deferred pre-norm kernel needs each ``a`` tile twice: as the MMA operand and, in fp32
registers, for the per-row sum of squares. This script runs, at one shape and on fresh
random inputs (3 draws per config), the same tilings with

* ``single_load``: one ``a`` load shared by the MMA and the sum of squares;
* ``double_load``: the kernel shipped until bench/NOTES.md's version 3, which loads the
  tile a second time for the sum;
* ``matmul``: the plain Helion GEMM, as a control,

and records for each how many of the draws failed the fp32 reference check and the
CUDA-graph time. Usage (CUDA machine): ``python bench/variants/shared_operand_check.py OUT.csv``.
"""

from __future__ import annotations

import sys

import helion
import helion.language as hl
import pandas as pd
import torch

from helion_kernels.techniques.gemm.kernels import matmul_kernel, matmul_reference
from helion_kernels.techniques.prenorm.kernels import rmsnorm_matmul_reference
from pre_norm_variants import in_loop_kernel  # the double-load kernel (shipped until version 3)
from helion_kernels.spec import Shape, random_gemm_operands
from helion_kernels.timing import time_ms
from helion_kernels.verify import VerificationError, check_outputs


@helion.kernel(static_shapes=True)
def single_load_kernel(a: torch.Tensor, b: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = a.size()
    _, n = b.size()
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m, tile_n in hl.tile([m, n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        sum_sq = hl.zeros([tile_m], dtype=torch.float32)
        for tile_k in hl.tile(k):
            a_tile = a[tile_m, tile_k]
            acc = torch.addmm(acc, a_tile, b[tile_k, tile_n])
            a32 = a_tile.to(torch.float32)
            sum_sq = sum_sq + torch.sum(a32 * a32, dim=1)
        row_rstd = torch.rsqrt(sum_sq / k + eps)
        c[tile_m, tile_n] = (acc * row_rstd[:, None]).to(c.dtype)
        if tile_n.begin == 0:
            rstd[tile_m] = row_rstd
    return c, rstd


def _cfg(bs, warps, stages, indexing="pointer", l2=2, pid="flat") -> helion.Config:
    return helion.Config(block_sizes=bs, num_warps=warps, num_stages=stages, indexing=indexing,
                         l2_groupings=[l2], pid_type=pid)


CONFIGS = [
    _cfg([128, 256, 64], 8, 3, "tensor_descriptor", 8),
    _cfg([128, 128, 64], 8, 3, "tensor_descriptor", 8, "persistent_interleaved"),
    _cfg([128, 128, 64], 4, 4, l2=8),
    _cfg([64, 128, 64], 4, 4, l2=4),
    _cfg([256, 128, 64], 8, 3),
    _cfg([128, 256, 64], 8, 4),
    _cfg([64, 128, 32], 4, 3),
    _cfg([64, 512, 64], 8, 3),
]


def main(out_csv: str, shape: Shape = Shape(65536, 512, 512), draws: int = 3) -> pd.DataFrame:
    kernels = [
        ("single_load", single_load_kernel, rmsnorm_matmul_reference, 3),
        ("double_load", in_loop_kernel, rmsnorm_matmul_reference, 3),
        ("matmul", matmul_kernel, matmul_reference, 2),
    ]
    rows = []
    for name, kernel, reference, nargs in kernels:
        for cfg in CONFIGS:
            failed, note, ms = 0, "", float("nan")
            try:
                for seed in range(draws):
                    args = (*random_gemm_operands(shape, torch.bfloat16, "cuda", seed), 1e-5)[:nargs]
                    bound = kernel.bind(args)
                    bound.set_config(cfg)
                    try:
                        check_outputs(bound(*args), reference(*args), torch.bfloat16)
                    except VerificationError as err:
                        failed, note = failed + 1, str(err)[:90]
                ms = time_ms(lambda: bound(*args))
            except Exception as err:  # a config that does not compile is a result too
                failed, note = -1, f"{type(err).__name__}: {err}"[:90]
            rows.append({"kernel": name, "block_sizes": "x".join(map(str, cfg.block_sizes)),
                         "indexing": cfg.config["indexing"], "pid_type": cfg.config["pid_type"],
                         "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
                         "failed_draws": failed, "draws": draws, "ms": round(ms, 5), "note": note})
            print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(out_csv, index=False)
    print(df.drop(columns="note").to_string(index=False))
    return df


if __name__ == "__main__":
    main(sys.argv[1])
