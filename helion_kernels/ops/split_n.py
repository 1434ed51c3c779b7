"""Split-N post-norm (technique 3) for N past the full-row limit:
``matmul_layernorm_split_n``, ``matmul_rmsnorm_split_n`` (the row sweep) and
``matmul_rmsnorm_matmul`` (the norm deferred into the next GEMM).

Source: the PyTorch blog "Towards Free Normalization: Fusing Normalization into GEMM and
Attention Kernels" (Meta, 2026). The blog exchanges per-row statistics between the CTAs of
a thread-block cluster through distributed shared memory, which Helion does not expose on
Hopper; the kernels here are the fastest of the Helion versions measured
(:mod:`helion_kernels.kernels.postnorm_split_n`, :mod:`helion_kernels.kernels.postnorm_deferred`;
the others are under ``bench/variants/``).
"""

from __future__ import annotations

import torch

from .. import checks, grads, runtime
from ..grads import deferred_grads
from ._op import Op
from .postnorm import (backward_layernorm, backward_rmsnorm, compiled_rms_norm, contiguous_operands, setup_layernorm,
                       setup_rmsnorm, unfused_layer_norm, unfused_rms_norm)
from .prenorm import fold_rmsnorm_weight

_row_sweep = runtime.LazyModule("helion_kernels.kernels.postnorm_split_n")
_deferred = runtime.LazyModule("helion_kernels.kernels.postnorm_deferred")


def _nan_stats(a: torch.Tensor, m: int) -> torch.Tensor:
    return torch.full((m,), float("nan"), dtype=torch.float32, device=a.device)  # over no columns


