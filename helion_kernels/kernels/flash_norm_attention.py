"""FlashNormAttention (forward): GDPA with LayerNorm on Q, RMSNorm on the output and both
residuals, in one kernel.

Technique 4 of the PyTorch blog "Towards Free Normalization: Fusing Normalization into
GEMM and Attention Kernels" (Meta, July 2026). For jagged sequences (offsets as in
:mod:`.gdpa`) and per Q row of width H*D::

    ln_q = layer_norm(q, (H*D,), ln_weight, ln_bias, eps)
    o    = act(ln_q_h @ k_h^T * qk_scale) @ v_h + ln_q_h        for every head h
    out  = rms_norm(o, (H*D,), rms_weight, eps) + q

Unfused, that is a LayerNorm pass, the attention, a residual add, an RMSNorm pass and a
second residual add, each a round trip of [total_q, H, D] through memory. Here one program
owns a tile of Q rows of one sequence for all heads, so both norms over H*D stay inside the
program: ``q`` is read from memory once and ``out`` written once (plus re-reads of ``q`` and
of the program's own fresh writes from L1/L2). Programs run per (Q tile, sequence), up to
``max_seq_len_q`` rows per sequence: the caller guarantees that bound.

:func:`flash_norm_attention_kernel` walks the heads with 2-D dots, writes each head's
un-normalised ``o_h`` and, once the RMSNorm statistic over all heads is known, re-reads and
rescales it. (An all-heads variant that holds the [tile_q, H*D] tile in registers and runs
batched 3-D dots, ``bench/variants/flash_norm_attention_all_heads.py``, limits Q tiles to
16-32 rows at H*D = 1024 and measured slower on the H200:
``bench/results/nvidia_h200_sm90/flash_norm_attention_configs_*.md``.)

The sequence's K and V (at most :data:`MAX_SEQ_LEN_KV` = 128 rows, the regime of the
technique and the hard limit declared here) are walked in KV tiles of a registered block
size between 16 and 128 rows; the programs of one sequence run next to each other, so K/V
come from L2 after the first. (Holding a whole 128-row sequence for all heads does not fit in
one block's shared memory once H*D >= 512: the first H200 run of the all-heads kernel with a
fixed 128-row tile needed 278528 bytes against 232448.) Longer KV sequences are refused
before launch (the unfused :func:`~helion_kernels.gdpa` has no such limit).
"""

from __future__ import annotations

import functools

import helion
import helion.language as hl
import torch
import torch.nn.functional as F

from ..spec import AttentionRow, AttentionShape, KernelSpec
from .gdpa import activation_fn, apply_activation, gdpa_kernel, gdpa_reference, random_jagged_inputs
from .limits import ACTIVATIONS, MAX_SEQ_LEN_KV

__all__ = [
    "DEFAULT_CONFIG",
    "SEED_CONFIGS",
    "SPEC",
    "flash_norm_attention_kernel",
    "flash_norm_attention_reference",
    "norm_block",
    "unfused_block",
]


