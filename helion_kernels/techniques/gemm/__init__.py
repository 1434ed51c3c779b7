"""``matmul``: the plain Helion GEMM, tuned like the fused kernels (the blog's baseline).
Kernel, reference and spec: :mod:`.kernels`."""

from __future__ import annotations

import torch

from ... import checks, runtime
from ...autograd import Op, matmul_grads

_kernels = runtime.LazyModule(f"{__name__}.kernels")


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.shape[0] == 0 or b.shape[1] == 0:
        return a.new_empty(a.shape[0], b.shape[1])
    return runtime.launch(_kernels.SPEC, (a.contiguous(), b.contiguous()))


def _matmul_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty(a.shape[0], b.shape[1])


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, dc):
    a, b = ctx.saved_tensors
    return matmul_grads(a, b, dc, *ctx.needs_input_grad[:2])


_OP = Op("matmul", _matmul, _matmul_fake, backward=_backward, setup_context=_setup_context)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The Helion GEMM ``a @ b`` with the tuned config for this shape.

    Args:
        a: [M, K], bf16, fp16 or fp32, on a CUDA device.
        b: [K, N], same dtype and device.

    Returns:
        [M, N] in the input dtype; fp32 accumulation (fp32 inputs use TF32 tensor cores).
        Differentiable in ``a`` and ``b`` (the backward runs two cuBLAS GEMMs).

    Raises:
        TypeError: non-tensor input, unsupported or mismatched dtypes.
        ValueError: not 2-D, mismatched K, K = 0, CPU tensors outside interpret modes,
            tensors on different devices.
    """
    checks.gemm_operands("matmul", a, b)
    runtime.check_runnable("matmul", a.device)
    return _OP(a, b)
