"""Backward passes of the GEMM + norm ops: every input and parameter's gradient against
float64 autograd of the plain PyTorch composition, for every dtype, affine on and off, odd
shapes; ``gradcheck`` of the backward formulas themselves in float64; ``opcheck`` with
inputs that require grad; a compiled training step; bit-identical reruns.

On the CPU the kernels run in reference mode; on a CUDA machine the same tests run the
kernels with whatever the (test) registry gives. Tolerances: :data:`GRAD_TOLERANCE`
(bf16 5e-2, the authors' backward tolerance)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import helion_kernels as hk
from helion_kernels.techniques import deferred
from helion_kernels import autograd
from helion_kernels import runtime
from helion_kernels.techniques import postnorm, prenorm, split_n
from helion_kernels.techniques.prenorm.kernels import SPEC_BACKWARD as BACKWARD_SPEC
from helion_kernels.verify import check_outputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ON_DEVICE = pytest.mark.cuda if DEVICE == "cuda" else pytest.mark.ref_mode
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# |grad - ref| <= tol * (|ref| + rms(ref)) elementwise, against a float64 reference.
GRAD_TOLERANCE = {torch.bfloat16: 5e-2, torch.float16: 1e-2, torch.float32: 5e-3}
EPS = 1e-5

pytestmark = [ON_DEVICE, pytest.mark.filterwarnings("ignore::helion_kernels.registry.ConfigFallbackWarning")]


def _leaves(m, k, n, n2, dtype, seed, affine=True):
    """a [M, K], b [K, N], c [N, N2] in ``dtype``; fp32 norm parameters (as a model under
    autocast keeps them); all require grad."""
    gen = torch.Generator().manual_seed(seed)

    def leaf(t, dt=dtype):
        return t.to(DEVICE, dt).requires_grad_()

    return {
        "a": leaf(torch.randn(m, k, generator=gen)),
        "b": leaf(torch.randn(k, n, generator=gen) / k**0.5),
        "c": leaf(torch.randn(n, n2, generator=gen) / n**0.5),
        "w": leaf(1 + 0.2 * torch.randn(n, generator=gen), torch.float32) if affine else None,
        "bias": leaf(0.2 * torch.randn(n, generator=gen), torch.float32) if affine else None,
        "wk": leaf(1 + 0.2 * torch.randn(k, generator=gen), torch.float32) if affine else None,
        # the post-norm addends (a Linear bias, fp32 as under autocast; a residual) and an
        # nn.Linear-layout weight [N, K], passed as its transposed view
        "lb": leaf(0.5 * torch.randn(n, generator=gen), torch.float32),
        "res": leaf(torch.randn(m, n, generator=gen)),
        "wt": leaf(torch.randn(n, k, generator=gen) / k**0.5),
    }


def _h(x):
    """The post-norm addend cases' norm input, in plain PyTorch: ``x @ W^T + lb + res``."""
    return x["a"] @ x["wt"].t() + x["lb"] + x["res"]


