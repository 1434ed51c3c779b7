"""``nn.Module`` drop-ins for a norm + Linear pair, over the fused ops.

Each module holds the pair it replaces as submodules named ``norm`` and ``linear`` (so a
checkpoint of the pair loads into it and back: ``norm.weight``, ``linear.weight``,
``linear.bias``), takes inputs with any leading dimensions (``[batch, seq, K]``), and
returns what the pair returns, also under ``torch.autocast("cuda", dtype=torch.bfloat16)``
with fp32 parameters: the GEMM runs in the autocast dtype (statistics are fp32 in any case),
and the output dtype is the one the pair's norm gives under the same autocast state, asked of
torch itself once per state (on CUDA autocast runs ``layer_norm`` in fp32, so
``LinearLayerNorm`` returns fp32 there, as the pair does; ``rms_norm`` is not on that list
in torch 2.11). Without autocast the GEMM runs in ``x``'s dtype, the parameters cast to it
(where ``nn.Linear`` refuses an input and weight of two dtypes). ``nn.RMSNorm(eps=None)``
keeps its meaning: the epsilon of the dtype torch's
``rms_norm`` computes in (fp32 for bf16 inputs too). Gradients land in the parameters' dtype.

The ops take ``nn.Linear``'s [N, K] weight as its transposed view and the post-norm kernels
read it in place (no copy per call); the pre-norm folds an RMSNorm weight into it once per
call (a [K, N] temporary with the view's layout, never a second parameter). What runs:

* :class:`RMSNormLinear`, :class:`LayerNormLinear`: ``rmsnorm_matmul`` /
  ``layernorm_matmul``; the Linear bias is added after the kernel (one elementwise pass over
  the output). :class:`AddRMSNormLinear`, :class:`AddLayerNormLinear`: the block's residual
  add too (``add_rmsnorm_matmul`` / ``add_layernorm_matmul``), returning ``h`` beside the output.
* :class:`LinearLayerNorm`, :class:`LinearRMSNorm`: ``matmul_layernorm`` /
  ``matmul_rmsnorm`` (fused or cuBLAS + inductor norm, as the registry decided), with the
  Linear bias and the optional residual added to the fp32 accumulator before the norm's
  statistics (``linear_bias=`` / ``residual=`` of the ops); past the full-row N limit the
  ops run cuBLAS (bias in its epilogue) + the compiled norm.

Source of the techniques: the PyTorch blog "Towards Free Normalization" (Meta, 2026).
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .techniques.attention import flash_norm_attention
from .techniques.postnorm import matmul_layernorm, matmul_rmsnorm
from .techniques.prenorm import add_layernorm_matmul, add_rmsnorm_matmul, layernorm_matmul, rmsnorm_matmul

__all__ = ["AddLayerNormLinear", "AddRMSNormLinear", "FlashNormAttention", "LayerNormLinear", "LinearLayerNorm",
           "LinearRMSNorm", "RMSNormLinear"]


def _check_x(module: nn.Module, x) -> None:
    """A module's input is a tensor of at least one dimension (features last).

    Raises:
        TypeError: not a tensor. ValueError: a 0-d tensor, or features other than the Linear's
        ``in_features``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{type(module).__name__}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 0:
        raise ValueError(f"{type(module).__name__}: x must have at least one dimension (the features, last), "
                         "got a 0-d tensor")
    if x.shape[-1] != module.linear.in_features:
        raise ValueError(f"{type(module).__name__}: x's last dimension must be in_features = "
                         f"{module.linear.in_features}, got x of shape {tuple(x.shape)}")


