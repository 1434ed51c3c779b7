"""FlashNormAttention: time each hand-picked config (and the GDPA kernel's) at one workload row.

Why: Helion's autotuner searches from these seeds for a short budget; this sweep shows
what each seed itself reaches, for both fused designs (the shipped per-head kernel,
``flash_norm_attention_kernel``, and the all-heads alternative) next to this package's
unfused GDPA kernel with eager norms. Run it from the checkout installed with
``pip install -e .``.

    python bench/variants/flash_norm_attention_configs.py --heads 8 --max-seq-len-q 3000

Writes ``bench/results/<gpu>/variants/flash_norm_attention_configs_H<H>_q<max>.{csv,md}``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import helion
import pandas as pd
import torch

import flash_norm_attention_all_heads as all_heads  # beside this script
from helion_kernels.bench_specs import norm_block
from helion_kernels import registry
from helion_kernels.benchmark import write_table
from helion_kernels.techniques.attention import kernels as fna
from helion_kernels.techniques.attention import kernels as gd
from helion_kernels.techniques.attention.kernels import kernel_reference as reference
from helion_kernels.techniques.attention.kernels import make_args
from helion_kernels.spec import AttentionRow
from helion_kernels.timing import time_ms
from helion_kernels.verify import check_outputs

GDPA_CONFIGS = [helion.Config(block_sizes=[bq, bk], num_warps=w, num_stages=s)
                for bq, bk, w, s in ((64, 64, 4, 2), (128, 64, 8, 2), (128, 128, 8, 2), (64, 128, 4, 3))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, default=8, help="H of the workload row (D = 128, batch 768)")
    p.add_argument("--max-seq-len-q", type=int, default=3000, help="longest Q sequence (fill 0.5)")
    p.add_argument("--out", type=Path, default=None, help="folder (default: bench/results/<gpu>/variants/)")
    args = p.parse_args()
    if args.heads < 1 or args.max_seq_len_q < 1:
        p.error("--heads and --max-seq-len-q must be >= 1")
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    row = AttentionRow(768, args.heads, 128, args.max_seq_len_q, 128, 0.5, 0)
    kargs = make_args(row, torch.bfloat16, device, 0)
    ref = reference(*kargs)
    rows = []
    fused = [(fna.flash_norm_attention_kernel, cfg) for cfg in fna.SEED_CONFIGS]
    fused += [(all_heads.flash_norm_attention_all_heads_kernel, cfg)
              for cfg in (all_heads.ALL_HEADS_DEFAULT_CONFIG, *all_heads.ALL_HEADS_SEED_CONFIGS[1:])]
    for kernel, cfg in fused:
        out = {"kernel": kernel.name, "config": repr(cfg.config)}
        try:
            bound = kernel.bind(kargs)
            bound.set_config(cfg)
            out["rel_error"] = check_outputs(bound(*kargs), ref, torch.bfloat16)
            out["ms"] = time_ms(lambda: bound(*kargs))
        except Exception as err:  # a config that does not fit is a result too
            out["error"] = f"{type(err).__name__}: {err}"[:160]
        rows.append(out)
        print(out, flush=True)
    q, k, v, qo, ko = kargs[:5]
    ln_w, ln_b, rms_w = (t.reshape(-1) for t in kargs[6:9])
    eps, qk_scale, activation = kargs[9:]
    for cfg in GDPA_CONFIGS:
        out = {"kernel": "gdpa+eager_norms", "config": repr(cfg.config)}
        try:
            bound = gd.gdpa_kernel.bind((q, k, v, qo, ko, row.max_seq_len_q, qk_scale, activation))
            bound.set_config(cfg)

            def run():
                return norm_block(q, lambda ln: bound(ln, k, v, qo, ko, row.max_seq_len_q, qk_scale, activation),
                                      ln_w, ln_b, rms_w, eps)

            out["rel_error"] = check_outputs(run(), ref, torch.bfloat16)
            out["ms"] = time_ms(run)
        except Exception as err:
            out["error"] = f"{type(err).__name__}: {err}"[:160]
        rows.append(out)
        print(out, flush=True)
    df = pd.DataFrame(rows)
    folder = args.out or Path(__file__).resolve().parent.parent / "results" / registry.gpu_key(device) / "variants"
    stem = folder / f"flash_norm_attention_configs_H{row.H}_q{row.max_seq_len_q}"
    write_table(df, stem, f"FlashNormAttention config sweep on {torch.cuda.get_device_name(device)}", [
        f"command: `python bench/variants/{Path(__file__).name} --heads {row.H} --max-seq-len-q {row.max_seq_len_q}`",
        f"row: {row}, bf16, fast_gelu, affine norms; total_q = {q.shape[0]}",
        "timing: CUDA-graph replay, median of 10 replays (one input set: it is larger than L2)"])
    print(f"wrote {stem}.csv/.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
