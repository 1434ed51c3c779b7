"""Row sweep: does keeping the last N tile in registers beat re-reading it from L2?

Times the shipped row-sweep kernels (``matmul_{layernorm,rmsnorm}_row_sweep_kernel``)
against their ``..._last_tile_kernel`` variants (defined here; measured, not shipped) on the same tiling: each workload row's
registry config reduced to the fields both kernels share (``block_sizes``, ``num_warps``,
``num_stages``, pointer indexing; the tuned split-N configs use nothing else but for one
unroll factor), so the only difference is the variant's code. Every output is checked
against the fp32 reference. Run it from the checkout installed with ``pip install -e .``:

    python bench/variants/row_sweep_last_tile.py [--norm rmsnorm] [--where 'N <= 1024']

Writes ``bench/results/<gpu>/variants/row_sweep_last_tile_<norm>[_<where>].{csv,md,json,png}`` (a
``--where`` run is named after its clause, so it never replaces the whole sweep).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import helion
import helion.language as hl
import pandas as pd
import torch

from helion_kernels import registry, workloads
from helion_kernels.benchmark import aim_bars, finish_plot, run_meta, workload_script_args, write_results
from helion_kernels.techniques.split_n import kernels as row_sweep
from helion_kernels.spec import Shape
from helion_kernels.timing import input_copies, measure_ceilings, time_ms
from helion_kernels.verify import check_outputs


# Variants that keep the last N tile's fp32 accumulator in registers and normalise it from
# there, so the second walk re-reads T - 1 tiles instead of T (T = 1 is then a full-row
# kernel that still stores the tile twice). Same block sizes, but more loads, stores and
# loops, so the registry's configs for the shipped kernels do not apply to them as they are.
# On the H200 (this script, on the tuned tilings): RMSNorm 1-3% faster on
# every workload row; LayerNorm takes 1.11-1.31x the time except at T = 1 (cause not
# checked; the carried tile is 128 more fp32 registers per thread on the 64 x 512 / 8-warp
# tiling). Not shipped: the RMSNorm gain is the size of run-to-run differences, and it
# would need a tuning run of its own to be registered. Helion 1.5 does not compile them at
# N = 1 (the first walk's bound, 0, leaves a size it cannot place).
@helion.kernel(static_shapes=True)
def matmul_layernorm_row_sweep_last_tile_kernel(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`matmul_layernorm_row_sweep_kernel` with the last N tile kept in registers."""
    m, k = a.size()
    n = hl.specialize(b.size(1))
    block_n = hl.register_block_size(n)
    last_begin = (helion.cdiv(n, block_n) - 1) * block_n
    y = torch.empty([m, n], dtype=a.dtype, device=a.device)
    tile_means = torch.empty([m, helion.cdiv(n, block_n)], dtype=torch.float32, device=a.device)
    mean = torch.empty([m], dtype=torch.float32, device=a.device)
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m in hl.tile(m):
        count = hl.zeros([tile_m], dtype=torch.float32)
        row_mean = hl.zeros([tile_m], dtype=torch.float32)
        m2 = hl.zeros([tile_m], dtype=torch.float32)
        last = hl.zeros([tile_m, block_n], dtype=torch.float32)
        for tile_n in hl.tile(n, block_size=block_n):
            acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(k):
                acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
            in_row = (tile_n.index < n)[None, :]
            tile_count = torch.sum(in_row.to(torch.float32), dim=1)
            tile_mean = torch.sum(acc, dim=1) / tile_count
            centred = torch.where(in_row, acc - tile_mean[:, None], 0.0)
            y[tile_m, tile_n] = centred.to(y.dtype)
            tile_means[tile_m, tile_n.id] = tile_mean
            total = count + tile_count
            delta = tile_mean - row_mean
            row_mean = row_mean + delta * (tile_count / total)
            m2 = m2 + torch.sum(centred * centred, dim=1) + delta * (delta * (count * tile_count / total))
            count = total
            last = acc
        row_rstd = torch.rsqrt(m2 / n + eps)
        for tile_n in hl.tile(0, last_begin, block_size=block_n):
            shift = tile_means[tile_m, tile_n.id] - row_mean
            out = (y[tile_m, tile_n].to(torch.float32) + shift[:, None]) * row_rstd[:, None]
            if weight is not None:
                out = out * weight[tile_n].to(torch.float32)[None, :]
            if bias is not None:
                out = out + bias[tile_n].to(torch.float32)[None, :]
            y[tile_m, tile_n] = out.to(y.dtype)
        for tile_n in hl.tile(last_begin, n, block_size=block_n):  # one tile, from registers
            out = (last - row_mean[:, None]) * row_rstd[:, None]
            if weight is not None:
                out = out * weight[tile_n].to(torch.float32)[None, :]
            if bias is not None:
                out = out + bias[tile_n].to(torch.float32)[None, :]
            y[tile_m, tile_n] = out.to(y.dtype)
        mean[tile_m] = row_mean
        rstd[tile_m] = row_rstd
    return y, mean, rstd


