"""Split-N post-norm, the row sweep (what ``matmul_{layernorm,rmsnorm}_split_n`` run): one
program per row block walks its N tiles, then re-reads them.

Reference mode checks the math (one tile per dimension there); the Triton interpreter runs
explicit tilings with several N tiles per row, a partial last N tile and M not a multiple
of tile_m, which is where the running statistics (Chan's merge for LayerNorm) and the
store-then-reload of the row block are exercised.
"""

from __future__ import annotations

import helion
import pytest
import torch

from helion_kernels import runtime
from helion_kernels.bench_specs import bench_spec
from helion_kernels.techniques.postnorm.kernels import LAYERNORM, RMSNORM
from helion_kernels.techniques.split_n import kernels as row_sweep
from helion_kernels.spec import Shape
from helion_kernels.verify import check_outputs

from _postnorm_inputs import ln_reference_f64 as _ln_reference
from _postnorm_inputs import norm_inputs as _inputs
from _postnorm_inputs import rms_reference_f64 as _rms_reference
from _postnorm_inputs import save_decision

pytestmark = pytest.mark.usefixtures("poisoned_empty")

AFFINE = ["none", "weight", "weight_bias"]


class _OneNorm:
    """The shipped kernel with its norm fixed, called as the variant pairs are: LayerNorm
    (a, b, weight, bias, eps), RMSNorm (a, b, weight, eps)."""

    def __init__(self, layernorm: int):
        self.layernorm = layernorm
        self.name = f"matmul_{'layernorm' if layernorm else 'rmsnorm'}_row_sweep"

    def args(self, args: tuple) -> tuple:
        return (*args, self.layernorm) if self.layernorm else (*args[:3], None, args[3], self.layernorm)

    def __call__(self, *args):
        return row_sweep.matmul_norm_row_sweep_kernel(*self.args(args))

    def bind(self, args: tuple):
        bound, full = row_sweep.matmul_norm_row_sweep_kernel.bind(self.args(args)), self.args

        class Bound:
            def set_config(self, config):
                bound.set_config(config)

            def __call__(self, *args):
                return bound(*full(args))

            def to_triton_code(self, config):
                return bound.to_triton_code(config)
        return Bound()


# (LayerNorm kernel, RMSNorm kernel): the shipped kernel with the norm fixed.
PAIRS = [(_OneNorm(LAYERNORM), _OneNorm(RMSNORM))]
PAIR_IDS = ["shipped"]


def _run(kernel, args, config):
    bound = kernel.bind(args)
    bound.set_config(config)
    return bound(*args)


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("shape", [Shape(1, 64, 96), Shape(33, 100, 96), Shape(45, 48, 200), Shape(7, 1, 5)], ids=str)
def test_reference_mode(shape, affine, dtype, device):
    a, b, w, bias, eps = _inputs(shape, dtype, device, 3, affine)
    for ln_kernel, rms_kernel in PAIRS:
        check_outputs(ln_kernel(a, b, w, bias, eps), _ln_reference(a, b, w, bias, eps), dtype)
        check_outputs(rms_kernel(a, b, w, eps), _rms_reference(a, b, w, eps), dtype)


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_large_row_mean_reference_mode(dtype, device):
    a, b, w, bias, eps = _inputs(Shape(33, 100, 96), dtype, device, 5, "weight_bias", large_mean=True)
    ref = _ln_reference(a, b, w, bias, eps)
    assert (ref[1] - 1000).abs().max() < 10  # the shift really happened
    for ln_kernel, _ in PAIRS:
        check_outputs(ln_kernel(a, b, w, bias, eps), ref, dtype)


# [tile_n, tile_m, tile_k]: 3-7 N tiles per row at N = 96 / 200 (a partial last one at
# N = 200 and 100), partial last row blocks.
CONFIGS = [
    helion.Config(block_sizes=[32, 16, 16], num_warps=4, num_stages=1),
    helion.Config(block_sizes=[64, 32, 32], num_warps=4, num_stages=2),
]
INTERPRETER_SHAPES = [Shape(33, 100, 96), Shape(45, 48, 200), Shape(1, 64, 100)]


