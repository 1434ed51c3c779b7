"""GDPA backward: time each hand-picked config of the dq and the dk/dv kernels at workload rows.

Why: the two backward kernels (:mod:`helion_kernels.techniques.attention.kernels`) ran configs pinned
on them, not tuned (now their registry's, else those defaults: ``helion-kernels autotune --kernel
gdpa_dq`` / ``gdpa_dkdv``); they are most of the FlashNormAttention backward and of ``gdpa``'s. This
sweep times each candidate on the ads-model rows (batch 768, D 128, KV 128, fill 0.5), checks
its gradients against the fp32 per-sequence autograd reference (5e-2, bf16), and shows which
ones to seed the tuning with. Run it from the checkout installed with ``pip install -e .``.

    python bench/variants/gdpa_backward_configs.py --rows 2,512 8,1024
    python bench/variants/gdpa_backward_configs.py --rows 8,1024 --configs 64x64/4/2 32x64/4/2 --tag small

Writes ``bench/results/<gpu>/variants/gdpa_backward_configs.{csv,md}``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import helion
import pandas as pd
import torch

from helion_kernels import registry
from helion_kernels.benchmark import write_table
from helion_kernels.techniques.attention import kernels as gb
from helion_kernels.techniques.attention.kernels import random_jagged_inputs
from helion_kernels.limits import ACTIVATIONS
from helion_kernels.spec import AttentionRow
from helion_kernels.timing import time_ms
from helion_kernels.verify import check_outputs

ACTIVATION = "fast_gelu"
# block_sizes: dq [tile_q, tile_kv], dk/dv [tile_kv, tile_q]; the first is the pinned one.
CANDIDATES = [(64, 64, 4, 2), (128, 64, 8, 2), (128, 128, 8, 2), (64, 128, 4, 3), (128, 128, 8, 3),
              (128, 64, 4, 3), (64, 128, 8, 2), (128, 32, 4, 3), (256, 64, 8, 2)]


def _row(text: str) -> AttentionRow:
    heads, max_q = (int(x) for x in text.split(","))
    return AttentionRow(768, heads, 128, max_q, 128, 0.5, 0)


def _candidate(text: str) -> tuple[int, int, int, int]:
    tiles, warps, stages = text.split("/")
    b0, b1 = tiles.split("x")
    return int(b0), int(b1), int(warps), int(stages)


def sweep_row(row: AttentionRow, device: torch.device, candidates: list[tuple[int, int, int, int]]) -> list[dict]:
    q, k, v, qo, ko = random_jagged_inputs(row.q_lengths(), [row.seq_len_kv] * row.batch, row.H, row.D,
                                           torch.bfloat16, device, 0)
    dout = torch.randn(q.shape, generator=torch.Generator(device=device).manual_seed(1), device=device,
                       dtype=torch.bfloat16)
    ref_dq, ref_dk, ref_dv = gb.gdpa_backward_reference(q, k, v, dout, qo, ko, 1.0, ACTIVATION)
    act = ACTIVATIONS.index(ACTIVATION)
    kernels = (
        ("dq", gb.gdpa_dq_kernel, (q, k, v, dout, qo, ko, row.max_seq_len_q, 1.0, act), (ref_dq,)),
        ("dkdv", gb.gdpa_dkdv_kernel, (q, k, v, dout, qo, ko, row.seq_len_kv, 1.0, act), (ref_dk, ref_dv)),
    )
    rows = []
    for name, kernel, args, ref in kernels:
        for b0, b1, warps, stages in candidates:
            cfg = helion.Config(block_sizes=[b0, b1], num_warps=warps, num_stages=stages)
            out = {"H": row.H, "max_seq_len_q": row.max_seq_len_q, "total_q": q.shape[0], "kernel": name,
                   "block_sizes": f"{b0}x{b1}", "num_warps": warps, "num_stages": stages}
            try:
                bound = kernel.bind(args)
                compiled = bound.compile_config(cfg)
                out["rel_error"] = check_outputs(compiled(*args), ref, torch.bfloat16, tolerance=5e-2)
                out["ms"] = time_ms(lambda: compiled(*args))
            except Exception as err:  # a config that does not fit is a result too
                out["error"] = f"{type(err).__name__}: {err}"[:160]
            rows.append(out)
            print(out, flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", nargs="+", default=["2,512", "8,1024"], metavar="H,MAX_Q",
                   help="workload rows as H,max_seq_len_q (batch 768, D 128, KV 128, fill 0.5)")
    p.add_argument("--configs", nargs="+", default=None, metavar="BQxBKV/WARPS/STAGES",
                   help="candidates such as 64x64/4/2 (default: the built-in list; the first is the baseline)")
    p.add_argument("--tag", default="", help="suffix of the output files' name")
    p.add_argument("--out", type=Path, default=None, help="folder (default: bench/results/<gpu>/variants/)")
    args = p.parse_args()
    try:
        rows = [_row(r) for r in args.rows]
    except ValueError:
        p.error("--rows takes H,max_seq_len_q pairs such as 2,512")
    try:
        candidates = [_candidate(c) for c in args.configs] if args.configs else CANDIDATES
    except ValueError:
        p.error("--configs takes candidates such as 64x64/4/2")
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    folder = args.out or Path(__file__).resolve().parent.parent / "results" / registry.gpu_key(device) / "variants"
    stem = folder / ("gdpa_backward_configs" + (f"_{args.tag}" if args.tag else ""))
    command = (f"python bench/variants/{Path(__file__).name} --rows {' '.join(args.rows)}"
               + (f" --configs {' '.join(args.configs)}" if args.configs else "")
               + (f" --tag {args.tag}" if args.tag else ""))
    results: list[dict] = []
    for row in rows:  # the files are rewritten after each row, so a run cut short keeps its rows
        results += sweep_row(row, device, candidates)
        df = pd.DataFrame(results)
        first = df.groupby(["H", "max_seq_len_q", "kernel"])["ms"].transform("first")  # the baseline config
        df["vs_pinned"] = df["ms"] / first
        write_table(df, stem, f"GDPA backward config sweep on {torch.cuda.get_device_name(device)}", [
            f"command: `{command}`", f"rows: batch 768, D 128, KV 128, fill 0.5, bf16, {ACTIVATION}",
            "timing: CUDA-graph replay, median of 10 replays (one input set: larger than L2)",
            "check: every gradient against the fp32 per-sequence autograd reference, 5e-2",
            "`vs_pinned`: time / the first config's of the same row and kernel (the pinned one, in the default list)"])
    print(f"wrote {stem}.csv/.md")
    print(df.sort_values(["H", "max_seq_len_q", "kernel", "ms"]).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
