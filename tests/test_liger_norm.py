"""The unfused path's Liger norms (``helion_kernels.liger_norm``): the split-N ops run
cuBLAS + Liger's norm where the registry names that pipeline and Liger can run on the
tensors, and cuBLAS + the compiled norm otherwise.

On the CPU the dispatch is tested with Liger's functions replaced by float64 references (the
Triton interpreter cannot run Liger's kernels, which call ``libdevice``); on a GPU, Liger's
norms and the ops' values and gradients against float64.
"""

from __future__ import annotations

import helion
import pytest
import torch

from helion_kernels import matmul_layernorm_split_n, matmul_rmsnorm_split_n, registry, runtime
from helion_kernels import results
from helion_kernels.techniques.split_n import kernels as row_sweep
from helion_kernels import liger_norm
from helion_kernels.spec import Shape
from helion_kernels.verify import check_outputs

from _postnorm_inputs import ln_reference_f64, norm_inputs, rms_reference_f64, save_decision

LIGER = liger_norm.PIPELINE
SPECS = {"layernorm": row_sweep.SPEC_LAYERNORM, "rmsnorm": row_sweep.SPEC_RMSNORM}
GRAD_TOLERANCE = {torch.bfloat16: 5e-2, torch.float32: 5e-3}


def _ln64(x, weight, bias, eps):
    x = x.double()
    var, mean = torch.var_mean(x, dim=1, correction=0)
    rstd = torch.rsqrt(var + eps)
    y = (x - mean[:, None]) * rstd[:, None]
    y = y if weight is None else y * weight.double()
    return (y if bias is None else y + bias.double()), mean, rstd


def _rms64(x, weight, eps):
    x = x.double()
    rstd = torch.rsqrt(x.pow(2).mean(dim=1) + eps)
    y = x * rstd[:, None]
    return (y if weight is None else y * weight.double()), rstd


@pytest.fixture
def fake_liger(monkeypatch):
    """Liger available for any tensor, its norms computed in float64 (returned as Liger's:
    y in the input dtype, statistics fp32); the list records each call."""
    calls = []

    def layer_norm(x, weight, bias, eps):
        calls.append("layer_norm")
        y, mean, rstd = _ln64(x, weight, bias, eps)
        return y.to(x.dtype), mean.float(), rstd.float()

    def rms_norm(x, weight, eps):
        calls.append("rms_norm")
        y, rstd = _rms64(x, weight, eps)
        return y.to(x.dtype), rstd.float()

    monkeypatch.setattr(liger_norm, "available", lambda device, n: True)
    monkeypatch.setattr(liger_norm, "layer_norm", layer_norm)
    monkeypatch.setattr(liger_norm, "rms_norm", rms_norm)
    return calls


def _call_both(shape: Shape, fused):
    a, b, w, bias, eps = norm_inputs(shape, torch.float32, "cpu", 51, "weight_bias")
    check_outputs(matmul_layernorm_split_n(a, b, w, bias, eps, return_stats=True, fused=fused),
                  ln_reference_f64(a, b, w, bias, eps), torch.float32)
    check_outputs(matmul_rmsnorm_split_n(a, b, w, eps, return_rstd=True, fused=fused),
                  rms_reference_f64(a, b, w, eps), torch.float32)


@pytest.mark.ref_mode
@pytest.mark.parametrize("fused", [None, False])
@pytest.mark.parametrize("unfused", [LIGER, "cublas+inductor_norm"])
def test_the_unfused_path_runs_the_pipeline_the_registry_names(unfused, fused, decisions, fake_liger):
    """Liger's norm runs exactly where the entry names its pipeline, also when ``fused=False``
    forces the unfused path (the path the op would otherwise take); values and statistics
    as the float64 reference either way."""
    shape = Shape(40, 24, 72)
    for spec in SPECS.values():
        save_decision(spec, shape, "unfused", unfused)
    _call_both(shape, fused)
    assert fake_liger == (["layer_norm", "rms_norm"] if unfused == LIGER else [])


