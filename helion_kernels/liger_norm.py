"""Liger's standalone norms as the norm of an op's unfused path.

Where tuning or the benchmark measured cuBLAS + Liger's norm faster than cuBLAS + the
inductor-compiled norm by the dispatch margin, the registry entry names ``cublas+liger_norm``
as the unfused pipeline (:func:`~helion_kernels.tuning.dispatch_decision`), and the split-N
ops run it when they do not run their fused kernel, provided liger-kernel >= 0.8.5 is
installed (``pip install "helion-kernels[liger]"``), the tensors are on a CUDA device and the
entry is near the call's shape (:func:`~helion_kernels.runtime.decide`); elsewhere the
compiled norm runs.

The functions call Liger's forward functions (``liger_kernel.ops``, the API of 0.8.5),
which also return the row statistics that the ops return with ``return_stats=True``; no
autograd runs inside them (the split-N ops' backward recomputes what it needs).
"""

from __future__ import annotations

import functools

import torch

PIPELINE = "cublas+liger_norm"
# Liger's norms hold a whole row in one block of at most this many elements.
MAX_N = 65536


# The Liger version whose forward functions (arguments, returns, fp32 statistics) this
# module was written and tested against.
MIN_VERSION = "0.8.5"


@functools.cache
def _ops():
    """Liger's norm modules (``liger_kernel.ops.layer_norm``, ``.rms_norm``), or None when
    liger-kernel is not installed, is older than :data:`MIN_VERSION` or does not import
    against this torch/triton."""
    try:
        import importlib.metadata

        from packaging.version import Version

        if Version(importlib.metadata.version("liger-kernel")) < Version(MIN_VERSION):
            return None
        from liger_kernel.ops import layer_norm, rms_norm
    except Exception:
        return None
    return layer_norm, rms_norm


def available(device: torch.device, n: int) -> bool:
    """Whether Liger's norms can normalise rows of ``n`` elements on ``device``: liger-kernel
    imports (:func:`_ops`), the device is a CUDA device (Liger's kernels are Triton kernels
    for GPUs) and N <= 65536 (one block per row)."""
    return device.type == "cuda" and n <= MAX_N and _ops() is not None


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``layer_norm(x, (N,), weight, bias, eps)`` of ``x`` [M, N] (CUDA) by Liger's kernel
    -> (y [M, N] in ``x.dtype``, mean [M] fp32, rstd [M] fp32); statistics in fp32.

    Raises:
        RuntimeError: liger-kernel is not available (check :func:`available` first).
    """
    layer_norm_ops = _require()[0]
    x, n = x.contiguous(), x.shape[1]  # Liger's kernel reads rows as contiguous
    # Liger's kernel always reads an affine weight and bias: ones and zeros stand for none.
    weight = torch.ones(n, dtype=x.dtype, device=x.device) if weight is None else weight
    bias = torch.zeros(n, dtype=x.dtype, device=x.device) if bias is None else bias
    with torch.cuda.device(x.device):  # Triton launches on the current device
        y, _, mean, rstd, *_ = layer_norm_ops.layer_norm_forward(x, weight.contiguous(), bias.contiguous(), eps)
    return y, mean.float(), rstd.float()


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``rms_norm(x, (N,), weight, eps)`` of ``x`` [M, N] (CUDA) by Liger's kernel
    -> (y [M, N] in ``x.dtype``, rstd [M] fp32). Liger's "gemma" casting mode with offset 0:
    ``x``, rstd and the weight in fp32, as this package's kernels compute it.

    Raises:
        RuntimeError: liger-kernel is not available (check :func:`available` first).
    """
    rms_norm_ops = _require()[1]
    w = None if weight is None else weight.contiguous()
    with torch.cuda.device(x.device):  # Triton launches on the current device
        y, _, rstd, *_ = rms_norm_ops.rms_norm_forward(x.contiguous(), w, eps, 0.0, "gemma", None)
    return y, rstd.float()


def _require():
    ops = _ops()
    if ops is None:
        raise RuntimeError("liger-kernel is not installed or does not import: pip install liger-kernel")
    return ops
