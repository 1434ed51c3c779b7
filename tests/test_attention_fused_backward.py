"""FlashNormAttention's fused backward kernel (both norms' backward inside GDPA's dq kernel):
``dq``, the norm parameters' gradients, and the ``ln`` / ``do`` it hands to the dk/dv kernel,
against autograd of the float64 block (and the same of the norms-apart path the op runs where
the kernel is not tuned faster; the dispatch between them), in reference mode, under the Triton interpreter (explicit
16-row tiles: partial tiles, empty sequences, a head_dim padded to a power of two, no affine
parameters) and on a GPU with the registry's config; the block barrier between the parked
``dln`` and its re-read in the generated code. The public op's gradients are tested in
``test_attention_backward.py``."""

from __future__ import annotations

import helion
import pytest
import torch

from helion_kernels import registry, runtime
from helion_kernels.limits import ACTIVATIONS
from helion_kernels.techniques import attention
from helion_kernels.techniques.attention.kernels import (
    EPS,
    SPEC_FNA_DQ,
    flash_norm_attention_dq_kernel,
    fna_dq_args,
    random_jagged_inputs,
)
from helion_kernels.verify import check_outputs, comparable

pytestmark = pytest.mark.usefixtures("poisoned_empty")  # every dq, ln and do row must be written

Q_LENGTHS = [5, 0, 33, 3, 1]  # 16-row tiles: partial last tiles, an empty sequence, M = 1
KV_LENGTHS = [7, 4, 0, 37, 128]  # an empty KV sequence (only the norms remain), the KV limit
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
SMALL = helion.Config(block_sizes=[16, 16], num_warps=4, num_stages=1)


def _args(dtype, device, seed, heads=2, dim=32, mean=0.0, activation=0, kv_lengths=KV_LENGTHS):
    q, k, v, qo, ko = random_jagged_inputs(Q_LENGTHS, kv_lengths, heads, dim, dtype, device, seed)
    q = (q.float() + mean).to(dtype)  # rows far from zero mean: the LayerNorm's hard case
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    params = [((1.0 if i != 1 else 0.0) + 0.2 * torch.randn(heads, dim, generator=gen, device=device)).to(dtype)
              for i in range(3)]
    dy = torch.randn(q.shape, generator=gen, device=device).to(dtype)
    return fna_dq_args(q, k, v, qo, ko, max(Q_LENGTHS), *params, EPS, 0.7, activation, dy)


def _check(args, outputs, dtype):
    """dq per sequence (each at its own scale), ln, do and the summed parameter gradients
    against the spec's reference in float64."""
    qo = args[6]
    wide = tuple(t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in args)
    expected = SPEC_FNA_DQ.reference(*wide)
    got = comparable(SPEC_FNA_DQ, outputs)
    assert got[0].dtype == got[1].dtype == got[2].dtype == dtype
    bounds = qo.tolist()
    for start, end in zip(bounds, bounds[1:]):
        if end > start:
            check_outputs(got[0][start:end], expected[0][start:end], dtype, tolerance=TOLERANCE[dtype])
    for name, out, ref in zip(("ln", "do", "parameter gradients"), got[1:], expected[1:]):
        try:
            check_outputs(out, ref, dtype, tolerance=TOLERANCE[dtype])
        except AssertionError as err:
            raise AssertionError(f"{name}: {err}") from None


