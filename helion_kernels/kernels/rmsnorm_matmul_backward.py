"""Backward of the deferred pre-norm ``c = rmsnorm(a) @ b``: the dgrad GEMM with the whole
RMSNorm backward in its epilogue.

With ``x_hat = a * rstd[:, None]`` (``rstd`` saved by the forward, fp32) and ``b`` the GEMM's
right operand (an RMSNorm weight already folded into it), the gradients are

    dx_hat = dc @ b^T                                   [M, K], the dgrad GEMM
    da     = rstd * (dx_hat - x_hat * s / K),   s = sum_k dx_hat * x_hat   (per row)
    db     = x_hat^T @ dc                               [K, N], the wgrad GEMM

The unfused backward writes ``dx_hat`` to memory and runs a norm-backward pass that reads it
and ``a`` back and writes ``da`` (and ``x_hat`` for the wgrad). Here one program owns a block
of ``tile_m`` rows, as in the forward kernel (:mod:`.rmsnorm_matmul`): it walks the K tiles,
each a GEMM over N, and in each epilogue accumulates the row sum ``s`` from the fp32
accumulator and the ``a`` tile, and writes ``dx_hat`` into ``da``'s storage and ``x_hat``
(the wgrad's operand). A second loop over the same rows' K tiles, which this program has
just written (L2 hits), applies ``rstd * (dx_hat - x_hat * s / K)`` in place. ``s`` never
needs a full-row tile over K and no load feeds both the MMA and a reduction (the Hopper
hazard described in :mod:`.rmsnorm_matmul`). The wgrad is cuBLAS on ``x_hat``
(``torch.mm``: it splits the long M reduction across the GPU, which a tile-per-output GEMM
cannot at K x N = 512 x 512).

The blog's identity ``s = sum_n dc * c`` (expand ``c = x_hat @ b``) would compute ``s`` from
the forward's output instead; it needs ``c`` kept alive for the backward and a pass over
``dc`` and ``c`` before the GEMM, where the row-block order gets ``s`` from the accumulator
for free.

Config ``block_sizes`` = [tile_m, tile_k of the dgrad GEMM, tile_n of its N loop, tile_k of
the fix-up loop].
"""

from __future__ import annotations

import helion
import helion.language as hl
import torch

from .. import grads
from ..spec import KernelSpec, Shape, gemm_flops, gemm_shape, random_gemm_operands, reference_dtype

EPS = 1e-5


