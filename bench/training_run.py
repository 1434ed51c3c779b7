"""A small MLP trained with the fused modules against the same MLP built from PyTorch pairs.

Same initial weights, same batches (random inputs, a fixed random teacher network's outputs
as the regression target), AdamW, fp32 parameters under bf16 autocast, 300 steps. The fused
model holds the very pairs' modules of a deep copy (``from_modules``), so only the kernels
differ. Checked: final losses within 1% of each other and no step's losses more than 2% apart.

    python bench/training_run.py [--steps 300] [--lr 1e-3] [--out DIR]

Writes ``training_run_lr<lr>.{csv,md}`` to ``bench/results/<gpu>/`` (or ``--out``); exits 1 if
a check fails.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from helion_kernels import LinearLayerNorm, LinearRMSNorm, RMSNormLinear, registry
from helion_kernels.tuning import versions

WIDTH, HIDDEN, OUT, BATCH = 512, 1024, 256, 8192


def unfused_mlp() -> nn.Sequential:
    """RMSNorm -> Linear, GELU, Linear -> LayerNorm, GELU, Linear -> RMSNorm, Linear."""
    return nn.Sequential(
        nn.RMSNorm(WIDTH), nn.Linear(WIDTH, HIDDEN), nn.GELU(),
        nn.Linear(HIDDEN, WIDTH, bias=False), nn.LayerNorm(WIDTH), nn.GELU(),
        nn.Linear(WIDTH, OUT, bias=False), nn.RMSNorm(OUT), nn.Linear(OUT, 1))


def fused_mlp(pairs: nn.Sequential) -> nn.Sequential:
    """The same layers, each norm + Linear pair as one module over the pair's own modules."""
    p = pairs
    return nn.Sequential(RMSNormLinear.from_modules(p[0], p[1]), p[2], LinearLayerNorm.from_modules(p[4], p[3]), p[5],
                         LinearRMSNorm.from_modules(p[7], p[6]), p[8])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    warnings.simplefilter("ignore", registry.ConfigFallbackWarning)  # untuned shapes: nearest configs
    torch.manual_seed(0)
    reference = unfused_mlp().cuda()
    models = {"unfused": reference, "fused": fused_mlp(copy.deepcopy(reference))}
    teacher = nn.Sequential(nn.Linear(WIDTH, 256), nn.Tanh(), nn.Linear(256, 1)).cuda()
    optims = {k: torch.optim.AdamW(m.parameters(), lr=args.lr) for k, m in models.items()}
    gen = torch.Generator(device="cuda").manual_seed(1)
    rows, t0 = [], time.perf_counter()
    for step in range(args.steps):
        x = torch.randn(BATCH, WIDTH, device="cuda", generator=gen)
        with torch.no_grad():
            y = teacher(x)
        row = {"step": step}
        for name, model in models.items():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = nn.functional.mse_loss(model(x).float(), y)
            optims[name].zero_grad(set_to_none=True)
            loss.backward()
            optims[name].step()
            row[f"{name}_loss"] = loss.item()
        row["rel_diff"] = abs(row["fused_loss"] - row["unfused_loss"]) / row["unfused_loss"]
        rows.append(row)
    df = pd.DataFrame(rows)
    final = df.iloc[-1]
    checks = {"final losses within 1%": final["rel_diff"] <= 0.01,
              "every step within 2%": bool((df["rel_diff"] <= 0.02).all()),
              "loss went down": final["unfused_loss"] < 0.5 * df["unfused_loss"].iloc[0]}
    device = torch.device("cuda")
    out_dir = args.out or Path(__file__).resolve().parent / "results" / registry.gpu_key(device)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"training_run_lr{args.lr:g}"
    df.to_csv(out_dir / f"{stem}.csv", index=False, float_format="%.6g")
    head = [f"# Training run on {torch.cuda.get_device_name(device)}", "",
            f"- command: `python bench/training_run.py --steps {args.steps} --lr {args.lr:g}`",
            f"- versions: {', '.join(f'{k} {v}' for k, v in versions().items())}",
            f"- model: RMSNormLinear({WIDTH}->{HIDDEN}), GELU, LinearLayerNorm({HIDDEN}->{WIDTH}), GELU, "
            f"LinearRMSNorm({WIDTH}->{OUT}), Linear({OUT}->1) against the same nn.RMSNorm/nn.Linear/nn.LayerNorm "
            f"pairs; batch {BATCH}, AdamW lr {args.lr:g}, fp32 parameters, bf16 autocast; {time.perf_counter() - t0:.0f} s",
            f"- largest per-step relative difference {df['rel_diff'].max():.4f} (step {int(df['rel_diff'].idxmax())}); "
            f"final losses {final['fused_loss']:.6g} (fused) and {final['unfused_loss']:.6g} (unfused), "
            f"difference {final['rel_diff']:.4f}",
            *(f"- check: {name}: {'PASS' if ok else 'FAIL'}" for name, ok in checks.items()), ""]
    shown = df.iloc[list(range(0, len(df), max(1, len(df) // 20))) + [len(df) - 1]].drop_duplicates()
    (out_dir / f"{stem}.md").write_text("\n".join(head) + "\n" + shown.to_markdown(index=False, floatfmt=".5g") + "\n")
    print("\n".join(head))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
