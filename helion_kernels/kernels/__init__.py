"""One module per fusion strategy; each exposes a :class:`~.spec.KernelSpec` named SPEC."""

from __future__ import annotations

from . import matmul, postnorm_full_row, postnorm_row_sweep, postnorm_split_n, rmsnorm_matmul
from .spec import KernelSpec, Shape

SPECS: dict[str, KernelSpec] = {
    spec.name: spec
    for spec in (matmul.SPEC, rmsnorm_matmul.SPEC, postnorm_full_row.SPEC_LAYERNORM,
                 postnorm_full_row.SPEC_RMSNORM, postnorm_split_n.SPEC_LAYERNORM,
                 postnorm_split_n.SPEC_RMSNORM, postnorm_row_sweep.SPEC_LAYERNORM,
                 postnorm_row_sweep.SPEC_RMSNORM)
}


def get_spec(name: str) -> KernelSpec:
    """The spec registered under ``name``; ValueError listing the known names otherwise."""
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(
            f"unknown kernel {name!r}; known kernels: {', '.join(sorted(SPECS))}"
        ) from None


__all__ = ["SPECS", "KernelSpec", "Shape", "get_spec"]
