"""Split-N candidates 1 and 2 (measured, not shipped; ``bench/variants/split_n_candidates.py``):
``norm(a @ b)`` with the statistics combined across N tiles by a second kernel or after a
grid barrier.

Reference mode checks the math of every kernel (one tile per dimension there, so the
combination is trivial); the Triton interpreter runs the two-kernel candidate with several
N tiles per row, a partial last tile and M not a multiple of tile_m, which is where the
partial statistics and Chan's combination are really exercised. The persistent candidate
needs a grid-wide barrier, which the interpreter (programs run one after another) cannot
run: its generated code is checked on CPU and its results in reference mode and on CUDA.
"""

from __future__ import annotations

import helion
import pytest
import torch

import split_n_candidates as split_n  # bench/variants
from helion_kernels.bench_specs import bench_spec
from helion_kernels.spec import Shape
from helion_kernels.verify import check_outputs

from _postnorm_inputs import ln_reference_f64 as _ln_reference
from _postnorm_inputs import norm_inputs as _inputs
from _postnorm_inputs import rms_reference_f64 as _rms_reference

pytestmark = pytest.mark.usefixtures("poisoned_empty")

SHAPES = [Shape(1, 64, 96), Shape(33, 100, 96), Shape(45, 48, 200), Shape(7, 1, 5)]
LN_AFFINE = ["none", "weight", "weight_bias"]


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("affine", LN_AFFINE)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_reference_mode_both_candidates(shape, affine, dtype, device):
    a, b, w, bias, eps = _inputs(shape, dtype, device, 3, affine)
    ln_ref, rms_ref = _ln_reference(a, b, w, bias, eps), _rms_reference(a, b, w, eps)
    check_outputs(split_n.layernorm_two_kernels(a, b, w, bias, eps, None, None), ln_ref, dtype)
    check_outputs(split_n.matmul_layernorm_split_n_kernel(a, b, w, bias, eps), ln_ref, dtype)
    check_outputs(split_n.rmsnorm_two_kernels(a, b, w, eps, None, None), rms_ref, dtype)
    check_outputs(split_n.matmul_rmsnorm_split_n_kernel(a, b, w, eps), rms_ref, dtype)


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_large_row_mean_reference_mode(dtype, device):
    a, b, w, bias, eps = _inputs(Shape(33, 100, 96), dtype, device, 5, "weight_bias", large_mean=True)
    ref = _ln_reference(a, b, w, bias, eps)
    assert (ref[1] - 1000).abs().max() < 10  # the shift really happened
    check_outputs(split_n.matmul_layernorm_split_n_kernel(a, b, w, bias, eps), ref, dtype)
    check_outputs(split_n.layernorm_two_kernels(a, b, w, bias, eps, None, None), ref, dtype)


# Phase-1 tilings [tile_n, tile_m, tile_k]: 3-7 N tiles per row at N = 96 / 200, partial
# last tiles in N and M.
GEMM_CONFIGS = [
    helion.Config(block_sizes=[32, 16, 16], num_warps=4, num_stages=1),
    helion.Config(block_sizes=[64, 32, 32], num_warps=4, num_stages=2),
]


@pytest.mark.triton_interpret
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])  # bf16 tl.dot is broken in the interpreter
@pytest.mark.parametrize("config", GEMM_CONFIGS, ids=lambda c: "x".join(map(str, c.block_sizes)))
@pytest.mark.parametrize("shape", [Shape(33, 100, 96), Shape(45, 48, 200), Shape(1, 64, 96)], ids=str)
def test_two_kernels_with_several_n_tiles(shape, config, dtype):
    a, b, w, bias, eps = _inputs(shape, dtype, "cpu", 11, "weight_bias")
    y, mean, rstd = split_n.layernorm_two_kernels(a, b, w, bias, eps, config, split_n.APPLY_CONFIG)
    check_outputs((y, mean, rstd), _ln_reference(a, b, w, bias, eps), dtype)
    apply = helion.Config(block_sizes=[8, 32], num_warps=4, num_stages=1)
    check_outputs(split_n.rmsnorm_two_kernels(a, b, w, eps, config, apply), _rms_reference(a, b, w, eps), dtype)


@pytest.mark.triton_interpret
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_two_kernels_large_row_mean(dtype):
    """Mean ~1e3, spread ~1, four N tiles: the tiles are stored centred on their own means
    and combined with Chan's formula; storing the raw tile in fp16 would lose the spread."""
    a, b, w, bias, eps = _inputs(Shape(33, 100, 96), dtype, "cpu", 13, "weight_bias", large_mean=True)
    out = split_n.layernorm_two_kernels(a, b, w, bias, eps, GEMM_CONFIGS[0], split_n.APPLY_CONFIG)
    check_outputs(out, _ln_reference(a, b, w, bias, eps), dtype)


