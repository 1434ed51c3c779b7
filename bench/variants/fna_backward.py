"""FlashNormAttention's backward, the norms fused into GDPA's dq kernel against the norms
apart, timed side by side: the race the op's dispatch follows.

Apart (what the op runs unless tuning measured the fused kernel faster for (H, D)): an
inductor pass for the RMSNorm backward that also recomputes ``ln``; GDPA's dq kernel; an
inductor pass for the LayerNorm backward; about 15 tensors of q's size moved. Fused
(``flash_norm_attention_dq``): one Helion kernel does the RMSNorm backward, recomputes ``ln``,
runs the dq loop and the LayerNorm backward per Q tile of all heads, about 8 tensors (plus the
parameters' per-program partial sums). Both then run GDPA's dk/dv kernel on the ``ln`` and
``do`` they wrote.

* ``fused``: :func:`helion_kernels.techniques.attention._fna_backward_impl` with ``fused=True``;
* ``apart``: the same with ``fused=False``.

Both get the same saved ``o`` and statistics (the forward kernel's) and the same ``dy``, run
their registry configs for (H, D) (else the defaults), are checked against each other (5e-2,
bf16, every gradient) and timed by CUDA-graph replay (median). ``over_floor``: time / the
backward's byte floor (q, dy, o, k, v read once; dq, dk, dv written once) at this GPU's copy
ceiling.

    python bench/variants/fna_backward.py [--rows 2,256 8,1024 8,3000]

Writes ``bench/results/<gpu>/variants/fna_backward.{csv,md}`` (rewritten after each row).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch

from helion_kernels import registry, runtime
from helion_kernels.limits import ACTIVATIONS
from helion_kernels.spec import AttentionRow
from helion_kernels.techniques import attention
from helion_kernels.techniques.attention import kernels

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gdpa_candidates import add_rows_argument, parsed_rows  # noqa: E402  (the variant scripts' --rows)

TOLERANCE = 5e-2  # bf16 gradients
VARIANTS = ("fused", "apart")


def row_inputs(row: AttentionRow, device, seed: int = 0) -> tuple:
    """The arguments both variants take for a workload row (bf16): the forward kernel's saved
    ``o`` and statistics, a random ``dy``, the forward's inputs."""
    q, k, v, qo, ko, max_q, lw, lb, rw, eps, qk_scale, act = kernels.make_args(row, torch.bfloat16, device, seed)
    o, stats = torch.empty_like(q), q.new_empty(3, q.shape[0], dtype=torch.float32)
    runtime.launch(kernels.SPEC, (q, k, v, qo, ko, max_q, lw, lb, rw, eps, qk_scale, act, o, stats))
    dy = torch.randn(q.shape, generator=torch.Generator(device=device).manual_seed(seed + 7), device=device)
    return (dy.to(q.dtype), q, k, v, o, stats, qo, ko, lw, lb, rw, max_q, row.seq_len_kv, ACTIVATIONS[act],
            qk_scale)


def run_variant(name: str, inputs: tuple, need_params: bool = True) -> tuple:
    return attention._fna_backward_impl(*inputs, need_params, True, name == "fused")


def floor_bytes(inputs: tuple) -> int:
    """The backward's byte floor: q, dy, o, k, v read once, dq, dk, dv written once."""
    q, k = inputs[1], inputs[2]
    return (4 * q.numel() + 4 * k.numel()) * q.element_size()


def sweep_row(row: AttentionRow, ceilings) -> list[dict]:
    from helion_kernels.timing import time_ms
    from helion_kernels.verify import check_outputs

    inputs = row_inputs(row, torch.device("cuda"))
    floor_ms = floor_bytes(inputs) / ceilings.bandwidth_gbps / 1e6
    fused = run_variant("fused", inputs)
    out = []
    for name in VARIANTS:
        r = {"H": row.H, "max_seq_len_q": row.max_seq_len_q, "total_q": int(inputs[1].shape[0]), "variant": name,
             "byte_floor_ms": floor_ms}
        try:
            got = run_variant(name, inputs)
            r["rel_diff_vs_fused"] = check_outputs(got, fused, torch.bfloat16, tolerance=TOLERANCE)
            r["ms"] = time_ms(lambda: run_variant(name, inputs))
            r["over_floor"] = r["ms"] / floor_ms
        except Exception as err:  # a failing variant is a result too
            r["error"] = f"{type(err).__name__}: {err}"[:200]
        out.append(r)
        print(r, flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_rows_argument(p, ["2,256", "4,1024", "8,1024", "8,3000"])
    p.add_argument("--out", type=Path, default=None, help="folder (default: bench/results/<gpu>/variants/)")
    args = p.parse_args(argv)
    rows = parsed_rows(p, args.rows)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (both variants' math runs on the CPU in tests/test_variants_fna_backward.py)",
              file=sys.stderr)
        return 2
    from helion_kernels.benchmark import device_ceilings, write_table

    device = torch.device("cuda")
    ceilings = device_ceilings(device)
    stem = (args.out or Path(__file__).resolve().parent.parent / "results" / registry.gpu_key(device) / "variants"
            ) / "fna_backward"
    results: list[dict] = []
    for row in rows:
        results += sweep_row(row, ceilings)
        df = pd.DataFrame(results)
        if "ms" in df:
            fused = df[df.variant == "fused"].set_index(["H", "max_seq_len_q"])["ms"]
            df["speedup_of_fused"] = [r.ms / fused.get((r.H, r.max_seq_len_q), float("nan")) for r in df.itertuples()]
        write_table(df, stem, f"FlashNormAttention backward, norms fused vs apart, on {torch.cuda.get_device_name()}", [
            f"command: `python bench/variants/{Path(__file__).name} --rows {' '.join(args.rows)}`",
            "rows: batch 768, D 128, KV 128, fill 0.5, bf16, fast_gelu, qk_scale 1, affine parameters",
            "timer: CUDA-graph replay (helion_kernels.timing.time_ms), median; one input set",
            f"byte floor at {ceilings.bandwidth_gbps:.0f} GB/s copy (read + write), from this GPU's ceilings.md",
            "check: every gradient of each variant against the fused one (5e-2, bf16); each is checked against "
            "float64 autograd in the tests",
            "speedup_of_fused: the variant's ms / fused ms"])
    print(f"wrote {stem}.csv/.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
