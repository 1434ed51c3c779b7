"""Checking kernel outputs against their fp32 PyTorch reference.

Used by the autotuner (every candidate, and again on fresh inputs before a config is
persisted), the benchmark and the tests, so all three apply the same bar.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .spec import KernelSpec, Problem

# Elementwise tolerance per input dtype: |out - ref| <= tol * (|ref| + rms(ref)).
# bf16 follows the authors' fused-forward tests (atol = rtol = 3e-2 on unit-scale outputs);
# fp32 inputs run on TF32 tensor cores (Helion's default dot precision).
TOLERANCE: dict[torch.dtype, float] = {
    torch.bfloat16: 3e-2,
    torch.float16: 1e-2,
    torch.float32: 5e-3,
    torch.float64: 1e-6,
}


VERIFY_DRAWS = 3


class VerificationError(AssertionError):
    """A kernel output differs from its reference by more than the tolerance."""


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64 (``inf`` if out has NaN/inf, 0 for empty)."""
    if out.numel() == 0:
        return 0.0
    out64, ref64 = out.to(torch.float64), ref.to(torch.float64)
    if not torch.isfinite(out64).all():
        return float("inf")
    denom = ref64.norm().item()
    diff = (out64 - ref64).norm().item()
    return diff / denom if denom > 0 else diff


def check_outputs(
    outputs: torch.Tensor | tuple | list,
    reference: torch.Tensor | tuple | list,
    dtype: torch.dtype,
    tolerance: float | None = None,
) -> float:
    """Compare every output with its reference; return the largest relative error.

    Each pair must have the same shape, ``outputs`` must be finite everywhere (NaN never
    passes), and every element must satisfy ``|out - ref| <= tol * (|ref| + rms(ref))``
    with ``tol = tolerance`` or, by default, ``TOLERANCE[dtype]``: scale-free, and one wrong
    element fails.

    Raises:
        VerificationError: with the worst element's index and values.
    """
    outs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    refs = reference if isinstance(reference, (tuple, list)) else (reference,)
    if len(outs) != len(refs):
        raise VerificationError(f"{len(outs)} outputs but {len(refs)} reference outputs")
    tol = TOLERANCE[dtype] if tolerance is None else tolerance
    worst = 0.0
    for i, (out, ref) in enumerate(zip(outs, refs)):
        if tuple(out.shape) != tuple(ref.shape):
            raise VerificationError(f"output {i}: shape {tuple(out.shape)} != {tuple(ref.shape)}")
        if out.numel() == 0:
            continue
        o = out.to(torch.float64)
        r = ref.to(device=out.device, dtype=torch.float64)
        if not torch.isfinite(o).all():
            bad = (~torch.isfinite(o)).sum().item()
            raise VerificationError(f"output {i}: {bad} non-finite elements")
        rms = r.pow(2).mean().sqrt()
        excess = (o - r).abs() - tol * (r.abs() + rms)
        if (excess > 0).any():
            idx = int(excess.flatten().argmax())
            pos = tuple(int(x) for x in torch.unravel_index(torch.tensor(idx), o.shape))
            raise VerificationError(
                f"output {i}: {(excess > 0).sum().item()} of {o.numel()} elements off by more "
                f"than {tol:g} x (|ref| + rms(ref)); worst at {pos}: got "
                f"{o[pos].item():.6g}, expected {r[pos].item():.6g}"
            )
        worst = max(worst, relative_error(out, r))
    return worst


def check_deterministic(run, repeats: int = 4) -> None:
    """Run ``run()`` ``1 + repeats`` times on the same inputs; every result must be bitwise equal.

    The kernels here have no atomics or split reductions, so a fixed config must give the
    same bits every time: a difference means a race, which a single reference check on one
    draw can miss.

    Raises:
        VerificationError: naming how many elements changed between runs.
    """
    first = run()
    firsts = first if isinstance(first, (tuple, list)) else (first,)
    firsts = [t.clone() for t in firsts]
    for rep in range(repeats):
        again = run()
        agains = again if isinstance(again, (tuple, list)) else (again,)
        for i, (x, y) in enumerate(zip(firsts, agains)):
            if not torch.equal(x, y):
                changed = (x != y).sum().item()
                raise VerificationError(
                    f"output {i}: {changed} elements changed between identical runs "
                    f"(run {rep + 2}): the kernel is nondeterministic with this config"
                )


def comparable(spec: KernelSpec, outputs):
    """A kernel's ``outputs`` in the form its reference gives them (``spec.compare_outputs``)."""
    return outputs if spec.compare_outputs is None else spec.compare_outputs(outputs)


def check_spec_outputs(spec: KernelSpec, outputs, args: tuple, dtype: torch.dtype) -> float:
    """:func:`check_outputs` of a kernel's ``outputs`` on ``args`` against ``spec.reference``."""
    return check_outputs(comparable(spec, outputs), spec.reference(*args), dtype)


def verify_config(
    bound, spec: KernelSpec, problem: Problem, dtype: torch.dtype, device: torch.device,
    seed: int, draws: int = VERIFY_DRAWS,
) -> float:
    """Check a compiled config (tuning) or a registered one (benchmark); return the largest
    relative error.

    ``draws`` fresh random inputs (seeds ``seed``, ``seed + 1``, ...) each against the fp32
    reference, and on the first draw five identical runs that must agree bit for bit.

    Raises:
        VerificationError: a draw is off, or the config is nondeterministic.
    """
    worst = 0.0
    for i in range(draws):
        fresh = spec.make_args(problem, dtype, device, seed + i)
        worst = max(worst, check_spec_outputs(spec, bound(*fresh), fresh, dtype))
        if i == 0:
            check_deterministic(lambda: bound(*fresh))
    return worst
