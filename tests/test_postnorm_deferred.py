"""Deferred post-norm (split-N candidate 3): ``rms_norm(a @ b, w) @ c`` with the norm moved
past the second GEMM. Reference mode, the Triton interpreter (several N tiles per row), CUDA."""

from __future__ import annotations

import helion
import pytest
import torch

from helion_kernels import matmul_rmsnorm_matmul
from helion_kernels.kernels.postnorm_deferred import (
    SPEC,
    matmul_rmsnorm_matmul_reference,
    matmul_rmsnorm_partials_kernel,
    rmsnorm_scaled_matmul_kernel,
)
from helion_kernels.verify import check_outputs

pytestmark = pytest.mark.usefixtures("poisoned_empty")


def _operands(m, k, n, n2, dtype, device, seed, mean=0.0):
    """a, b, c, weight; ``mean`` shifts x = a @ b's rows away from 0 (a large mean against
    the spread, where the RMS is dominated by the mean)."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen)
    a[:, 0] = 1.0
    b = torch.randn(k, n, generator=gen) / k**0.5
    b[0] += mean
    c = torch.randn(n, n2, generator=gen) / n**0.5
    w = 1.0 + 0.2 * torch.randn(n, generator=gen)
    return tuple(t.to(device=device, dtype=dtype) for t in (a, b, c, w))


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize(("m", "k", "n", "n2"), [(1, 64, 96, 48), (37, 100, 200, 72), (64, 256, 512, 128)])
def test_matches_fp64(m, k, n, n2, affine, dtype, device):
    a, b, c, w = _operands(m, k, n, n2, dtype, device, seed=m + n)
    w = w if affine else None
    out = matmul_rmsnorm_matmul(a, b, c, w, eps=1e-5)
    assert out.shape == (m, n2) and out.dtype == dtype
    ref = matmul_rmsnorm_matmul_reference(a.double(), b.double(), c.double(),
                                          None if w is None else w.double(), 1e-5)
    check_outputs(out, ref, dtype)


@pytest.mark.ref_mode
def test_large_mean_rows(device):
    a, b, c, w = _operands(33, 64, 160, 40, torch.bfloat16, device, seed=5, mean=1e3)
    out = matmul_rmsnorm_matmul(a, b, c, w)
    ref = matmul_rmsnorm_matmul_reference(a.double(), b.double(), c.double(), w.double())
    check_outputs(out, ref, torch.bfloat16)


@pytest.mark.ref_mode
def test_bad_inputs_raise_before_launch(monkeypatch):
    from helion_kernels import runtime

    for name in ("launch", "launch_kernel"):
        monkeypatch.setattr(runtime, name, lambda *a: pytest.fail("launched on bad input"))
    a, b, c, w = _operands(8, 16, 24, 8, torch.float32, "cpu", 0)
    with pytest.raises(ValueError, match=r"c must be 2-D \[N, N2\] with N = 24"):
        matmul_rmsnorm_matmul(a, b, c[:20], w)
    with pytest.raises(TypeError, match="c must have the dtype"):
        matmul_rmsnorm_matmul(a, b, c.double(), w)
    with pytest.raises(ValueError, match="mismatched K"):
        matmul_rmsnorm_matmul(a, b[:15], c, w)
    with pytest.raises(ValueError, match=r"weight must have shape \[N\] = \(24,\)"):
        matmul_rmsnorm_matmul(a, b, c, w[:8])
    with pytest.raises(ValueError, match="N must be at least 1"):
        matmul_rmsnorm_matmul(a, b[:, :0], c[:0], None)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        matmul_rmsnorm_matmul(a, b, c, w, eps=-1.0)
    assert matmul_rmsnorm_matmul(a[:0], b, c, w).shape == (0, 8)


@pytest.mark.triton_interpret
@pytest.mark.parametrize("mean", [0.0, 1e3])
def test_generated_code_under_the_interpreter(mean):
    """N = 96 with tile_n = 32: three partials per row; M not a multiple of tile_m."""
    dtype = torch.float16  # bf16 tl.dot is broken in the interpreter
    a, b, c, w = _operands(37, 64, 96, 40, dtype, "cpu", 3, mean=mean)
    producer = matmul_rmsnorm_partials_kernel.bind((a, b))
    producer.set_config(helion.Config(block_sizes=[32, 16, 32], num_warps=4, num_stages=1))
    x, partials = producer(a, b)
    assert partials.shape == (37, 3)
    c_folded = (w.float()[:, None] * c.float()).to(dtype)
    consumer = rmsnorm_scaled_matmul_kernel.bind((x, c_folded, partials, 1e-5))
    consumer.set_config(helion.Config(block_sizes=[16, 16, 32], num_warps=4, num_stages=1))
    out = consumer(x, c_folded, partials, 1e-5)
    ref = matmul_rmsnorm_matmul_reference(a.double(), b.double(), c.double(), w.double())
    check_outputs(out, ref, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda(dtype, registry_dir):
    for shape, mean in (((4096, 512, 2048, 512), 0.0), ((1000, 256, 1536, 384), 1e3)):
        a, b, c, w = _operands(*shape, dtype, "cuda", 7, mean=mean)
        with pytest.warns(Warning):  # empty registry: default configs, with a warning
            out = matmul_rmsnorm_matmul(a, b, c, w)
        ref = matmul_rmsnorm_matmul_reference(a, b, c, w)
        check_outputs(out, ref, dtype)


@pytest.mark.ref_mode
def test_kernels_in_float64_are_exact(device):
    """The two kernels called directly on float64 inputs (the public op takes bf16/fp16/
    fp32): nothing is rounded to a low precision, only the kernels' fp32 accumulators, so
    they must agree with the reference to ~1e-5; a wrong scale of 0.5% (e.g. dividing by
    N + 1) passes the dtype tolerances above but not this."""
    a, b, c, w = _operands(19, 48, 80, 24, torch.float64, device, 11)
    x, partials = matmul_rmsnorm_partials_kernel(a, b)
    out = rmsnorm_scaled_matmul_kernel(x, w[:, None] * c, partials, 1e-5)
    ref = matmul_rmsnorm_matmul_reference(a, b, c, w, 1e-5)
    torch.testing.assert_close(out, ref, rtol=2e-4, atol=1e-5)
