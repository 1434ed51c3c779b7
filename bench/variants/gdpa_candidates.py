"""Precisions of the jagged attention kernels, timed side by side: the shipped ones and those before.

Why (issue: the FlashNormAttention forward sat 6.3-9.7x above its byte floor, the GDPA backward
about 5x): the kernels rounded each [tile_q, tile_kv] product (the scores, ``dout v^T``) to
bf16, and Helion then evaluated the activation, or its derivative, in bf16 arithmetic: a
conversion before and after nearly every operation, and the tanh of the GELU through
libdevice. Since 2026-12-07 the kernels take the fp32 product and the sigmoid form (measured
here first, on an H100, as candidates ``fp32`` and ``fp32+sigmoid`` of commit 5b8e019). The
variants swap the kernels' helpers, not their bodies:

* ``shipped``: the kernels as the ops run them (fp32 products, GELU as ``s * sigmoid(2 z)``);
* ``fp32+tanh``: fp32 products, the tanh-GELU and its derivative through ``tanh``;
* ``bf16+tanh``: the kernels before: products rounded to the inputs' dtype, then ``tanh``.

Every kernel (``gdpa``, ``flash_norm_attention``, ``gdpa_dq``, ``gdpa_dkdv``) runs its
registry config for (H, D) (else its default) with each variant, is checked against its fp32
reference (bf16: 3e-2 forward, 5e-2 backward) and timed by CUDA-graph replay (``time_ms``,
median). ``over_floor``: time / the byte floor at this GPU's copy ceiling (``ceilings.md``;
bytes: each input read once and each output written once).

    python bench/variants/gdpa_candidates.py [--rows 2,256 8,1024 8,3000] [--kernels gdpa ...]

Writes ``bench/results/<gpu>/variants/gdpa_candidates.{csv,md}`` (rewritten after each row).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import re
import sys
import types
from pathlib import Path

import helion
import pandas as pd
import torch

from helion_kernels import registry, runtime
from helion_kernels.bench_specs import bench_spec
from helion_kernels.spec import AttentionRow
from helion_kernels.techniques import get_spec
from helion_kernels.techniques.attention import kernels as attention

KERNELS = ("gdpa", "flash_norm_attention", "gdpa_dq", "gdpa_dkdv")
TOLERANCE = {"gdpa": 3e-2, "flash_norm_attention": 3e-2, "gdpa_dq": 5e-2, "gdpa_dkdv": 5e-2}
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def rounded_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The product as before: accumulated in fp32, rounded to the inputs' dtype."""
    return torch.matmul(a, b)


def tanh_activation(s: torch.Tensor, act: int) -> torch.Tensor:
    if act == 0:
        return 0.5 * s * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (s + 0.044715 * s * s * s)))
    return attention.apply_activation(s, act)


def tanh_activation_grad(s: torch.Tensor, act: int) -> torch.Tensor:
    if act == 0:
        t = torch.tanh(_SQRT_2_OVER_PI * (s + 0.044715 * s * s * s))
        return 0.5 * (1.0 + t) + 0.5 * s * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * s * s)
    return attention.activation_grad(s, act)


_TANH = {"apply_activation": tanh_activation, "activation_grad": tanh_activation_grad}
CANDIDATES: dict[str, dict] = {
    "shipped": {},
    "fp32+tanh": _TANH,
    "bf16+tanh": {"score_dot": rounded_dot, **_TANH},
}


def candidate_module(candidate: str) -> types.ModuleType:
    """A second copy of the kernels' module with the candidate's helpers in place of its own
    (Helion resolves a kernel's globals through the module it was defined in, so each
    candidate gets a module of its own, registered under the attention package)."""
    name = f"{attention.__name__}_candidate_{re.sub(r'[^A-Za-z0-9]', '_', candidate)}"
    if name not in sys.modules:
        found = importlib.util.spec_from_file_location(name, attention.__file__)
        module = importlib.util.module_from_spec(found)
        sys.modules[name] = module
        found.loader.exec_module(module)
        for helper, fn in CANDIDATES[candidate].items():
            setattr(module, helper, fn)
    return sys.modules[name]


def candidate_kernel(kernel, candidate: str):
    """``kernel`` with the candidate's helpers (``shipped``: the kernel itself)."""
    if not CANDIDATES[candidate]:
        return kernel
    return getattr(candidate_module(candidate), kernel.fn.__name__)


def run_candidate(name: str, candidate: str, args: tuple, config: helion.Config | None):
    """The outputs of kernel ``name`` with ``candidate`` on ``args`` (``config`` None: in
    Helion's reference mode only) and the compiled callable, for timing."""
    spec = get_spec(name)
    kernel = candidate_kernel(spec.kernel, candidate)
    if config is None:
        if not runtime.reference_mode(kernel):  # a Helion kernel called without a config autotunes
            raise ValueError("run_candidate: a config is needed outside Helion's reference mode")
        return kernel(*args), (lambda: kernel(*args))
    run = kernel.bind(args).compile_config(config)
    return run(*args), (lambda: run(*args))


