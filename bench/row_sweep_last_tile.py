"""Row sweep: does keeping the last N tile in registers beat re-reading it from L2?

Times the shipped row-sweep kernels (``matmul_{layernorm,rmsnorm}_row_sweep_kernel``)
against their ``..._last_tile_kernel`` variants on the same tiling: each workload row's
registry config reduced to the fields both kernels share (``block_sizes``, ``num_warps``,
``num_stages``, pointer indexing; the tuned split-N configs use nothing else but for one
unroll factor), so the only difference is the variant's code. Every output is checked
against the fp32 reference. Run it from the checkout installed with ``pip install -e .``:

    python bench/row_sweep_last_tile.py [--norm rmsnorm] [--where 'N <= 1024']

Writes ``bench/results/<gpu>/row_sweep_last_tile_<norm>.{csv,md,json,png}``.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import helion
import pandas as pd
import torch

from helion_kernels import registry
from helion_kernels.benchmark import aim_bars, finish_plot, run_meta, workload_script_args, write_results
from helion_kernels.kernels import postnorm_row_sweep as row_sweep
from helion_kernels.kernels.spec import Shape
from helion_kernels.timing import input_copies, measure_ceilings, time_ms
from helion_kernels.verify import check_outputs

KERNELS = {
    "layernorm": (row_sweep.SPEC_LAYERNORM, row_sweep.matmul_layernorm_row_sweep_kernel,
                  row_sweep.matmul_layernorm_row_sweep_last_tile_kernel),
    "rmsnorm": (row_sweep.SPEC_RMSNORM, row_sweep.matmul_rmsnorm_row_sweep_kernel,
                row_sweep.matmul_rmsnorm_row_sweep_last_tile_kernel),
}


def shared_config(config: helion.Config) -> helion.Config:
    """The fields of a row-sweep config that both kernels accept (list-valued fields such as
    ``indexing`` have one entry per load/store or loop, which the variant has more of)."""
    return helion.Config(block_sizes=config.block_sizes, num_warps=config.num_warps,
                         num_stages=config.num_stages, indexing="pointer")


def bench_row(spec, kernels, shape: Shape, device, dtype: torch.dtype = torch.bfloat16) -> dict:
    resolved = registry.resolve(spec.name, spec.default_config, shape, dtype, registry.gpu_key(device))
    config = shared_config(resolved.config)
    first = spec.make_args(shape, dtype, device, 0)
    per_set = sum(t.numel() * t.element_size() for t in first if isinstance(t, torch.Tensor))
    sets = [first] + [spec.make_args(shape, dtype, device, s)
                      for s in range(1, input_copies(per_set, device))]
    ref = spec.reference(*first)
    row = {"M": shape.M, "K": shape.K, "N": shape.N, "config": resolved.source,
           "tiling": "x".join(map(str, config.block_sizes)) + f" w{config.num_warps} s{config.num_stages}",
           "tiles_per_row": -(-shape.N // config.block_sizes[0])}
    for name, kernel in zip(("shipped", "last_tile"), kernels):
        bound = kernel.bind(first)
        bound.set_config(config)
        row[f"{name}_rel_error"] = check_outputs(bound(*first), ref, dtype)
        row[f"{name}_ms"] = time_ms([lambda s=s: bound(*s) for s in sets])
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
    meta["command"] = " ".join(["python bench/row_sweep_last_tile.py --norm", args.norm, "--workload", args.workload]
                               + (["--where", shlex.quote(args.where)] if args.where else []))
    out_dir = args.out or Path(__file__).resolve().parent / "results" / meta["gpu_key"]
    paths = write_results(pd.DataFrame(rows), meta, out_dir, f"row_sweep_last_tile_{args.norm}", plot,
                          notes=("`last_tile_speedup` = shipped_ms / last_tile_ms on the same tiling",))
    print("wrote " + ", ".join(str(x) for x in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
