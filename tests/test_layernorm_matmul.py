"""Deferred pre-LayerNorm ``layernorm_matmul`` (statistics computed by the kernel, or given by
the producer) and the pre-norm block's residual add with either norm (``add_rmsnorm_matmul``,
``add_layernorm_matmul``): forward and every gradient against float64 PyTorch, hard rows
(zeros, mean 1e3 with std 1, NaN), bad input, ``torch.compile(fullgraph=True)``, ``opcheck``;
reference mode, the Triton interpreter (the kernels at explicit configs) and CUDA."""

from __future__ import annotations

import re

import helion
import pytest
import torch
import torch.nn.functional as F

from helion_kernels import add_layernorm_matmul, add_rmsnorm_matmul, layernorm_matmul, runtime
from helion_kernels.autograd import layer_stats
from helion_kernels.spec import Shape
from helion_kernels.techniques.prenorm import kernels as K
from helion_kernels.verify import check_outputs

from _seeds import stable_seed

pytestmark = pytest.mark.usefixtures("poisoned_empty")

EPS = 1e-5
SHAPES = [Shape(m, k, n) for m in (1, 7, 4097) for k in (96, 1000) for n in (200, 300)]
GRAD_TOLERANCE = {torch.bfloat16: 5e-2, torch.float16: 5e-2, torch.float32: None}
OPS = ["layernorm", "layernorm_given", "add_rmsnorm", "add_layernorm"]


