"""Full-row post-norm ``norm(a @ b)``: reference mode, Triton interpreter and CUDA.

The Helion kernels are called directly (``kernel(*args)`` in reference mode, a bound kernel
with an explicit config otherwise), always against float64 references.
"""

from __future__ import annotations

import warnings

import helion
import pytest
import torch
import torch.nn.functional as F

from helion_kernels.techniques.postnorm import kernels as postnorm_full_row
from helion_kernels import limits
from helion_kernels.limits import check_full_row_n, max_full_row_n
from helion_kernels.bench_specs import bench_spec
from helion_kernels.techniques.postnorm.kernels import (
    LAYERNORM,
    RMSNORM,
    SPEC_LAYERNORM,
    SPEC_RMSNORM,
    matmul_norm_kernel,
    matmul_norm_reference,
)
from helion_kernels.spec import Shape

from _postnorm_inputs import matmul_layernorm_reference, matmul_rmsnorm_reference
from helion_kernels.verify import check_outputs

from _seeds import stable_seed

# Every output element must be written: allocations start as NaN.
pytestmark = pytest.mark.usefixtures("poisoned_empty")

# M = 1; N not a power of two (96, 200, 500); K not a power of two; M not a multiple of any
# tile; K = 1; N = 1.
ODD_SHAPES = [
    Shape(1, 64, 32), Shape(33, 100, 96), Shape(130, 72, 200), Shape(17, 48, 500),
    Shape(7, 1, 5), Shape(5, 48, 1),
]

# Which affine parameters a call passes.
LN_AFFINE = ["none", "weight", "bias", "weight_bias"]
RMS_AFFINE = ["none", "weight"]


def _ln_inputs(shape: Shape, dtype, device, seed: int, affine: str):
    """(a, b, weight, bias, eps, LAYERNORM) in the kernel's argument order; weight/bias per ``affine``."""
    a, b, _, _, eps, _ = SPEC_LAYERNORM.make_args(shape, dtype, device, seed)
    gen = torch.Generator().manual_seed(seed + 7)
    weight = (1 + 0.5 * torch.randn(shape.N, generator=gen)).to(device=device, dtype=dtype)
    bias = (0.5 * torch.randn(shape.N, generator=gen)).to(device=device, dtype=dtype)
    return (a, b, weight if "weight" in affine else None, bias if "bias" in affine else None, eps, LAYERNORM)


def _rms_inputs(shape: Shape, dtype, device, seed: int, affine: str):
    """(a, b, weight, None, eps, RMSNORM) in the kernel's argument order; weight per ``affine``."""
    a, b, _, _, eps, _ = SPEC_RMSNORM.make_args(shape, dtype, device, seed)
    gen = torch.Generator().manual_seed(seed + 7)
    weight = (1 + 0.5 * torch.randn(shape.N, generator=gen)).to(device=device, dtype=dtype)
    return (a, b, weight if affine == "weight" else None, None, eps, RMSNORM)


def _float64(args: tuple) -> tuple:
    return tuple(x.double() if isinstance(x, torch.Tensor) else x for x in args)


def _large_mean(args: tuple) -> tuple:
    """The same arguments with every output row shifted by 1000: ``a[:, -1] = 1`` and
    ``b[-1, :] = 1000``, so ``a @ b`` has row means ~1e3 and row spreads ~1."""
    a, b = args[0].clone(), args[1].clone()
    a[:, -1] = 1
    b[-1, :] = 1000
    return (a, b, *args[2:])


def _run(kernel, args: tuple, config: helion.Config | None):
    """Reference mode (``config=None``): a plain call; otherwise the generated Triton code
    for ``config``."""
    if config is None:
        return kernel(*args)
    bound = kernel.bind(args)
    bound.set_config(config)
    return bound(*args)


def _check_layernorm(args, dtype, config=None):
    out = _run(matmul_norm_kernel, args, config)
    c, mean, rstd = out
    assert c.dtype == dtype and mean.dtype == torch.float32 and rstd.dtype == torch.float32
    check_outputs(out, matmul_norm_reference(*_float64(args)), dtype)


