"""How an op reaches its kernel (:class:`Op`), and the backward pieces every technique shares.

Under ``torch.compile`` an op is a ``torch.library`` custom op (namespace
``helion_kernels``): one opaque node with a fake implementation and a registered autograd
formula, so a model compiles with ``fullgraph=True``. Eager calls skip the dispatcher, as
Quack's ops do: without autograd the implementation runs directly; with it, inside a
``torch.autograd.Function`` built from the same ``setup_context`` and ``backward``.

Backward conventions: norm statistics and elementwise arithmetic in fp32; GEMMs in the input
dtype with fp32 accumulation; weight and bias gradients as fp32 sums over rows (deterministic),
cast to the parameter's dtype at the end.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

NAMESPACE = "helion_kernels"
_PLAIN = (torch.Tensor, torch.nn.Parameter)


class Op:
    """One custom op: ``impl`` registered as ``helion_kernels::<name>`` with ``fake`` as
    its fake implementation and, when given, ``backward`` / ``setup_context`` as its autograd
    formula.

    Calling the object runs the registered op while a tracer (``torch.compile``, ``opcheck``,
    ``make_fx``) is active; otherwise, when autograd must record the call, ``impl`` inside an
    autograd Function with the same formula; otherwise ``eager`` (default ``impl``), which
    may return None for an optional output the caller did not ask for. ``named`` and
    ``input_grads`` let the formula use the inputs' names instead of their positions. ``public``
    names the function(s) a user calls where they differ from ``name`` (errors say it)."""

    def __init__(self, name: str, impl: Callable, fake: Callable, eager: Callable | None = None,
                 backward: Callable | None = None, setup_context: Callable | None = None,
                 public: str | None = None) -> None:
        self.name = name
        self.impl = impl
        self.eager = eager or impl
        self.names = tuple(inspect.signature(impl).parameters)
        self.custom_op = torch.library.custom_op(f"{NAMESPACE}::{name}", impl, mutates_args=())
        self.custom_op.register_fake(fake)
        self.differentiable = backward is not None
        self.function = None
        if backward is not None:
            self.custom_op.register_autograd(backward, setup_context=setup_context)
            self.function = _autograd_function(name, impl, setup_context, backward, public or name)

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

    def named(self, values) -> types.SimpleNamespace:
        """The op's inputs (or ``ctx.needs_input_grad``) by name."""
        return types.SimpleNamespace(**dict(zip(self.names, values)))

    def input_grads(self, **grads) -> tuple:
        """One gradient per input, in the op's order: those given by name, None elsewhere."""
        return tuple(grads.get(name) for name in self.names)