def _compute_dtypes(x: torch.Tensor, norm: nn.Module, norm_input: str,
                    residual: torch.Tensor | None = None) -> tuple[torch.dtype, torch.dtype]:
    """(dtype of the GEMM, dtype the pair's norm computes in and returns). Under autocast on
    ``x``'s device: the autocast dtype, and what the norm does to an input of the dtype it
    sees (``norm_input``: "x" for a pre-norm, "gemm" for a post-norm, promoted with a
    residual's dtype as ``linear(x) + residual`` is); else ``x.dtype`` (promoted likewise)."""
    device = x.device.type
    autocast = torch.is_autocast_enabled(device)
    gemm = torch.get_autocast_dtype(device) if autocast else x.dtype
    seen = x.dtype if norm_input == "x" else gemm
    if residual is not None and norm_input == "gemm":
        seen = torch.promote_types(seen, residual.dtype)
    if not autocast:
        return gemm, seen
    return gemm, _autocast_norm_dtype(type(norm).__name__, device, gemm, seen)


def _autocast_norm_dtype(norm: str, device: str, autocast_dtype: torch.dtype, input_dtype: torch.dtype) -> torch.dtype:
    """The output dtype of ``F.layer_norm`` / ``F.rms_norm`` on an ``input_dtype`` tensor with
    fp32 parameters under autocast to ``autocast_dtype`` on ``device``: torch's own policy,
    which differs between devices and versions. Asked once per state (a tiny probe; while
    ``torch.compile`` traces a new state, the probe is traced and its ops are dead code)."""
    key = (norm, device, autocast_dtype, input_dtype)
    if key not in _NORM_DTYPES:
        x = torch.zeros(1, 2, dtype=input_dtype, device=device)
        weight = torch.ones(2, device=device)
        with torch.autocast(device, dtype=autocast_dtype), contextlib.ExitStack() as quiet:
            if not torch.compiler.is_compiling():  # dynamo cannot trace warnings filters (fullgraph)
                # torch warns that the probe's mixed dtypes miss its fused CPU kernel: the probe's
                # own business, not the user's
                quiet.enter_context(warnings.catch_warnings())
                warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
            y = F.layer_norm(x, (2,), weight) if norm == "LayerNorm" else F.rms_norm(x, (2,), weight)
        _NORM_DTYPES[key] = y.dtype
    return _NORM_DTYPES[key]


_NORM_DTYPES: dict[tuple, torch.dtype] = {}


def _eps(norm: nn.Module, dtype: torch.dtype) -> float:
    """The norm's eps; for ``eps=None`` what torch's ``rms_norm`` uses: the epsilon of the
    dtype it computes in (fp32 for bf16/fp16/fp32 inputs, float64 for float64), not of the
    input dtype."""
    return norm.eps if norm.eps is not None else torch.finfo(torch.promote_types(dtype, torch.float32)).eps


class _NormLinearPair(nn.Module):
    """A norm and a Linear held as ``self.norm`` and ``self.linear``. Subclasses set
    ``_norm_type`` and ``_normalized`` (the Linear's feature count the norm is over)."""

    _norm_type: type
    _normalized: str  # "in_features" (pre-norm) or "out_features" (post-norm)

    def __init__(self, norm: nn.Module, linear: nn.Linear) -> None:
        super().__init__()
        self.norm, self.linear = norm, linear

    @classmethod
    def _build(cls, in_features: int, out_features: int, linear_bias: bool, device, dtype, **norm_args):
        """A new (norm, linear) pair: the norm over the Linear's ``_normalized`` features."""
        features = in_features if cls._normalized == "in_features" else out_features
        return (cls._norm_type(features, **norm_args, device=device, dtype=dtype),
                nn.Linear(in_features, out_features, bias=linear_bias, device=device, dtype=dtype))

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


def _stat(module: nn.Module, name: str, t, lead: tuple) -> torch.Tensor | None:
    """A given row statistic of x's leading shape, flattened to [M]; None stays None.

    Raises:
        ValueError: not a tensor of x's leading shape.
    """
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(lead):
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{type(module).__name__}: {name} must have x's leading shape {tuple(lead)}, got {got}")
    return t.reshape(-1)


