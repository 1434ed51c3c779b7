"""``AddRMSNormLinear`` / ``AddLayerNormLinear`` (the pre-norm block's residual add, norm and
Linear) and ``LayerNormLinear`` with the producer's statistics, against the PyTorch modules
they replace: both outputs and every gradient, leading dimensions, state_dict both ways,
from_modules, autocast with fp32 parameters, torch.compile, bad input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helion_kernels import AddLayerNormLinear, AddRMSNormLinear, LayerNormLinear
from helion_kernels.autograd import layer_stats
from helion_kernels.verify import check_outputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_DEVICE = pytest.mark.cuda if DEVICE == "cuda" else pytest.mark.ref_mode
pytestmark = pytest.mark.filterwarnings("ignore::helion_kernels.registry.ConfigFallbackWarning")
GRAD_TOLERANCE = {torch.bfloat16: 5e-2, torch.float32: 5e-3}
MODULES = {"AddRMSNormLinear": (AddRMSNormLinear, nn.RMSNorm), "AddLayerNormLinear": (AddLayerNormLinear, nn.LayerNorm)}


def _pair(kind: str, k: int, n: int, bias: bool, dtype, seed: int) -> tuple[nn.Module, nn.Linear]:
    torch.manual_seed(seed)
    norm, linear = MODULES[kind][1](k, eps=1e-6), nn.Linear(k, n, bias=bias)
    with torch.no_grad():  # affine parameters away from their 1 / 0 initialisation
        for p in norm.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return norm.to(DEVICE, dtype), linear.to(DEVICE, dtype)


def _block(norm, linear, x, residual):
    h = x + residual
    return linear(norm(h)), h


@ON_DEVICE
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", sorted(MODULES))
def test_matches_the_block_forward_and_backward(kind, dtype, bias):
    norm, linear = _pair(kind, 48, 40, bias, dtype, seed=1)
    module = MODULES[kind][0].from_modules(norm, linear)
    x = torch.randn(3, 7, 48, device=DEVICE).to(dtype).requires_grad_()  # leading dims [3, 7]
    r = torch.randn(3, 7, 48, device=DEVICE).to(dtype).requires_grad_()
    probe_y, probe_h = torch.randn(3, 7, 40, device=DEVICE), torch.randn(3, 7, 48, device=DEVICE)
    y, h = module(x, r)
    assert y.shape == (3, 7, 40) and h.shape == (3, 7, 48) and y.dtype == h.dtype == dtype
    ((y.float() * probe_y).sum() + (h.float() * probe_h).sum()).backward()
    got = {"x": x.grad, "r": r.grad, **{n: p.grad for n, p in module.named_parameters()}}
    ref_norm, ref_linear = _pair(kind, 48, 40, bias, torch.float64, seed=1)
    x64, r64 = (t.detach().double().requires_grad_() for t in (x, r))
    ref_y, ref_h = _block(ref_norm, ref_linear, x64, r64)
    check_outputs((y, h), (ref_y, ref_h), dtype)
    ((ref_y * probe_y.double()).sum() + (ref_h * probe_h.double()).sum()).backward()
    expected = {"x": x64.grad, "r": r64.grad, **{f"norm.{n}": p.grad for n, p in ref_norm.named_parameters()},
                **{f"linear.{n}": p.grad for n, p in ref_linear.named_parameters()}}
    assert set(got) == set(expected)
    for name, g in got.items():
        check_outputs(g, expected[name], dtype, tolerance=GRAD_TOLERANCE[dtype])


@ON_DEVICE
@pytest.mark.parametrize("kind", sorted(MODULES))
def test_state_dict_both_ways_and_constructor(kind):
    norm, linear = _pair(kind, 16, 8, True, torch.float32, seed=3)
    module = MODULES[kind][0].from_modules(norm, linear)
    keys = {"norm.weight", "linear.weight", "linear.bias"} | ({"norm.bias"} if "Layer" in kind else set())
    assert set(module.state_dict()) == keys
    fresh = MODULES[kind][0](16, 8, eps=1e-6).to(DEVICE)
    fresh.load_state_dict(module.state_dict())
    x, r = torch.randn(4, 16, device=DEVICE), torch.randn(4, 16, device=DEVICE)
    for a, b in zip(fresh(x, r), _block(norm, linear, x, r)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_from_modules_and_bad_input_are_refused_clearly():
    with pytest.raises(TypeError, match="nn.RMSNorm"):
        AddRMSNormLinear.from_modules(nn.LayerNorm(8), nn.Linear(8, 4))
    with pytest.raises(ValueError, match="in_features"):
        AddLayerNormLinear.from_modules(nn.LayerNorm(4), nn.Linear(8, 4))
    module = AddRMSNormLinear(8, 4)
    with pytest.raises(ValueError, match="residual must have x's shape"):
        module(torch.randn(2, 8), torch.randn(3, 8))
    with pytest.raises(TypeError, match="residual must be a torch.Tensor"):
        module(torch.randn(2, 8), None)
    with pytest.raises(ValueError, match="at least one dimension"):
        module(torch.tensor(1.0), torch.tensor(1.0))
    for layer in (module, LayerNormLinear(8, 4)):
        with pytest.raises(ValueError, match=r"last dimension must be in_features = 8, got x of shape \(2, 9\)"):
            layer(torch.randn(2, 9), torch.randn(2, 9)) if layer is module else layer(torch.randn(2, 9))


def test_the_add_ops_name_their_own_arguments_in_errors():
    from helion_kernels import add_layernorm_matmul, add_rmsnorm_matmul

    for op in (add_rmsnorm_matmul, add_layernorm_matmul):
        with pytest.raises(ValueError, match=r"mismatched K: x is \(2, 8\).*b is \(9, 4\)"):
            op(torch.randn(2, 8), torch.randn(2, 8), torch.randn(9, 4))
        with pytest.raises(ValueError, match=r"x must be 2-D.*x.reshape\(-1, K\)"):
            op(torch.randn(2, 2, 8), torch.randn(2, 2, 8), torch.randn(8, 4))
        with pytest.raises(TypeError, match="x and b must share a dtype"):
            op(torch.randn(2, 8), torch.randn(2, 8), torch.randn(8, 4, dtype=torch.float64).half())


@ON_DEVICE
def test_a_double_backward_is_refused_naming_the_add_ops():
    from helion_kernels import add_layernorm_matmul, add_rmsnorm_matmul

    for op in (add_rmsnorm_matmul, add_layernorm_matmul):
        x, residual = (torch.randn(4, 8, device=DEVICE, requires_grad=True) for _ in range(2))
        y, h = op(x, residual, torch.randn(8, 4, device=DEVICE))
        with pytest.raises(RuntimeError, match="add_rmsnorm_matmul / add_layernorm_matmul: the backward is not "
                                               "differentiable; create_graph=True"):
            torch.autograd.grad(y.sum() + h.sum(), x, create_graph=True)


@ON_DEVICE
@pytest.mark.parametrize("kind", sorted(MODULES))
def test_autocast_with_fp32_parameters_and_inputs(kind):
    """fp32 inputs and parameters under bf16 autocast: ``h`` is fp32 as the block's add gives,
    ``y`` the autocast dtype; values close to the block's; fp32 gradients."""
    norm, linear = _pair(kind, 256, 128, True, torch.float32, seed=6)
    module = MODULES[kind][0].from_modules(norm, linear)
    x, r = torch.randn(4, 64, 256, device=DEVICE), torch.randn(4, 64, 256, device=DEVICE)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        ours, theirs = module(x, r), _block(norm, linear, x, r)
    assert [t.dtype for t in ours] == [t.dtype for t in theirs]
    check_outputs(ours[0], theirs[0].float(), torch.bfloat16)
    torch.testing.assert_close(ours[1], theirs[1])
    ours[0].float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in module.parameters())


