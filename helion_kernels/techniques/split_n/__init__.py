"""Split-N post-norm (technique 3) for any N: ``matmul_layernorm_split_n`` and
``matmul_rmsnorm_split_n``, the row sweep of :mod:`.kernels`.

Source: the PyTorch blog "Towards Free Normalization: Fusing Normalization into GEMM and
Attention Kernels" (Meta, 2026), whose cluster / distributed-shared-memory exchange Helion
does not expose on Hopper; the kernel sweeps a row block's N tiles with L2 as the exchange.
Both norms share one op body; the backward is the full-row ops' (:mod:`..postnorm`).
"""

from __future__ import annotations

import torch

from ... import checks, runtime
from ...autograd import contiguous_or_none, gemm_operand
from ..postnorm import post_norm_op, unfused_norm

_kernels = runtime.LazyModule(f"{__name__}.kernels")


def _split_n(layernorm: bool, a, b, weight, bias, eps: float, fused) -> tuple:
    """(y, mean or None, rstd): the row sweep where the registry chose it, else cuBLAS + the
    compiled or Liger's norm (the registry's unfused pipeline)."""
    m, n = a.shape[0], b.shape[1]
    if m == 0 or n == 0:
        nan = torch.full((m,), float("nan"), dtype=torch.float32, device=a.device)  # over no columns
        return a.new_empty(m, n), (nan.clone() if layernorm else None), nan
    args = (a.contiguous(), gemm_operand(b), *contiguous_or_none(weight, bias), eps, int(layernorm))
    spec = _kernels.SPEC_LAYERNORM if layernorm else _kernels.SPEC_RMSNORM
    decision = runtime.decide(spec, args, fused)
    if decision.fused:
        out = runtime.launch(spec, args)
        return out if layernorm else (out[0], None, out[1])
    return unfused_norm(layernorm, torch.mm(a, b), weight, bias, eps, decision.pipeline)


def _layernorm_impl(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                    eps: float, fused: bool | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _split_n(True, a, b, weight, bias, eps, fused)


def _layernorm_fake(a, b, weight, bias, eps, fused):
    m = a.shape[0]
    return a.new_empty(m, b.shape[1]), a.new_empty(m, dtype=torch.float32), a.new_empty(m, dtype=torch.float32)


def _rmsnorm_impl(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None, eps: float,
                  fused: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    y, _, rstd = _split_n(False, a, b, weight, None, eps, fused)
    return y, rstd


def _rmsnorm_fake(a, b, weight, eps, fused):
    return a.new_empty(a.shape[0], b.shape[1]), a.new_empty(a.shape[0], dtype=torch.float32)


_LAYERNORM = post_norm_op("matmul_layernorm_split_n", _layernorm_impl, _layernorm_fake)
_RMSNORM = post_norm_op("matmul_rmsnorm_split_n", _rmsnorm_impl, _rmsnorm_fake)


def matmul_layernorm_split_n(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    return_stats: bool = False,
    fused: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``layer_norm(a @ b, (N,), weight, bias, eps)`` for any N, the row split into N tiles.

    Split-N post-norm, technique 3 of the PyTorch blog "Towards Free Normalization" (Meta,
    2026), as the row sweep of :mod:`.kernels`: the GEMM keeps its own N tiling; one program
    per row block walks the block's N tiles, storing each un-normalised (centred on its own
    mean) and merging its statistics with Chan's formula, then re-reads the tiles from L2 and
    normalises them. ``fused=None`` runs the kernel only where tuning or the benchmark
    measured it at least 2% faster than the unfused path, at this shape or the nearest tuned
    one (:func:`~helion_kernels.runtime.decide`; unfused on a GPU without entries for its
    architecture); ``fused=True`` forces the kernel (a conservative default config and a
    warning on a GPU without entries), ``fused=False`` the unfused path: cuBLAS + the
    compiled norm, or cuBLAS + Liger's norm where the registry recorded that faster and
    liger-kernel is installed (:mod:`helion_kernels.liger_norm`). Measured:
    ``bench/results/<gpu>/matmul_layernorm_split_n_*``.

    Args, returns and errors: as :func:`~helion_kernels.matmul_layernorm`, without an N limit
    and without ``linear_bias`` and ``residual``. Gradients as there too, but nothing of the
    forward is kept: the backward recomputes ``a @ b`` (one more GEMM) and the statistics.
    The un-normalised tile is stored in the input dtype between the two sweeps (centred on
    its tile mean), so with fp16 inputs a deviation past 65504 overflows, as in cuBLAS + a
    standalone norm; the full-row kernel keeps it in fp32.
    """
    op = "matmul_layernorm_split_n"
    checks.gemm_operands(op, a, b)
    eps = checks.norm_params(op, a, b.shape[1], eps, weight=weight, bias=bias)
    checks.flag(op, "return_stats", return_stats)
    checks.fused_flag(op, fused)
    runtime.check_runnable(op, a.device)
    y, mean, rstd = _LAYERNORM(a, b, weight, bias, eps, fused)
    return (y, mean, rstd) if return_stats else y


def matmul_rmsnorm_split_n(
    a: torch.Tensor,
    b: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    return_rstd: bool = False,
    fused: bool | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``rms_norm(a @ b, (N,), weight, eps)`` for any N, the row split into N tiles.

    The RMSNorm twin of :func:`matmul_layernorm_split_n` (same technique, kernel, dispatch,
    unfused path and caveats: with fp16 inputs a product past 65504 overflows between the
    sweeps; the backward recomputes ``a @ b``). Args, returns and errors: as
    :func:`~helion_kernels.matmul_rmsnorm`, without an N limit and without ``linear_bias``
    and ``residual``.
    """
    op = "matmul_rmsnorm_split_n"
    checks.gemm_operands(op, a, b)
    eps = checks.norm_params(op, a, b.shape[1], eps, weight=weight)
    checks.flag(op, "return_rstd", return_rstd)
    checks.fused_flag(op, fused)
    runtime.check_runnable(op, a.device)
    y, rstd = _RMSNORM(a, b, weight, eps, fused)
    return (y, rstd) if return_rstd else y
