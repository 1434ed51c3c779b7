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

The names come from :data:`.techniques.TECHNIQUES` and :data:`.modules.__all__`. Importing
the package does not import Helion (an op's first kernel launch does). Configs come from the
registry (:mod:`.registry`); ``helion-kernels autotune`` tunes your own shapes.
"""

from . import modules as _modules
from .techniques import public_ops as _public_ops

globals().update(_public_ops())
globals().update({name: getattr(_modules, name) for name in _modules.__all__})

__all__ = sorted([*_public_ops(), *_modules.__all__])