@pytest.mark.ref_mode
@pytest.mark.parametrize("mean", [0.0, 300.0], ids=["centred", "large_mean"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_reference_mode(dtype, mean, device):
    args = _args(dtype, device, 3, mean=mean)
    _check(args, runtime.launch(SPEC_FNA_DQ, args), dtype)


@pytest.mark.ref_mode
def test_without_parameter_sums(device):
    """``param_sums`` = 0 (no parameter needs a gradient): the same dq, one row of zeros."""
    args = _args(torch.float32, device, 4)
    dq, _, _, partials = runtime.launch(SPEC_FNA_DQ, (*args[:14], 0))
    assert partials.shape == (3, 1, 2, 32) and not partials.any()
    check_outputs(dq, SPEC_FNA_DQ.reference(*args)[0], torch.float32, tolerance=1e-4)


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("keys", ["keys", "no_keys"])
def test_norms_apart_path(keys, dtype, device):
    """What the op runs where the fused kernel is not tuned faster: the same four results,
    also with no KV rows at all (only the norms and the residual paths remain)."""
    args = _args(dtype, device, 3, mean=300.0, kv_lengths=KV_LENGTHS if keys == "keys" else [0] * len(KV_LENGTHS))
    dq, ln, do, dparams = attention._norms_apart_dq(*args)
    _check(args, (dq, ln, do, dparams[:, None]), dtype)  # dparams as one slot of partial sums


def test_dispatch(decisions):
    """The fused kernel only where the registry recorded it faster than the norms apart;
    ``fused`` forces."""
    args = _args(torch.float32, "cpu", 0)
    assert not runtime.decide(SPEC_FNA_DQ, args).fused  # no entry
    assert runtime.decide(SPEC_FNA_DQ, args, True).fused
    meta = {"latency_ms": 0.01, "dispatch": {"choice": "fused", "fused_ms": 0.01, "unfused_ms": 0.02,
                                             "unfused": SPEC_FNA_DQ.dispatch_baseline}}
    registry.save_entry(SPEC_FNA_DQ.name, registry.gpu_key(torch.device("cpu")),
                        registry.Entry(SPEC_FNA_DQ.key_of(args), "float32", SPEC_FNA_DQ.default_config, meta))
    runtime.clear_cache()
    assert runtime.decide(SPEC_FNA_DQ, args).fused
    assert not runtime.decide(SPEC_FNA_DQ, args, False).fused
    # one decision per (H, D), whatever the jagged total of the step
    shorter = (args[0][:7], *args[1:])
    assert runtime.decide(SPEC_FNA_DQ, shorter) is runtime.decide(SPEC_FNA_DQ, args)


def test_dispatch_ignores_a_gemm_pipeline_record(decisions):
    """A hand-edited record naming Liger's norm (a GEMM pipeline) runs the norms apart."""
    args = _args(torch.float32, "cpu", 0)
    meta = {"latency_ms": 0.01, "dispatch": {"choice": "unfused", "fused_ms": 0.01, "unfused_ms": 0.02,
                                             "unfused": "cublas+liger_norm"}}
    registry.save_entry(SPEC_FNA_DQ.name, registry.gpu_key(torch.device("cpu")),
                        registry.Entry(SPEC_FNA_DQ.key_of(args), "float32", SPEC_FNA_DQ.default_config, meta))
    decision = runtime.decide(SPEC_FNA_DQ, args)
    assert not decision.fused and decision.pipeline == SPEC_FNA_DQ.dispatch_baseline


@pytest.mark.triton_interpret
@pytest.mark.parametrize(("heads", "dim"), [(2, 32), (3, 48)], ids=["2x32", "3x48_padded"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_under_the_interpreter(activation, heads, dim):
    dtype = torch.float16  # bf16 tl.dot is broken in the interpreter
    args = _args(dtype, "cpu", 5, heads, dim, mean=2.0, activation=ACTIVATIONS.index(activation))
    bound = flash_norm_attention_dq_kernel.bind(tuple(args))
    bound.set_config(SMALL)
    _check(args, bound(*args), dtype)


@pytest.mark.triton_interpret
@pytest.mark.parametrize("tiles", [(32, 16), (128, 16), (16, 64)], ids=lambda t: "x".join(map(str, t)))
def test_tilings_under_the_interpreter(tiles):
    """[tile_kv, tile_q]: a KV tile of the whole 128-row limit, Q tiles past every sequence."""
    dtype = torch.float16
    args = _args(dtype, "cpu", 9, 2, 32, mean=2.0)
    bound = flash_norm_attention_dq_kernel.bind(args)
    bound.set_config(helion.Config(block_sizes=list(tiles), num_warps=4, num_stages=1))
    _check(args, bound(*args), dtype)


@pytest.mark.triton_interpret
def test_without_affine_parameters_under_the_interpreter():
    """No affine parameters (the kernel's None branches): checked against ones and zeros."""
    dtype = torch.float16
    args = list(_args(dtype, "cpu", 6, 2, 32))
    ones, zeros = torch.ones(2, 32, dtype=dtype), torch.zeros(2, 32, dtype=dtype)
    args[4:6] = fna_dq_args(*args[:3], *args[6:9], ones, zeros, ones, EPS, 0.7, 0, args[3])[4:6]
    plain = (*args[:9], None, None, None, *args[12:])
    bound = flash_norm_attention_dq_kernel.bind(plain)
    bound.set_config(SMALL)
    _check((*args[:9], ones, zeros, ones, *args[12:]), bound(*plain), dtype)


@pytest.mark.triton_interpret  # code generation only
def test_block_barrier_between_parked_dln_and_its_reread():
    """The third loop re-reads ``dln`` from ``dq``, where other threads of the block may
    have written it: Helion must put a block barrier between the store and the load."""
    args = _args(torch.float16, "cpu", 7, 2, 128)
    code = flash_norm_attention_dq_kernel.bind(args).to_triton_code(helion.Config(block_sizes=[32, 16]))
    store = code.index("tl.store(dq")
    assert store < code.index("tl.debug_barrier()", store) < code.index("tl.load(dq", store)


@pytest.mark.cuda
def test_cuda_registry_config(registry_dir):
    """H 4, D 128 in bf16 with the default config (an empty registry)."""
    runtime.clear_cache()
    args = _args(torch.bfloat16, "cuda", 8, 4, 128, mean=50.0)
    _check(args, runtime.launch(SPEC_FNA_DQ, args), torch.bfloat16)
    runtime.clear_cache()
