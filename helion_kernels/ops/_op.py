"""How a public op reaches its kernel: a ``torch.library`` custom op for compiled graphs,
a direct call for eager ones.

Under ``torch.compile`` the custom op (namespace ``helion_kernels``) puts one opaque node in
the graph, whose fake (meta) implementation gives the output shapes while tracing, so a
model that calls the op compiles with ``fullgraph=True``. An eager call that autograd does
not record (no input requires grad, or grad mode is off) skips the dispatcher (10-30 us per
call, longer than some of these kernels run) and runs the same implementation directly, as
Quack's ops do; one that autograd records goes through the op, whose backward is registered
with ``register_autograd`` (the same path a compiled training step takes).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..grads import tracing

NAMESPACE = "helion_kernels"


class Op:
    """One custom op: ``impl`` registered as ``helion_kernels::<name>`` with ``fake`` as
    its fake implementation and, when given, ``backward`` / ``setup_context`` as its autograd
    formula (``torch.library.register_autograd``).

    Calling the object runs ``eager`` (default: ``impl``) directly, unless ``torch.compile``
    is tracing or autograd must record the call (an op with a backward, grad mode on, an input
    that requires grad): then it calls the registered op. ``eager`` may return None for an
    optional output the caller did not ask for, where the op (whose outputs must be tensors)
    returns an empty tensor."""

    def __init__(self, name: str, impl: Callable, fake: Callable, eager: Callable | None = None,
                 backward: Callable | None = None, setup_context: Callable | None = None) -> None:
        self.name = name
        self.impl = impl
        self.eager = eager or impl
        self.custom_op = torch.library.custom_op(f"{NAMESPACE}::{name}", impl, mutates_args=())
        self.custom_op.register_fake(fake)
        self.differentiable = backward is not None
        if backward is not None:
            self.custom_op.register_autograd(backward, setup_context=setup_context)

    def __call__(self, *args):
        if tracing(args) or (self.differentiable and records_grad(*args)):
            return self.custom_op(*args)
        return self.eager(*args)





def records_grad(*args) -> bool:
    """Whether autograd records a call with ``args``: grad mode on and a tensor requiring grad."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in args)


def filled(like: torch.Tensor, outputs: tuple) -> tuple:
    """``outputs`` with each None (an optional output not asked for) as an empty fp32 tensor."""
    return tuple(like.new_empty(0, dtype=torch.float32) if t is None else t for t in outputs)