class _PreNormLinear(_NormLinearPair):
    """``linear(norm(x))``: the pre-norm modules' shared forward over ``_op``."""

    _normalized = "in_features"

    def _op(self, a: torch.Tensor, weight: torch.Tensor, eps: float, **stats) -> torch.Tensor:
        raise NotImplementedError

    def _forward(self, x: torch.Tensor, **stats) -> torch.Tensor:
        _check_x(self, x)
        gemm_dtype, norm_dtype = _compute_dtypes(x, self.norm, "x")
        lead, k = x.shape[:-1], x.shape[-1]
        stats = {name: _stat(self, name, t, lead) for name, t in stats.items()}
        with torch.autocast(x.device.type, enabled=False):
            weight = self.linear.weight.to(gemm_dtype).t()  # [K, N] view of the [N, K] weight
            y = self._op(x.reshape(-1, k).to(gemm_dtype), weight, _eps(self.norm, norm_dtype), **stats)
            if self.linear.bias is not None:
                y = y + self.linear.bias.to(gemm_dtype)
        return y.reshape(*lead, y.shape[-1])


class RMSNormLinear(_PreNormLinear):
    """``linear(norm(x))`` with ``norm = nn.RMSNorm(K)``, ``linear = nn.Linear(K, N)``: the
    deferred pre-norm (technique 2), one kernel.

    Args:
        in_features, out_features: K and N.
        bias: whether the Linear has a bias.
        eps, elementwise_affine: as ``nn.RMSNorm``.

    Shapes: ``x`` [..., K] -> [..., N].
    """

    _norm_type = nn.RMSNorm

    def __init__(self, in_features: int, out_features: int, bias: bool = True, eps: float | None = None,
                 elementwise_affine: bool = True, device=None, dtype=None) -> None:
        super().__init__(*self._build(in_features, out_features, bias, device, dtype, eps=eps,
                                      elementwise_affine=elementwise_affine))

    def forward(self, x: torch.Tensor, rstd: torch.Tensor | None = None) -> torch.Tensor:
        """``linear(norm(x))``; ``rstd`` [...] fp32 (x's leading dims), when whatever produced
        ``x`` already computed ``1 / sqrt(mean(x**2, -1) + eps)``: the GEMM then only scales its
        epilogue (``rmsnorm_matmul(..., rstd=)``), and the norm's gradient flows through it.

        Raises:
            TypeError: ``x`` not a tensor.
            ValueError: ``x`` 0-d, or ``rstd`` not of x's leading shape; the op's own errors otherwise.
        """
        return self._forward(x, rstd=rstd)

    def _op(self, a, weight, eps, rstd=None):
        return rmsnorm_matmul(a, weight, self.norm.weight, eps, rstd=rstd)


