"""The FlashNormAttention backward variants (``bench/variants/fna_backward.py``): the norms
apart (the backward before) and fused (shipped) give the same gradients on a small workload
row in reference mode, both against float64 autograd; ``gradcheck`` of the apart formulas."""

from __future__ import annotations

import pytest
import torch

import fna_backward  # bench/variants
from helion_kernels.spec import AttentionRow
from helion_kernels.techniques.attention import kernels
from helion_kernels.verify import check_outputs

ROW = AttentionRow(batch=3, H=2, D=32, max_seq_len_q=40, seq_len_kv=20, fill=0.5, seed=1)


@pytest.mark.ref_mode
def test_both_variants_against_float64():
    inputs = fna_backward.row_inputs(ROW, "cpu")
    dy, q, k, v, o, stats, qo, ko, lw, lb, rw, max_q, max_kv, activation, scale = inputs
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v, lw, lb, rw)]
    out = kernels.flash_norm_attention_reference(*leaves[:3], qo, ko, *leaves[3:], kernels.EPS, scale, activation)
    dq, dk, dv, *dparams = torch.autograd.grad(out, leaves, dy.double())
    for name in fna_backward.VARIANTS:
        got = fna_backward.run_variant(name, inputs)
        check_outputs(got, (dq, dk, dv, torch.stack(dparams)), torch.bfloat16, tolerance=fna_backward.TOLERANCE)


class _Block(torch.autograd.Function):
    """float64 forward of the block on rows [T, W] with a dense stand-in for the attention
    (``ln @ m``: any differentiable map of ``ln`` checks the formulas' plumbing), backward by
    the apart variant's two formulas."""

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
        do, ln, drw = fna_backward.fna_output_backward(dy, o, q, stats, lw, lb, rw)
        dq, dlw, dlb = fna_backward.fna_input_backward(dy, do, do @ m.t(), q, stats, lw)
        return dq, ln.t() @ do, dlw, dlb, drw


@pytest.mark.ref_mode  # float64 on the CPU, whatever the session
def test_gradcheck_apart_formulas():
    gen = torch.Generator().manual_seed(11)

    def t(*shape, center=0.0):
        return (center + torch.randn(*shape, generator=gen, dtype=torch.float64)).requires_grad_()

    q, m = t(4, 6), (0.3 * t(6, 6)).detach().requires_grad_()
    assert torch.autograd.gradcheck(_Block.apply, (q, m, t(6, center=1.0), t(6), t(6, center=1.0)))
