"""Jagged GDPA backward kernels (dq; dk and dv): reference mode, Triton interpreter and CUDA,
against autograd of the float64 per-sequence reference, for every activation, with empty
sequences, sequences shorter than a tile and B = 1; bit-identical reruns; and the
activations' derivatives against autograd."""

from __future__ import annotations

import helion
import pytest
import torch

from helion_kernels.techniques.attention.kernels import random_jagged_inputs
from helion_kernels import runtime
from helion_kernels.techniques.attention.kernels import (
    SPEC_GDPA_DKDV,
    SPEC_GDPA_DQ,
    activation_grad,
    gdpa_backward_reference,
    gdpa_dkdv_kernel,
    gdpa_dq_kernel,
)
from helion_kernels.techniques.attention.kernels import activation_fn
from helion_kernels.limits import ACTIVATIONS
from helion_kernels.verify import check_outputs

pytestmark = pytest.mark.usefixtures("poisoned_empty")  # every gradient row must be written

# Empty Q and KV sequences, sequences shorter than a tile, more than one tile of each.
Q_LENGTHS = [5, 0, 33, 3, 20]
KV_LENGTHS = [7, 4, 0, 37, 1]
GRAD_TOLERANCE = {torch.bfloat16: 5e-2, torch.float16: 1e-2, torch.float32: 1e-4}


def _inputs(dtype, device, seed, heads=2, dim=32, q_lengths=Q_LENGTHS, kv_lengths=KV_LENGTHS):
    q, k, v, qo, ko = random_jagged_inputs(q_lengths, kv_lengths, heads, dim, dtype, device, seed)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    dout = torch.randn(q.shape, generator=gen, device=device).to(dtype)
    return q, k, v, dout, qo, ko


SMALL = helion.Config(block_sizes=[16, 16], num_warps=4, num_stages=1)


def _run(inputs, act: int, scale: float, config: helion.Config | None):
    q, k, v, dout, qo, ko = inputs
    max_q = int((qo[1:] - qo[:-1]).max())
    max_kv = int((ko[1:] - ko[:-1]).max())
    dq_args = (q, k, v, dout, qo, ko, max_q, scale, act)
    dkdv_args = (q, k, v, dout, qo, ko, max_kv, scale, act)
    if config is None:  # the registry's configs (else the defaults), as the ops launch them
        return (runtime.launch(SPEC_GDPA_DQ, dq_args), *runtime.launch(SPEC_GDPA_DKDV, dkdv_args))
    outs = []
    for kernel, args in ((gdpa_dq_kernel, dq_args), (gdpa_dkdv_kernel, dkdv_args)):
        bound = kernel.bind(args)
        bound.set_config(config)
        out = bound(*args)
        outs.extend(out if isinstance(out, tuple) else (out,))
    return tuple(outs)


def _check(inputs, act: int, dtype, config: helion.Config | None, scale: float = 0.7):
    grads = _run(inputs, act, scale, config)
    q, k, v, dout, qo, ko = inputs
    expected = gdpa_backward_reference(q, k, v, dout, qo, ko, scale, ACTIVATIONS[act])
    for name, got, ref in zip(("dq", "dk", "dv"), grads, expected):
        assert got.shape == ref.shape and got.dtype == dtype, name
        assert not torch.isnan(got).any(), name
        bounds = (qo if name == "dq" else ko).tolist()
        for start, end in zip(bounds, bounds[1:]):  # each sequence at its own scale
            try:
                check_outputs(got[start:end], ref[start:end], dtype, tolerance=GRAD_TOLERANCE[dtype])
            except AssertionError as err:
                raise AssertionError(f"{name}, rows {start}:{end}: {err}") from None


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_reference_mode(activation, dtype, device):
    _check(_inputs(dtype, device, 3), ACTIVATIONS.index(activation), dtype, config=None)


@pytest.mark.ref_mode
def test_single_sequence(device):
    """B = 1, a sequence shorter than any tile."""
    inputs = _inputs(torch.float32, device, 5, heads=1, dim=16, q_lengths=[3], kv_lengths=[2])
    _check(inputs, 0, torch.float32, config=None)


@pytest.mark.triton_interpret
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_under_the_interpreter(activation):
    """16-row tiles: partial last tiles, several of each, empty sequences."""
    dtype = torch.float16  # bf16 tl.dot is broken in the interpreter
    _check(_inputs(dtype, "cpu", 7), ACTIVATIONS.index(activation), dtype, config=SMALL)


