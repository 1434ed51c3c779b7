"""Backward passes of the GEMM + norm ops, in PyTorch (cuBLAS GEMMs, fp32 norm arithmetic).

Pure functions of what the forward saved and the incoming gradients, so the tests can
check them with ``torch.autograd.gradcheck`` in float64 and the ops' autograd
registrations (:mod:`._op`) are thin. Norm statistics and elementwise arithmetic are fp32;
the GEMMs run in the input dtype with fp32 accumulation (as ``nn.Linear``'s backward does);
norm weight and bias gradients are fp32 sums over rows (deterministic, never accumulated in
bf16), cast to the parameter's dtype at the end.

What each forward saves, and why (the cheapest set that rebuilds the normalised tensor):

* pre-norm ``rms_norm(a) @ b``: ``a``, ``b`` (alive anyway: the layer's input and weight)
  and the fp32 ``rstd`` [M]; ``x_hat = a * rstd`` is rebuilt on the fly.
* post-norm ``norm(a @ b)``: ``a``, ``b`` and the affine parameters; the product ``a @ b`` is
  recomputed (one GEMM) and its row statistics with it (one reduction), so ``x_hat`` is
  consistent with the product the gradient is taken of (with fp32 inputs the forward's
  statistics come from a TF32 product). Rebuilding ``x_hat`` from the output instead,
  ``(y - bias) / weight``, fails where a weight element is 0 (a common initialisation of a
  residual branch's norm) and loses precision where ``|bias| >> |weight * x_hat|``; saving
  the product would cost an [M, N] write in the forward, the very pass the fusion removes.
"""

from __future__ import annotations

import torch


def mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` accumulated and returned in fp32 (torch's CPU build has no ``out_dtype``)."""
    if a.is_cuda and a.dtype in (torch.bfloat16, torch.float16):
        return torch.mm(a, b, out_dtype=torch.float32)
    return a.float() @ b.float()


def _param_grad(value: torch.Tensor, param: torch.Tensor | None, needed: bool) -> torch.Tensor | None:
    return value.to(param.dtype) if needed and param is not None else None


def matmul_grads(a: torch.Tensor, b: torch.Tensor, dc: torch.Tensor, need_a: bool = True, need_b: bool = True):
    """(dA, dB) of ``c = a @ b``."""
    return (torch.mm(dc, b.t()) if need_a else None, torch.mm(a.t(), dc) if need_b else None)


def rms_row_backward(dx_hat: torch.Tensor, x_hat: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """d(input) of ``x_hat = x * rstd`` (no affine), fp32: ``rstd * (dx_hat - x_hat * mean(dx_hat * x_hat))``."""
    s = (dx_hat * x_hat).mean(dim=1, keepdim=True)
    return rstd[:, None] * (dx_hat - x_hat * s)


def layer_row_backward(dx_hat: torch.Tensor, x_hat: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """d(input) of ``x_hat = (x - mean) * rstd`` (no affine), fp32."""
    return rstd[:, None] * (dx_hat - dx_hat.mean(dim=1, keepdim=True)
                            - x_hat * (dx_hat * x_hat).mean(dim=1, keepdim=True))


def rmsnorm_matmul_grads(a, b, rstd, dc, need_a: bool = True, need_b: bool = True):
    """(dA, dB) of ``c = (a * rstd[:, None]) @ b`` (the weight is folded into ``b``)."""
    x_hat = a.float() * rstd[:, None]
    da = db = None
    if need_a:
        da = rms_row_backward(mm_fp32(dc, b.t()), x_hat, rstd).to(a.dtype)
    if need_b:
        db = torch.mm(x_hat.to(a.dtype).t(), dc)
    return da, db


def postnorm_grads(kind: str, a, b, weight, bias, eps: float, dy, needs: tuple[bool, bool, bool, bool]):
    """(dA, dB, dWeight, dBias) of ``y = norm(a @ b) * weight + bias`` over N, ``kind`` being
    ``"layernorm"`` or ``"rmsnorm"`` (no bias)."""
    c = mm_fp32(a, b)
    if kind == "layernorm":
        var, mean = torch.var_mean(c, dim=1, correction=0)
        rstd = torch.rsqrt(var + eps)
        x_hat = (c - mean[:, None]) * rstd[:, None]
    else:
        rstd = torch.rsqrt(c.pow(2).mean(dim=1) + eps)
        x_hat = c * rstd[:, None]
    dy32 = dy.float()
    g = dy32 * weight.float() if weight is not None else dy32
    dx = (layer_row_backward if kind == "layernorm" else rms_row_backward)(g, x_hat, rstd).to(a.dtype)
    da, db = matmul_grads(a, b, dx, needs[0], needs[1])
    dweight = _param_grad((dy32 * x_hat).sum(dim=0), weight, needs[2])
    dbias = _param_grad(dy32.sum(dim=0), bias, needs[3])
    return da, db, dweight, dbias


def deferred_grads(a, b, c, eps: float, dout, needs: tuple[bool, bool, bool]):
    """(dA, dB, dC) of ``out = rms_norm(a @ b) @ c`` (the norm weight folded into ``c``)."""
    x = mm_fp32(a, b)
    rstd = torch.rsqrt(x.pow(2).mean(dim=1) + eps)
    x_hat = x * rstd[:, None]
    dc = torch.mm(x_hat.to(a.dtype).t(), dout) if needs[2] else None
    da = db = None
    if needs[0] or needs[1]:
        dx = rms_row_backward(mm_fp32(dout, c.t()), x_hat, rstd).to(a.dtype)
        da, db = matmul_grads(a, b, dx, needs[0], needs[1])
    return da, db, dc
