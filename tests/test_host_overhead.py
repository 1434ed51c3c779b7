"""bench/host_overhead.py: it times every public op and norm + Linear module, and its CPU mode
(the launch stubbed) runs end to end for this package."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

import helion_kernels as hk
import host_overhead
from _bench_scripts import run_bench_script

pytestmark = pytest.mark.ref_mode  # no kernel runs here; once per CPU session


def test_every_public_op_is_timed():
    timed = {name.split("(")[0] for name, *_ in host_overhead._cases(hk, torch)}
    ops = {name for name in hk.__all__ if callable(getattr(hk, name)) and not isinstance(getattr(hk, name), type)}
    assert ops - {"fold_rmsnorm_weight"} <= timed, ops - timed  # fold_rmsnorm_weight runs no kernel


def test_every_norm_linear_module_is_timed_beside_its_pair():
    modules = {cls.__name__ for cls, _ in host_overhead._modules(hk)}
    public = {name for name in hk.__all__ if isinstance(getattr(hk, name), type)}
    assert modules == public - {"FlashNormAttention"}  # no norm + Linear pair to compare with


def test_the_cpu_mode_runs(tmp_path):
    done = run_bench_script("host_overhead", "--calls", "5", "--rounds", "1", "--processes", "1", "--out", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    df = pd.read_csv(tmp_path / "host_overhead.csv")
    cases = host_overhead._cases(hk, torch)
    assert len(df) == 2 * len(cases)  # eager and custom_op per case
    assert all(math.isfinite(v) and v > 0 for v in df[["package_us", "total_us"]].to_numpy().ravel())


def test_every_training_step_runs():
    """The GPU mode's training steps (module and compiled block), once each on the CPU."""
    steps = host_overhead._training_cases(hk, torch, device="cpu")
    assert [name for name, *_ in steps] == [cls.__name__ for cls, _ in host_overhead._modules(hk)]
    for _, module_step, pair_step in steps:
        module_step()
        pair_step()
