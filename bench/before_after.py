"""One headline row per technique, timed with this checkout's package and with another's, on
one GPU: evidence that a refactor moved no kernel.

Each row's kernel runs through the package's own launch path (``runtime.launch``: the
registry's config for the shape, as an op's fused path runs it) on fresh random inputs,
checked against the fp32 reference, and is timed by CUDA-graph replay (median, input sets
rotated past L2). Processes alternate between the two packages (``--repeats`` each), and a
row's time is the median over its processes.

    python bench/before_after.py --baseline DIR [--repeats 3] [--out DIR]

``DIR`` holds the other package (its ``helion_kernels/`` and ``configs/``, e.g. ``git
archive <commit> helion_kernels configs``; a ``COMMIT`` file there names its commit). Writes
``before_after.{csv,md}`` (or ``--stem``) to ``bench/results/<gpu>/`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

CHECKOUT = Path(__file__).resolve().parent.parent
ROWS = [  # (kernel, workload kind, the row)
    ("matmul", "gemm", (65536, 1024, 1024)),
    ("rmsnorm_matmul", "gemm", (65536, 1024, 1024)),
    ("rmsnorm_matmul_given_rstd", "gemm", (65536, 1024, 1024)),
    ("rmsnorm_matmul_backward", "gemm", (65536, 1024, 1024)),
    ("matmul_layernorm", "gemm", (65536, 128, 128)),
    ("matmul_rmsnorm", "gemm", (65536, 128, 128)),
    ("matmul_layernorm_split_n", "gemm", (262144, 1024, 1024)),
    ("matmul_rmsnorm_split_n", "gemm", (262144, 1024, 1024)),
    ("matmul_rmsnorm_matmul", "gemm", (262144, 512, 2048)),
    ("flash_norm_attention", "attention", (768, 2, 128, 1024, 128, 0.5, 0)),
    ("flash_norm_attention", "attention", (768, 8, 128, 1024, 128, 0.5, 0)),
    ("flash_norm_attention", "attention", (768, 8, 128, 3000, 128, 0.5, 0)),
]


def row_label(name: str, kind: str, row: tuple) -> str:
    return f"{name} " + ("x".join(map(str, row[:3])) if kind == "gemm" else f"H{row[1]} q<={row[3]}")


def _child(rows: list) -> dict:
    """This process's package: per row, (rel. error, ms)."""
    import warnings

    warnings.simplefilter("ignore")
    import torch

    from helion_kernels import runtime
    from helion_kernels.spec import AttentionRow, Shape
    from helion_kernels.timing import input_copies, time_ms
    from helion_kernels.verify import check_outputs

    import importlib

    import helion_kernels

    new = (Path(helion_kernels.__file__).parent / "techniques").is_dir()  # else the layout before techniques/
    get_spec = importlib.import_module("helion_kernels.techniques" if new else "helion_kernels.kernels").get_spec
    out = {}
    device = torch.device("cuda")
    for name, kind, row in rows:
        label = row_label(name, kind, row)
        try:
            spec = get_spec(name)
            problem = Shape(*row) if kind == "gemm" else AttentionRow(*row)
            first = spec.make_args(problem, torch.bfloat16, device, 0)
            per_set = sum(t.numel() * t.element_size() for t in first if isinstance(t, torch.Tensor))
            sets = [first] + [spec.make_args(problem, torch.bfloat16, device, s)
                              for s in range(1, input_copies(per_set, device))]
            got = runtime.launch(spec, first)
            got = got if isinstance(got, tuple) else (got,)
            if spec.compare_outputs is not None:
                got = spec.compare_outputs(got)
            error = check_outputs(got, spec.reference(*first), torch.bfloat16)
            ms = time_ms([lambda a=a: runtime.launch(spec, a) for a in sets])
            out[label] = {"rel_error": error, "ms": ms, "config": runtime.resolved_config(spec, first).source}
        except Exception as err:  # one row failing leaves the others
            out[label] = {"error": f"{type(err).__name__}: {err}"[:300]}
        print(label, out[label], file=sys.stderr, flush=True)
    return out