class LayerNormLinear(_PreNormLinear):
    """``linear(norm(x))`` with ``norm = nn.LayerNorm(K)``, ``linear = nn.Linear(K, N)``: the
    deferred pre-LayerNorm (``layernorm_matmul``, technique 2).

    Args:
        in_features, out_features: K and N.
        bias: whether the Linear has a bias.
        eps, elementwise_affine, norm_bias: as ``nn.LayerNorm``'s eps, elementwise_affine, bias.

    Shapes: ``x`` [..., K] -> [..., N].
    """

    _norm_type = nn.LayerNorm

    def __init__(self, in_features: int, out_features: int, bias: bool = True, eps: float = 1e-5,
                 elementwise_affine: bool = True, norm_bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(*self._build(in_features, out_features, bias, device, dtype, eps=eps,
                                      elementwise_affine=elementwise_affine, bias=norm_bias))

    def forward(self, x: torch.Tensor, mean: torch.Tensor | None = None,
                rstd: torch.Tensor | None = None) -> torch.Tensor:
        """``linear(norm(x))``; ``mean``, ``rstd`` [...] fp32 (x's leading dims, both or neither)
        when whatever produced ``x`` already computed its rows' LayerNorm statistics.

        Raises:
            TypeError: ``x`` not a tensor.
            ValueError: ``x`` 0-d, a statistic not of x's leading shape; the op's own errors otherwise.
        """
        return self._forward(x, mean=mean, rstd=rstd)

    def _op(self, a, weight, eps, mean=None, rstd=None):
        return layernorm_matmul(a, weight, self.norm.weight, self.norm.bias, eps, mean=mean, rstd=rstd)


class _AddNormLinear(_NormLinearPair):
    """``(linear(norm(x + residual)), x + residual)``: the pre-norm block's add, norm and
    Linear, over ``add_rmsnorm_matmul`` / ``add_layernorm_matmul``."""

    _normalized = "in_features"

    def _op(self, x, residual, weight, eps):
        raise NotImplementedError

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(linear(norm(h)), h)`` with ``h = x + residual``, both [..., K] of one shape.

        ``h`` has the dtype PyTorch gives ``x + residual``. Where that is the GEMM's dtype (no
        autocast, or inputs already in the autocast dtype), one compiled pass writes ``h`` and
        its statistics and the GEMM applies them; otherwise (e.g. fp32 inputs under bf16
        autocast) the add runs apart in ``h``'s dtype, as the pair's does, and the pre-norm op
        computes the statistics of ``h`` cast to the GEMM's dtype.

        Raises:
            TypeError: ``x`` or ``residual`` not a tensor.
            ValueError: ``x`` 0-d, ``residual`` not of x's shape; the op's own errors otherwise.
        """
        _check_x(self, x)
        if not isinstance(residual, torch.Tensor):
            raise TypeError(f"{type(self).__name__}: residual must be a torch.Tensor, got {type(residual).__name__}")
        if residual.shape != x.shape:
            raise ValueError(f"{type(self).__name__}: residual must have x's shape {tuple(x.shape)}, got "
                             f"{tuple(residual.shape)}")
        gemm_dtype, norm_dtype = _compute_dtypes(x, self.norm, "x")
        if not torch.is_autocast_enabled(x.device.type):  # the pair's GEMM runs in h's dtype
            gemm_dtype = norm_dtype = torch.promote_types(x.dtype, residual.dtype)
        lead, k = x.shape[:-1], x.shape[-1]
        eps = _eps(self.norm, norm_dtype)
        with torch.autocast(x.device.type, enabled=False):
            weight = self.linear.weight.to(gemm_dtype).t()
            if x.dtype == residual.dtype == gemm_dtype:
                y, h = self._op(x.reshape(-1, k), residual.reshape(-1, k), weight, eps)
            else:
                h = (x + residual).reshape(-1, k)
                y = self._pre_norm(h.to(gemm_dtype), weight, eps)
            if self.linear.bias is not None:
                y = y + self.linear.bias.to(gemm_dtype)
        return y.reshape(*lead, y.shape[-1]), h.reshape(x.shape)


class AddRMSNormLinear(_AddNormLinear):
    """``(linear(norm(x + residual)), x + residual)`` with ``norm = nn.RMSNorm(K)``, ``linear =
    nn.Linear(K, N)``: a pre-norm block's residual add, RMSNorm and Linear
    (:func:`~helion_kernels.add_rmsnorm_matmul`).

    Args:
        in_features, out_features: K and N.
        bias: whether the Linear has a bias.
        eps, elementwise_affine: as ``nn.RMSNorm``.

    Shapes: ``x``, ``residual`` [..., K] -> ([..., N], [..., K]).
    """

    _norm_type = nn.RMSNorm

    def __init__(self, in_features: int, out_features: int, bias: bool = True, eps: float | None = None,
                 elementwise_affine: bool = True, device=None, dtype=None) -> None:
        super().__init__(*self._build(in_features, out_features, bias, device, dtype, eps=eps,
                                      elementwise_affine=elementwise_affine))

    def _op(self, x, residual, weight, eps):
        return add_rmsnorm_matmul(x, residual, weight, self.norm.weight, eps)

    def _pre_norm(self, h, weight, eps):
        return rmsnorm_matmul(h, weight, self.norm.weight, eps)


class AddLayerNormLinear(_AddNormLinear):
    """``(linear(norm(x + residual)), x + residual)`` with ``norm = nn.LayerNorm(K)``: as
    :class:`AddRMSNormLinear` (:func:`~helion_kernels.add_layernorm_matmul`).

    Args:
        in_features, out_features: K and N.
        bias: whether the Linear has a bias.
        eps, elementwise_affine, norm_bias: as ``nn.LayerNorm``'s eps, elementwise_affine, bias.
    """

    _norm_type = nn.LayerNorm

    def __init__(self, in_features: int, out_features: int, bias: bool = True, eps: float = 1e-5,
                 elementwise_affine: bool = True, norm_bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(*self._build(in_features, out_features, bias, device, dtype, eps=eps,
                                      elementwise_affine=elementwise_affine, bias=norm_bias))

    def _op(self, x, residual, weight, eps):
        return add_layernorm_matmul(x, residual, weight, self.norm.weight, self.norm.bias, eps)

    def _pre_norm(self, h, weight, eps):
        return layernorm_matmul(h, weight, self.norm.weight, self.norm.bias, eps)


class _LinearNorm(_NormLinearPair):
    """``norm(linear(x) [+ residual])``: the post-norm modules' shared forward."""

    _normalized = "out_features"

    def _op(self, a: torch.Tensor, weight: torch.Tensor, eps: float, **addends) -> torch.Tensor:
        raise NotImplementedError

    def _residual(self, residual: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """``residual`` broadcast to ``shape`` (x's leading dims + [N], as ``linear(x) +
        residual`` broadcasts) and flattened to [M, N].

        Raises:
            TypeError: not a tensor.
            ValueError: it does not broadcast to ``shape``.
        """
        if not isinstance(residual, torch.Tensor):
            raise TypeError(f"{type(self).__name__}: residual must be a torch.Tensor or None, got "
                            f"{type(residual).__name__}")
        try:
            residual = residual.broadcast_to(shape)
        except RuntimeError:
            raise ValueError(f"{type(self).__name__}: residual of shape {tuple(residual.shape)} does not "
                             f"broadcast to x's leading dimensions + [N] = {shape}") from None
        return residual.reshape(-1, shape[-1])

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``norm(linear(x) + residual)`` (a post-LN block); ``residual`` [..., N] or None.
        The Linear bias and the residual are added inside the kernel, before the statistics."""
        _check_x(self, x)
        gemm_dtype, norm_dtype = _compute_dtypes(x, self.norm, "gemm", residual)
        lead, k = x.shape[:-1], x.shape[-1]
        n = self.linear.out_features
        eps = _eps(self.norm, norm_dtype)
        with torch.autocast(x.device.type, enabled=False):
            a = x.reshape(-1, k).to(gemm_dtype)
            weight = self.linear.weight.to(gemm_dtype).t()  # [K, N] view, read in place
            addends = {"linear_bias": self.linear.bias,
                       "residual": None if residual is None else self._residual(residual, (*lead, n))}
            y = self._op(a, weight, eps, **addends)
        return y.to(norm_dtype).reshape(*lead, n)


class LinearLayerNorm(_LinearNorm):
    """``norm(linear(x) [+ residual])`` with ``linear = nn.Linear(K, N)``, ``norm =
    nn.LayerNorm(N)``: the post-norm of a GEMM, fused where tuning measured it faster
    (technique 1).

    Args:
        in_features, out_features: K and N.
        bias: whether the Linear has a bias (added inside the kernel, before the norm).
        eps, elementwise_affine, norm_bias: as ``nn.LayerNorm``'s eps, elementwise_affine, bias.

    Shapes: ``x`` [..., K] -> [..., N].
    """

    _norm_type = nn.LayerNorm

    def __init__(self, in_features: int, out_features: int, bias: bool = True, eps: float = 1e-5,
                 elementwise_affine: bool = True, norm_bias: bool = True, device=None, dtype=None) -> None:
        super().__init__(*self._build(in_features, out_features, bias, device, dtype, eps=eps,
                                      elementwise_affine=elementwise_affine, bias=norm_bias))

    def _op(self, a, weight, eps, **addends):
        return matmul_layernorm(a, weight, self.norm.weight, self.norm.bias, eps, **addends)


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
        super().__init__(*self._build(in_features, out_features, bias, device, dtype, eps=eps,
                                      elementwise_affine=elementwise_affine))

    def _op(self, a, weight, eps, **addends):
        return matmul_rmsnorm(a, weight, self.norm.weight, eps, **addends)


class FlashNormAttention(nn.Module):
    """``rms(gdpa(ln(q), k, v) + ln(q)) + q`` over jagged sequences, in one forward kernel
    (:func:`~helion_kernels.flash_norm_attention`, technique 4 of the PyTorch blog "Towards
    Free Normalization", Meta 2026), with its backward.

    Holds the block's two norms as submodules ``ln`` (``nn.LayerNorm(H * D)``) and ``rms``
    (``nn.RMSNorm(H * D)``), so its state_dict keys are ``ln.weight``, ``ln.bias`` and
    ``rms.weight``; both norms use ``eps``.

    Args:
        num_heads, head_dim: H and D of ``q``, ``k``, ``v`` [total, H, D].
        eps: of both norms.
        activation: "fast_gelu", "gelu", "silu" or "relu" (GDPA's activation).
        qk_scale: multiplies the scores before the activation.
        elementwise_affine, ln_bias: as ``nn.LayerNorm``'s (``elementwise_affine`` also for
            the RMSNorm weight).

    Shapes: ``forward(q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv)``, ``q``
    [total_q, H, D], ``k``, ``v`` [total_kv, H, D], offsets int64 [B + 1]; returns
    [total_q, H, D] in ``q``'s dtype.
    """

    def __init__(self, num_heads: int, head_dim: int, eps: float = 1e-5, activation: str = "fast_gelu",
                 qk_scale: float = 1.0, elementwise_affine: bool = True, ln_bias: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        from .limits import ACTIVATIONS

        if not (isinstance(num_heads, int) and num_heads >= 1 and isinstance(head_dim, int) and head_dim >= 16):
            raise ValueError(f"FlashNormAttention: num_heads must be >= 1 and head_dim >= 16 (the smallest "
                             f"tensor-core dot), got {num_heads!r} and {head_dim!r}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"FlashNormAttention: activation must be one of {ACTIVATIONS}, got {activation!r}")
        if not eps >= 0:
            raise ValueError(f"FlashNormAttention: eps must be >= 0, got {eps!r}")
        width = num_heads * head_dim
        self.num_heads, self.head_dim = num_heads, head_dim
        self.eps, self.activation, self.qk_scale = eps, activation, qk_scale
        self.ln = nn.LayerNorm(width, eps=eps, elementwise_affine=elementwise_affine, bias=ln_bias,
                               device=device, dtype=dtype)
        self.rms = nn.RMSNorm(width, eps=eps, elementwise_affine=elementwise_affine, device=device, dtype=dtype)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_offsets: torch.Tensor,
                kv_offsets: torch.Tensor, max_seq_len_q: int, max_seq_len_kv: int, *,
                validate: bool = True) -> torch.Tensor:
        """See the class docstring and :func:`~helion_kernels.flash_norm_attention` (whose
        errors it raises).

        Raises:
            ValueError: ``q`` is not [total_q, num_heads, head_dim] of this module.
        """
        if isinstance(q, torch.Tensor) and (q.dim() != 3 or tuple(q.shape[1:]) != (self.num_heads, self.head_dim)):
            raise ValueError(f"FlashNormAttention: q must be [total_q, H, D] = [*, {self.num_heads}, "
                             f"{self.head_dim}] (the module's num_heads and head_dim), got {tuple(q.shape)}")
        return flash_norm_attention(q, k, v, q_offsets, kv_offsets, max_seq_len_q, max_seq_len_kv,
                                    self.ln.weight, self.ln.bias, self.rms.weight, self.eps, self.activation,
                                    self.qk_scale, validate=validate)

    def extra_repr(self) -> str:
        return (f"num_heads={self.num_heads}, head_dim={self.head_dim}, eps={self.eps}, "
                f"activation={self.activation!r}, qk_scale={self.qk_scale}")
