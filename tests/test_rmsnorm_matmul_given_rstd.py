"""``rmsnorm_matmul(..., rstd=)``: the deferred pre-norm on the producer's statistics (kernel
``rmsnorm_matmul_given_rstd``): forward against float64, gradients of every input (rstd's
flowing back into its producer), dispatch, bad input; reference mode, interpreter and CUDA."""

from __future__ import annotations

import helion
import pytest
import torch

from helion_kernels import rmsnorm_matmul
from helion_kernels.techniques.prenorm.kernels import (
    SPEC_GIVEN_RSTD,
    prenorm_matmul_given_stats_kernel,
    rmsnorm_matmul_reference,
)
from helion_kernels.autograd import rms_rstd
from helion_kernels.spec import Shape
from helion_kernels.verify import check_outputs

from _seeds import stable_seed

pytestmark = pytest.mark.usefixtures("poisoned_empty")

ODD_SHAPES = [Shape(1, 64, 32), Shape(33, 100, 72), Shape(130, 256, 200), Shape(5, 48, 1)]
EPS = 1e-5


def _inputs(shape: Shape, dtype, device, seed: int):
    a, b, _ = SPEC_GIVEN_RSTD.make_args(shape, dtype, device, seed)
    gen = torch.Generator().manual_seed(seed + 7)
    weight = (1 + 0.5 * torch.randn(shape.K, generator=gen)).to(device=device, dtype=dtype)
    return a, b, weight


def _forward(shape, dtype, device, seed):
    a, b, w = _inputs(shape, dtype, device, seed)
    rstd = rms_rstd(a, EPS)
    c, r = rmsnorm_matmul(a, b, w, rstd=rstd, return_rstd=True)
    assert c.dtype == dtype and r is rstd
    check_outputs(c, rmsnorm_matmul_reference(a.double(), b.double(), EPS, w.double())[0], dtype)


def _gradients(shape, dtype, device, seed, fused):
    """The producer computes rstd from a under autograd: the gradients must be those of the
    whole rms_norm(a, w) @ b, computed in float64."""
    a, b, w = _inputs(shape, dtype, device, seed)
    dc = torch.randn(shape.M, shape.N, device=device, dtype=torch.float32).to(dtype)
    leaves = [t.detach().requires_grad_() for t in (a, b, w)]
    c = rmsnorm_matmul(leaves[0], leaves[1], leaves[2], rstd=rms_rstd(leaves[0], EPS), fused=fused)
    c.backward(dc)
    ref = [t.detach().double().requires_grad_() for t in (a, b, w)]
    ref_c = rmsnorm_matmul_reference(*ref[:2], EPS, ref[2])[0]
    ref_c.backward(dc.double())
    check_outputs(c.detach(), ref_c.detach(), dtype)
    check_outputs([t.grad for t in leaves], [t.grad for t in ref], dtype, tolerance=5e-2 if dtype != torch.float32 else None)


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=str)
def test_reference_mode_matches_fp64(shape, dtype, device):
    _forward(shape, dtype, device, stable_seed(shape))


