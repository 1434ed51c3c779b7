"""The public full-row post-norm ops ``matmul_layernorm`` / ``matmul_rmsnorm`` and their
dispatcher :func:`helion_kernels.runtime.decide`.

* Input validation: every error is raised before any kernel (or the unfused GEMM) runs.
* Results of the fused path (Helion reference mode) and of the unfused path (torch.mm +
  torch's norm, eager on CPU) against float64 references, for ``fused=None/True/False``.
* Dispatch decisions read from a registry (Triton interpreter: the only CPU mode in which
  the registry is consulted): exact entries, untuned shapes (nearest entry, with a
  warning), a GPU without entries, N past the full-row limit, forced paths, caching.
"""

from __future__ import annotations

import re
import warnings

import helion
import pytest
import torch

import helion_kernels
from helion_kernels import registry, runtime
from helion_kernels.limits import max_full_row_n
from helion_kernels.techniques.postnorm.kernels import LAYERNORM, RMSNORM, SPEC_LAYERNORM, SPEC_RMSNORM
from helion_kernels.techniques import postnorm
from helion_kernels.spec import Shape
from helion_kernels.registry import ConfigFallbackWarning, Entry
from helion_kernels.verify import check_outputs

from _postnorm_inputs import matmul_layernorm_reference, matmul_rmsnorm_reference
from _seeds import stable_seed

# Every output element must be written: allocations start as NaN.
pytestmark = pytest.mark.usefixtures("poisoned_empty")

LN, RMS = "matmul_layernorm", "matmul_rmsnorm"
OPS = [LN, RMS]
SPECS = {LN: SPEC_LAYERNORM, RMS: SPEC_RMSNORM}


# --- helpers -----------------------------------------------------------------------------


def _inputs(op: str, shape: Shape, dtype, device, seed: int, affine: bool = True,
            param_dtype=None) -> dict:
    """Keyword arguments of a call: unit-variance a, b; weight (and bias for LayerNorm)."""
    a, b = SPECS[op].make_args(shape, dtype, device, seed)[:2]
    gen = torch.Generator().manual_seed(seed + 7)
    pdt = param_dtype or dtype
    weight = (1 + 0.5 * torch.randn(shape.N, generator=gen)).to(device=device, dtype=pdt)
    bias = (0.5 * torch.randn(shape.N, generator=gen)).to(device=device, dtype=pdt)
    kw = {"a": a, "b": b, "weight": weight if affine else None, "eps": 1e-5}
    if op == LN:
        kw["bias"] = bias if affine else None
    return kw


def _kernel_args(op: str, kw: dict) -> tuple:
    """The kernel's positional arguments as the op launches them (what decide /
    resolved_config take): no Linear bias, no residual."""
    return (kw["a"], kw["b"], kw.get("weight"), kw.get("bias"), float(kw.get("eps", 1e-5)),
            LAYERNORM if op == LN else RMSNORM, None, None)


def _call(op: str, kw: dict, *, stats: bool = False, fused=None):
    if op == LN:
        return helion_kernels.matmul_layernorm(
            kw["a"], kw["b"], kw.get("weight"), kw.get("bias"), kw.get("eps", 1e-5),
            return_stats=stats, fused=fused)
    return helion_kernels.matmul_rmsnorm(
        kw["a"], kw["b"], kw.get("weight"), kw.get("eps", 1e-5), return_rstd=stats, fused=fused)


def _reference(op: str, kw: dict) -> tuple:
    """float64 reference: (y, mean, rstd) for LayerNorm, (y, rstd) for RMSNorm."""
    d = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    if op == LN:
        return matmul_layernorm_reference(d["a"], d["b"], d["weight"], d["bias"], d["eps"])
    return matmul_rmsnorm_reference(d["a"], d["b"], d["weight"], d["eps"])


