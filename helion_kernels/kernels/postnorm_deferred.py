"""Deferred post-norm: ``rms_norm(a @ b, w) @ c`` without ever normalising ``a @ b``.

Candidate 3 of the split-N post-norm (technique 3 of the PyTorch blog "Towards Free
Normalization: Fusing Normalization into GEMM and Attention Kernels", Meta, July 2026), for
the Linear -> RMSNorm -> Linear pattern. When the norm's only consumer is the next GEMM, the
deferred pre-norm identity (technique 2, :mod:`.rmsnorm_matmul`) moves the normalisation
past it::

    rms_norm(x, w) @ c == rstd[:, None] * (x @ (w[:, None] * c)),   x = a @ b

and ``rstd`` comes from the split-N partials the producer GEMM already writes:

1. producer: :func:`matmul_rmsnorm_partials_kernel` writes ``x = a @ b`` un-normalised (any N, its own N tiling) and per-row, per-N-tile sums of
   squares [M, T];
2. consumer: :func:`rmsnorm_scaled_matmul_kernel`, a plain GEMM on ``x`` and the folded
   ``w[:, None] * c`` whose epilogue sums a row's T partials and scales the accumulator by
   ``rstd``.

Against cuBLAS GEMM -> standalone RMSNorm -> cuBLAS GEMM this drops the norm's whole pass
(a read and a write of [M, N]); what is added is the partials (T floats per row) and the
fold of ``w`` into ``c`` (once per weight update). No load feeds both an MMA and a
reduction (the Hopper hazard of :mod:`.rmsnorm_matmul`): the consumer's only extra load is
the [tile_m, T] partials block in its epilogue. The normalised activations never exist, so
this applies only when nothing else (a residual, a second consumer) reads them.
LayerNorm's version needs the tile centred per N tile (as the split-N LayerNorm stores it)
and a rank-T correction in the consumer's epilogue; not written yet.

Configs: the producer's tiling is this op's registry entry at (M, K, N) (:data:`SPEC`, tuned
with ``helion-kernels autotune --kernel matmul_rmsnorm_matmul``; the shipped H200 entries
are the phase-1 tilings tuned for the persistent split-N kernel, which this producer ran
with when it was measured); the consumer's is the plain ``matmul`` entry at (M, N, N2)
(:func:`consumer_config_for`). The entry also records whether the whole op (both kernels,
timed at N2 = K) beat cuBLAS -> compiled RMSNorm -> cuBLAS there (:data:`SPEC`'s
``dispatch_fused`` and ``dispatch_baseline``); the public op follows that decision.
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch
import torch.nn.functional as F

from .. import registry
from ..spec import (
    KernelSpec,
    Shape,
    gemm_flops,
    gemm_min_bytes,
    gemm_shape,
    random_gemm_operands,
    reference_dtype,
)

__all__ = [
    "CONSUMER_DEFAULT_CONFIG",
    "SPEC",
    "consumer_config",
    "consumer_config_for",
    "matmul_rmsnorm_matmul_reference",
    "matmul_rmsnorm_partials_kernel",
    "rmsnorm_scaled_matmul_kernel",
]


@helion.kernel(static_shapes=True)
def matmul_rmsnorm_partials_kernel(
    a: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The producer: (x = ``a @ b`` [M, N] in ``a.dtype``, partial sums of squares [M, T]
    fp32 of x's T = cdiv(N, tile_n) column tiles). Config ``block_sizes`` = [tile_n, tile_m,
    tile_k]."""
    m, k = a.size()
    n = hl.specialize(b.size(1))
    block_n = hl.register_block_size(helion.next_power_of_2(n))
    c = torch.empty([m, n], dtype=a.dtype, device=a.device)
    partials = torch.empty([m, helion.cdiv(n, block_n)], dtype=torch.float32, device=a.device)
    for tile_m, tile_n in hl.tile([m, n], block_size=[None, block_n]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = torch.addmm(acc, a[tile_m, tile_k], b[tile_k, tile_n])
        c[tile_m, tile_n] = acc.to(c.dtype)
        partials[tile_m, tile_n.id] = torch.sum(acc * acc, dim=1)  # padded columns are 0
    return c, partials


@helion.kernel(static_shapes=True)
def rmsnorm_scaled_matmul_kernel(
    x: torch.Tensor, c: torch.Tensor, partials: torch.Tensor, eps: float
) -> torch.Tensor:
    """``rms_norm(x) @ c`` as ``rstd[:, None] * (x @ c)``, ``rstd`` from split-N partials.

    Args:
        x: [M, N] un-normalised activations (the producer GEMM's output).
        c: [N, N2] consumer weight, the RMSNorm weight already folded in.
        partials: [M, T] fp32, row sums of squares of x's T column tiles (their sum over T
            is the row's sum of squares over N).
        eps: added to the mean square.

    Returns [M, N2] in ``x.dtype``. Config ``block_sizes`` = [tile_m, tile_n, tile_k], the
    layout of :func:`.matmul.matmul_kernel`.
    """
    m, n = x.size()
    n2 = c.size(1)
    out = torch.empty([m, n2], dtype=x.dtype, device=x.device)
    for tile_m, tile_n in hl.tile([m, n2]):
        acc = hl.zeros([tile_m, tile_n], dtype=torch.float32)
        for tile_k in hl.tile(n):
            acc = torch.addmm(acc, x[tile_m, tile_k], c[tile_k, tile_n])
        rstd = torch.rsqrt(torch.sum(partials[tile_m, :], dim=1) / n + eps)
        out[tile_m, tile_n] = (acc * rstd[:, None]).to(out.dtype)
    return out


# A GEMM tiling without TMA, so it fits any shape; the registry's `matmul` entries are used
# when the consumer's shape has one (only their tiling, warps and stages carry over).
CONSUMER_DEFAULT_CONFIG = helion.Config(block_sizes=[128, 128, 64], num_warps=8, num_stages=3)


def consumer_config(matmul_config: dict | None) -> helion.Config:
    """The consumer's config from a ``matmul`` registry config (its JSON dict): the tiling,
    warps and stages carry over (the consumer's epilogue has its own loads, so TMA and L2
    grouping settings of the plain GEMM are not reused); None: :data:`CONSUMER_DEFAULT_CONFIG`."""
    if matmul_config is None:
        return CONSUMER_DEFAULT_CONFIG
    return helion.Config(**{key: matmul_config[key] for key in ("block_sizes", "num_warps", "num_stages")
                            if key in matmul_config})


def consumer_config_for(m: int, n: int, n2: int, dtype: torch.dtype, device: torch.device) -> helion.Config:
    """The consumer's config for a call at (M, N, N2): :func:`consumer_config` of the
    ``matmul`` registry entry at that shape, or the nearest (with the registry's warning)."""
    found = registry.lookup("matmul", Shape(m, n, n2), dtype, registry.gpu_key(device))
    return consumer_config(None if found.entry is None else found.entry.config)


def matmul_rmsnorm_matmul_reference(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``rms_norm(a @ b, (N,), weight, eps) @ c`` in fp32 (float64 stays float64)."""
    dt = reference_dtype(a.dtype)
    x = a.to(dt) @ b.to(dt)
    y = F.rms_norm(x, (x.shape[1],), None if weight is None else weight.to(dt), eps)
    return y @ c.to(dt)


def producer_reference(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a @ b`` and its row sums of squares in fp32 (float64 stays float64): what the
    producer's outputs give once its partials are summed over the tiles."""
    x = a.to(reference_dtype(a.dtype)) @ b.to(reference_dtype(a.dtype))
    return x, x.pow(2).sum(dim=1)


def _sum_partials(outputs: tuple) -> tuple:
    """The producer's (x, partials [M, T]) as (x, row sums of squares [M])."""
    x, partials = outputs
    return x, partials.sum(dim=1)


def _make_args(shape: Shape, dtype: torch.dtype, device, seed: int | None) -> tuple:
    return random_gemm_operands(shape, dtype, device, seed)


EPS = 1e-5


def dispatch_weight(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The second weight ``c`` [N, N2 = K] with which the fused and unfused ops are timed for
    the dispatch decision (the block Linear K -> N, RMSNorm over N, Linear N -> K, as in
    ``bench/postnorm_deferred.py``): N(0, 1/N), drawn from a fixed seed on ``a``'s device."""
    n, k = b.shape[1], a.shape[1]
    gen = torch.Generator(device=a.device).manual_seed(0)
    return (torch.randn(n, k, generator=gen, device=a.device) * n**-0.5).to(a.dtype)


def _baselines(a: torch.Tensor, b: torch.Tensor) -> dict:
    """The cuBLAS GEMM (the producer's unfused twin) and the whole unfused op the dispatch
    decision times: cuBLAS, the compiled RMSNorm, cuBLAS (the weight folded into ``c``)."""
    c, n = dispatch_weight(a, b), b.shape[1]
    norm = torch.compile(lambda x: F.rms_norm(x, (n,), eps=EPS), dynamic=False)
    return {"cublas_mm": lambda: torch.mm(a, b),
            "cublas+inductor_norm+cublas": lambda: torch.mm(norm(torch.mm(a, b)), c)}


def _dispatch_fused(run, args: tuple):
    """The whole fused op for the dispatch decision: the producer (``run``, the config being
    tuned), then the consumer on its ``matmul`` registry config at (M, N, N2 = K)."""
    a, b = args
    c = dispatch_weight(a, b)
    x, partials = run(a, b)
    # a kernel object of its own, so the op's cached launches keep their configs
    consumer = helion.kernel(rmsnorm_scaled_matmul_kernel.fn, static_shapes=True).bind((x, c, partials, EPS))
    consumer.set_config(consumer_config_for(a.shape[0], b.shape[1], c.shape[1], a.dtype, a.device))

    def fused_op():
        x, partials = run(a, b)
        return consumer(x, c, partials, EPS)
    return fused_op


# Phase-1 tilings of the split-N kernels ([tile_n, tile_m, tile_k]).
_SEEDS = tuple(
    helion.Config(block_sizes=[tn, tm, 64], num_warps=w, num_stages=st, indexing=ix, pid_type=pid)
    for tn, tm, w, st, ix, pid in ((256, 128, 8, 4, "pointer", "flat"), (128, 128, 4, 4, "pointer", "flat"),
                                   (128, 128, 8, 3, "tensor_descriptor", "flat"), (128, 64, 4, 4, "pointer", "flat"),
                                   (256, 128, 8, 3, "tensor_descriptor", "persistent_interleaved"))
)

# The producer GEMM, tuned and registered under the op's name at (M, K, N). Tuning also times
# the whole op (both GEMMs, at N2 = K) against cuBLAS -> compiled norm -> cuBLAS and records
# the faster in the entry, which the public op follows; the benchmark of the whole op with
# Liger's norm too is bench/postnorm_deferred.py.
SPEC = KernelSpec(
    name="matmul_rmsnorm_matmul",
    kernel=matmul_rmsnorm_partials_kernel,
    workload="gemm",
    make_args=_make_args,
    key_of=gemm_shape,
    reference=producer_reference,
    flops=gemm_flops,
    min_bytes=gemm_min_bytes,
    default_config=helion.Config(block_sizes=[64, 64, 32], num_warps=4, num_stages=2),
    seed_configs=_SEEDS,
    baselines=_baselines,
    unfused_baselines=("cublas_mm",),
    technique=("the first GEMM of rms_norm(a @ b) @ c with per-tile sums of squares (split-N "
               "candidate 3, technique 3, PyTorch blog 'Towards Free Normalization', 2026)"),
    gemm_twin="matmul",
    compare_outputs=_sum_partials,
    dispatch_baseline="cublas+inductor_norm+cublas",
    dispatch_fused=_dispatch_fused,
)