def _inputs(shape: Shape, dtype, device, seed: int, affine: bool = True, offset: float = 2.0):
    """x (rows off zero mean), residual, W [K, N] ~ N(0, 1/K), norm weight and bias, dy, dh."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*size, scale=1.0, shift=0.0):
        return (torch.randn(*size, generator=gen) * scale + shift).to(device=device, dtype=dtype)

    x, r = randn(shape.M, shape.K, shift=offset), randn(shape.M, shape.K)
    w = randn(shape.K, shape.N, scale=shape.K**-0.5)
    weight = randn(shape.K, scale=0.1, shift=1.0) if affine else None
    bias = randn(shape.K, scale=0.1) if affine else None
    return x, r, w, weight, bias, randn(shape.M, shape.N), randn(shape.M, shape.K)


def _reference(op: str, x, r, w, weight, bias, dtype=torch.float64):
    """(y, h) of the op in PyTorch on the same tensors (float64 in, float64 out); the add's
    ``h`` rounded to ``dtype`` as the op's is (its gradient passes straight through), so the
    norm sees the same rounded rows."""
    k = x.shape[1]
    h = x + r if op.startswith("add") else x
    if op.startswith("add"):
        h = h + (h.to(dtype).double() - h).detach()
    if op == "add_rmsnorm":
        return F.rms_norm(h, (k,), weight, EPS) @ w, h
    return F.layer_norm(h, (k,), weight, bias, EPS) @ w, h


def _run(op: str, x, r, w, weight, bias, fused):
    if op == "layernorm":
        return layernorm_matmul(x, w, weight, bias, EPS, fused=fused), None
    if op == "layernorm_given":  # the producer's statistics, computed under autograd
        mean, rstd = layer_stats(x, EPS)
        return layernorm_matmul(x, w, weight, bias, mean=mean, rstd=rstd, fused=fused), None
    if op == "add_rmsnorm":
        return add_rmsnorm_matmul(x, r, w, weight, EPS, fused=fused)
    return add_layernorm_matmul(x, r, w, weight, bias, EPS, fused=fused)


def _check(op: str, shape: Shape, dtype, device, fused, affine: bool = True, offset: float = 2.0, seed=None):
    seed = stable_seed((op, shape, affine, offset)) if seed is None else seed
    x, r, w, weight, bias, dy, dh = _inputs(shape, dtype, device, seed, affine, offset)
    if op == "add_rmsnorm":
        bias = None
    leaves = [t if t is None else t.detach().requires_grad_() for t in (x, r, w, weight, bias)]
    y, h = _run(op, *leaves, fused)
    assert y.dtype == dtype and y.shape == (shape.M, shape.N)
    loss = (y.float() * dy.float()).sum() + (0 if h is None else (h.float() * dh.float()).sum())
    loss.backward()
    ref = [t if t is None else t.detach().double().requires_grad_() for t in (x, r, w, weight, bias)]
    ref_y, ref_h = _reference(op, *ref, dtype=dtype)
    ref_loss = (ref_y * dy.double()).sum() + (0 if h is None else (ref_h * dh.double()).sum())
    ref_loss.backward()
    check_outputs(y.detach(), ref_y.detach(), dtype)
    if h is not None:
        assert h.dtype == dtype
        check_outputs(h.detach(), ref_h.detach(), dtype)
    used = [i for i, t in enumerate(leaves) if t is not None and (h is not None or i != 1)]
    check_outputs([leaves[i].grad for i in used], [ref[i].grad for i in used], dtype, tolerance=GRAD_TOLERANCE[dtype])


@pytest.mark.ref_mode
@pytest.mark.parametrize("fused", [None, False], ids=["kernel", "unfused"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_forward_and_every_gradient(op, shape, dtype, fused, device):
    """In reference mode ``fused=None`` runs the kernels (and the fused backward), ``False`` the
    unfused paths; both against float64."""
    _check(op, shape, dtype, device, fused)


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("op", OPS)
def test_without_affine_parameters(op, dtype, device):
    _check(op, Shape(33, 200, 72), dtype, device, None, affine=False)


@pytest.mark.ref_mode
@pytest.mark.parametrize("fused", [None, False], ids=["kernel", "unfused"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("op", OPS)
def test_rows_far_from_zero_mean(op, dtype, fused, device):
    """Mean 1e3, std 1: the mean's correction cancels almost all of ``a @ b``; the reference is
    computed from the same rounded inputs."""
    _check(op, Shape(40, 1000, 200), dtype, device, fused, offset=1e3)


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("op", OPS)
def test_fused_forward_then_unfused_backward(op, dtype, device, monkeypatch):
    """The path a GPU dispatches today: the fused forward (nothing normalised kept), then the
    unfused backward, which writes the norm's output for the wgrad itself."""
    real = runtime.decide
    backward = (K.SPEC_LAYERNORM_BACKWARD, K.SPEC_BACKWARD)
    monkeypatch.setattr(runtime, "decide", lambda spec, args, fused=None, training=False:
                        real(spec, args, False if spec in backward else fused, training))
    _check(op, Shape(33, 200, 72), dtype, device, None)


@pytest.mark.ref_mode
@pytest.mark.parametrize("fused", [None, False], ids=["kernel", "unfused"])
@pytest.mark.parametrize("op", ["add_rmsnorm", "add_layernorm"])
def test_only_parameters_need_gradients(op, fused, device):
    """x and residual frozen: b's, the weight's and the bias's gradients alone, against float64."""
    x, r, w, weight, bias, dy, dh = _inputs(Shape(17, 96, 40), torch.float32, device, 13)
    bias = None if op == "add_rmsnorm" else bias
    params = [t if t is None else t.detach().requires_grad_() for t in (w, weight, bias)]
    y, h = _run(op, x, r, *params, fused)
    (y * dy).sum().backward()
    ref = [t if t is None else t.detach().double().requires_grad_() for t in (w, weight, bias)]
    ref_y, _ = _reference(op, x.double(), r.double(), *ref, dtype=torch.float32)
    (ref_y * dy.double()).sum().backward()
    used = [i for i, t in enumerate(params) if t is not None]
    check_outputs([params[i].grad for i in used], [ref[i].grad for i in used], torch.float32)


