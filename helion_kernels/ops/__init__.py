"""The public ops, one module per technique. Each validates its inputs (:mod:`..checks`),
is a ``torch.library`` custom op under the ``helion_kernels`` namespace (:mod:`._op`), and
launches its kernel through :mod:`..runtime`."""

from .attention import flash_norm_attention, gdpa
from .gemm import matmul
from .postnorm import matmul_layernorm, matmul_rmsnorm
from .prenorm import fold_rmsnorm_weight, rmsnorm_matmul
from .split_n import matmul_layernorm_split_n, matmul_rmsnorm_matmul, matmul_rmsnorm_split_n

__all__ = [
    "flash_norm_attention",
    "fold_rmsnorm_weight",
    "gdpa",
    "matmul",
    "matmul_layernorm",
    "matmul_layernorm_split_n",
    "matmul_rmsnorm",
    "matmul_rmsnorm_matmul",
    "matmul_rmsnorm_split_n",
    "rmsnorm_matmul",
]