@pytest.mark.triton_interpret
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])  # bf16 tl.dot is broken in the interpreter
@pytest.mark.parametrize("affine", ["none", "weight_bias"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "x".join(map(str, c.block_sizes)))
@pytest.mark.parametrize("shape", INTERPRETER_SHAPES, ids=str)
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_several_n_tiles_per_row(pair, shape, config, affine, dtype):
    a, b, w, bias, eps = _inputs(shape, dtype, "cpu", 11, affine)
    check_outputs(_run(pair[0], (a, b, w, bias, eps), config), _ln_reference(a, b, w, bias, eps), dtype)
    check_outputs(_run(pair[1], (a, b, w, eps), config), _rms_reference(a, b, w, eps), dtype)


@pytest.mark.triton_interpret
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("ramp", [0.0, 30.0])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "x".join(map(str, c.block_sizes)))
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_large_row_mean_several_n_tiles(pair, config, ramp, dtype):
    """Mean ~1e3, 3-7 N tiles. Spread ~1: the tiles are stored centred on their own means
    (a raw fp16 tile would lose the spread; a sum/sum-of-squares variance would cancel in
    fp32). With a column ramp the tile means differ by ~30 and the between-tile term of
    Chan's merge is most of the variance, so a wrong merge fails."""
    a, b, w, bias, eps = _inputs(Shape(33, 100, 96), dtype, "cpu", 13, "weight_bias", large_mean=True, ramp=ramp)
    ref = _ln_reference(a, b, w, bias, eps)
    assert (ref[1] - 1000).abs().max() < 10
    check_outputs(_run(pair[0], (a, b, w, bias, eps), config), ref, dtype)


@pytest.mark.triton_interpret
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_huge_row_mean_stays_finite(pair):
    """fp32 rows with mean 2e19: the first tile's mean squared overflows fp32, and Chan's
    merge weights it by 0; the output must stay finite (NaN never passes). Precision is lost
    at that magnitude, so only finiteness is checked."""
    a, b, w, bias, eps = _inputs(Shape(9, 40, 96), torch.float32, "cpu", 41, "weight_bias")
    a[:, -1] = 1
    b[-1, :] = 2e19
    y, mean, rstd = _run(pair[0], (a, b, w, bias, eps), CONFIGS[0])
    assert torch.isfinite(y).all() and torch.isfinite(rstd).all()
    torch.testing.assert_close(mean.double(), (a.double() @ b.double()).mean(1), rtol=1e-5, atol=0)


@pytest.mark.ref_mode  # (the kernels' fp32 accumulators do not compile for float64 operands)
def test_float64_is_exact(device):
    """float64 operands (the public ops take bf16/fp16/fp32): nothing is rounded to a low
    precision, so both kernels must agree with the reference to 1e-6; a 0.5% error in a
    statistic (e.g. dividing by N + 1) passes the dtype tolerances but not this."""
    a, b, w, bias, eps = _inputs(Shape(33, 100, 200), torch.float64, device, 29, "weight_bias", ramp=3.0)
    for ln_kernel, rms_kernel in PAIRS:
        check_outputs(ln_kernel(a, b, w, bias, eps), _ln_reference(a, b, w, bias, eps), torch.float64)
        check_outputs(rms_kernel(a, b, w, eps), _rms_reference(a, b, w, eps), torch.float64)