@pytest.mark.ref_mode
@pytest.mark.parametrize("op", OPS)
def test_zero_rows(op, device):
    """A row of zeros normalises to zeros (rstd = 1/sqrt(eps)); its gradients stay finite."""
    shape = Shape(9, 96, 40)
    x, r, w, weight, bias, dy, dh = _inputs(shape, torch.float32, device, 11, offset=0.0)
    x[3] = 0
    r[3] = 0
    leaves = [t.detach().requires_grad_() for t in (x, r, w, weight, bias)]
    y, h = _run(op, *leaves, None)
    ((y * dy).sum() + (0 if h is None else (h * dh).sum())).backward()
    ref = [t.detach().double().requires_grad_() for t in (x, r, w, weight, bias)]
    ref_y, ref_h = _reference(op, *ref)
    ((ref_y * dy.double()).sum() + (0 if h is None else (ref_h * dh.double()).sum())).backward()
    check_outputs(y.detach(), ref_y.detach(), torch.float32)
    assert torch.isfinite(leaves[0].grad).all() and torch.isfinite(leaves[2].grad).all()


@pytest.mark.ref_mode
@pytest.mark.parametrize("fused", [None, False], ids=["kernel", "unfused"])
@pytest.mark.parametrize("op", OPS)
def test_a_nan_row_stays_in_its_row(op, fused, device):
    """NaN in one input row reaches that row of the outputs and of the input gradients only
    (the weights' gradients sum over rows and may be NaN)."""
    shape = Shape(8, 64, 48)
    x, r, w, weight, bias, dy, dh = _inputs(shape, torch.float32, device, 12)
    x[5, 7] = float("nan")
    leaves = [t.detach().requires_grad_() for t in (x, r, w, weight, bias)]
    y, h = _run(op, *leaves, fused)
    ((y * dy).sum() + (0 if h is None else (h * dh).sum())).backward()
    others = torch.arange(shape.M) != 5
    assert torch.isnan(y[5]).all() and torch.isfinite(y[others]).all()
    grads = [leaves[0].grad] + ([leaves[1].grad] if h is not None else [])
    for g in grads:
        assert torch.isnan(g[5]).any() and torch.isfinite(g[others]).all()


@pytest.mark.ref_mode
def test_a_double_backward_names_the_call_with_given_statistics(device):
    from helion_kernels import rmsnorm_matmul

    a = torch.randn(4, 8, device=device, requires_grad=True)
    b, rstd, mean = torch.randn(8, 4, device=device), torch.rand(4, device=device) + 0.5, torch.randn(4, device=device)
    for name, call in (("rmsnorm_matmul(rstd=)", lambda: rmsnorm_matmul(a, b, rstd=rstd)),
                       ("layernorm_matmul(mean=, rstd=)", lambda: layernorm_matmul(a, b, mean=mean, rstd=rstd))):
        with pytest.raises(RuntimeError, match=rf"^{re.escape(name)}: the backward is not differentiable"):
            torch.autograd.grad(call().sum(), a, create_graph=True)


@pytest.mark.ref_mode
def test_given_statistics_gradients_reach_their_producer(device):
    """mean and rstd given under autograd: a's gradient is the whole LayerNorm's, through them."""
    shape = Shape(17, 96, 40)
    x, _, w, weight, bias, dy, _ = _inputs(shape, torch.float32, device, 13)
    a = x.detach().requires_grad_()
    mean, rstd = layer_stats(a, EPS)
    (layernorm_matmul(a, w, weight, bias, mean=mean, rstd=rstd) * dy).sum().backward()
    ref = x.detach().double().requires_grad_()
    ((F.layer_norm(ref, (shape.K,), weight.double(), bias.double(), EPS) @ w.double()) * dy.double()).sum().backward()
    check_outputs(a.grad, ref.grad, torch.float32)
    # detached statistics: only the scaled GEMM's part reaches a (documented)
    a.grad = None
    mean, rstd = (t.detach() for t in layer_stats(a, EPS))
    (layernorm_matmul(a, w, mean=mean, rstd=rstd) * dy).sum().backward()
    assert torch.isfinite(a.grad).all()


