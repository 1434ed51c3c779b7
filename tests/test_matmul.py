"""The plain Helion GEMM: reference mode, Triton interpreter and CUDA."""

from __future__ import annotations

import helion
import pytest
import torch

from helion_kernels import matmul
from helion_kernels.techniques.gemm.kernels import SPEC, matmul_kernel, matmul_reference
from helion_kernels.spec import Shape
from helion_kernels.verify import check_outputs

# Every output element must be written: allocations start as NaN.
pytestmark = pytest.mark.usefixtures("poisoned_empty")

SHAPES = [Shape(1, 64, 32), Shape(33, 100, 72), Shape(130, 256, 200), Shape(5, 1, 7)]


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_reference_mode_matches_fp64(shape, dtype, device):
    a, b = SPEC.make_args(shape, dtype, device, shape.K)
    c = matmul(a, b)
    assert c.shape == (shape.M, shape.N) and c.dtype == dtype
    check_outputs(c, matmul_reference(a.double(), b.double()), dtype)


@pytest.mark.triton_interpret
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])  # bf16 tl.dot is broken in the interpreter
@pytest.mark.parametrize("block_sizes", [[16, 32, 16], [32, 16, 64]], ids=str)
def test_triton_code_for_explicit_configs(block_sizes, dtype):
    args = SPEC.make_args(Shape(33, 100, 72), dtype, "cpu", 1)
    bound = matmul_kernel.bind(args)
    bound.set_config(helion.Config(block_sizes=block_sizes, num_warps=4, num_stages=2))
    check_outputs(bound(*args), SPEC.reference(*args), dtype)


@pytest.mark.cuda
@pytest.mark.filterwarnings("ignore::helion_kernels.registry.ConfigFallbackWarning")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", SHAPES + [Shape(4096, 1024, 512)], ids=str)
def test_cuda_with_registry_configs(shape, dtype, device):
    a, b = SPEC.make_args(shape, dtype, device, 2)
    check_outputs(matmul(a, b), matmul_reference(a, b), dtype)


@pytest.mark.ref_mode
def test_reference_mode_fills_the_cpu_gap_exactly():
    """torch's CPU build has no ``mm``/``bmm`` with ``out_dtype`` (Helion's reference mode uses
    them for every dot). The library registers CPU kernels for exactly those overloads when
    they are missing (no test patch): the same numbers as upcasting, nothing else replaced."""
    from helion_kernels.techniques import cpu_reference_mode

    cpu_reference_mode.install()
    gen = torch.Generator().manual_seed(3)
    a, b = (torch.randn(5, 7, generator=gen).bfloat16(), torch.randn(7, 3, generator=gen).bfloat16())
    assert torch.equal(torch.mm(a, b, out_dtype=torch.float32), a.float() @ b.float())
    assert torch.equal(torch.bmm(a[None], b[None], out_dtype=torch.float32)[0], a.float() @ b.float())
    assert torch.mm(a, b).dtype == torch.bfloat16  # the plain overload is torch's own
    check_outputs(matmul(a, b), matmul_reference(a, b), torch.bfloat16)
