"""How a public op reaches its kernel: a ``torch.library`` custom op for compiled graphs,
a direct call for eager ones.

Under ``torch.compile`` the custom op (namespace ``helion_kernels``) puts one opaque node in
the graph, whose fake (meta) implementation gives the output shapes while tracing, so a
model that calls the op compiles with ``fullgraph=True``; its backward is registered with
``register_autograd``, so a compiled training step traces it. Eager calls skip the
dispatcher, as Quack's ops do: one that autograd does not record (no input requires grad, or
grad mode is off) runs the implementation directly, and one that autograd records runs it
inside a ``torch.autograd.Function`` built from the same ``setup_context`` and ``backward``.
On the H200 machine the custom op's Python dispatch and autograd wrapper cost about half a
millisecond of host time per training call, more than many of these kernels run
(``bench/profile_training_step.py --cprofile``; log under
``bench/results/nvidia_h200_sm90/logs/``); the Function path skips both.
"""

from __future__ import annotations

from typing import Callable

import torch

from torch.utils._python_dispatch import _get_current_dispatch_mode

from ..grads import _PLAIN

NAMESPACE = "helion_kernels"


class Op:
    """One custom op: ``impl`` registered as ``helion_kernels::<name>`` with ``fake`` as
    its fake implementation and, when given, ``backward`` / ``setup_context`` as its autograd
    formula (``torch.library.register_autograd``).

    Calling the object runs the registered op while ``torch.compile`` (or another tracer) is
    tracing; otherwise, when autograd must record the call (an op with a backward, grad mode
    on, an input that requires grad), ``impl`` inside an autograd Function with the same
    formula; otherwise ``eager`` (default: ``impl``) directly. ``eager`` may return None for
    an optional output the caller did not ask for, where the op (whose outputs must be
    tensors) returns an empty tensor."""

    def __init__(self, name: str, impl: Callable, fake: Callable, eager: Callable | None = None,
                 backward: Callable | None = None, setup_context: Callable | None = None) -> None:
        self.name = name
        self.impl = impl
        self.eager = eager or impl
        self.custom_op = torch.library.custom_op(f"{NAMESPACE}::{name}", impl, mutates_args=())
        self.custom_op.register_fake(fake)
        self.differentiable = backward is not None
        self.function = None
        if backward is not None:
            self.custom_op.register_autograd(backward, setup_context=setup_context)
            self.function = _autograd_function(name, impl, setup_context, backward)

    def __call__(self, *args):
        if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
            return self.custom_op(*args)
        record = self.differentiable and torch.is_grad_enabled()
        recorded = False
        for t in args:  # one pass: a traced tensor (fake, functional) or one autograd records
            if isinstance(t, torch.Tensor):
                if type(t) not in _PLAIN:
                    return self.custom_op(*args)
                recorded = recorded or (record and t.requires_grad)
        if recorded:
            return self.function.apply(*args)
        return self.eager(*args)


def _autograd_function(name: str, impl: Callable, setup_context: Callable, backward: Callable) -> type:
    """A ``torch.autograd.Function`` running ``impl`` with the op's own ``setup_context`` and
    ``backward`` (the signatures ``register_autograd`` takes)."""

    def forward(*args):
        return impl(*args)

    def setup(ctx, inputs, output):
        setup_context(ctx, inputs, output)

    def backward_(ctx, *grads):
        # No double backward: a clear error, not a wrong one. Autograd runs a backward with grad
        # mode on only for create_graph=True. (once_differentiable raises only when an incoming
        # gradient requires grad; after out.sum() none does, and the second-order terms would
        # be silently missing.)
        if torch.is_grad_enabled():
            raise RuntimeError(f"{name}: the backward is not differentiable; create_graph=True (a double "
                               f"backward, e.g. a gradient penalty) is not supported")
        return backward(ctx, *grads)

    # Named after the op, so a graph's grad_fn reads "<op>Backward".
    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward), "setup_context": staticmethod(setup),
        "backward": staticmethod(backward_)})





def records_grad(*args) -> bool:
    """Whether autograd records a call with ``args``: grad mode on and a tensor requiring grad."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in args)


def filled(like: torch.Tensor, outputs: tuple) -> tuple:
    """``outputs`` with each None (an optional output not asked for) as an empty fp32 tensor."""
    return tuple(like.new_empty(0, dtype=torch.float32) if t is None else t for t in outputs)


def gemm_operand(b: torch.Tensor) -> torch.Tensor:
    """``b`` [K, N] as the GEMM kernels read it: row-major, or column-major as it is (the
    transposed view of an ``nn.Linear`` weight [N, K] is read in place, no copy: Helion
    compiles that layout as its own specialization); any other layout is copied."""
    return b if b.is_contiguous() or b.t().is_contiguous() else b.contiguous()