@pytest.mark.ref_mode
def test_an_untuned_shape_follows_the_nearest_entrys_pipeline_only_nearby(decisions, fake_liger):
    """An untuned shape runs the nearest entry's Liger pipeline where that entry is within
    ``runtime.ALTERNATIVE_PIPELINE_REACH`` (here N 80 against 72), and the compiled norm where
    it is farther (N 4x away), since Liger's speed there was never measured."""
    for spec in SPECS.values():
        save_decision(spec, Shape(64, 24, 72), "unfused", LIGER)
    with pytest.warns(registry.ConfigFallbackWarning, match="following the one tuned for"):
        _call_both(Shape(50, 24, 80), None)
    assert fake_liger == ["layer_norm", "rms_norm"]
    with pytest.warns(registry.ConfigFallbackWarning, match="following the one tuned for"):
        _call_both(Shape(50, 24, 288), None)
    assert fake_liger == ["layer_norm", "rms_norm"]  # no further call


@pytest.mark.ref_mode
def test_forcing_the_unfused_path_gives_no_fallback_warning(decisions, fake_liger):
    """``fused=False`` reads the registry only for the unfused pipeline: an untuned shape
    gives no warning about following another shape's decision."""
    for spec in SPECS.values():
        save_decision(spec, Shape(64, 24, 72), "unfused", LIGER)
    _call_both(Shape(50, 24, 80), False)  # fallback warnings are errors in this suite
    assert fake_liger == ["layer_norm", "rms_norm"]


@pytest.mark.ref_mode
def test_without_liger_the_compiled_norm_runs(decisions, monkeypatch):
    """An entry naming Liger's pipeline on a machine where Liger cannot run (here: CPU
    tensors) runs the compiled norm instead, with the same results."""
    def never(*args):
        raise AssertionError("Liger's norm called where it cannot run")

    monkeypatch.setattr(liger_norm, "layer_norm", never)
    monkeypatch.setattr(liger_norm, "rms_norm", never)
    shape = Shape(40, 24, 72)
    for spec in SPECS.values():
        save_decision(spec, shape, "unfused", LIGER)
    _call_both(shape, None)


@pytest.mark.parametrize("inductor_ms, fused", [(1.5, True), (1.01, False), (None, False)])
def test_without_liger_the_choice_is_taken_again_against_the_compiled_norm(inductor_ms, fused, decisions):
    """An entry whose kernel lost only to Liger's pipeline runs the kernel where Liger
    cannot run, if the compiled norm's recorded time is the margin slower than the kernel;
    an entry without that time keeps its choice."""
    from helion_kernels.registry import Entry

    spec, shape = SPECS["layernorm"], Shape(40, 24, 72)
    times = {"cublas+liger_norm": 0.9} if inductor_ms is None else {"cublas+inductor_norm": inductor_ms,
                                                                     "cublas+liger_norm": 0.9}
    meta = {"dispatch": {"choice": "unfused", "fused_ms": 1.0, "unfused_ms": 0.9, "unfused": LIGER, "margin": 1.02,
                         "unfused_timed_ms": times}}
    config = helion.Config(block_sizes=[16, 16, 16], num_warps=4, num_stages=1)
    registry.save_entry(spec.name, registry.gpu_key(torch.device("cpu")), Entry(shape, "float32", config, meta))
    a, b, w, bias, eps = norm_inputs(shape, torch.float32, "cpu", 51, "weight_bias")
    args = (a, b, w, bias, eps)
    assert runtime.decide(spec, args).fused is fused
    assert runtime.decide(spec, args).pipeline == spec.dispatch_baseline


def test_available_only_on_cuda_with_liger_and_n_in_range(monkeypatch):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(liger_norm, "_ops", lambda: ("layer_norm", "rms_norm"))
    assert liger_norm.available(cuda, 8) and liger_norm.available(cuda, liger_norm.MAX_N)
    assert not liger_norm.available(cuda, liger_norm.MAX_N + 1)
    assert not liger_norm.available(cpu, 8)
    monkeypatch.setattr(liger_norm, "_ops", lambda: None)  # not installed, too old, or broken
    assert not liger_norm.available(cuda, 8)
    with pytest.raises(RuntimeError, match="pip install"):
        liger_norm.layer_norm(torch.zeros(2, 8), None, None, 1e-5)


