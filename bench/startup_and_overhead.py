"""Start-up time and per-call host overhead of the public ops, in fresh processes.

Compares this checkout's package with another copy of it (``--baseline``: a checkout or an
unpacked older version, the folder holding its ``helion_kernels/``), on a CUDA GPU:

* start-up: ``import torch``; ``import helion_kernels`` on top of it; the first call of
  ``rmsnorm_matmul`` at a tuned shape (65536x1024x1024 bf16: registry lookup, kernel
  compilation, launch) and the second; and, in a second process, the same with ``import
  helion`` done explicitly first, which tells how much of the first call is Helion's own
  import. Every process gets empty Triton and inductor caches, so compilation is cold.
* host overhead: the host time of one eager call (the mean of 500 back-to-back calls, no
  synchronisation inside the loop, median of 7 rounds) at shapes small enough that the GPU
  is never the bottleneck, for the package's eager path and, for this checkout, also through
  the ``torch.ops.helion_kernels`` custom op (the path a compiled graph takes).

    python bench/startup_and_overhead.py --baseline ../old-checkout [--out DIR]

Writes ``startup_and_overhead.{csv,md,json}`` to ``bench/results/<gpu>/`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent


def _child_startup(mode: str) -> dict:
    """``startup``: the user's sequence; ``helion_first``: ``import helion`` before the
    package; ``helion_after_cuda``: ``import helion`` timed on its own just before the first
    call (after CUDA is initialised), which splits the first call into Helion's import and
    the rest."""
    t0 = time.perf_counter()
    import torch

    t1 = time.perf_counter()
    out = {"import_torch_s": t1 - t0}
    if mode == "helion_first":
        import helion  # noqa: F401

        out["import_helion_s"] = time.perf_counter() - t1
        t1 = time.perf_counter()
    import helion_kernels as hk

    t2 = time.perf_counter()
    out["import_helion_kernels_s"] = t2 - t1
    out["helion_imported_by_package_import"] = mode != "helion_first" and "helion" in sys.modules
    a = torch.randn(65536, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16) / 32
    torch.cuda.synchronize()
    if mode == "helion_after_cuda":
        t = time.perf_counter()
        import helion  # noqa: F401, F811

        out["import_helion_s"] = time.perf_counter() - t
    t3 = time.perf_counter()
    hk.rmsnorm_matmul(a, b)
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    hk.rmsnorm_matmul(a, b)
    torch.cuda.synchronize()
    out.update(first_call_s=t4 - t3, second_call_s=time.perf_counter() - t4)
    return out


def _overhead_cases(hk, torch):
    """(name, eager call, custom-op call or None): shapes where the GPU is never the bottleneck."""
    dev, bf16 = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device=dev, generator=gen) * scale).to(bf16)

    a64, b64 = rand(65536, 64), rand(64, 64, scale=0.125)
    w, bias = rand(64), rand(64)
    a256, b256 = rand(4096, 256), rand(256, 256, scale=1 / 16)
    q = rand(40, 2, 64)
    k, v = rand(32, 2, 64, scale=0.125), rand(32, 2, 64)
    qo = torch.tensor([0, 17, 40], device=dev)
    ko = torch.tensor([0, 16, 32], device=dev)
    ops = getattr(torch.ops, "helion_kernels", None)
    has_ops = ops is not None and hasattr(ops, "matmul")
    return [
        ("matmul_layernorm 65536x64x64 (fused)", lambda: hk.matmul_layernorm(a64, b64, w, bias),
         (lambda: ops.matmul_layernorm(a64, b64, w, bias, 1e-5, False, None)) if has_ops else None),
        ("matmul 4096x256x256", lambda: hk.matmul(a256, b256),
         (lambda: ops.matmul(a256, b256)) if has_ops else None),
        ("rmsnorm_matmul 4096x256x256", lambda: hk.rmsnorm_matmul(a256, b256),
         (lambda: ops.rmsnorm_matmul(a256, b256, 1e-5)) if has_ops else None),
        ("flash_norm_attention B2 H2 D64 (validate=False)",
         lambda: hk.flash_norm_attention(q, k, v, qo, ko, 23, 16, validate=False),
         (lambda: ops.flash_norm_attention(q, k, v, qo, ko, 23, 16, None, None, None, 1e-5, "fast_gelu", 1.0,
                                           False)) if has_ops else None),
    ]


def _host_us(torch, fn, calls: int = 500, rounds: int = 15) -> tuple[float, float]:
    """Median over rounds of (host microseconds per call, wall microseconds per call incl.
    the final synchronisation)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    host, wall = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) / calls * 1e6)
        wall.append((t2 - t0) / calls * 1e6)
    return statistics.median(host), statistics.median(wall)


