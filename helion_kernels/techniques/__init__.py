"""The techniques, one home each, and the one list the package's public names come from.

Each technique is a small folder: its ``__init__`` holds the public ops (custom op, fake,
autograd and backward formulas; no Helion import, so ``import helion_kernels`` stays fast)
and its ``kernels`` module the Helion kernels, fp32 references and :class:`~..spec.KernelSpec`
objects (Helion is imported by an op's first kernel launch). Adding a technique: a folder
here, an entry in :data:`TECHNIQUES`, its bench spec (:mod:`..bench_specs`), a config file
and workload table under ``configs/``, and its tests.
"""

from __future__ import annotations

import importlib
import warnings
from typing import NamedTuple

from .. import cpu_reference_mode
from ..spec import KernelSpec

cpu_reference_mode.install()  # a no-op unless HELION_INTERPRET is set: torch's CPU build lacks mm(out_dtype=)


class Technique(NamedTuple):
    module: str  # helion_kernels.techniques.<module>
    ops: tuple[str, ...]  # the public functions of the module
    kernels: dict[str, tuple[str, str, str]]  # tunable kernel -> (KernelSpec in .kernels, workload, one line)


TECHNIQUES: tuple[Technique, ...] = (
    Technique("gemm", ("matmul",), {
        "matmul": ("SPEC", "gemm", "plain Helion GEMM (the baseline of the blog's metric)")}),
    Technique("prenorm", ("rmsnorm_matmul", "fold_rmsnorm_weight", "layernorm_matmul", "add_rmsnorm_matmul",
                          "add_layernorm_matmul"), {
        "rmsnorm_matmul": ("SPEC", "gemm", "deferred pre-norm: rms_norm(a) @ b (technique 2)"),
        "rmsnorm_matmul_given_rstd": ("SPEC_GIVEN_RSTD", "gemm",
                                      "rmsnorm_matmul(..., rstd=), add_rmsnorm_matmul: the producer's rstd"),
        "rmsnorm_matmul_backward": ("SPEC_BACKWARD", "gemm",
                                    "rmsnorm_matmul's backward: the norm's backward in the dgrad GEMM"),
        "layernorm_matmul": ("SPEC_LAYERNORM", "gemm", "deferred pre-norm: layer_norm(a) @ b (technique 2)"),
        "layernorm_matmul_given_stats": ("SPEC_LAYERNORM_GIVEN", "gemm",
                                         "layernorm_matmul(..., mean=, rstd=), add_layernorm_matmul: the "
                                         "producer's statistics"),
        "layernorm_matmul_backward": ("SPEC_LAYERNORM_BACKWARD", "gemm",
                                      "the pre-LayerNorm backward: the norm's backward in the dgrad GEMM's "
                                      "epilogue, row terms from the forward's output")}),
    Technique("postnorm", ("matmul_layernorm", "matmul_rmsnorm"), {
        "matmul_layernorm": ("SPEC_LAYERNORM", "gemm",
                             "full-row post-norm: layer_norm(a @ b), N <= 2048, 1024 in fp32 (technique 1)"),
        "matmul_rmsnorm": ("SPEC_RMSNORM", "gemm",
                           "full-row post-norm: rms_norm(a @ b), N <= 2048, 1024 in fp32 (technique 1)")}),
    Technique("split_n", ("matmul_layernorm_split_n", "matmul_rmsnorm_split_n"), {
        "matmul_layernorm_split_n": ("SPEC_LAYERNORM", "gemm",
                                     "split-N post-norm (row sweep): layer_norm(a @ b), any N (technique 3)"),
        "matmul_rmsnorm_split_n": ("SPEC_RMSNORM", "gemm",
                                   "split-N post-norm (row sweep): rms_norm(a @ b), any N (technique 3)")}),
    Technique("deferred", ("matmul_rmsnorm_matmul",), {
        "matmul_rmsnorm_matmul": ("SPEC", "gemm",
                                  "rms_norm(a @ b) @ c, norm deferred to the next GEMM; tunes the first GEMM")}),
    Technique("attention", ("flash_norm_attention", "gdpa"), {
        "flash_norm_attention": ("SPEC", "attention", "FlashNormAttention on jagged GDPA (technique 4)"),
        "gdpa": ("SPEC_GDPA", "attention", "jagged GDPA alone (the attention of technique 4's unfused block)"),
        "gdpa_dq": ("SPEC_GDPA_DQ", "attention", "GDPA's backward, dq (gdpa's backward)"),
        "gdpa_dkdv": ("SPEC_GDPA_DKDV", "attention",
                      "GDPA's backward, dk and dv (gdpa and flash_norm_attention backward)"),
        "flash_norm_attention_dq": ("SPEC_FNA_DQ", "attention",
                                    "FlashNormAttention backward: both norms' backward fused into GDPA's dq "
                                    "(run where tuned faster than the norms apart)")}),
)


class CatalogEntry(NamedTuple):
    """Where a tunable kernel's spec lives, and what the CLI says of it without importing Helion."""

    module: str  # helion_kernels.techniques.<module>.kernels
    attr: str
    workload: str  # "gemm" or "attention": the workload tables it is tuned on
    technique: str
    public: bool  # the kernel of a public op of the same name (else one an op runs internally)


PUBLIC_OPS: dict[str, str] = {op: t.module for t in TECHNIQUES for op in t.ops}  # op -> technique
CATALOG: dict[str, CatalogEntry] = {
    name: CatalogEntry(f"{__name__}.{t.module}.kernels", attr, workload, text, name in PUBLIC_OPS)
    for t in TECHNIQUES for name, (attr, workload, text) in t.kernels.items()}

# Old --kernel / registry names, kept as aliases that warn.
DEPRECATED = {
    "matmul_layernorm_row_sweep": "matmul_layernorm_split_n",
    "matmul_rmsnorm_row_sweep": "matmul_rmsnorm_split_n",
}


def public_ops() -> dict:
    """The public functions by name (imports the technique modules: no Helion)."""
    return {op: getattr(importlib.import_module(f"{__name__}.{module}"), op) for op, module in PUBLIC_OPS.items()}


def canonical_name(name: str) -> str:
    """``name``, or the current name of a deprecated one (with a FutureWarning).

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    if name in DEPRECATED:
        new = DEPRECATED[name]
        warnings.warn(f"kernel name {name!r} is deprecated; it is now {new!r}", FutureWarning, stacklevel=2)
        return new
    if name not in CATALOG:
        raise ValueError(f"unknown kernel {name!r}; known kernels: {', '.join(sorted(CATALOG))}")
    return name


def get_spec(name: str) -> KernelSpec:
    """The spec of the kernel ``name`` (importing its kernel module, and Helion, on first use).

    Raises:
        ValueError: an unknown name, listing the known ones.
    """
    entry = CATALOG[canonical_name(name)]
    return getattr(importlib.import_module(entry.module), entry.attr)


__all__ = ["CATALOG", "DEPRECATED", "PUBLIC_OPS", "TECHNIQUES", "CatalogEntry", "Technique", "canonical_name",
           "get_spec", "public_ops"]