# name -> (the op, the same function in plain PyTorch); both take the leaves dict.
OPS = {
    "matmul": (lambda x: hk.matmul(x["a"], x["b"]), lambda x: x["a"] @ x["b"]),
    "rmsnorm_matmul": (lambda x: hk.rmsnorm_matmul(x["a"], x["b"], x["wk"], EPS),
                       lambda x: F.rms_norm(x["a"], (x["a"].shape[1],), x["wk"], EPS) @ x["b"]),
    # fused=True: the dgrad kernel in the backward; fused=False: cuBLAS + the norm's backward.
    "rmsnorm_matmul_fused": (lambda x: hk.rmsnorm_matmul(x["a"], x["b"], x["wk"], EPS, fused=True),
                             lambda x: F.rms_norm(x["a"], (x["a"].shape[1],), x["wk"], EPS) @ x["b"]),
    "rmsnorm_matmul_unfused": (lambda x: hk.rmsnorm_matmul(x["a"], x["b"], x["wk"], EPS, fused=False),
                               lambda x: F.rms_norm(x["a"], (x["a"].shape[1],), x["wk"], EPS) @ x["b"]),
    "matmul_layernorm_fused": (
        lambda x: hk.matmul_layernorm(x["a"], x["b"], x["w"], x["bias"], EPS, fused=True),
        lambda x: F.layer_norm(x["a"] @ x["b"], (x["b"].shape[1],), x["w"], x["bias"], EPS)),
    "matmul_layernorm": (lambda x: hk.matmul_layernorm(x["a"], x["b"], x["w"], x["bias"], EPS),
                         lambda x: F.layer_norm(x["a"] @ x["b"], (x["b"].shape[1],), x["w"], x["bias"], EPS)),
    "matmul_layernorm_unfused": (
        lambda x: hk.matmul_layernorm(x["a"], x["b"], x["w"], x["bias"], EPS, fused=False),
        lambda x: F.layer_norm(x["a"] @ x["b"], (x["b"].shape[1],), x["w"], x["bias"], EPS)),
    "matmul_rmsnorm": (lambda x: hk.matmul_rmsnorm(x["a"], x["b"], x["w"], EPS),
                       lambda x: F.rms_norm(x["a"] @ x["b"], (x["b"].shape[1],), x["w"], EPS)),
    "matmul_rmsnorm_unfused": (lambda x: hk.matmul_rmsnorm(x["a"], x["b"], x["w"], EPS, fused=False),
                               lambda x: F.rms_norm(x["a"] @ x["b"], (x["b"].shape[1],), x["w"], EPS)),
    # a Linear bias and a residual added before the norm, the weight read as W.t() in place
    "matmul_layernorm_addends": (
        lambda x: hk.matmul_layernorm(x["a"], x["wt"].t(), x["w"], x["bias"], EPS, linear_bias=x["lb"],
                                      residual=x["res"]),
        lambda x: F.layer_norm(_h(x), (x["b"].shape[1],), x["w"], x["bias"], EPS)),
    "matmul_layernorm_addends_unfused": (
        lambda x: hk.matmul_layernorm(x["a"], x["wt"].t(), x["w"], x["bias"], EPS, linear_bias=x["lb"],
                                      residual=x["res"], fused=False),
        lambda x: F.layer_norm(_h(x), (x["b"].shape[1],), x["w"], x["bias"], EPS)),
    "matmul_rmsnorm_addends": (
        lambda x: hk.matmul_rmsnorm(x["a"], x["wt"].t(), x["w"], EPS, linear_bias=x["lb"], residual=x["res"]),
        lambda x: F.rms_norm(_h(x), (x["b"].shape[1],), x["w"], EPS)),
    "matmul_rmsnorm_addends_unfused": (
        lambda x: hk.matmul_rmsnorm(x["a"], x["wt"].t(), x["w"], EPS, linear_bias=x["lb"], residual=x["res"],
                                    fused=False),
        lambda x: F.rms_norm(_h(x), (x["b"].shape[1],), x["w"], EPS)),
    "matmul_layernorm_split_n": (
        lambda x: hk.matmul_layernorm_split_n(x["a"], x["b"], x["w"], x["bias"], EPS),
        lambda x: F.layer_norm(x["a"] @ x["b"], (x["b"].shape[1],), x["w"], x["bias"], EPS)),
    "matmul_rmsnorm_split_n": (lambda x: hk.matmul_rmsnorm_split_n(x["a"], x["b"], x["w"], EPS),
                               lambda x: F.rms_norm(x["a"] @ x["b"], (x["b"].shape[1],), x["w"], EPS)),
    "matmul_rmsnorm_matmul": (
        lambda x: hk.matmul_rmsnorm_matmul(x["a"], x["b"], x["c"], x["w"], EPS),
        lambda x: F.rms_norm(x["a"] @ x["b"], (x["b"].shape[1],), x["w"], EPS) @ x["c"]),
    "matmul_rmsnorm_matmul_fused": (
        lambda x: hk.matmul_rmsnorm_matmul(x["a"], x["b"], x["c"], x["w"], EPS, fused=True),
        lambda x: F.rms_norm(x["a"] @ x["b"], (x["b"].shape[1],), x["w"], EPS) @ x["c"]),
    "matmul_rmsnorm_matmul_unfused": (
        lambda x: hk.matmul_rmsnorm_matmul(x["a"], x["b"], x["c"], x["w"], EPS, fused=False),
        lambda x: F.rms_norm(x["a"] @ x["b"], (x["b"].shape[1],), x["w"], EPS) @ x["c"]),
}
SHAPES = [(1, 48, 96, 40), (33, 100, 20, 12), (64, 64, 128, 64)]  # M = 1; K, N not powers of two