@ON_DEVICE
@pytest.mark.parametrize("kind", sorted(MODULES))
def test_mixed_input_dtypes_follow_the_blocks_promotion(kind):
    """bf16 ``x`` plus an fp32 residual into fp32 parameters, no autocast: the block's add
    gives fp32 ``h``, so its norm and Linear run in fp32; the module's outputs too."""
    norm, linear = _pair(kind, 48, 80, True, torch.float32, seed=8)
    module = MODULES[kind][0].from_modules(norm, linear)
    x = torch.randn(3, 48, device=DEVICE).to(torch.bfloat16)
    r = torch.randn(3, 48, device=DEVICE)
    ours, theirs = module(x, r), _block(norm, linear, x, r)
    assert [t.dtype for t in ours] == [t.dtype for t in theirs] == [torch.float32] * 2
    check_outputs(ours[0], theirs[0], torch.float32)
    torch.testing.assert_close(ours[1], theirs[1])


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("kind", sorted(MODULES))
def test_compiles_with_fullgraph(kind):
    norm, linear = _pair(kind, 32, 24, False, torch.float32, seed=5)
    module = MODULES[kind][0].from_modules(norm, linear)
    x, r = torch.randn(2, 3, 32, device=DEVICE), torch.randn(2, 3, 32, device=DEVICE)
    torch._dynamo.reset()
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    for a, b in zip(torch.compile(module, fullgraph=True, backend=backend)(x, r), module(x, r)):
        torch.testing.assert_close(a, b)


@ON_DEVICE
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_layernorm_linear_with_the_producers_statistics(dtype):
    """LayerNormLinear.forward(x, mean=, rstd=) computed under autograd: the pair's output and
    x's whole gradient through them."""
    torch.manual_seed(4)
    norm, linear = nn.LayerNorm(48, eps=1e-5), nn.Linear(48, 40)
    module = LayerNormLinear.from_modules(norm.to(DEVICE, dtype), linear.to(DEVICE, dtype))
    x = (torch.randn(2, 5, 48, device=DEVICE) + 3).to(dtype).requires_grad_()
    mean, rstd = (t.reshape(2, 5) for t in layer_stats(x.reshape(-1, 48), 1e-5))
    y = module(x, mean=mean, rstd=rstd)
    y.float().sum().backward()
    x64 = x.detach().double().requires_grad_()
    ref = nn.Sequential(norm, linear).double()(x64)
    ref.sum().backward()
    check_outputs(y, ref, dtype)
    check_outputs(x.grad, x64.grad, dtype, tolerance=GRAD_TOLERANCE[dtype])
    with pytest.raises(ValueError, match="mean must have x's leading shape"):
        module(x, mean=mean.reshape(-1), rstd=rstd)
