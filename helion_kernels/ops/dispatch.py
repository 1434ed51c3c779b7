"""Which path a public GEMM + norm op takes for a call: the fused kernel, or cuBLAS + the
inductor-compiled norm, as the registry recorded when the shape was tuned (one function per
technique; this module picks it by the kernel spec, for the benchmark and the CLI)."""

from __future__ import annotations

from . import postnorm, prenorm


def use_fused(spec, args: tuple, fused: bool | None = None) -> bool:
    """Whether the public op of ``spec`` (one with a ``dispatch_baseline``) runs its fused
    kernel for a call with the kernel arguments ``args``: :func:`.prenorm.use_fused` for
    ``rmsnorm_matmul`` (any N), :func:`.postnorm.use_fused` for the full-row ops (unfused past
    the full-row N limit)."""
    if spec.name == "rmsnorm_matmul":
        return prenorm.use_fused(args, fused)
    return postnorm.use_fused(spec, args, fused)


def has_n_limit(spec) -> bool:
    """Whether the op of ``spec`` runs unfused past the full-row N limit (the post-norm ops)."""
    return spec.name != "rmsnorm_matmul"