@pytest.mark.ref_mode
def test_returned_statistics(device):
    x, _, w, *_ = _inputs(Shape(7, 96, 40), torch.float32, device, 14)
    c, mean, rstd = layernorm_matmul(x, w, return_stats=True)
    ref_mean, ref_rstd = layer_stats(x.double(), EPS)
    check_outputs((mean, rstd), (ref_mean, ref_rstd), torch.float32)
    given = layernorm_matmul(x, w, mean=mean, rstd=rstd, return_stats=True)
    assert given[1] is mean and given[2] is rstd


@pytest.mark.parametrize("bad,message", [
    (lambda a, b, s: layernorm_matmul(a, b, mean=s), "pass both mean and rstd"),
    (lambda a, b, s: layernorm_matmul(a, b, rstd=s), "pass both mean and rstd"),
    (lambda a, b, s: layernorm_matmul(a, b, mean=s[:-1], rstd=s[:-1]), "mean must have shape"),
    (lambda a, b, s: layernorm_matmul(a, b, mean=s.double(), rstd=s), "mean must be float32"),
    (lambda a, b, s: layernorm_matmul(a, b, torch.ones(5)), "weight must have shape"),
    (lambda a, b, s: layernorm_matmul(a, b, None, torch.ones(5)), "bias must have shape"),
    (lambda a, b, s: layernorm_matmul(a, b, eps=-1.0), "eps"),
    (lambda a, b, s: layernorm_matmul(a, b[:-1]), "K"),
    (lambda a, b, s: add_rmsnorm_matmul(a, a[:-1], b), "residual must have x's shape"),
    (lambda a, b, s: add_rmsnorm_matmul(a, a.double(), b), "one dtype"),
    (lambda a, b, s: add_layernorm_matmul(a, "r", b), "residual must be a torch.Tensor"),
    (lambda a, b, s: add_layernorm_matmul(a, a, b, torch.ones(3)), "weight must have shape"),
    (lambda a, b, s: add_rmsnorm_matmul(a, a, b, fused="yes"), "fused"),
])
def test_bad_input_is_refused_before_launch(bad, message):
    a, b, s = torch.randn(4, 8), torch.randn(8, 6), torch.ones(4)
    with pytest.raises((TypeError, ValueError), match=message):
        bad(a, b, s)


@pytest.mark.ref_mode
@pytest.mark.parametrize("op", OPS)
def test_compiled_fullgraph_forward_and_backward(op, device):
    shape = Shape(24, 64, 40)
    x, r, w, weight, bias, dy, dh = _inputs(shape, torch.float32, device, 15)
    if op == "add_rmsnorm":
        bias = None

    def step(*tensors):
        y, h = _run(op, *tensors, None)
        return (y * dy).sum() + (0 if h is None else (h * dh).sum())

    leaves = [t if t is None else t.detach().requires_grad_() for t in (x, r, w, weight, bias)]
    step(*leaves).backward()
    eager = [t.grad for t in leaves if t is not None and t.grad is not None]
    compiled = [t if t is None else t.detach().requires_grad_() for t in (x, r, w, weight, bias)]
    torch.compile(step, fullgraph=True)(*compiled).backward()
    check_outputs([t.grad for t in compiled if t is not None and t.grad is not None], eager, torch.float32)


