"""Test sessions and the small CPU work-arounds they need.

A pytest session runs in exactly one mode, chosen by the environment:

* ``pytest`` on a machine without CUDA (or with ``HELION_INTERPRET=1``): Helion's reference
  mode (eager PyTorch, checks the math); runs unmarked and ``ref_mode`` tests.
* ``TRITON_INTERPRET=1 pytest``: the Triton code Helion generates for explicit configs,
  on CPU (checks tiling and masking); runs ``triton_interpret`` tests.
* ``pytest`` on a CUDA machine: runs unmarked and ``cuda`` tests.

Tests of another mode are deselected (not skipped). The two interpret modes are never
combined: Helion refuses that.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# The A/B scripts under bench/variants/ and the report scripts under bench/ are tested too.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench" / "variants"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

if os.environ.get("TRITON_INTERPRET") == "1":
    MODE = "triton_interpret"
elif os.environ.get("HELION_INTERPRET", "0") not in ("", "0") or not torch.cuda.is_available():
    # Must happen before helion_kernels is imported: Helion reads it when a kernel is defined.
    os.environ["HELION_INTERPRET"] = "1"
    MODE = "ref_mode"
else:
    MODE = "cuda"

MODE_MARKERS = ("ref_mode", "triton_interpret", "cuda")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ref_mode: runs kernels in Helion's reference mode (HELION_INTERPRET=1)")
    # A silent fallback to another shape's config is a test bug; tests that expect one say so.
    # (Registered here, not in pyproject.toml: naming the class imports helion_kernels, which
    # must wait until HELION_INTERPRET is settled above.)
    config.addinivalue_line("filterwarnings", "error::helion_kernels.registry.ConfigFallbackWarning")


def pytest_report_header(config: pytest.Config) -> str:
    return f"helion-kernels test mode: {MODE}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        marks = [m for m in MODE_MARKERS if item.get_closest_marker(m)]
        unmarked_ok = MODE != "triton_interpret"
        (keep if (MODE in marks or (not marks and unmarked_ok)) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(autouse=True)
def _cpu_workarounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch two known gaps of the Triton interpreter for the duration of each test (never
    in the library). (The gap of torch's CPU build that Helion's reference mode falls into,
    ``torch.mm(..., out_dtype=)``, is filled by the library itself:
    ``helion_kernels/cpu_reference_mode.py``.)

    * The Triton interpreter does not implement ``libdevice.rsqrt``, ``tanh``, ``erf`` or
      ``exp``: route them to ``tl.math.rsqrt``, ``2 * sigmoid(2x) - 1``, ``tl.math.erf`` and
      ``tl.exp``.
    * The Triton interpreter cannot use a runtime value as a loop bound (it is a 1-element
      array there, not a scalar), which the jagged kernels do with their offsets and the
      dynamic-shape builds (``runtime.dynamic_build``) with their K: make the interpreter's
      tensor ``__index__`` accept a 1-element array.
    """
    if MODE == "triton_interpret":
        import triton.language as tl
        from triton.language.extra import libdevice

        import triton.runtime.interpreter as interpreter

        monkeypatch.setattr(libdevice, "rsqrt", lambda x, **kw: tl.math.rsqrt(x))
        monkeypatch.setattr(libdevice, "tanh", lambda x, **kw: 2 * tl.sigmoid(2 * x) - 1)
        monkeypatch.setattr(libdevice, "erf", lambda x, **kw: tl.math.erf(x))
        monkeypatch.setattr(libdevice, "exp", lambda x, **kw: tl.exp(x))
        patch_tensor = interpreter._patch_lang_tensor

        def patch_tensor_with_index(tensor, scope):
            patch_tensor(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

        monkeypatch.setattr(interpreter, "_patch_lang_tensor", patch_tensor_with_index)


@pytest.fixture
def poisoned_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every float ``torch.empty`` (the kernels' output allocations) start as NaN.

    Recycled memory can hold the right answer from an earlier run and hide an element the
    kernel never writes; NaN cannot pass :func:`check_outputs`.
    """
    from torch._subclasses.fake_tensor import is_fake

    empty = torch.empty

    def nan_empty(*args, **kwargs):
        t = empty(*args, **kwargs)
        # Only real tensors made eagerly: not while torch.compile or make_fx traces (dynamo,
        # or an active dispatch mode: a decomposition such as new_empty's calls torch.empty),
        # where the fill became a copy_ into a graph-made tensor that inductor rejected on the
        # GPU (the add ops' compiled statistics pass, tests/test_poisoned_empty.py).
        if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0 or is_fake(t):
            return t
        # Not a leaf that requires grad: inductor's first compile in a process builds its
        # pattern examples that way, and an in-place fill on one raises (seen on the GPU when
        # a poisoned test compiled the unfused norm first).
        if t.is_floating_point() and t.device.type != "meta" and not t.requires_grad:
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", nan_empty)


@pytest.fixture(autouse=True)
def _no_autotuning(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Helion kernel called without a config autotunes itself: minutes on a GPU, inside the
    test (reference mode never does, so only the CUDA suite would stall). No test tunes for
    real (tuning tests fake ``tune_problem``), so an autotune fails the test at once."""
    from helion.runtime.kernel import BoundKernel

    def refuse(self, *args, **kwargs):
        raise RuntimeError(f"{self.kernel.name}: called without a config, so Helion would autotune it "
                           "inside a test; set one (as the ops' runtime and tune_problem do)")

    monkeypatch.setattr(BoundKernel, "autotune", refuse)


@pytest.fixture(autouse=True)
def _fresh_kernel_cache():
    from helion_kernels import runtime

    runtime.clear_cache()
    yield
    runtime.clear_cache()


@pytest.fixture(autouse=True)
def _empty_user_registry(tmp_path_factory, monkeypatch):
    """Every test starts with an empty user registry of its own (never the developer's
    ``~/.cache``); the shipped registry stays visible unless :func:`registry_dir` hides it."""
    monkeypatch.setenv("HELION_KERNELS_CONFIG_DIR", str(tmp_path_factory.mktemp("user_registry")))


@pytest.fixture
def decisions(registry_dir, monkeypatch):
    """An empty registry whose dispatch decisions apply, as on a GPU (outside reference mode,
    which has no registry and always runs the kernels); compiled kernels and decisions
    forgotten before and after."""
    from helion_kernels import runtime

    monkeypatch.setattr(runtime, "reference_mode", lambda kernel: False)
    runtime.clear_cache()
    yield
    runtime.clear_cache()


@pytest.fixture
def registry_dir(tmp_path, monkeypatch):
    """An empty registry: the user registry (with an empty workload folder) in a temporary
    directory, and no shipped registry."""
    from helion_kernels import registry

    (tmp_path / "workloads").mkdir()
    monkeypatch.setenv("HELION_KERNELS_CONFIG_DIR", str(tmp_path))
    monkeypatch.setattr(registry, "shipped_dir", lambda: tmp_path / "no_shipped_registry")
    return tmp_path


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if MODE == "cuda" else "cpu")
