"""Deferred pre-norm ``rmsnorm(a) @ b``: reference mode, Triton interpreter and CUDA."""

from __future__ import annotations

import helion
import pytest
import torch

from helion_kernels import fold_rmsnorm_weight, rmsnorm_matmul
from helion_kernels.techniques.prenorm.kernels import (
    SPEC,
    prenorm_matmul_kernel,
    rmsnorm_matmul_reference,
)
from helion_kernels.spec import Shape
from helion_kernels.verify import check_outputs

from _seeds import stable_seed

# Every output element must be written: allocations start as NaN.
pytestmark = pytest.mark.usefixtures("poisoned_empty")

# M = 1, K and N not powers of two, M not a multiple of any tile, K = 1, N = 1.
ODD_SHAPES = [Shape(1, 64, 32), Shape(33, 100, 72), Shape(130, 256, 200), Shape(7, 1, 5), Shape(5, 48, 1)]


def _inputs(shape: Shape, dtype, device, seed: int, affine: bool):
    a, b, eps, _ = SPEC.make_args(shape, dtype, device, seed)
    gen = torch.Generator().manual_seed(seed + 7)
    weight = (1 + 0.5 * torch.randn(shape.K, generator=gen)).to(device=device, dtype=dtype) if affine else None
    return a, b, eps, weight


def _check(shape, dtype, device, seed, affine):
    a, b, eps, weight = _inputs(shape, dtype, device, seed, affine)
    c, rstd = rmsnorm_matmul(a, b, weight, eps, return_rstd=True)
    assert c.dtype == dtype and rstd.dtype == torch.float32
    ref_c, ref_rstd = rmsnorm_matmul_reference(a.double(), b.double(), eps, None if weight is None else weight.double())
    check_outputs((c, rstd), (ref_c, ref_rstd), dtype)


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("affine", [False, True], ids=["no_affine", "affine"])
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=str)
def test_reference_mode_matches_fp64(shape, dtype, affine, device):
    _check(shape, dtype, device, seed=stable_seed((shape, affine)), affine=affine)


@pytest.mark.ref_mode
def test_large_row_scale_is_normalised_away(device):
    """rmsnorm is scale-invariant: rows of magnitude 1e3 and 1e-3 give the same output."""
    a, b, eps, _ = _inputs(Shape(16, 96, 40), torch.float32, device, 3, False)
    scale = torch.logspace(-3, 3, 16, device=device)[:, None]
    c = rmsnorm_matmul(a, b, eps=0.0)
    c_scaled = rmsnorm_matmul(a * scale, b, eps=0.0)
    check_outputs(c_scaled, c, torch.float32)


@pytest.mark.ref_mode
def test_fold_weight_equals_affine_argument(device):
    a, b, eps, w = _inputs(Shape(9, 40, 24), torch.float32, device, 11, True)
    folded = fold_rmsnorm_weight(w, b)
    assert folded.shape == b.shape and folded.dtype == b.dtype
    check_outputs(rmsnorm_matmul(a, folded, eps=eps), rmsnorm_matmul(a, b, w, eps), torch.float32)


