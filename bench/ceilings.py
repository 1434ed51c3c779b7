"""The device's copy and bf16 GEMM ceilings, measured so that the byte floor is honest.

A floor computed at a low copy figure flatters the kernel it judges: one ``copy_`` of 1 GiB
timed by ``do_bench_cudagraph`` reads lower than what a compiled norm reaches on the same
card. Here every method and size is timed by CUDA-graph replay (a graph of ``--copies``
back-to-back launches, replayed ``--replays`` times, the median per launch), bytes read and
written both counted, and the best kept:

* ``torch_copy``: ``dst.copy_(src)``;
* ``triton_copy``: a plain Triton copy kernel (16-byte vectors, 8 warps);
* ``compiled_scale``: ``torch.compile`` of ``x * 2`` (what inductor's elementwise passes reach).

The GEMM ceiling: cuBLAS ``a @ b`` in bf16 at 8192^3 and 16384x8192x8192 on random data.

    python bench/ceilings.py [--out DIR]

Writes ``ceilings.{csv,md}`` to ``bench/results/<gpu>/`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent.parent


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(dst + offsets, tl.load(src + offsets, mask=mask), mask=mask)


def _triton_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    block = 8192
    _copy_kernel[(triton.cdiv(src.numel(), block),)](src, dst, src.numel(), BLOCK=block, num_warps=8)


def graph_ms(fn, copies: int, replays: int) -> float:
    """Median ms per call of ``fn``: a CUDA graph of ``copies`` calls, replayed ``replays`` times."""
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(copies):
                fn()
    torch.cuda.synchronize()
    graph.replay()  # warm
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / copies)
    return statistics.median(times)


def copy_rows(copies: int, replays: int) -> list[dict]:
    rows = []
    scale = torch.compile(lambda x: x * 2)
    for mib in (256, 1024, 4096):
        n = mib * 2**20 // 4
        src = torch.randn(n, device="cuda")
        dst = torch.empty_like(src)
        methods = {"torch_copy": lambda: dst.copy_(src), "triton_copy": lambda: _triton_copy(src, dst),
                   "compiled_scale": lambda: scale(src)}
        for name, fn in methods.items():
            try:
                ms = graph_ms(fn, copies, replays)
            except Exception as err:  # one method failing leaves the others
                rows.append({"kind": "copy", "method": name, "size": f"{mib} MiB", "ms": float("nan"),
                             "rate": float("nan"), "note": f"{type(err).__name__}: {err}"[:120]})
                continue
            rows.append({"kind": "copy", "method": name, "size": f"{mib} MiB", "ms": ms,
                         "rate": 2 * n * 4 / (ms * 1e-3) / 1e9, "note": ""})
        del src, dst
        torch.cuda.empty_cache()
    return rows


def gemm_rows(replays: int) -> list[dict]:
    rows = []
    for m, k, n in ((8192, 8192, 8192), (16384, 8192, 8192)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        ms = graph_ms(lambda: torch.mm(a, b), 10, replays)
        rows.append({"kind": "bf16_gemm", "method": "cublas_mm", "size": f"{m}x{k}x{n}", "ms": ms,
                     "rate": 2 * m * k * n / (ms * 1e-3) / 1e12, "note": ""})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results/<gpu>/")
    parser.add_argument("--copies", type=int, default=20)
    parser.add_argument("--replays", type=int, default=15)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    from helion_kernels import registry

    gpu = registry.gpu_key(torch.device("cuda"))
    df = pd.DataFrame(copy_rows(args.copies, args.replays) + gemm_rows(args.replays))
    best_copy = df[df.kind == "copy"]["rate"].max()
    best_gemm = df[df.kind == "bf16_gemm"]["rate"].max()
    out = args.out or ROOT / "bench" / "results" / gpu
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "ceilings.csv", index=False, float_format="%.5g")
    text = "\n".join([
        f"# Ceilings of {torch.cuda.get_device_name()}", "",
        f"- command: `python bench/ceilings.py`",
        f"- date: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}; torch {torch.__version__}, "
        f"triton {triton.__version__}",
        f"- timer: CUDA graph of {args.copies} launches (10 for the GEMM), replayed {args.replays} times, "
        "median per launch; copy rate counts bytes read + written (GB/s), GEMM rate in TFLOP/s",
        f"- **copy ceiling: {best_copy:.0f} GB/s** (best row); **bf16 GEMM ceiling: {best_gemm:.0f} TFLOP/s**", "",
        df.to_markdown(index=False, floatfmt=".4g"), ""])
    (out / "ceilings.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
