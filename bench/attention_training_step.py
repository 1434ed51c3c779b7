"""Forward + backward of the FlashNormAttention block: the fused op against what a user runs.

For each row of an attention workload (default ``flash_norm_attention``: batch 768, H 2-8,
D 128, KV 128, jagged Q at fill 0.5), bf16 ``q``, ``k``, ``v`` and norm parameters all requiring
grad, a random output gradient, and the same timer for every column of a row (``--timer
plain``: ``triton.testing.do_bench`` medians; ``--timer graph``: CUDA-graph replay, the row
falling back to plain for every column if any cannot be captured):

* ``fused``: :func:`helion_kernels.flash_norm_attention` (fused forward; backward: both norms'
  backward fused into GDPA's dq kernel, then GDPA's dk/dv kernel);
* ``unfused_compiled`` / ``unfused_eager``: the block as a PyTorch user writes it (norms on
  the jagged rows, attention on Q padded to its longest sequence), under
  ``torch.compile(dynamic=True)`` and eager;
* ``gdpa+eager_norms`` / ``gdpa+compiled_norms``: this package's ``gdpa`` (with its backward,
  the same GDPA kernels and registry configs as ``fused``) between eager norms, and the same
  block under ``torch.compile(dynamic=True)`` (inductor fuses the norms around gdpa's custom
  op): the honest unfused baselines (no padding);
* ``fused_forward``: the fused forward alone, no grad, for the forward/backward split.

Every gradient (q, k, v, three norm parameters) of ``fused`` is checked against
``gdpa+eager_norms`` (5e-2, bf16). Offsets are not validated inside the timed calls
(``validate=False``; the check runs once before).

    python bench/attention_training_step.py [--where "H == 2"] [--timer graph] [--out DIR]
    python bench/attention_training_step.py --where "H == 2 and max_seq_len_q == 256" --profile

Writes ``attention_training_step_<workload>[_graph][_<where>].{csv,md,json,png}`` to
``bench/results/<gpu>/``.
"""

from __future__ import annotations

import shlex
import sys
import warnings
from pathlib import Path

import pandas as pd
import torch

from helion_kernels import flash_norm_attention, gdpa, registry
from helion_kernels.benchmark import aim_bars, device_ceilings, finish_plot, run_meta, workload_script_args, write_results
from helion_kernels.bench_specs import compiled_unfused_block, norm_block, unfused_block
from helion_kernels.techniques.attention.kernels import EPS
from helion_kernels.techniques.attention.kernels import random_jagged_inputs
from helion_kernels.verify import check_outputs
from helion_kernels.workloads import problems

sys.path.insert(0, str(Path(__file__).resolve().parent))
from training_step import _time_all, add_timer_argument  # noqa: E402  (one timer for every column of a row)

ACTIVATION = "fast_gelu"


def _step(fn, leaves, dy):
    """One forward + backward of ``fn(*leaves)`` against ``dy``, gradients reset first."""
    def run():
        for t in leaves:
            t.grad = None
        fn(*leaves).backward(dy)
    return run


def row_steps(row, device: str = "cuda") -> tuple[dict, dict]:
    """(the row's columns as zero-argument steps, the gradient check of ``fused`` against
    ``gdpa+eager_norms``) on fresh bf16 inputs for ``row``; ``fused_forward`` is the fused
    forward alone, no grad."""
    torch._dynamo.reset()
    dev, dt = torch.device(device), torch.bfloat16
    q_lengths = row.q_lengths()
    q, k, v, qo, ko = random_jagged_inputs(q_lengths, [row.seq_len_kv] * row.batch, row.H, row.D, dt, dev, 0)
    gen = torch.Generator(device=dev).manual_seed(1)
    width = row.H * row.D
    params = [((1.0 if i != 1 else 0.0) + 0.1 * torch.randn(width, generator=gen, device=dev)).to(dt)
              for i in range(3)]
    leaves = [t.requires_grad_() for t in (q, k, v, *params)]
    dy = torch.randn(q.shape, generator=gen, device=dev).to(dt)
    max_q, max_kv = row.max_seq_len_q, row.seq_len_kv
    flash_norm_attention(q.detach(), k.detach(), v.detach(), qo, ko, max_q, max_kv)  # validates once

    def fused(q, k, v, lw, lb, rw):
        return flash_norm_attention(q, k, v, qo, ko, max_q, max_kv, lw, lb, rw, EPS, ACTIVATION, 1.0,
                                    validate=False)

    def gdpa_eager_norms(q, k, v, lw, lb, rw):
        return norm_block(q, lambda ln: gdpa(ln, k, v, qo, ko, max_q, max_kv, ACTIVATION, 1.0, validate=False),
                          lw, lb, rw, EPS)

    # The same block with inductor fusing the norms around gdpa's custom op (dynamic: the jagged total changes).
    gdpa_compiled_norms = torch.compile(gdpa_eager_norms, dynamic=True)

    def block(fn):
        return lambda q, k, v, lw, lb, rw: fn(q, k, v, qo, ko, max_q, max_kv, lw, lb, rw, EPS, 1.0, ACTIVATION)

    steps = {
        "fused": _step(fused, leaves, dy),
        "gdpa+eager_norms": _step(gdpa_eager_norms, leaves, dy),
        "gdpa+compiled_norms": _step(gdpa_compiled_norms, leaves, dy),
        "unfused_compiled": _step(block(compiled_unfused_block()), leaves, dy),
        "unfused_eager": _step(block(unfused_block), leaves, dy),
    }
    check = {}
    steps["gdpa+eager_norms"]()
    expected = [t.grad.clone() for t in leaves]
    steps["fused"]()
    try:
        check["grad_rel_error"] = max(check_outputs(t.grad, e.float(), dt, tolerance=5e-2)
                                      for t, e in zip(leaves, expected))
        check["check"] = "ok"
    except AssertionError as err:
        check["grad_rel_error"], check["check"] = float("inf"), f"FAILED: {err}"

    def forward_only():
        with torch.no_grad():
            fused(*leaves)

    steps["fused_forward"] = forward_only
    return steps, check