@pytest.mark.triton_interpret
@pytest.mark.parametrize("tiles", [(64, 32), (32, 32), (128, 32), (64, 64)], ids=lambda t: "x".join(map(str, t)))
def test_the_swept_tilings_under_the_interpreter(tiles):
    """The tilings of the GDPA backward sweep on the H200, where dk/dv at [tile_kv, tile_q] =
    64x32, 4 warps, 2 stages gave a wrong dk: under the interpreter (which ignores warps and
    stages) they compute dq, dk and dv right, here in fp16 at H 2, D 32, sequences of 1 to 130
    rows against 5 to 128 (not the sweep's shapes)."""
    inputs = _inputs(torch.float16, "cpu", 11, q_lengths=[1, 70, 130, 33], kv_lengths=[128, 100, 64, 5])
    _check(inputs, 0, torch.float16, config=helion.Config(block_sizes=list(tiles), num_warps=4, num_stages=2))


@pytest.mark.cuda
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_cuda(activation):
    inputs = _inputs(torch.bfloat16, "cuda", 9, heads=4, dim=128,
                     q_lengths=[5, 0, 300, 3, 129], kv_lengths=[7, 4, 0, 128, 1])
    _check(inputs, ACTIVATIONS.index(activation), torch.bfloat16, config=None)
    first = _run(inputs, ACTIVATIONS.index(activation), 0.7, None)
    again = _run(inputs, ACTIVATIONS.index(activation), 0.7, None)
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # deterministic: no atomics


@pytest.mark.ref_mode
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_activation_grad_matches_autograd(activation):
    s = torch.linspace(-6, 6, 1001, dtype=torch.float64).requires_grad_()
    (expected,) = torch.autograd.grad(activation_fn(activation)(s).sum(), s)
    got = activation_grad(s.detach(), ACTIVATIONS.index(activation))
    torch.testing.assert_close(got.to(torch.float64), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.ref_mode
@pytest.mark.parametrize("name", ["gdpa", "gdpa_dq", "gdpa_dkdv"])
def test_gdpa_kernels_take_their_registry_config_and_run_their_default_quietly(name):
    """Each GDPA kernel runs its registry entry for (H, D) where there is one, and its default
    (the config pinned on it before it could be tuned) without a warning where there is none."""
    import warnings

    from helion_kernels import registry
    from helion_kernels.spec import AttentionRow
    from helion_kernels.techniques import get_spec

    spec = get_spec(name)
    args = spec.make_args(AttentionRow(3, 2, 32, 40, 20, 0.5, 0), torch.float32, "cpu", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolved = runtime.resolve(spec, args)
    assert resolved.source == "default" and repr(resolved.config) == repr(spec.default_config)
    tuned = helion.Config(block_sizes=[32, 16], num_warps=2, num_stages=1)
    registry.save_entry(name, registry.gpu_key(args[0].device), registry.Entry(spec.key_of(args), "float32", tuned))
    resolved = runtime.resolve(spec, args)
    assert resolved.source == "exact" and resolved.config.config["block_sizes"] == [32, 16]
    for got, want in zip(runtime.launch(spec, args) if name == "gdpa_dkdv" else (runtime.launch(spec, args),),
                         spec.reference(*args)):
        assert check_outputs((got,), (want,), torch.float32) < 1e-4


def test_a_jagged_call_reads_the_registry_once_per_key(monkeypatch):
    """Jagged totals change every step, so the launch cache (keyed on shapes) misses each call;
    the registry is still read once per (H, D), dtype and device, until clear_cache."""
    from helion_kernels.spec import AttentionRow
    from helion_kernels.techniques import get_spec

    spec = get_spec("gdpa_dq")
    calls = []
    resolve = runtime.resolve
    monkeypatch.setattr(runtime, "resolve", lambda *a, **k: calls.append(a) or resolve(*a, **k))
    runtime.clear_cache()
    for batch in (3, 4, 5):  # three totals, one key
        runtime._resolved(spec, spec.make_args(AttentionRow(batch, 2, 32, 40, 20, 0.5, 0), torch.float32, "cpu", 0))
    assert len(calls) == 1
    runtime._resolved(spec, spec.make_args(AttentionRow(3, 4, 32, 40, 20, 0.5, 0), torch.float32, "cpu", 0))
    assert len(calls) == 2  # another H
    runtime.clear_cache()
    runtime._resolved(spec, spec.make_args(AttentionRow(3, 2, 32, 40, 20, 0.5, 0), torch.float32, "cpu", 0))
    assert len(calls) == 3