def test_an_old_liger_counts_as_absent(monkeypatch):
    """A liger-kernel older than the API this package calls is not used."""
    import importlib.metadata

    liger_norm._ops.cache_clear()
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.5.0")
    try:
        assert liger_norm._ops() is None
    finally:
        liger_norm._ops.cache_clear()


# --- on a GPU -----------------------------------------------------------------------------

def _require_liger():
    pytest.importorskip("liger_kernel.ops.layer_norm", reason="liger-kernel is an optional dependency")
    assert liger_norm.available(torch.device("cuda"), 8), "liger-kernel installed but too old or does not import"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("affine", ["none", "weight", "weight_bias"])
@pytest.mark.parametrize("m, n", [(1, 2048), (777, 3000), (129, 96), (40000, 96)])
def test_cuda_liger_norms_match_float64(m, n, affine, dtype, poisoned_empty):
    """Values and statistics (fp32) of both norms, every row and column written (NaN-filled
    allocations), at M = 1, a non-power-of-two N, a small N, and many short rows (Liger's
    RMSNorm takes another kernel at N <= 256 and M >= 32768); fp32 parameters with bf16 rows
    (autocast's mix)."""
    _require_liger()
    gen = torch.Generator().manual_seed(m + n)
    x = (3 + 2 * torch.randn(m, n, generator=gen)).to("cuda", dtype)
    weight = (1 + 0.5 * torch.randn(n, generator=gen)).to("cuda") if affine != "none" else None
    bias = (0.5 * torch.randn(n, generator=gen)).to("cuda") if affine == "weight_bias" else None
    y, mean, rstd = liger_norm.layer_norm(x, weight, bias, 1e-5)
    assert mean.dtype == rstd.dtype == torch.float32
    check_outputs((y, mean, rstd), _ln64(x, weight, bias, 1e-5), dtype)
    y, rstd = liger_norm.rms_norm(x, weight, 1e-6)
    assert rstd.dtype == torch.float32
    check_outputs((y, rstd), _rms64(x, weight, 1e-6), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("norm", list(SPECS))
def test_cuda_ops_on_the_liger_path_match_float64_with_gradients(norm, dtype, decisions, monkeypatch):
    """The split-N op where its entry names Liger's pipeline: Liger's norm runs, and the
    output and the statistics it returned match float64, and so do the gradients of ``a``,
    ``b``, weight and bias (the op's backward recomputes its statistics: end to end)."""
    _require_liger()
    shape = Shape(333, 200, 2304)
    save_decision(SPECS[norm], shape, "unfused", LIGER, device="cuda", dtype=registry.dtype_name(dtype))
    ran = []
    for name in ("layer_norm", "rms_norm"):
        real = getattr(liger_norm, name)
        monkeypatch.setattr(liger_norm, name, lambda *args, _real=real, _name=name: ran.append(_name) or _real(*args))
    a, b, w, bias, eps = norm_inputs(shape, dtype, "cuda", 53, "weight_bias")
    leaves = [t.clone().requires_grad_() for t in (a, b, w, bias)]
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    if norm == "layernorm":
        out = matmul_layernorm_split_n(*leaves, eps, return_stats=True)
        ref = _ln64(leaves64[0] @ leaves64[1], leaves64[2], leaves64[3], eps)
    else:
        leaves, leaves64 = leaves[:3], leaves64[:3]
        out = matmul_rmsnorm_split_n(*leaves, eps, return_rstd=True)
        ref = _rms64(leaves64[0] @ leaves64[1], leaves64[2], eps)
    assert ran == ["layer_norm" if norm == "layernorm" else "rms_norm"]
    check_outputs(tuple(t.detach() for t in out), tuple(t.detach() for t in ref), dtype)
    probe = torch.randn(out[0].shape, generator=torch.Generator().manual_seed(7)).to("cuda")
    (out[0].float() * probe).sum().backward()
    (ref[0] * probe.double()).sum().backward()
    check_outputs([t.grad for t in leaves], [t.grad for t in leaves64], dtype, tolerance=GRAD_TOLERANCE[dtype])