@pytest.mark.triton_interpret  # code generation only; reference mode has none
@pytest.mark.parametrize("kernel", [k for pair in PAIRS for k in pair], ids=lambda k: k.name)
def test_reload_loop_follows_a_cta_barrier(kernel):
    """The second N loop loads what the first stored, from other threads of the program:
    Helion must put a CTA barrier between them, for the default and every seed config.
    (If a Helion upgrade dropped it the kernel would race, and only sometimes be wrong.)"""
    spec = row_sweep.SPEC_LAYERNORM if "layernorm" in kernel.name else row_sweep.SPEC_RMSNORM
    a, b, weight, bias, eps, _ = spec.make_args(Shape(64, 96, 512), torch.float16, "cpu", None)
    bound = kernel.bind((a, b, weight, bias, eps) if "layernorm" in kernel.name else (a, b, weight, eps))
    for config in (spec.default_config, *spec.seed_configs):
        code = bound.to_triton_code(config)
        body = code[code.index("@triton.jit"):]
        first_store = body.index("tl.store(y")
        barrier = body.index("tl.debug_barrier()")
        reload = body.index("tl.load(y")
        assert first_store < barrier < reload, config


def test_specs_registered():
    """One name per op: the public function, the registry file and ``--kernel``; the old
    row-sweep names still resolve, with a deprecation warning."""
    from helion_kernels.techniques import get_spec

    assert get_spec("matmul_layernorm_split_n") is row_sweep.SPEC_LAYERNORM
    assert get_spec("matmul_rmsnorm_split_n") is row_sweep.SPEC_RMSNORM
    assert row_sweep.SPEC_LAYERNORM.name == "matmul_layernorm_split_n"
    with pytest.warns(FutureWarning, match="'matmul_rmsnorm_row_sweep' is deprecated"):
        assert get_spec("matmul_rmsnorm_row_sweep") is row_sweep.SPEC_RMSNORM
    assert "technique 3" in bench_spec(row_sweep.SPEC_RMSNORM.name).technique


# Each seed tiling once, on shapes with several N tiles, a partial last tile and M = 1;
# fp32 operands get two stages so that they fit in shared memory.
CUDA_CASES = [
    (Shape(1000, 512, 4096), torch.bfloat16, 0),
    (Shape(333, 256, 1000), torch.bfloat16, 1),
    (Shape(1, 64, 520), torch.bfloat16, 2),
    (Shape(333, 256, 1000), torch.float32, 3),
    (Shape(1000, 512, 4096), torch.float32, 4),
    (Shape(777, 1024, 2000), torch.bfloat16, 5),
]