def _grads_against_f64(name, leaves, dtype, probe_seed=0):
    op, ref = OPS[name]
    out = op(leaves)
    gen = torch.Generator().manual_seed(probe_seed)
    probe = torch.randn(out.shape, generator=gen).to(DEVICE)
    (out.float() * probe).sum().backward()
    used = {k: v.grad for k, v in leaves.items() if v is not None and v.grad is not None}
    ref_leaves = {k: (None if v is None else v.detach().double().requires_grad_()) for k, v in leaves.items()}
    (ref(ref_leaves) * probe.double()).sum().backward()
    expected = {k: v.grad for k, v in ref_leaves.items() if v is not None and v.grad is not None}
    assert set(used) == set(expected), (set(used), set(expected))
    for key in used:
        try:
            check_outputs(used[key], expected[key], dtype, tolerance=GRAD_TOLERANCE[dtype])
        except AssertionError as err:
            raise AssertionError(f"gradient of {key}: {err}") from None
        assert used[key].dtype == leaves[key].dtype  # gradients land in the parameter's dtype
    return used


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(OPS))
def test_gradients_match_float64(name, dtype, shape, affine):
    _grads_against_f64(name, _leaves(*shape, dtype, seed=sum(shape), affine=affine), dtype)


@pytest.mark.parametrize("name", list(OPS))
def test_gradients_with_large_row_means(name):
    """Rows whose mean is large against their spread (the cancellation case of LayerNorm);
    the large part is exact in TF32 (30 * 3), so the fp32 forward on a GPU is held to fp32."""
    leaves = _leaves(17, 40, 24, 8, torch.float32, seed=3)
    with torch.no_grad():
        leaves["a"][:, 0] = 30.0
        leaves["b"][0] = 3.0
    _grads_against_f64(name, leaves, torch.float32)


@pytest.mark.parametrize("name", list(OPS))
def test_double_backward_is_a_clear_error(name):
    """create_graph=True raises, also where the incoming gradient needs no grad (out.sum()),
    which once_differentiable alone lets through with silently constant gradients."""
    leaves = _leaves(9, 16, 24, 8, torch.float32, seed=6)
    out = OPS[name][0](leaves)
    with pytest.raises(RuntimeError, match="the backward is not differentiable; create_graph=True"):
        torch.autograd.grad(out.sum(), leaves["a"], create_graph=True)


def test_only_requested_gradients_are_computed():
    leaves = _leaves(8, 16, 24, 8, torch.float32, seed=4)
    leaves["b"].requires_grad_(False)
    leaves["bias"].requires_grad_(False)
    hk.matmul_layernorm(leaves["a"], leaves["b"], leaves["w"], leaves["bias"]).sum().backward()
    assert leaves["a"].grad is not None and leaves["w"].grad is not None
    assert leaves["b"].grad is None and leaves["bias"].grad is None


def test_statistics_are_not_differentiable():
    leaves = _leaves(8, 16, 24, 8, torch.float32, seed=5)
    y, mean, rstd = hk.matmul_layernorm(leaves["a"], leaves["b"], leaves["w"], leaves["bias"], return_stats=True)
    assert y.requires_grad and not mean.requires_grad and not rstd.requires_grad
    c, r = hk.rmsnorm_matmul(leaves["a"], leaves["b"][:, :8], return_rstd=True)
    assert c.requires_grad and not r.requires_grad


@pytest.mark.parametrize(("name", "keys"), [("matmul_layernorm_fused", ("a", "b", "w", "bias")),
                                            ("rmsnorm_matmul_fused", ("a", "b", "wk"))])
