"""The nn.Module drop-ins against the PyTorch pairs they replace: outputs and every
parameter's gradient, leading dimensions, eps semantics, state_dict both ways, from_modules,
autocast (CUDA), torch.compile."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from helion_kernels import LayerNormLinear, LinearLayerNorm, LinearRMSNorm, RMSNormLinear, modules
from helion_kernels.verify import check_outputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_DEVICE = pytest.mark.cuda if DEVICE == "cuda" else pytest.mark.ref_mode
pytestmark = pytest.mark.filterwarnings("ignore::helion_kernels.registry.ConfigFallbackWarning")
GRAD_TOLERANCE = {torch.bfloat16: 5e-2, torch.float32: 5e-3}


def _pair(kind: str, k: int, n: int, bias: bool, eps, dtype, seed: int):
    torch.manual_seed(seed)
    if kind == "RMSNormLinear":
        pair = nn.Sequential(nn.RMSNorm(k, eps=eps), nn.Linear(k, n, bias=bias))
    elif kind == "LayerNormLinear":
        pair = nn.Sequential(nn.LayerNorm(k, eps=eps or 1e-5), nn.Linear(k, n, bias=bias))
    else:
        norm = nn.LayerNorm(n, eps=eps or 1e-5) if kind == "LinearLayerNorm" else nn.RMSNorm(n, eps=eps)
        pair = nn.Sequential(nn.Linear(k, n, bias=bias), norm)
    with torch.no_grad():  # affine parameters away from their 1 / 0 initialisation
        for name, p in pair.named_parameters():
            if not name.endswith("1.weight") and p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    return pair.to(DEVICE, dtype)


def _module(kind: str, pair: nn.Sequential):
    if kind in PRE_NORM:
        return MODULES[kind].from_modules(pair[0], pair[1])
    return {"LinearLayerNorm": LinearLayerNorm, "LinearRMSNorm": LinearRMSNorm}[kind].from_modules(pair[1], pair[0])


KINDS = ["RMSNormLinear", "LayerNormLinear", "LinearLayerNorm", "LinearRMSNorm"]
PRE_NORM = ("RMSNormLinear", "LayerNormLinear")  # norm, then Linear
MODULES = {"RMSNormLinear": RMSNormLinear, "LayerNormLinear": LayerNormLinear, "LinearLayerNorm": LinearLayerNorm,
           "LinearRMSNorm": LinearRMSNorm}
# (kind, eps): nn.RMSNorm's eps=None means the dtype's epsilon; nn.LayerNorm has no None.
KIND_EPS = [(k, e) for k in KINDS for e in (None, 1e-6) if not ("LayerNorm" in k and e is None)]


@ON_DEVICE
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("kind", "eps"), KIND_EPS, ids=[f"{k}-eps_{e}" for k, e in KIND_EPS])
def test_matches_the_pair_forward_and_backward(kind, eps, dtype, bias):
    pair = _pair(kind, 48, 40, bias, eps, dtype, seed=1)
    module = _module(kind, pair)
    x = torch.randn(3, 7, 48, device=DEVICE).to(dtype).requires_grad_()  # leading dims [3, 7]
    probe = torch.randn(3, 7, 40, device=DEVICE)
    out = module(x)
    assert out.shape == (3, 7, 40) and out.dtype == dtype
    (out.float() * probe).sum().backward()
    got = {"x": x.grad, **{n: p.grad for n, p in module.named_parameters()}}
    ref_pair = _pair(kind, 48, 40, bias, eps, torch.float64, seed=1)
    x64 = x.detach().double().requires_grad_()
    ref = ref_pair(x64)
    check_outputs(out, ref, dtype)
    (ref * probe.double()).sum().backward()
    expected = {"x": x64.grad}
    for (name, p), (_, q) in zip(pair.named_parameters(), ref_pair.named_parameters()):
        module_name = {"0": "norm", "1": "linear"}[name[0]] if kind in PRE_NORM else \
            {"0": "linear", "1": "norm"}[name[0]]
        expected[f"{module_name}{name[1:]}"] = q.grad
    assert set(got) == set(expected)
    for name, g in got.items():
        check_outputs(g, expected[name], dtype, tolerance=GRAD_TOLERANCE[dtype])


@ON_DEVICE
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_rmsnorm_linear_with_the_producers_rstd(dtype):
    """rstd computed by the block (the residual add) from x under autograd: the pair's output
    and every gradient, through the given-rstd kernel."""
    pair = _pair("RMSNormLinear", 48, 40, True, 1e-6, dtype, seed=4)
    module = _module("RMSNormLinear", pair)
    r, h = (torch.randn(3, 7, 48, device=DEVICE).to(dtype) for _ in range(2))
    h.requires_grad_()
    probe = torch.randn(3, 7, 40, device=DEVICE)
    x = r + h
    out = module(x, rstd=torch.rsqrt(x.float().square().mean(-1) + 1e-6))
    (out.float() * probe).sum().backward()
    ref_pair = _pair("RMSNormLinear", 48, 40, True, 1e-6, torch.float64, seed=4)
    h64 = h.detach().double().requires_grad_()
    ref = ref_pair(r.double() + h64)
    (ref * probe.double()).sum().backward()
    check_outputs(out, ref, dtype)
    check_outputs([h.grad, module.norm.weight.grad, module.linear.weight.grad, module.linear.bias.grad],
                  [h64.grad, ref_pair[0].weight.grad, ref_pair[1].weight.grad, ref_pair[1].bias.grad], dtype,
                  tolerance=GRAD_TOLERANCE[dtype])
    with pytest.raises(ValueError, match=r"rstd must have x's leading shape \(3, 7\), got \(21,\)"):
        module(x, rstd=torch.ones(21, device=DEVICE))


@ON_DEVICE
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["RMSNormLinear", "LinearRMSNorm"])
def test_eps_none_on_small_activations(kind, dtype):
    """``nn.RMSNorm(eps=None)`` adds the epsilon of the dtype rms_norm computes in (fp32 for
    bf16 too, against its docstring's finfo(x.dtype)); with rows of small mean square a bf16
    epsilon (0.0078) would shift the output far past the tolerance."""
    pair = _pair(kind, 48, 40, False, None, dtype, seed=7)
    with torch.no_grad():
        for p in pair.parameters():
            if p.dim() == 2:
                p.mul_(0.05)  # small pre-norm activations for the post-norm pair
    x = (0.01 * torch.randn(6, 48, device=DEVICE)).to(dtype)
    ours = _module(kind, pair)(x)
    reference = copy.deepcopy(pair).float()(x.float())  # eps=None: fp32's epsilon, as for bf16
    check_outputs(ours, reference, dtype)


@ON_DEVICE
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["LinearLayerNorm", "LinearRMSNorm"])
def test_bias_and_residual_inside_the_kernel(kind, dtype, monkeypatch):
    """``norm(linear(x) + residual)`` with a Linear bias: one kernel launch that gets the bias,
    the residual and the Linear's own weight storage (no copy), and every gradient (the
    residual's too) against float64 autograd of the pair."""
    from helion_kernels import runtime

    launched = []
    launch = runtime.launch
    monkeypatch.setattr(runtime, "launch", lambda spec, args: launched.append(args) or launch(spec, args))
    pair = _pair(kind, 32, 24, True, 1e-5, dtype, seed=2)
    module = _module(kind, pair)
    x = torch.randn(2, 5, 32, device=DEVICE).to(dtype).requires_grad_()
    r = torch.randn(2, 5, 24, device=DEVICE).to(dtype).requires_grad_()
    probe = torch.randn(2, 5, 24, device=DEVICE)
    out = module(x, residual=r)
    (out.float() * probe).sum().backward()
    if DEVICE == "cpu":  # reference mode runs the fused kernel (on a GPU the registry decides)
        (args,) = launched
        assert args[1].data_ptr() == pair[0].weight.data_ptr()  # W.t() read in place
        assert args[6] is pair[0].bias and args[7].shape == (10, 24)  # linear_bias, residual
    ref_pair = copy.deepcopy(pair).double()
    x64, r64 = (t.detach().double().requires_grad_() for t in (x, r))
    ref = ref_pair[1](ref_pair[0](x64) + r64)
    check_outputs(out, ref, dtype)
    (ref * probe.double()).sum().backward()
    tolerance = GRAD_TOLERANCE[dtype]
    check_outputs(x.grad, x64.grad, dtype, tolerance=tolerance)
    check_outputs(r.grad, r64.grad, dtype, tolerance=tolerance)
    got = dict(module.named_parameters())
    for prefix, ref_module in (("linear", ref_pair[0]), ("norm", ref_pair[1])):
        for name, q in ref_module.named_parameters():
            check_outputs(got[f"{prefix}.{name}"].grad, q.grad, dtype, tolerance=tolerance)


@ON_DEVICE
@pytest.mark.parametrize("kind", KINDS)
def test_state_dict_both_ways_and_constructor(kind):
    pair = _pair(kind, 16, 8, True, 1e-5, torch.float32, seed=3)
    module = _module(kind, pair)
    names = ("norm", "linear") if kind in PRE_NORM else ("linear", "norm")
    expected = {f"{names[int(k[0])]}{k[1:]}" for k in pair.state_dict()}
    assert set(module.state_dict()) == expected == {"norm.weight", "linear.weight", "linear.bias"} | (
        {"norm.bias"} if "LayerNorm" in kind else set())
    fresh = MODULES[kind](16, 8, eps=1e-5).to(DEVICE)
    fresh.load_state_dict(module.state_dict())
    x = torch.randn(4, 16, device=DEVICE)
    torch.testing.assert_close(fresh(x), module(x))
    back = _pair(kind, 16, 8, True, 1e-5, torch.float32, seed=4)
    back.load_state_dict({f"{names.index(k.split('.')[0])}.{k.split('.', 1)[1]}": v for k, v in fresh.state_dict().items()})
    torch.testing.assert_close(back(x), pair(x))


@ON_DEVICE
def test_from_modules_refuses_a_mismatched_pair():
    with pytest.raises(TypeError, match="norm must be an nn.RMSNorm"):
        RMSNormLinear.from_modules(nn.LayerNorm(8), nn.Linear(8, 4))
    with pytest.raises(ValueError, match="in_features"):
        RMSNormLinear.from_modules(nn.RMSNorm(4), nn.Linear(8, 4))
    with pytest.raises(ValueError, match="out_features"):
        LinearLayerNorm.from_modules(nn.LayerNorm(8), nn.Linear(8, 4))
    with pytest.raises(TypeError, match="linear must be an nn.Linear"):
        LinearRMSNorm.from_modules(nn.RMSNorm(4), nn.Identity())


@pytest.mark.parametrize("module", [RMSNormLinear(8, 4), LinearLayerNorm(8, 4), LinearRMSNorm(8, 4)],
                         ids=["RMSNormLinear", "LinearLayerNorm", "LinearRMSNorm"])
def test_refuses_a_0d_input_and_a_non_tensor(module):
    """Checked before the input is reshaped, so the message names the module, not an IndexError."""
    name = type(module).__name__
    with pytest.raises(ValueError, match=f"{name}: x must have at least one dimension"):
        module(torch.tensor(1.0))
    with pytest.raises(TypeError, match=f"{name}: x must be a torch.Tensor, got list"):
        module([1.0] * 8)


@ON_DEVICE
@pytest.mark.parametrize("kind", KINDS)
def test_linear_weight_gradient_arrives_in_its_layout(kind):
    """The Linear weight W [N, K] enters the ops as ``W.t()``; its gradient reaches W row-major
    (computed as ``dc^T @ x``, as torch's mm backward does), so autograd accumulates it
    without a transposing copy, and equals the pair's."""
    pair = _pair(kind, 24, 20, False, 1e-5, torch.float32, seed=6)
    module = _module(kind, copy.deepcopy(pair))
    weight = module.linear.weight
    arrived = []
    weight.register_hook(lambda g: arrived.append(g.is_contiguous()))
    x = torch.randn(7, 24, device=DEVICE)
    module(x).square().sum().backward()
    pair(x).square().sum().backward()
    assert arrived == [True]
    check_outputs(weight.grad, pair[1 if kind in PRE_NORM else 0].weight.grad, torch.float32,
                  tolerance=GRAD_TOLERANCE[torch.float32])


@ON_DEVICE
def test_shares_the_pairs_parameters():
    norm, linear = nn.RMSNorm(8), nn.Linear(8, 4)
    module = RMSNormLinear.from_modules(norm, linear)
    assert module.norm is norm and module.linear.weight is linear.weight


@ON_DEVICE
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("kind", KINDS)
def test_compiles_with_fullgraph(kind):
    pair = _pair(kind, 32, 24, False, 1e-5, torch.float32, seed=5)
    module = _module(kind, pair)
    x = torch.randn(2, 3, 32, device=DEVICE)
    torch._dynamo.reset()
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    torch.testing.assert_close(torch.compile(module, fullgraph=True, backend=backend)(x), module(x))


@ON_DEVICE
@pytest.mark.parametrize("eps", [None, 1e-5], ids=["eps_none", "eps_1e-5"])
@pytest.mark.parametrize("kind", KINDS)
def test_autocast_with_fp32_parameters(kind, eps):
    """fp32 parameters under bf16 autocast (on the device at hand; CPU and CUDA autocast
    differ on which norms they run in fp32): the pair's output dtype, close values, fp32
    gradients."""
    if "LayerNorm" in kind and eps is None:
        eps = 1e-6  # nn.LayerNorm has no eps=None
    pair = _pair(kind, 256, 128, True, eps, torch.float32, seed=6)
    module = _module(kind, pair)
    x = torch.randn(4, 64, 256, device=DEVICE)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        ours, theirs = module(x), pair(x)
    assert ours.dtype == theirs.dtype
    check_outputs(ours, theirs.float(), torch.bfloat16)
    ours.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in module.parameters())


