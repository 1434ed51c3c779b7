"""The sub-tiled-epilogue GEMM variant (``bench/variants/gemm_epilogue_subtile.py``): the
variants' configs, and that Helion's sub-tiled store writes every element (interpreter)."""

from __future__ import annotations

import helion
import pytest
import torch

import gemm_epilogue_subtile  # bench/variants

BASE = {"block_sizes": [128, 256, 64], "num_warps": 8, "num_stages": 3, "l2_groupings": [8],
        "pid_type": "persistent_interleaved"}


@pytest.mark.parametrize("indexing, store", [
    ("tensor_descriptor", "tensor_descriptor"),
    (["pointer", "pointer", "pointer"], ["pointer", "pointer", "tensor_descriptor"]),
    ("pointer", ["pointer", "pointer", "tensor_descriptor"]),
])
def test_subtiled_variants_store_through_a_descriptor(indexing, store):
    base = {**BASE, "indexing": indexing}
    plain = gemm_epilogue_subtile.variant_config(base, {})
    assert plain.config == helion.Config(**base).config  # the entry itself is left as it is
    sub = gemm_epilogue_subtile.variant_config(base, {"epilogue_subtile": 4, "num_stages": 4})
    assert sub.config["epilogue_subtile"] == 4 and sub.config["num_stages"] == 4
    assert sub.config["indexing"] == store and sub.config["block_sizes"] == [128, 256, 64]


@pytest.mark.triton_interpret
@pytest.mark.parametrize("split", [2, 4])
@pytest.mark.parametrize("m, k, n", [(300, 192, 640), (1, 64, 256), (257, 128, 384)])
def test_subtiled_store_is_the_product(split, m, k, n):
    """fp16: the interpreter mishandles bf16 ``tl.dot``; a flat grid: the interpreter runs no
    persistent grid here (no SM count on a CPU). Edge tiles (m, n not multiples of the tile)
    and a partial last sub-tile (n = 640 with 256-wide tiles) included."""
    from helion_kernels.techniques.gemm.kernels import matmul_kernel

    gen = torch.Generator().manual_seed(m * n + split)
    a = torch.randn(m, k, generator=gen, dtype=torch.float16)
    b = torch.randn(k, n, generator=gen, dtype=torch.float16) / k ** 0.5
    config = gemm_epilogue_subtile.variant_config({**BASE, "pid_type": "flat", "indexing": "tensor_descriptor"},
                                                  {"epilogue_subtile": split})
    c = helion.kernel(matmul_kernel.fn, static_shapes=True).bind((a, b)).compile_config(config)(a, b)
    ref = a.float() @ b.float()
    err = float((c.float() - ref).abs().max() / ref.abs().max())
    assert err < 1e-2, err  # NaN fails too
