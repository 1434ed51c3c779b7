"""The Triton code Helion generates for every shipped registry entry, saved and compared.

Evidence that a refactor of the kernels or of the code that resolves their configs leaves
what runs on the GPU unchanged: for every entry of the shipped registry (every op, GPU and
shape under ``configs/``), each call variant an op makes (optional tensors passed or not)
and each build a call can use (the static one; the dynamic-M one for untuned M), the code
of the config the runtime would resolve. Kernels outside the registry (the pinned GDPA
configs, the deferred norm's consumer on ``matmul`` entries) are included too.

    python bench/codegen_snapshot.py save DIR            # one .py per call, DIR/manifest.csv
    python bench/codegen_snapshot.py compare BEFORE AFTER --out bench/results/cpu/codegen_comparison.csv

``compare`` reads two saved folders (each written by the script of its own commit) and
writes one row per call: ``identical`` (byte for byte); ``same code`` (the same once
comments and docstrings, which cite source lines, are dropped and kernel names replaced by a
placeholder); ``same kernel`` (the ``@triton.jit`` code the same so; the host function that
allocates the outputs and launches differs, its changed lines listed); or ``differs``.
Runs on a CPU (no GPU, no interpret mode needed). Helion 1.5.0 refuses
``host_tensor_descriptors`` off a CUDA sm_90 device, so that key is dropped where it is False
(its default); entries where it is True are listed as ``gpu_only``.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

os.environ.pop("HELION_INTERPRET", None)  # code generation, not reference mode
os.environ.pop("TRITON_INTERPRET", None)

import helion  # noqa: E402
from helion.runtime.settings import RefMode  # noqa: E402

from helion_kernels import registry, runtime  # noqa: E402
from helion_kernels.techniques import CATALOG, get_spec  # noqa: E402


def _kernel(kernel, static: bool):
    """``kernel``'s function as a build that generates code off reference mode."""
    return helion.kernel(kernel.fn, static_shapes=static, ref_mode=RefMode.OFF)


def _variants(name: str, args: tuple) -> dict[str, tuple]:
    """The argument patterns the op passes to the kernel of ``name`` (from the tuning args)."""
    if name in ("matmul_layernorm", "matmul_rmsnorm"):  # (a, b, weight, bias, eps, layernorm)
        a, b = args[0], args[1]
        m, n = a.shape[0], b.shape[1]
        plain = (a, b, None, None, *args[4:6])
        addends = (b.new_empty(n), a.new_empty(m, n), a.new_empty(m, n))  # linear_bias, residual, product
        return {"affine": args, "plain": plain, "affine+addends+product": (*args, *addends),
                "plain+product": (*plain, None, None, a.new_empty(m, n))}
    if name in ("matmul_layernorm_split_n", "matmul_rmsnorm_split_n"):
        return {"affine": args, "plain": (args[0], args[1], None, None, *args[4:6])}
    if name == "flash_norm_attention":
        q = args[0]
        saved = (torch.empty_like(q), q.new_empty(3, q.shape[0], dtype=torch.float32))
        return {"forward": args, "forward+saved": (*args, *saved)}
    return {"call": args}


def _entry_config(spec, entry, args, source: str):
    """The config the runtime gives a call resolved to ``entry`` as ``source``."""
    return runtime.resolve_entry(spec, registry.Lookup(source, entry, None), args)


def calls(only=None):
    """(gpu, op, key, build, variant, kernel, args, config) for every call to snapshot
    (``only``: the ops whose names contain one of these strings)."""
    for gpu in registry.known_gpus():
        for name in sorted(CATALOG):
            if only and not any(part in name for part in only):
                continue
            spec = get_spec(name)
            entries = registry.entries_for(name, gpu)
            for (*key, dtype), entry in sorted(entries.items(), key=lambda kv: str(kv[0])):
                problem = entry.shape if spec.workload == "gemm" else _attention_row(entry.shape)
                args = spec.make_args(problem, getattr(torch, dtype), "cpu", None)
                static = spec.kernel.settings.static_shapes
                builds = [("static" if static else "dynamic", static, "exact")]
                if spec.dynamic_m:  # untuned M >= 2 runs the dynamic build on the nearest entry's config
                    builds.append(("dynamic-M", False, "nearest"))
                for variant, vargs in _variants(name, args).items():
                    for build, static, source in builds:
                        yield (gpu, name, f"{entry.shape} {dtype}", build, variant, _kernel(spec.kernel, static),
                               vargs, _entry_config(spec, entry, vargs, source))
                if name == "matmul_rmsnorm_matmul":
                    yield from _consumer(gpu, entry, args)
    if not only or any(part in "gdpa" for part in only):
        yield from _pinned()


