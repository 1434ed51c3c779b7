"""Host cost of the public ops' Python wrappers alone, the kernel launch stubbed out.

The GPU measurement (``startup_and_overhead.py``) times whole eager calls, 90-270 us each,
dominated by Helion's own launch path and varying by tens of microseconds from one process
to the next; this isolates what the package adds in front of the launch (validation,
dispatch, the custom-op bypass), which is what changed when the ops became custom ops.
Any machine (no GPU needed: it runs with ``TRITON_INTERPRET=1`` so CPU tensors pass the
device check, and the launch returns preallocated outputs).

    python bench/wrapper_overhead.py --baseline <folder holding another helion_kernels/> [--out DIR]

Writes ``wrapper_overhead.{csv,md}`` (default ``bench/results/cpu/``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent


def _child() -> dict:
    os.environ["TRITON_INTERPRET"] = "1"
    import warnings

    warnings.simplefilter("ignore")
    import torch

    import helion_kernels as hk

    a = torch.randn(256, 64, dtype=torch.bfloat16)
    b = torch.randn(64, 64, dtype=torch.bfloat16)
    w, bias = torch.randn(64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16)
    y, stats = torch.empty(256, 64, dtype=torch.bfloat16), torch.empty(256)

    def fake_launch(spec, args, *rest):
        return (y, stats, stats) if "layernorm" in spec.name else (y, stats) if "rms" in spec.name else y

    if "helion_kernels.runtime" in sys.modules:  # this layout: ops launch through runtime
        from helion_kernels import runtime

        runtime.launch = fake_launch
    else:  # the earlier layout: ops.run
        from helion_kernels import ops

        ops.run = fake_launch
    cases = {"matmul_layernorm(fused=True)": lambda: hk.matmul_layernorm(a, b, w, bias, fused=True),
             "matmul": lambda: hk.matmul(a, b),
             "rmsnorm_matmul": lambda: hk.rmsnorm_matmul(a, b)}
    out = {}
    for name, fn in cases.items():
        for _ in range(200):
            fn()
        rounds = []
        for _ in range(15):
            t = time.perf_counter()
            for _ in range(2000):
                fn()
            rounds.append((time.perf_counter() - t) / 2000 * 1e6)
        out[name] = statistics.median(rounds)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="folder holding the other helion_kernels/")
    ap.add_argument("--out", type=Path, default=CHECKOUT / "bench" / "results" / "cpu")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child()))
        return 0
    if args.baseline is None:
        ap.error("--baseline is required")
    import pandas as pd

    results = {}
    for label, root in (("this checkout", CHECKOUT), ("baseline", args.baseline.resolve())):
        env = {k: v for k, v in os.environ.items() if k not in ("HELION_INTERPRET",)}
        env["PYTHONPATH"] = str(root)
        run = subprocess.run([sys.executable, __file__, "--child"], env=env, cwd=root, capture_output=True,
                             text=True, check=True)
        results[label] = json.loads(run.stdout.strip().splitlines()[-1])
    df = pd.DataFrame(results).rename_axis("op (wrapper only, us per call)").reset_index()
    df["added_us"] = df["this checkout"] - df["baseline"]
    args.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(args.out / "wrapper_overhead.csv", index=False, float_format="%.3g")
    head = ["# Host cost of the ops' Python wrappers (kernel launch stubbed)", "",
            f"- command: `python bench/wrapper_overhead.py --baseline <a checkout of 8f1f445>`",
            f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}; median of 15 rounds of 2000 calls, one process per package",
            "- baseline: commit 8f1f445, the package before the ops became custom ops", ""]
    (args.out / "wrapper_overhead.md").write_text("\n".join(head) + "\n" + df.to_markdown(index=False, floatfmt=".3g") + "\n")
    print(df.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
