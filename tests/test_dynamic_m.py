"""Untuned M on the kernels' dynamic-shape build (``KernelSpec.dynamic_m``): a shape tuned
exactly runs the static build; any other shape runs the dynamic build, compiled once per
config and shared by every M (sizes 0 and 1 apart), with the same results, for both layouts of
``b`` (row-major, and an ``nn.Linear`` weight's transpose read in place); the fallback warning
comes once per (K, N), not once per M."""

from __future__ import annotations

import warnings

import helion
import pytest
from helion.runtime.kernel import BoundKernel
import torch

from helion_kernels import registry, runtime
from helion_kernels.techniques.gemm import kernels as matmul
from helion_kernels.techniques.postnorm import kernels as postnorm_full_row
from helion_kernels.techniques.prenorm import kernels as rmsnorm_matmul
from helion_kernels.autograd import gemm_operand
from helion_kernels.registry import ConfigFallbackWarning, Entry
from helion_kernels.spec import Shape
from helion_kernels.verify import check_outputs

SPECS = {"matmul": matmul.SPEC, "rmsnorm_matmul": rmsnorm_matmul.SPEC,
         "matmul_layernorm": postnorm_full_row.SPEC_LAYERNORM, "matmul_rmsnorm": postnorm_full_row.SPEC_RMSNORM}
# Small pointer tilings the interpreter runs quickly (block_sizes in each kernel's loop order).
CONFIGS = {"matmul": helion.Config(block_sizes=[16, 16, 16], num_warps=4, num_stages=1, indexing="pointer"),
           "rmsnorm_matmul": helion.Config(block_sizes=[16, 16, 16, 16], num_warps=4, num_stages=1,
                                           indexing="pointer"),
           # [N tile (raised to Npad), tile_m, tile_k]
           "matmul_layernorm": helion.Config(block_sizes=[16, 16, 16], num_warps=4, num_stages=1,
                                             indexing="pointer"),
           "matmul_rmsnorm": helion.Config(block_sizes=[16, 16, 16], num_warps=4, num_stages=1,
                                           indexing="pointer")}
TUNED = Shape(64, 48, 40)


def _args(name: str, shape: Shape, transposed_b: bool = False) -> tuple:
    args = SPECS[name].make_args(shape, torch.float32, "cpu", shape.M)
    if transposed_b:  # b as nn.Linear keeps it: the transpose of a contiguous [N, K] weight
        args = (args[0], gemm_operand(args[1].t().contiguous().t()), *args[2:])
        assert not args[1].is_contiguous()
    return args


def _run(name: str, args: tuple) -> tuple:
    out = runtime.launch(SPECS[name], args)
    out = out if isinstance(out, tuple) else (out,)
    ref = SPECS[name].reference(*(t.double() if isinstance(t, torch.Tensor) else t for t in args))
    check_outputs(out, ref, torch.float32)
    return out


@pytest.fixture
def tuned(registry_dir):
    """One entry per kernel at TUNED on this machine's registry key, kernels compiled afresh."""
    for name, spec in SPECS.items():
        registry.save_entry(spec.name, registry.gpu_key(torch.device("cpu")),
                            Entry(TUNED, "float32", CONFIGS[name], {"latency_ms": 0.01}))
    runtime.clear_cache()
    yield
    runtime.clear_cache()


@pytest.mark.triton_interpret
@pytest.mark.parametrize("name", list(SPECS))
def test_exact_shape_static_other_m_dynamic_compiled_once(name, tuned):
    spec = SPECS[name]
    _run(name, _args(name, TUNED))
    exact_run = runtime._bound(spec, _args(name, TUNED))[0]
    assert isinstance(exact_run, BoundKernel) and exact_run.kernel is spec.kernel  # the static build
    with pytest.warns(ConfigFallbackWarning, match="64x48x40"):
        _run(name, _args(name, Shape(40, 48, 40)))
    runs = set()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigFallbackWarning)  # once per (K, N), not per M
        for m in (40, 23, 97, 2):
            args = _args(name, Shape(m, 48, 40))
            _run(name, args)
            runs.add(id(runtime._bound(spec, args)[0]))
    assert len(runs) == 1  # one compiled kernel for every M >= 2
    assert runtime._bound(spec, _args(name, Shape(23, 48, 40)))[1].source == "nearest"


@pytest.mark.triton_interpret
@pytest.mark.parametrize("name", list(SPECS))
def test_untuned_shapes_read_the_transposed_weight_and_single_rows(name, tuned):
    """Both layouts of ``b`` at an untuned M: 37 on the dynamic build, 1 on the static one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigFallbackWarning)
        for m in (1, 37):
            _run(name, _args(name, Shape(m, 48, 40), transposed_b=True))
            _run(name, _args(name, Shape(m, 48, 40)))


@pytest.mark.triton_interpret
def test_a_new_k_or_n_warns_again(tuned):
    with pytest.warns(ConfigFallbackWarning):
        _run("matmul", _args("matmul", Shape(40, 48, 40)))
    with pytest.warns(ConfigFallbackWarning, match="40x48x24"):
        _run("matmul", _args("matmul", Shape(40, 48, 24)))


@pytest.mark.cuda
@pytest.mark.parametrize("transposed_b", [False, True], ids=["row_major_b", "linear_weight_b"])
@pytest.mark.parametrize("name", list(SPECS))
def test_cuda_untuned_m_on_the_shipped_registry(name, transposed_b):
    """Shapes no registry tunes (the H200's entries are at M = 65536): every M >= 2, also one
    not a multiple of 16, shares one compiled dynamic kernel and matches the fp32 reference."""
    spec = SPECS[name]
    runs = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigFallbackWarning)
        for m in (4096, 4097, 1, 30000):
            args = spec.make_args(Shape(m, 1024, 1024), torch.bfloat16, "cuda", m)
            if transposed_b:
                args = (args[0], args[1].t().contiguous().t(), *args[2:])
            out = runtime.launch(spec, args)
            out = out if isinstance(out, tuple) else (out,)
            check_outputs(out, spec.reference(*args), torch.bfloat16)
            run, resolved = runtime._bound(spec, args)
            assert resolved.source != "exact"  # no registry tunes these M
            if m >= 2:
                runs.add(id(run))
    assert len(runs) == 1  # one compiled kernel (Triton may specialise it again inside for M % 16)


@pytest.mark.triton_interpret
@pytest.mark.parametrize("name", ["matmul_layernorm", "matmul_rmsnorm"])
def test_single_row_runs_the_static_build(name, tuned):
    """M = 1 keeps the static build: Helion's dynamic build treats the [1, N] ``product``
    buffer's first dimension as a broadcast and stores every row of the tile into it (the
    full-row ops' saved product at M = 1 was wrong on the H200)."""
    spec = SPECS[name]
    args = _args(name, Shape(1, 48, 40))
    product = torch.full((1, 40), float("nan"))
    call = (*args, None, None, product)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigFallbackWarning)
        runtime.launch(spec, call)
        run = runtime._bound(spec, call)[0]
    torch.testing.assert_close(product, args[0] @ args[1], rtol=1e-4, atol=1e-4)
    assert run.kernel is spec.kernel  # the static build