def _attention_row(shape):
    from helion_kernels.spec import AttentionRow

    return AttentionRow(batch=2, H=shape.H, D=shape.D, max_seq_len_q=16, seq_len_kv=16, fill=0.5, seed=0)


def _consumer(gpu: str, entry, producer_args):
    """The deferred norm's second kernel at (M, N, N2 = K), on its ``matmul``-derived config."""
    from helion_kernels.techniques.deferred import kernels as deferred

    a, b = producer_args
    m, n, k = a.shape[0], b.shape[1], a.shape[1]
    x, c = a.new_empty(m, n), a.new_empty(n, k)
    partials = torch.empty(m, 8, dtype=torch.float32)
    found = registry.lookup("matmul", registry.Shape(m, n, k), entry.dtype, gpu, warn=False)
    config = deferred.consumer_config(None if found.entry is None else found.entry.config)
    yield (gpu, "matmul_rmsnorm_matmul:consumer", f"{entry.shape} {entry.dtype}", "static", "call",
           _kernel(deferred.rmsnorm_scaled_matmul_kernel, True), (x, c, partials, 1e-5), config)


def _pinned():
    """The GDPA forward and backward kernels on their default configs (the configs pinned on
    them before they had specs; what runs where the registry has no entry for them)."""
    from helion_kernels.techniques.attention import kernels as gdpa

    q = torch.empty(32, 2, 128, dtype=torch.bfloat16)
    offsets = torch.tensor([0, 16, 32])
    fwd = (q, q, q, offsets, offsets, 16, 1.0, 0)
    yield ("pinned", "gdpa", "H2xD128 bfloat16", "dynamic", "call", _kernel(gdpa.gdpa_kernel, False), fwd,
           gdpa.SPEC_GDPA.default_config)
    dq_args = (q, q, q, q, offsets, offsets, 16, 1.0, 0)
    for spec in (gdpa.SPEC_GDPA_DQ, gdpa.SPEC_GDPA_DKDV):
        yield ("pinned", spec.kernel.name, "H2xD128 bfloat16", "dynamic", "call", _kernel(spec.kernel, False),
               _dq_args(spec.kernel, dq_args), spec.default_config)


def _dq_args(kernel, args):
    import inspect

    n = len(inspect.signature(kernel.fn).parameters)
    return args[:n]


def _slug(*parts) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "_", "__".join(map(str, parts)))


def save(out: Path, only=None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows, start = [], time.time()
    for gpu, op, key, build, variant, kernel, args, config in calls(only):
        path = out / _slug(gpu, op, key, build, variant)
        path = path.with_name(path.name + ".py")
        row = {"gpu": gpu, "op": op, "key": key, "build": build, "variant": variant, "file": path.name,
               "config": repr(config)}
        try:
            bound = kernel.bind(args)
            gpu_only = bound.config_spec.unsupported_config_keys(config.config)
            if config.config.get("host_tensor_descriptors"):
                row["status"] = "gpu_only"
            config = helion.Config(**{k: v for k, v in config.config.items() if k not in gpu_only})
            code = bound.to_triton_code(config)
            path.write_text(code)
            row["sha256"] = hashlib.sha256(code.encode()).hexdigest()[:16]
            row.setdefault("status", "ok")
        except Exception as err:  # record, go on
            row["status"] = f"error: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
        rows.append(row)
        print(f"[{time.time() - start:6.0f} s] {row['status'][:40]:10} {gpu} {op} {key} {build} {variant}",
              flush=True)
    pd.DataFrame(rows).to_csv(out / "manifest.csv", index=False)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "helion_kernels"], capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parent).stdout.strip()
    (out / "COMMIT").write_text(commit + (" (with uncommitted changes)" if dirty else "") + "\n")
    print(f"{len(rows)} calls in {time.time() - start:.0f} s -> {out}")


_NAMES = re.compile(r"\b(_helion_\w+|\w+_kernel)\b")
_DOCSTRING = re.compile(r'^\s*"""[\s\S]*?"""\n', re.MULTILINE)


