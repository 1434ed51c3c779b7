"""Tuning logic that runs without a GPU (the tuning itself is exercised on the GPU)."""

from __future__ import annotations

import pytest
import torch

from helion_kernels import tuning
from helion_kernels.kernels import get_spec
from helion_kernels.kernels.spec import Shape


def test_options_are_validated():
    with pytest.raises(ValueError, match="effort must be one of"):
        tuning.TuneOptions(effort="max")
    with pytest.raises(ValueError, match="budget_seconds must be positive"):
        tuning.TuneOptions(budget_seconds=0)


def test_tune_shape_refuses_cpu():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        tuning.tune_shape(get_spec("matmul"), Shape(8, 8, 8), torch.bfloat16, tuning.TuneOptions(), torch.device("cpu"))


def test_a_failing_shape_does_not_stop_the_sweep(monkeypatch):
    def fake(spec, shape, dtype, options, device, progress_bar=True):
        if shape.M == 2:
            raise RuntimeError("compile failed")
        return tuning.TuneResult(shape, "tuned", 0.1, "ok")

    monkeypatch.setattr(tuning, "tune_shape", fake)
    shapes = [Shape(1, 8, 8), Shape(2, 8, 8), Shape(3, 8, 8)]
    results = tuning.tune_shapes(get_spec("matmul"), shapes, torch.bfloat16, tuning.TuneOptions(), torch.device("cpu"))
    assert [r.status for r in results] == ["tuned", "failed", "tuned"]
    assert "RuntimeError: compile failed" in results[1].message


def test_versions_name_what_decides_speed():
    assert set(tuning.versions()) == {"torch", "cuda", "triton", "helion"}
