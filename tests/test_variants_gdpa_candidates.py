"""The attention precision variants (``bench/variants/gdpa_candidates.py``): each variant of
each kernel against the kernel's fp32 reference, in reference mode and in the generated Triton
code under the interpreter, so that a GPU run times only variants whose math is right; and the
tanh forms of the GELU and of its derivative (the kernels' before) against torch."""

from __future__ import annotations

import helion
import pytest
import torch

import gdpa_candidates  # bench/variants
from helion_kernels.spec import AttentionRow
from helion_kernels.techniques import get_spec
from helion_kernels.verify import check_outputs

ROW = AttentionRow(batch=3, H=2, D=32, max_seq_len_q=40, seq_len_kv=20, fill=0.5, seed=1)
# [tile_q, tile_kv] of gdpa and dq; [tile_kv, tile_q] of dkdv and flash_norm_attention (16 to 128)
SMALL = helion.Config(block_sizes=[16, 16], num_warps=4, num_stages=1)


def _check(name: str, candidate: str, dtype: torch.dtype, config, tolerance: float):
    spec = get_spec(name)
    args = spec.make_args(ROW, dtype, "cpu", 3)
    got, _ = gdpa_candidates.run_candidate(name, candidate, args, config)
    got = got if isinstance(got, tuple) else (got,)
    assert check_outputs(got, spec.reference(*args), dtype, tolerance=tolerance) < tolerance


@pytest.mark.ref_mode
@pytest.mark.parametrize("candidate", list(gdpa_candidates.CANDIDATES))
@pytest.mark.parametrize("name", gdpa_candidates.KERNELS)
def test_candidates_in_reference_mode(name, candidate):
    _check(name, candidate, torch.float32, None, 1e-4)
    _check(name, candidate, torch.bfloat16, None, gdpa_candidates.TOLERANCE[name])


@pytest.mark.triton_interpret
@pytest.mark.parametrize("candidate", ["shipped", "bf16+tanh"])
@pytest.mark.parametrize("name", gdpa_candidates.KERNELS)
def test_candidates_under_the_interpreter(name, candidate):
    """fp16: Triton's interpreter has no bf16 constants (the shipped kernels build some)."""
    _check(name, candidate, torch.float16, SMALL, 1e-2)


def test_the_tanh_gelu_and_its_derivative():
    s = torch.linspace(-8, 8, 2001, dtype=torch.float64, requires_grad=True)
    want = torch.nn.functional.gelu(s, approximate="tanh")
    torch.testing.assert_close(gdpa_candidates.tanh_activation(s, 0), want, rtol=1e-12, atol=1e-12)
    (grad,) = torch.autograd.grad(want.sum(), s)
    torch.testing.assert_close(gdpa_candidates.tanh_activation_grad(s.detach(), 0), grad, rtol=1e-12, atol=1e-12)


def test_a_swap_reaches_the_kernel():
    """The variant's kernel reads the swapped helper, the shipped kernel is untouched."""
    spec = get_spec("gdpa")
    assert gdpa_candidates.candidate_kernel(spec.kernel, "shipped") is spec.kernel
    before = gdpa_candidates.candidate_kernel(spec.kernel, "bf16+tanh")
    assert before is not spec.kernel and before.fn.__globals__["score_dot"] is gdpa_candidates.rounded_dot
    assert spec.kernel.fn.__globals__["score_dot"] is not gdpa_candidates.rounded_dot


def test_a_config_is_needed_outside_reference_mode(monkeypatch):
    """Without a config a Helion kernel autotunes itself on a GPU: refused."""
    from helion_kernels import runtime

    monkeypatch.setattr(runtime, "reference_mode", lambda kernel: False)
    spec = get_spec("gdpa")
    with pytest.raises(ValueError, match="a config is needed"):
        gdpa_candidates.run_candidate("gdpa", "shipped", spec.make_args(ROW, torch.float32, "cpu", 0), None)