def test_reference_against_float64_formula():
    """The fp32 reference itself, against the textbook formula in float64."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(6, 10, generator=gen)
    b = torch.randn(10, 4, generator=gen)
    w = torch.randn(10, generator=gen)
    c, rstd = rmsnorm_matmul_reference(a, b, 1e-5, w)
    a64 = a.double()
    expect_rstd = 1 / torch.sqrt((a64**2).mean(1) + 1e-5)
    expect = (a64 * expect_rstd[:, None] * w.double()) @ b.double()
    assert c.dtype == torch.float32
    torch.testing.assert_close(c.double(), expect, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rstd.double(), expect_rstd, rtol=1e-6, atol=0)


# Explicit configs for the generated Triton code: several tiles per dimension, partial
# tiles in M, N and K, with and without L2 grouping. (Persistent program ids need the SM
# count of a GPU, so they are covered by the CUDA tests.)
# block_sizes = [tile_m, tile_k of the sum of squares, tile_n, tile_k of the GEMM].
INTERPRETER_CONFIGS = [
    helion.Config(block_sizes=[16, 32, 16, 32], num_warps=4, num_stages=2),
    helion.Config(block_sizes=[32, 64, 16, 16], num_warps=4, num_stages=1),
    helion.Config(block_sizes=[16, 16, 32, 64], num_warps=2, num_stages=2),
]


@pytest.mark.triton_interpret
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])  # bf16 tl.dot is broken in the interpreter
@pytest.mark.parametrize("config", INTERPRETER_CONFIGS, ids=lambda c: "x".join(map(str, c.block_sizes)))
@pytest.mark.parametrize("shape", [Shape(33, 100, 72), Shape(1, 48, 40), Shape(64, 64, 96)], ids=str)
def test_triton_code_for_explicit_configs(shape, config, dtype):
    args = SPEC.make_args(shape, dtype, "cpu", 5)
    bound = prenorm_matmul_kernel.bind(args)
    bound.set_config(config)
    c, rstd = bound(*args)
    check_outputs((c, rstd), SPEC.reference(*args), dtype)


@pytest.mark.triton_interpret
def test_triton_interpreter_through_ops_with_registry(registry_dir):
    from helion_kernels import registry
    from helion_kernels.registry import ConfigFallbackWarning, Entry

    shape = Shape(33, 100, 72)
    fused = {"dispatch": {"choice": "fused", "fused_ms": 1.0, "unfused_ms": 2.0, "unfused": "cublas+inductor_norm"}}
    registry.save_entry("rmsnorm_matmul", "cpu", Entry(shape, "float16", INTERPRETER_CONFIGS[0], fused))
    a, b, eps, w = _inputs(shape, torch.float16, "cpu", 21, True)
    c = rmsnorm_matmul(a, b, w, eps)  # exact entry: no warning (warnings are errors here)
    check_outputs(c, rmsnorm_matmul_reference(a, b, eps, w)[0], torch.float16)
    a2, b2, _, _ = _inputs(Shape(20, 100, 72), torch.float16, "cpu", 22, False)
    with pytest.warns(ConfigFallbackWarning, match="using the one tuned for 33x100x72"):
        c2 = rmsnorm_matmul(a2, b2)
    check_outputs(c2, rmsnorm_matmul_reference(a2, b2)[0], torch.float16)


@pytest.mark.cuda
@pytest.mark.filterwarnings("ignore::helion_kernels.registry.ConfigFallbackWarning")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("affine", [False, True], ids=["no_affine", "affine"])
@pytest.mark.parametrize("shape", ODD_SHAPES + [Shape(4096, 1024, 512)], ids=str)
def test_cuda_with_registry_configs(shape, dtype, affine, device):
    _check(shape, dtype, device, seed=stable_seed((shape, affine)) + 1, affine=affine)


@pytest.mark.triton_interpret
def test_triton_code_for_the_two_per_sm_pointer_seed():
    """The hand-picked 128x128 tiling for two programs per SM (pointer indexing, flat grid), at
    a shape with partial tiles in every dimension. Its persistent twin needs a GPU's SM count."""
    from helion_kernels.techniques.prenorm.kernels import SEED_ROW_BLOCK_POINTER_128x128_TWO_PER_SM, row_block_config

    config = row_block_config(SEED_ROW_BLOCK_POINTER_128x128_TWO_PER_SM)
    assert config in SPEC.seed_configs
    args = SPEC.make_args(Shape(150, 200, 136), torch.float16, "cpu", 9)
    bound = prenorm_matmul_kernel.bind(args)
    bound.set_config(config)
    check_outputs(bound(*args), SPEC.reference(*args), torch.float16)


@pytest.mark.cuda
@pytest.mark.parametrize("index", range(len(SPEC.seed_configs)))
def test_cuda_every_seed_config(index, device):
    """Each hand-picked tiling (the search's first population) is correct at an odd shape."""
    args = SPEC.make_args(Shape(1000, 384, 640), torch.bfloat16, device, stable_seed(index))
    bound = prenorm_matmul_kernel.bind(args)
    bound.set_config(SPEC.seed_configs[index])
    check_outputs(bound(*args), SPEC.reference(*args), torch.bfloat16)
