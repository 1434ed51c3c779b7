"""The ``poisoned_empty`` fixture (tests/conftest.py) leaves graphs that torch.compile traces alone."""

import pytest
import torch

pytestmark = pytest.mark.usefixtures("poisoned_empty")


def add_and_empty(x, residual):
    """The form of the add ops' compiled statistics pass for RMSNorm: ``h`` and an empty ``mean``."""
    h = x + residual
    return h, h.new_empty(0, dtype=torch.float32)


def test_a_compiled_graph_that_allocates():
    """On CUDA the add ops compile their add + statistics pass with inductor (run_compiled).
    Under the NaN-poisoned ``torch.empty`` those compiles failed on the GPU: traced, the fill
    became a copy_ into a graph-made tensor, which inductor rejects. A graph of that form
    compiles here and matches eager (inductor's caches off: a cached graph hides the fault;
    config.patch, not monkeypatch, whose undo deletes the aliased setting)."""
    import torch._inductor.config

    torch._dynamo.reset()
    x, residual = torch.randn(6, 40), torch.randn(6, 40)
    with torch._inductor.config.patch(force_disable_caches=True):
        got = torch.compile(add_and_empty, fullgraph=True)(x, residual)
    for g, w in zip(got, add_and_empty(x, residual)):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("tracing_mode", ["real", "fake", "symbolic"])
def test_a_traced_decomposition_that_allocates(tracing_mode):
    """Inductor traces ``new_empty`` through its Python decomposition, which calls
    ``torch.empty`` under a dispatch mode (where the GPU run still failed with only dynamo's
    tracing excluded): no fill may enter the traced graph."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def decomposed(h):
        return h + 1, torch._refs.new_empty(h, (0,), dtype=torch.float32)

    graph = make_fx(decomposed, tracing_mode=tracing_mode)(torch.randn(4, 8)).graph
    assert not [n for n in graph.nodes if n.op == "call_function" and "fill" in str(n.target)]


def test_an_eager_allocation_is_poisoned():
    """The fixture still does its job where it is meant to: eager float allocations are NaN."""
    assert torch.empty(5).isnan().all() and torch.empty(2, 3, dtype=torch.bfloat16).isnan().all()
