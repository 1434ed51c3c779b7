"""Deferred post-norm (split-N candidate 3): ``rms_norm(a @ b, w) @ c`` with the norm moved
past the second GEMM. Reference mode, the Triton interpreter (several N tiles per row), CUDA."""

from __future__ import annotations

import warnings

import helion
import pytest
import torch

from helion_kernels import matmul_rmsnorm_matmul
from helion_kernels.spec import Shape
from helion_kernels.bench_specs import bench_spec, deferred_weight as dispatch_weight
from helion_kernels.techniques.deferred.kernels import (
    SPEC,
    matmul_rmsnorm_matmul_reference,
    matmul_rmsnorm_partials_kernel,
    rmsnorm_scaled_matmul_kernel,
)
from helion_kernels.verify import check_outputs

from _postnorm_inputs import save_decision

pytestmark = pytest.mark.usefixtures("poisoned_empty")


def _operands(m, k, n, n2, dtype, device, seed, mean=0.0):
    """a, b, c, weight; ``mean`` shifts x = a @ b's rows away from 0 (a large mean against
    the spread, where the RMS is dominated by the mean)."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen)
    a[:, 0] = 1.0
    b = torch.randn(k, n, generator=gen) / k**0.5
    b[0] += mean
    c = torch.randn(n, n2, generator=gen) / n**0.5
    w = 1.0 + 0.2 * torch.randn(n, generator=gen)
    return tuple(t.to(device=device, dtype=dtype) for t in (a, b, c, w))


@pytest.mark.ref_mode
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize(("m", "k", "n", "n2"), [(1, 64, 96, 48), (37, 100, 200, 72), (64, 256, 512, 128)])
def test_matches_fp64(m, k, n, n2, affine, dtype, device):
    a, b, c, w = _operands(m, k, n, n2, dtype, device, seed=m + n)
    w = w if affine else None
    out = matmul_rmsnorm_matmul(a, b, c, w, eps=1e-5)
    assert out.shape == (m, n2) and out.dtype == dtype
    ref = matmul_rmsnorm_matmul_reference(a.double(), b.double(), c.double(),
                                          None if w is None else w.double(), 1e-5)
    check_outputs(out, ref, dtype)


@pytest.mark.ref_mode
def test_large_mean_rows(device):
    a, b, c, w = _operands(33, 64, 160, 40, torch.bfloat16, device, seed=5, mean=1e3)
    out = matmul_rmsnorm_matmul(a, b, c, w)
    ref = matmul_rmsnorm_matmul_reference(a.double(), b.double(), c.double(), w.double())
    check_outputs(out, ref, torch.bfloat16)


@pytest.mark.ref_mode
def test_bad_inputs_raise_before_launch(monkeypatch):
    from helion_kernels import runtime

    for name in ("launch", "launch_kernel"):
        monkeypatch.setattr(runtime, name, lambda *a: pytest.fail("launched on bad input"))
    a, b, c, w = _operands(8, 16, 24, 8, torch.float32, "cpu", 0)
    with pytest.raises(ValueError, match=r"c must have shape \[N, N2\] with N = 24"):
        matmul_rmsnorm_matmul(a, b, c[:20], w)
    with pytest.raises(TypeError, match="c must have the dtype"):
        matmul_rmsnorm_matmul(a, b, c.double(), w)
    with pytest.raises(ValueError, match="mismatched K"):
        matmul_rmsnorm_matmul(a, b[:15], c, w)
    with pytest.raises(ValueError, match=r"weight must have shape \[N\] = \(24,\)"):
        matmul_rmsnorm_matmul(a, b, c, w[:8])
    with pytest.raises(ValueError, match="N must be at least 1"):
        matmul_rmsnorm_matmul(a, b[:, :0], c[:0], None)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        matmul_rmsnorm_matmul(a, b, c, w, eps=-1.0)
    assert matmul_rmsnorm_matmul(a[:0], b, c, w).shape == (0, 8)


@pytest.mark.triton_interpret
@pytest.mark.parametrize("mean", [0.0, 1e3])
def test_generated_code_under_the_interpreter(mean):
    """N = 96 with tile_n = 32: three partials per row; M not a multiple of tile_m."""
    dtype = torch.float16  # bf16 tl.dot is broken in the interpreter
    a, b, c, w = _operands(37, 64, 96, 40, dtype, "cpu", 3, mean=mean)
    producer = matmul_rmsnorm_partials_kernel.bind((a, b))
    producer.set_config(helion.Config(block_sizes=[32, 16, 32], num_warps=4, num_stages=1))
    x, partials = producer(a, b)
    assert partials.shape == (37, 3)
    c_folded = (w.float()[:, None] * c.float()).to(dtype)
    consumer = rmsnorm_scaled_matmul_kernel.bind((x, c_folded, partials, 1e-5))
    consumer.set_config(helion.Config(block_sizes=[16, 16, 32], num_warps=4, num_stages=1))
    out = consumer(x, c_folded, partials, 1e-5)
    ref = matmul_rmsnorm_matmul_reference(a.double(), b.double(), c.double(), w.double())
    check_outputs(out, ref, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda(dtype, registry_dir):
    """An empty registry: the kernels when forced (default configs, with a warning), cuBLAS +
    the compiled norm + cuBLAS by default (no warning); both match the reference."""
    from helion_kernels.registry import ConfigFallbackWarning

    for shape, mean in (((4096, 512, 2048, 512), 0.0), ((1000, 256, 1536, 384), 1e3)):
        a, b, c, w = _operands(*shape, dtype, "cuda", 7, mean=mean)
        ref = matmul_rmsnorm_matmul_reference(a, b, c, w)
        with pytest.warns(ConfigFallbackWarning, match="default config"):
            check_outputs(matmul_rmsnorm_matmul(a, b, c, w, fused=True), ref, dtype)
        if mean == 0.0:  # the unfused path rounds x to bf16 before its norm, as PyTorch's pair does
            with warnings.catch_warnings():
                warnings.simplefilter("error", ConfigFallbackWarning)
                check_outputs(matmul_rmsnorm_matmul(a, b, c, w), ref, dtype)


@pytest.mark.cuda
def test_cuda_dispatch_timing(registry_dir):
    """What tuning times for the decision: the whole fused op (both kernels) gives the
    reference's output, and the unfused pipeline it is timed against does too."""
    from helion_kernels.registry import ConfigFallbackWarning

    a, b = SPEC.make_args(Shape(2048, 256, 1024), torch.bfloat16, "cuda", 3)
    c = dispatch_weight(a, b)
    assert c.shape == (1024, 256)
    ref = matmul_rmsnorm_matmul_reference(a, b, c)
    # The producer on an explicit config, as tuning passes it: a Helion kernel called without
    # one autotunes (minutes on the GPU; reference mode never does, so only CUDA would stall).
    producer = helion.kernel(matmul_rmsnorm_partials_kernel.fn, static_shapes=True, config=SPEC.default_config)
    with pytest.warns(ConfigFallbackWarning):  # the consumer: no matmul entry, the default config
        fused_op = bench_spec(SPEC.name).dispatch_fused(producer, (a, b))
        check_outputs(fused_op(), ref, torch.bfloat16)
    check_outputs(bench_spec(SPEC.name).baselines(a, b)[SPEC.dispatch_baseline](), ref, torch.bfloat16)


