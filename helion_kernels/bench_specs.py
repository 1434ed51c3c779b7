"""What measuring a kernel needs (the bench side): the unfused pipelines a user has, the
byte and FLOP counts of the floors, what the plots and aims compare against.

Tuning and the benchmark read a :class:`BenchSpec` per kernel name (:func:`bench_spec`),
beside its :class:`~.spec.KernelSpec`. Every baseline takes the kernel's own arguments and
returns zero-argument callables, so a benchmark times exactly what a user would run.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import torch
import torch.nn.functional as F

from . import liger_norm
from .autograd import run_compiled
from .spec import AttentionRow, Shape

Problem = Any  # Shape or AttentionRow


@dataclasses.dataclass(frozen=True)
class BenchSpec:
    """How a kernel is measured.

    Attributes:
        technique: one line naming the technique and its source.
        flops: ``problem -> int``, floating-point operations of the fused op.
        min_bytes: ``(problem, dtype) -> int``, fewest device-memory bytes the op must move.
        baselines: ``*kernel_args -> {name: zero-arg callable}``, the unfused alternatives.
        unfused_baselines: keys of ``baselines`` that are complete unfused pipelines (the
            speed-ups are against these).
        norm_baseline: the standalone norm whose latency the blog's "latency saved" metric is
            a percentage of; None: no such metric.
        gemm_twin: the plain Helion GEMM the fused kernel is compared with (the blog's metric).
        checked_baselines: baselines whose outputs are also checked against the reference.
        plot_relative_to: the baseline the plot divides latencies by.
        aim: the speed-up over the best unfused pipeline the plot marks; None: none.
        dispatch_alternatives: other unfused pipelines the op can run (cuBLAS + Liger's norm,
            present in ``baselines`` only where liger-kernel is installed): tuning times them
            beside the spec's ``dispatch_baseline``.
        dispatch_fused: ``(run, args) -> zero-arg callable``, the whole fused op tuning times
            for the dispatch record where the kernel is one launch of it (``run(*args)``
            launches the kernel being tuned); None: the kernel alone.
    """

    technique: str
    flops: Callable[[Problem], int]
    min_bytes: Callable[[Problem, torch.dtype], int]
    baselines: Callable[..., dict[str, Callable[[], object]]]
    unfused_baselines: tuple[str, ...]
    norm_baseline: str | None = None
    gemm_twin: str | None = None
    checked_baselines: tuple[str, ...] = ()
    plot_relative_to: str = "cublas_mm"
    aim: float | None = None
    dispatch_alternatives: tuple[str, ...] = ()
    dispatch_fused: Callable[[Callable[..., Any], tuple], Callable[[], object]] | None = None


def gemm_min_bytes(shape: Shape, dtype: torch.dtype) -> int:
    """Read ``a`` and ``b`` once, write ``c`` once."""
    return dtype.itemsize * (shape.M * shape.K + shape.K * shape.N + shape.M * shape.N)


def gemm_flops(shape: Shape) -> int:
    return 2 * shape.M * shape.K * shape.N


_BLOG = "PyTorch blog 'Towards Free Normalization', 2026"
EPS = 1e-5


# --- the GEMM and the pre-norm -------------------------------------------------------------


def _gemm_baselines(a: torch.Tensor, b: torch.Tensor) -> dict:
    return {"cublas_mm": lambda: torch.mm(a, b)}


def _prenorm_baselines(a: torch.Tensor, b: torch.Tensor, eps: float, layernorm: int = 0, colsum=None,
                       beta=None) -> dict:
    """A standalone norm, then the cuBLAS GEMM (with the folded LayerNorm bias in its epilogue):
    the compiled norm, and Liger's where installed."""
    k = a.shape[1]
    if layernorm:
        norm = lambda x: F.layer_norm(x, (k,), eps=eps)  # noqa: E731
    else:
        norm = lambda x: F.rms_norm(x, (k,), eps=eps)  # noqa: E731
    inductor_norm = torch.compile(norm, dynamic=False)
    bias = None if beta is None else beta.to(a.dtype)

    def gemm(x):
        return torch.mm(x, b) if bias is None else torch.addmm(bias, x, b)

    out = {
        "cublas_mm": lambda: torch.mm(a, b),
        "inductor_norm": lambda: inductor_norm(a),
        "cublas+inductor_norm": lambda: gemm(inductor_norm(a)),
    }
    if layernorm:
        liger = liger_module("LigerLayerNorm", "layer_norm", k, eps, a, bias=None)
    else:
        liger = liger_module("LigerRMSNorm", "rms_norm", k, eps, a)  # weight ones: the un-affine norm
    if liger is not None:
        out["liger_norm"] = lambda: liger(a)
        out["cublas+liger_norm"] = lambda: gemm(liger(a))
    return out


def _given_rstd_baselines(a: torch.Tensor, b: torch.Tensor, rstd: torch.Tensor, mean=None, colsum=None,
                          beta=None) -> dict:
    """The op's own unfused path with the statistics given (the compiled row scaling, then
    cuBLAS), and the user's usual one (the compiled norm with its statistics, then cuBLAS)."""
    from .autograd import layer_x_hat, rms_x_hat

    layernorm = int(mean is not None)
    if layernorm:
        scale = torch.compile(layer_x_hat, dynamic=False)
        scaled = lambda: scale(a, mean, rstd)  # noqa: E731
    else:
        scale = torch.compile(rms_x_hat, dynamic=False)
        scaled = lambda: scale(a, rstd)  # noqa: E731
    out = _prenorm_baselines(a, b, EPS, layernorm, colsum, beta)
    bias = None if beta is None else beta.to(a.dtype)
    out.update({"inductor_scale": scaled,
                "cublas+inductor_scale": lambda: torch.mm(scaled(), b) if bias is None else torch.addmm(bias, scaled(), b)})
    return out


def _prenorm_backward_baselines(a: torch.Tensor, b: torch.Tensor, dc: torch.Tensor, rstd: torch.Tensor) -> dict:
    from .techniques.prenorm import prenorm_norm_backward, rmsnorm_matmul_dgrad

    dx_hat = torch.mm(dc, b.t())
    return {
        "cublas_mm": lambda: torch.mm(dc, b.t()),
        "inductor_norm_backward": lambda: run_compiled(prenorm_norm_backward, dx_hat, a, rstd),
        "cublas+inductor_norm_backward": lambda: rmsnorm_matmul_dgrad(a, b, dc, rstd),
    }


def _prenorm_backward_min_bytes(shape: Shape, dtype: torch.dtype) -> int:
    """Read ``a``, ``b``, ``dc`` and ``rstd`` once; write ``da`` and ``x_hat`` once."""
    return dtype.itemsize * (3 * shape.M * shape.K + shape.K * shape.N + shape.M * shape.N) + 4 * shape.M


def _layernorm_backward_baselines(a, b, dc, rstd, s2, mean, s1) -> dict:
    """The cuBLAS dgrad, and it followed by the compiled LayerNorm backward over whole rows."""
    from .techniques.prenorm.layernorm import _layer_backward, layer_dgrad

    dx_hat = torch.mm(dc, b.t())
    return {
        "cublas_mm": lambda: torch.mm(dc, b.t()),
        "inductor_norm_backward": lambda: run_compiled(_layer_backward, dx_hat, a, mean, rstd),
        "cublas+inductor_norm_backward": lambda: layer_dgrad(a, b, dc, mean, rstd),
    }


def liger_module(class_name: str, module: str, n: int, eps: float, like: torch.Tensor, **params):
    """Liger's norm module (``liger_kernel.transformers.<module>.<class_name>``) with these
    affine parameters (None: zeros), on ``like``'s device and dtype; None where liger-kernel is
    absent or broken, or ``like`` is not on a CUDA device."""
    if like.device.type != "cuda":
        return None
    try:
        cls = getattr(__import__(f"liger_kernel.transformers.{module}", fromlist=[class_name]), class_name)
    except Exception:  # absent, or broken against this torch/triton: skip the baseline
        return None
    norm = cls(n, eps=eps).to(device=like.device, dtype=like.dtype)
    with torch.no_grad():
        for name, value in params.items():
            if value is None:
                getattr(norm, name).zero_()
            else:
                getattr(norm, name).copy_(value)
    return norm


# --- post-norm -----------------------------------------------------------------------------


def _norm_baselines(a: torch.Tensor, b: torch.Tensor, weight, bias, eps: float, layernorm: int, *_) -> dict:
    """The cuBLAS GEMM, then a standalone norm: compiled by inductor, and Liger's where it runs
    (the forward kernels the split-N ops' unfused path runs, so tuning times what the op runs)."""
    n = b.shape[1]
    if layernorm:
        norm = lambda x: F.layer_norm(x, (n,), weight, bias, eps)  # noqa: E731
        liger = lambda x: liger_norm.layer_norm(x, weight, bias, eps)[0]  # noqa: E731
    else:
        norm = lambda x: F.rms_norm(x, (n,), weight, eps)  # noqa: E731
        liger = lambda x: liger_norm.rms_norm(x, weight, eps)[0]  # noqa: E731
    c0 = torch.mm(a, b)
    inductor_norm = torch.compile(norm, dynamic=False)
    out = {
        "cublas_mm": lambda: torch.mm(a, b),
        "inductor_norm": lambda: inductor_norm(c0),
        "cublas+inductor_norm": lambda: inductor_norm(torch.mm(a, b)),
    }
    if liger_norm.available(a.device, n):
        out["liger_norm"] = lambda: liger(c0)
        out[liger_norm.PIPELINE] = lambda: liger(torch.mm(a, b))
    return out


# --- the deferred norm -------------------------------------------------------------------------


def deferred_weight(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The second weight ``c`` [N, N2 = K] the deferred op is timed with for its dispatch
    decision (Linear K -> N, RMSNorm over N, Linear N -> K): N(0, 1/N) from a fixed seed."""
    n, k = b.shape[1], a.shape[1]
    gen = torch.Generator(device=a.device).manual_seed(0)
    return (torch.randn(n, k, generator=gen, device=a.device) * n**-0.5).to(a.dtype)


def _deferred_baselines(a: torch.Tensor, b: torch.Tensor) -> dict:
    """The cuBLAS GEMM (the producer's unfused twin) and the whole unfused op: cuBLAS, the
    compiled RMSNorm, cuBLAS."""
    c, n = deferred_weight(a, b), b.shape[1]
    norm = torch.compile(lambda x: F.rms_norm(x, (n,), eps=EPS), dynamic=False)
    return {"cublas_mm": lambda: torch.mm(a, b),
            "cublas+inductor_norm+cublas": lambda: torch.mm(norm(torch.mm(a, b)), c)}


def _deferred_fused(run, args: tuple):
    """The whole fused op: the producer (``run``), then the consumer on its ``matmul``
    registry config at (M, N, N2 = K), a kernel object of its own (the op's cached launches
    keep their configs)."""
    import helion

    from .techniques.deferred import consumer_config_for
    from .techniques.deferred.kernels import rmsnorm_scaled_matmul_kernel

    a, b = args
    c = deferred_weight(a, b)
    x, partials = run(a, b)
    consumer = helion.kernel(rmsnorm_scaled_matmul_kernel.fn, static_shapes=True).bind((x, c, partials, EPS))
    consumer.set_config(consumer_config_for(a.shape[0], b.shape[1], c.shape[1], a.dtype, a.device))

    def fused_op():
        x, partials = run(a, b)
        return consumer(x, c, partials, EPS)
    return fused_op


# --- FlashNormAttention ------------------------------------------------------------------------


def unfused_block(q, k, v, q_offsets, kv_offsets, max_seq_len_q: int, max_seq_len_kv: int, ln_weight=None,
                  ln_bias=None, rms_weight=None, eps: float = 1e-5, qk_scale: float = 1.0,
                  activation: str = "fast_gelu") -> torch.Tensor:
    """The block as a PyTorch user writes it (eager, or compiled with ``dynamic=True``):
    norms on the jagged rows, attention on zero-padded [B, L, H, D] copies, gathered back.
    Zero padding is exact: a padded K row scores 0, every activation maps 0 to 0, padded V
    rows are 0. Affine parameters are [H * D]."""
    from .techniques.attention.kernels import activation_fn

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


def norm_block(q: torch.Tensor, attend, ln_weight=None, ln_bias=None, rms_weight=None, eps: float = 1e-5):
    """``rms_norm(attend(ln_q) + ln_q) + q`` with ``ln_q = layer_norm(q)`` in eager PyTorch,
    around any attention ``attend``; both norms over H*D, affine parameters [H * D]."""
    total, heads, dim = q.shape
    width = heads * dim
    ln = F.layer_norm(q.reshape(total, width), (width,), ln_weight, ln_bias, eps).view(total, heads, dim)
    o = attend(ln) + ln
    return F.rms_norm(o.reshape(total, width), (width,), rms_weight, eps).view(total, heads, dim) + q


@functools.cache
def compiled_unfused_block():
    """:func:`unfused_block` under ``torch.compile(dynamic=True)``: jagged totals change every
    batch, so one dynamic-shape compile serves every row."""
    return torch.compile(unfused_block, dynamic=True)


def _attention_baselines(q, k, v, qo, ko, max_seq_len_q, ln_weight, ln_bias, rms_weight, eps, qk_scale,
                         activation, *_) -> dict:
    """The unfused block (eager and compiled), and the package's GDPA kernel (its registry
    config, else its default) between eager norms."""
    from . import runtime
    from .limits import ACTIVATIONS
    from .techniques.attention.kernels import SPEC_GDPA

    max_kv = int((ko[1:] - ko[:-1]).max()) if ko.numel() > 1 else 0
    act = ACTIVATIONS[activation]
    flat = [p.reshape(-1) for p in (ln_weight, ln_bias, rms_weight)]

    def block(fn):
        return lambda: fn(q, k, v, qo, ko, max_seq_len_q, max_kv, *flat, eps, qk_scale, act)

    def gdpa_eager_norms():
        return norm_block(q, lambda ln: runtime.launch(SPEC_GDPA, (ln, k, v, qo, ko, max_seq_len_q, qk_scale,
                                                                   activation)),
                          *flat, eps)

    return {"unfused_compiled": block(compiled_unfused_block()), "unfused_eager": block(unfused_block),
            "gdpa+eager_norms": gdpa_eager_norms}


def _default_config_baseline(kernel_name: str):
    """Baselines of a GDPA kernel: the same kernel at its default config (what the ops ran
    before they could be tuned), compiled once."""

    def baselines(*args) -> dict:
        from .techniques import get_spec

        spec = get_spec(kernel_name)
        run = spec.kernel.bind(args).compile_config(spec.default_config)
        return {"default_config": lambda: run(*args)}

    return baselines


def _fna_dq_baselines(*args) -> dict:
    """The fused dq kernel's default config, and what the op runs where tuning did not
    measure the kernel faster: the norms in two inductor passes around GDPA's dq kernel."""
    from .techniques.attention import _norms_apart_dq

    return {**_default_config_baseline("flash_norm_attention_dq")(*args),
            "inductor_norms+gdpa_dq": lambda: _norms_apart_dq(*args)}


def _jagged_bytes(q_sized: int, kv_sized: int):
    """Bytes a jagged attention kernel must move: ``q_sized`` [total_q, H, D] and ``kv_sized``
    [total_kv, H, D] tensors, each read or written once (the forward: q, k, v in, out out)."""

    def min_bytes(row: AttentionRow, dtype: torch.dtype) -> int:
        total_q, total_kv = sum(row.q_lengths()), row.batch * row.seq_len_kv
        return dtype.itemsize * row.H * row.D * (q_sized * total_q + kv_sized * total_kv)

    return min_bytes


def _jagged_flops(gemms: int):
    """``gemms`` products of [len_q, len_kv, D] per head and sequence (the forward: 2)."""
    return lambda row: gemms * 2 * row.H * row.D * row.seq_len_kv * sum(row.q_lengths())


# --- the list ----------------------------------------------------------------------------------

_UNFUSED_NORM = ("cublas+inductor_norm", liger_norm.PIPELINE)
_FULL_ROW = BenchSpec(f"full-row post-norm (technique 1, {_BLOG})", gemm_flops, gemm_min_bytes, _norm_baselines,
                      _UNFUSED_NORM, norm_baseline="inductor_norm", gemm_twin="matmul")
_SPLIT_N = dataclasses.replace(
    _FULL_ROW, technique=f"split-N post-norm, one program sweeping a row block's N tiles with L2 as the exchange "
                         f"(technique 3, {_BLOG})", dispatch_alternatives=(liger_norm.PIPELINE,))

BENCH_SPECS: dict[str, BenchSpec] = {
    "matmul": BenchSpec("plain GEMM (the baseline the fused kernels are measured against)", gemm_flops,
                        gemm_min_bytes, _gemm_baselines, ("cublas_mm",)),
    "rmsnorm_matmul": BenchSpec(f"deferred pre-norm (technique 2, {_BLOG})", gemm_flops, gemm_min_bytes,
                                _prenorm_baselines, _UNFUSED_NORM, norm_baseline="inductor_norm",
                                gemm_twin="matmul"),
    # the blog's metric against the whole norm: the statistics' cost in the producer is not timed
    "rmsnorm_matmul_given_rstd": BenchSpec(
        f"deferred pre-norm with the producer's rstd, whose cost is not timed here (technique 2, {_BLOG})",
        gemm_flops, gemm_min_bytes, _given_rstd_baselines, ("cublas+inductor_scale", *_UNFUSED_NORM),
        norm_baseline="inductor_norm", gemm_twin="matmul"),
    "layernorm_matmul": BenchSpec(f"deferred pre-LayerNorm (technique 2, {_BLOG})", gemm_flops, gemm_min_bytes,
                                  _prenorm_baselines, _UNFUSED_NORM, norm_baseline="inductor_norm",
                                  gemm_twin="matmul"),
    "layernorm_matmul_given_stats": BenchSpec(
        f"deferred pre-LayerNorm with the producer's mean and rstd, whose cost is not timed here (technique 2, "
        f"{_BLOG})", gemm_flops, gemm_min_bytes, _given_rstd_baselines, ("cublas+inductor_scale", *_UNFUSED_NORM),
        norm_baseline="inductor_norm", gemm_twin="matmul"),
    "layernorm_matmul_backward": BenchSpec(
        "backward of the deferred pre-LayerNorm: the norm's backward in the dgrad GEMM's epilogue, its row terms "
        "from the forward's output", gemm_flops, _prenorm_backward_min_bytes, _layernorm_backward_baselines,
        ("cublas+inductor_norm_backward",), norm_baseline="inductor_norm_backward"),
    "rmsnorm_matmul_backward": BenchSpec(
        "backward of the deferred pre-norm: the RMSNorm backward in the dgrad GEMM's epilogue", gemm_flops,
        _prenorm_backward_min_bytes, _prenorm_backward_baselines, ("cublas+inductor_norm_backward",),
        norm_baseline="inductor_norm_backward"),
    "matmul_layernorm": _FULL_ROW,
    "matmul_rmsnorm": _FULL_ROW,
    "matmul_layernorm_split_n": _SPLIT_N,
    "matmul_rmsnorm_split_n": _SPLIT_N,
    "matmul_rmsnorm_matmul": BenchSpec(
        f"the first GEMM of rms_norm(a @ b) @ c with per-tile sums of squares (split-N candidate 3, technique 3, "
        f"{_BLOG})", gemm_flops, gemm_min_bytes, _deferred_baselines, ("cublas_mm",), gemm_twin="matmul",
        dispatch_fused=_deferred_fused),
    "flash_norm_attention": BenchSpec(
        f"FlashNormAttention on jagged GDPA (technique 4, {_BLOG})", _jagged_flops(2), _jagged_bytes(2, 2),
        _attention_baselines, ("unfused_compiled", "unfused_eager", "gdpa+eager_norms"),
        checked_baselines=("unfused_compiled",), plot_relative_to="unfused_compiled", aim=1.35),
    "gdpa": BenchSpec(f"jagged GDPA, the attention of technique 4's unfused block ({_BLOG})", _jagged_flops(2),
                      _jagged_bytes(2, 2), _default_config_baseline("gdpa"), ("default_config",),
                      plot_relative_to="default_config"),
    "gdpa_dq": BenchSpec("GDPA backward, dq: scores and dout v^T recomputed per KV tile, no atomics",
                         _jagged_flops(3), _jagged_bytes(3, 2), _default_config_baseline("gdpa_dq"),
                         ("default_config",), plot_relative_to="default_config"),
    "gdpa_dkdv": BenchSpec("GDPA backward, dk and dv: scores and dout v^T recomputed per Q tile, no atomics",
                           _jagged_flops(4), _jagged_bytes(2, 4), _default_config_baseline("gdpa_dkdv"),
                           ("default_config",), plot_relative_to="default_config"),
    "flash_norm_attention_dq": BenchSpec(
        "FlashNormAttention backward to dq: both norms' backward around GDPA's dq loop, one program per Q tile of "
        "all heads (reads q, dy, o; writes dq and the ln, do the dk/dv kernel reads)", _jagged_flops(3),
        _jagged_bytes(6, 2), _fna_dq_baselines, ("inductor_norms+gdpa_dq",),
        plot_relative_to="inductor_norms+gdpa_dq"),
}


def bench_spec(name: str) -> BenchSpec:
    """The bench spec of the kernel ``name`` (a deprecated name works, with a warning).

    Raises:
        ValueError: an unknown name.
    """
    if name in BENCH_SPECS:
        return BENCH_SPECS[name]
    from .techniques import canonical_name

    return BENCH_SPECS[canonical_name(name)]
