"""Run the public GEMM-shaped ops once on tiny and odd shapes and on two larger ones.

bf16 and fp32, each call checked against a float64 reference; one line per call (ok /
FAIL with the error). Why: M = N = 1 fails under the Triton interpreter (an interpreter
gap, not a kernel bug), so the CPU tests cannot show these shapes work; and the registry's
fallback configs are exercised at shapes nobody tuned. Run it from the checkout installed
with ``pip install -e .`` on a CUDA machine:

    python bench/public_ops_small_shapes.py
"""

from __future__ import annotations

import sys
import warnings

import torch
import torch.nn.functional as F

import helion_kernels as hk
from helion_kernels.limits import max_full_row_n
from helion_kernels.verify import check_outputs

SHAPES = [(1, 3, 1), (1, 64, 1), (5, 3, 1), (1, 3, 2), (3, 17, 1), (1000, 512, 4096), (333, 256, 1000)]


def cases(a, b, c, w, bias) -> dict:
    """name -> (op call, float64 reference call)."""
    n = b.shape[1]

    def ln():
        return F.layer_norm(a.double() @ b.double(), (n,), w.double(), bias.double(), 1e-5)

    def rms():
        return F.rms_norm(a.double() @ b.double(), (n,), w.double(), 1e-5)

    out = {
        "matmul": (lambda: hk.matmul(a, b), lambda: a.double() @ b.double()),
        "matmul_layernorm_split_n": (lambda: hk.matmul_layernorm_split_n(a, b, w, bias), ln),
        "matmul_rmsnorm_split_n": (lambda: hk.matmul_rmsnorm_split_n(a, b, w), rms),
        "matmul_rmsnorm_matmul": (lambda: hk.matmul_rmsnorm_matmul(a, b, c, w), lambda: rms() @ c.double()),
    }
    if n <= max_full_row_n(a.dtype, a.device):
        out["matmul_layernorm(fused=True)"] = (lambda: hk.matmul_layernorm(a, b, w, bias, fused=True), ln)
    return out


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")  # fallback-config warnings: untuned shapes are the point
    torch.manual_seed(0)
    failed = 0
    for dtype in (torch.bfloat16, torch.float32):
        for m, k, n in SHAPES:
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = (torch.randn(k, n, device="cuda") / k**0.5).to(dtype)
            w = torch.randn(n, device="cuda", dtype=dtype)
            bias = torch.randn(n, device="cuda", dtype=dtype)
            c = torch.randn(n, 8, device="cuda", dtype=dtype)
            for name, (op, ref) in cases(a, b, c, w, bias).items():
                try:
                    err = check_outputs(op(), ref(), dtype)
                    print(f"ok   {name:30s} {dtype} {m}x{k}x{n} rel {err:.2e}")
                except Exception as e:  # report every call, then the count
                    failed += 1
                    print(f"FAIL {name:30s} {dtype} {m}x{k}x{n} {type(e).__name__}: {str(e)[:200]}")
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