def _check(op: str, kw: dict, dtype, *, fused=None) -> tuple:
    """Call with and without stats; check types, shapes and values against float64."""
    out = _call(op, kw, stats=True, fused=fused)
    m, n = kw["a"].shape[0], kw["b"].shape[1]
    assert isinstance(out, tuple) and len(out) == (3 if op == LN else 2)
    assert out[0].dtype == dtype and out[0].shape == (m, n)
    for s in out[1:]:
        assert s.dtype == torch.float32 and s.shape == (m,)
    check_outputs(out, _reference(op, kw), dtype)
    y = _call(op, kw, stats=False, fused=fused)
    assert isinstance(y, torch.Tensor) and y.dtype == dtype
    check_outputs(y, _reference(op, kw)[0], dtype)
    return out


@pytest.fixture
def calls(monkeypatch) -> dict:
    """Record which path each call takes: ``runtime.launch`` (the fused kernel) or
    ``postnorm._unfused_norm`` (the standalone norm after torch.mm)."""
    rec = {"fused": [], "unfused": []}
    real_run, real_norm = runtime.launch, postnorm._unfused_norm

    def run(spec, args):
        rec["fused"].append(spec.name)
        return real_run(spec, args)

    def unfused_norm(fn, x, *params):
        rec["unfused"].append(tuple(x.shape))
        return real_norm(fn, x, *params)

    monkeypatch.setattr(runtime, "launch", run)
    monkeypatch.setattr(postnorm, "_unfused_norm", unfused_norm)
    return rec


@pytest.fixture
def no_work(monkeypatch) -> None:
    """Any kernel launch, registry lookup, GEMM or norm is a bug: validation must fail first."""

    def forbidden(what):
        def f(*args, **kwargs):
            raise AssertionError(f"{what} ran before validation failed")
        return f

    monkeypatch.setattr(runtime, "launch", forbidden("runtime.launch"))
    monkeypatch.setattr(runtime, "resolved_config", forbidden("runtime.resolved_config"))
    monkeypatch.setattr(runtime, "_bound", forbidden("runtime._bound"))
    monkeypatch.setattr(registry, "lookup", forbidden("registry.lookup"))
    monkeypatch.setattr(postnorm, "_unfused_norm", forbidden("postnorm._unfused_norm"))
    monkeypatch.setattr(torch, "mm", forbidden("torch.mm"))


def _ab(m=8, k=16, n=24, dtype=torch.bfloat16):
    return torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)


# --- 1. validation (reference-mode session) ----------------------------------------------


@pytest.mark.ref_mode
@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize("fused", [None, True, False], ids=["auto", "fused", "unfused"])
@pytest.mark.parametrize("op", OPS)
class TestValidation:
    def test_not_2d(self, op, fused):
        a, b = _ab()
        with pytest.raises(ValueError, match=r"a must be 2-D \(\[M, K\]\), got shape \(2, 4, 16\)"):
            _call(op, {"a": a.reshape(2, 4, 16), "b": b}, fused=fused)
        with pytest.raises(ValueError, match=r"b must be 2-D \(\[K, N\]\), got shape \(16,\)"):
            _call(op, {"a": a, "b": b[:, 0]}, fused=fused)

    def test_mismatched_k(self, op, fused):
        a, _ = _ab(k=16)
        _, b = _ab(k=24)
        with pytest.raises(ValueError, match=r"mismatched K: a is \(8, 16\).*b is \(24, 24\)"):
            _call(op, {"a": a, "b": b}, fused=fused)

    def test_zero_k(self, op, fused):
        with pytest.raises(ValueError, match="K must be at least 1"):
            _call(op, {"a": torch.empty(3, 0), "b": torch.empty(0, 2)}, fused=fused)

    @pytest.mark.parametrize("dtype", [torch.float64, torch.int32])
    def test_unsupported_dtype(self, op, fused, dtype):
        a, b = torch.ones(4, 4, dtype=dtype), torch.ones(4, 4, dtype=dtype)
        with pytest.raises(TypeError, match=f"a has dtype {dtype}; supported: bfloat16, float16, float32"):
            _call(op, {"a": a, "b": b}, fused=fused)

    def test_mismatched_dtypes(self, op, fused):
        a, _ = _ab(dtype=torch.bfloat16)
        _, b = _ab(dtype=torch.float16)
        with pytest.raises(TypeError, match="a and b must share a dtype"):
            _call(op, {"a": a, "b": b}, fused=fused)

    def test_not_a_tensor(self, op, fused):
        _, b = _ab()
        with pytest.raises(TypeError, match="a must be a torch.Tensor, got list"):
            _call(op, {"a": [[1.0] * 16], "b": b}, fused=fused)

    def test_param_not_a_tensor(self, op, fused):
        kw = dict(zip(("a", "b"), _ab(n=24)), weight=[1.0] * 24)
        with pytest.raises(TypeError, match="weight must be a torch.Tensor or None, got list"):
            _call(op, kw, fused=fused)

    def test_param_on_another_device(self, op, fused):
        kw = dict(zip(("a", "b"), _ab(n=24)), weight=torch.ones(24, device="meta"))
        with pytest.raises(ValueError, match="all tensors must be on one device"):
            _call(op, kw, fused=fused)

    @pytest.mark.parametrize("eps", [-1e-5, float("-inf"), float("inf"), float("nan")], ids=repr)
    def test_bad_eps(self, op, fused, eps):
        kw = dict(zip(("a", "b"), _ab()), eps=eps)
        with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
            _call(op, kw, fused=fused)

    @pytest.mark.parametrize("eps", [True, False, "1e-5", None], ids=repr)
    def test_eps_of_the_wrong_type(self, op, fused, eps):
        kw = dict(zip(("a", "b"), _ab()), eps=eps)
        with pytest.raises(TypeError, match="eps must be a real number"):
            _call(op, kw, fused=fused)

    def test_cpu_tensors_outside_interpret_modes(self, op, fused, monkeypatch):
        monkeypatch.delenv("HELION_INTERPRET", raising=False)
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        with pytest.raises(ValueError, match="need CUDA tensors, got cpu"):
            _call(op, dict(zip(("a", "b"), _ab())), fused=fused)