def normalised(code: str) -> str:
    """``code`` without comments and docstrings (they cite source lines), kernel and host
    function names replaced by one placeholder."""
    code = _DOCSTRING.sub("", code)
    lines = [line for line in code.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return _NAMES.sub("KERNEL", "\n".join(lines))


def split(code: str) -> tuple[str, str]:
    """(the ``@triton.jit`` kernels, the host function) of normalised generated code; the
    module's imports (which name the kernel's source module) belong to neither."""
    start, host = code.find("@triton.jit"), code.rfind("\ndef KERNEL(")
    return code[start:host], code[host:]


def _changed(old: str, new: str) -> str:
    diff = difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
    return " | ".join(line.strip() for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---")))


def compare(before: Path, after: Path, out: Path) -> pd.DataFrame:
    b = pd.read_csv(before / "manifest.csv")
    a = pd.read_csv(after / "manifest.csv")
    keys = ["gpu", "op", "key", "build", "variant"]
    merged = b.merge(a, on=keys, how="outer", suffixes=("_before", "_after"), indicator=True)
    rows = []
    for _, r in merged.iterrows():
        row = {k: r[k] for k in keys}
        if r["_merge"] != "both":
            row.update(result=f"only {'before' if r['_merge'] == 'left_only' else 'after'}", changed_lines="")
        elif r["status_before"] not in ("ok", "gpu_only") or r["status_after"] not in ("ok", "gpu_only"):
            same = r["status_before"] == r["status_after"]
            row.update(result="same error" if same else "error", changed_lines=f"{r['status_before']} | {r['status_after']}")
        else:
            old = (before / r["file_before"]).read_text()
            new = (after / r["file_after"]).read_text()
            (old_kernel, old_host), (new_kernel, new_host) = split(normalised(old)), split(normalised(new))
            if old == new:
                row.update(result="identical", changed_lines="")
            elif old_kernel == new_kernel and old_host == new_host:
                row.update(result="same code", changed_lines="")
            elif old_kernel == new_kernel:
                row.update(result="same kernel", changed_lines="host: " + _changed(old_host, new_host)[:2000])
            else:
                row.update(result="differs", changed_lines=_changed(normalised(old), normalised(new))[:2000])
        row["status"] = r.get("status_after", "")
        rows.append(row)
    df = pd.DataFrame(rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out, index=False)
    counts = df.groupby(["op", "result"]).size().rename("calls").reset_index()
    host = df[df.result == "same kernel"].changed_lines.str.replace(r"\d+", "#", regex=True)
    text = "\n".join([
        "# Generated Triton code before and after a refactor", "",
        f"- command: `python bench/codegen_snapshot.py compare {before.name} {after.name}` (each folder written by "
        "`save` on its own commit: " + ", ".join(f"{p.name}: {_stamp(p)}" for p in (before, after)) + ")",
        f"- {len(df)} calls: every shipped registry entry x each call variant an op makes x the static and the "
        "dynamic-M build, plus the pinned GDPA kernels; `host_tensor_descriptors` dropped where set (a CUDA-only key)",
        "- `identical`: byte for byte; `same code`: the same once comments and docstrings (which cite source "
        "lines) are dropped and kernel names replaced; `same kernel`: every `@triton.jit` function the same so, "
        "the host function (output allocation and launch) differs; `differs`: a kernel differs", "",
        counts.to_markdown(index=False), "",
        "Host-function differences of the `same kernel` calls (numbers as #), each distinct text once:", "",
        *(f"- `{text[:400]}`" for text in sorted(set(host))), ""])
    out.with_suffix(".md").write_text(text)
    print(counts.to_string(index=False))
    return df


def _stamp(folder: Path) -> str:
    stamp = folder / "COMMIT"
    return stamp.read_text().strip() if stamp.is_file() else "unrecorded"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save", help="generate and save the code of every call")
    s.add_argument("dir", type=Path)
    s.add_argument("--only", nargs="+", help="ops whose names contain one of these (default: all)")
    c = sub.add_parser("compare", help="compare two saved folders")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--out", type=Path, default=Path("bench/results/cpu/codegen_comparison.csv"))
    args = parser.parse_args(argv)
    if args.cmd == "save":
        save(args.dir, args.only)
    else:
        compare(args.before, args.after, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