# --- dispatch: the kernels only where tuning measured the op faster --------------------------


@pytest.mark.parametrize("choice", ["fused", "unfused"])
def test_dispatch_follows_the_registry(choice, decisions):
    from helion_kernels import runtime
    from helion_kernels.registry import ConfigFallbackWarning

    assert SPEC.dispatch_baseline == "cublas+inductor_norm+cublas" and bench_spec(SPEC.name).dispatch_fused is not None
    save_decision(SPEC, Shape(64, 32, 4096), choice)
    args = SPEC.make_args(Shape(64, 32, 4096), torch.float32, "cpu", 0)
    assert runtime.decide(SPEC, args).fused is (choice == "fused")
    near = SPEC.make_args(Shape(48, 32, 3000), torch.float32, "cpu", 0)
    with pytest.warns(ConfigFallbackWarning) if choice == "unfused" else warnings.catch_warnings():
        assert runtime.decide(SPEC, near).fused is (choice == "fused")  # the nearest tuned shape's
    assert runtime.decide(SPEC, args, True).fused and not runtime.decide(SPEC, args, False).fused


def test_no_entry_means_unfused(decisions):
    from helion_kernels import runtime

    assert not runtime.decide(SPEC, SPEC.make_args(Shape(64, 32, 4096), torch.float32, "cpu", 0)).fused