@pytest.mark.ref_mode
@pytest.mark.parametrize("fused", [None, False], ids=["kernel", "unfused"])
@pytest.mark.parametrize("params", ["none", "frozen"])
@pytest.mark.parametrize("op", ["add_rmsnorm", "add_layernorm"])
def test_compiled_backward_without_trainable_norm_parameters(op, params, fused, device):
    """Under torch.compile the backward runs through the dispatcher, which refuses outputs that
    alias each other: the parameters' unneeded gradients must be distinct empty tensors."""
    x, r, w, weight, bias, dy, dh = _inputs(Shape(24, 64, 40), torch.float32, device, 17)
    weight, bias = (None, None) if params == "none" else (weight, None if op == "add_rmsnorm" else bias)
    leaves = [t.detach().requires_grad_() for t in (x, r, w)]

    def step(x, r, w):
        y, h = _run(op, x, r, w, weight, bias, fused)
        return (y * dy).sum() + (h * dh).sum()

    step(*leaves).backward()
    eager = [t.grad for t in leaves]
    compiled = [t.detach().requires_grad_() for t in (x, r, w)]
    torch.compile(step, fullgraph=True)(*compiled).backward()
    check_outputs([t.grad for t in compiled], eager, torch.float32)


@pytest.mark.ref_mode
@pytest.mark.parametrize("op", ["add_rmsnorm", "add_layernorm"])
def test_no_dgrad_when_only_parameters_need_gradients(op, device, monkeypatch):
    """After the fused forward (nothing normalised kept) the unfused backward of a frozen x and
    residual rebuilds the norm's output for the wgrad without the dgrad GEMM ``dy @ b^T``: for
    ``b`` alone, and for RMSNorm's weight too (from ``x_hat^T @ dy``; LayerNorm's parameters
    are column sums of ``dy @ b^T``, so they need it)."""
    x, r, w, weight, bias, dy, _ = _inputs(Shape(24, 64, 40), torch.float32, device, 18)
    params = [w.detach().requires_grad_(), weight.detach().requires_grad_(op == "add_rmsnorm"),
              None if op == "add_rmsnorm" else bias]
    real = runtime.decide
    monkeypatch.setattr(runtime, "decide", lambda spec, args, fused=None, training=False:
                        real(spec, args, False if spec in (K.SPEC_LAYERNORM_BACKWARD, K.SPEC_BACKWARD) else fused,
                             training))
    y, _ = _run(op, x, r, *params, None)
    shapes, mm = [], torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b, **kw: shapes.append((tuple(a.shape), tuple(b.shape))) or mm(a, b, **kw))
    (y * dy).sum().backward()
    assert ((24, 40), (40, 64)) not in shapes, shapes
    assert all(t is None or t.grad is not None for t in params if t is not None and t.requires_grad)


@pytest.mark.ref_mode
def test_opcheck(device):
    """The custom ops' schemas, fakes and autograd registrations (torch.library.opcheck)."""
    from helion_kernels.techniques.prenorm import layernorm, residual

    x, r, w, weight, bias, *_ = _inputs(Shape(8, 32, 24), torch.float32, device, 16)
    beta = layernorm.folded_bias(bias, w)
    mean, rstd = layer_stats(x, EPS)
    cases = [(layernorm._OP, (x, w, beta, EPS, None)), (layernorm._GIVEN, (x, w, beta, mean, rstd, None)),
             (residual._OP, (x, r, w, weight, bias, EPS, 1, None)), (residual._OP, (x, r, w, None, None, EPS, 1, True)),
             (residual._OP, (x, r, w, weight, None, EPS, 0, False)), (residual._OP, (x, r, w, weight, None, EPS, 0, True))]
    for op, args in cases:
        args = tuple(t.detach().requires_grad_() if isinstance(t, torch.Tensor) and t.is_floating_point()
                     and t.dim() > 0 else t for t in args)
        torch.library.opcheck(op.custom_op, args, test_utils=("test_schema", "test_faketensor",
                                                               "test_autograd_registration"))


def test_dispatch_without_entries_is_unfused():
    """No registry entries yet for the new kernels: every call runs unfused (reference mode aside)."""
    for spec in (K.SPEC_LAYERNORM, K.SPEC_LAYERNORM_GIVEN, K.SPEC_LAYERNORM_BACKWARD):
        args = spec.make_args(Shape(64, 32, 48), torch.float32, "cpu", 0)
        assert not runtime.decide(spec, args, False).fused
        assert runtime.decide(spec, args, True).fused


