"""``nn.Module`` drop-ins for a norm + Linear pair, over the fused ops.

Each module holds the pair it replaces as submodules named ``norm`` and ``linear`` (so a
checkpoint of the pair loads into it and back: ``norm.weight``, ``linear.weight``,
``linear.bias``), takes inputs with any leading dimensions (``[batch, seq, K]``), and
returns what the pair returns, also under ``torch.autocast("cuda", dtype=torch.bfloat16)``
with fp32 parameters: the GEMM runs in the autocast dtype, the norm's statistics in fp32,
and the output dtype is the pair's (autocast runs ``layer_norm`` / ``rms_norm`` in fp32 on
CUDA, so a module ending in the norm returns fp32 there, one ending in the Linear the
autocast dtype). ``nn.RMSNorm(eps=None)`` keeps its meaning: the machine epsilon of the
dtype the norm sees. Gradients land in the parameters' dtype.

The kernels read ``nn.Linear``'s [N, K] weight as its transposed view; an RMSNorm weight in
front of the GEMM is folded into it once per call (a [K, N] temporary, never a second
parameter). What runs fused today, and what does not yet:

* :class:`RMSNormLinear`: ``rmsnorm_matmul``; the Linear bias is added after the kernel
  (one elementwise pass over the output).
* :class:`LinearLayerNorm`, :class:`LinearRMSNorm`: ``matmul_layernorm`` /
  ``matmul_rmsnorm`` (fused or cuBLAS + inductor norm, as the registry decided) when the
  Linear has no bias and no residual is given; otherwise ``F.linear`` (+ residual) and the
  standalone norm, because the bias and the residual must be added before the norm's
  statistics and the kernels do not take them yet.

Source of the techniques: the PyTorch blog "Towards Free Normalization" (Meta, 2026).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .ops import matmul_layernorm, matmul_rmsnorm, rmsnorm_matmul


def _compute_dtypes(x: torch.Tensor) -> tuple[torch.dtype, torch.dtype]:
    """(dtype of the GEMM, dtype the norm sees): the autocast dtype and fp32 under CUDA
    autocast (norms are on autocast's fp32 list there), else ``x.dtype`` for both."""
    if x.is_cuda and torch.is_autocast_enabled("cuda"):
        return torch.get_autocast_dtype("cuda"), torch.float32
    return x.dtype, x.dtype


def _eps(norm: nn.Module, dtype: torch.dtype) -> float:
    return norm.eps if norm.eps is not None else torch.finfo(dtype).eps


class _NormLinearPair(nn.Module):
    """A norm and a Linear held as ``self.norm`` and ``self.linear``. Subclasses set
    ``_norm_type`` and ``_normalized`` (the Linear's feature count the norm is over)."""

    _norm_type: type
    _normalized: str  # "in_features" (pre-norm) or "out_features" (post-norm)

    def __init__(self, norm: nn.Module, linear: nn.Linear) -> None:
        super().__init__()
        self.norm, self.linear = norm, linear

    @classmethod
    def from_modules(cls, norm: nn.Module, linear: nn.Linear):
        """The module over an existing pair (sharing its parameters, so the pair's
        state_dict loads into it and back).

        Raises:
            TypeError: ``norm`` or ``linear`` of the wrong type.
            ValueError: the norm is not over the Linear's features on its side.
        """
        if not isinstance(norm, cls._norm_type):
            raise TypeError(f"norm must be an nn.{cls._norm_type.__name__}, got {type(norm).__name__}")
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be an nn.Linear, got {type(linear).__name__}")
        features = getattr(linear, cls._normalized)
        if tuple(norm.normalized_shape) != (features,):
            raise ValueError(f"the norm must be over the Linear's {cls._normalized} ({features}), got "
                             f"normalized_shape {tuple(norm.normalized_shape)}")
        module = cls.__new__(cls)
        _NormLinearPair.__init__(module, norm, linear)
        return module


class RMSNormLinear(_NormLinearPair):
    """``linear(norm(x))`` with ``norm = nn.RMSNorm(K)``, ``linear = nn.Linear(K, N)``: the
    deferred pre-norm (technique 2), one kernel.

    Args:
        in_features, out_features: K and N.
        bias: whether the Linear has a bias.
        eps, elementwise_affine: as ``nn.RMSNorm``.

    Shapes: ``x`` [..., K] -> [..., N].
    """

    _norm_type = nn.RMSNorm
    _normalized = "in_features"

    def __init__(self, in_features: int, out_features: int, bias: bool = True, eps: float | None = None,
                 elementwise_affine: bool = True, device=None, dtype=None) -> None:
        super().__init__(nn.RMSNorm(in_features, eps=eps, elementwise_affine=elementwise_affine, device=device,
                                    dtype=dtype),
                         nn.Linear(in_features, out_features, bias=bias, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gemm_dtype, norm_dtype = _compute_dtypes(x)
        lead, k = x.shape[:-1], x.shape[-1]
        with torch.autocast(x.device.type, enabled=False):
            weight = self.linear.weight.to(gemm_dtype).t()  # [K, N] view of the [N, K] weight
            y = rmsnorm_matmul(x.reshape(-1, k).to(gemm_dtype), weight, self.norm.weight,
                               _eps(self.norm, norm_dtype))
            if self.linear.bias is not None:
                y = y + self.linear.bias.to(gemm_dtype)
        return y.reshape(*lead, y.shape[-1])


class _LinearNorm(_NormLinearPair):
    """``norm(linear(x) [+ residual])``: the post-norm modules' shared forward."""

    _normalized = "out_features"

    def _fused(self, a: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        raise NotImplementedError

    def _unfused(self, h: torch.Tensor, eps: float) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``norm(linear(x) + residual)`` (a post-LN block); ``residual`` [..., N] or None."""
        gemm_dtype, norm_dtype = _compute_dtypes(x)
        lead, k = x.shape[:-1], x.shape[-1]
        eps = _eps(self.norm, norm_dtype)
        with torch.autocast(x.device.type, enabled=False):
            a = x.reshape(-1, k).to(gemm_dtype)
            weight = self.linear.weight.to(gemm_dtype)
            if self.linear.bias is None and residual is None:
                y = self._fused(a, weight.t(), eps)
            else:  # added before the statistics: not in the kernels yet
                bias = None if self.linear.bias is None else self.linear.bias.to(gemm_dtype)
                h = F.linear(a, weight, bias)
                if residual is not None:
                    h = h + residual.reshape(h.shape).to(gemm_dtype)
                y = self._unfused(h.to(norm_dtype), eps)
        return y.to(norm_dtype).reshape(*lead, y.shape[-1])
class LinearLayerNorm(_LinearNorm):
    """``norm(linear(x) [+ residual])`` with ``linear = nn.Linear(K, N)``, ``norm =
    nn.LayerNorm(N)``: the post-norm of a GEMM, fused where tuning measured it faster
    (technique 1; split-N is not dispatched to, being slower on the H200).

    Args:
        in_features, out_features: K and N.
        bias: whether the Linear has a bias (a bias runs the unfused path, see the module doc).
        eps, elementwise_affine, norm_bias: as ``nn.LayerNorm``'s eps, elementwise_affine, bias.

    Shapes: ``x`` [..., K] -> [..., N].
    """

    _norm_type = nn.LayerNorm

    def __init__(self, in_features: int, out_features: int, bias: bool = True, eps: float = 1e-5,
                 elementwise_affine: bool = True, norm_bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(nn.LayerNorm(out_features, eps=eps, elementwise_affine=elementwise_affine, bias=norm_bias,
                                      device=device, dtype=dtype),
                         nn.Linear(in_features, out_features, bias=bias, device=device, dtype=dtype))

    def _fused(self, a, weight, eps):
        return matmul_layernorm(a, weight, self.norm.weight, self.norm.bias, eps)

    def _unfused(self, h, eps):
        return F.layer_norm(h, self.norm.normalized_shape, self.norm.weight, self.norm.bias, eps)


class LinearRMSNorm(_LinearNorm):
    """``norm(linear(x) [+ residual])`` with ``norm = nn.RMSNorm(N)``; as
    :class:`LinearLayerNorm`.

    Args:
        in_features, out_features: K and N.
        bias: whether the Linear has a bias.
        eps, elementwise_affine: as ``nn.RMSNorm`` (``eps=None``: the dtype's epsilon).
    """

    _norm_type = nn.RMSNorm

    def __init__(self, in_features: int, out_features: int, bias: bool = True, eps: float | None = None,
                 elementwise_affine: bool = True, device=None, dtype=None) -> None:
        super().__init__(nn.RMSNorm(out_features, eps=eps, elementwise_affine=elementwise_affine, device=device,
                                    dtype=dtype),
                         nn.Linear(in_features, out_features, bias=bias, device=device, dtype=dtype))

    def _fused(self, a, weight, eps):
        return matmul_rmsnorm(a, weight, self.norm.weight, eps)

    def _unfused(self, h, eps):
        return F.rms_norm(h, self.norm.normalized_shape, self.norm.weight, eps)