def _child_overhead() -> dict:
    import warnings

    import torch

    import helion_kernels as hk

    warnings.simplefilter("ignore")  # untuned shapes warn once; not what is measured
    out = {}
    for name, eager, op in _overhead_cases(hk, torch):
        out[name] = {"eager": _host_us(torch, eager)}
        if op is not None:
            out[name]["custom_op"] = _host_us(torch, op)
    return out


def _run_child(package_root: Path, mode: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(package_root), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    with tempfile.TemporaryDirectory() as cache:
        env["TRITON_CACHE_DIR"] = str(Path(cache) / "triton")
        env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(cache) / "inductor")
        run = subprocess.run([sys.executable, __file__, "--child", mode], env=env, capture_output=True,
                             text=True, cwd=package_root)
    if run.returncode != 0:
        raise RuntimeError(f"{mode} child failed for {package_root}:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def _cli_help_seconds(package_root: Path) -> float:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(package_root), os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "helion_kernels", "--help"], env=env, check=True, capture_output=True,
                   cwd=package_root)
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", type=Path, help="folder holding the other helion_kernels/ (required)")
    p.add_argument("--out", type=Path, default=None, help="default: bench/results/<gpu>/")
    p.add_argument("--child", choices=["startup", "helion_first", "helion_after_cuda", "overhead"],
                   help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        result = _child_overhead() if args.child == "overhead" else _child_startup(args.child)
        print(json.dumps(result))
        return 0
    if args.baseline is None:
        p.error("--baseline is required")

    import pandas as pd
    import torch

    from helion_kernels import registry
    from helion_kernels.tuning import versions

    packages = {"this checkout": CHECKOUT, "baseline": args.baseline.resolve()}
    rows, raw = [], {label: {} for label in packages}

    def add(label: str, measure: str, value: float) -> None:
        rows.append({"package": label, "measure": measure, "value": value})

    for label, root in packages.items():
        for mode in ("startup", "helion_first", "helion_after_cuda"):
            raw[label][mode] = _run_child(root, mode)
        startup = raw[label]["startup"]
        add(label, "import torch (s)", startup["import_torch_s"])
        add(label, "import helion_kernels after torch (s)", startup["import_helion_kernels_s"])
        add(label, "helion-kernels --help, whole process (s)", _cli_help_seconds(root))
        add(label, "first call, rmsnorm_matmul 65536x1024x1024 (s)", startup["first_call_s"])
        add(label, "second call (s)", startup["second_call_s"])
        add(label, "[process 2] import helion before helion_kernels (s)", raw[label]["helion_first"]["import_helion_s"])
        add(label, "[process 2] first call (s)", raw[label]["helion_first"]["first_call_s"])
        add(label, "[process 3] import helion after CUDA init, just before the first call (s)",
            raw[label]["helion_after_cuda"]["import_helion_s"])
        add(label, "[process 3] first call (s)", raw[label]["helion_after_cuda"]["first_call_s"])
    # Host overhead: two processes per package, interleaved, so drift hits both alike.
    for rep in range(2):
        for label, root in packages.items():
            raw[label][f"overhead_{rep}"] = _run_child(root, "overhead")
    for label in packages:
        for case in raw[label]["overhead_0"]:
            for path in raw[label]["overhead_0"][case]:
                per_process = [raw[label][f"overhead_{rep}"][case][path] for rep in range(2)]
                add(label, f"host us per call: {case}, {path}", statistics.mean(h for h, _ in per_process))
                add(label, f"wall us per call: {case}, {path}", statistics.mean(w for _, w in per_process))
    long = pd.DataFrame(rows)
    df = long.pivot(index="measure", columns="package", values="value").reindex(long["measure"].unique())
    df = df[list(packages)].reset_index()
    device = torch.device("cuda")
    out_dir = args.out or CHECKOUT / "bench" / "results" / registry.gpu_key(device)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(device), "versions": versions(),
            "command": f"python bench/startup_and_overhead.py --baseline {args.baseline}",
            "baseline": str(args.baseline), "raw": raw,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    df.to_csv(out_dir / "startup_and_overhead.csv", index=False, float_format="%.4g")
    head = [f"# Start-up and per-call host overhead on {meta['gpu']}", "",
            f"- command: `{meta['command']}` (baseline: the package before it became custom ops)",
            f"- date: {meta['date']}",
            f"- versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}",
            "- fresh process per start-up measurement, empty Triton and inductor caches (cold compile);",
            "  host us per call: mean of 500 back-to-back eager calls without synchronisation, median of",
            "  15 rounds, averaged over two processes per package run interleaved; wall us: the same loop",
            "  including the final synchronisation; `custom_op`: through torch.ops.helion_kernels (the",
            "  path a compiled graph takes), `eager`: the public function as a user calls it", ""]
    (out_dir / "startup_and_overhead.md").write_text(
        "\n".join(head) + "\n" + df.to_markdown(index=False, floatfmt=".4g") + "\n")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"wrote {out_dir}/startup_and_overhead.{{csv,md,json}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
