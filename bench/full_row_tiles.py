"""Where and why full-row post-norm fusion stops paying: the tile it is forced to vs the GEMM's.

Reads committed files only (no GPU): the benchmark tables
``bench/results/<gpu>/matmul_{layernorm,rmsnorm}_postnorm_fullrow_M_<M>.csv`` and the
registry entries of the fused kernels and of the plain Helion GEMM, and writes
``bench/results/<gpu>/full_row_tiles.md``: per row, the fused program's tile
(tile_m x Npad, a whole row), the fp32 accumulator it must hold in registers per thread,
the tile the plain GEMM was tuned to at the same or nearest shape, and how the fused
kernel compares with cuBLAS and with cuBLAS + the inductor norm.
Usage: ``python bench/full_row_tiles.py [GPU_KEY]`` (default nvidia_h200_sm90).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from helion_kernels import registry
from helion_kernels.spec import Shape

ROOT = Path(__file__).resolve().parent.parent


def _tile(entry: registry.Entry | None, fused: bool, n: int) -> str:
    if entry is None:
        return "default"
    cfg = entry.config  # the config's JSON dict
    bs = cfg["block_sizes"]
    npad = 1 << (int(n) - 1).bit_length()
    mnk = (bs[1], npad, bs[2]) if fused else tuple(bs)
    return f"{mnk[0]}x{mnk[1]}x{mnk[2]} w{cfg['num_warps']} s{cfg['num_stages']}"


def main(gpu: str = "nvidia_h200_sm90") -> pd.DataFrame:
    results = ROOT / "bench" / "results" / gpu
    gemm_entries = registry.entries_for("matmul", gpu)
    rows = []
    for kernel in ("matmul_layernorm", "matmul_rmsnorm"):
        entries = registry.entries_for(kernel, gpu)
        for csv in sorted(results.glob(f"{kernel}_postnorm_fullrow_M_*.csv")):
            for times in pd.read_csv(csv).to_dict("records"):
                r = pd.Series(times)
                shape = Shape(int(r.M), int(r.K), int(r.N))
                fused = entries.get((*shape, times["dtype"])) or registry.nearest_entry(entries, shape, times["dtype"])
                gemm = gemm_entries.get((*shape, times["dtype"])) or registry.nearest_entry(gemm_entries, shape, times["dtype"])
                npad = 1 << (int(r.N) - 1).bit_length()
                tile_m = fused.config["block_sizes"][1] if fused else 16
                threads = 32 * (fused.config["num_warps"] if fused else 4)
                rows.append({
                    "kernel": kernel, "M": r.M, "K": r.K, "N": r.N,
                    "fused tile (m x Npad x k)": _tile(fused, True, r.N),
                    "acc fp32 regs/thread": tile_m * npad // threads,
                    "Helion GEMM tile": _tile(gemm, False, r.N) + ("" if gemm and gemm.shape == shape else " (nearest)"),
                    "fused / cuBLAS": round(times[f"{kernel}_ms"] / r.cublas_mm_ms, 3),
                    "fused / (cuBLAS+inductor)": round(times[f"{kernel}_ms"] / times["cublas+inductor_norm_ms"], 3),
                    "dispatch": r.dispatch,
                })
    df = pd.DataFrame(rows)
    out = results / "full_row_tiles.md"
    out.write_text(
        f"# Full-row post-norm: forced tile vs the GEMM's own tile ({gpu})\n\n"
        f"- command: `python bench/full_row_tiles.py {gpu}` (from the committed benchmark CSVs "
        "and registry; no GPU run)\n"
        "- `acc fp32 regs/thread`: tile_m x Npad / (32 x num_warps), the accumulator alone; "
        "an H100/H200 thread has at most 255 registers\n"
        "- `fused / (cuBLAS+inductor)` > 1: the fused kernel loses; `dispatch` is what "
        "`matmul_layernorm` / `matmul_rmsnorm` run at that shape\n\n" + df.to_markdown(index=False) + "\n"
    )
    print(df.to_string(index=False))
    return df


if __name__ == "__main__":
    main(*sys.argv[1:])