INTERPRETER_CONFIGS = {
    "layernorm_matmul": [helion.Config(block_sizes=[16, 32, 32, 16], num_warps=4, num_stages=1),
                         helion.Config(block_sizes=[32, 64, 64, 32], num_warps=4, num_stages=2)],
    "layernorm_matmul_given_stats": [helion.Config(block_sizes=[16, 32, 16], num_warps=4, num_stages=1),
                                     helion.Config(block_sizes=[32, 64, 32], num_warps=4, num_stages=2)],
    "layernorm_matmul_backward": [helion.Config(block_sizes=[16, 32, 16], num_warps=4, num_stages=1),
                                  helion.Config(block_sizes=[32, 64, 32], num_warps=4, num_stages=2)],
    "rmsnorm_matmul_given_rstd": [helion.Config(block_sizes=[16, 32, 16], num_warps=4, num_stages=1)],
}


@pytest.mark.triton_interpret
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])  # bf16 tl.dot is broken in the interpreter
@pytest.mark.parametrize("shape", [Shape(33, 100, 72), Shape(1, 48, 40)], ids=str)
@pytest.mark.parametrize("name", sorted(INTERPRETER_CONFIGS))
def test_triton_code_for_explicit_configs(name, shape, dtype):
    """Partial tiles in every dimension, fp16 (the mean off in the epilogue) and fp32 (off each
    tile before the MMA)."""
    spec = {s.name: s for s in (K.SPEC_LAYERNORM, K.SPEC_LAYERNORM_GIVEN, K.SPEC_LAYERNORM_BACKWARD,
                                K.SPEC_GIVEN_RSTD)}[name]
    args = spec.make_args(shape, dtype, "cpu", 5)
    for config in INTERPRETER_CONFIGS[name]:
        bound = spec.kernel.bind(args)
        bound.set_config(config)
        out = bound(*args)
        check_outputs(out, spec.reference(*args), dtype)


@pytest.mark.triton_interpret
def test_triton_code_far_from_zero_mean():
    """Rows at mean 100 (fp16's range): the epilogue's correction and the per-tile shift."""
    for dtype in (torch.float16, torch.float32):
        for spec in (K.SPEC_LAYERNORM, K.SPEC_LAYERNORM_GIVEN):
            args = list(spec.make_args(Shape(20, 200, 48), dtype, "cpu", 6))
            a = (args[0].float() + 97.0).to(dtype)  # make_args' rows sit at mean 3
            args[0] = a
            if spec is K.SPEC_LAYERNORM_GIVEN:
                mean, rstd = layer_stats(a.double(), EPS)
                args[2], args[3] = rstd.float(), mean.float()
            bound = spec.kernel.bind(tuple(args))
            bound.set_config(INTERPRETER_CONFIGS[spec.name][0])
            check_outputs(bound(*args), spec.reference(*args), dtype)


@pytest.mark.cuda
@pytest.mark.filterwarnings("ignore::helion_kernels.registry.ConfigFallbackWarning")
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [Shape(1, 96, 200), Shape(4097, 1000, 300)], ids=str)
@pytest.mark.parametrize("op", OPS)
def test_cuda_forward_and_every_gradient(op, shape, dtype, fused, device):
    runtime.clear_cache()
    _check(op, shape, dtype, device, fused)
    _check(op, shape, dtype, device, fused, offset=1e3)



def test_backward_kernel_args_in_float64():
    """The dgrad kernel's arguments for a float64 check: the row terms stay fp32 (the
    operand's column sums in float64 do not leak into them)."""
    from helion_kernels.spec import Shape
    from helion_kernels.techniques.prenorm.kernels import SPEC_LAYERNORM_BACKWARD

    args = SPEC_LAYERNORM_BACKWARD.make_args(Shape(8, 16, 8), torch.float64, "cpu", 0)
    assert args[4].dtype == args[6].dtype == torch.float32  # s2, s1
