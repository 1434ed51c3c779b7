"""The full-row post-norm kernels' optional tensors: a Linear bias and a residual added
before the statistics, the ``product`` output (the norm's input, what the backward keeps),
and ``b`` read in place as the transposed view of an ``nn.Linear`` weight. Reference mode,
Triton interpreter and CUDA, against float64 references."""

from __future__ import annotations

import helion
import pytest
import torch

from helion_kernels.techniques.postnorm import kernels as postnorm_full_row
from helion_kernels.techniques.postnorm.kernels import SPEC_LAYERNORM, SPEC_RMSNORM, with_call_slots
from helion_kernels.spec import Shape
from helion_kernels.verify import check_outputs

pytestmark = pytest.mark.usefixtures("poisoned_empty")  # every output element must be written

SPECS = [SPEC_LAYERNORM, SPEC_RMSNORM]
# (linear_bias, residual, product, b as W.t())
VARIANTS = {
    "product": (False, False, True, False),
    "linear_bias": (True, False, False, False),
    "residual": (False, True, False, False),
    "all": (True, True, True, False),
    "all_wt": (True, True, True, True),
    "wt": (False, False, False, True),
}


def _args(spec, shape: Shape, dtype, device, variant: str):
    """The spec's (a, b, weight, bias, eps, layernorm) with the variant's optional tensors appended, and
    the float64 norm input ``h`` they describe."""
    with_bias, with_residual, with_product, transposed = VARIANTS[variant]
    args = list(spec.make_args(shape, dtype, device, seed=shape.M + shape.N))
    gen = torch.Generator().manual_seed(shape.K)
    if transposed:  # the same [K, N] values, stored as an nn.Linear weight [N, K]
        args[1] = args[1].t().contiguous().t()
        assert args[1].stride() == (1, shape.K)
    linear_bias = (0.5 * torch.randn(shape.N, generator=gen)).to(device) if with_bias else None  # fp32
    residual = torch.randn(shape.M, shape.N, generator=gen).to(device, dtype) if with_residual else None
    product = torch.empty(shape.M, shape.N, dtype=dtype, device=device) if with_product else None
    h = args[0].double() @ args[1].double()
    if linear_bias is not None:
        h = h + linear_bias.double()
    if residual is not None:
        h = h + residual.double()
    return (*args, linear_bias, residual, product), h


def _reference(spec, args: tuple):
    """The spec's float64 reference of the same call."""
    f64 = tuple(t.double() if isinstance(t, torch.Tensor) else t for t in args)
    return spec.reference(*f64[:6], linear_bias=f64[6], residual=f64[7])


def _check(spec, shape: Shape, dtype, device, variant: str, config: helion.Config | None):
    args, h = _args(spec, shape, dtype, device, variant)
    if config is None:
        out = spec.kernel(*args)
    else:
        bound = spec.kernel.bind(args)
        bound.set_config(spec.call_config(config, args))  # as the runtime adapts a registry config
        out = bound(*args)
    check_outputs(out, _reference(spec, args), dtype)
    if args[-1] is not None:
        check_outputs(args[-1], h, dtype)


@pytest.mark.ref_mode
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_reference_mode(spec, dtype, variant, device):
    _check(spec, Shape(33, 100, 96), dtype, device, variant, None)
    _check(spec, Shape(1, 48, 5), dtype, device, variant, None)  # M = 1, N not a power of two


@pytest.mark.triton_interpret
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_with_a_tuned_indexing_list(spec, variant):
    """A registry config lists one indexing entry per load/store of the kernel without the
    optional tensors (7 for LayerNorm, 5 for RMSNorm); with_call_slots inserts theirs. The
    first two entries (a, b) are tensor descriptors, as tuned configs often have them."""
    slots = 7 if spec is SPEC_LAYERNORM else 5
    indexing = ["tensor_descriptor", "tensor_descriptor", *["pointer"] * (slots - 2)]
    config = helion.Config(block_sizes=[16, 16, 32], num_warps=4, num_stages=1, indexing=indexing)
    _check(spec, Shape(33, 100, 96), torch.float32, "cpu", variant, config)


@pytest.mark.triton_interpret  # code generation only
@pytest.mark.parametrize("variant", ["product", "linear_bias", "residual", "all"])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_inserted_slots_index_the_optional_tensors(spec, variant):
    """The slot with_call_slots inserts for each optional tensor is the one Helion uses for
    its access: a block pointer put in that slot shows up on that tensor's load or store
    (slots 2, 3, ... in the order linear_bias, residual, product, for those passed)."""
    args, _ = _args(spec, Shape(64, 64, 64), torch.float32, "cpu", variant)
    slots = 7 if spec is SPEC_LAYERNORM else 5
    config = spec.call_config(helion.Config(block_sizes=[16, 16, 32], num_warps=4, num_stages=1,
                                            indexing=["pointer"] * slots), args)
    indexing = config.config["indexing"]
    passed = [name for name, on in zip(("linear_bias", "residual", "product"), VARIANTS[variant]) if on]
    assert len(indexing) == slots + len(passed)
    for slot, name in enumerate(passed, start=2):
        marked = [*indexing[:slot], "block_ptr", *indexing[slot + 1:]]
        code = spec.kernel.bind(args).to_triton_code(helion.Config(**{**config.config, "indexing": marked}))
        block_ptrs = [line for line in code.splitlines() if "make_block_ptr" in line]
        assert len(block_ptrs) == 1 and f"make_block_ptr({name}," in block_ptrs[0], (name, block_ptrs)


def test_call_slots_leave_other_configs_alone():
    config = helion.Config(block_sizes=[16, 16, 32], indexing="pointer")
    t = torch.empty(0)
    base = (None,) * 6  # a, b, weight, bias, eps, layernorm
    assert with_call_slots(config, base + (t, t, t)) == config  # one indexing string
    listed = helion.Config(block_sizes=[16, 16, 32], indexing=["a", "b", "c", "d", "e"])
    assert with_call_slots(listed, base) == listed  # no optional tensors passed
    assert with_call_slots(listed, base + (None, None, None)) == listed
    assert with_call_slots(listed, base + (None, None, t)).config["indexing"] == [
        "a", "b", "pointer", "c", "d", "e"]
    assert with_call_slots(listed, base + (t, None, None)).config["indexing"] == [
        "a", "b", "pointer", "c", "d", "e"]
    assert with_call_slots(listed, base + (t, t, t)).config["indexing"] == [
        "a", "b", "pointer", "pointer", "pointer", "c", "d", "e"]


@pytest.mark.cuda
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_cuda(spec, variant, device):
    """The default config and the seeds (every seed for the all-addends variants, the first
    three for the others), fitted to the call as the runtime fits them."""
    shape = Shape(256, 512, 500)
    args, _ = _args(spec, shape, torch.bfloat16, device, variant)
    seeds = spec.seed_configs if variant.startswith("all") else spec.seed_configs[:3]
    for config in (spec.default_config, *seeds):
        config = postnorm_full_row.fit_shared_memory(config, args)
        _check(spec, shape, torch.bfloat16, device, variant, config)
