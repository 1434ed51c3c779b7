"""Helion kernels, one module per fusion strategy, each beside its fp32 reference.

Every kernel a public op tunes is described by a :class:`~helion_kernels.spec.KernelSpec`
under the op's name. This package's ``__init__`` imports none of the kernel modules
(``import helion`` takes seconds): :func:`get_spec` imports the one asked for.
"""

from __future__ import annotations

import importlib
import warnings
from typing import NamedTuple

from ..spec import KernelSpec
from . import cpu_reference_mode

cpu_reference_mode.install()  # a no-op unless HELION_INTERPRET is set

class CatalogEntry(NamedTuple):
    """Where an op's spec lives, and what the CLI says of it without importing Helion."""

    module: str  # under helion_kernels.kernels
    attr: str  # the KernelSpec's name in that module
    workload: str  # "gemm" or "attention": the workload tables it is tuned on
    technique: str


# op / registry / --kernel name -> its catalog entry
CATALOG: dict[str, CatalogEntry] = {name: CatalogEntry(*entry) for name, entry in {
    "matmul": ("matmul", "SPEC", "gemm", "plain Helion GEMM (the baseline of the blog's metric)"),
    "rmsnorm_matmul": ("rmsnorm_matmul", "SPEC", "gemm", "deferred pre-norm: rms_norm(a) @ b (technique 2)"),
    "rmsnorm_matmul_given_rstd": ("rmsnorm_matmul", "SPEC_GIVEN_RSTD", "gemm",
                                  "deferred pre-norm on the producer's rstd: (a @ b) * rstd (rmsnorm_matmul(..., rstd=))"),
    "rmsnorm_matmul_backward": ("rmsnorm_matmul_backward", "SPEC", "gemm",
                                "backward of rmsnorm_matmul: the norm's backward in the dgrad GEMM's epilogue"),
    "matmul_layernorm": ("postnorm_full_row", "SPEC_LAYERNORM", "gemm",
                         "full-row post-norm: layer_norm(a @ b), N <= 2048, 1024 in fp32 (technique 1)"),
    "matmul_rmsnorm": ("postnorm_full_row", "SPEC_RMSNORM", "gemm",
                       "full-row post-norm: rms_norm(a @ b), N <= 2048, 1024 in fp32 (technique 1)"),
    "matmul_layernorm_split_n": ("postnorm_split_n", "SPEC_LAYERNORM", "gemm",
                                 "split-N post-norm (row sweep): layer_norm(a @ b), any N (technique 3)"),
    "matmul_rmsnorm_split_n": ("postnorm_split_n", "SPEC_RMSNORM", "gemm",
                               "split-N post-norm (row sweep): rms_norm(a @ b), any N (technique 3)"),
    "matmul_rmsnorm_matmul": ("postnorm_deferred", "SPEC", "gemm",
                              "rms_norm(a @ b) @ c, norm deferred to the next GEMM; tunes the first GEMM"),
    "flash_norm_attention": ("flash_norm_attention", "SPEC", "attention",
                             "FlashNormAttention on jagged GDPA (technique 4)"),
}.items()}

# Old --kernel / registry names, kept as aliases that warn.
DEPRECATED = {
    "matmul_layernorm_row_sweep": "matmul_layernorm_split_n",
    "matmul_rmsnorm_row_sweep": "matmul_rmsnorm_split_n",
}


def canonical_name(name: str) -> str:
    """``name``, or the current name of a deprecated one (with a FutureWarning).

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    if name in DEPRECATED:
        new = DEPRECATED[name]
        # FutureWarning: shown by default (a DeprecationWarning is hidden outside __main__).
        warnings.warn(f"kernel name {name!r} is deprecated; it is now {new!r}", FutureWarning, stacklevel=2)
        return new
    if name not in CATALOG:
        raise ValueError(f"unknown kernel {name!r}; known kernels: {', '.join(sorted(CATALOG))}")
    return name


def get_spec(name: str) -> KernelSpec:
    """The spec of the op ``name`` (importing its kernel module, and Helion, on first use).

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    entry = CATALOG[canonical_name(name)]
    return getattr(importlib.import_module(f"{__name__}.{entry.module}"), entry.attr)


__all__ = ["CATALOG", "DEPRECATED", "CatalogEntry", "canonical_name", "get_spec"]
