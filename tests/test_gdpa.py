"""Jagged GDPA and FlashNormAttention (forward): reference mode, Triton interpreter, errors.

Under the Triton interpreter the jagged loops need one of the conftest work-arounds (a
loaded offset as a loop bound); CUDA tests run both ops on a GPU.
"""

from __future__ import annotations

import helion
import pytest
import torch

from helion_kernels import flash_norm_attention, gdpa, runtime
from helion_kernels.techniques.attention.kernels import flash_norm_attention_kernel, flash_norm_attention_reference
from helion_kernels.techniques.attention.kernels import gdpa_kernel, gdpa_reference, random_jagged_inputs
from helion_kernels.limits import ACTIVATIONS, MAX_SEQ_LEN_KV
from helion_kernels.registry import ConfigFallbackWarning
from helion_kernels.spec import jagged_lengths
from helion_kernels.verify import check_outputs

pytestmark = pytest.mark.usefixtures("poisoned_empty")

# Empty Q and empty KV sequences, sequences shorter than any Q tile, a full 128-row KV.
Q_LENGTHS = [5, 0, 37, 3, 1, 20]
KV_LENGTHS = [7, 4, 0, 9, 128, 1]


def _check_per_sequence(out, ref, q_offsets, dtype):
    """``check_outputs`` sequence by sequence, so each is held to its own scale (outputs of a
    128-row KV sequence are ~10x those of a 4-row one); a sequence with no KV rows must be
    exactly 0."""
    bounds = q_offsets.tolist()
    assert out.shape == ref.shape
    for start, end in zip(bounds, bounds[1:]):
        check_outputs(out[start:end], ref[start:end], dtype)


def _inputs(dtype, device, seed, heads=3, dim=64, q_lengths=Q_LENGTHS, kv_lengths=KV_LENGTHS):
    return random_jagged_inputs(q_lengths, kv_lengths, heads, dim, dtype, device, seed)


