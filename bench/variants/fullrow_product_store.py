"""Where and how should the full-row LayerNorm kernel store the norm's input ``h`` in training?

When autograd records ``matmul_layernorm``, the kernel also stores ``h = a @ b`` (``product``)
for the backward. Until 2026-12-03 the kernel stored ``h`` last, after ``c`` and the statistics,
and on the H200 that store cost the LayerNorm kernel up to 0.155 ms, about twice what it cost
the RMSNorm kernel at the same shape. Two suspects: stored last, the fp32 accumulator stays live
beside ``centered`` and ``y`` through the whole epilogue; and the store's indexing slot is always
``"pointer"`` (:func:`helion_kernels.techniques.postnorm.kernels.with_call_slots`), also where the
tuned config stores ``c`` through a tensor descriptor. This A/B decided it: storing ``h`` first
cost 2.8-4.2x less at 256 <= N <= 512 at M = 262144, c's indexing changed nothing, and the
library's kernels now store ``h`` first, by pointer
(``bench/results/nvidia_h200_sm90/variants/fullrow_product_store_M_262144.md``).

Variants, each with the registry's config for the row (the forward's: the store slot added):

* ``last_pointer``: :func:`store_h_last_kernel`, the kernel as it was (``h`` stored last, by pointer);
* ``last_like_c``: the same, ``h`` stored with ``c``'s indexing;
* ``first_pointer``: the library's kernel (``h`` stored right after the k-loop, before the
  statistics, by pointer);
* ``first_like_c``: the library's kernel, ``h`` stored with ``c``'s indexing;
* ``forward``: the library's kernel without ``h`` (``variant - forward`` is what the store costs).

Every variant is checked against an fp32 reference (y, mean, rstd, h). A config the GPU refuses
for shared memory is stepped down as the library does (``smaller_config``; column ``stages``).

Usage (CUDA machine): ``python bench/variants/fullrow_product_store.py [--where 'M == 262144']
[--repeats 3]`` over the rows of ``configs/workloads/postnorm_fullrow.csv``; writes
``bench/results/<gpu>/variants/fullrow_product_store[_<where>].{csv,md,png}`` (the plot: what
storing ``h`` costs per row and variant).
"""

from __future__ import annotations

import argparse
import functools
import shlex
import statistics
import sys
from pathlib import Path

import helion
import helion.language as hl
import pandas as pd
import torch

from helion_kernels import registry, runtime, workloads
from helion_kernels.benchmark import finish_plot, row_labels, time_columns, write_table
from helion_kernels.bench_specs import bench_spec
from helion_kernels.techniques.postnorm.kernels import (
    SPEC_LAYERNORM,
    matmul_norm_kernel as matmul_layernorm_kernel,
    matmul_norm_reference as matmul_layernorm_reference,
    smaller_config,
)
from helion_kernels.spec import Shape
from helion_kernels.timing import input_copies
from helion_kernels.verify import VerificationError, check_outputs
from helion_kernels.workloads import load_workload


