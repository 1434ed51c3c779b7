"""The shared correctness bar: it must fail on NaN, one wrong element, or a wrong shape."""

from __future__ import annotations

import pytest
import torch

from helion_kernels.verify import VerificationError, check_deterministic, check_outputs, relative_error


def _ref(n=4096):
    return torch.randn(n, generator=torch.Generator().manual_seed(0))


def test_bf16_rounding_passes():
    ref = _ref()
    assert check_outputs(ref.to(torch.bfloat16), ref, torch.bfloat16) < 5e-3


def test_nan_never_passes():
    out = _ref().clone()
    out[17] = float("nan")
    with pytest.raises(VerificationError, match="1 non-finite"):
        check_outputs(out, _ref(), torch.float32)
    assert relative_error(out, _ref()) == float("inf")


def test_one_wrong_element_fails_even_in_a_large_output():
    ref = torch.randn(1 << 20, generator=torch.Generator().manual_seed(1))
    out = ref.clone()
    out[123456] += 0.5  # relative norm error ~5e-4: would pass a norm-only check
    assert relative_error(out, ref) < 1e-3
    with pytest.raises(VerificationError, match=r"1 of 1048576 elements.*worst at \(123456,\)"):
        check_outputs(out, ref, torch.bfloat16)


def test_shape_and_count_mismatch():
    with pytest.raises(VerificationError, match="shape"):
        check_outputs(torch.zeros(3), torch.zeros(4), torch.float32)
    with pytest.raises(VerificationError, match="2 outputs but 1"):
        check_outputs((torch.zeros(3), torch.zeros(3)), torch.zeros(3), torch.float32)


def test_deterministic_run_passes():
    out = torch.randn(64)
    check_deterministic(lambda: (out * 2, out + 1))


def test_nondeterminism_is_caught():
    calls = iter(range(100))

    def racy():
        t = torch.zeros(32)
        if next(calls) == 3:  # the fourth run differs in one element
            t[5] = 1e-3
        return t

    with pytest.raises(VerificationError, match="1 elements changed between identical runs"):
        check_deterministic(racy)
