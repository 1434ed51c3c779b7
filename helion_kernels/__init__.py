"""helion-kernels: autotuned Helion kernels that fuse normalization into the GEMM beside it.

Public API::

    from helion_kernels import rmsnorm_matmul, matmul, fold_rmsnorm_weight
    from helion_kernels import matmul_layernorm, matmul_rmsnorm
    from helion_kernels import matmul_layernorm_split_n, matmul_rmsnorm_split_n  # large N
    from helion_kernels import matmul_rmsnorm_matmul  # rms_norm(a @ b) @ c, norm deferred
    from helion_kernels import gdpa, flash_norm_attention  # jagged attention

Each kernel reads its tuned config from the committed registry under ``configs/``; see the
README for tuning (``helion-kernels autotune``) and benchmarking (``helion-kernels bench``).
"""

from .kernels.rmsnorm_matmul import fold_rmsnorm_weight
from .ops import (
    flash_norm_attention,
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