def _check_rmsnorm(args, dtype, config=None):
    out = _run(matmul_norm_kernel, args, config)
    c, rstd = out
    assert c.dtype == dtype and rstd.dtype == torch.float32
    check_outputs(out, matmul_norm_reference(*_float64(args)), dtype)


# --- reference mode ----------------------------------------------------------------------

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", LN_AFFINE)
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=str)
def test_layernorm_reference_mode_matches_fp64(shape, dtype, affine, device):
    seed = stable_seed((shape, affine))
    _check_layernorm(_ln_inputs(shape, dtype, device, seed, affine), dtype)


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", RMS_AFFINE)
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=str)
def test_rmsnorm_reference_mode_matches_fp64(shape, dtype, affine, device):
    seed = stable_seed((shape, affine))
    _check_rmsnorm(_rms_inputs(shape, dtype, device, seed, affine), dtype)


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [Shape(33, 100, 96), Shape(1, 64, 200)], ids=str)
def test_large_row_mean_reference_mode(shape, dtype, device):
    """Row mean ~1e3 against a spread ~1: a one-pass E[x^2] - E[x]^2 variance in fp32
    loses all digits here; the two-pass variance does not."""
    ln_args = _large_mean(_ln_inputs(shape, dtype, device, 31, "weight_bias"))
    _check_layernorm(ln_args, dtype)
    mean = matmul_norm_kernel(*ln_args)[1]
    assert (mean - 1000).abs().max() < 10  # the shift really happened
    _check_rmsnorm(_large_mean(_rms_inputs(shape, dtype, device, 32, "weight")), dtype)


@pytest.mark.ref_mode
@pytest.mark.parametrize("spec", [SPEC_LAYERNORM, SPEC_RMSNORM], ids=lambda s: s.name)
def test_spec_make_args_and_reference(spec, device):
    """The tuning/benchmark arguments: affine, in the kernel's order, reproducible."""
    shape = Shape(20, 40, 96)
    args = spec.make_args(shape, torch.float16, device, 4)
    again = spec.make_args(shape, torch.float16, device, 4)
    assert len(args) == 6 and args[4] == 1e-5 and args[5] == (LAYERNORM if spec is SPEC_LAYERNORM else RMSNORM)
    for x, y in zip(args[:4], again[:4]):
        assert (x is None and y is None) or torch.equal(x, y)
    weight = args[2]
    assert weight.shape == (96,) and 0.5 < weight.float().mean().item() < 1.5
    assert weight.float().std().item() > 0.01  # really affine, not ones
    if spec is SPEC_LAYERNORM:
        assert args[3].shape == (96,) and args[3].float().abs().max().item() > 0.01
    else:
        assert args[3] is None
    assert spec.key_of(args) == shape
    check_outputs(spec.kernel(*args), spec.reference(*args), torch.float16)
    empty = spec.make_args(shape, torch.float16, device, None)
    assert [None if x is None else tuple(x.shape) for x in empty[:4]] == [
        None if x is None else tuple(x.shape) for x in args[:4]]


# --- pure PyTorch, every mode but the interpreter ----------------------------------------