def _affine(heads, dim, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    return tuple((base + 0.2 * torch.randn(heads * dim, generator=gen)).to(device=device, dtype=dtype)
                 for base in (1.0, 0.0, 1.0))


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gdpa_matches_fp64(activation, dtype, device):
    q, k, v, qo, ko = _inputs(dtype, device, 1)
    out = gdpa(q, k, v, qo, ko, 37, 128, activation, qk_scale=0.7)
    assert out.dtype == dtype and out.shape == q.shape
    ref = gdpa_reference(q.double(), k.double(), v.double(), qo, ko, 0.7, activation)
    _check_per_sequence(out, ref, qo, dtype)
    assert (out[5:42] == 0).all() and (out[45] != 0).any()  # no KV rows; 128 KV rows


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize(("heads", "dim"), [(3, 64), (2, 128)], ids=["H3xD64", "H2xD128"])
def test_flash_norm_attention_matches_fp64(heads, dim, affine, activation, dtype, device):
    q, k, v, qo, ko = _inputs(dtype, device, 2, heads, dim)
    params = _affine(heads, dim, dtype, device, 3) if affine else (None, None, None)
    out = flash_norm_attention(q, k, v, qo, ko, 37, 128, *params, eps=1e-5,
                               activation=activation, qk_scale=0.5)
    ref = flash_norm_attention_reference(q.double(), k.double(), v.double(), qo, ko,
                                         *[None if p is None else p.double().view(heads, dim) for p in params],
                                         1e-5, 0.5, activation)
    _check_per_sequence(out, ref, qo, dtype)


@pytest.mark.ref_mode
def test_affine_shapes_h_d_and_flat_agree(device):
    q, k, v, qo, ko = _inputs(torch.float32, device, 4)
    flat = _affine(3, 64, torch.float32, device, 5)
    a = flash_norm_attention(q, k, v, qo, ko, 37, 128, *flat)
    b = flash_norm_attention(q, k, v, qo, ko, 37, 128, *[p.view(3, 64) for p in flat])
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.ref_mode
@pytest.mark.parametrize("fn", [gdpa, flash_norm_attention], ids=lambda f: f.__name__)
def test_single_sequence_and_all_empty(fn, device):
    q, k, v, qo, ko = _inputs(torch.float32, device, 6, q_lengths=[11], kv_lengths=[13])
    assert fn(q, k, v, qo, ko, 11, 13).shape == (11, 3, 64)
    q, k, v, qo, ko = _inputs(torch.float32, device, 7, q_lengths=[0, 0], kv_lengths=[3, 0])
    assert fn(q, k, v, qo, ko, 0, 3).shape == (0, 3, 64)


def _forbid_launch(monkeypatch):
    for name in ("launch", "launch_kernel"):
        monkeypatch.setattr(runtime, name, lambda *a: pytest.fail("launched on bad input"))


def _bad(fn, match, **overrides):
    q, k, v, qo, ko = _inputs(torch.float32, "cpu", 8)
    kwargs = dict(q=q, k=k, v=v, q_offsets=qo, kv_offsets=ko, max_seq_len_q=37, max_seq_len_kv=128)
    kwargs.update(overrides)
    with pytest.raises((TypeError, ValueError), match=match):
        fn(**kwargs)


@pytest.mark.ref_mode
@pytest.mark.parametrize("fn", [gdpa, flash_norm_attention], ids=lambda f: f.__name__)
def test_bad_inputs_raise_before_launch(fn, monkeypatch):
    _forbid_launch(monkeypatch)
    q, k, v, qo, ko = _inputs(torch.float32, "cpu", 8)
    _bad(fn, "mismatched|both must be", kv_offsets=ko[:-1])
    _bad(fn, "must start at 0", q_offsets=qo + 1)
    _bad(fn, "never decrease", kv_offsets=ko.flip(0))
    _bad(fn, "int64", q_offsets=qo.int())
    _bad(fn, "3-D", q=q[:, 0])
    _bad(fn, "with q's H and D", k=k[:, :2])
    _bad(fn, "share one of", v=v.double())
    _bad(fn, "more than max_seq_len_q = 36", max_seq_len_q=36)
    _bad(fn, "activation must be one of", activation="tanh")
    _bad(fn, "qk_scale must be a finite", qk_scale=float("nan"))
    _bad(fn, r"H >= 1 and D >= 16", q=q[..., :8], k=k[..., :8], v=v[..., :8])
    _bad(fn, r"H >= 1 and D >= 16", q=q[:, :0], k=k[:, :0], v=v[:, :0])


@pytest.mark.triton_interpret
@pytest.mark.parametrize(("heads", "dim"), [(2, 48), (3, 96)])
def test_head_dim_not_a_power_of_two_under_the_interpreter(heads, dim):
    """D = 48 or 96 runs in registers padded to 64 / 128: the padded lanes are masked out of
    both norms' statistics and the outputs (the Triton code, not reference mode, pads), for
    the output, the kept o and statistics, and the GDPA kernel; no LayerNorm weight, so the
    padded lanes of the LayerNorm output would be -mean * rstd unless masked."""
    from helion_kernels.techniques.attention.kernels import with_saved_outputs

    dtype = torch.float16
    q, k, v, qo, ko = _inputs(dtype, "cpu", 20, heads, dim, INTERPRETER_Q, INTERPRETER_KV)
    q = q + 2.0  # a row mean away from 0: the case padded lanes would get wrong
    _, b, r = (p.view(heads, dim) for p in _affine(heads, dim, dtype, "cpu", 21))
    args = (q, k, v, qo, ko, 33, None, b, r, 1e-5, 0.7, 3)
    config = helion.Config(block_sizes=[16, 16], num_warps=4, num_stages=1)
    o_saved, stats = torch.empty_like(q), torch.empty(3, q.shape[0], dtype=torch.float32)
    bound = flash_norm_attention_kernel.bind((*args, o_saved, stats))
    bound.set_config(with_saved_outputs(config, (*args, o_saved, stats)))
    out = bound(*args, o_saved, stats)
    ref = flash_norm_attention_reference(q.double(), k.double(), v.double(), qo, ko, None, b.double(),
                                         r.double(), 1e-5, 0.7, "relu")
    _check_per_sequence(out, ref, qo, dtype)
    o_ref, stats_ref = _saved_reference(q, k, v, qo, ko, torch.ones(heads, dim), b, 0.7, "relu")
    _check_per_sequence(o_saved, o_ref, qo, dtype)
    check_outputs(stats, stats_ref, torch.float32)


def test_kv_limit_holds_for_any_integer_type():
    import numpy as np

    q, k, v, qo, ko = _inputs(torch.float32, "cpu", 9, q_lengths=[4], kv_lengths=[129])
    with pytest.raises(ValueError, match=rf"limit of {MAX_SEQ_LEN_KV} KV rows"):
        flash_norm_attention(q, k, v, qo, ko, 4, np.int64(200))


@pytest.mark.ref_mode
def test_flash_norm_attention_refuses_long_kv():
    q, k, v, qo, ko = _inputs(torch.float32, "cpu", 9, q_lengths=[4], kv_lengths=[129])
    with pytest.raises(ValueError, match=rf"limit of {MAX_SEQ_LEN_KV} KV rows .* use gdpa\(\)"):
        flash_norm_attention(q, k, v, qo, ko, 4, 129)
    with pytest.raises(ValueError, match="more than max_seq_len_kv = 128"):
        flash_norm_attention(q, k, v, qo, ko, 4, 128)  # the lengths are checked too
    assert gdpa(q, k, v, qo, ko, 4, 129).shape == q.shape  # the unfused block has no limit
    q, k, v, qo, ko = _inputs(torch.float32, "cpu", 9, q_lengths=[4], kv_lengths=[128])
    with pytest.raises(ValueError, match=r"ln_weight must have shape \[H \* D\]"):
        flash_norm_attention(q, k, v, qo, ko, 4, 128, ln_weight=torch.ones(7))


def test_jagged_lengths_average_fill():
    lengths = jagged_lengths(768, 3000, fill=0.5, seed=0)
    assert len(lengths) == 768 and min(lengths) >= 0 and max(lengths) <= 3000
    assert abs(sum(lengths) / (768 * 3000) - 0.5) < 0.03
    assert lengths == jagged_lengths(768, 3000, fill=0.5, seed=0)


@pytest.mark.triton_interpret  # code generation only (see the module docstring)
def test_generated_code_for_kv_tiles_up_to_the_limit():

    q, k, v, qo, ko = _inputs(torch.float16, "cpu", 10, heads=2, dim=128)
    w = torch.ones(2, 128, dtype=torch.float16)
    args = (q, k, v, qo, ko, 37, w, w, w, 1e-5, 1.0, 0)
    for kernel in (flash_norm_attention_kernel,):
        bound = kernel.bind(args)
        for cfg in (helion.Config(block_sizes=[16, 32], num_warps=4),
                    helion.Config(block_sizes=[MAX_SEQ_LEN_KV, 16], num_warps=8, num_stages=2)):
            code = bound.to_triton_code(cfg)
            assert f"tl.constexpr({cfg.block_sizes[0]})" in code and "tl.dot" in code
    # The per-head kernel re-reads the un-normalised o_h it wrote to `out`, possibly from
    # other threads of the block: Helion must separate the two loops by a block barrier.
    code = flash_norm_attention_kernel.bind(args).to_triton_code(helion.Config(block_sizes=[16, 32]))
    body = code[code.index("sum_sq ="):]
    store = body.index("tl.store(out")
    assert store < body.index("tl.debug_barrier()", store) < body.index("tl.load(out", store)
    assert "tl.dot" in gdpa_kernel.bind((q, k, v, qo, ko, 37, 1.0, 2)).to_triton_code(
        helion.Config(block_sizes=[32, 32]))


INTERPRETER_Q = [5, 0, 33, 3]  # tile_q = 16: 3 tiles, the last of 1 row; an empty sequence
INTERPRETER_KV = [7, 4, 0, 37]  # an empty KV sequence; 37 rows = 3 KV tiles of 16


@pytest.mark.triton_interpret
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("heads", [2, 3])  # H * D not a power of two with H = 3
def test_generated_code_under_the_interpreter(heads, activation):

    dtype = torch.float16  # bf16 tl.dot is broken in the interpreter
    q, k, v, qo, ko = _inputs(dtype, "cpu", 14, heads, 32, INTERPRETER_Q, INTERPRETER_KV)
    index = ACTIVATIONS.index(activation)
    bound = gdpa_kernel.bind((q, k, v, qo, ko, 33, 0.7, index))
    bound.set_config(helion.Config(block_sizes=[16, 16], num_warps=4, num_stages=1))
    ref = gdpa_reference(q.double(), k.double(), v.double(), qo, ko, 0.7, activation)
    _check_per_sequence(bound(q, k, v, qo, ko, 33, 0.7, index), ref, qo, dtype)

    w, b, r = (p.view(heads, 32) for p in _affine(heads, 32, dtype, "cpu", 15))
    args = (q, k, v, qo, ko, 33, w, b, r, 1e-5, 0.7, index)
    ref = flash_norm_attention_reference(q.double(), k.double(), v.double(), qo, ko, w.double(),
                                         b.double(), r.double(), 1e-5, 0.7, activation)
    bound = flash_norm_attention_kernel.bind(args)
    bound.set_config(helion.Config(block_sizes=[16, 16], num_warps=4, num_stages=1))
    _check_per_sequence(bound(*args), ref, qo, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_cuda_both_kernels(activation, registry_dir):
    """With an empty registry, so the fused kernel runs its default config (the tuned ones
    are checked per workload row by the benchmark)."""
    runtime.clear_cache()
    q, k, v, qo, ko = _inputs(torch.bfloat16, "cuda", 11, heads=4, dim=128)
    params = _affine(4, 128, torch.bfloat16, "cuda", 12)
    ref = gdpa_reference(q, k, v, qo, ko, 1.0, activation)
    _check_per_sequence(gdpa(q, k, v, qo, ko, 37, 128, activation), ref, qo, torch.bfloat16)
    with pytest.warns(ConfigFallbackWarning, match="default config"):
        out = flash_norm_attention(q, k, v, qo, ko, 37, 128, *params, activation=activation)
    runtime.clear_cache()
    hd = [p.view(4, 128) for p in params]
    ref = flash_norm_attention_reference(q, k, v, qo, ko, *hd, 1e-5, 1.0, activation)
    _check_per_sequence(out, ref, qo, torch.bfloat16)


@pytest.mark.ref_mode
def test_each_activation_is_the_named_one(device):
    """fp32 on the CPU is exact enough to tell GELU from its tanh approximation (they differ
    by ~1e-3, inside the bf16 tolerance of the tests above)."""
    q, k, v, qo, ko = _inputs(torch.float32, device, 13)
    outs = {}
    for index, name in enumerate(ACTIVATIONS):
        outs[name] = gdpa_kernel(q, k, v, qo, ko, 37, 1.0, index)
        ref = gdpa_reference(q.double(), k.double(), v.double(), qo, ko, 1.0, name)
        torch.testing.assert_close(outs[name].double(), ref, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(outs["gelu"], outs["fast_gelu"], rtol=0, atol=1e-5)


@pytest.mark.ref_mode
def test_argument_types_and_sizes():
    q, k, v, qo, ko = _inputs(torch.float32, "cpu", 16)
    with pytest.raises(ValueError, match="qk_scale must be a finite number"):
        gdpa(q, k, v, qo, ko, 37, 128, qk_scale=10**400)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        flash_norm_attention(q, k, v, qo, ko, 37, 128, eps=10**400)
    with pytest.raises(TypeError, match="kv_offsets must be an int64 tensor .* got a torch.int32 tensor"):
        gdpa(q, k, v, qo, ko.int(), 37, 128)
    with pytest.raises(ValueError, match=r"q_offsets must be 1-D .* got shape \(0,\)"):
        gdpa(q, k, v, qo[:0], ko[:0], 37, 128)
    import numpy  # a dependency of pandas, so always installed; its integers are ints too

    assert gdpa(q, k, v, qo, ko, numpy.int64(37), numpy.int64(128)).shape == q.shape


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_unfused_baseline_is_the_same_block(activation, dtype, device):
    """The benchmark's baseline (padded attention, jagged norms) against the per-sequence
    fp64 reference, eagerly (its torch.compile form is what the benchmark times)."""
    from helion_kernels.bench_specs import unfused_block

    q, k, v, qo, ko = _inputs(dtype, device, 17)
    params = _affine(3, 64, dtype, device, 18)
    out = unfused_block(q, k, v, qo, ko, 37, 128, *params, 1e-5, 0.7, activation)
    assert out.dtype == dtype
    ref = flash_norm_attention_reference(q.double(), k.double(), v.double(), qo, ko,
                                         *[p.double().view(3, 64) for p in params], 1e-5, 0.7, activation)
    _check_per_sequence(out, ref, qo, dtype)


def _saved_reference(q, k, v, qo, ko, w, b, scale, activation):
    """float64 ``o = gdpa(ln) + ln`` and the rows' (ln mean, ln rstd, rms rstd)."""
    total, heads, dim = q.shape
    q64 = q.double().reshape(total, -1)
    var, mean = torch.var_mean(q64, dim=1, correction=0)
    rstd = torch.rsqrt(var + 1e-5)
    ln = ((q64 - mean[:, None]) * rstd[:, None] * w.double().reshape(-1) + b.double().reshape(-1))
    ln = ln.reshape(total, heads, dim)
    o = gdpa_reference(ln, k.double(), v.double(), qo, ko, scale, activation) + ln
    rstd_o = torch.rsqrt(o.reshape(total, -1).pow(2).mean(dim=1) + 1e-5)
    return o, torch.stack([mean, rstd, rstd_o])


def _check_saved_outputs(kernel_call, q, k, v, qo, ko, w, b, dtype, scale, activation):
    o_saved, stats = torch.empty_like(q), torch.empty(3, q.shape[0], dtype=torch.float32, device=q.device)
    kernel_call(o_saved, stats)
    o_ref, stats_ref = _saved_reference(q, k, v, qo, ko, w, b, scale, activation)
    _check_per_sequence(o_saved, o_ref, qo, dtype)
    check_outputs(stats, stats_ref, torch.float32)


@pytest.mark.ref_mode
def test_saved_outputs_reference_mode(device):
    """What the forward keeps for the backward: ``o`` and both norms' statistics."""
    q, k, v, qo, ko = _inputs(torch.float32, device, 16, heads=2, dim=32)
    w, b, r = (p.view(2, 32) for p in _affine(2, 32, torch.float32, device, 17))
    args = (q, k, v, qo, ko, 37, w, b, r, 1e-5, 0.7, 0)
    _check_saved_outputs(lambda o, s: flash_norm_attention_kernel(*args, o, s), q, k, v, qo, ko, w, b,
                         torch.float32, 0.7, "fast_gelu")


@pytest.mark.ref_mode
@pytest.mark.parametrize("heads", [1, 3, 8])
def test_one_pass_statistics_of_rows_far_from_zero(heads, device):
    """The LayerNorm statistics merged head by head (one pass over q): rows of mean 1e3 and
    per-head means far apart, fp32, against float64 var_mean over H*D."""
    q, k, v, qo, ko = _inputs(torch.float32, device, 22, heads, 32)
    q = q + 1e3 + 50.0 * torch.arange(heads, device=device, dtype=torch.float32)[None, :, None]
    w, b, r = (p.view(heads, 32) for p in _affine(heads, 32, torch.float32, device, 23))
    args = (q, k, v, qo, ko, 37, w, b, r, 1e-5, 0.7, 0)
    _check_saved_outputs(lambda o, s: flash_norm_attention_kernel(*args, o, s), q, k, v, qo, ko, w, b,
                         torch.float32, 0.7, "fast_gelu")


@pytest.mark.triton_interpret
def test_saved_outputs_under_the_interpreter():
    from helion_kernels.techniques.attention.kernels import with_saved_outputs

    dtype = torch.float16
    q, k, v, qo, ko = _inputs(dtype, "cpu", 18, 2, 32, INTERPRETER_Q, INTERPRETER_KV)
    w, b, r = (p.view(2, 32) for p in _affine(2, 32, dtype, "cpu", 19))
    args = (q, k, v, qo, ko, 33, w, b, r, 1e-5, 0.7, 2)

    def call(o, s):
        bound = flash_norm_attention_kernel.bind((*args, o, s))
        tuned = helion.Config(block_sizes=[16, 16], num_warps=4, num_stages=1, indexing=["pointer"] * 16)
        bound.set_config(with_saved_outputs(tuned, (*args, o, s)))  # a registry-style indexing list
        bound(*args, o, s)

    _check_saved_outputs(call, q, k, v, qo, ko, w, b, dtype, 0.7, "silu")


@pytest.mark.triton_interpret
def test_a_registry_config_of_an_earlier_kernel_runs_fitted():
    """A config saved for an earlier version of the kernel (one loop more: its per-loop list
    one entry too long, as the forward's entries after its statistics went to one pass) runs
    fitted to the kernel, with a warning naming the re-tune, instead of failing the launch."""
    from helion_kernels.registry import ConfigFallbackWarning
    from helion_kernels.techniques.attention.kernels import SPEC_GDPA

    q, k, v, qo, ko = _inputs(torch.float16, "cpu", 24, 2, 32, INTERPRETER_Q, INTERPRETER_KV)
    args = (q, k, v, qo, ko, 33, 0.7, 3)
    loops = len(gdpa_kernel.bind(args).config_spec.range_unroll_factors)
    stale = helion.Config(block_sizes=[16, 16], num_warps=4, num_stages=1, range_unroll_factors=[0] * (loops + 1))
    with pytest.raises(helion.exc.InvalidConfig):
        gdpa_kernel.bind(args).compile_config(stale)
    with pytest.warns(ConfigFallbackWarning, match="does not fit this version of the kernel"):
        run = runtime._compiled(SPEC_GDPA, args, runtime.Resolved(stale, "exact", None))
    ref = gdpa_reference(q.double(), k.double(), v.double(), qo, ko, 0.7, "relu")
    _check_per_sequence(run(*args), ref, qo, torch.float16)