@helion.kernel(static_shapes=False)
def flash_norm_attention_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_seq_len_q: int,
    ln_weight: torch.Tensor | None,
    ln_bias: torch.Tensor | None,
    rms_weight: torch.Tensor | None,
    eps: float,
    qk_scale: float,
    activation: int,
    o_saved: torch.Tensor | None = None,
    stats: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out`` [total_q, H, D] in ``q.dtype``, one head at a time with 2-D dots. Affine
    parameters are [H, D] (or None); ``activation`` indexes :data:`ACTIVATIONS`; rows past
    ``max_seq_len_q`` in a sequence are not computed. For a backward, the optional
    ``o_saved`` [total_q, H, D] receives the un-normalised ``o`` (in ``q.dtype``, as the
    RMSNorm saw it) and ``stats`` [3, total_q] fp32 the LayerNorm mean and rstd and the
    RMSNorm rstd of each row.

    Per Q tile: two loops over heads for the LayerNorm statistics over H*D (``q`` is
    re-read from L1/L2); a third computes each head's ``o_h = act(ln_h k_h^T) v_h + ln_h``,
    adds ``sum(o_h**2)`` to the row's RMSNorm statistic and writes ``o_h`` to ``out``
    un-normalised; a fourth loop re-reads each ``o_h`` (still in L1/L2: the program wrote it
    a moment ago) and writes ``o_h * rstd * w_h + q_h``. Helion puts a block-wide barrier
    (``tl.debug_barrier()``) between the write and the re-read of ``out``, which may map
    elements to other threads; a test checks that it is in the generated code. So no
    [tile_q, H*D] tile is held, the attention runs once, and ``o`` is rounded to the output
    dtype once before the RMSNorm scale (the unfused block also rounds the attention output
    and ln_q first). Config ``block_sizes`` = [tile_kv (16 to 128), tile_q (16 to 128)].
    """
    num_heads = hl.specialize(q.size(1))
    head_dim = hl.specialize(q.size(2))
    act = hl.specialize(activation)
    width = num_heads * head_dim
    block_kv = hl.register_block_size(16, MAX_SEQ_LEN_KV)
    block_q = hl.register_block_size(16, 128)
    batch = q_offsets.size(0) - 1
    out = torch.empty_like(q)
    for q_block, seq in hl.grid([(max_seq_len_q + block_q - 1) // block_q, batch]):
        # A head_dim that is not a power of two is padded to one in registers; the padded
        # lanes load as 0, but (q - mean) and the LayerNorm output are not 0 there: mask them.
        in_lane = (hl.arange(head_dim) < head_dim)[None, :]
        q_end = q_offsets[seq + 1]
        begin = q_offsets[seq] + q_block * block_q
        kv_start = kv_offsets[seq]
        kv_end = kv_offsets[seq + 1]
        for tile_q in hl.tile(begin, torch.minimum(begin + block_q, q_end), block_size=block_q):
            row_sum = hl.zeros([tile_q], dtype=torch.float32)
            for h in hl.grid(num_heads):
                row_sum = row_sum + torch.sum(q[tile_q, h, :].to(torch.float32), dim=1)
            mean = row_sum / width
            row_m2 = hl.zeros([tile_q], dtype=torch.float32)
            for h in hl.grid(num_heads):
                d = torch.where(in_lane, q[tile_q, h, :].to(torch.float32) - mean[:, None], 0.0)
                row_m2 = row_m2 + torch.sum(d * d, dim=1)
            rstd = torch.rsqrt(row_m2 / width + eps)
            sum_sq = hl.zeros([tile_q], dtype=torch.float32)
            for h in hl.grid(num_heads):
                ln = torch.where(in_lane, (q[tile_q, h, :].to(torch.float32) - mean[:, None]) * rstd[:, None], 0.0)
                if ln_weight is not None:
                    ln = ln * ln_weight[h, :].to(torch.float32)[None, :]
                if ln_bias is not None:
                    ln = ln + ln_bias[h, :].to(torch.float32)[None, :]
                ln_q = ln.to(q.dtype)
                acc = hl.zeros([tile_q, head_dim], dtype=torch.float32)
                for tile_kv in hl.tile(kv_start, kv_end, block_size=block_kv):
                    p = apply_activation(torch.matmul(ln_q, k[tile_kv, h, :].T) * qk_scale, act)
                    acc = torch.addmm(acc, p.to(v.dtype), v[tile_kv, h, :])
                o = (acc + ln).to(out.dtype)
                o32 = o.to(torch.float32)
                sum_sq = sum_sq + torch.sum(o32 * o32, dim=1)
                out[tile_q, h, :] = o
                if o_saved is not None:
                    o_saved[tile_q, h, :] = o
            rstd_o = torch.rsqrt(sum_sq / width + eps)
            if stats is not None:
                stats[0, tile_q] = mean
                stats[1, tile_q] = rstd
                stats[2, tile_q] = rstd_o
            for h in hl.grid(num_heads):
                y = out[tile_q, h, :].to(torch.float32) * rstd_o[:, None]
                if rms_weight is not None:
                    y = y * rms_weight[h, :].to(torch.float32)[None, :]
                out[tile_q, h, :] = (y + q[tile_q, h, :].to(torch.float32)).to(out.dtype)
    return out


# block_sizes = [tile_kv, tile_q]. The kernel works on [tile_q, D] and [tile_kv, D] tiles, as
# the GDPA kernel (whose block_sizes order is the reverse, [tile_q, tile_kv]).
DEFAULT_CONFIG = helion.Config(block_sizes=[64, 64], num_warps=4, num_stages=2)


def with_saved_outputs(config: helion.Config, args: tuple) -> helion.Config:
    """``config`` for a call that passes ``o_saved`` / ``stats`` (the last two arguments): a
    per-access ``indexing`` list, tuned without their stores, collapses to its one value when
    all entries agree (every H200 entry is all "pointer"), else to "pointer"."""
    indexing = config.config.get("indexing")
    if not isinstance(indexing, list) or not any(isinstance(t, torch.Tensor) for t in args[12:14]):
        return config
    value = indexing[0] if indexing and len(set(indexing)) == 1 else "pointer"
    return helion.Config(**{**config.config, "indexing": value})
SEED_CONFIGS = tuple(
    helion.Config(block_sizes=[kv, tq], num_warps=w, num_stages=st)
    for kv, tq, w, st in ((64, 64, 4, 2), (32, 64, 4, 2), (64, 32, 4, 2), (64, 64, 4, 3),
                          (64, 64, 8, 2), (128, 64, 4, 2), (64, 128, 8, 2), (128, 128, 8, 2))
)
def flash_norm_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    ln_weight: torch.Tensor | None = None,
    ln_bias: torch.Tensor | None = None,
    rms_weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    qk_scale: float = 1.0,
    activation: str = "fast_gelu",
) -> torch.Tensor:
    """The unfused block in fp32 (float64 stays float64), affine parameters [H, D] or None."""
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    total, heads, dim = q.shape

    def flat(t):
        return None if t is None else t.to(dt).reshape(heads * dim)

    q32 = q.to(dt)
    ln = F.layer_norm(q32.reshape(total, -1), (heads * dim,), flat(ln_weight), flat(ln_bias), eps)
    ln = ln.reshape(total, heads, dim)
    o = gdpa_reference(ln, k.to(dt), v.to(dt), q_offsets, kv_offsets, qk_scale, activation) + ln
    y = F.rms_norm(o.reshape(total, -1), (heads * dim,), flat(rms_weight), eps)
    return y.reshape(total, heads, dim) + q32


def unfused_block(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: torch.Tensor,
    kv_offsets: torch.Tensor,
    max_seq_len_q: int,
    max_seq_len_kv: int,
    ln_weight: torch.Tensor | None = None,
    ln_bias: torch.Tensor | None = None,
    rms_weight: torch.Tensor | None = None,
    eps: float = 1e-5,
    qk_scale: float = 1.0,
    activation: str = "fast_gelu",
) -> torch.Tensor:
    """The block as a PyTorch user writes it (the benchmark's baseline, eager or under
    ``torch.compile``): norms on the jagged rows, attention on zero-padded [B, L, H, D]
    copies, the result gathered back to the jagged rows. Affine parameters are [H * D].

    Zero padding is exact here: a padded K row gives a score of 0, every activation maps 0
    to 0, and padded V rows are 0. Same dtype in and out; the benchmark compiles it with
    ``torch.compile(dynamic=True)``, once per (H, D): jagged totals change every batch.
    """
    total, heads, dim = q.shape
    batch = q_offsets.numel() - 1

    def padded(x, offsets, max_len):
        lengths = offsets[1:] - offsets[:-1]
        seq = torch.repeat_interleave(torch.arange(batch, device=x.device), lengths, output_size=x.shape[0])
        pos = torch.arange(x.shape[0], device=x.device) - offsets[seq]
        out = x.new_zeros(batch, max_len, heads, dim)
        out[seq, pos] = x
        return out, seq, pos

    def attend(ln):
        ln_pad, seq, pos = padded(ln, q_offsets, max_seq_len_q)
        k_pad, _, _ = padded(k, kv_offsets, max_seq_len_kv)
        v_pad, _, _ = padded(v, kv_offsets, max_seq_len_kv)
        scores = torch.einsum("bqhd,bkhd->bhqk", ln_pad, k_pad) * qk_scale
        return torch.einsum("bhqk,bkhd->bqhd", activation_fn(activation)(scores), v_pad)[seq, pos]

    return norm_block(q, attend, ln_weight, ln_bias, rms_weight, eps)


def norm_block(
    q: torch.Tensor,
    attend,
    ln_weight: torch.Tensor | None = None,
    ln_bias: torch.Tensor | None = None,
    rms_weight: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``rms_norm(attend(ln_q) + ln_q) + q`` with ``ln_q = layer_norm(q)``, in eager PyTorch:
    the unfused block around any attention ``attend`` ([total, H, D] -> [total, H, D]).
    Both norms are over H*D of ``q`` [total, H, D]; affine parameters are [H * D]."""
    total, heads, dim = q.shape
    width = heads * dim
    ln = F.layer_norm(q.reshape(total, width), (width,), ln_weight, ln_bias, eps).view(total, heads, dim)
    o = attend(ln) + ln
    return F.rms_norm(o.reshape(total, width), (width,), rms_weight, eps).view(total, heads, dim) + q