@helion.kernel(static_shapes=True)
def matmul_rmsnorm_row_sweep_last_tile_kernel(
    a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`matmul_rmsnorm_row_sweep_kernel` with the last N tile kept in registers."""
    m, k = a.size()
    n = hl.specialize(b.size(1))
    block_n = hl.register_block_size(n)
    last_begin = (helion.cdiv(n, block_n) - 1) * block_n
    y = torch.empty([m, n], dtype=a.dtype, device=a.device)
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m in hl.tile(m):
        sum_sq = hl.zeros([tile_m], dtype=torch.float32)
        last = hl.zeros([tile_m, block_n], dtype=torch.float32)
        for tile_n in hl.tile(n, block_size=block_n):
            acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
            for tile_k in hl.tile(k):
                acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
            y[tile_m, tile_n] = acc.to(y.dtype)
            sum_sq = sum_sq + torch.sum(acc * acc, dim=1)
            last = acc
        row_rstd = torch.rsqrt(sum_sq / n + eps)
        for tile_n in hl.tile(0, last_begin, block_size=block_n):
            out = y[tile_m, tile_n].to(torch.float32) * row_rstd[:, None]
            if weight is not None:
                out = out * weight[tile_n].to(torch.float32)[None, :]
            y[tile_m, tile_n] = out.to(y.dtype)
        for tile_n in hl.tile(last_begin, n, block_size=block_n):  # one tile, from registers
            out = last * row_rstd[:, None]
            if weight is not None:
                out = out * weight[tile_n].to(torch.float32)[None, :]
            y[tile_m, tile_n] = out.to(y.dtype)
        rstd[tile_m] = row_rstd
    return y, rstd


KERNELS = {
    "layernorm": (row_sweep.SPEC_LAYERNORM, row_sweep.matmul_norm_row_sweep_kernel,
                  matmul_layernorm_row_sweep_last_tile_kernel),
    "rmsnorm": (row_sweep.SPEC_RMSNORM, row_sweep.matmul_norm_row_sweep_kernel,
                matmul_rmsnorm_row_sweep_last_tile_kernel),
}


def variant_args(args: tuple) -> tuple:
    """The shipped kernel's arguments (a, b, weight, bias, eps, layernorm) as the variant
    kernels take them: (a, b, weight, bias, eps) or (a, b, weight, eps)."""
    a, b, weight, bias, eps, layernorm = args
    return (a, b, weight, bias, eps) if layernorm else (a, b, weight, eps)


def shared_config(config: helion.Config) -> helion.Config:
    """The fields of a row-sweep config that both kernels accept (list-valued fields such as
    ``indexing`` have one entry per load/store or loop, which the variant has more of)."""
    return helion.Config(block_sizes=config.block_sizes, num_warps=config.num_warps,
                         num_stages=config.num_stages, indexing="pointer")


def bench_row(spec, kernels, shape: Shape, device, dtype: torch.dtype = torch.bfloat16) -> dict:
    found = registry.lookup(spec.name, shape, dtype, registry.gpu_key(device))
    config = shared_config(spec.default_config if found.entry is None else helion.Config(**found.entry.config))
    first = spec.make_args(shape, dtype, device, 0)
    per_set = sum(t.numel() * t.element_size() for t in first if isinstance(t, torch.Tensor))
    sets = [first] + [spec.make_args(shape, dtype, device, s)
                      for s in range(1, input_copies(per_set, device))]
    ref = spec.reference(*first)
    row = {"M": shape.M, "K": shape.K, "N": shape.N, "config": found.source,
           "tiling": "x".join(map(str, config.block_sizes)) + f" w{config.num_warps} s{config.num_stages}",
           "tiles_per_row": -(-shape.N // config.block_sizes[0])}
    for name, kernel, fix in zip(("shipped", "last_tile"), kernels, (tuple, variant_args)):
        bound = kernel.bind(fix(first))
        bound.set_config(config)
        row[f"{name}_rel_error"] = check_outputs(bound(*fix(first)), ref, dtype)
        row[f"{name}_ms"] = time_ms([lambda s=fix(s): bound(*s) for s in sets])
    row["last_tile_speedup"] = row["shipped_ms"] / row["last_tile_ms"]
    return row


def plot(df: pd.DataFrame, meta: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.K}x{r.N} (T={r.tiles_per_row})" for r in df.itertuples()]
    fig, ax = plt.subplots(1, 1, figsize=(max(7, len(df) * 0.9), 4))
    aim_bars(ax, 100 * (df["last_tile_speedup"] - 1), labels, 0, "no change",
             "% faster than the shipped row sweep", baseline=0)
    ax.set_title(f"{meta['gpu']}: last N tile kept in registers, same tiling (higher is better)")
    finish_plot(fig, [ax], path)


def main() -> int:
    args, table = workload_script_args(
        __doc__.splitlines()[0], lambda p: p.add_argument("--norm", choices=sorted(KERNELS), default="rmsnorm"))
    device = torch.device("cuda")
    ceilings = measure_ceilings(device)
    spec, *kernels = KERNELS[args.norm]
    rows = []
    for r in table.itertuples():
        rows.append(bench_row(spec, kernels, Shape(int(r.M), int(r.K), int(r.N)), device))
        print(rows[-1], flush=True)
    meta = run_meta(device, ceilings, inputs="bf16, affine on, the kernel spec's random operands")
    meta["command"] = " ".join(["python bench/variants/row_sweep_last_tile.py --norm", args.norm, "--workload", args.workload]
                               + (["--where", shlex.quote(args.where)] if args.where else []))
    out_dir = args.out or Path(__file__).resolve().parent.parent / "results" / meta["gpu_key"] / "variants"
    paths = write_results(pd.DataFrame(rows), meta, out_dir, f"row_sweep_last_tile_{args.norm}{workloads.where_suffix(args.where)}", plot,
                          notes=("`last_tile_speedup` = shipped_ms / last_tile_ms on the same tiling",))
    print("wrote " + ", ".join(str(x) for x in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
