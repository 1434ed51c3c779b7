"""bench/training_step.py's timing loop (``--repeats``) on the CPU, with triton's timers
replaced by fakes that record the order of the calls."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
import triton.testing

from _bench_scripts import REPO, run_bench_script


@pytest.fixture(scope="module")
def training_step():
    spec = importlib.util.spec_from_file_location("training_step", REPO / "bench" / "training_step.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["training_step"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["training_step"]


def _recording_timer(calls: list, fail: bool = False):
    def bench(fn, return_mode="median"):
        assert return_mode == "median"
        if fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        calls.append(fn())
        return float(len(calls))
    return bench


def test_repeats_take_the_columns_in_order_then_reversed(training_step, monkeypatch):
    calls: list = []
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", _recording_timer(calls))
    times, timer = training_step._time_all({"a": lambda: "a", "b": lambda: "b"}, "graph", repeats=3)
    assert timer == "graph"
    assert calls == ["a", "b", "b", "a"] * 3  # in order then reversed within each repeat, not a,a,a,b,b,b
    assert times == {"a": [2.5, 6.5, 10.5], "b": [2.5, 6.5, 10.5]}  # the timer's 1, 2, 3, ... averaged


def test_a_row_that_cannot_be_captured_is_timed_plain(training_step, monkeypatch):
    calls: list = []
    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", _recording_timer([], fail=True))
    monkeypatch.setattr(triton.testing, "do_bench", _recording_timer(calls))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)  # no CUDA here
    times, timer = training_step._time_all({"a": lambda: "a", "b": lambda: "b"}, "graph", repeats=2)
    assert timer == "plain" and calls == ["a", "b", "b", "a"] * 2
    assert times == {"a": [2.5, 6.5], "b": [2.5, 6.5]}


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_repeats_must_be_a_positive_integer(value):
    result = run_bench_script("training_step", "--repeats", value)
    assert result.returncode == 2 and "must be a positive integer" in result.stderr