def sweep_row(row: AttentionRow, kernels, candidates, ceilings) -> list[dict]:
    from helion_kernels.timing import time_ms
    from helion_kernels.verify import check_outputs

    device = torch.device("cuda")
    rows = []
    for name in kernels:
        spec = get_spec(name)
        args = spec.make_args(row, torch.bfloat16, device, 0)
        ref = spec.reference(*args)
        resolved = runtime.resolved_config(spec, args)
        floor_ms = bench_spec(name).min_bytes(row, torch.bfloat16) / ceilings.bandwidth_gbps / 1e6
        for candidate in candidates:
            out = {"kernel": name, "H": row.H, "max_seq_len_q": row.max_seq_len_q, "candidate": candidate,
                   "config_source": resolved.source, "byte_floor_ms": floor_ms}
            try:
                got, call = run_candidate(name, candidate, args, resolved.config)
                got = got if isinstance(got, tuple) else (got,)
                out["rel_error"] = check_outputs(got, ref, torch.bfloat16, tolerance=TOLERANCE[name])
                out["ms"] = time_ms(call)
                out["over_floor"] = out["ms"] / floor_ms
            except Exception as err:  # a failing candidate is a result too
                out["error"] = f"{type(err).__name__}: {err}"[:200]
            rows.append(out)
            print(out, flush=True)
    return rows


def _row(text: str) -> AttentionRow:
    heads, max_q = (int(x) for x in text.split(","))
    return AttentionRow(768, heads, 128, max_q, 128, 0.5, 0)


def add_rows_argument(p: argparse.ArgumentParser, default: list[str]) -> None:
    """``--rows H,MAX_Q ...``: attention rows of the variant scripts (batch 768, D 128, KV 128)."""
    p.add_argument("--rows", nargs="+", default=default, metavar="H,MAX_Q",
                   help="attention rows as H,max_seq_len_q (batch 768, D 128, KV 128, fill 0.5)")


def parsed_rows(p: argparse.ArgumentParser, texts: list[str]) -> list[AttentionRow]:
    try:
        return [_row(r) for r in texts]
    except ValueError:
        p.error("--rows takes H,max_seq_len_q pairs such as 2,256")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_rows_argument(p, ["2,256", "8,1024", "8,3000"])
    p.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS))
    p.add_argument("--candidates", nargs="+", choices=list(CANDIDATES), default=list(CANDIDATES))
    p.add_argument("--out", type=Path, default=None, help="folder (default: bench/results/<gpu>/variants/)")
    args = p.parse_args(argv)
    rows = parsed_rows(p, args.rows)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (the candidates' math runs on the CPU in tests/test_variants_gdpa_candidates.py)",
              file=sys.stderr)
        return 2
    from helion_kernels.benchmark import device_ceilings, write_table

    device = torch.device("cuda")
    ceilings = device_ceilings(device)
    stem = (args.out or Path(__file__).resolve().parent.parent / "results" / registry.gpu_key(device) / "variants"
            ) / "gdpa_candidates"
    command = (f"python bench/variants/{Path(__file__).name} --rows {' '.join(args.rows)} --kernels "
               f"{' '.join(args.kernels)} --candidates {' '.join(args.candidates)}")
    results: list[dict] = []
    for row in rows:  # rewritten after each row: a run cut short keeps its rows
        results += sweep_row(row, args.kernels, args.candidates, ceilings)
        df = pd.DataFrame(results)
        if "ms" in df:
            shipped = df[df.candidate == "shipped"].set_index(["kernel", "H", "max_seq_len_q"])["ms"]
            df["speedup_vs_shipped"] = [shipped.get((r.kernel, r.H, r.max_seq_len_q), float("nan")) / r.ms
                                        for r in df.itertuples()]
        write_table(df, stem, f"GDPA / FlashNormAttention precisions on {torch.cuda.get_device_name()}", [
            f"command: `{command}`", "rows: batch 768, D 128, KV 128, fill 0.5, bf16, fast_gelu, qk_scale 1",
            "timer: CUDA-graph replay (helion_kernels.timing.time_ms), median; one input set",
            f"byte floor at {ceilings.bandwidth_gbps:.0f} GB/s copy (read + write), from this GPU's ceilings.md "
            "(measured now where missing)",
            "check: against the fp32 reference, 3e-2 forward, 5e-2 backward (bf16)"])
    print(f"wrote {stem}.csv/.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
