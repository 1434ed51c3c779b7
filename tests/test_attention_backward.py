"""Backward of ``gdpa`` and ``flash_norm_attention`` through the public ops and the
``FlashNormAttention`` module: every input's and parameter's gradient against autograd of the
float64 per-sequence reference, for every activation, affine on and off, empty sequences,
B = 1, sequences shorter than a tile; ``opcheck``; a compiled training step; deterministic
reruns on a GPU."""

from __future__ import annotations

import pytest
import torch

import helion_kernels as hk
from helion_kernels.techniques.attention.kernels import flash_norm_attention_reference
from helion_kernels.techniques.attention.kernels import gdpa_reference, random_jagged_inputs
from helion_kernels.limits import ACTIVATIONS
from helion_kernels.techniques import attention
from helion_kernels.verify import check_outputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_DEVICE = pytest.mark.cuda if DEVICE == "cuda" else pytest.mark.ref_mode
pytestmark = [ON_DEVICE, pytest.mark.filterwarnings("ignore::helion_kernels.registry.ConfigFallbackWarning")]
# fp32 on a GPU: the kernels' fp32 dots run on TF32 tensor cores (10 explicit mantissa bits),
# and the backward chains three of them (s, dp, ds @ k); 1e-3 failed there by up to a few 1e-3.
GRAD_TOLERANCE = {torch.bfloat16: 5e-2, torch.float32: 1e-2 if DEVICE == "cuda" else 1e-3}
H, D = 2, 32
# (q lengths, kv lengths): empty Q and KV sequences, shorter than a tile, several tiles; B = 1.
LAYOUTS = {"jagged": ([5, 0, 33, 3, 20], [7, 4, 0, 37, 1]), "single": ([3], [2])}


def _leaves(layout: str, dtype, seed: int, affine: bool = True, param_shape=(H * D,), dim: int = D):
    q_lengths, kv_lengths = LAYOUTS[layout]
    q, k, v, qo, ko = random_jagged_inputs(q_lengths, kv_lengths, H, dim, dtype, DEVICE, seed)
    gen = torch.Generator().manual_seed(seed + 1)

    def param(center):
        return (center + 0.2 * torch.randn(H * dim, generator=gen)).reshape(param_shape).to(DEVICE).requires_grad_()

    params = (param(1.0), param(0.0), param(1.0)) if affine else (None, None, None)
    return [t.requires_grad_() for t in (q, k, v)], params, qo, ko, max(q_lengths), max(kv_lengths)


