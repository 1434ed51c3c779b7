"""The pre-norm op's forward dispatch (:func:`helion_kernels.runtime.decide`): the
fused kernel only where the registry recorded it faster than cuBLAS + the compiled norm, the
nearest tuned shape's decision for an untuned one, unfused on a GPU without entries,
``fused=True/False`` forcing; and the op's output on either path. The decisions are read
outside reference mode (which has no registry and always runs the kernel)."""

from __future__ import annotations

import helion
import pytest
import torch

import helion_kernels as hk
from helion_kernels import registry, runtime
from helion_kernels.techniques.prenorm.kernels import SPEC, rmsnorm_matmul_reference
from helion_kernels.techniques import prenorm
from helion_kernels.registry import ConfigFallbackWarning, Entry
from helion_kernels.spec import Shape
from helion_kernels.verify import check_outputs

# block_sizes = [tile_m, tile_n, K tile (whole row), tile_k] of the row-block kernel.
CONFIG = helion.Config(block_sizes=[16, 16, 64, 16], num_warps=4, num_stages=1, indexing="pointer")


def _save(shape: Shape, dtype: str, choice: str | None) -> None:
    meta = {"latency_ms": 0.01}
    if choice is not None:
        meta["dispatch"] = {"choice": choice, "fused_ms": 0.01, "unfused_ms": 0.02,
                            "unfused": SPEC.dispatch_baseline}
    registry.save_entry(SPEC.name, registry.gpu_key(torch.device("cpu")), Entry(shape, dtype, CONFIG, meta))


def _args(shape: Shape, dtype=torch.float32) -> tuple:
    return SPEC.make_args(shape, dtype, "cpu", 0)


def _fused(args: tuple, fused: bool | None = None) -> bool:
    return runtime.decide(SPEC, args, fused).fused


@pytest.mark.parametrize("choice", ["fused", "unfused"])
def test_exact_entry_decides(choice, decisions):
    _save(Shape(64, 64, 48), "float32", choice)
    args = _args(Shape(64, 64, 48))
    assert _fused(args) is (choice == "fused")
    assert _fused(args, True) and not _fused(args, False)


@pytest.mark.parametrize("choice", ["fused", "unfused"])
def test_untuned_shape_follows_the_nearest_decision(choice, decisions):
    _save(Shape(64, 64, 48), "float32", choice)
    with pytest.warns(ConfigFallbackWarning, match="64x64x48") if choice == "unfused" else _no_warning():
        assert _fused(_args(Shape(40, 64, 48))) is (choice == "fused")


def test_no_entry_means_unfused(decisions):
    assert not _fused(_args(Shape(64, 64, 48)))
    assert not runtime.decide(SPEC, _args(Shape(64, 64, 4096))).fused  # no N limit: the pre-norm takes any N


def test_empty_operands_never_launch(decisions):
    assert not _fused((torch.empty(0, 8), torch.empty(8, 4), 1e-5), True)
    assert not _fused((torch.empty(3, 8), torch.empty(8, 0), 1e-5), True)


@pytest.mark.triton_interpret
@pytest.mark.parametrize("choice", ["fused", "unfused"])
def test_the_op_runs_the_recorded_path(choice, decisions, monkeypatch):
    """End to end in the interpreter: the kernel launches only where the registry chose it,
    and both paths give the same op."""
    seen = []
    launch = runtime.launch
    monkeypatch.setattr(runtime, "launch", lambda spec, args: seen.append(spec.name) or launch(spec, args))
    shape = Shape(33, 64, 48)
    _save(shape, "float32", choice)
    a, b, eps, _ = _args(shape)
    out = hk.rmsnorm_matmul(a, b, eps=eps)
    assert seen == (["rmsnorm_matmul"] if choice == "fused" else [])
    check_outputs(out, rmsnorm_matmul_reference(a.double(), b.double(), eps)[0], torch.float32)


class _no_warning:
    """A context that fails on any ConfigFallbackWarning."""

    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("error", ConfigFallbackWarning)

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)
        return False