@pytest.mark.ref_mode
@pytest.mark.parametrize("fused", [None, False], ids=["kernel", "unfused"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [Shape(1, 64, 32), Shape(33, 100, 72)], ids=str)
def test_reference_mode_gradients(shape, dtype, fused, device):
    _gradients(shape, dtype, device, stable_seed(shape) + 1, fused=fused)


@pytest.mark.ref_mode
def test_rstd_gradient_alone(device):
    """A detached a: only rstd's gradient, sum_k(a * (dc @ b^T)) per row."""
    a, b, _ = _inputs(Shape(9, 40, 24), torch.float32, device, 3)
    rstd = rms_rstd(a, EPS).requires_grad_()
    dc = torch.randn(9, 24, device=device)
    rmsnorm_matmul(a, b, rstd=rstd).backward(dc)
    expect = (a.double() * (dc.double() @ b.double().t())).sum(1)
    check_outputs(rstd.grad, expect, torch.float32)


@pytest.mark.ref_mode
def test_bad_rstd_is_refused_before_launch(device):
    a, b, _ = _inputs(Shape(8, 16, 12), torch.float32, device, 5)
    with pytest.raises(ValueError, match=r"rstd must have shape \[M\] = \(8,\)"):
        rmsnorm_matmul(a, b, rstd=torch.ones(7, device=device))
    with pytest.raises(TypeError, match="rstd must be float32"):
        rmsnorm_matmul(a, b, rstd=torch.ones(8, device=device, dtype=torch.float64))
    with pytest.raises(TypeError, match="rstd must be a torch.Tensor or None"):
        rmsnorm_matmul(a, b, rstd=[1.0] * 8)


def test_dispatch_follows_its_own_registry_decisions(decisions):
    """Unfused without entries (the compiled row scaling + cuBLAS); the given-rstd kernel's
    own decision applies, not the statistics kernel's; fused= forces."""
    from helion_kernels import registry, runtime
    from helion_kernels.registry import Entry

    args = SPEC_GIVEN_RSTD.make_args(Shape(64, 32, 48), torch.float32, "cpu", 0)
    assert not runtime.decide(SPEC_GIVEN_RSTD, args).fused
    assert runtime.decide(SPEC_GIVEN_RSTD, args, True).fused
    fused = {"dispatch": {"choice": "fused", "fused_ms": 1.0, "unfused_ms": 2.0, "unfused": "cublas+inductor_scale"}}
    registry.save_entry("rmsnorm_matmul", "cpu", Entry(Shape(64, 32, 48), "float32", {"block_sizes": [16, 16, 16]}, fused))
    runtime.clear_cache()  # decisions are cached per process
    assert not runtime.decide(SPEC_GIVEN_RSTD, args).fused
    registry.save_entry("rmsnorm_matmul_given_rstd", "cpu",
                        Entry(Shape(64, 32, 48), "float32", {"block_sizes": [16, 16, 16]}, fused))
    runtime.clear_cache()
    assert runtime.decide(SPEC_GIVEN_RSTD, args).fused
    assert not runtime.decide(SPEC_GIVEN_RSTD, args, False).fused


INTERPRETER_CONFIGS = [
    helion.Config(block_sizes=[16, 16, 32], num_warps=4, num_stages=2),
    helion.Config(block_sizes=[32, 16, 16], num_warps=4, num_stages=1, indexing="pointer"),
]


@pytest.mark.triton_interpret
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])  # bf16 tl.dot is broken in the interpreter
@pytest.mark.parametrize("config", INTERPRETER_CONFIGS, ids=lambda c: "x".join(map(str, c.block_sizes)))
@pytest.mark.parametrize("shape", [Shape(33, 100, 72), Shape(1, 48, 40)], ids=str)
def test_triton_code_for_explicit_configs(shape, config, dtype):
    args = SPEC_GIVEN_RSTD.make_args(shape, dtype, "cpu", 5)
    bound = prenorm_matmul_given_stats_kernel.bind(args)
    bound.set_config(config)
    check_outputs(bound(*args), SPEC_GIVEN_RSTD.reference(*args), dtype)


@pytest.mark.cuda
@pytest.mark.filterwarnings("ignore::helion_kernels.registry.ConfigFallbackWarning")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("shape", ODD_SHAPES + [Shape(4096, 1024, 512)], ids=str)
def test_cuda_forward_and_gradients(shape, dtype, fused, device):
    _forward(shape, dtype, device, stable_seed(shape) + 2)
    _gradients(shape, dtype, device, stable_seed(shape) + 3, fused=fused)


@pytest.mark.cuda
@pytest.mark.filterwarnings("ignore::helion_kernels.registry.ConfigFallbackWarning")
def test_cuda_compiled_fullgraph(device):
    a, b, w = _inputs(Shape(256, 128, 64), torch.bfloat16, device, 9)

    def block(r, h):
        x = r + h
        return rmsnorm_matmul(x, b, w, rstd=torch.rsqrt(x.float().square().mean(-1) + EPS), fused=True)

    out = torch.compile(block, fullgraph=True)(a, a)
    check_outputs(out, rmsnorm_matmul_reference((2 * a).double(), b.double(), EPS, w.double())[0], torch.bfloat16)
