"""The ``poisoned_empty`` fixture (tests/conftest.py) leaves graphs that torch.compile traces alone."""

import pytest
import torch

pytestmark = pytest.mark.usefixtures("poisoned_empty")


def add_and_empty(x, residual):
    """The form of the add ops' compiled statistics pass for RMSNorm: ``h`` and an empty ``mean``."""
    h = x + residual
    return h, h.new_empty(0, dtype=torch.float32)


def test_a_compiled_graph_that_allocates(monkeypatch):
    """On CUDA the add ops compile their add + statistics pass with inductor (run_compiled).
    Under the NaN-poisoned ``torch.empty`` those compiles failed on the GPU: traced, the fill
    became a copy_ into a graph-made tensor, which inductor rejects. A graph of that form
    compiles here and matches eager (inductor's caches off: a cached graph hides the fault)."""
    import torch._inductor.config

    monkeypatch.setattr(torch._inductor.config, "force_disable_caches", True)
    torch._dynamo.reset()
    x, residual = torch.randn(6, 40), torch.randn(6, 40)
    for got, want in zip(torch.compile(add_and_empty, fullgraph=True)(x, residual), add_and_empty(x, residual)):
        torch.testing.assert_close(got, want)
