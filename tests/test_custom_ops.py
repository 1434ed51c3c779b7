"""Every public op is a ``torch.library`` custom op (namespace ``helion_kernels``): it passes
``torch.library.opcheck``, a model calling it compiles with ``torch.compile(fullgraph=True)``
and gives the eager result, the op is one node of the traced graph, and eager calls skip the
dispatcher. Reference mode on CPU (the kernels run eagerly; the fake implementations and
Dynamo's tracing of the Python wrappers are the same on any device)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import helion_kernels as hk
from helion_kernels.techniques import attention, deferred, gemm, postnorm, prenorm, split_n

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_GPU = pytest.mark.cuda if DEVICE == "cuda" else pytest.mark.ref_mode  # the same tests on CUDA


def _gemm_inputs(m=9, k=24, n=20, n2=12, dtype=torch.float32):
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(m, k, generator=gen).to(DEVICE, dtype)
    b = (torch.randn(k, n, generator=gen) / k**0.5).to(DEVICE, dtype)
    c = (torch.randn(n, n2, generator=gen) / n**0.5).to(DEVICE, dtype)
    w = (1 + 0.1 * torch.randn(n, generator=gen)).to(DEVICE)
    bias = (0.1 * torch.randn(n, generator=gen)).to(DEVICE)
    return a, b, c, w, bias


def _jagged_inputs(dtype=torch.float32):
    gen = torch.Generator().manual_seed(6)
    qo, ko = torch.tensor([0, 5, 5, 12], device=DEVICE), torch.tensor([0, 8, 11, 16], device=DEVICE)
    q, k, v = (torch.randn(n, 2, 16, generator=gen).to(DEVICE, dtype) for n in (12, 16, 16))
    params = [(1 + 0.1 * torch.randn(32, generator=gen)).to(DEVICE) for _ in range(3)]
    return q, k, v, qo, ko, params


def _op_cases():
    """(id, custom op, positional args of the op)."""
    a, b, c, w, bias = _gemm_inputs()
    q, k, v, qo, ko, (lw, lb, rw) = _jagged_inputs()
    # the pre-norm ops' rstd, the backward ops' output gradient and "no kept x_hat"
    dc, rstd = torch.randn(a.shape[0], b.shape[1], device=DEVICE), torch.rand(a.shape[0], device=DEVICE) + 0.5
    no_x_hat = a.new_empty(0, a.shape[1])
    return [
        ("matmul", gemm._OP, (a, b)),
        ("rmsnorm_matmul", prenorm._OP, (a, b.t().contiguous().t(), 1e-5, None)),
        ("rmsnorm_matmul_given_rstd", prenorm._GIVEN_RSTD, (a, b.t().contiguous().t(), rstd, None)),
        ("rmsnorm_matmul_given_rstd_unfused", prenorm._GIVEN_RSTD, (a, b, rstd, False)),
        ("rmsnorm_matmul_grads_kept_x_hat", prenorm._GRADS, (a, b, dc, rstd, torch.randn_like(a), None, True, True)),
        ("rmsnorm_matmul_grads_column_major_b", prenorm._GRADS,
         (a, b.t().contiguous().t(), dc, rstd, no_x_hat, False, True, True)),
        ("rmsnorm_matmul_grads_dgrad_only", prenorm._GRADS, (a, b, dc, rstd, no_x_hat, False, True, False)),
        ("rmsnorm_matmul_backward", prenorm._DGRAD, (a, b, dc, rstd, True)),
        ("matmul_layernorm", postnorm._LAYERNORM, (a, b, w, bias, 1e-5, True, None, False, None, None)),
        ("matmul_layernorm_unfused", postnorm._LAYERNORM, (a, b, w, None, 1e-5, False, False, False, None, None)),
        ("matmul_layernorm_kept", postnorm._LAYERNORM, (a, b, w, bias, 1e-5, False, True, True, None, None)),
        ("matmul_layernorm_addends", postnorm._LAYERNORM,
         (a, b.t().contiguous().t(), w, bias, 1e-5, False, True, True, bias, torch.randn_like(a @ b))),
        ("matmul_rmsnorm", postnorm._RMSNORM, (a, b, w, 1e-5, True, True, False, None, None)),
        ("matmul_rmsnorm_addends_unfused", postnorm._RMSNORM,
         (a, b, w, 1e-5, True, False, False, w, torch.randn_like(a @ b))),
        ("matmul_layernorm_split_n", split_n._LAYERNORM, (a, b, w, bias, 1e-5, None)),
        ("matmul_rmsnorm_split_n", split_n._RMSNORM, (a, b, None, 1e-5, None)),
        ("matmul_rmsnorm_matmul", deferred._DEFERRED, (a, b, c, 1e-5, True)),
        ("matmul_rmsnorm_matmul_unfused", deferred._DEFERRED, (a, b, c, 1e-5, False)),
        ("gdpa", attention._GDPA, (q, k, v, qo, ko, 7, 8, "silu", 0.5, True)),
        ("flash_norm_attention", attention._FNA,
         (q, k, v, qo, ko, 7, 8, lw, lb, rw, 1e-5, "fast_gelu", 1.0, True, False)),
        ("flash_norm_attention_kept", attention._FNA,
         (q, k, v, qo, ko, 7, 8, lw, lb, rw, 1e-5, "fast_gelu", 1.0, True, True)),
        ("gdpa_backward", attention._GDPA_BACKWARD, (q, k, v, torch.randn_like(q), qo, ko, 7, 8, "relu", 0.5)),
        ("flash_norm_attention_backward", attention._FNA_BACKWARD,
         (torch.randn_like(q), q, k, v, torch.randn_like(q), torch.rand(3, q.shape[0], device=q.device) + 0.5, qo, ko, lw, lb, rw, 7, 8,
          "fast_gelu", 1.0, True, True)),
    ]


CASES = _op_cases()
# On a GPU the ops run whatever the (empty, test) registry gives: default configs, with a warning.
pytestmark = pytest.mark.filterwarnings("ignore::helion_kernels.registry.ConfigFallbackWarning")


@ON_GPU
@pytest.mark.parametrize(("name", "op", "args"), CASES, ids=[c[0] for c in CASES])
def test_opcheck(name, op, args):
    assert op.custom_op._qualname == f"helion_kernels::{op.name}"
    torch.library.opcheck(op.custom_op, args)


@pytest.mark.ref_mode
@pytest.mark.parametrize(("name", "op", "args"), CASES, ids=[c[0] for c in CASES])
def test_eager_calls_skip_the_dispatcher(name, op, args, monkeypatch):
    """An eager call runs the implementation directly (the dispatcher costs 10-30 us)."""
    expected = op.impl(*args)
    monkeypatch.setattr(op, "custom_op", lambda *a: pytest.fail("eager call went through the dispatcher"))
    out = op(*args)
    for x, y in zip(out if isinstance(out, tuple) else (out,), expected if isinstance(expected, tuple) else (expected,)):
        if x is None:  # an optional output not asked for: the op's empty stand-in
            assert y.numel() == 0
        else:
            torch.testing.assert_close(x, y)


def _model_calls():
    """(id, function of tensors calling one public op the way a model does)."""
    a, b, c, w, bias = _gemm_inputs(dtype=torch.bfloat16)
    q, k, v, qo, ko, (lw, lb, rw) = _jagged_inputs()
    return [
        ("matmul", lambda a: hk.matmul(a, b) * 2, a),
        ("rmsnorm_matmul", lambda a: hk.rmsnorm_matmul(a, b, w.new_ones(24), return_rstd=True)[0] + 1, a),
        ("rmsnorm_matmul_given_rstd",
         lambda a: hk.rmsnorm_matmul(a, b, w.new_ones(24), rstd=torch.rsqrt(a.float().square().mean(1) + 1e-5)), a),
        ("matmul_layernorm", lambda a: hk.matmul_layernorm(torch.relu(a), b, w, bias).float().sum(1), a),
        ("matmul_layernorm_stats", lambda a: hk.matmul_layernorm(a, b, w, bias, return_stats=True)[2], a),
        ("matmul_layernorm_unfused", lambda a: hk.matmul_layernorm(a, b, w, bias, fused=False), a),
        ("matmul_rmsnorm", lambda a: hk.matmul_rmsnorm(a, b, w, fused=True) - 1, a),
        ("matmul_layernorm_split_n", lambda a: hk.matmul_layernorm_split_n(a, b, w, bias) * 3, a),
        ("matmul_rmsnorm_split_n", lambda a: hk.matmul_rmsnorm_split_n(a, b, w, return_rstd=True)[1], a),
        ("matmul_rmsnorm_matmul", lambda a: hk.matmul_rmsnorm_matmul(a, b, c, w), a),
        ("gdpa", lambda q: hk.gdpa(q, k, v, qo, ko, 7, 8, activation="relu") + q, q),
        ("flash_norm_attention", lambda q: hk.flash_norm_attention(q * 2, k, v, qo, ko, 7, 8, lw, lb, rw), q),
    ]


MODEL_CALLS = _model_calls()


def _ops_in_graph(fn, x) -> list[str]:
    """Compile ``fn`` with fullgraph=True through AOTAutograd; the helion_kernels ops in the
    traced graph, and the compiled function's result next to the eager one."""
    seen: list[str] = []

    def backend(gm, example_inputs):
        from torch._dynamo.backends.common import aot_autograd

        def record(graph, _):
            seen.extend(str(n.target) for n in graph.graph.nodes if "helion_kernels" in str(n.target))
            return graph

        return aot_autograd(fw_compiler=record)(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    torch.testing.assert_close(compiled(x), fn(x))
    return seen


@ON_GPU
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit, on importing torch._dynamo
@pytest.mark.parametrize(("name", "fn", "x"), MODEL_CALLS, ids=[c[0] for c in MODEL_CALLS])
def test_fullgraph_compile(name, fn, x):
    """No graph break (fullgraph=True would raise), the op is one node of the graph, and the
    compiled result is the eager one."""
    op = name.removesuffix("_stats").removesuffix("_unfused")
    assert _ops_in_graph(fn, x) == [f"helion_kernels.{op}.default"]


@ON_GPU
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_fullgraph_compile_with_inductor():
    """The default backend too, with two ops in one graph (pre-norm GEMM, then a post-norm one)."""
    a, b, *_ = _gemm_inputs(dtype=torch.bfloat16)  # a [9, 24], b [24, 20]
    gen = torch.Generator().manual_seed(7)
    b2 = (torch.randn(20, 16, generator=gen) / 4).to(DEVICE, torch.bfloat16)
    w2, bias2 = (1 + 0.1 * torch.randn(16, generator=gen)).to(DEVICE), (0.1 * torch.randn(16, generator=gen)).to(DEVICE)

    def block(x, fused):
        return hk.matmul_layernorm(hk.rmsnorm_matmul(x, b), b2, w2, bias2, fused=fused)

    for fused in (None, False):  # unfused: cuBLAS + the inductor-compiled norm inside the op
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(block, fullgraph=True)(a, fused), block(a, fused))