# --- what tuning and the benchmark need (KernelSpec) ---------------------------------------

EPS = 1e-5
ACTIVATION = "fast_gelu"


def make_args(row: AttentionRow, dtype: torch.dtype, device, seed: int | None) -> tuple:
    """Kernel arguments for a workload row: (q, k, v, q_offsets, kv_offsets, max_seq_len_q,
    ln_weight [H, D], ln_bias, rms_weight, eps, qk_scale, activation index), the ads-model
    block of the blog (affine parameters near 1 and 0, ``fast_gelu``). Tensor values are drawn
    from ``seed`` (None: 0); the Q lengths from the row's own seed, so every draw has the
    same lengths."""
    seed = 0 if seed is None else seed
    q, k, v, qo, ko = random_jagged_inputs(row.q_lengths(), [row.seq_len_kv] * row.batch, row.H,
                                           row.D, dtype, device, seed)
    gen = torch.Generator(device=device).manual_seed(seed + 1_000_003)
    params = [(1.0 if i != 1 else 0.0) + 0.1 * torch.randn(row.H, row.D, generator=gen, device=device)
              for i in range(3)]  # ln_weight ~ 1, ln_bias ~ 0, rms_weight ~ 1
    return (q, k, v, qo, ko, row.max_seq_len_q, *(p.to(dtype) for p in params), EPS, 1.0,
            ACTIVATIONS.index(ACTIVATION))