def _against_f64(op_out, ref_fn, leaves, dtype, seed=0):
    probe = torch.randn(op_out.shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    (op_out.float() * probe).sum().backward()
    ref_leaves = [None if t is None else t.detach().double().requires_grad_() for t in leaves]
    (ref_fn(*ref_leaves) * probe.double()).sum().backward()
    for i, (got, ref) in enumerate(zip(leaves, ref_leaves)):
        if got is None:
            continue
        assert got.grad is not None and got.grad.dtype == got.dtype, i
        assert not torch.isnan(got.grad).any(), i
        try:
            check_outputs(got.grad, ref.grad, dtype, tolerance=GRAD_TOLERANCE[dtype])
        except AssertionError as err:
            raise AssertionError(f"gradient of input {i}: {err}") from None


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_flash_norm_attention_gradients(activation, dtype, affine, layout):
    (q, k, v), params, qo, ko, max_q, max_kv = _leaves(layout, dtype, seed=len(activation), affine=affine)
    out = hk.flash_norm_attention(q, k, v, qo, ko, max_q, max_kv, *params, activation=activation, qk_scale=0.7)

    def reference(q, k, v, lw, lb, rw):
        hd = [None if p is None else p.reshape(H, D) for p in (lw, lb, rw)]
        return flash_norm_attention_reference(q, k, v, qo, ko, *hd, 1e-5, 0.7, activation)

    _against_f64(out, reference, [q, k, v, *params], dtype)


@pytest.mark.parametrize("dim", [48, 96])
def test_head_dim_not_a_power_of_two(dim):
    """Padded lanes masked out of both norms (the interpreter test checks the Triton code)."""
    (q, k, v), params, qo, ko, max_q, max_kv = _leaves("jagged", torch.bfloat16, dim, param_shape=(H * dim,),
                                                        dim=dim)
    out = hk.flash_norm_attention(q, k, v, qo, ko, max_q, max_kv, *params, activation="silu")

    def reference(q, k, v, lw, lb, rw):
        hd = [p.reshape(H, dim) for p in (lw, lb, rw)]
        return flash_norm_attention_reference(q, k, v, qo, ko, *hd, 1e-5, 1.0, "silu")

    _against_f64(out, reference, [q, k, v, *params], torch.bfloat16)


def test_parameters_as_heads_by_dim():
    """[H, D] affine parameters get [H, D] gradients."""
    (q, k, v), params, qo, ko, max_q, max_kv = _leaves("jagged", torch.float32, 3, param_shape=(H, D))
    hk.flash_norm_attention(q, k, v, qo, ko, max_q, max_kv, *params).sum().backward()
    assert all(p.grad is not None and p.grad.shape == (H, D) for p in params)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gdpa_gradients(activation, layout):
    (q, k, v), _, qo, ko, max_q, max_kv = _leaves(layout, torch.float32, seed=7)
    out = hk.gdpa(q, k, v, qo, ko, max_q, max_kv, activation, 0.7)
    _against_f64(out, lambda q, k, v: gdpa_reference(q, k, v, qo, ko, 0.7, activation), [q, k, v], torch.float32)


def test_no_rows_and_no_kv():
    """No Q rows at all: empty gradients; no KV rows: only the norms and residuals remain."""
    (q, k, v), params, qo, ko, _, _ = _leaves("single", torch.float32, 2)
    empty = q.detach()[:0].requires_grad_()
    hk.flash_norm_attention(empty, k, v, torch.zeros_like(qo), ko, 0, 2, *params).sum().backward()
    assert empty.grad.shape == empty.shape
    (q, k, v), params, qo, _, max_q, _ = _leaves("single", torch.float32, 4)
    k0, v0 = (t.detach()[:0].requires_grad_() for t in (k, v))
    ko0 = torch.zeros_like(qo)
    out = hk.flash_norm_attention(q, k0, v0, qo, ko0, max_q, 0, *params)

    def reference(q, lw, lb, rw):
        hd = [p.reshape(H, D) for p in (lw, lb, rw)]
        return flash_norm_attention_reference(q, k0.double(), v0.double(), qo, ko0, *hd)

    _against_f64(out, reference, [q, *params], torch.float32)


def test_only_the_parameters_require_grad():
    (q, k, v), params, qo, ko, max_q, max_kv = _leaves("jagged", torch.float32, 5)
    q, k, v = (t.detach() for t in (q, k, v))
    hk.flash_norm_attention(q, k, v, qo, ko, max_q, max_kv, *params).sum().backward()
    assert all(p.grad is not None for p in params)


def test_module_matches_the_op_and_its_state_dict():
    module = hk.FlashNormAttention(H, D, activation="silu", qk_scale=0.5).to(DEVICE)
    assert set(module.state_dict()) == {"ln.weight", "ln.bias", "rms.weight"}
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    (q, k, v), _, qo, ko, max_q, max_kv = _leaves("jagged", torch.float32, 6)
    out = module(q, k, v, qo, ko, max_q, max_kv)
    ref = flash_norm_attention_reference(q.double(), k.double(), v.double(), qo, ko,
                                         *(p.detach().double().view(H, D) for p in (module.ln.weight, module.ln.bias,
                                                                                    module.rms.weight)),
                                         1e-5, 0.5, "silu")
    check_outputs(out, ref, torch.float32)
    out.sum().backward()
    assert all(p.grad is not None for p in module.parameters())
    other = hk.FlashNormAttention(H, D).to(DEVICE)
    other.load_state_dict(module.state_dict())
    assert torch.equal(other.rms.weight, module.rms.weight)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_compiled_training_step():
    """``torch.compile(fullgraph=True)`` of forward + backward gives the eager gradients."""
    (q, k, v), params, qo, ko, max_q, max_kv = _leaves("jagged", torch.float32, 8)

    def step(q, k, v, lw, lb, rw):
        return hk.flash_norm_attention(q, k, v, qo, ko, max_q, max_kv, lw, lb, rw, validate=False).square().sum()

    leaves = [q, k, v, *params]
    eager = torch.autograd.grad(step(*leaves), leaves)
    torch._dynamo.reset()
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    compiled = torch.autograd.grad(torch.compile(step, fullgraph=True, backend=backend)(*leaves), leaves)
    for e, c in zip(eager, compiled):
        torch.testing.assert_close(c, e, rtol=1e-4, atol=1e-5)


def test_opcheck_with_autograd():
    (q, k, v), params, qo, ko, max_q, max_kv = _leaves("jagged", torch.float32, 9)
    torch.library.opcheck(attention._FNA.custom_op,
                          (q, k, v, qo, ko, max_q, max_kv, *params, 1e-5, "relu", 0.7, True, True))
    torch.library.opcheck(attention._GDPA.custom_op, (q, k, v, qo, ko, max_q, max_kv, "relu", 0.7, True))
    out, o, stats = attention._FNA(q, k, v, qo, ko, max_q, max_kv, *params, 1e-5, "relu", 0.7, True, True)
    for need_params, fused in ((True, None), (False, None), (True, False), (False, False)):  # False: norms apart
        torch.library.opcheck(attention._FNA_BACKWARD.custom_op,
                              (torch.randn_like(out), q, k, v, o, stats, qo, ko, *params, max_q, max_kv, "relu", 0.7,
                               need_params, True, fused), test_utils=("test_schema", "test_faketensor"))


@pytest.mark.cuda
def test_backward_is_deterministic():
    (q, k, v), params, qo, ko, max_q, max_kv = _leaves("jagged", torch.bfloat16, 10)
    leaves = [q, k, v, *params]

    def grads_of():
        out = hk.flash_norm_attention(q, k, v, qo, ko, max_q, max_kv, *params)
        return torch.autograd.grad(out.float().square().sum(), leaves)

    assert all(torch.equal(a, b) for a, b in zip(grads_of(), grads_of()))


def test_double_backward_is_a_clear_error():
    (q, k, v), params, qo, ko, max_q, max_kv = _leaves("single", torch.float32, 12)
    for loss in (lambda out: out.square().sum(), lambda out: out.sum()):  # the second's gradient needs no grad
        out = hk.flash_norm_attention(q, k, v, qo, ko, max_q, max_kv, *params)
        with pytest.raises(RuntimeError, match="flash_norm_attention: the backward is not differentiable"):
            torch.autograd.grad(loss(out), q, create_graph=True)


def test_module_checks_its_configuration():
    for kwargs in ({"num_heads": 0, "head_dim": 32}, {"num_heads": 2, "head_dim": 8},
                   {"num_heads": 2, "head_dim": 32, "activation": "tanh"},
                   {"num_heads": 2, "head_dim": 32, "eps": -1.0}):
        with pytest.raises(ValueError, match="FlashNormAttention"):
            hk.FlashNormAttention(**kwargs)
    (q, k, v), _, qo, ko, max_q, max_kv = _leaves("single", torch.float32, 13)
    with pytest.raises(ValueError, match=r"\[\*, 3, 32\] \(the module's num_heads"):
        hk.FlashNormAttention(3, D).to(DEVICE)(q, k, v, qo, ko, max_q, max_kv)