@helion.kernel(static_shapes=True)
def rmsnorm_matmul_dgrad_kernel(
    a: torch.Tensor, b: torch.Tensor, dc: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(da [M, K], x_hat [M, K]), both in ``a.dtype``, of ``c = (a * rstd[:, None]) @ b``
    for the output gradient ``dc`` [M, N]; fp32 accumulation and row sums."""
    m, k = a.size()
    n = b.size(1)
    da = torch.empty_like(a)
    x_hat = torch.empty_like(a)
    for tile_m in hl.tile(m):
        row_rstd = rstd[tile_m]
        s = hl.zeros([tile_m], dtype=torch.float32)
        for tile_k in hl.tile(k):
            acc = hl.zeros([tile_m, tile_k], dtype=torch.float32)
            for tile_n in hl.tile(n):
                acc = torch.addmm(acc, dc[tile_m, tile_n], b[tile_k, tile_n].T)
            xh = a[tile_m, tile_k].to(torch.float32) * row_rstd[:, None]
            s = s + torch.sum(acc * xh, dim=1)
            da[tile_m, tile_k] = acc.to(da.dtype)  # dx_hat for now; fixed up below
            x_hat[tile_m, tile_k] = xh.to(x_hat.dtype)
        mean_dot = s / k
        for tile_k in hl.tile(k):
            dxh = da[tile_m, tile_k].to(torch.float32)
            xh = a[tile_m, tile_k].to(torch.float32) * row_rstd[:, None]
            da[tile_m, tile_k] = (row_rstd[:, None] * (dxh - xh * mean_dot[:, None])).to(da.dtype)
    return da, x_hat


def rmsnorm_matmul_dgrad_reference(
    a: torch.Tensor, b: torch.Tensor, dc: torch.Tensor, rstd: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(da, x_hat) of the kernel in fp32 (float64 stays float64), from the same formula."""
    dt = reference_dtype(a.dtype)
    x_hat = a.to(dt) * rstd.to(dt)[:, None]
    dx_hat = dc.to(dt) @ b.to(dt).t()
    s = (dx_hat * x_hat).mean(dim=1, keepdim=True)
    return rstd.to(dt)[:, None] * (dx_hat - x_hat * s), x_hat


def _make_args(shape: Shape, dtype: torch.dtype, device, seed: int | None) -> tuple:
    """(a, b, dc, rstd): the forward's operands, a unit-variance output gradient and the
    forward's rstd."""
    a, b = random_gemm_operands(shape, dtype, device, seed)
    if seed is None:
        return a, b, a.new_empty(shape.M, shape.N), torch.empty(shape.M, dtype=torch.float32, device=a.device)
    gen = torch.Generator(device=a.device).manual_seed(seed + 1)
    dc = torch.randn(shape.M, shape.N, generator=gen, device=a.device, dtype=torch.float32).to(dtype)
    rstd = torch.rsqrt(a.to(reference_dtype(dtype)).pow(2).mean(dim=1) + EPS).float()
    return a, b, dc, rstd


def _baselines(a: torch.Tensor, b: torch.Tensor, dc: torch.Tensor, rstd: torch.Tensor) -> dict:
    dx_hat = torch.mm(dc, b.t())
    return {
        "cublas_mm": lambda: torch.mm(dc, b.t()),
        "inductor_norm_backward": lambda: grads.run_compiled(grads.prenorm_norm_backward, dx_hat, a, rstd),
        "cublas+inductor_norm_backward": lambda: grads.rmsnorm_matmul_dgrad(a, b, dc, rstd),
    }


def _min_bytes(shape: Shape, dtype: torch.dtype) -> int:
    """Read ``a``, ``b``, ``dc`` and ``rstd`` once; write ``da`` and ``x_hat`` once."""
    return dtype.itemsize * (3 * shape.M * shape.K + shape.K * shape.N + shape.M * shape.N) + 4 * shape.M


def _config(tm: int, tk: int, tn: int, warps: int, stages: int, indexing: str = "pointer",
            pid_type: str = "flat") -> helion.Config:
    return helion.Config(block_sizes=[tm, tk, tn, 128], num_warps=warps, num_stages=stages, indexing=indexing,
                         pid_type=pid_type)


SPEC = KernelSpec(
    name="rmsnorm_matmul_backward",
    kernel=rmsnorm_matmul_dgrad_kernel,
    workload="gemm",
    make_args=_make_args,
    key_of=gemm_shape,
    reference=rmsnorm_matmul_dgrad_reference,
    flops=gemm_flops,
    min_bytes=_min_bytes,
    default_config=helion.Config(block_sizes=[64, 64, 64, 64], num_warps=4, num_stages=2),
    seed_configs=(
        _config(128, 128, 64, 8, 3),
        _config(128, 256, 64, 8, 3),
        _config(128, 128, 64, 8, 3, "tensor_descriptor"),
        _config(64, 128, 64, 4, 4),
        _config(64, 256, 64, 8, 3),
        _config(128, 256, 64, 8, 3, "tensor_descriptor", "persistent_interleaved"),
    ),
    baselines=_baselines,
    unfused_baselines=("cublas+inductor_norm_backward",),
    technique="backward of the deferred pre-norm: the RMSNorm backward in the dgrad GEMM's epilogue",
    norm_baseline="inductor_norm_backward",
    dispatch_baseline="cublas+inductor_norm_backward",
)