@helion.kernel(static_shapes=True)
def store_h_last_kernel(
    a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, product: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``matmul_layernorm_kernel`` as it was before 2026-12-03: ``product`` given and stored last.

    Loads and stores in program order: a, b, weight, bias, c, mean, rstd, product.
    """
    m, k = a.size()
    n = hl.specialize(b.size(1))
    block_n = hl.register_block_size(helion.next_power_of_2(n), helion.next_power_of_2(n))
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    mean = torch.empty([m], dtype=torch.float32, device=a.device)
    rstd = torch.empty([m], dtype=torch.float32, device=a.device)
    for tile_m, tile_n in hl.tile([m, n], block_size=[None, block_n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
        row_mean = torch.sum(acc, dim=1) / n
        in_row = (tile_n.index < n)[None, :]
        centered = torch.where(in_row, acc - row_mean[:, None], 0.0)
        var = torch.sum(centered * centered, dim=1) / n
        row_rstd = torch.rsqrt(var + eps)
        y = centered * row_rstd[:, None] * weight[tile_n].to(torch.float32)[None, :]
        c[tile_m, tile_n] = (y + bias[tile_n].to(torch.float32)[None, :]).to(c.dtype)
        mean[tile_m] = row_mean
        rstd[tile_m] = row_rstd
        product[tile_m, tile_n] = acc.to(product.dtype)
    return c, mean, rstd


# The forward's indexing slots (a config tuned without h): a, b, weight, bias, c, mean, rstd.
C_SLOT = 4


def with_h_slot(config: helion.Config, first: bool, like_c: bool) -> helion.Config:
    """``config`` (tuned without ``h``) with the ``h`` store's indexing slot: after the k-loop's
    two loads (``first``) or after every other access, ``"pointer"`` or ``c``'s (``like_c``)."""
    indexing = config.config.get("indexing")
    if not isinstance(indexing, list):
        return config  # one indexing for every access
    slot = indexing[C_SLOT] if like_c else "pointer"
    indexing = [*indexing[:2], slot, *indexing[2:]] if first else [*indexing, slot]
    return helion.Config(**{**config.config, "indexing": indexing})


VARIANTS = {  # name -> (kernel, h stored first, h indexed like c)
    "last_pointer": (store_h_last_kernel, False, False),
    "last_like_c": (store_h_last_kernel, False, True),
    "first_pointer": (matmul_layernorm_kernel, True, False),
    "first_like_c": (matmul_layernorm_kernel, True, True),
}


def _kernel_args(name: str, args: tuple, h: torch.Tensor) -> tuple:
    """The kernel's arguments: ``args`` = (a, b, weight, bias, eps, layernorm) and ``h``."""
    if VARIANTS[name][0] is store_h_last_kernel:
        return (*args[:5], h)
    return (*args, None, None, h)  # no Linear bias, no residual


def bound_kernel(name: str, args: tuple, config: helion.Config):
    """(a callable running variant ``name`` on ``args`` and its h buffer, the config it launched
    with): ``config`` stepped down by ``smaller_config`` while the GPU refuses it for shared memory."""
    from triton.runtime.errors import OutOfResources

    kernel, first, like_c = VARIANTS[name]
    config = with_h_slot(config, first, like_c)
    h = args[0].new_empty(args[0].shape[0], args[1].shape[1])
    while True:
        bound = kernel.bind(_kernel_args(name, args, h))
        bound.set_config(config)
        try:
            bound(*_kernel_args(name, args, h))
            return (lambda: (*bound(*_kernel_args(name, args, h)), h)), config
        except OutOfResources as err:
            config = smaller_config(config) if err.name == "shared memory" else None
            if config is None:
                raise


def bench_row(shape: Shape, device: torch.device, repeats: int) -> dict:
    dtype = torch.bfloat16
    per_set = bench_spec(SPEC_LAYERNORM.name).min_bytes(shape, dtype) + shape.M * shape.N * 2
    arg_sets = [SPEC_LAYERNORM.make_args(shape, dtype, device, s) for s in range(input_copies(per_set, device))]
    forward = runtime.resolve(SPEC_LAYERNORM, arg_sets[0], warn=False)
    indexing = forward.config.config.get("indexing", "pointer")
    row: dict = {**shape._asdict(), "config": forward.source,
                 "indexing_c": indexing[C_SLOT] if isinstance(indexing, list) else indexing}
    a, b = arg_sets[0][:2]
    ref = (*matmul_layernorm_reference(*arg_sets[0]), a.float() @ b.float())
    columns = {}
    for name in VARIANTS:
        runs = [bound_kernel(name, args, forward.config) for args in arg_sets]
        row[f"{name}_stages"] = runs[0][1].num_stages
        try:
            row[f"{name}_rel_error"] = check_outputs(runs[0][0](), ref, dtype)
        except VerificationError as err:
            row[f"{name}_rel_error"], row[f"{name}_check"] = float("inf"), f"FAILED: {err}"[:160]
        columns[name] = [run for run, _ in runs]
    columns["forward"] = [functools.partial(runtime.launch, SPEC_LAYERNORM, args) for args in arg_sets]
    times = {name: statistics.median(ts) for name, ts in time_columns(columns, repeats).items()}
    row.update({f"{name}_ms": t for name, t in times.items()})
    for name in VARIANTS:
        row[f"{name}_store_ms"] = times[name] - times["forward"]
    return row


def plot_store_cost(df: pd.DataFrame, path: Path, gpu: str) -> None:
    """Bars: what storing ``h`` costs (ms, variant - forward) per row and variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cost = df[[f"{name}_store_ms" for name in VARIANTS]].copy()
    cost.columns = list(VARIANTS)
    cost.index = row_labels(df)
    fig, ax = plt.subplots(figsize=(max(8, len(df) * 0.9), 5))
    cost.plot.bar(ax=ax, width=0.85)
    ax.set_ylabel("ms: forward with h - forward without")
    ax.set_title(f"{gpu}: what storing h costs the full-row LayerNorm kernel (lower is better)")
    ax.legend(fontsize=8)
    finish_plot(fig, [ax], path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--where", default=None, help="pandas query on the postnorm_fullrow table")
    p.add_argument("--repeats", type=int, default=3,
                   help="repeats, each timing the columns in order, then reversed (default 3)")
    args = p.parse_args()
    try:
        table = load_workload("postnorm_fullrow", args.where)
    except ValueError as err:
        p.error(str(err))
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    rows = []
    for r in table.itertuples():
        rows.append(bench_row(Shape(int(r.M), int(r.K), int(r.N)), device, args.repeats))
        print({k: v for k, v in rows[-1].items() if k.endswith("_ms") or k in ("M", "K", "N")}, flush=True)
    df = pd.DataFrame(rows)
    stem = (Path(__file__).resolve().parent.parent / "results" / registry.gpu_key(device) / "variants"
            / f"fullrow_product_store{workloads.where_suffix(args.where)}")
    command = " ".join(["python bench/variants/fullrow_product_store.py", *map(shlex.quote, sys.argv[1:])])
    write_table(df, stem, f"Full-row LayerNorm: where and how h is stored, on {torch.cuda.get_device_name(device)}", [
        f"command: `{command}`",
        "bf16, affine LayerNorm; every variant runs the registry's forward config for the row with the h store's "
        "indexing slot added; `<variant>_store_ms` = variant - forward (what storing h costs)",
        f"timing: CUDA-graph replay, median, input sets rotated past L2; every column timed in {args.repeats} "
        "repeats, the columns in order then reversed; medians",
    ])
    plot_store_cost(df, Path(f"{stem}.png"), torch.cuda.get_device_name(device))
    print(df.to_string())
    print(f"wrote {stem}.csv, .md and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
