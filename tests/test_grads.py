"""Helpers of :mod:`helion_kernels.grads` that the unfused paths and the backward passes share."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from helion_kernels import autograd
from helion_kernels.techniques import attention, prenorm
from helion_kernels.techniques import postnorm


def test_widths_static_compiles_once_per_width_after_the_first_m():
    """What ``run_compiled`` gives inductor on a GPU, checked with dynamo's eager backend (the
    marks, not the code generator, decide when it compiles): one graph for the first M, one
    for every other M, and a new N one new graph (N stays static; M is already known to vary),
    right results, the caller's tensors unmarked."""
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(postnorm._rms_norm_stats, backend="eager", dynamic=None)
    graphs = []
    for n in (40, 64, 80):
        weight = torch.randn(n)
        for m in (2, 3, 37, 100, 17, 5, 65, 1000, 9):  # not 64: a weight of that length reads as rows
            x = torch.randn(m, n)
            y, rstd = autograd.call_compiled(compiled, (x, weight, 1e-5))
            torch.testing.assert_close(y, F.rms_norm(x, (n,), weight, 1e-5))
            torch.testing.assert_close(rstd, torch.rsqrt(x.pow(2).mean(dim=1) + 1e-5))
            assert not hasattr(weight, "_dynamo_static_indices") and not hasattr(x, "_dynamo_static_indices")
        graphs.append(counters["stats"]["unique_graphs"])
    # 9 M's at each of three N's: 2 graphs, then 1 more per N (dynamic=False: 27; unmarked
    # dynamic=None: [2, 3, 3], the third graph with N symbolic and reused for every later N)
    assert graphs == [2, 3, 4]
    torch._dynamo.reset()


def test_widths_static_marks_all_but_the_rows():
    """Every dimension of M's length is left to vary, wherever it is (the attention's [3, M]
    statistics); every other one is static."""
    x, rstd, weight, b, stats = torch.randn(6, 4), torch.randn(6), torch.randn(4), torch.randn(4, 3), torch.randn(3, 6)
    marked = autograd.widths_static((x, rstd, weight, b, stats, 1e-5, None, "rms"))
    assert marked[5:] == (1e-5, None, "rms")
    assert all(t is not s and t.data_ptr() == s.data_ptr() for t, s in zip(marked[:5], (x, rstd, weight, b, stats)))
    assert marked[0]._dynamo_static_indices == {1}
    assert not hasattr(marked[1], "_dynamo_static_indices")  # [M]: rows only
    assert marked[2]._dynamo_static_indices == {0}
    assert marked[3]._dynamo_static_indices == {0, 1}  # a [K, N] weight: no rows
    assert marked[4]._dynamo_static_indices == {0}  # [3, M]


def test_widths_static_lets_jagged_totals_vary():
    """The attention's backward pass: rows [T, W] and statistics [3, T], with T (the jagged
    batch's total) new at every step, compile twice, not once per T."""
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(attention._fna_input_backward, backend="eager", dynamic=None)
    width = 8
    ln_weight = torch.randn(width)
    for total in (5, 9, 30, 17, 64, 3):
        rows = [torch.randn(total, width) for _ in range(4)]
        stats = torch.rand(3, total) + 0.5
        autograd.call_compiled(compiled, (*rows, stats, ln_weight))
    assert counters["stats"]["unique_graphs"] == 2
    torch._dynamo.reset()


def test_call_compiled_holds_more_graphs_than_dynamos_default():
    """Twelve widths, each its own graph, all compiled (dynamo's default limit of 8 per
    function would run the last ones eagerly)."""
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(postnorm._rms_norm_stats, backend="eager", dynamic=None)
    for n in range(8, 8 + 12):
        autograd.call_compiled(compiled, (torch.randn(4, n), torch.randn(n), 1e-5))
    assert counters["stats"]["unique_graphs"] == 12  # without the raised limit: 8
    torch._dynamo.reset()


