"""Inputs, float64 references and registry decisions shared by the post-norm GEMM tests (split-N,
row sweep, deferred)."""

from __future__ import annotations

import helion
import torch

from helion_kernels.techniques.postnorm.kernels import EPS, LAYERNORM, RMSNORM, SPEC_LAYERNORM, matmul_norm_reference
from helion_kernels.spec import Shape


def matmul_layernorm_reference(a, b, weight=None, bias=None, eps=EPS, linear_bias=None, residual=None):
    """:func:`matmul_norm_reference` of LayerNorm, with the op's argument order: (y, mean, rstd)."""
    return matmul_norm_reference(a, b, weight, bias, eps, LAYERNORM, linear_bias, residual)


def matmul_rmsnorm_reference(a, b, weight=None, eps=EPS, linear_bias=None, residual=None):
    """:func:`matmul_norm_reference` of RMSNorm, with the op's argument order: (y, rstd)."""
    return matmul_norm_reference(a, b, weight, None, eps, RMSNORM, linear_bias, residual)


def norm_inputs(shape: Shape, dtype, device, seed: int, affine: str, large_mean: bool = False,
                ramp: float = 0.0):
    """(a, b, weight, bias, eps) for ``norm(a @ b)``; ``affine`` names which of weight and
    bias are given ("none", "weight", "weight_bias"). With ``large_mean`` every output row
    has mean ~1e3 and spread ~1 (``a[:, -1] = 1``, ``b[-1, :] = 1000``); ``ramp`` adds an
    integer column ramp from -ramp to +ramp to every row, so that N tiles' means differ by
    ~ramp."""
    a, b, _, _, eps, _ = SPEC_LAYERNORM.make_args(shape, dtype, device, seed)
    if large_mean or ramp:
        a[:, -1] = 1
        # Integers: exact in TF32, which fp32 operands run on (a rounded 1e3 is off by ~0.5).
        b[-1, :] = 1000 * large_mean + torch.round(ramp * torch.linspace(-1, 1, shape.N, device=device))
    gen = torch.Generator().manual_seed(seed + 7)
    weight = (1 + 0.5 * torch.randn(shape.N, generator=gen)).to(device=device, dtype=dtype)
    bias = (0.5 * torch.randn(shape.N, generator=gen)).to(device=device, dtype=dtype)
    return a, b, weight if "weight" in affine else None, bias if "bias" in affine else None, eps


def _f64(t):
    return None if t is None else t.double()


def ln_reference_f64(a, b, weight, bias, eps):
    """``layer_norm(a @ b)`` computed in float64: (y, mean, rstd)."""
    return matmul_layernorm_reference(_f64(a), _f64(b), _f64(weight), _f64(bias), eps)


def rms_reference_f64(a, b, weight, eps):
    """``rms_norm(a @ b)`` computed in float64: (y, rstd)."""
    return matmul_rmsnorm_reference(_f64(a), _f64(b), _f64(weight), eps)


def save_decision(spec, shape: Shape, choice: str, unfused: str | None = None, device="cpu",
                  dtype: str = "float32") -> None:
    """A registry entry of ``spec`` at ``shape`` (``dtype``, for ``device``'s GPU key; a
    float32 CPU entry by default) whose dispatch decision is ``choice`` ("fused" or
    "unfused"), its unfused pipeline ``unfused`` (default: the spec's ``dispatch_baseline``),
    with a small config the interpreter can run."""
    from helion_kernels import registry
    from helion_kernels.registry import Entry

    meta = {"latency_ms": 0.01, "dispatch": {"choice": choice, "fused_ms": 0.01, "unfused_ms": 0.02,
                                             "unfused": unfused or spec.dispatch_baseline}}
    config = helion.Config(block_sizes=[16, 16, 16], num_warps=4, num_stages=1, indexing="pointer")
    registry.save_entry(spec.name, registry.gpu_key(torch.device(device)), Entry(shape, dtype, config, meta))