def test_backward_is_deterministic(name, keys):
    """The same inputs give the same gradient bits (fp32 sums over rows, no atomics)."""
    runs = []
    for _ in range(2):
        leaves = _leaves(64, 64, 128, 64, torch.bfloat16, seed=6)
        OPS[name][0](leaves).float().pow(2).sum().backward()
        runs.append([leaves[k].grad for k in keys])
    for x, y in zip(*runs):
        assert torch.equal(x, y)


def test_backward_dispatch(monkeypatch):
    """fused=True runs the dgrad kernel in the backward, fused=False neither kernel,
    fused=None the fused forward and (in reference mode, which has no registry decisions)
    the fused backward; on a GPU fused=None follows the registry (next test)."""
    seen = []
    real = prenorm.runtime.launch
    monkeypatch.setattr(prenorm.runtime, "launch", lambda spec, args: seen.append(spec.name) or real(spec, args))
    both = ["rmsnorm_matmul", "rmsnorm_matmul_backward"]
    cases = ((True, both), (False, [])) + (((None, both),) if DEVICE == "cpu" else ())
    for fused, expected in cases:
        seen.clear()
        x = _leaves(9, 24, 20, 12, torch.float32, seed=1)
        hk.rmsnorm_matmul(x["a"], x["b"], x["wk"], fused=fused).sum().backward()
        assert seen == expected, fused


@pytest.mark.parametrize("choice", ["fused", "unfused"])
def test_backward_follows_the_registry(choice, decisions):
    """Outside reference mode, fused=None reads the dispatch decision tuning recorded."""
    import helion

    from helion_kernels import registry
    from helion_kernels.techniques.prenorm.kernels import SPEC_BACKWARD as SPEC
    from helion_kernels.spec import Shape

    args = SPEC.make_args(Shape(9, 24, 20), torch.float32, "cpu", 0)
    meta = {"dispatch": {"choice": choice, "fused_ms": 1.0, "unfused_ms": 2.0,
                         "unfused": SPEC.dispatch_baseline}}
    registry.save_entry(SPEC.name, registry.gpu_key(args[0].device),
                        registry.Entry(Shape(9, 24, 20), "float32", helion.Config(block_sizes=[16, 16, 16, 16]), meta))
    assert runtime.decide(BACKWARD_SPEC, args, None).fused is (choice == "fused")
    assert runtime.decide(BACKWARD_SPEC, args, True).fused and not runtime.decide(BACKWARD_SPEC, args, False).fused


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("name", ["matmul", "rmsnorm_matmul", "matmul_layernorm", "matmul_rmsnorm_split_n",
                                  "matmul_rmsnorm_matmul"])
def test_compiled_training_step(name):
    """Forward and backward under torch.compile(fullgraph=True) give the eager gradients."""
    op, _ = OPS[name]

    def step(leaves):
        loss = op(leaves).float().pow(2).mean()
        loss.backward()
        return loss

    eager = _leaves(33, 48, 40, 24, torch.float32, seed=7)
    step(eager)
    compiled = _leaves(33, 48, 40, 24, torch.float32, seed=7)
    torch._dynamo.reset()
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    torch.compile(lambda x: op(x).float().pow(2).mean(), fullgraph=True, backend=backend)(compiled).backward()
    for key, leaf in eager.items():
        if leaf is not None and leaf.grad is not None:
            torch.testing.assert_close(compiled[key].grad, leaf.grad, rtol=1e-4, atol=1e-5, msg=key)