class _MmOutputs(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the storage of every ``aten.mm`` output."""

    def __init__(self):
        super().__init__()
        self.ptrs = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.mm.default:
            self.ptrs.append(out.data_ptr())
        return out


def _prenorm_inputs(m=9, k=24, n=20, device="cpu", dtype=torch.float32):
    gen = torch.Generator().manual_seed(3)
    a, b, dc = (torch.randn(*shape, generator=gen).to(device, dtype) for shape in ((m, k), (k, n), (m, n)))
    return a, b, dc, (torch.rand(m, generator=gen) + 0.5).to(device)


def test_unfused_prenorm_norm_backward_writes_da_over_dx_hat():
    """The unfused pre-norm dgrad writes dA into the dgrad GEMM's output (the [M, K] ``dx_hat``
    nothing reads after it), with and without ``x_hat``, and the values are the out-of-place
    pass's; a dtype that differs from ``a``'s (``dx_hat`` in fp32) takes the out-of-place pass."""
    a, b, dc, rstd = _prenorm_inputs()
    expected = prenorm.prenorm_da(dc @ b.t(), a, rstd)
    for fn in (prenorm.rmsnorm_matmul_da, lambda *args: prenorm.rmsnorm_matmul_dgrad(*args)[0]):
        with _MmOutputs() as mm:
            da = fn(a, b, dc, rstd)
        assert da.data_ptr() == mm.ptrs[0]
        torch.testing.assert_close(da, expected)
    assert not prenorm.dgrad_in_place(torch.empty(9, 24), a.to(torch.bfloat16))


@pytest.mark.cuda
@pytest.mark.parametrize("fn", ["rmsnorm_matmul_da", "rmsnorm_matmul_dgrad"])
def test_inductor_writes_da_in_place(fn):
    """On a GPU the pass is inductor's: it stores dA into ``dx_hat``'s buffer rather than a
    new one and a copy, so the call's peak is ``dx_hat`` (plus ``x_hat`` for the dgrad), not one
    [M, K] more."""
    m, k = 4096, 1024
    a, b, dc, rstd = _prenorm_inputs(m, k, 512, device="cuda", dtype=torch.bfloat16)
    call = getattr(prenorm, fn)
    call(a, b, dc, rstd)  # compiles
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = call(a, b, dc, rstd)
    torch.cuda.synchronize()
    tensors = 1 if fn == "rmsnorm_matmul_da" else 2
    assert torch.cuda.max_memory_allocated() - base < (tensors + 0.5) * m * k * a.element_size()
    del out


class _Block(torch.autograd.Function):
    """float64 forward of the FlashNormAttention block on rows [T, W] with a dense stand-in for
    the attention (``ln @ m``: any differentiable map of ``ln`` checks the formulas' plumbing),
    backward by the norms-apart path's two row passes."""

    @staticmethod
    def forward(ctx, q, m, lw, lb, rw):
        var, mean = torch.var_mean(q, dim=1, correction=0)
        rstd = torch.rsqrt(var + 1e-5)
        ln = (q - mean[:, None]) * rstd[:, None] * lw + lb
        o = ln @ m + ln
        rstd_o = torch.rsqrt(o.pow(2).mean(dim=1) + 1e-5)
        ctx.save_for_backward(q, m, lw, lb, rw, o, torch.stack([mean, rstd, rstd_o]))
        return o * rstd_o[:, None] * rw + q

    @staticmethod
    def backward(ctx, dy):
        q, m, lw, lb, rw, o, stats = ctx.saved_tensors
        do, ln, drw = attention._fna_output_backward(dy, o, q, stats, lw, lb, rw)
        dq, dlw, dlb = attention._fna_input_backward(dy, do, do @ m.t(), q, stats, lw)
        return dq, ln.t() @ do, dlw, dlb, drw


def test_gradcheck_attention_norm_row_passes():
    gen = torch.Generator().manual_seed(11)

    def t(*shape, center=0.0):
        return (center + torch.randn(*shape, generator=gen, dtype=torch.float64)).requires_grad_()

    q, m = t(4, 6), (0.3 * t(6, 6)).detach().requires_grad_()
    assert torch.autograd.gradcheck(_Block.apply, (q, m, t(6, center=1.0), t(6), t(6, center=1.0)))
