"""Input validation of the public ops: clear errors, raised before any kernel launches."""

from __future__ import annotations

import pytest
import torch

from helion_kernels import matmul, rmsnorm_matmul, runtime

# CPU tensors throughout: these run in the CPU (reference-mode) session.
pytestmark = pytest.mark.ref_mode


@pytest.fixture(autouse=True)
def _no_launch(monkeypatch):
    """Any launch in these tests is a bug: validation must fail first."""

    def launched(*args, **kwargs):
        raise AssertionError("a kernel was launched before validation failed")

    monkeypatch.setattr(runtime, "launch", launched)
    monkeypatch.setattr(runtime, "launch_kernel", launched)


def _ab(m=8, k=16, n=4, dtype=torch.bfloat16):
    return torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)


@pytest.mark.parametrize("op", [matmul, rmsnorm_matmul], ids=["matmul", "rmsnorm_matmul"])
class TestGemmOperands:
    def test_mismatched_k(self, op):
        a, _ = _ab(k=16)
        _, b = _ab(k=24)
        with pytest.raises(ValueError, match=r"mismatched K: a is \(8, 16\).*b is \(24, 4\)"):
            op(a, b)

    @pytest.mark.parametrize("bad", [torch.randn(16), torch.randn(2, 8, 16)], ids=["1d", "3d"])
    def test_not_2d(self, op, bad):
        _, b = _ab(dtype=torch.float32)
        with pytest.raises(ValueError, match="a must be 2-D"):
            op(bad, b)

    def test_unsupported_dtype(self, op):
        a, b = _ab(dtype=torch.float64)
        with pytest.raises(TypeError, match="dtype torch.float64; supported: bfloat16, float16, float32"):
            op(a, b)

    def test_int_dtype(self, op):
        with pytest.raises(TypeError, match="dtype torch.int32"):
            op(torch.ones(4, 4, dtype=torch.int32), torch.ones(4, 4, dtype=torch.int32))

    def test_mixed_dtypes(self, op):
        a, _ = _ab(dtype=torch.bfloat16)
        _, b = _ab(dtype=torch.float16)
        with pytest.raises(TypeError, match="must share a dtype"):
            op(a, b)

    def test_not_a_tensor(self, op):
        _, b = _ab()
        with pytest.raises(TypeError, match="a must be a torch.Tensor, got list"):
            op([[1.0]], b)

    def test_zero_k(self, op):
        with pytest.raises(ValueError, match="K must be at least 1"):
            op(torch.empty(3, 0), torch.empty(0, 2))

    def test_cpu_tensors_outside_interpret_modes(self, op, monkeypatch):
        monkeypatch.delenv("HELION_INTERPRET", raising=False)
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        with pytest.raises(ValueError, match="need CUDA tensors, got cpu"):
            op(*_ab())

    def test_requires_grad_validated_first(self, op):
        a, b = _ab()
        with pytest.raises(ValueError, match="mismatched K"):
            op(a.requires_grad_(), b[:15])

    def test_empty_m_returns_empty_without_launch(self, op):
        out = op(torch.empty(0, 16, dtype=torch.bfloat16), torch.randn(16, 4, dtype=torch.bfloat16))
        out = out if isinstance(out, torch.Tensor) else out[0]
        assert out.shape == (0, 4) and out.dtype == torch.bfloat16


def test_weight_shape():
    a, b = _ab()
    with pytest.raises(ValueError, match=r"weight must have shape \[K\] = \(16,\), got \(8,\)"):
        rmsnorm_matmul(a, b, torch.ones(8))


def test_weight_not_tensor():
    with pytest.raises(TypeError, match="weight must be a torch.Tensor or None"):
        rmsnorm_matmul(*_ab(), weight=[1.0] * 16)


@pytest.mark.parametrize("eps", [-1e-5, float("nan"), float("inf")])
def test_bad_eps(eps):
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        rmsnorm_matmul(*_ab(), eps=eps)


@pytest.mark.parametrize("eps", ["1e-5", True, torch.tensor(1e-5)], ids=["str", "bool", "tensor"])
def test_eps_of_the_wrong_type(eps):
    with pytest.raises(TypeError, match="eps must be a real number"):
        rmsnorm_matmul(*_ab(), eps=eps)


def test_empty_n_returns_rstd_of_right_shape():
    c, rstd = rmsnorm_matmul(torch.randn(3, 16), torch.randn(16, 0), return_rstd=True)
    assert c.shape == (3, 0) and rstd.shape == (3,) and rstd.dtype == torch.float32


def test_devices_must_match(monkeypatch):
    a, b = _ab()
    with pytest.raises(ValueError, match="all tensors must be on one device"):
        rmsnorm_matmul(a, b.to("meta"))


def test_meta_tensors_are_refused():
    a, b = _ab()
    with pytest.raises(ValueError, match="meta tensors hold no data"):
        rmsnorm_matmul(a.to("meta"), b.to("meta"))


@pytest.mark.parametrize(("weight", "b", "error", "match"), [
    (torch.ones(3), torch.ones(4, 5), ValueError, r"shape \[K\] = \(4,\)"),
    (torch.ones(1), torch.ones(4, 5), ValueError, r"shape \[K\] = \(4,\)"),  # no silent broadcast
    (torch.ones(4, dtype=torch.int32), torch.ones(4, 5), TypeError, "floating-point"),
    (torch.ones(4), torch.ones(4), ValueError, "2-D"),
    ([1.0] * 4, torch.ones(4, 5), TypeError, "floating-point tensor, got list"),
])
def test_fold_rmsnorm_weight_bad_input(weight, b, error, match):
    from helion_kernels import fold_rmsnorm_weight

    with pytest.raises(error, match=match):
        fold_rmsnorm_weight(weight, b)
