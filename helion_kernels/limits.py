"""The kernels' hard limits, as data and arithmetic that need no Helion import.

The public ops check their inputs against these before anything launches, and the kernel
modules declare the same limits to Helion's autotuner; both read them from here.
"""

from __future__ import annotations

import functools

import torch

# FlashNormAttention holds a sequence's K/V in KV tiles of 16-128 rows: the short-KV regime
# of technique 4 (the unfused gdpa has no such limit).
MAX_SEQ_LEN_KV = 128

# GDPA activations; the kernels take the index into this tuple (a compile-time constant).
ACTIVATIONS = ("fast_gelu", "gelu", "silu", "relu")

# Shared memory per block (opt-in) assumed when no CUDA device is given: H100/H200
# (sm_90), 227 KiB = 232448 bytes.
DEFAULT_SHARED_MEMORY_PER_BLOCK = 232448
# The smallest full-row program: the minimum tile_m and tile_k of a dot, one stage.
MIN_TILE_M = 16
MIN_TILE_K = 16

SPLIT_N_HINT = (
    "use the split-N strategy (technique 3) for larger N: "
    "helion_kernels.matmul_layernorm_split_n / matmul_rmsnorm_split_n"
)


def shared_memory_per_block(device: torch.device | str | None) -> int:
    """``shared_memory_per_block_optin`` of a CUDA device (``None``: the current one when
    there is one); :data:`DEFAULT_SHARED_MEMORY_PER_BLOCK` on the CPU."""
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_shared_memory(device if device.index is not None else torch.device("cuda", torch.cuda.current_device()))
    return DEFAULT_SHARED_MEMORY_PER_BLOCK


@functools.lru_cache(maxsize=None)
def _cuda_shared_memory(device: torch.device) -> int:  # asked on every full-row call: cached
    return int(torch.cuda.get_device_properties(device).shared_memory_per_block_optin)


def full_row_shared_memory(stages: int, tile_m: int, tile_k: int, npad: int, itemsize: int) -> int:
    """Shared memory a full-row program is estimated to need: per pipeline stage an ``a``
    tile tile_m x tile_k and a ``b`` tile tile_k x Npad, plus the fp32 [tile_m, Npad] row
    tile staged for the epilogue's layout change."""
    return stages * (tile_m * tile_k + tile_k * npad) * itemsize + tile_m * npad * 4


def max_full_row_n(dtype: torch.dtype, device: torch.device | str | None = None) -> int:
    """The largest N the full-row strategy accepts for inputs of ``dtype`` on ``device``.

    One program owns whole output rows, so its N tile is ``Npad``, the next power of two
    of N. The smallest legal program (tile_m = 16, tile_k = 16, one pipeline stage) must
    fit in the shared memory of one block, which holds

    * the ``a`` tile: 16 * 16 * itemsize bytes,
    * the ``b`` tile: 16 * Npad * itemsize bytes,
    * the fp32 row tile [16, Npad] staged for the epilogue's layout change: 16 * Npad * 4,

    i.e. ``256 * itemsize + 16 * Npad * (itemsize + 4) <= smem``. The result is the
    largest power of two ``Npad`` that satisfies it (every N <= Npad pads to at most
    Npad). For bf16/fp16 with 232448 bytes: ``512 + 96 * Npad <= 232448`` gives 2048; for
    fp32, ``1024 + 128 * Npad <= 232448`` gives 1024.

    ``smem`` is :func:`shared_memory_per_block` of ``device``.
    """
    return _max_full_row_npad(dtype.itemsize, shared_memory_per_block(device))


@functools.lru_cache(maxsize=None)
def _max_full_row_npad(item: int, smem: int) -> int:  # asked on every full-row call: cached
    def need(npad: int) -> int:
        return full_row_shared_memory(1, MIN_TILE_M, MIN_TILE_K, npad, item)

    if need(1) > smem:
        raise ValueError(f"{smem} bytes of shared memory per block cannot hold even N = 1")
    npad = 1
    while need(2 * npad) <= smem:
        npad *= 2
    return npad


def check_full_row_n(
    n: int, dtype: torch.dtype, device: torch.device | str | None = None, op: str = "full-row post-norm"
) -> None:
    """Raise ValueError (its message starting with ``op``) when N is larger than the full-row
    strategy supports.

    Raises:
        ValueError: naming N, the limit :func:`max_full_row_n` and the alternative.
    """
    limit = max_full_row_n(dtype, device)
    if n > limit:
        raise ValueError(
            f"{op}: N = {n} is too large for the full-row post-norm fusion (technique 1): one "
            f"program must hold a whole output row, and for {dtype} on this device at most "
            f"N = {limit} fits in shared memory; {SPLIT_N_HINT}"
        )