def _run(folder: Path, kernels: list[str]) -> dict:
    code = (f"import sys, json; sys.path.insert(0, {str(folder)!r}); sys.path.insert(1, {str(CHECKOUT / 'bench')!r}); "
            f"import before_after; rows = [r for r in before_after.ROWS if r[0] in {kernels!r}]; "
            f"print(json.dumps(before_after._child(rows)))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))},
                          capture_output=True, text=True, cwd=folder)
    sys.stderr.write(done.stderr[-3000:])
    if done.returncode != 0:
        raise RuntimeError(f"the child for {folder} failed")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _commit(folder: Path) -> str:
    done = subprocess.run(["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    stamp = folder / "COMMIT"
    if stamp.is_file():
        return stamp.read_text().strip()[:7]
    return done.stdout.strip() or "?"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the folder holding the other package")
    parser.add_argument("--repeats", type=int, default=3, help="processes per package, alternating")
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results/<gpu>/")
    names = list(dict.fromkeys(name for name, *_ in ROWS))
    parser.add_argument("--kernels", nargs="+", default=names, choices=names,
                        help="the kernels whose rows to time (default: all)")
    parser.add_argument("--stem", default="before_after", help="the table's file name (default before_after)")
    args = parser.parse_args(argv)
    import torch

    from helion_kernels import registry

    packages = {"after": CHECKOUT, "before": args.baseline.resolve()}
    runs: dict[str, list[dict]] = {label: [] for label in packages}
    for _ in range(args.repeats):
        for label, folder in packages.items():
            runs[label].append(_run(folder, args.kernels))
    rows = []
    for name, kind, row in (r for r in ROWS if r[0] in args.kernels):
        key = row_label(name, kind, row)
        out = {"kernel": name, "row": key.split(" ", 1)[1]}
        for label in packages:
            got = [r[key] for r in runs[label]]
            times = [g["ms"] for g in got if "ms" in g]
            out[f"{label}_ms"] = statistics.median(times) if times else float("nan")
            out[f"{label}_rel_error"] = max((g["rel_error"] for g in got if "rel_error" in g), default=float("nan"))
            out[f"{label}_config"] = next((g["config"] for g in got if "config" in g), "")
            errors = [g["error"] for g in got if "error" in g]
            if errors:
                out[f"{label}_error"] = errors[0]
        out["after_over_before"] = out["after_ms"] / out["before_ms"]
        rows.append(out)
    df = pd.DataFrame(rows)
    gpu = registry.gpu_key(torch.device("cuda"))
    dest = args.out or CHECKOUT / "bench" / "results" / gpu
    dest.mkdir(parents=True, exist_ok=True)
    df.to_csv(dest / f"{args.stem}.csv", index=False, float_format="%.5g")
    text = "\n".join([
        f"# One row per technique, before and after, on {torch.cuda.get_device_name()}", "",
        f"- command: `python bench/before_after.py --baseline <the package of {_commit(args.baseline)}> "
        f"--repeats {args.repeats}" + ("" if len(args.kernels) == len(names) else " --kernels " + " ".join(args.kernels))
        + ("" if args.stem == "before_after" else f" --stem {args.stem}") + "`",
        f"- date: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}; after: {_commit(CHECKOUT)}, before: "
        f"{_commit(args.baseline)}",
        "- timer: CUDA-graph replay (do_bench_cudagraph), median, input sets rotated to >= 4x L2; each package in "
        f"{args.repeats} processes, alternating; a row's time is the median over its processes",
        "- each kernel through `runtime.launch` with the registry's config for the shape (`config`: exact, or "
        "nearest where this GPU has no entry of its own), bf16, checked against the fp32 reference", "",
        df.to_markdown(index=False, floatfmt=".4g"), ""])
    (dest / f"{args.stem}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
