"""Host time of one call of every public op, with the GPU kernel launch stubbed out (CPU).

What a call costs on the host before the kernel runs, split in two:

* ``package_us``: the package's own Python (checks, custom-op or autograd bypass, the
  fused-or-unfused decision, argument preparation), with the package's hand-over to Helion
  (``runtime.launch`` / ``runtime.launch_kernel``) replaced by returning outputs made once;
* ``total_us``: everything up to the launch, Helion's binding and the generated host code
  (output allocation, grid) included, with only Triton's launch replaced by a no-op.

Each op is called at a small shape as a user calls it (``path = eager``: the public
function, no autograd) and through its ``torch.ops.helion_kernels`` custom op (``path =
custom_op``: what a compiled graph calls). Every op runs its fused kernel by the registry's
decision: a temporary user registry holds a "fused" entry for each shape on this machine's
registry key. CPU tensors pass the device check under ``TRITON_INTERPRET=1``; nothing runs
on a GPU and nothing is interpreted (the launch is stubbed). Mean of ``--calls`` back-to-back
calls, median of ``--rounds`` rounds, one fresh process per package.

    python bench/host_overhead.py [--baseline DIR] [--out bench/results/cpu]

``--baseline DIR``: also measure the package in DIR (a checkout of another commit, the
folder holding its ``helion_kernels/``), in a process of its own. Writes
``host_overhead.{csv,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

CHECKOUT = Path(__file__).resolve().parent.parent


def _cases(hk, torch, device: str = "cpu"):
    """(op, shape key for the registry entry, eager call, custom-op call)."""
    bf16 = torch.bfloat16
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=bf16)

    a, b, c = rand(256, 64), rand(64, 128), rand(128, 64)
    w128, bias128 = rand(128), rand(128)
    rstd = (torch.rand(256) + 0.5).to(device)
    q, k, v = rand(40, 2, 64), rand(32, 2, 64), rand(32, 2, 64)
    qo, ko = torch.tensor([0, 17, 40], device=device), torch.tensor([0, 16, 32], device=device)
    w64, bias64, r = rand(64), rand(64), rand(256, 64)
    mean = torch.randn(256, generator=gen).to(device)
    ops = torch.ops.helion_kernels
    gemm = (256, 64, 128)
    prenorm = [  # the pre-norm ops of 2026-12-07 (absent from an older package: left out there)
        ("layernorm_matmul", "layernorm_matmul", gemm, lambda: hk.layernorm_matmul(a, b, w64, bias64),
         lambda: ops.layernorm_matmul(a, b, None, 1e-5, None)),
        ("layernorm_matmul(mean=, rstd=)", "layernorm_matmul_given_stats", gemm,
         lambda: hk.layernorm_matmul(a, b, w64, bias64, mean=mean, rstd=rstd),
         lambda: ops.layernorm_matmul_given_stats(a, b, None, mean, rstd, None)),
        ("add_rmsnorm_matmul", "rmsnorm_matmul_given_rstd", gemm, lambda: hk.add_rmsnorm_matmul(a, r, b, w64),
         lambda: ops.add_norm_matmul(a, r, b, w64, None, 1e-5, 0, None)),
        ("add_layernorm_matmul", "layernorm_matmul_given_stats", gemm,
         lambda: hk.add_layernorm_matmul(a, r, b, w64, bias64),
         lambda: ops.add_norm_matmul(a, r, b, w64, bias64, 1e-5, 1, None)),
    ] if hasattr(hk, "add_layernorm_matmul") else []
    return prenorm + [
        ("matmul", "matmul", gemm, lambda: hk.matmul(a, b), lambda: ops.matmul(a, b)),
        ("rmsnorm_matmul", "rmsnorm_matmul", gemm, lambda: hk.rmsnorm_matmul(a, b),
         lambda: ops.rmsnorm_matmul(a, b, 1e-5, None)),
        ("rmsnorm_matmul(rstd=)", "rmsnorm_matmul_given_rstd", gemm, lambda: hk.rmsnorm_matmul(a, b, rstd=rstd),
         lambda: ops.rmsnorm_matmul_given_rstd(a, b, rstd, None)),
        ("matmul_layernorm", "matmul_layernorm", gemm, lambda: hk.matmul_layernorm(a, b, w128, bias128),
         lambda: ops.matmul_layernorm(a, b, w128, bias128, 1e-5, False, None, False, None, None)),
        ("matmul_rmsnorm", "matmul_rmsnorm", gemm, lambda: hk.matmul_rmsnorm(a, b, w128),
         lambda: ops.matmul_rmsnorm(a, b, w128, 1e-5, False, None, False, None, None)),
        ("matmul_layernorm_split_n", "matmul_layernorm_split_n", gemm,
         lambda: hk.matmul_layernorm_split_n(a, b, w128, bias128),
         lambda: ops.matmul_layernorm_split_n(a, b, w128, bias128, 1e-5, None)),
        ("matmul_rmsnorm_split_n", "matmul_rmsnorm_split_n", gemm, lambda: hk.matmul_rmsnorm_split_n(a, b, w128),
         lambda: ops.matmul_rmsnorm_split_n(a, b, w128, 1e-5, None)),
        ("matmul_rmsnorm_matmul", "matmul_rmsnorm_matmul", gemm, lambda: hk.matmul_rmsnorm_matmul(a, b, c),
         lambda: ops.matmul_rmsnorm_matmul(a, b, c, 1e-5, None)),
        ("gdpa", None, None, lambda: hk.gdpa(q, k, v, qo, ko, 23, 16, validate=False),
         lambda: ops.gdpa(q, k, v, qo, ko, 23, 16, "fast_gelu", 1.0, False)),
        ("flash_norm_attention", "flash_norm_attention", (2, 64),
         lambda: hk.flash_norm_attention(q, k, v, qo, ko, 23, 16, validate=False),
         lambda: ops.flash_norm_attention(q, k, v, qo, ko, 23, 16, None, None, None, 1e-5, "fast_gelu", 1.0, False,
                                          False)),
    ]


def _get_spec(name: str):
    import importlib

    import helion_kernels

    new = (Path(helion_kernels.__file__).parent / "techniques").is_dir()  # else the layout before techniques/
    return importlib.import_module("helion_kernels.techniques" if new else "helion_kernels.kernels").get_spec(name)


def _fused_registry(folder: Path, cases, gpu: str = "cpu") -> None:
    """A user registry with a "fused" entry on ``gpu``'s registry key for each case's shape
    (the spec's default config, which generates code for any shape)."""

    done = set()
    for _, kernel, key, *_ in cases:
        if kernel is None or (kernel, key) in done:  # two ops deciding by one spec at one shape: one entry
            continue
        done.add((kernel, key))
        spec = _get_spec(kernel)
        fields = ("M", "K", "N") if len(key) == 3 else ("H", "D")
        config = json.loads(spec.default_config.to_json())
        entry = {**dict(zip(fields, key)), "dtype": "bfloat16", "config": config,
                 "dispatch": {"choice": "fused", "fused_ms": 1.0, "unfused_ms": 2.0,
                              "unfused": spec.dispatch_baseline, "margin": 1.02}}
        path = folder / gpu / f"{kernel}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.loads(path.read_text()) if path.exists() else {"format": 1, "kernel": kernel, "gpu": gpu,
                                                                   "entries": []}
        data["entries"].append(entry)
        path.write_text(json.dumps(data))