def _layernorm_split_n(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None,
                       bias: torch.Tensor | None, eps: float,
                       fused: bool | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, n = a.shape[0], b.shape[1]
    if m == 0 or n == 0:
        return a.new_empty(m, n), _nan_stats(a, m), _nan_stats(a, m)
    args = (*contiguous_operands(a, b, weight, bias), eps)
    spec = _row_sweep.SPEC_LAYERNORM
    decision = runtime.decide(spec, args, fused)
    if decision.fused:
        return runtime.launch(spec, args)
    return unfused_layer_norm(a, b, weight, bias, eps, decision.pipeline)


def _layernorm_split_n_fake(a, b, weight, bias, eps, fused):
    m = a.shape[0]
    return a.new_empty(m, b.shape[1]), a.new_empty(m, dtype=torch.float32), a.new_empty(m, dtype=torch.float32)


def _rmsnorm_split_n(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor | None,
                     eps: float, fused: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = a.shape[0], b.shape[1]
    if m == 0 or n == 0:
        return a.new_empty(m, n), _nan_stats(a, m)
    args = (*contiguous_operands(a, b, weight), eps)
    spec = _row_sweep.SPEC_RMSNORM
    decision = runtime.decide(spec, args, fused)
    if decision.fused:
        return runtime.launch(spec, args)
    return unfused_rms_norm(a, b, weight, eps, decision.pipeline)


def _rmsnorm_split_n_fake(a, b, weight, eps, fused):
    return a.new_empty(a.shape[0], b.shape[1]), a.new_empty(a.shape[0], dtype=torch.float32)


# The same outputs and statistics as the full-row ops, so the same backward.
_LAYERNORM = Op("matmul_layernorm_split_n", _layernorm_split_n, _layernorm_split_n_fake,
                backward=backward_layernorm, setup_context=setup_layernorm)
_RMSNORM = Op("matmul_rmsnorm_split_n", _rmsnorm_split_n, _rmsnorm_split_n_fake,
              backward=backward_rmsnorm, setup_context=setup_rmsnorm)


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
    2026), as the row sweep of :mod:`helion_kernels.kernels.postnorm_split_n`: the GEMM
    keeps its own N tiling (tile_n < N); one program per row block walks the block's N
    tiles, storing each un-normalised (centred on its own mean) and merging its statistics
    with Chan's formula, then re-reads the tiles from L2 and normalises them. On the H200 it
    is correct but 1.11-1.24x slower than cuBLAS + the best standalone norm on every
    benchmarked shape (``bench/results/``), so ``matmul_layernorm`` does not dispatch to it,
    and this op itself runs the kernel only where tuning measured it at least 2% faster than
    cuBLAS + the compiled norm (``fused=None``: the registry's decision at this shape or the
    nearest tuned one, as for the full-row ops; unfused on a GPU with no entries for its
    architecture (another GPU of the same architecture follows the tuned one's); none of the
    H200's tuned rows chose it). ``fused=True`` forces the kernel (with a conservative default
    config and a warning on a GPU without entries), ``fused=False`` the unfused path.

    The unfused path is cuBLAS + the compiled norm, or cuBLAS + Liger's norm where the
    registry recorded that pipeline at least 2% faster and liger-kernel is installed
    (:mod:`helion_kernels.liger_norm`; on the H200 LayerNorm at every row with N >= 2048,
    where inductor's LayerNorm reads each row twice, and RMSNorm at K = 512, N = 2048 and 4096).

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

    The RMSNorm twin of :func:`matmul_layernorm_split_n` (same technique and kernel design,
    same dispatch, unfused path and caveats: on the H200 from break-even at K = N = 512 to
    1.15x slower than cuBLAS + the best standalone norm, and Liger's RMSNorm faster than
    the compiled one on no row; with fp16 inputs a product past 65504 overflows
    between the sweeps; the backward recomputes ``a @ b``). Args, returns and errors: as
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


def _rmsnorm_matmul(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, eps: float,
                    fused: bool | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, x = a @ b, rstd [M] fp32): the producer's output and the row statistics are
    returned for the backward (x is written anyway). The two kernels where the registry chose
    them (:func:`~helion_kernels.runtime.decide` at (M, K, N)), else cuBLAS, the
    compiled norm and cuBLAS."""
    m, n, n2 = a.shape[0], b.shape[1], c.shape[1]
    if m == 0 or n2 == 0:
        x = torch.mm(a, b)
        return a.new_zeros(m, n2), x, grads.rms_rstd(x, eps)
    if not runtime.decide(_deferred.SPEC, (a, b), fused).fused:
        x = torch.mm(a, b)  # cuBLAS reads a transposed (nn.Linear) weight in place
        y, rstd = compiled_rms_norm(x, None, eps)  # the weight is in c
        return torch.mm(y, c), x, rstd
    a, b, c = a.contiguous(), b.contiguous(), c.contiguous()
    x, partials = runtime.launch(_deferred.SPEC, (a, b))
    out = runtime.launch_kernel(_deferred.rmsnorm_scaled_matmul_kernel, (x, c, partials, eps),
                                lambda: _deferred.consumer_config_for(m, n, n2, a.dtype, a.device))
    return out, x, torch.rsqrt(partials.sum(dim=1) / n + eps)


def _rmsnorm_matmul_fake(a, b, c, eps, fused):
    m = a.shape[0]
    return a.new_empty(m, c.shape[1]), a.new_empty(m, b.shape[1]), a.new_empty(m, dtype=torch.float32)


def _setup_deferred(ctx, inputs, output):
    a, b, c, *_ = inputs
    _, x, rstd = output
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(a, b, c, x, rstd)
    ctx.mark_non_differentiable(x, rstd)


def _backward_deferred(ctx, dout, *_):
    if dout is None:
        return None, None, None, None, None
    a, b, c, x, rstd = ctx.saved_tensors
    return (*deferred_grads(a, b, c, x, rstd, dout, ctx.needs_input_grad[:3]), None, None)


_DEFERRED = Op("matmul_rmsnorm_matmul", _rmsnorm_matmul, _rmsnorm_matmul_fake, backward=_backward_deferred,
               setup_context=_setup_deferred)


def matmul_rmsnorm_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    fused: bool | None = None,
) -> torch.Tensor:
    """``rms_norm(a @ b, (N,), weight, eps) @ c`` without normalising ``a @ b`` (any N).

    Split-N candidate 3 (deferred post-norm) of technique 3 of the PyTorch blog "Towards
    Free Normalization" (Meta, 2026), see :mod:`helion_kernels.kernels.postnorm_deferred`:
    the first GEMM writes ``x = a @ b`` and per-row partial sums of squares; the second runs
    on ``x`` and ``w[:, None] * c`` and scales its accumulator by ``rstd``. For the Linear ->
    RMSNorm -> Linear pattern when nothing else reads the normalised activations. On the
    H200 it beats cuBLAS -> standalone RMSNorm -> cuBLAS only at K = 512 with N >= 2048
    (``bench/results/``), so the op runs the two kernels only where tuning measured them at
    least 2% faster than cuBLAS, the compiled norm and cuBLAS (timed at N2 = K) at this (M,
    K, N), or at the nearest tuned shape (``fused=None``, as for the other GEMM + norm ops;
    unfused on a GPU with no entries for its architecture; in Helion's reference mode, which
    has no timings, the kernels). The decision does not look at N2. ``fused=True`` forces the
    kernels, ``fused=False`` the unfused path. The first GEMM's tiling is this op's registry
    entry at (M, K, N), the second's the ``matmul`` entry at (M, N, N2), each falling back
    (with a warning) to the nearest or a default config.

    Args:
        a: [M, K], bf16, fp16 or fp32, on a CUDA device.
        b: [K, N] and c: [N, N2], same dtype and device. N is the normalised dimension.
        weight: optional RMSNorm affine weight [N], folded into ``c`` on every call (fold it
            once with :func:`~helion_kernels.fold_rmsnorm_weight` and pass ``weight=None``
            to reuse it).
        eps: added to the mean square, >= 0.

    Returns:
        [M, N2] in the input dtype. ``x`` is stored in the input dtype between the GEMMs (as
        by cuBLAS + a standalone norm); statistics and accumulation are fp32. Differentiable
        in ``a``, ``b``, ``c`` and ``weight`` (not twice: ``create_graph=True`` raises); the
        backward (:func:`helion_kernels.grads.deferred_grads`) uses ``a``, ``b``, ``c`` and the
        forward's ``x = a @ b`` [M, N] and ``rstd``, which are kept (one [M, N] activation).

    Raises:
        TypeError, ValueError: as :func:`~helion_kernels.matmul_rmsnorm`, and for ``c`` not
            [N, N2] in the same dtype and device, N = 0, or ``fused`` not None, True or False.
    """
    op = "matmul_rmsnorm_matmul"
    checks.gemm_operands(op, a, b)
    n = b.shape[1]
    if not isinstance(c, torch.Tensor):
        raise TypeError(f"{op}: c must be a torch.Tensor, got {type(c).__name__}")
    if c.dim() != 2 or c.shape[0] != n:
        raise ValueError(f"{op}: c must have shape [N, N2] with N = {n}, the columns of b (b is {tuple(b.shape)}), "
                         f"got shape {tuple(c.shape)}")
    if c.dtype != a.dtype:
        raise TypeError(f"{op}: c must have the dtype of a and b ({a.dtype}), got {c.dtype}")
    if n == 0:
        raise ValueError(f"{op}: N must be at least 1 (the norm is over N), got b of shape {tuple(b.shape)}")
    checks.same_device(op, a, c)
    eps = checks.norm_params(op, a, n, eps, weight=weight)
    checks.fused_flag(op, fused)
    runtime.check_runnable(op, a.device)
    if weight is not None:
        c = fold_rmsnorm_weight(weight, c)
    return _DEFERRED(a, b, c, eps, fused)[0]