def bench_row(row, timer: str, device: str = "cuda") -> dict:
    steps, check = row_steps(row, device)
    result = {**row.columns(), **check}
    times, result["timer"] = _time_all(steps, timer)
    result.update({f"{name}_ms": ms for name, ms in times.items()})
    result["speedup_vs_compiled"] = result["unfused_compiled_ms"] / result["fused_ms"]
    result["speedup_vs_eager"] = result["unfused_eager_ms"] / result["fused_ms"]
    result["speedup_vs_gdpa+eager_norms"] = result["gdpa+eager_norms_ms"] / result["fused_ms"]
    result["speedup_vs_gdpa+compiled_norms"] = result["gdpa+compiled_norms_ms"] / result["fused_ms"]
    return result


def plot(df: pd.DataFrame, meta: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"H{r.H} q<={r.max_seq_len_q}" for r in df.itertuples()]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, len(df) * 0.8), 8))
    aim_bars(axes[0], df["speedup_vs_compiled"], labels, 1.5, "aim 1.5x",
             "speed-up over the compiled unfused block", baseline=1.0)
    axes[0].set_title(f"{meta['gpu']}: FlashNormAttention forward + backward (higher is better)")
    aim_bars(axes[1], df["speedup_vs_gdpa+compiled_norms"], labels, 1.2, "aim 1.2x",
             "speed-up over gdpa + compiled norms", baseline=1.0)
    finish_plot(fig, axes, path)


def main() -> int:
    def arguments(p):
        add_timer_argument(p)
        p.add_argument("--profile", action="store_true",
                       help="instead of timing: torch.profiler of the fused and the gdpa + eager norms steps "
                            "of each row (host time per step, GPU kernels), printed, nothing written")
        p.add_argument("--cprofile", action="store_true", help="with --profile: also cProfile the fused step's Python")

    args, table = workload_script_args(__doc__.splitlines()[0], arguments, default_workload="flash_norm_attention",
                                       kind="attention")
    warnings.simplefilter("ignore", registry.ConfigFallbackWarning)
    device = torch.device("cuda")
    if args.profile:
        from profile_training_step import profile, python_profile  # the training bench's profilers

        for row in problems(table, kind="attention"):
            steps, check = row_steps(row)
            for name in ("fused", "gdpa+eager_norms"):
                profile(f"{name} H{row.H} q<={row.max_seq_len_q} ({check['check']})", steps[name])
            if args.cprofile:
                python_profile(f"fused H{row.H} q<={row.max_seq_len_q}", steps["fused"])
        return 0
    ceilings = device_ceilings(device)
    rows = []
    for row in problems(table, kind="attention"):
        rows.append(bench_row(row, args.timer))
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    df = pd.DataFrame(rows)
    meta = run_meta(device, ceilings, timer=args.timer, repeats=1,
                    inputs=f"bf16 q, k, v and norm parameters, all requiring grad; {ACTIVATION}; random output gradient",
                    baselines="unfused block (padded attention) eager and under torch.compile(dynamic=True); "
                              "gdpa (with its backward) between eager norms and between norms compiled around it "
                              "(torch.compile(dynamic=True) of the block with gdpa's custom op inside)")
    meta["timing"] = ("every column of a row by the row's timer (graph: CUDA-graph replay, do_bench_cudagraph; "
                      "plain: an eager loop, do_bench, host time included), median")
    meta["command"] = shlex.join(["python", "bench/attention_training_step.py", *sys.argv[1:]])
    out = args.out or Path(__file__).resolve().parent / "results" / meta["gpu_key"]
    paths = write_results(df, meta, out, f"attention_training_step_{args.workload}", plot, notes=(
        "`speedup_vs_*` = that column's time / `fused_ms` (forward + backward)",))
    print("wrote " + ", ".join(map(str, paths)))
    return 1 if (df["check"] != "ok").any() else 0


if __name__ == "__main__":
    sys.exit(main())