def _per_call_us(fn, calls: int, rounds: int) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(rounds):  # this process's CPU time: other processes on the machine do not count
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        times.append((time.process_time() - t0) / calls * 1e6)
    return statistics.median(times)


def _child(calls: int, rounds: int) -> dict:
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ.pop("HELION_INTERPRET", None)
    folder = Path(tempfile.mkdtemp())
    os.environ["HELION_KERNELS_CONFIG_DIR"] = str(folder)
    import warnings

    warnings.simplefilter("ignore")
    import helion.runtime
    import torch

    def no_launch(*args, **kwargs):  # the Triton launch, stubbed
        return None

    helion.runtime.default_launcher = no_launch  # what generated host code imports
    import helion_kernels as hk
    from helion_kernels import runtime

    cases = _cases(hk, torch)
    _fused_registry(folder, cases)
    out = {}
    for name, _, _, eager, custom in cases:
        for path, fn in (("eager", eager), ("custom_op", custom)):
            out[(name, path)] = {"total_us": _per_call_us(fn, calls, rounds)}
    # package_us: the hand-over to Helion returns the outputs it gave before
    launch, launch_kernel = runtime.launch, runtime.launch_kernel
    made: dict = {}

    def remembered(real):  # one launch per spec or kernel: each case calls its own, at one shape
        def stub(first, args, *rest):
            out = made.get(id(first))
            if out is None:
                out = made[id(first)] = real(first, args, *rest)
            return out
        return stub

    runtime.launch, runtime.launch_kernel = remembered(launch), remembered(launch_kernel)
    for name, _, _, eager, custom in cases:
        for path, fn in (("eager", eager), ("custom_op", custom)):
            out[(name, path)]["package_us"] = _per_call_us(fn, calls, rounds)
    return {f"{name}|{path}": value for (name, path), value in out.items()}