# (op, parameter) pairs: matmul_rmsnorm has no bias.
OP_PARAMS = [(LN, "weight"), (LN, "bias"), (RMS, "weight")]
FUSED = pytest.mark.parametrize("fused", [None, True, False], ids=["auto", "fused", "unfused"])


@pytest.mark.ref_mode
@pytest.mark.usefixtures("no_work")
@FUSED
@pytest.mark.parametrize(("op", "param"), OP_PARAMS)
@pytest.mark.parametrize("bad_shape", [(16,), (1, 24), (25,), ()], ids=str)
def test_param_shape(op, param, bad_shape, fused):
    a, b = _ab(k=16, n=24)
    kw = {"a": a, "b": b, param: torch.ones(bad_shape, dtype=torch.bfloat16)}
    with pytest.raises(ValueError, match=rf"{param} must have shape \[N\] = \(24,\), got "
                                         rf"{re.escape(str(bad_shape))}"):
        _call(op, kw, fused=fused)


@pytest.mark.ref_mode
@pytest.mark.usefixtures("no_work")
@FUSED
@pytest.mark.parametrize(("op", "param"), OP_PARAMS)
@pytest.mark.parametrize("bad_dtype", [torch.int64, torch.bool], ids=str)
def test_param_not_float(op, param, bad_dtype, fused):
    kw = dict(zip(("a", "b"), _ab(n=24)), **{param: torch.ones(24, dtype=bad_dtype)})
    with pytest.raises(TypeError, match=f"{param} must be floating point, got {bad_dtype}"):
        _call(op, kw, fused=fused)


@pytest.mark.ref_mode
@pytest.mark.usefixtures("no_work")
@FUSED
@pytest.mark.parametrize(("op", "which"), [(LN, "a"), (LN, "b"), (RMS, "a"), (RMS, "b"), *OP_PARAMS])
def test_bad_input_that_requires_grad_fails_before_launch(op, which, fused):
    """Training calls (inputs requiring grad go through the custom op and its autograd) are
    validated first too."""
    kw = _inputs(op, Shape(8, 16, 24), torch.float32, "cpu", 0)
    kw[which].requires_grad_()
    kw["b"] = kw["b"][:15].detach().requires_grad_(which == "b")
    with pytest.raises(ValueError, match=f"{op}: mismatched K"):
        _call(op, kw, fused=fused)