def _opcheck_cases():
    x = _leaves(9, 24, 20, 12, torch.float32, seed=8)
    a, b, c, w, bias = x["a"], x["b"], x["c"], x["w"], x["bias"]
    lb, res, wt = x["lb"], x["res"], x["wt"]
    return [
        ("matmul_layernorm", postnorm._LAYERNORM, (a, b, w, bias, EPS, True, None, True, None, None)),
        ("matmul_layernorm_unfused", postnorm._LAYERNORM, (a, b, w, bias, EPS, False, False, True, None, None)),
        ("matmul_layernorm_addends", postnorm._LAYERNORM, (a, wt.t(), w, bias, EPS, False, None, True, lb, res)),
        ("matmul_layernorm_addends_unfused", postnorm._LAYERNORM,
         (a, wt.t(), w, bias, EPS, False, False, True, lb, res)),
        ("matmul_rmsnorm", postnorm._RMSNORM, (a, b, w, EPS, True, False, True, None, None)),
        ("matmul_rmsnorm_fused", postnorm._RMSNORM, (a, b, w, EPS, False, True, True, None, None)),
        ("matmul_rmsnorm_addends", postnorm._RMSNORM, (a, b, w, EPS, False, None, True, lb, res)),
        ("rmsnorm_matmul", prenorm._OP, (a, b, EPS, None)),
        ("rmsnorm_matmul_unfused", prenorm._OP, (a, b, EPS, False)),
        # a column-major a (a transposed activation): x_hat is built from the contiguous copy
        ("rmsnorm_matmul_unfused_column_major_a", prenorm._OP, (a.t().contiguous().t(), b, EPS, False)),
        ("rmsnorm_matmul_unfused_no_columns", prenorm._OP, (a, b[:, :0], EPS, None)),
        # b = W.t() (a Linear weight): dB comes back laid out as b, W's gradient row-major
        ("rmsnorm_matmul_column_major_b", prenorm._OP, (a, wt.t(), EPS, None)),
        ("rmsnorm_matmul_unfused_column_major_b", prenorm._OP, (a, wt.t(), EPS, False)),
        ("matmul_rmsnorm_matmul_column_major_b", deferred._DEFERRED, (a, wt.t(), c, EPS, False)),
        ("matmul_layernorm_split_n", split_n._LAYERNORM, (a, b, w, bias, EPS, None)),
        ("matmul_rmsnorm_matmul", deferred._DEFERRED, (a, b, c, EPS, True)),
        ("matmul_rmsnorm_matmul_unfused", deferred._DEFERRED, (a, b, c, EPS, False)),
    ]