def _host_us(torch, fn, calls: int, rounds: int) -> dict:
    """Median over rounds of host microseconds per call (``calls`` back-to-back calls, no
    synchronisation inside the loop) and wall microseconds (the final synchronisation included)."""
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
        host.append((t1 - t0) / calls * 1e6)
        wall.append((time.perf_counter() - t0) / calls * 1e6)
    return {"host_us": statistics.median(host), "wall_us": statistics.median(wall)}


def _modules(hk) -> list:
    """(norm + Linear module, where its norm sits: "post", "pre" or "add" (after a residual add))."""
    modules = [(hk.LinearLayerNorm, "post"), (hk.LinearRMSNorm, "post"), (hk.RMSNormLinear, "pre")]
    if hasattr(hk, "AddLayerNormLinear"):  # the 2026-12-07 pre-norm modules
        modules += [(hk.LayerNormLinear, "pre"), (hk.AddRMSNormLinear, "add"), (hk.AddLayerNormLinear, "add")]
    return modules


def _training_cases(hk, torch, device: str = "cuda"):
    """(module, one fused training step, one step of the compiled PyTorch pair): M = 1024
    tokens, K = N = 256, bf16, parameters' gradients only."""
    from torch import nn

    x = torch.randn(8, 128, 256, device=device, dtype=torch.bfloat16)
    out = []
    residual = torch.randn_like(x)
    for cls, kind in _modules(hk):
        module = cls(256, 256).to(device=device, dtype=torch.bfloat16)
        if kind == "add":  # the block the module replaces: y = linear(norm(x + residual)), h = x + residual
            def block(x, residual, norm=module.norm, linear=module.linear):
                h = x + residual
                return linear(norm(h)), h
            compiled = torch.compile(block)
        else:
            layers = (module.norm, module.linear) if kind == "pre" else (module.linear, module.norm)
            compiled = torch.compile(nn.Sequential(*layers))

        def step(m, kind=kind):
            if kind == "add":
                return lambda: m(x, residual)[0].float().sum().backward()  # y only: h needs no gradient here
            return lambda: m(x).float().sum().backward()
        out.append((cls.__name__, step(module), step(compiled)))
    return out