@ON_DEVICE
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("kind", KINDS)
def test_autocast_dtype_probe_is_quiet_and_compiles(kind, monkeypatch):
    """The module asks torch, with a tiny probe, what dtype its norm returns under autocast.
    Eager, the probe's own dtype-mismatch warning from torch is not shown to the user; under
    ``torch.compile(fullgraph=True)`` the probe (not yet cached) traces without a graph break
    (a warnings filter would break it)."""
    pair = _pair(kind, 32, 24, False, 1e-5, torch.float32, seed=7)
    module = _module(kind, pair)
    x = torch.randn(2, 3, 32, device=DEVICE)
    monkeypatch.setattr(modules, "_NORM_DTYPES", {})
    with torch.autocast(DEVICE, dtype=torch.bfloat16), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        eager = module(x)
    assert not [w for w in seen if "Mismatch dtype between input and weight" in str(w.message)]
    monkeypatch.setattr(modules, "_NORM_DTYPES", {})
    torch._dynamo.reset()
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        compiled = torch.compile(module, fullgraph=True, backend=backend)(x)
    assert compiled.dtype == eager.dtype
    check_outputs(compiled, eager.float(), torch.bfloat16)


@ON_DEVICE
@pytest.mark.parametrize("kind", ["LinearLayerNorm", "LinearRMSNorm"])
def test_residual_broadcasts_like_the_pair(kind):
    """A residual of x's leading shape or one that broadcasts to it ([seq, N] for x [batch,
    seq, K]) works as ``linear(x) + residual`` does; one that does not is a ValueError naming
    it, before anything runs (where a plain reshape would pair up rows silently)."""
    pair = _pair(kind, 16, 8, True, 1e-5, torch.float32, seed=4)
    module = _module(kind, pair)
    x = torch.randn(2, 4, 16, device=DEVICE)
    r = torch.randn(4, 8, device=DEVICE, requires_grad=True)
    out = module(x, residual=r)
    check_outputs(out, pair[1](pair[0](x) + r), torch.float32)
    out.sum().backward()
    assert r.grad.shape == (4, 8)
    for bad in (torch.randn(4, 2, 8), torch.randn(8, 8), torch.randn(2, 4, 9)):
        with pytest.raises(ValueError, match="residual of shape"):
            module(x, residual=bad.to(DEVICE))