def _autograd_function(name: str, impl: Callable, setup_context: Callable, backward: Callable,
                       public: str) -> type:
    """A ``torch.autograd.Function`` running ``impl`` with the op's own formula; its errors
    name ``public``, the function(s) a user called."""

    def forward(*args):
        return impl(*args)

    def setup(ctx, inputs, output):
        setup_context(ctx, inputs, output)

    def backward_(ctx, *grads):
        # Autograd runs a backward with grad mode on only for create_graph=True: refuse a double
        # backward instead of leaving its second-order terms out.
        if torch.is_grad_enabled():
            raise RuntimeError(f"{public}: the backward is not differentiable; create_graph=True (a double "
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
    """``b`` [K, N] as the GEMM kernels read it: row-major, or column-major as it is (an
    ``nn.Linear`` weight's ``.t()``, read in place); any other layout is copied."""
    return b if b.is_contiguous() or b.t().is_contiguous() else b.contiguous()


def contiguous_or_none(*tensors) -> tuple:
    """Optional tensors (affine parameters, addends), contiguous; None stays None."""
    return tuple(None if t is None else t.contiguous() for t in tensors)


# --- compiled elementwise passes ------------------------------------------------------------


def tracing(args: tuple) -> bool:
    """Whether a call is being traced rather than run (``torch.compile``, or a tracer below it
    with a dispatch mode active or tensor subclasses as arguments)."""
    return (torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None
            or any(isinstance(t, torch.Tensor) and type(t) not in _PLAIN for t in args))


@functools.cache
def _inductor(fn):
    # emulate_precision_casts: round a bf16/fp16 intermediate where eager does. Without it,
    # inductor's Triton code kept the add ops' h = x + residual in fp32 for the statistics
    # while returning h rounded (bf16 rows of mean 1e3 normalised wrongly on an H100).
    return torch.compile(fn, dynamic=None, options={"emulate_precision_casts": True})


def widths_static(args: tuple) -> tuple:
    """``args`` with every size marked static for ``torch.compile`` except those equal to
    ``args[0]``'s first dimension (the rows, M, which may change between steps). Unmarked,
    inductor's second compile makes every changed size symbolic, including a width another
    layer brought, which turns its one-pass row reduction into a loop. The marks go on
    aliases (``detach``), not on the caller's tensors."""
    m = args[0].shape[0]
    marked = []
    for t in args:
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            t = t.detach()
            for dim, size in enumerate(t.shape):
                if size != m:
                    torch._dynamo.mark_static(t, dim)
        marked.append(t)
    return tuple(marked)


# Graphs one compiled pass may hold (dynamo's default is 8 per function, past which it runs
# eagerly): widths x dtypes x None patterns x flags of one process.
RECOMPILE_LIMIT = 64


def call_compiled(compiled, args: tuple):
    """``compiled(*widths_static(args))`` with dynamo's recompile limit raised while it runs."""
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        return compiled(*widths_static(args))


def run_compiled(fn, *args):
    """``fn(*args)``, inductor-compiled on CUDA when called eagerly (one fused pass instead of
    a dozen fp32 kernels; once for the first M and once more for every other M; low-precision
    intermediates rounded as eager rounds them), traced as it is inside the caller's graph
    (whose inductor settings then apply), eager on a CPU."""
    if args[0].is_cuda and not tracing(args):
        return call_compiled(_inductor(fn), args)
    return fn(*args)


# --- shared backward formulas -------------------------------------------------------------


def f32(t: torch.Tensor) -> torch.Tensor:
    """fp32, or float64 for float64 (gradcheck)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def col_sums(t: torch.Tensor) -> torch.Tensor:
    """Column sums of a 2-D tensor in fp32 (float64 for float64), accumulated in one pass
    with no widened copy of ``t`` (a bf16 [M, N] gradient is not written again in fp32)."""
    return t.sum(dim=0, dtype=torch.promote_types(t.dtype, torch.float32))


def mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` accumulated and returned in fp32 (torch's CPU build has no ``out_dtype``)."""
    if a.is_cuda and a.dtype in (torch.bfloat16, torch.float16):
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()


def param_grad(value: torch.Tensor | None, param: torch.Tensor | None, needed: bool = True) -> torch.Tensor | None:
    """A parameter's gradient computed in fp32, in the parameter's shape and dtype; None where
    it is not needed or either is None."""
    if not needed or param is None or value is None:
        return None
    return value.reshape(param.shape).to(param.dtype)


def column_major(b: torch.Tensor) -> bool:
    """Whether ``b`` [K, N] is the transposed view of a row-major [N, K] tensor (``W.t()``)."""
    return b.dim() == 2 and not b.is_contiguous() and b.t().is_contiguous()


def wgrad(x: torch.Tensor, dc: torch.Tensor, b: torch.Tensor, fp32: bool = False) -> torch.Tensor:
    """``dB = x^T @ dc`` [K, N] of ``c = x @ b``, laid out as ``b``: for ``b = W.t()`` the GEMM
    writes W's gradient row-major (as torch's own mm backward), so autograd accumulates it
    into W without a transposing copy. ``fp32``: returned in fp32 (:func:`mm_fp32`)."""
    mm = mm_fp32 if fp32 else torch.mm
    return mm(dc.t(), x).t() if column_major(b) else mm(x.t(), dc)


def empty_like_layout(b: torch.Tensor) -> torch.Tensor:
    """An empty tensor of ``b``'s shape with :func:`wgrad`'s layout for ``b`` (for fakes)."""
    return b.new_empty(b.shape[::-1]).t() if column_major(b) else b.new_empty(b.shape)


def matmul_grads(a: torch.Tensor, b: torch.Tensor, dc: torch.Tensor, need_a: bool = True, need_b: bool = True):
    """(dA, dB) of ``c = a @ b``; dB laid out as ``b``."""
    return (torch.mm(dc, b.t()) if need_a else None, wgrad(a, dc, b) if need_b else None)


def rms_rstd(a: torch.Tensor, eps: float) -> torch.Tensor:
    """The rows' ``rstd = 1 / sqrt(mean(a**2, dim=1) + eps)`` [M] in fp32."""
    return torch.rsqrt(a.float().pow(2).mean(dim=1) + eps)


def rms_x_hat(a: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """``x_hat = a * rstd[:, None]`` in ``a.dtype``."""
    return (f32(a) * rstd[:, None]).to(a.dtype)


def rms_row_backward(dx_hat: torch.Tensor, x_hat: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """d(input) of ``x_hat = x * rstd`` (no affine), fp32: ``rstd * (dx_hat - x_hat * mean(dx_hat * x_hat))``."""
    s = (dx_hat * x_hat).mean(dim=1, keepdim=True)
    return rstd[:, None] * (dx_hat - x_hat * s)


def layer_stats(a: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' LayerNorm ``(mean, rstd)`` [M] in fp32 (the variance of the centred rows: no
    cancellation for rows far from zero mean)."""
    a32 = a.float()
    mean = a32.mean(dim=1)
    return mean, torch.rsqrt((a32 - mean[:, None]).pow(2).mean(dim=1) + eps)


def layer_x_hat(a: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """``x_hat = (a - mean[:, None]) * rstd[:, None]`` in ``a.dtype``."""
    return ((f32(a) - mean[:, None]) * rstd[:, None]).to(a.dtype)


def colsum_for(b: torch.Tensor) -> torch.Tensor | None:
    """The pre-LayerNorm kernels' ``colsum`` of the GEMM's right operand ``b`` [K, N]: its
    column sums in fp32, of ``b`` as stored (what the MMA reads); None for fp32 ``b``, whose
    MMA rounds to TF32 (the kernels then take the mean off each ``a`` tile instead)."""
    return None if b.dtype == torch.float32 else b.sum(dim=0, dtype=torch.float32)


def layer_row_backward(dx_hat: torch.Tensor, x_hat: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """d(input) of ``x_hat = (x - mean) * rstd`` (no affine), fp32."""
    return rstd[:, None] * (dx_hat - dx_hat.mean(dim=1, keepdim=True)
                            - x_hat * (dx_hat * x_hat).mean(dim=1, keepdim=True))