@pytest.mark.cuda
@pytest.mark.parametrize(("shape", "dtype", "seed"), CUDA_CASES, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_cuda_seed_configs(pair, shape, dtype, seed):
    """Rows with mean 1e3, spread 1 and a column ramp, both norms, affine on."""
    config = row_sweep.SPEC_LAYERNORM.seed_configs[seed]
    if dtype == torch.float32:
        config = helion.Config(**{**config.config, "num_stages": 2})
    a, b, w, bias, eps = _inputs(shape, dtype, "cuda", 19, "weight_bias", large_mean=True, ramp=3.0)
    check_outputs(_run(pair[0], (a, b, w, bias, eps), config), _ln_reference(a, b, w, bias, eps), dtype)
    check_outputs(_run(pair[1], (a, b, w, eps), config), _rms_reference(a, b, w, eps), dtype)


def test_cuda_cases_cover_every_seed():
    assert sorted(seed for *_, seed in CUDA_CASES) == list(range(len(row_sweep.SPEC_LAYERNORM.seed_configs)))


@pytest.mark.ref_mode  # CPU tensors: the public ops refuse them outside interpret modes
def test_public_split_n_functions_run_the_row_sweep(monkeypatch):
    """``matmul_{layernorm,rmsnorm}_split_n`` launch this module's specs (the fastest split-N
    version on the H200), after validating their inputs."""
    from helion_kernels import matmul_layernorm_split_n, matmul_rmsnorm_split_n

    launched = []
    monkeypatch.setattr(runtime, "launch", lambda spec, args: launched.append(spec.name) or spec.reference(*args))
    a, b, w, bias, eps = _inputs(Shape(5, 16, 24), torch.float32, "cpu", 31, "weight_bias")
    check_outputs(matmul_layernorm_split_n(a, b, w, bias, eps), _ln_reference(a, b, w, bias, eps)[0], torch.float32)
    check_outputs(matmul_rmsnorm_split_n(a, b, w, eps), _rms_reference(a, b, w, eps)[0], torch.float32)
    assert launched == ["matmul_layernorm_split_n", "matmul_rmsnorm_split_n"]
    with pytest.raises(ValueError, match="mismatched K"):
        matmul_rmsnorm_split_n(a, b[:3])
    assert len(launched) == 2


@pytest.mark.cuda
def test_cuda_public_functions_without_registry(registry_dir):
    """An empty registry: unfused by default (nothing measured the kernel faster), and with
    fused=True the kernel on the default config, with a warning; correct outputs both ways."""
    from helion_kernels import matmul_layernorm_split_n, matmul_rmsnorm_split_n
    from helion_kernels.registry import ConfigFallbackWarning

    for fused in (None, True):
        # Rows of mean ~1e3 only for the kernel: the unfused path rounds cuBLAS's bf16 output
        # (spacing 4 at 1e3) before its norm, as the PyTorch pair does, which no tolerance covers.
        a, b, w, bias, eps = _inputs(Shape(777, 320, 1536), torch.bfloat16, "cuda", 37, "weight_bias",
                                     large_mean=bool(fused))
        with pytest.warns(ConfigFallbackWarning, match="default config") if fused else _no_fallback_warning():
            y = matmul_layernorm_split_n(a, b, w, bias, eps, return_stats=True, fused=fused)
        check_outputs(y, _ln_reference(a, b, w, bias, eps), torch.bfloat16)
        with pytest.warns(ConfigFallbackWarning, match="default config") if fused else _no_fallback_warning():
            y = matmul_rmsnorm_split_n(a, b, w, eps, return_rstd=True, fused=fused)
        check_outputs(y, _rms_reference(a, b, w, eps), torch.bfloat16)


def _no_fallback_warning():
    import contextlib
    import warnings

    from helion_kernels.registry import ConfigFallbackWarning

    @contextlib.contextmanager
    def strict():
        with warnings.catch_warnings():
            warnings.simplefilter("error", ConfigFallbackWarning)
            yield
    return strict()


# --- dispatch: the kernel only where tuning measured it faster -----------------------------

SPECS = {"layernorm": row_sweep.SPEC_LAYERNORM, "rmsnorm": row_sweep.SPEC_RMSNORM}


def _kernel_args(norm: str, shape: Shape) -> tuple:
    a, b, w, bias, eps = _inputs(shape, torch.float32, "cpu", 41, "weight_bias")
    return (a, b, w, bias, eps, LAYERNORM) if norm == "layernorm" else (a, b, w, None, eps, RMSNORM)


@pytest.mark.parametrize("choice", ["fused", "unfused"])
@pytest.mark.parametrize("norm", list(SPECS))
def test_dispatch_follows_the_registry_at_any_n(norm, choice, decisions):
    from helion_kernels.registry import ConfigFallbackWarning

    spec = SPECS[norm]
    assert spec.dispatch_baseline == "cublas+inductor_norm" and spec.n_limit is None
    save_decision(spec, Shape(64, 32, 4096), choice)
    assert runtime.decide(spec, _kernel_args(norm, Shape(64, 32, 4096))).fused is (choice == "fused")
    with pytest.warns(ConfigFallbackWarning) if choice == "unfused" else _no_fallback_warning():
        assert runtime.decide(spec, _kernel_args(norm, Shape(48, 32, 3000))).fused is (choice == "fused")  # nearest
    assert runtime.decide(spec, _kernel_args(norm, Shape(64, 32, 4096)), True).fused  # forced, past any full-row limit
    assert not runtime.decide(spec, _kernel_args(norm, Shape(64, 32, 4096)), False).fused


@pytest.mark.parametrize("norm", list(SPECS))
def test_no_entry_means_unfused(norm, decisions):

    assert not runtime.decide(SPECS[norm], _kernel_args(norm, Shape(64, 32, 4096))).fused


@pytest.mark.triton_interpret
@pytest.mark.parametrize("choice", ["fused", "unfused"])
def test_the_ops_run_the_recorded_path(choice, decisions, monkeypatch):
    """End to end in the interpreter: the kernel launches only where the registry chose it,
    and both paths give the op (values and statistics) within fp32 tolerance."""
    from helion_kernels import matmul_layernorm_split_n, matmul_rmsnorm_split_n

    seen = []
    launch = runtime.launch
    monkeypatch.setattr(runtime, "launch", lambda spec, args: seen.append(spec.name) or launch(spec, args))
    shape = Shape(33, 48, 40)
    for spec in SPECS.values():
        save_decision(spec, shape, choice)
    a, b, w, bias, eps = _inputs(shape, torch.float32, "cpu", 43, "weight_bias")
    check_outputs(matmul_layernorm_split_n(a, b, w, bias, eps, return_stats=True), _ln_reference(a, b, w, bias, eps),
                  torch.float32)
    check_outputs(matmul_rmsnorm_split_n(a, b, w, eps, return_rstd=True), _rms_reference(a, b, w, eps), torch.float32)
    assert seen == (list(s.name for s in SPECS.values()) if choice == "fused" else [])


@pytest.mark.ref_mode
def test_fused_flag_is_checked(device):
    from helion_kernels import matmul_layernorm_split_n, matmul_rmsnorm_split_n

    a, b, w, bias, eps = _inputs(Shape(4, 8, 16), torch.float32, device, 29, "weight_bias")
    with pytest.raises(TypeError, match="matmul_layernorm_split_n: fused must be None, True or False"):
        matmul_layernorm_split_n(a, b, fused="yes")
    with pytest.raises(TypeError, match="matmul_rmsnorm_split_n: fused must be None, True or False"):
        matmul_rmsnorm_split_n(a, b, fused=1)


# --- the public functions --------------------------------------------------------------


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [Shape(1, 64, 96), Shape(33, 100, 200)], ids=str)
def test_public_functions_match_fp64(shape, dtype, device):
    from helion_kernels import matmul_layernorm_split_n, matmul_rmsnorm_split_n

    a, b, w, bias, eps = _inputs(shape, dtype, device, 23, "weight_bias", large_mean=True)
    y, mean, rstd = matmul_layernorm_split_n(a, b, w, bias, eps, return_stats=True)
    check_outputs((y, mean, rstd), _ln_reference(a, b, w, bias, eps), dtype)
    check_outputs(matmul_layernorm_split_n(a, b, w, bias, eps), _ln_reference(a, b, w, bias, eps)[0], dtype)
    check_outputs(matmul_rmsnorm_split_n(a, b, w, eps, return_rstd=True), _rms_reference(a, b, w, eps), dtype)


@pytest.mark.ref_mode
def test_public_functions_validate_and_handle_empty(device):
    from helion_kernels import matmul_layernorm_split_n, matmul_rmsnorm_split_n

    a, b, w, bias, eps = _inputs(Shape(4, 8, 16), torch.float32, device, 29, "weight_bias")
    with pytest.raises(ValueError, match="matmul_layernorm_split_n: mismatched K"):
        matmul_layernorm_split_n(a, b[:7], w, bias)
    with pytest.raises(ValueError, match=r"bias must have shape \[N\]"):
        matmul_layernorm_split_n(a, b, w, bias[:3])
    with pytest.raises(TypeError, match="matmul_rmsnorm_split_n: a has dtype torch.int32"):
        matmul_rmsnorm_split_n(a.int(), b.int())
    with pytest.raises(ValueError, match="eps must be a finite number"):
        matmul_rmsnorm_split_n(a, b, w, eps=-1.0)
    y, mean, rstd = matmul_layernorm_split_n(a[:0], b, return_stats=True)
    assert y.shape == (0, 16) and mean.shape == rstd.shape == (0,)
    y, rstd = matmul_rmsnorm_split_n(a, b[:, :0], return_rstd=True)
    assert y.shape == (4, 0) and rstd.isnan().all()
