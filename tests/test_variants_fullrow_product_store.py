"""The full-row LayerNorm's ``h`` store, measured in variants
(``bench/variants/fullrow_product_store.py``): the former kernel storing ``h`` last is checked
against fp32 in reference mode, and every variant runs under the Triton interpreter with a per-access
indexing list (its length must match the kernel's loads and stores)."""

from __future__ import annotations

import subprocess
import sys

import helion
import pytest
import torch

import fullrow_product_store as variants  # bench/variants
from _bench_scripts import REPO
from helion_kernels.techniques.postnorm.kernels import SPEC_LAYERNORM, matmul_norm_reference
from helion_kernels.spec import Shape
from helion_kernels.verify import check_outputs

pytestmark = pytest.mark.usefixtures("poisoned_empty")

SHAPES = [Shape(1, 64, 32), Shape(33, 40, 72), Shape(40, 48, 40)]


def _reference(args: tuple) -> tuple:
    a, b, w, bias, eps, layernorm = args
    return (*matmul_norm_reference(a.double(), b.double(), w.double(), bias.double(), eps, layernorm),
            a.double() @ b.double())


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_store_h_last_in_reference_mode(shape, dtype, device):
    args = SPEC_LAYERNORM.make_args(shape, dtype, device, shape.M + shape.N)
    h = args[0].new_empty(shape.M, shape.N)
    out = variants.store_h_last_kernel(*args[:5], h)
    check_outputs((*out, h), _reference(args), dtype)


@pytest.mark.triton_interpret
@pytest.mark.parametrize("name", sorted(variants.VARIANTS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_every_variant_under_the_interpreter(shape, name):
    # fp32: the interpreter mishandles bf16 tl.dot. Two M tiles, several K steps, a padded N tile.
    config = helion.Config(block_sizes=[16, 16, 16], num_warps=4, num_stages=1, indexing=["pointer"] * 7)
    args = SPEC_LAYERNORM.make_args(shape, torch.float32, "cpu", shape.M + shape.N)
    run, used = variants.bound_kernel(name, args, config)
    assert len(used.config["indexing"]) == 8
    check_outputs(run(), _reference(args), torch.float32)


def test_the_h_slot_goes_after_the_k_loop_or_last():
    config = helion.Config(block_sizes=[16, 64, 64], indexing=["a", "b", "w", "bias", "c", "mean", "rstd"])
    slots = lambda first, like_c: variants.with_h_slot(config, first, like_c).config["indexing"]  # noqa: E731
    assert slots(True, False) == ["a", "b", "pointer", "w", "bias", "c", "mean", "rstd"]
    assert slots(True, True) == ["a", "b", "c", "w", "bias", "c", "mean", "rstd"]
    assert slots(False, False) == ["a", "b", "w", "bias", "c", "mean", "rstd", "pointer"]
    assert slots(False, True)[-1] == "c"
    one = helion.Config(block_sizes=[16, 64, 64], indexing="tensor_descriptor")
    assert variants.with_h_slot(one, True, True) is one


def test_a_bad_query_is_a_usage_error():
    result = subprocess.run([sys.executable, str(REPO / "bench" / "variants" / "fullrow_product_store.py"),
                             "--where", "M == 1"], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 2 and "selects no row" in result.stderr