def test_references_against_torch_functional():
    """The fp32 references against F.layer_norm / F.rms_norm in float64."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(6, 10, generator=gen)
    b = torch.randn(10, 12, generator=gen)
    w = torch.randn(12, generator=gen)
    bias = torch.randn(12, generator=gen)
    c64 = a.double() @ b.double()
    y, mean, rstd = matmul_layernorm_reference(a, b, w, bias, 1e-5)
    assert y.dtype == mean.dtype == rstd.dtype == torch.float32
    torch.testing.assert_close(y.double(), F.layer_norm(c64, (12,), w.double(), bias.double(), 1e-5),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean.double(), c64.mean(1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rstd.double(), 1 / torch.sqrt(c64.var(1, unbiased=False) + 1e-5),
                               rtol=1e-5, atol=0)
    y, rstd = matmul_rmsnorm_reference(a, b, w, 1e-5)
    assert y.dtype == rstd.dtype == torch.float32
    torch.testing.assert_close(y.double(), F.rms_norm(c64, (12,), w.double(), 1e-5),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rstd.double(), 1 / torch.sqrt(c64.pow(2).mean(1) + 1e-5),
                               rtol=1e-5, atol=0)
    y64 = matmul_rmsnorm_reference(a.double(), b.double())[0]
    assert y64.dtype == torch.float64


@pytest.mark.parametrize(("dtype", "expected"),
                         [(torch.bfloat16, 2048), (torch.float16, 2048), (torch.float32, 1024)])
def test_max_full_row_n_documented_default(dtype, expected):
    """H100/H200 opt-in shared memory (232448 bytes), the CPU default."""
    assert max_full_row_n(dtype, "cpu") == expected


@pytest.mark.parametrize(("smem", "dtype", "expected"), [
    (166912, torch.bfloat16, 1024),  # A100 opt-in: 512 + 96 * 2048 > 166912
    (101376, torch.float32, 512),    # sm_86/89 opt-in: 1024 + 128 * 1024 > 101376
    (512 + 96 * 4096, torch.bfloat16, 4096),  # exactly at a boundary
    (512 + 96 * 4096 - 1, torch.bfloat16, 2048),
])
def test_max_full_row_n_arithmetic(smem, dtype, expected, monkeypatch):
    monkeypatch.setattr(limits, "DEFAULT_SHARED_MEMORY_PER_BLOCK", smem)
    assert max_full_row_n(dtype, "cpu") == expected


@pytest.mark.parametrize("dtype", DTYPES)
def test_check_full_row_n(dtype, device):
    limit = max_full_row_n(dtype, device)
    assert limit & (limit - 1) == 0
    for n in (1, 96, limit // 2 + 1, limit):
        check_full_row_n(n, dtype, device)  # at the limit passes
    for n in (limit + 1, 2 * limit):
        with pytest.raises(ValueError, match="split-N") as err:
            check_full_row_n(n, dtype, device)
        assert f"N = {n}" in str(err.value) and str(limit) in str(err.value)
        assert "technique 3" in str(err.value)


def _smem_estimate(config, n, item):
    """The estimate fit_shared_memory works with (see its docstring)."""
    _, tile_m, tile_k = config.block_sizes
    npad = 1 << (n - 1).bit_length()
    return config.num_stages * (tile_m * tile_k + tile_k * npad) * item + tile_m * npad * 4


@pytest.mark.parametrize(("n", "dtype"), [(1000, torch.bfloat16), (2048, torch.bfloat16), (1024, torch.float32),
                                          (513, torch.float16)])
def test_fit_shared_memory_shrinks_a_config_from_a_smaller_n(n, dtype, monkeypatch):
    """The H200 failure: a 64 x 64, 3-stage tiling tuned at N = 256 asked for 417792 bytes at
    N = 1000. Fitted, it is within 232448 bytes; stages go first; the N tile is kept."""
    from helion_kernels.techniques.postnorm.kernels import fit_shared_memory

    monkeypatch.setattr(postnorm_full_row, "shared_memory_per_block", lambda device: 232448)

    tuned = helion.Config(block_sizes=[512, 64, 64], num_warps=4, num_stages=3, indexing="pointer")
    a, b = torch.empty(8, 32, dtype=dtype), torch.empty(32, n, dtype=dtype)
    fitted = fit_shared_memory(tuned, (a, b))
    item = a.element_size()
    assert _smem_estimate(tuned, n, item) > 232448 >= _smem_estimate(fitted, n, item)
    assert fitted.num_stages == 1 and fitted.block_sizes[0] == 512
    assert fitted.config["indexing"] == "pointer" and fitted.num_warps == 4


def test_fit_shared_memory_keeps_a_config_that_fits(monkeypatch):
    from helion_kernels.techniques.postnorm.kernels import fit_shared_memory

    monkeypatch.setattr(postnorm_full_row, "shared_memory_per_block", lambda device: 232448)

    tuned = helion.Config(block_sizes=[16, 64, 64], num_warps=4, num_stages=3)
    args = (torch.empty(8, 32, dtype=torch.bfloat16), torch.empty(32, 256, dtype=torch.bfloat16))
    assert fit_shared_memory(tuned, args) is tuned


@pytest.mark.triton_interpret  # binds a config (no launch); reference mode has no configs
def test_fit_applies_to_fallback_configs_only(registry_dir):
    """The runtime applies fit_config to the nearest shape's config, never to an exact entry."""
    import dataclasses

    from helion_kernels import registry, runtime

    seen = []
    spec = dataclasses.replace(SPEC_LAYERNORM, fit_config=lambda cfg, args: seen.append(args[1].shape[1]) or cfg)
    tuned = helion.Config(block_sizes=[16, 64, 64], num_warps=4, num_stages=3)
    registry.save_entry(spec.name, "cpu", registry.Entry(Shape(64, 32, 512), "float32", tuned, {}))
    for n in (512, 1000):
        args = spec.make_args(Shape(64, 32, n), torch.float32, "cpu", 0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", registry.ConfigFallbackWarning)
            runtime.resolved_config(spec, args)
    assert seen == [1000]


def test_smaller_config_steps_stages_then_tile_k_then_tile_m():
    from helion_kernels.techniques.postnorm.kernels import smaller_config

    config = helion.Config(block_sizes=[16, 32, 32], num_warps=8, num_stages=2, indexing="tensor_descriptor",
                           pid_type="persistent_interleaved")
    steps = []
    while config is not None:
        steps.append((config.num_stages, *config.block_sizes))
        assert config.num_warps == 8 and config.config["pid_type"] == "persistent_interleaved"
        config = smaller_config(config)
    assert steps == [(2, 16, 32, 32), (1, 16, 32, 32), (1, 16, 32, 16), (1, 16, 16, 16)]


class _FakeRun:
    """A bound kernel whose launch the GPU refuses (OutOfResources) above ``max_stages``."""

    def __init__(self, config, max_stages: int, launches: list):
        self.config, self.max_stages, self.launches = config, max_stages, launches

    def __call__(self, *args):
        from triton.runtime.errors import OutOfResources

        self.launches.append(self.config.num_stages)
        if self.config.num_stages > self.max_stages:
            raise OutOfResources(245784, 232448, "shared memory")
        return "ran"


@pytest.mark.triton_interpret  # the runtime binds configs in this mode; the launch is faked
@pytest.mark.parametrize(("max_stages", "expect"), [(3, [3, 3]), (1, [3, 2, 1, 1]), (0, None)])
def test_a_launch_refused_for_shared_memory_runs_a_smaller_config(max_stages, expect, registry_dir, monkeypatch):
    """The H200 failure: the tuned 128 x 64, 3-stage config at 262144x64x256 launched without
    ``product``, but with it asked for 245784 bytes of 232448. The first launch steps down
    (smaller_config), warns once, and the config that ran is kept; nothing smaller: the error."""
    import dataclasses

    from helion_kernels import registry, runtime

    launches = []
    monkeypatch.setattr(runtime, "_compiled", lambda spec, args, resolved: _FakeRun(resolved.config, max_stages,
                                                                                    launches))
    # one step to nothing below 1 stage, so the no-smaller case stays short
    spec = dataclasses.replace(SPEC_LAYERNORM, smaller_config=lambda c: None if c.num_stages == 1 else
                               helion.Config(**{**c.config, "num_stages": c.num_stages - 1}))
    tuned = helion.Config(block_sizes=[16, 64, 64], num_warps=8, num_stages=3)
    registry.save_entry(spec.name, "cpu", registry.Entry(Shape(64, 32, 256), "float32", tuned, {}))
    args = spec.make_args(Shape(64, 32, 256), torch.float32, "cpu", 0)
    if expect is None:
        from triton.runtime.errors import OutOfResources

        with pytest.raises(OutOfResources), pytest.warns(registry.ConfigFallbackWarning):
            runtime.launch(spec, args)
        return
    if max_stages < 3:
        with pytest.warns(registry.ConfigFallbackWarning, match="more shared memory than the GPU has"):
            assert runtime.launch(spec, args) == "ran"
    else:
        assert runtime.launch(spec, args) == "ran"
    assert runtime.launch(spec, args) == "ran"  # the second launch: the kept config, no warning
    assert launches == expect
    assert runtime.resolved_config(spec, args).config.num_stages == min(3, max_stages)
    # another M with the same tuned config starts from the config that launched: no retry, no warning
    registry.save_entry(spec.name, "cpu", registry.Entry(Shape(96, 32, 256), "float32", tuned, {}))
    launches.clear()
    assert runtime.launch(spec, spec.make_args(Shape(96, 32, 256), torch.float32, "cpu", 0)) == "ran"
    assert launches == [min(3, max_stages)]


@pytest.mark.triton_interpret  # the runtime binds configs in this mode; the launch is faked
def test_a_launch_refused_for_another_resource_is_not_retried(registry_dir, monkeypatch):
    from triton.runtime.errors import OutOfResources

    from helion_kernels import registry, runtime

    launches = []

    def refused(*args):
        launches.append(1)
        raise OutOfResources(300, 255, "registers")

    monkeypatch.setattr(runtime, "_compiled", lambda spec, args, resolved: refused)
    registry.save_entry(SPEC_LAYERNORM.name, "cpu", registry.Entry(
        Shape(64, 32, 256), "float32", helion.Config(block_sizes=[16, 64, 64], num_warps=8, num_stages=3), {}))
    with pytest.raises(OutOfResources, match="registers"):
        runtime.launch(SPEC_LAYERNORM, SPEC_LAYERNORM.make_args(Shape(64, 32, 256), torch.float32, "cpu", 0))
    assert launches == [1]


def test_specs_are_consistent():
    for spec in (SPEC_LAYERNORM, SPEC_RMSNORM):
        bench = bench_spec(spec.name)
        assert spec.kernel is matmul_norm_kernel
        assert bench.norm_baseline == "inductor_norm"
        assert bench.unfused_baselines == ("cublas+inductor_norm", "cublas+liger_norm")
        assert bench.gemm_twin == "matmul" and "technique 1" in bench.technique
        assert bench.flops(Shape(2, 3, 4)) == 2 * 2 * 3 * 4
        for cfg in (spec.default_config, *spec.seed_configs):
            assert len(cfg.block_sizes) == 3  # [N tile (fixed to Npad), tile_m, tile_k]
    assert SPEC_LAYERNORM.name == "matmul_layernorm" and SPEC_RMSNORM.name == "matmul_rmsnorm"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit, on importing torch._dynamo
@pytest.mark.parametrize("spec", [SPEC_LAYERNORM, SPEC_RMSNORM], ids=lambda s: s.name)
def test_baselines_compute_the_same_op(spec, device, monkeypatch):
    """Every baseline is the unfused op on the same arguments (torch.compile replaced by
    eager here: compiling with inductor on CPU takes half a minute)."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    args = spec.make_args(Shape(8, 16, 24), torch.float32, device, 0)
    bench = bench_spec(spec.name)
    baselines = bench.baselines(*args)
    assert {"cublas_mm", "inductor_norm", "cublas+inductor_norm"} <= set(baselines)
    assert bench.norm_baseline in baselines and bench.unfused_baselines[0] in baselines
    torch.testing.assert_close(baselines["cublas_mm"](), args[0] @ args[1])
    expect = spec.reference(*args)[0]
    for name, run in baselines.items():
        if name != "cublas_mm":
            torch.testing.assert_close(run(), expect, rtol=1e-4, atol=1e-4, msg=name)


# --- generated code: N tile pinned to a whole row ----------------------------------------


@pytest.mark.triton_interpret  # code generation only; reference mode has none
@pytest.mark.cuda
@pytest.mark.parametrize("n", [64, 96, 128, 200, 500, 512])
def test_every_config_gets_a_whole_row_tile(n):
    """No config can split a row: the N tile is raised to next_power_of_2(N) in the code."""
    args = SPEC_LAYERNORM.make_args(Shape(64, 64, n), torch.float16, "cpu", None)
    bound = matmul_norm_kernel.bind(args)
    npad = helion.next_power_of_2(n)
    for cfg in (SPEC_LAYERNORM.default_config, *SPEC_LAYERNORM.seed_configs,
                helion.Config(block_sizes=[16, 32, 32], num_warps=4, num_stages=2)):
        code = bound.to_triton_code(cfg)
        assert f"_BLOCK_SIZE_0 = tl.constexpr({npad})" in code, code


# --- Triton interpreter ------------------------------------------------------------------

# Explicit configs for the generated Triton code: partial tiles in M and K, one or several
# M and K tiles, pointer and tensor-descriptor indexing, with and without L2 grouping.
# block_sizes = [N tile (fixed to Npad whatever is written), tile_m, tile_k].
INTERPRETER_CONFIGS = [
    SPEC_LAYERNORM.default_config,
    helion.Config(block_sizes=[16, 32, 32], num_warps=4, num_stages=2),
    helion.Config(block_sizes=[16, 16, 64], num_warps=4, num_stages=2, indexing="tensor_descriptor"),
    helion.Config(block_sizes=[16, 32, 16], num_warps=4, num_stages=1, l2_groupings=[4]),
]
INTERPRETER_SHAPES = [Shape(33, 100, 96), Shape(1, 48, 200), Shape(20, 40, 64)]


def _cfg_id(config: helion.Config) -> str:
    return "x".join(map(str, config.block_sizes)) + "-" + str(config.config.get("indexing", "default"))


@pytest.mark.triton_interpret
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])  # bf16 tl.dot is broken in the interpreter
@pytest.mark.parametrize("config", INTERPRETER_CONFIGS, ids=_cfg_id)
@pytest.mark.parametrize("shape", INTERPRETER_SHAPES, ids=str)
def test_layernorm_triton_code_for_explicit_configs(shape, config, dtype):
    _check_layernorm(_ln_inputs(shape, dtype, "cpu", 5, "weight_bias"), dtype, config)


@pytest.mark.triton_interpret
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("config", INTERPRETER_CONFIGS, ids=_cfg_id)
@pytest.mark.parametrize("shape", INTERPRETER_SHAPES, ids=str)
def test_rmsnorm_triton_code_for_explicit_configs(shape, config, dtype):
    _check_rmsnorm(_rms_inputs(shape, dtype, "cpu", 6, "weight"), dtype, config)


@pytest.mark.triton_interpret
@pytest.mark.parametrize("affine", ["none", "weight", "bias"])
def test_layernorm_triton_code_affine_variants(affine):
    _check_layernorm(_ln_inputs(Shape(20, 40, 96), torch.float16, "cpu", 8, affine),
                     torch.float16, INTERPRETER_CONFIGS[1])


@pytest.mark.triton_interpret
def test_rmsnorm_triton_code_without_weight():
    _check_rmsnorm(_rms_inputs(Shape(20, 40, 96), torch.float16, "cpu", 9, "none"),
                   torch.float16, INTERPRETER_CONFIGS[1])


@pytest.mark.triton_interpret
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [Shape(33, 100, 96), Shape(20, 40, 500)], ids=str)
def test_large_row_mean_triton_code(shape, dtype):
    """Row mean ~1e3: the padded columns (N not a power of two) must stay out of the
    variance, and the variance must be two-pass."""
    config = INTERPRETER_CONFIGS[1]
    _check_layernorm(_large_mean(_ln_inputs(shape, dtype, "cpu", 33, "weight_bias")), dtype, config)
    _check_rmsnorm(_large_mean(_rms_inputs(shape, dtype, "cpu", 34, "weight")), dtype, config)


# --- CUDA --------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ODD_SHAPES + [Shape(256, 512, 1024)], ids=str)
def test_cuda_default_config(shape, dtype, device):
    seed = stable_seed(shape)
    config = SPEC_LAYERNORM.default_config
    _check_layernorm(_ln_inputs(shape, dtype, device, seed, "weight_bias"), dtype, config)
    if shape.K > 1:
        _check_layernorm(_large_mean(_ln_inputs(shape, dtype, device, seed, "none")), dtype, config)
    _check_rmsnorm(_rms_inputs(shape, dtype, device, seed, "weight"), dtype, config)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_default_config_at_the_limit(dtype, device):
    """The default config is the smallest program: it must fit at N = max_full_row_n."""
    n = max_full_row_n(dtype, device)
    shape = Shape(64, 256, n)
    config = SPEC_LAYERNORM.default_config
    _check_layernorm(_ln_inputs(shape, dtype, device, 1, "weight_bias"), dtype, config)
    _check_rmsnorm(_rms_inputs(shape, dtype, device, 2, "weight"), dtype, config)
