"""One module per fusion strategy; each exposes a :class:`~.spec.KernelSpec` named SPEC."""

from __future__ import annotations

from . import matmul, rmsnorm_matmul
from .spec import KernelSpec, Shape

SPECS: dict[str, KernelSpec] = {m.SPEC.name: m.SPEC for m in (matmul, rmsnorm_matmul)}


def get_spec(name: str) -> KernelSpec:
    """The spec registered under ``name``; ValueError listing the known names otherwise."""
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(
            f"unknown kernel {name!r}; known kernels: {', '.join(sorted(SPECS))}"
        ) from None


__all__ = ["SPECS", "KernelSpec", "Shape", "get_spec"]