@pytest.mark.parametrize(("name", "op", "args"), _opcheck_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_opcheck_with_autograd(name, op, args):
    torch.library.opcheck(op.custom_op, args)


def test_eager_training_calls_skip_the_dispatcher(monkeypatch):
    """A call autograd records runs the op's autograd Function (its backward, without the
    dispatcher); one it does not, the direct implementation; neither the registered op."""
    leaves = _leaves(8, 16, 24, 8, torch.float32, seed=9)
    seen = []
    op = postnorm._LAYERNORM
    real = op.function.apply
    monkeypatch.setattr(op, "custom_op", lambda *a: pytest.fail("an eager call went through the dispatcher"))
    monkeypatch.setattr(op.function, "apply", lambda *a: seen.append("function") or real(*a))
    y = hk.matmul_layernorm(leaves["a"], leaves["b"], leaves["w"], leaves["bias"])
    assert type(y.grad_fn).__name__ == "matmul_layernormBackward"
    with torch.no_grad():
        hk.matmul_layernorm(leaves["a"], leaves["b"], leaves["w"], leaves["bias"])
    assert seen == ["function"]


def test_unfused_prenorm_backward_reads_the_kept_x_hat(monkeypatch):
    """After the unfused forward, ``rmsnorm_matmul`` saves that forward's ``x_hat`` [M, K]
    and its backward rebuilds none (neither the norm backward that writes one nor
    ``rms_x_hat`` runs; the gradients themselves are checked with the other ops'); after
    the fused forward nothing is kept."""
    x = _leaves(9, 24, 20, 12, torch.float32, seed=10)
    c = hk.rmsnorm_matmul(x["a"], x["b"], x["wk"], EPS, fused=False)
    assert c.grad_fn.saved_tensors[3].shape == x["a"].shape
    fused = hk.rmsnorm_matmul(x["a"], x["b"], x["wk"], EPS, fused=True)
    assert fused.grad_fn.saved_tensors[3].numel() == 0
    for name in ("prenorm_norm_backward", "rms_x_hat"):
        monkeypatch.setattr(prenorm, name, lambda *args, name=name: pytest.fail(f"the backward ran {name}"))
    c.sum().backward()
    assert x["a"].grad is not None and x["b"].grad is not None and x["wk"].grad is not None


@pytest.mark.parametrize("fused", [False, None, True])
def test_prenorm_training_compiles_once_for_every_m(fused, monkeypatch):
    """Under ``torch.compile(dynamic=True)`` what the first M of a training step through the
    pre-norm op compiles serves every other M, with the right gradients: the op's ``x_hat`` output (M rows after
    the unfused path, none after the fused kernel) has a row count the graph learns at run
    time, so no path decision is taken while tracing. With ``fused=None`` the registry
    decides, as on a GPU (reference mode would always run the kernel)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    if fused is None:
        monkeypatch.setattr(runtime, "reference_mode", lambda kernel: False)
    b = _leaves(8, 48, 20, 8, torch.float32, seed=11)["b"]
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    step = torch.compile(lambda x, e: hk.rmsnorm_matmul(x, b, None, e, fused=fused).square().sum(),
                         fullgraph=True, dynamic=True, backend=counter)
    first = None
    for m in (33, 17, 5, 64, 9, 12, 40, 21, 3, 50):  # more M than dynamo's recompile limit (8)
        x = _leaves(m, 48, 20, 8, torch.float32, seed=m)["a"]
        step(x, EPS).backward()
        first = first or counter.frame_count
        ref = {k: t.detach().double().requires_grad_() for k, t in (("a", x), ("b", b))}
        (F.rms_norm(ref["a"], (48,), None, EPS) @ ref["b"]).square().sum().backward()
        for key, leaf in (("a", x), ("b", b)):  # fp32's tolerance: a GPU kernel's tl.dot runs in TF32
            try:
                check_outputs(leaf.grad, ref[key].grad, torch.float32, tolerance=GRAD_TOLERANCE[torch.float32])
            except AssertionError as err:
                raise AssertionError(f"M = {m}, gradient of {key}: {err}") from None
        b.grad = None
    assert counter.frame_count == first  # what the first M compiled served every other M


def test_prenorm_static_graphs_have_no_run_time_sizes(monkeypatch):
    """A graph compiled for static sizes takes the registry's path decision while tracing, so
    neither its forward nor its backward has a size learnt at run time (which would keep
    ``mode="reduce-overhead"`` from CUDA-graphing it); a dynamic graph has one, x_hat's rows."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    monkeypatch.setattr(runtime, "reference_mode", lambda kernel: False)  # the registry decides
    b = _leaves(8, 24, 10, 8, torch.float32, seed=13)["b"]
    for dynamic, expected in ((False, [False, False]), (True, [True, True])):
        unbacked = []

        def inspect(gm, _inputs, unbacked=unbacked):
            unbacked.append(any(free_unbacked_symbols(n.meta["val"]) for n in gm.graph.nodes
                                if n.meta.get("val") is not None))
            return make_boxed_func(gm.forward)

        torch._dynamo.reset()
        step = torch.compile(lambda x: hk.rmsnorm_matmul(x, b, None, EPS).square().sum(), fullgraph=True,
                             dynamic=dynamic, backend=aot_autograd(fw_compiler=inspect, bw_compiler=inspect))
        step(_leaves(7, 24, 10, 8, torch.float32, seed=14)["a"]).backward()
        assert unbacked == expected, dynamic


def test_prenorm_keeps_no_x_hat_for_a_frozen_weight():
    """``x_hat`` only serves the wgrad: with ``b`` not requiring grad nothing more than
    ``a``, ``b`` and ``rstd`` is saved."""
    x = _leaves(9, 24, 20, 12, torch.float32, seed=12)
    c = hk.rmsnorm_matmul(x["a"], x["b"].detach(), None, EPS, fused=False)
    assert c.grad_fn.saved_tensors[3].numel() == 0
    c.sum().backward()
    ref = x["a"].detach().double().requires_grad_()
    (F.rms_norm(ref, (24,), None, EPS) @ x["b"].detach().double()).sum().backward()
    check_outputs(x["a"].grad, ref.grad, torch.float32, tolerance=GRAD_TOLERANCE[torch.float32])


# --- gradcheck of the backward formulas (float64, any machine) ---------------------------


class _PostNorm(torch.autograd.Function):
    """float64 forward of ``norm(a @ b [+ lb + res]) * w + bias`` with the ops' backward
    formula (addends only with ``saved``: the recomputing backward has none)."""

    @staticmethod
    def forward(ctx, kind, saved, a, b, w, bias, lb=None, res=None):
        cc = a @ b if lb is None else a @ b + lb + res
        if kind == "layernorm":
            var, mean = torch.var_mean(cc, dim=1, correction=0)
            rstd = torch.rsqrt(var + EPS)
            y = (cc - mean[:, None]) * rstd[:, None]
        else:
            mean, rstd = None, torch.rsqrt(cc.pow(2).mean(dim=1) + EPS)
            y = cc * rstd[:, None]
        ctx.kind, ctx.saved = kind, saved
        ctx.addend_dtypes = (None, None) if lb is None else (lb.dtype, res.dtype)
        ctx.save_for_backward(a, b, w, bias, cc, mean, rstd)
        return y * w + (bias if bias is not None else 0)

    @staticmethod
    def backward(ctx, dy):
        """With the forward's product and statistics (``saved``), or recomputing them."""
        a, b, w, bias, cc, mean, rstd = ctx.saved_tensors
        needs = (True, True, True, bias is not None, True, True)
        kept = (cc, mean, rstd) if ctx.saved else None
        return (None, None, *postnorm.postnorm_grads(ctx.kind, a, b, w, bias, EPS, dy, needs, kept, ctx.addend_dtypes))


class _PreNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        rstd = torch.rsqrt(a.pow(2).mean(dim=1) + EPS)
        ctx.save_for_backward(a, b, rstd)
        return (a * rstd[:, None]) @ b

    @staticmethod
    def backward(ctx, dc):
        return prenorm.rmsnorm_matmul_grads(*ctx.saved_tensors, dc)


class _PreNormKept(torch.autograd.Function):
    """The unfused path's backward, which keeps the forward's x_hat."""

    @staticmethod
    def forward(ctx, a, b):
        rstd = torch.rsqrt(a.pow(2).mean(dim=1) + EPS)
        x_hat = a * rstd[:, None]
        ctx.save_for_backward(a, b, rstd, x_hat)
        return x_hat @ b

    @staticmethod
    def backward(ctx, dc):
        return prenorm.kept_x_hat_grads(*ctx.saved_tensors, dc)


class _Deferred(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, c):
        x = a @ b
        rstd = torch.rsqrt(x.pow(2).mean(dim=1) + EPS)
        ctx.save_for_backward(a, b, c, x, rstd)
        return F.rms_norm(x, (b.shape[1],), None, EPS) @ c

    @staticmethod
    def backward(ctx, dout):
        return deferred.deferred_grads(*ctx.saved_tensors, dout, (True, True, True))


@pytest.mark.ref_mode  # float64 on the CPU, whatever the session
def test_gradcheck_backward_formulas():
    gen = torch.Generator().manual_seed(10)

    def t(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).requires_grad_()

    a, b, c, w, bias = t(3, 5), t(5, 4), t(4, 2), t(4), t(4)
    for saved in (True, False):
        assert torch.autograd.gradcheck(lambda a, b, w, bias: _PostNorm.apply("layernorm", saved, a, b, w, bias),
                                        (a, b, w, bias))
        assert torch.autograd.gradcheck(lambda a, b, w: _PostNorm.apply("rmsnorm", saved, a, b, w, None), (a, b, w))
    lb, res = t(4), t(3, 4)
    for kind in ("layernorm", "rmsnorm"):
        assert torch.autograd.gradcheck(
            lambda a, b, w, bias, lb, res: _PostNorm.apply(kind, True, a, b, w, bias, lb, res), (a, b, w, bias, lb, res))
    assert torch.autograd.gradcheck(_PreNorm.apply, (a, b))
    assert torch.autograd.gradcheck(_PreNormKept.apply, (a, b))
    assert torch.autograd.gradcheck(_Deferred.apply, (a, b, c))
    dc = t(3, 4).detach()
    (a @ b).backward(dc)
    torch.testing.assert_close(autograd.matmul_grads(a.detach(), b.detach(), dc), (a.grad, b.grad))