@pytest.mark.triton_interpret
@pytest.mark.parametrize("choice", ["fused", "unfused", "forced"])
def test_the_op_runs_the_recorded_path(choice, decisions, monkeypatch):
    """End to end in the interpreter: the two kernels launch only where the registry chose
    them (or ``fused=True``), and both paths give the op and its gradients."""
    from helion_kernels import runtime

    seen = []
    launch, launch_kernel = runtime.launch, runtime.launch_kernel
    monkeypatch.setattr(runtime, "launch", lambda spec, args: seen.append(spec.name) or launch(spec, args))
    monkeypatch.setattr(runtime, "launch_kernel",
                        lambda kernel, *rest: seen.append(kernel.name) or launch_kernel(kernel, *rest))
    save_decision(SPEC, Shape(33, 48, 40), "unfused" if choice == "forced" else choice)
    a, b, c, w = (t.requires_grad_() for t in _operands(33, 48, 40, 24, torch.float32, "cpu", 9))
    from helion_kernels.registry import ConfigFallbackWarning

    # The consumer runs the `matmul` entry at (M, N, N2), which this registry lacks.
    with pytest.warns(ConfigFallbackWarning, match="matmul: ") if choice != "unfused" else warnings.catch_warnings():
        out = matmul_rmsnorm_matmul(a, b, c, w, fused=True if choice == "forced" else None)
    ref_inputs = [t.detach().double().requires_grad_() for t in (a, b, c, w)]
    ref = matmul_rmsnorm_matmul_reference(*ref_inputs)
    check_outputs(out, ref, torch.float32)
    dout = torch.randn_like(out)
    check_outputs(torch.autograd.grad(out, (a, b, c, w), dout),
                  torch.autograd.grad(ref, ref_inputs, dout.double()), torch.float32)
    assert seen == ([] if choice == "unfused" else ["matmul_rmsnorm_matmul", "rmsnorm_scaled_matmul_kernel"])


@pytest.mark.ref_mode
def test_fused_flag_is_checked(device):
    a, b, c, w = _operands(4, 8, 16, 8, torch.float32, device, 29)
    with pytest.raises(TypeError, match="matmul_rmsnorm_matmul: fused must be None, True or False"):
        matmul_rmsnorm_matmul(a, b, c, w, fused="yes")


@pytest.mark.ref_mode
@pytest.mark.parametrize("fused", [True, False])
def test_both_paths_match_fp64(fused, device):
    """Reference mode always runs the kernels unless forced off: both paths, M = 1 too."""
    for shape in ((1, 64, 96, 48), (37, 100, 200, 72)):
        a, b, c, w = _operands(*shape, torch.bfloat16, device, 13)
        out = matmul_rmsnorm_matmul(a, b, c, w, fused=fused)
        check_outputs(out, matmul_rmsnorm_matmul_reference(a.double(), b.double(), c.double(), w.double()),
                      torch.bfloat16)


@pytest.mark.ref_mode
def test_kernels_in_float64_are_exact(device):
    """The two kernels called directly on float64 inputs (the public op takes bf16/fp16/
    fp32): nothing is rounded to a low precision, only the kernels' fp32 accumulators, so
    they must agree with the reference to ~1e-5; a wrong scale of 0.5% (e.g. dividing by
    N + 1) passes the dtype tolerances above but not this."""
    a, b, c, w = _operands(19, 48, 80, 24, torch.float64, device, 11)
    x, partials = matmul_rmsnorm_partials_kernel(a, b)
    out = rmsnorm_scaled_matmul_kernel(x, w[:, None] * c, partials, 1e-5)
    ref = matmul_rmsnorm_matmul_reference(a, b, c, w, 1e-5)
    torch.testing.assert_close(out, ref, rtol=2e-4, atol=1e-5)