def kernel_reference(q, k, v, qo, ko, max_seq_len_q, ln_weight, ln_bias, rms_weight, eps, qk_scale,
                     activation) -> tuple[torch.Tensor]:
    """:func:`flash_norm_attention_reference` on the kernel's arguments."""
    return (flash_norm_attention_reference(q, k, v, qo, ko, ln_weight, ln_bias, rms_weight, eps,
                                           qk_scale, ACTIVATIONS[activation]),)


def key_of(args: tuple):
    """Registry key of a call: (H, D) of ``q``."""
    return AttentionShape(int(args[0].shape[1]), int(args[0].shape[2]))


def min_bytes(row: AttentionRow, dtype: torch.dtype) -> int:
    """Read q, k, v once and write out once."""
    total_q, total_kv = sum(row.q_lengths()), row.batch * row.seq_len_kv
    return dtype.itemsize * row.H * row.D * (2 * total_q + 2 * total_kv)


def flops(row: AttentionRow) -> int:
    """Two GEMMs per head and sequence: 2 * 2 * len_q * len_kv * D * H."""
    return 4 * row.H * row.D * row.seq_len_kv * sum(row.q_lengths())


@functools.cache
def compiled_unfused_block():
    """:func:`unfused_block` under ``torch.compile(dynamic=True)``: jagged totals change
    every batch, so one dynamic-shape compile serves every row."""
    return torch.compile(unfused_block, dynamic=True)


def _baselines(q, k, v, qo, ko, max_seq_len_q, ln_weight, ln_bias, rms_weight, eps, qk_scale,
               activation) -> dict:
    """The unfused block a PyTorch user writes (eager and compiled), and this package's
    unfused GDPA kernel between eager norms; all take [H * D] affine parameters."""
    max_kv = int((ko[1:] - ko[:-1]).max()) if ko.numel() > 1 else 0
    act = ACTIVATIONS[activation]
    flat = [p.reshape(-1) for p in (ln_weight, ln_bias, rms_weight)]

    def block(fn):
        return lambda: fn(q, k, v, qo, ko, max_seq_len_q, max_kv, *flat, eps, qk_scale, act)

    def gdpa_eager_norms():
        return norm_block(q, lambda ln: gdpa_kernel(ln, k, v, qo, ko, max_seq_len_q, qk_scale, activation),
                          *flat, eps)

    return {
        "unfused_compiled": block(compiled_unfused_block()),
        "unfused_eager": block(unfused_block),
        "gdpa+eager_norms": gdpa_eager_norms,
    }


SPEC = KernelSpec(
    name="flash_norm_attention",
    kernel=flash_norm_attention_kernel,
    workload="attention",
    make_args=make_args,
    key_of=key_of,
    reference=kernel_reference,
    flops=flops,
    min_bytes=min_bytes,
    default_config=DEFAULT_CONFIG,
    seed_configs=SEED_CONFIGS,
    baselines=_baselines,
    unfused_baselines=("unfused_compiled", "unfused_eager", "gdpa+eager_norms"),
    technique="FlashNormAttention on jagged GDPA (technique 4, PyTorch blog 'Towards Free Normalization', 2026)",
    checked_baselines=("unfused_compiled",),
    call_config=with_saved_outputs,
    plot_relative_to="unfused_compiled",
    aim=1.35,
)
