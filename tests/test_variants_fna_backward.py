"""The FlashNormAttention backward variants (``bench/variants/fna_backward.py``): the norms
apart and fused give the same gradients on a small workload row in reference mode, both
against float64 autograd, with the affine parameters and without."""

from __future__ import annotations

import pytest
import torch

import fna_backward  # bench/variants
from helion_kernels import runtime
from helion_kernels.limits import ACTIVATIONS
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


@pytest.mark.ref_mode
def test_both_variants_without_affine_parameters():
    dy, q, k, v, _, _, qo, ko, _, _, _, max_q, max_kv, activation, scale = fna_backward.row_inputs(ROW, "cpu")
    o, stats = torch.empty_like(q), q.new_empty(3, q.shape[0], dtype=torch.float32)
    act = ACTIVATIONS.index(activation)
    runtime.launch(kernels.SPEC, (q, k, v, qo, ko, max_q, None, None, None, kernels.EPS, scale, act, o, stats))
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out = kernels.flash_norm_attention_reference(*leaves, qo, ko, None, None, None, kernels.EPS, scale, activation)
    want = torch.autograd.grad(out, leaves, dy.double())
    inputs = (dy, q, k, v, o, stats, qo, ko, None, None, None, max_q, max_kv, activation, scale)
    for name in fna_backward.VARIANTS:
        dq, dk, dv, dparams = fna_backward.run_variant(name, inputs, need_params=False)
        assert dparams.numel() == 0
        check_outputs((dq, dk, dv), want, torch.bfloat16, tolerance=fna_backward.TOLERANCE)