@pytest.mark.ref_mode
@pytest.mark.usefixtures("no_work")
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("dtype", "n"), [(torch.bfloat16, 4097), (torch.bfloat16, 2049),
                                          (torch.float16, 2049), (torch.float32, 1025)])
def test_fused_true_past_the_limit_names_split_n(op, dtype, n):
    """``fused=True`` past max_full_row_n: ValueError naming the split-N strategy, raised
    before any registry lookup, GEMM or launch."""
    limit = max_full_row_n(dtype)
    assert n > limit
    kw = _inputs(op, Shape(2, 8, n), dtype, "cpu", 1)
    with pytest.raises(ValueError, match="split-N") as err:
        _call(op, kw, fused=True)
    assert f"N = {n}" in str(err.value) and f"N = {limit}" in str(err.value)
    with pytest.raises(ValueError, match=r"technique 3"):
        runtime.decide(SPECS[op], _kernel_args(op, kw), True).fused


@pytest.mark.ref_mode
@pytest.mark.parametrize("op", OPS)
def test_grad_mode_off_is_accepted(op, calls):
    """requires_grad tensors are fine under torch.no_grad(): the error is about autograd."""
    kw = _inputs(op, Shape(4, 16, 24), torch.float32, "cpu", 2)
    for t in (kw["a"], kw["weight"]):
        t.requires_grad_()
    with torch.no_grad():
        y = _call(op, kw)
    check_outputs(y, _reference(op, kw)[0], torch.float32)


