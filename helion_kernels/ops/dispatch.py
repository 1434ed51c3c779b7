"""Which path a public GEMM + norm op takes for a call: the fused kernel, or cuBLAS + the
inductor-compiled norm, as the registry recorded when the shape was tuned. Ops whose kernel
has an N limit (the full-row post-norm) run unfused past it; the others (the pre-norm, the
split-N post-norm) take the registry's choice at any N."""

from __future__ import annotations

from .. import runtime
from . import postnorm


def use_fused(spec, args: tuple, fused: bool | None = None) -> bool:
    """Whether the public op of ``spec`` (one with a ``dispatch_baseline``) runs its fused
    kernel for a call with the kernel arguments ``args``: :func:`.postnorm.use_fused` where
    the kernel has an N limit (unfused past it), else :func:`~helion_kernels.runtime.registry_choice`."""
    if has_n_limit(spec):
        return postnorm.use_fused(spec, args, fused)
    return runtime.registry_choice(spec, args, fused)


def has_n_limit(spec) -> bool:
    """Whether the op of ``spec`` runs unfused past an N limit of its kernel (``spec.n_limit``)."""
    return spec.n_limit is not None
