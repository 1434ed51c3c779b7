"""helion-kernels: autotuned Helion kernels that fuse normalization into the GEMM or
attention beside it (the techniques of the PyTorch blog "Towards Free Normalization",
Meta, 2026).

Public API (each op a ``torch.library`` custom op, usable under ``torch.compile``)::

    from helion_kernels import rmsnorm_matmul, fold_rmsnorm_weight   # pre-norm
    from helion_kernels import matmul_layernorm, matmul_rmsnorm        # post-norm, N <= 2048
    from helion_kernels import matmul_layernorm_split_n, matmul_rmsnorm_split_n  # any N
    from helion_kernels import matmul_rmsnorm_matmul   # rms_norm(a @ b) @ c, norm deferred
    from helion_kernels import gdpa, flash_norm_attention   # jagged attention
    from helion_kernels import matmul                   # the plain Helion GEMM
    from helion_kernels import RMSNormLinear, LinearLayerNorm, LinearRMSNorm  # nn.Module drop-ins
    from helion_kernels import FlashNormAttention       # the attention block as a module

Importing the package does not import Helion: each kernel module (and Helion) is imported
by the first call that needs it. Configs come from the registry (:mod:`.registry`); the
README says how to tune your own shapes (``helion-kernels autotune``).
"""

from .modules import FlashNormAttention, LinearLayerNorm, LinearRMSNorm, RMSNormLinear
from .ops import (
    flash_norm_attention,
    fold_rmsnorm_weight,
    gdpa,
    matmul,
    matmul_layernorm,
    matmul_layernorm_split_n,
    matmul_rmsnorm,
    matmul_rmsnorm_matmul,
    matmul_rmsnorm_split_n,
    rmsnorm_matmul,
)

__all__ = [
    "FlashNormAttention",
    "LinearLayerNorm",
    "LinearRMSNorm",
    "RMSNormLinear",
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
