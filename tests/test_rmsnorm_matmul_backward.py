"""The pre-norm dgrad kernel (the RMSNorm backward in the dgrad GEMM's epilogue): reference
mode, Triton interpreter and CUDA, against float64 references. (The full-row post-norm
kernels' optional inputs and ``product`` output: ``test_postnorm_full_row_addends.py``.)"""

from __future__ import annotations

import helion
import pytest
import torch

from helion_kernels.techniques.prenorm.kernels import (
    SPEC_BACKWARD as SPEC,
    rmsnorm_matmul_dgrad_kernel,
    rmsnorm_matmul_dgrad_reference,
)
from helion_kernels.spec import Shape
from helion_kernels.verify import check_outputs

pytestmark = pytest.mark.usefixtures("poisoned_empty")  # every output element must be written

# M = 1; K and N not powers of two; M not a multiple of any tile; more K tiles than one.
SHAPES = [Shape(1, 48, 24), Shape(37, 200, 130), Shape(64, 128, 64), Shape(130, 320, 72)]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _f64(args: tuple) -> tuple:
    return tuple(x.double() if isinstance(x, torch.Tensor) else x for x in args)


def _check_dgrad(shape: Shape, dtype, device, config=None):
    args = SPEC.make_args(shape, dtype, device, seed=shape.M + shape.K)
    if config is None:
        out = rmsnorm_matmul_dgrad_kernel(*args)
    else:
        bound = rmsnorm_matmul_dgrad_kernel.bind(args)
        bound.set_config(config)
        out = bound(*args)
    assert all(o.dtype == dtype and o.shape == (shape.M, shape.K) for o in out)
    check_outputs(out, rmsnorm_matmul_dgrad_reference(*_f64(args)), dtype)


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dgrad_reference_mode(shape, dtype, device):
    _check_dgrad(shape, dtype, device)


INTERPRETER_CONFIGS = [
    SPEC.default_config,
    helion.Config(block_sizes=[16, 32, 16, 64], num_warps=4, num_stages=1),  # K tiles differ between loops
    helion.Config(block_sizes=[32, 64, 32, 32], num_warps=4, num_stages=1, indexing="block_ptr"),
]


@pytest.mark.triton_interpret
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)  # bf16 tl.dot is broken there
@pytest.mark.parametrize("config", INTERPRETER_CONFIGS, ids=lambda c: "x".join(map(str, c.block_sizes)))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dgrad_triton_code(shape, config, dtype):
    _check_dgrad(shape, dtype, "cpu", config)


@pytest.mark.triton_interpret  # code generation only
def test_dgrad_fix_up_loop_waits_for_the_stores():
    """The second K loop re-reads what the first stored: a barrier must sit between them."""
    args = SPEC.make_args(Shape(256, 512, 256), torch.bfloat16, "cpu", None)
    code = rmsnorm_matmul_dgrad_kernel.bind(args).to_triton_code(SPEC.seed_configs[0])
    loops = code.split("for offset_")
    assert len(loops) >= 4  # K loop, its N loop, the fix-up K loop
    assert "tl.debug_barrier()" in loops[-2], code


def test_dgrad_reference_is_the_autograd_gradient():
    """The formula the kernel implements is d/da of (a * rstd(a)) @ b, in float64."""
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(6, 10, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(10, 7, generator=gen, dtype=torch.float64)
    dc = torch.randn(6, 7, generator=gen, dtype=torch.float64)
    rstd = torch.rsqrt(a.pow(2).mean(dim=1) + 1e-5)
    ((a * rstd[:, None]) @ b).backward(dc)
    da, x_hat = rmsnorm_matmul_dgrad_reference(a.detach(), b, dc, rstd.detach())
    torch.testing.assert_close(da, a.grad)
    torch.testing.assert_close(x_hat, a.detach() * rstd.detach()[:, None])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("config", [SPEC.default_config, *SPEC.seed_configs],
                         ids=lambda c: f"{'x'.join(map(str, c.block_sizes))}_{c.config.get('indexing')}")
@pytest.mark.parametrize("shape", SHAPES + [Shape(512, 1024, 768)], ids=str)
def test_dgrad_cuda(shape, config, dtype, device):
    _check_dgrad(shape, dtype, device, config)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", SHAPES + [Shape(512, 1024, 768)], ids=str)
def test_dgrad_cuda_fp32(shape, device):
    """fp32 with the default config (the bf16 seeds' tiles need more shared memory in fp32)."""
    _check_dgrad(shape, torch.float32, device, SPEC.default_config)
