"""Pre-norm formulations measured, not shipped (``bench/variants/pre_norm_variants.py``): the
epilogue-only scaling of a GEMM whose producer already wrote the rows' rstd, and the sum of
squares taken in the first N tile's k-loop only. Reference mode checks the math; the Triton
interpreter runs several N and k tiles per row, a partial last tile and M not a multiple of
tile_m (so the first-tile kernel's masked-off loads in the later N tiles must add nothing)."""

from __future__ import annotations

import helion
import pytest
import torch

import pre_norm_variants as variants  # bench/variants
from helion_kernels.techniques.prenorm.kernels import rmsnorm_matmul_reference
from helion_kernels.spec import Shape, random_gemm_operands
from helion_kernels.verify import check_outputs

pytestmark = pytest.mark.usefixtures("poisoned_empty")

SHAPES = [Shape(1, 64, 32), Shape(33, 100, 72), Shape(40, 48, 40)]
EPS = 1e-5
CONFIG = helion.Config(block_sizes=[16, 16, 16], num_warps=4, num_stages=1, indexing="pointer")


def _args(shape: Shape, dtype, device):
    a, b = random_gemm_operands(shape, dtype, device, shape.M + shape.N)
    return a, b, EPS


def _run(kernel, args, config):
    if config is None:
        return kernel(*args)
    bound = kernel.bind(args)
    bound.set_config(config)
    return bound(*args)


def _check_scale_only(shape, dtype, device, config):
    a, b, eps = _args(shape, dtype, device)
    ref = rmsnorm_matmul_reference(a.double(), b.double(), eps)
    rstd = variants.rstd_reference(a, eps)
    check_outputs(_run(variants.row_scale_kernel, (a, b, rstd), config), ref[0], dtype)


def _check_first_tile(shape, dtype, device, config):
    args = _args(shape, dtype, device)
    ref = rmsnorm_matmul_reference(*(x.double() if isinstance(x, torch.Tensor) else x for x in args))
    check_outputs(_run(variants.first_tile_kernel, args, config), ref, dtype)


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_reference_mode(shape, dtype, device):
    _check_scale_only(shape, dtype, device, None)
    _check_first_tile(shape, dtype, device, None)


@pytest.mark.triton_interpret
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_under_the_interpreter(shape):
    # fp32: the interpreter mishandles bf16 tl.dot.
    _check_scale_only(shape, torch.float32, "cpu", CONFIG)
    _check_first_tile(shape, torch.float32, "cpu", variants.first_tile_config(CONFIG))


@pytest.mark.triton_interpret
def test_first_tile_sums_squares_in_one_n_tile_only():
    """The sum's load is its own (not the MMA's) and is masked off past the first N tile."""
    args = _args(Shape(40, 48, 40), torch.float32, "cpu")
    bound = variants.first_tile_kernel.bind(args)
    code = bound.to_triton_code(variants.first_tile_config(CONFIG))
    loads = [line for line in code.splitlines() if "tl.load(a +" in line]
    assert len(loads) == 2, loads
    assert "== 0" in code and any("&" in line for line in loads), loads


def test_every_tiling_is_a_config_of_both_kernels():
    """Each tiling the script times builds a ``helion.Config`` for the plain GEMM and, through
    ``row_block_config``, for the row-block kernel, and Helion's search takes each as a seed
    (its encoding asserts on a key or list the kernel has not got)."""
    from helion.autotuner.config_generation import ConfigGeneration  # Helion 1.5 internals
    from helion.runtime.settings import RefMode

    from helion_kernels.techniques.gemm.kernels import matmul_kernel
    from helion_kernels.techniques.prenorm.kernels import rmsnorm_matmul_kernel, row_block_config
    from helion_kernels.tuning import fit_seed

    a, b, eps = _args(Shape(256, 256, 256), torch.bfloat16, "cpu")
    for kernel, args, build in ((matmul_kernel, (a, b), lambda t: helion.Config(**t)),
                                (variants.first_tile_kernel, (a, b, eps),
                                 lambda t: variants.first_tile_config(helion.Config(**t))),
                                (rmsnorm_matmul_kernel, (a, b, eps),
                                 lambda t: row_block_config(helion.Config(**t), variants.STATS_K))):
        config_spec = helion.kernel(kernel.fn, static_shapes=True, ref_mode=RefMode.OFF).bind(args).config_spec
        seeds = [fit_seed(config_spec, build(t)) for t in variants.TILINGS.values()]
        dropped: list[str] = []
        taken = ConfigGeneration(config_spec).user_seed_flat_config_pairs(seeds, dropped.append)
        assert not dropped and len(taken) == len(seeds), (kernel.fn.__name__, dropped)


def test_shapes_argument_is_checked():
    import argparse

    assert variants.shape_argument("65536x1024x512") == Shape(65536, 1024, 512)
    for bad in ("64x64", "axbxc", "0x8x8", "8x8x8x8"):
        with pytest.raises(argparse.ArgumentTypeError, match="MxKxN"):
            variants.shape_argument(bad)
    with pytest.raises(ValueError, match="draws"):
        variants.main("unused.csv", shapes=[Shape(64, 64, 64)], draws=0)