@pytest.mark.ref_mode
@pytest.mark.parametrize("fused", [None, True, False], ids=["auto", "fused", "unfused"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("m", "n"), [(0, 24), (5, 0), (0, 0), (1, 0)])
def test_empty_outputs(op, fused, m, n, calls):
    """Empty M or N: correctly shaped outputs and stats, nothing launched."""
    dtype = torch.bfloat16
    kw = {"a": torch.randn(m, 16, dtype=dtype), "b": torch.randn(16, n, dtype=dtype),
          "weight": torch.ones(n, dtype=dtype)}
    if op == LN:
        kw["bias"] = torch.zeros(n, dtype=dtype)
    out = _call(op, kw, stats=True, fused=fused)
    assert len(out) == (3 if op == LN else 2)
    assert out[0].shape == (m, n) and out[0].dtype == dtype
    for s in out[1:]:
        assert s.shape == (m,) and s.dtype == torch.float32
    y = _call(op, kw, fused=fused)
    assert isinstance(y, torch.Tensor) and y.shape == (m, n) and y.dtype == dtype
    assert calls == {"fused": [], "unfused": []}


# --- 2. results through the public functions (reference-mode session) --------------------

# M = 1; N not a power of two (96, 200); K not a power of two; M not a multiple of 16.
SHAPES = [Shape(1, 64, 96), Shape(33, 40, 200), Shape(16, 72, 64), Shape(3, 1, 5)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("fused", [None, True, False], ids=["auto", "fused", "unfused"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_public_op_matches_fp64(op, shape, fused, affine, dtype, calls):
    kw = _inputs(op, shape, dtype, "cpu", stable_seed((op, shape, affine)), affine)
    _check(op, kw, dtype, fused=fused)
    # Reference mode has no registry: fused=None always takes the kernel.
    if fused is False:
        assert calls["fused"] == [] and calls["unfused"] == [(shape.M, shape.N)] * 2
    else:
        assert calls["fused"] == [op, op] and calls["unfused"] == []


@pytest.mark.ref_mode
@pytest.mark.parametrize("op", OPS)
def test_fused_and_unfused_agree(op):
    kw = _inputs(op, Shape(20, 48, 96), torch.float32, "cpu", 3)
    fused = _call(op, kw, stats=True, fused=True)
    unfused = _call(op, kw, stats=True, fused=False)
    check_outputs(fused, unfused, torch.float32)


@pytest.mark.ref_mode
@pytest.mark.parametrize("fused", [None, True, False], ids=["auto", "fused", "unfused"])
@pytest.mark.parametrize("op", OPS)
def test_non_contiguous_inputs(op, fused):
    """A transposed ``b`` (an nn.Linear weight ``W.t()``) and strided affine parameters."""
    shape = Shape(9, 40, 96)
    kw = _inputs(op, shape, torch.float16, "cpu", 4)
    kw["b"] = kw["b"].t().contiguous().t()
    kw["a"] = torch.cat([kw["a"], kw["a"]], dim=1)[:, ::2]
    kw["weight"] = kw["weight"].repeat_interleave(2)[::2]
    assert not (kw["b"].is_contiguous() or kw["a"].is_contiguous() or kw["weight"].is_contiguous())
    _check(op, kw, torch.float16, fused=fused)


@pytest.mark.ref_mode
@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")  # eager F.rms_norm
@pytest.mark.parametrize("fused", [None, True, False], ids=["auto", "fused", "unfused"])
@pytest.mark.parametrize("op", OPS)
def test_fp32_params_with_half_inputs(op, fused):
    """The documented "any float dtype" affine parameters: fp32 weight/bias with bf16 a, b."""
    kw = _inputs(op, Shape(12, 32, 96), torch.bfloat16, "cpu", 5, param_dtype=torch.float32)
    _check(op, kw, torch.bfloat16, fused=fused)


@pytest.mark.ref_mode
@pytest.mark.parametrize(("dtype", "param_dtype"), [(torch.float32, torch.bfloat16),
                                                    (torch.float16, torch.bfloat16),
                                                    (torch.bfloat16, torch.float64)], ids=str)
def test_unfused_layernorm_accepts_any_float_params(dtype, param_dtype):
    """The docstring promises affine parameters of any float dtype; the fused path honours
    that, the unfused path must too (it must never fail where the fused one runs)."""
    kw = _inputs(LN, Shape(12, 32, 96), dtype, "cpu", 5, param_dtype=param_dtype)
    _check(LN, kw, dtype, fused=True)  # passes
    _check(LN, kw, dtype, fused=False)  # RuntimeError: mixed dtype (CPU)


@pytest.mark.ref_mode
@pytest.mark.parametrize("fused", [None, True, False], ids=["auto", "fused", "unfused"])
@pytest.mark.parametrize("op", OPS)
def test_eps_is_used(op, fused):
    """eps = 0 (int) is accepted; a huge eps visibly shrinks the output (rstd ~ 1/sqrt(eps))."""
    kw = _inputs(op, Shape(6, 32, 64), torch.float32, "cpu", 6, affine=False)
    _check(op, {**kw, "eps": 0}, torch.float32, fused=fused)
    big = {**kw, "eps": 1e4}
    out = _check(op, big, torch.float32, fused=fused)
    assert out[0].abs().max() < 0.07 and (out[-1] < 0.011).all()


@pytest.mark.ref_mode
@pytest.mark.parametrize("op", OPS)
def test_past_the_limit_auto_runs_unfused(op, calls):
    """fused=None with N past max_full_row_n: the unfused path, no error (reference mode
    would otherwise always fuse)."""
    n = max_full_row_n(torch.float32) + 1
    kw = _inputs(op, Shape(2, 8, n), torch.float32, "cpu", 7)
    _check(op, kw, torch.float32, fused=None)
    assert calls["fused"] == [] and len(calls["unfused"]) == 2
    assert not runtime.decide(SPECS[op], _kernel_args(op, kw)).fused


@pytest.mark.ref_mode
@pytest.mark.parametrize("op", OPS)
def test_at_the_limit_fused_true_runs_the_kernel(op, calls):
    n = max_full_row_n(torch.float32)
    kw = _inputs(op, Shape(2, 8, n), torch.float32, "cpu", 8)
    _check(op, kw, torch.float32, fused=True)
    assert calls["fused"] == [op, op] and calls["unfused"] == []


@pytest.mark.ref_mode
@pytest.mark.parametrize("op", OPS)
def test_use_fused_in_reference_mode(op):
    spec = SPECS[op]
    a, b = _ab(n=96, dtype=torch.float16)
    assert runtime.decide(spec, (a, b)).fused is True
    assert runtime.decide(spec, (a, b), True).fused is True
    assert runtime.decide(spec, (a, b), False).fused is False
    _, wide = _ab(n=2049, dtype=torch.float16)
    assert runtime.decide(spec, (a, wide)).fused is False
    assert runtime.decide(spec, (a, wide), False).fused is False


# --- 3. dispatch from the registry (Triton interpreter) ----------------------------------

# block_sizes = [N tile (raised to Npad), tile_m, tile_k]: two M tiles, several K steps.
INTERP_CONFIG = helion.Config(block_sizes=[16, 16, 16], num_warps=4, num_stages=1)
GPU = "cpu"  # registry.gpu_key of a CPU tensor


def _record(choice: str) -> dict:
    return {"choice": choice, "fused_ms": 0.01, "unfused_ms": 0.02, "unfused": "cublas+inductor_norm"}


def _save(op: str, shape: Shape, dtype: str, choice: str | None, gpu: str = GPU,
          training: str | None = None) -> None:
    """An entry with the forward ``dispatch`` record ``choice`` and, given ``training``, a
    training record (``registry.TRAINING_DISPATCH``) of that choice."""
    meta = {"latency_ms": 0.01}
    if choice is not None:
        meta["dispatch"] = _record(choice)
    if training is not None:
        meta[registry.TRAINING_DISPATCH] = _record(training)
    registry.save_entry(op, gpu, Entry(shape, dtype, INTERP_CONFIG, meta))


interp = pytest.mark.triton_interpret


@interp
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])  # bf16 tl.dot is broken in the interpreter
@pytest.mark.parametrize("op", OPS)
def test_registry_choice_decides_the_path(op, dtype, registry_dir, calls):
    name = registry.dtype_name(dtype)
    fused_shape, unfused_shape = Shape(33, 40, 96), Shape(24, 64, 128)
    _save(op, fused_shape, name, "fused")
    _save(op, unfused_shape, name, "unfused")
    spec = SPECS[op]

    kw = _inputs(op, fused_shape, dtype, "cpu", 10)
    assert runtime.decide(spec, _kernel_args(op, kw)).fused is True  # exact entry: no warning
    _check(op, kw, dtype)
    assert calls["fused"] == [op, op] and calls["unfused"] == []

    kw = _inputs(op, unfused_shape, dtype, "cpu", 11)
    assert runtime.decide(spec, _kernel_args(op, kw)).fused is False
    _check(op, kw, dtype)
    assert calls["fused"] == [op, op] and calls["unfused"] == [(24, 128)] * 2


@interp
@pytest.mark.parametrize("op", OPS)
def test_forced_paths_override_the_registry(op, registry_dir, calls):
    fused_shape, unfused_shape = Shape(20, 32, 64), Shape(8, 32, 96)
    _save(op, fused_shape, "float16", "fused")
    _save(op, unfused_shape, "float16", "unfused")
    kw = _inputs(op, fused_shape, torch.float16, "cpu", 12)
    _check(op, kw, torch.float16, fused=False)
    assert calls["fused"] == [] and len(calls["unfused"]) == 2
    kw = _inputs(op, unfused_shape, torch.float16, "cpu", 13)
    _check(op, kw, torch.float16, fused=True)  # the exact entry's config: no warning
    assert calls["fused"] == [op, op] and len(calls["unfused"]) == 2


@interp
@pytest.mark.parametrize("op", OPS)
def test_entry_without_dispatch_record_runs_unfused(op, registry_dir, calls):
    """An entry tuned without a dispatch measurement is no evidence that fusing wins."""
    shape = Shape(16, 32, 64)
    _save(op, shape, "float16", None)
    kw = _inputs(op, shape, torch.float16, "cpu", 14)
    _check(op, kw, torch.float16)
    assert calls["fused"] == [] and len(calls["unfused"]) == 2


@interp
@pytest.mark.parametrize("op", OPS)
def test_gpu_without_entries_runs_unfused(op, registry_dir, calls):
    """No entry for this GPU (only for another one): never the fused kernel."""
    _save(op, Shape(16, 32, 64), "float16", "fused", gpu="nvidia_h200_sm90")
    kw = _inputs(op, Shape(16, 32, 64), torch.float16, "cpu", 15)
    with warnings.catch_warnings():
        # Whether this case warns is not what is tested here.
        warnings.simplefilter("ignore", ConfigFallbackWarning)
        assert runtime.decide(SPECS[op], _kernel_args(op, kw)).fused is False
        _check(op, kw, torch.float16)
    assert calls["fused"] == [] and len(calls["unfused"]) == 2


@interp
@pytest.mark.parametrize("op", OPS)
def test_forced_fused_without_entries_uses_the_default_config(op, registry_dir, calls):
    kw = _inputs(op, Shape(20, 32, 96), torch.float16, "cpu", 16)
    with pytest.warns(ConfigFallbackWarning, match="conservative default config"):
        out = _call(op, kw, stats=True, fused=True)
    check_outputs(out, _reference(op, kw), torch.float16)
    assert calls["fused"] == [op] and calls["unfused"] == []
    assert runtime.resolved_config(SPECS[op], _kernel_args(op, kw)).source == "default"


@interp
@pytest.mark.parametrize("choice", ["fused", "unfused"])
@pytest.mark.parametrize("op", OPS)
def test_untuned_shape_follows_the_nearest_entry(op, choice, registry_dir, calls):
    tuned = Shape(32, 64, 96)
    _save(op, tuned, "float16", choice)
    query = Shape(20, 64, 96)
    kw = _inputs(op, query, torch.float16, "cpu", 17)
    with pytest.warns(ConfigFallbackWarning, match="the one tuned for 32x64x96 float16"):
        out = _call(op, kw, stats=True)
    check_outputs(out, _reference(op, kw), torch.float16)
    # Warned once per shape and process: the second call is silent (warnings are errors).
    check_outputs(_call(op, kw), _reference(op, kw)[0], torch.float16)
    if choice == "fused":
        assert calls["fused"] == [op, op] and calls["unfused"] == []
    else:
        assert calls["fused"] == [] and calls["unfused"] == [(20, 96)] * 2


@interp
@pytest.mark.parametrize("op", OPS)
def test_nearest_of_several_entries_decides(op, registry_dir, calls):
    """Two tuned shapes with opposite decisions: each untuned shape follows its nearest."""
    _save(op, Shape(8, 64, 32), "float32", "fused")
    _save(op, Shape(32, 64, 128), "float32", "unfused")
    near_fused = _inputs(op, Shape(10, 64, 40), torch.float32, "cpu", 18)
    with pytest.warns(ConfigFallbackWarning, match="the one tuned for 8x64x32"):
        _check(op, near_fused, torch.float32)
    assert calls["fused"] == [op, op] and calls["unfused"] == []
    near_unfused = _inputs(op, Shape(30, 48, 120), torch.float32, "cpu", 19)
    with pytest.warns(ConfigFallbackWarning, match="the one tuned for 32x64x128"):
        _check(op, near_unfused, torch.float32)
    assert calls["fused"] == [op, op] and len(calls["unfused"]) == 2


@interp
@pytest.mark.parametrize("op", OPS)
def test_past_the_limit_auto_runs_unfused_without_registry_lookup(op, registry_dir, calls, monkeypatch):
    """N past the limit with fused=None: unfused, no error, and the registry (empty here,
    which would warn) is not even consulted; fused=True raises."""
    def resolved(*args):
        raise AssertionError("registry consulted past the N limit")

    monkeypatch.setattr(registry, "lookup", resolved)
    n = max_full_row_n(torch.float32) + 3
    _save(op, Shape(2, 8, n), "float32", "fused")  # even an exact "fused" entry is ignored
    kw = _inputs(op, Shape(2, 8, n), torch.float32, "cpu", 20)
    _check(op, kw, torch.float32)
    assert calls["fused"] == [] and len(calls["unfused"]) == 2
    with pytest.raises(ValueError, match="split-N"):
        _call(op, kw, fused=True)
    assert calls["fused"] == []


@interp
@pytest.mark.parametrize("op", OPS)
def test_decision_is_cached_until_clear_cache(op, registry_dir, calls):
    """The registry is read once per shape and process; clear_cache() re-reads it."""
    shape = Shape(16, 32, 64)
    _save(op, shape, "float16", "unfused")
    kw = _inputs(op, shape, torch.float16, "cpu", 21)
    check_outputs(_call(op, kw), _reference(op, kw)[0], torch.float16)
    assert calls["fused"] == [] and len(calls["unfused"]) == 1
    _save(op, shape, "float16", "fused")
    check_outputs(_call(op, kw), _reference(op, kw)[0], torch.float16)
    assert calls["fused"] == [] and len(calls["unfused"]) == 2
    runtime.clear_cache()
    check_outputs(_call(op, kw), _reference(op, kw)[0], torch.float16)
    assert calls["fused"] == [op] and len(calls["unfused"]) == 2


@interp
def test_layernorm_and_rmsnorm_have_separate_registries(registry_dir, calls):
    shape = Shape(16, 32, 64)
    _save(LN, shape, "float16", "fused")
    _save(RMS, shape, "float16", "unfused")
    ln = _inputs(LN, shape, torch.float16, "cpu", 22)
    rms = _inputs(RMS, shape, torch.float16, "cpu", 23)
    _check(LN, ln, torch.float16)
    _check(RMS, rms, torch.float16)
    assert calls["fused"] == [LN, LN] and calls["unfused"] == [(16, 64)] * 2


@interp
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("op", OPS)
def test_interpreter_odd_shapes_both_paths(op, affine, registry_dir, calls):
    """M = 1 and N = 5 (a partial N tile) through both registry decisions."""
    for i, (shape, choice) in enumerate([(Shape(1, 48, 96), "fused"), (Shape(1, 48, 40), "unfused"),
                                         (Shape(19, 24, 5), "fused")]):
        _save(op, shape, "float16", choice)
        kw = _inputs(op, shape, torch.float16, "cpu", 30 + i, affine)
        before = len(calls["fused"])
        _check(op, kw, torch.float16)
        assert len(calls["fused"]) - before == (2 if choice == "fused" else 0)


@interp
@pytest.mark.parametrize(("forward", "training"), [("fused", "unfused"), ("unfused", "fused"), ("fused", "fused")])
@pytest.mark.parametrize("op", OPS)
def test_training_calls_follow_the_training_record(op, forward, training, registry_dir, calls):
    """An entry with both records: a call autograd records (the forward also writes the norm's
    input for the backward) takes the training decision, an inference call the forward one;
    fused in training only where the forward is fused too (the write adds work to the fused
    path only, so a fused training record under an unfused forward one is out of date)."""
    shape = Shape(20, 32, 64)
    _save(op, shape, "float16", forward, training=training)
    spec = SPECS[op]
    kw = _inputs(op, shape, torch.float16, "cpu", 21)
    args = _kernel_args(op, kw)
    training_fused = training == "fused" and forward == "fused"
    assert runtime.decide(spec, args).fused is (forward == "fused")
    assert runtime.decide(spec, args, training=True).fused is training_fused
    with torch.no_grad():
        check_outputs(_call(op, kw), _reference(op, kw)[0], torch.float16)
    assert (calls["fused"], calls["unfused"]) == (([op], []) if forward == "fused" else ([], [(20, 64)]))
    kw["a"].requires_grad_(True)
    y = _call(op, kw)
    check_outputs(y.detach(), _reference(op, {**kw, "a": kw["a"].detach()})[0], torch.float16)
    fused_calls = [op] * ((forward == "fused") + training_fused)
    assert calls["fused"] == fused_calls and len(calls["unfused"]) == 2 - len(fused_calls)


@interp
@pytest.mark.parametrize("op", OPS)
def test_training_without_a_training_record_follows_the_forward_one(op, registry_dir, calls):
    """An entry measured only in the forward benchmark decides training calls as well."""
    shape = Shape(20, 32, 64)
    _save(op, shape, "float16", "fused")
    kw = _inputs(op, shape, torch.float16, "cpu", 22)
    assert runtime.decide(SPECS[op], _kernel_args(op, kw), training=True).fused is True
    kw["weight"].requires_grad_(True)
    _call(op, kw).float().sum().backward()
    assert calls["fused"] == [op] and calls["unfused"] == []
    assert kw["weight"].grad is not None and torch.isfinite(kw["weight"].grad).all()
