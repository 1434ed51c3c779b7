"""Where one training step of a fused module spends its time: ``torch.profiler`` over a few
forward + backward steps of one layer, next to the compiled PyTorch pair.

    python bench/profile_training_step.py --layer rmsnorm_linear --shape 65536,1024,1024

Prints, for the fused module (eager) and the compiled pair, the GPU kernels by total time and
the host time per step; with ``--cprofile``, also the Python functions of the fused step by
their own host time (cProfile). Nothing is written (it is a diagnostic, not a result).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
import warnings

import torch

from helion_kernels import registry
from helion_kernels.workloads import parse_shape

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from training_step import _fused, _pair, _step  # noqa: E402  (the benchmark's own layer set-up)


def profile(name: str, step, steps: int = 5) -> None:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    host = (time.perf_counter() - t0) / steps
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / steps
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    print(f"\n=== {name}: host {1e3 * host:.3f} ms/step to enqueue, {1e3 * wall:.3f} ms/step wall ===")
    events = prof.key_averages()
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]:
        print(f"{e.self_cpu_time_total / steps / 1e3:8.3f} ms/step host  x{e.count // steps:<3d} {e.key[:90]}")
    kernels = [e for e in events if e.self_device_time_total > 0]
    for e in sorted(kernels, key=lambda e: -e.self_device_time_total)[:16]:
        print(f"{e.self_device_time_total / steps / 1e3:8.3f} ms/step  x{e.count // steps:<3d} {e.key[:90]}")


def python_profile(name: str, step, steps: int = 20, top: int = 30) -> None:
    """cProfile of ``steps`` steps: the functions by own time, then by cumulative time."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    prof.disable()
    print(f"\n=== {name}: cProfile over {steps} steps ===")
    stats = pstats.Stats(prof).strip_dirs()
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layer", default="rmsnorm_linear", choices=["rmsnorm_linear", "linear_layernorm", "linear_rmsnorm"])
    ap.add_argument("--shape", default="65536,1024,1024")
    ap.add_argument("--cprofile", action="store_true", help="also profile the fused step's Python")
    ap.add_argument("--sync-debug", action="store_true",
                    help="report every host-device synchronisation one fused step makes")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    warnings.simplefilter("ignore", registry.ConfigFallbackWarning)
    m, k, n = parse_shape(args.shape)
    torch.manual_seed(0)
    pair = _pair(args.layer, k, n).to("cuda", torch.bfloat16)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    fused = _step(_fused(args.layer, pair), x, dy)
    if args.sync_debug:
        fused()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fused()
        torch.cuda.set_sync_debug_mode("default")
        syncs = [str(w.message)[:160] for w in caught if "synchroniz" in str(w.message).lower()]
        print(f"\n=== fused {args.layer}: {len(syncs)} synchronising calls in one step ===")
        for line in syncs:
            print("  " + line)
    profile(f"fused {args.layer} {args.shape}", fused)
    if args.cprofile:
        python_profile(f"fused {args.layer} {args.shape}", fused)
    profile(f"compiled pair {args.layer} {args.shape}", _step(torch.compile(pair), x, dy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
