"""The one gap of torch's CPU build that Helion's reference mode falls into, filled.

Under ``HELION_INTERPRET=1`` Helion runs a kernel's dots as ``torch.mm`` / ``torch.bmm``
with ``out_dtype=`` (fp32 accumulation of bf16/fp16 operands); torch's CPU build (2.13)
has no kernel for those overloads, so every kernel with a dot would fail on a CPU. This
registers CPU kernels for ``aten::mm.dtype`` and ``aten::bmm.dtype`` that upcast both
operands to ``out_dtype`` first: bf16/fp16 products are exact in fp32, so the result is
the same as a fused fp32-accumulating dot. Only an overload torch lacks is registered, and
only in reference mode (see :func:`install`); nothing that torch implements is replaced.
"""

from __future__ import annotations

import os

import torch

_LIBRARY: list[torch.library.Library] = []  # keeps the registrations alive


def _upcast(op):
    def impl(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        return op(a.to(out_dtype), b.to(out_dtype))

    return impl


def install() -> None:
    """Register the missing CPU kernels, once, when ``HELION_INTERPRET`` is set."""
    if _LIBRARY or os.environ.get("HELION_INTERPRET", "0") in ("", "0"):
        return
    lib = torch.library.Library("aten", "IMPL")
    for name, op in (("mm.dtype", torch.mm), ("bmm.dtype", torch.bmm)):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "CPU"):
            lib.impl(name, _upcast(op), "CPU")
    _LIBRARY.append(lib)