@pytest.mark.triton_interpret
def test_partials_are_per_tile_statistics():
    """The phase-1 partials of a 4-tile row: column counts 32, 32, 32, 4; each tile's mean
    and sum of squared deviations; and the stored tile is centred on that mean."""
    a, b, *_ = _inputs(Shape(9, 48, 100), torch.float32, "cpu", 17, "none")
    bound = split_n.matmul_layernorm_partials_kernel.bind((a, b))
    bound.set_config(GEMM_CONFIGS[0])
    centred, partials = bound(a, b)
    assert partials.shape == (9, 4, 3)
    full = (a.double() @ b.double()).view(9, 1, 100)
    for j, (lo, hi) in enumerate([(0, 32), (32, 64), (64, 96), (96, 100)]):
        tile = full[:, 0, lo:hi]
        assert torch.equal(partials[:, j, 0], torch.full((9,), float(hi - lo)))
        torch.testing.assert_close(partials[:, j, 1].double(), tile.mean(1), rtol=1e-4, atol=1e-4)
        dev = tile - tile.mean(1, keepdim=True)
        torch.testing.assert_close(partials[:, j, 2].double(), dev.pow(2).sum(1), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(centred[:, lo:hi].double(), dev, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("n", "num_tiles", "width"), [
    (100, 4, 32), (100, 2, 64), (100, 1, 128), (96, 3, 32), (4096, 16, 256), (5, 1, 8), (512, 4, 128),
])
def test_gemm_tile_width(n, num_tiles, width):
    assert split_n.gemm_tile_width(n, num_tiles) == width
    assert -(-n // width) == num_tiles


@pytest.mark.triton_interpret  # code generation only; reference mode has none
@pytest.mark.parametrize("spec", [split_n.SPEC_LAYERNORM, split_n.SPEC_RMSNORM], ids=lambda s: s.name)
def test_persistent_kernel_code_has_one_grid_barrier(spec):
    """Every seed and the default config generate a persistent kernel with the barrier, whose
    phase 2 reduces a row's partials in one block, not in a masked 4096-wide loop, also after
    Helion's autotuner has taken the seed in (it fills a missing ``reduction_loops`` with
    4096: what the first H200 tuning ran)."""
    from helion.autotuner.config_generation import ConfigGeneration  # Helion 1.5 internals

    args = spec.make_args(Shape(64, 96, 512), torch.float16, "cpu", None)
    bound = spec.kernel.bind(args)
    seeds = ConfigGeneration(bound.config_spec).user_seed_flat_config_pairs(
        [spec.default_config, *spec.seed_configs])
    assert len(seeds) == 1 + len(spec.seed_configs)
    for _, config in seeds:
        code = bound.to_triton_code(config)
        assert code.count("x_grid_barrier(") == 1, config
        assert "_NUM_SM" in code
        assert "_RDIM_SIZE" in code and "_REDUCTION_BLOCK" not in code, config


def test_specs_are_the_variants():
    assert split_n.SPEC_LAYERNORM.name == "matmul_layernorm_persistent"
    assert split_n.SPEC_RMSNORM.name == "matmul_rmsnorm_persistent"
    assert "technique 3" in bench_spec(split_n.SPEC_LAYERNORM.name).technique


def test_phase1_config_keeps_the_gemm_part_only():
    """The CUDA failure of the one-block seeds: a persistent config's ``reduction_loops`` in
    the partials kernel ("Too many values for config['reduction_loops'], expected 0")."""
    for spec in (split_n.SPEC_LAYERNORM, split_n.SPEC_RMSNORM):
        for seed in spec.seed_configs:
            cfg = split_n.phase1_config(seed.config)
            assert "reduction_loops" not in cfg.config and "pid_type" not in cfg.config
            assert cfg.block_sizes == seed.block_sizes[:3] and cfg.num_warps == seed.num_warps


def _with_stages(config: helion.Config, stages: int | None) -> helion.Config:
    return config if stages is None else helion.Config(**{**config.config, "num_stages": stages})


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [Shape(1000, 512, 4096), Shape(333, 256, 1000)], ids=str)
def test_cuda_both_candidates(shape, dtype):
    a, b, w, bias, eps = _inputs(shape, dtype, "cuda", 19, "weight_bias", large_mean=True)
    ref = _ln_reference(a, b, w, bias, eps)
    # A bf16 seed tiling; fp32 operands need half its stages to fit in shared memory.
    stages = 2 if dtype == torch.float32 else None
    gemm = _with_stages(split_n.SPEC_LAYERNORM.seed_configs[1], stages)
    gemm3 = split_n.phase1_config(gemm.config)
    check_outputs(split_n.layernorm_two_kernels(a, b, w, bias, eps, gemm3), ref, dtype)
    bound = split_n.matmul_layernorm_split_n_kernel.bind((a, b, w, bias, eps))
    bound.set_config(gemm)
    check_outputs(bound(a, b, w, bias, eps), ref, dtype)
    # RMSNorm: both candidates, with the seed tiling of the RMSNorm spec.
    ref = _rms_reference(a, b, w, eps)
    gemm = _with_stages(split_n.SPEC_RMSNORM.seed_configs[1], stages)
    gemm3 = split_n.phase1_config(gemm.config)
    check_outputs(split_n.rmsnorm_two_kernels(a, b, w, eps, gemm3, split_n.RMS_APPLY_CONFIG), ref, dtype)
    bound = split_n.matmul_rmsnorm_split_n_kernel.bind((a, b, w, eps))
    bound.set_config(gemm)
    check_outputs(bound(a, b, w, eps), ref, dtype)
