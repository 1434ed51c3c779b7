"""``matmul_rmsnorm_matmul`` = ``rms_norm(a @ b, weight) @ c``, the norm deferred into the
next GEMM (:mod:`.kernels`): the Linear -> RMSNorm -> Linear pattern of technique 3 of the
PyTorch blog "Towards Free Normalization" (Meta, 2026), when nothing else reads the
normalised activations.
"""

from __future__ import annotations

import torch

from ... import checks, registry, runtime
from ...autograd import Op, matmul_grads, rms_rstd, rms_x_hat, run_compiled, wgrad
from ...spec import Shape
from ..postnorm import compiled_rms_norm
from ..prenorm import fold_rmsnorm_weight, rmsnorm_matmul_da

_kernels = runtime.LazyModule(f"{__name__}.kernels")


def consumer_config_for(m: int, n: int, n2: int, dtype: torch.dtype, device: torch.device):
    """The consumer's config for a call at (M, N, N2): the ``matmul`` registry entry at that
    shape, or the nearest (with the registry's warning)."""
    found = registry.lookup("matmul", Shape(m, n, n2), dtype, registry.gpu_key(device))
    return _kernels.consumer_config(None if found.entry is None else found.entry.config)


def _deferred(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, eps: float,
              fused: bool | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, x = a @ b, rstd [M] fp32): the two kernels where the registry chose them, else
    cuBLAS, the compiled norm and cuBLAS; ``x`` and ``rstd`` are what the backward needs."""
    m, n, n2 = a.shape[0], b.shape[1], c.shape[1]
    if m == 0 or n2 == 0:
        x = torch.mm(a, b)
        return a.new_zeros(m, n2), x, rms_rstd(x, eps)
    if not runtime.decide(_kernels.SPEC, (a, b), fused).fused:
        x = torch.mm(a, b)  # cuBLAS reads a transposed (nn.Linear) weight in place
        y, rstd = compiled_rms_norm(x, None, eps)  # the weight is in c
        return torch.mm(y, c), x, rstd
    a, b, c = a.contiguous(), b.contiguous(), c.contiguous()
    x, partials = runtime.launch(_kernels.SPEC, (a, b))
    out = runtime.launch_kernel(_kernels.rmsnorm_scaled_matmul_kernel, (x, c, partials, eps),
                                lambda: consumer_config_for(m, n, n2, a.dtype, a.device))
    return out, x, torch.rsqrt(partials.sum(dim=1) / n + eps)


def _deferred_fake(a, b, c, eps, fused):
    m = a.shape[0]
    return a.new_empty(m, c.shape[1]), a.new_empty(m, b.shape[1]), a.new_empty(m, dtype=torch.float32)


def deferred_grads(a, b, c, x, rstd, dout, needs: tuple[bool, bool, bool]):
    """(dA, dB, dC) of ``out = rms_norm(a @ b) @ c`` (the norm weight folded into ``c``), from
    the forward's ``x = a @ b`` (input dtype) and fp32 ``rstd``."""
    dc = wgrad(run_compiled(rms_x_hat, x, rstd), dout, c) if needs[2] else None
    da = db = None
    if needs[0] or needs[1]:
        dx = rmsnorm_matmul_da(x, c, dout, rstd)
        da, db = matmul_grads(a, b, dx, needs[0], needs[1])
    return da, db, dc



def _setup_context(ctx, inputs, output):
    x = _DEFERRED.named(inputs)
    _, product, rstd = output
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x.a, x.b, x.c, product, rstd)
    ctx.mark_non_differentiable(product, rstd)


def _backward(ctx, dout, *_):
    if dout is None:
        return _DEFERRED.input_grads()
    a, b, c, product, rstd = ctx.saved_tensors
    need = _DEFERRED.named(ctx.needs_input_grad)
    da, db, dc = deferred_grads(a, b, c, product, rstd, dout, (need.a, need.b, need.c))
    return _DEFERRED.input_grads(a=da, b=db, c=dc)


_DEFERRED = Op("matmul_rmsnorm_matmul", _deferred, _deferred_fake, backward=_backward, setup_context=_setup_context)


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
    Free Normalization" (Meta, 2026), see :mod:`.kernels`:
    the first GEMM writes ``x = a @ b`` and per-row partial sums of squares; the second runs
    on ``x`` and ``w[:, None] * c`` and scales its accumulator by ``rstd``. For the Linear ->
    RMSNorm -> Linear pattern when nothing else reads the normalised activations. The op runs
    the two kernels only where tuning measured them at least 2% faster than cuBLAS, the
    compiled norm and cuBLAS (timed at N2 = K) at this (M, K, N) or the nearest tuned shape
    (``fused=None``, :func:`~helion_kernels.runtime.decide`; unfused on a GPU without entries
    for its architecture; the kernels in Helion's reference mode). The decision does not look
    at N2. Measured: ``bench/results/<gpu>/matmul_rmsnorm_matmul_*``. ``fused=True`` forces the
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
        backward (:func:`deferred_grads`) uses ``a``, ``b``, ``c`` and the
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
