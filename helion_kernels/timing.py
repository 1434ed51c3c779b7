"""GPU timing: CUDA-graph replay, median, rotating input sets so L2 does not flatter; and the
device ceilings (copy bandwidth, bf16 GEMM rate) that every floor is computed at."""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from typing import Callable, Sequence

import torch


def time_ms(fns: Callable[[], object] | Sequence[Callable[[], object]], rep_ms: int = 50) -> float:
    """Median milliseconds per call of ``fns``, by CUDA-graph replay (``do_bench_cudagraph``:
    a graph of about ``rep_ms`` of back-to-back calls, replayed 10 times).

    Pass several callables (the same op on different input sets) to have consecutive calls
    in the graph cycle through them, so inputs are not served from a warm L2.
    """
    from triton.testing import do_bench_cudagraph

    seq = [fns] if callable(fns) else list(fns)
    for fn in seq:  # compile / autotune / allocate outside the graph capture
        fn()
    torch.cuda.synchronize()
    cycle = itertools.cycle(seq)
    return float(do_bench_cudagraph(lambda: next(cycle)(), rep=rep_ms, return_mode="median"))


def input_copies(bytes_per_set: int, device: torch.device, cap: int = 8) -> int:
    """How many input sets make the rotation at least 4x the L2 cache (1..cap)."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return max(1, min(cap, -(-4 * l2 // max(bytes_per_set, 1))))


@dataclasses.dataclass(frozen=True)
class Ceilings:
    """Device ceilings: copy bandwidth (bytes read + written, GB/s) and bf16 GEMM rate (TFLOP/s)."""

    bandwidth_gbps: float
    bf16_tflops: float


def graph_ms(fn: Callable[[], object], calls: int = 20, replays: int = 15) -> float:
    """Median ms per call of ``fn``: one CUDA graph of ``calls`` back-to-back calls, replayed
    ``replays`` times (CUDA events around each replay)."""
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    torch.cuda.synchronize()
    graph.replay()  # warm
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


COPY_SIZES_MIB = (256, 1024, 4096)
GEMM_SHAPES = ((8192, 8192, 8192), (16384, 8192, 8192))


def measure_ceilings(device: torch.device, calls: int = 20, replays: int = 15) -> tuple[Ceilings, list[dict]]:
    """The device's ceilings, the best of several methods and sizes, and every measurement
    (``kind``, ``method``, ``size``, ``ms``, ``rate``, ``note``).

    Copy (bytes read and written): ``dst.copy_(src)`` and ``torch.compile`` of ``x * 2`` (what
    an inductor elementwise pass, like the compiled norm, reaches) at :data:`COPY_SIZES_MIB`;
    one ``copy_`` timed by ``do_bench_cudagraph`` reads well below what the compiled norm
    moves. GEMM: cuBLAS bf16 ``a @ b`` at :data:`GEMM_SHAPES`. Each by :func:`graph_ms`.
    """
    rows = []
    scale = torch.compile(lambda x: x * 2)
    for mib in COPY_SIZES_MIB:
        n = mib * 2**20 // 4
        src = torch.randn(n, device=device)
        dst = torch.empty_like(src)
        for method, fn in {"torch_copy": lambda: dst.copy_(src), "compiled_scale": lambda: scale(src)}.items():
            try:
                ms = graph_ms(fn, calls, replays)
                rows.append({"kind": "copy", "method": method, "size": f"{mib} MiB", "ms": ms,
                             "rate": 2 * n * 4 / (ms * 1e-3) / 1e9, "note": ""})
            except (RuntimeError, torch.cuda.OutOfMemoryError) as err:  # one failing leaves the others
                rows.append({"kind": "copy", "method": method, "size": f"{mib} MiB", "ms": float("nan"),
                             "rate": float("nan"), "note": f"{type(err).__name__}: {err}"[:120]})
        del src, dst
        torch.cuda.empty_cache()
    for m, k, n in GEMM_SHAPES:
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        ms = graph_ms(lambda: torch.mm(a, b), 10, replays)
        rows.append({"kind": "bf16_gemm", "method": "cublas_mm", "size": f"{m}x{k}x{n}", "ms": ms,
                     "rate": 2 * m * k * n / (ms * 1e-3) / 1e12, "note": ""})
        del a, b
    best = {kind: max((r["rate"] for r in rows if r["kind"] == kind and r["rate"] == r["rate"]), default=float("nan"))
            for kind in ("copy", "bf16_gemm")}
    return Ceilings(bandwidth_gbps=best["copy"], bf16_tflops=best["bf16_gemm"]), rows