def _child_gpu(calls: int, rounds: int) -> dict:
    """Whole calls on the GPU: each op eager, through its custom op and inside a compiled
    function, beside ``torch.mm`` and the kernel's generated host function called directly;
    the modules' training steps beside the compiled pair."""
    import warnings

    warnings.simplefilter("ignore")
    folder = Path(tempfile.mkdtemp())
    os.environ["HELION_KERNELS_CONFIG_DIR"] = str(folder)
    import torch

    import helion_kernels as hk
    from helion_kernels import registry, runtime

    cases = _cases(hk, torch, "cuda")
    _fused_registry(folder, cases, registry.gpu_key(torch.device("cuda")))
    out = {}
    for name, _, _, eager, custom in cases:
        paths = {"eager": eager, "custom_op": custom}
        try:
            compiled = torch.compile(eager, fullgraph=True)
            compiled()
            paths["compiled"] = compiled
        except Exception as err:  # recorded, the rest goes on
            out[f"{name}|compiled"] = {"host_us": float("nan"), "wall_us": float("nan"),
                                       "note": f"{type(err).__name__}: {err}"[:160]}
        for path, fn in paths.items():
            out[f"{name}|{path}"] = _host_us(torch, fn, calls, rounds)
        launches = getattr(runtime, "_LAUNCHES", None)
        if launches:  # the generated host function of the op's last launch, called directly
            seen = []
            real = runtime.launch
            runtime.launch = lambda spec, args: seen.append((spec, args)) or real(spec, args)
            eager()
            runtime.launch = real
            if seen:
                spec, args = seen[-1]
                hit = launches.get(runtime._signature(spec.name, args))
                if hit is not None:
                    out[f"{name}|host_function"] = _host_us(torch, lambda: hit.run(*args), calls, rounds)
    a, b = torch.randn(256, 64, device="cuda", dtype=torch.bfloat16), torch.randn(64, 128, device="cuda",
                                                                                  dtype=torch.bfloat16)
    out["torch.mm 256x64x128|eager"] = _host_us(torch, lambda: torch.mm(a, b), calls, rounds)
    for module, fused, pair in _training_cases(hk, torch):
        out[f"{module} step 1024x256x256|module"] = _host_us(torch, fused, max(calls // 10, 20), rounds)
        out[f"{module} step 1024x256x256|compiled_pair"] = _host_us(torch, pair, max(calls // 10, 20), rounds)
    return out


def _run_child(folder: Path, calls: int, rounds: int, gpu: bool = False) -> dict:
    child = "_child_gpu" if gpu else "_child"
    code = (f"import sys, json; sys.path.insert(0, {str(folder)!r}); sys.path.insert(1, {str(CHECKOUT / 'bench')!r}); "
            f"import host_overhead; print(json.dumps(host_overhead.{child}({calls}, {rounds})))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=folder)
    if done.returncode != 0:
        raise RuntimeError(f"child for {folder} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _commit(folder: Path) -> str:
    stamp = folder / "COMMIT"  # an exported tree (git archive) records its commit here; it may sit in another repo
    if stamp.is_file():
        return stamp.read_text().strip()[:7]
    done = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "?"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="another checkout to measure beside this one")
    parser.add_argument("--out", type=Path, default=None,
                        help="default: bench/results/cpu (CPU) or bench/results/<gpu> (--gpu)")
    parser.add_argument("--gpu", action="store_true", help="whole calls on the CUDA GPU, nothing stubbed")
    parser.add_argument("--calls", type=int, default=None, help="calls per round (default 1000 on CPU, 200 on GPU)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--processes", type=int, default=2, help="processes per package, averaged")
    args = parser.parse_args(argv)
    calls = args.calls or (200 if args.gpu else 1000)
    runs = {"this checkout": CHECKOUT}
    if args.baseline is not None:
        runs["baseline"] = args.baseline.resolve()
    rows = []
    for _ in range(args.processes):  # the packages' processes interleaved, the machine's drift shared
        for label, folder in runs.items():
            for key, value in _run_child(folder, calls, args.rounds, args.gpu).items():
                op, path = key.split("|")
                rows.append({"op": op, "path": path, "package": label, "commit": _commit(folder), **value})
    values = ["host_us", "wall_us"] if args.gpu else ["package_us", "total_us"]
    df = (pd.DataFrame(rows).groupby(["op", "path", "package", "commit"], sort=False)[values]
          .mean().round(2).reset_index())
    gpu_name = ""
    if args.gpu:
        import torch

        from helion_kernels import registry

        gpu_name = torch.cuda.get_device_name()
        out = args.out or CHECKOUT / "bench" / "results" / registry.gpu_key(torch.device("cuda"))
    else:
        out = args.out or CHECKOUT / "bench" / "results" / "cpu"
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "host_overhead.csv", index=False)
    wide = df.pivot_table(index=["op", "path"], columns="package", values=values, sort=False)
    wide.columns = [f"{what} ({label})" for what, label in wide.columns]
    wide = wide.reset_index()
    command = "python bench/host_overhead.py" + (" --gpu" if args.gpu else "") + (
        f" --baseline <checkout of {_commit(args.baseline)}>" if args.baseline else "")
    if args.gpu:
        title = f"# Host time per eager call on {gpu_name}"
        how = [f"- machine: {gpu_name}, {os.cpu_count()} CPU cores; host time per call: mean of {calls} back-to-back "
               f"calls without synchronisation (training steps: {max(calls // 10, 20)}), median of {args.rounds} "
               f"rounds, mean of {args.processes} processes per package (interleaved); `wall_us` includes the final "
               "synchronisation",
               "- every op on its fused kernel (a temporary registry entry at the shape, the spec's default config); "
               "`eager`: the public function; `custom_op`: torch.ops.helion_kernels; `compiled`: inside "
               "torch.compile(fullgraph=True); `host_function`: the kernel's generated host code called directly "
               "(output allocation + Triton's launch), the floor a wrapper can reach",
               "- aims (issue): a whole eager op call <= 30 us; a module training step's host time <= 1.2x the "
               "compiled pair's"]
    else:
        title = "# Host time per call, the GPU launch stubbed (CPU)"
        how = [f"- machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
               f"CPU time per call: mean of {calls} calls, median of {args.rounds} rounds, mean of "
               f"{args.processes} processes per package (interleaved)",
               "- `package_us`: the package's own Python (its hand-over to Helion stubbed); `total_us`: everything up "
               "to Triton's launch (stubbed), Helion's binding and generated host code included; the add ops' "
               "figures include their compiled add + statistics pass, which runs here on the CPU (on a GPU: one "
               "launch)",
               "- aim (issue): `package_us` <= 10 us for every op; on a GPU a whole eager call <= 30 us"]
    text = "\n".join([
        title, "",
        f"- command: `{command}`",
        f"- date: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}; commits: "
        + ", ".join(f"{label} {_commit(folder)}" for label, folder in runs.items()),
        *how, "",
        wide.round(1).to_markdown(index=False), ""])
    (out / "host_overhead.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