@pytest.mark.ref_mode
def test_validation_runs_while_tracing():
    """Bad input is refused while Dynamo traces, as in eager (the checks read only metadata)."""
    a, b, *_ = _gemm_inputs()
    torch._dynamo.reset()
    compiled = torch.compile(lambda a: hk.matmul(a, b[:5]), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match="mismatched K"):
        compiled(a)


def _modules_after(statement: str) -> list[str]:
    code = (f"import sys; {statement}; "
            "print(sorted(m for m in ('helion', 'triton', 'pandas', 'matplotlib') if m in sys.modules))")
    return eval(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


@pytest.mark.ref_mode
def test_import_does_not_import_helion():
    """``import helion_kernels`` leaves Helion (seconds to import), Triton and pandas to the
    first call that needs them; the CLI's module (``--help``) needs pandas, not Helion."""
    assert _modules_after("import helion_kernels") == []
    assert _modules_after("import helion_kernels.cli") == ["pandas"]


@ON_GPU
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_dynamic_compile_with_a_changing_eps():
    """``dynamic=True`` traces a changing eps (or qk_scale) as a symbolic float, which the
    checks pass on unvalidated instead of breaking the graph."""
    a, b, c, w, bias = _gemm_inputs()
    q, k, v, qo, ko, _ = _jagged_inputs()
    calls = [lambda x, e: hk.matmul_rmsnorm(x, b, w, e), lambda x, e: hk.rmsnorm_matmul(x, b, None, e),
             lambda x, e: hk.matmul_layernorm(x, b, w, bias, e, fused=False),
             lambda x, e: hk.matmul_rmsnorm_matmul(x, b, c, w, e)]
    for fn in calls:
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend="aot_eager")
        for eps in (1e-5, 1e-6, 0.5):
            torch.testing.assert_close(compiled(a, eps), fn(a, eps))
    torch._dynamo.reset()
    gdpa = torch.compile(lambda q, s: hk.gdpa(q, k, v, qo, ko, 7, 8, qk_scale=s), fullgraph=True, dynamic=True,
                         backend="aot_eager")
    for scale in (0.5, 0.25):
        torch.testing.assert_close(gdpa(q, scale), hk.gdpa(q, k, v, qo, ko, 7, 8, qk_scale=scale))


@pytest.mark.ref_mode
def test_flags_and_numbers_are_type_checked():
    a, b, _, w, _ = _gemm_inputs()
    with pytest.raises(TypeError, match="matmul_layernorm: fused must be None, True or False, got 'yes'"):
        hk.matmul_layernorm(a, b, fused="yes")
    with pytest.raises(TypeError, match="matmul_rmsnorm: return_rstd must be True or False, got 'no'"):
        hk.matmul_rmsnorm(a, b, return_rstd="no")
    with pytest.raises(TypeError, match="rmsnorm_matmul: eps must be a real number, got str"):
        hk.rmsnorm_matmul(a, b, eps="1e-5")
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        hk.matmul_rmsnorm_split_n(a, b, w, eps=float("nan"))


@pytest.mark.ref_mode
def test_both_interpret_modes_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    a, b, *_ = _gemm_inputs()
    with pytest.raises(ValueError, match="both set; Helion runs one interpreter at a time"):
        hk.matmul(a, b)
