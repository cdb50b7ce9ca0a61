"""tracecomp as a torch.compile backend (tracecomp/torch): registration, the ATen table,
and small graphs compiled by tracecomp against eager PyTorch, values and gradients."""
import importlib.metadata
import logging
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (a test-only dependency)")
if not hasattr(torch, "compile"):          # tests/torch/ itself, seen as a namespace package
    pytest.skip("torch not installed (a test-only dependency)", allow_module_level=True)

import tracecomp.torch as tt  # noqa: E402
from tracecomp.torch import aten  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled(fn, **options):
    return torch.compile(fn, backend="tracecomp", options=options or None)


def close(a, b, dtype=torch.float32):
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a, b, **tol)


def test_import_tracecomp_does_not_import_torch():
    code = "import sys, tracecomp; assert 'torch' not in sys.modules, 'import tracecomp imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_backend_is_registered_by_name():
    assert "tracecomp" in torch._dynamo.list_backends()
    f = compiled(lambda x: (x * 2).sin())
    x = torch.randn(5)
    close(f(x), (x * 2).sin())


def _installed() -> bool:
    try:
        importlib.metadata.distribution("tracecomp")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _installed(), reason="tracecomp is not installed (no entry points)")
def test_the_entry_point_loads_the_backend_without_importing_tracecomp_torch():
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    assert "tracecomp" in eps.names, "reinstall tracecomp (pip install -e .) to refresh its entry points"
    assert eps["tracecomp"].value == "tracecomp.torch:backend"
    code = ("import sys, torch\n"
            "f = torch.compile(lambda x: x.exp() + 1, backend='tracecomp')\n"
            "x = torch.arange(4.0)\n"
            "assert torch.allclose(f(x), x.exp() + 1)\n"
            "assert 'tracecomp.torch' in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/")


def test_the_table_is_generated_from_ops_yaml_with_a_few_hand_written_rules():
    rules = tt.rules()
    generated = [r for r in rules.values() if r.origin.startswith("ops.yaml:")]
    assert len(generated) > 200
    assert rules["aten.add.Tensor"].origin.startswith("ops.yaml:") and rules["aten.add.Tensor"].op == "add"
    assert rules["aten.sum.dim_IntList"].op == "sum"          # found by argument names, not overload names
    assert rules["aten.bmm.default"].origin.startswith("ops.yaml:")
    for name in ("aten.view.default", "aten.native_layer_norm.default", "aten.convolution_backward.default",
                 "aten.max_pool2d_with_indices_backward.default", "aten.embedding.default"):
        assert rules[name].origin == "aten.py", name
    assert len(generated) > 4 * (len(rules) - len(generated))


def test_an_argument_tracecomp_lacks_must_hold_a_neutral_value():
    full = tt.rules()["aten.full.default"]
    assert full.refusal(([2, 3], 1.0), {"layout": torch.strided, "device": torch.device("cpu")}) is None
    assert "layout" in full.refusal(([2, 3], 1.0), {"layout": torch.sparse_coo})
    mm = tt.rules().get("aten.mm.dtype")
    if mm is not None:                  # mm with out_dtype: tracecomp's mm has no such argument
        assert "out_dtype" in mm.refusal((torch.ones(2, 2), torch.ones(2, 2), torch.float32), {})


def test_the_decompositions_keep_the_fused_attention_ops():
    table = tt.decompositions()
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default not in table
    assert torch.ops.aten.gelu_backward.default in table          # the rest of Core ATen's


@pytest.mark.parametrize("mask", ["causal", "additive"])
def test_grouped_query_attention_shares_key_heads_in_values_and_gradients(mask):
    """Llama's sdpa call: 4 query heads over 2 key/value heads (enable_gqa), which ATen's
    CPU flash kernel takes as they are; tracecomp repeats them and sums their gradients."""
    def f(q, k, v, m):
        kw = dict(is_causal=True) if m is None else dict(attn_mask=m)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 8, 16, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    m = None if mask == "causal" else torch.randn(2, 1, 8, 8, generator=g, dtype=torch.float64)
    reports = []
    inputs = [t.requires_grad_() for t in (q, k, v)]
    eager = [t.detach().clone().requires_grad_() for t in inputs]
    got, expected = compiled(f, strict=True, report=reports.append)(*inputs, m), f(*eager, m)
    close(got, expected, torch.float64)
    weights = torch.randn(got.shape, generator=g, dtype=torch.float64)
    (got * weights).sum().backward()
    (expected * weights).sum().backward()
    for a, b in zip(inputs, eager):
        close(a.grad, b.grad, torch.float64)
    ops = set().union(*(r.compiled for r in reports))
    assert "aten._scaled_dot_product_flash_attention_for_cpu_backward.default" in ops, ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_elementwise_reductions_and_matmul_with_gradients(dtype):
    def f(x, w, b):
        h = torch.tanh(x @ w + b) * torch.sigmoid(x.sum(1, keepdim=True))
        return (h.exp().mean(0) - h.amax(1).unsqueeze(1).pow(2).sum()).softmax(0)

    torch.manual_seed(0)
    args = [torch.randn(4, 3, dtype=dtype, requires_grad=True), torch.randn(3, 5, dtype=dtype, requires_grad=True),
            torch.randn(5, dtype=dtype, requires_grad=True)]
    before = dict(tt.counts)
    out = compiled(f)(*args)
    grads = torch.autograd.grad((out * torch.arange(5, dtype=dtype)).sum(), args)
    expected = f(*args)
    close(out, expected, dtype)
    for g, e in zip(grads, torch.autograd.grad((expected * torch.arange(5, dtype=dtype)).sum(), args)):
        close(g, e, dtype)
    assert tt.counts["forward"] == before.get("forward", 0) + 1
    assert tt.counts["backward"] == before.get("backward", 0) + 1


def test_integer_and_bool_inputs_and_outputs():
    def f(i, x, m):
        picked = x[i]                       # index.Tensor
        return torch.where(m, picked, -picked), (i * 3 + 1) // 2, m.logical_not()

    x = torch.randn(6, 4)
    i = torch.tensor([0, 5, 2], dtype=torch.int64)
    m = torch.tensor([[True, False, True, False]] * 3)
    for got, want in zip(compiled(f)(i, x, m), f(i, x, m)):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    i32 = i.to(torch.int32)
    torch.testing.assert_close(compiled(lambda i: i * 2 + 1)(i32), i32 * 2 + 1)


def test_under_no_grad_an_inference_graph_is_compiled():
    lin = torch.nn.Linear(4, 3)
    before = tt.counts["inference"]
    x = torch.randn(2, 4)
    with torch.no_grad():
        out = compiled(lin)(x)
        close(out, lin(x))
    assert not out.requires_grad
    assert tt.counts["inference"] == before + 1


def test_transposed_inputs_are_read_in_place_and_other_layouts_copied(caplog):
    def f(a, b):
        return a * 2 + b

    base = torch.randn(5, 3)
    a = base.t()                                    # dense, in another dim order: no copy
    b = torch.randn(3, 1).expand(3, 5)              # stride 0: copied, said once
    g = compiled(f)
    with caplog.at_level(logging.INFO, logger="tracecomp"):
        for _ in range(2):
            close(g(a, b), f(a, b))
    copies = [r for r in caplog.records if "not dense" in r.getMessage()]
    assert len(copies) == 1, [r.getMessage() for r in caplog.records]
    assert "input" in copies[0].getMessage()


def test_outputs_that_are_views_alias_like_eager():
    def f(x, w):
        h = x @ w
        return h, h.t(), x.view(-1), x

    x, w = torch.randn(3, 4), torch.randn(4, 2)
    got = compiled(f)(x, w)
    for g, e in zip(got, f(x, w)):
        close(g, e)
        assert g.stride() == e.stride()
    assert got[2].data_ptr() == x.data_ptr() and got[1].data_ptr() == got[0].data_ptr()


@pytest.mark.parametrize("grad", [False, True])
def test_an_output_in_another_dim_order_keeps_eager_strides_for_its_views(grad):
    """Attention's output takes its query's layout: (batch, token, head, dim) behind a
    (batch, head, token, dim) shape when the query is a transposed projection.  Returned
    with a view that relies on that layout (transposed back, then viewed), it comes out
    of the compiled code in that layout, so that PyTorch can take the view from it."""
    def f(x, w):
        b, t, _ = x.shape
        q = (x @ w).view(b, t, 4, 8).transpose(1, 2)
        a = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        return a, a.transpose(1, 2).view(b, t, -1)

    x, w = torch.randn(2, 8, 32) / 4, torch.randn(32, 32, requires_grad=grad)
    got, expected = compiled(f, strict=True)(x, w), f(x, w)
    for g, e in zip(got, expected):
        close(g, e)
        assert g.stride() == e.stride()
    assert got[1].data_ptr() == got[0].data_ptr()


def test_unknown_options_are_refused():
    f = torch.compile(lambda x: x + 1, backend="tracecomp", options={"no_such_option": 1})
    with pytest.raises(Exception, match="no_such_option"):
        f(torch.ones(2))
    assert aten.NEUTRAL["layout"](torch.strided)


def test_dynamo_dynamic_sizes_are_symbolic_sizes_compiled_once():
    """Dynamo marks a size dynamic once it changes (a SymInt); tracecomp traces those dims as
    symbolic sizes, so its dynamic graph compiles once (forward and backward) for every batch
    size, the SymInt inputs read from the dims they equal and the sizes the forward saves
    for the backward computed per call: sizes never traced (11, 2) come out right."""
    lin = torch.nn.Linear(6, 4)
    reports = []
    f = torch.compile(lambda x: torch.softmax(lin(x).view(x.shape[0], 2, 2), -1).sum(-1) * x.shape[0],
                      backend="tracecomp", options={"report": reports.append})
    before = dict(tt.counts)
    for batch in (5, 3, 7, 3, 11, 2):
        x = torch.randn(batch, 6, requires_grad=True)
        out = f(x)
        want_x = x.detach().clone().requires_grad_()
        want = torch.softmax(lin(want_x).view(batch, 2, 2), -1).sum(-1) * batch
        close(out, want)
        lin.zero_grad()
        (out * torch.arange(2.0)).sum().backward()
        got_grads = [x.grad, lin.weight.grad.clone()]
        lin.zero_grad()
        (want * torch.arange(2.0)).sum().backward()
        # torch.testing's float32 tolerance: the weight gradient (entries up to ~10) sums over
        # the batch in another order than eager's (both ~3e-6 from float64)
        torch.testing.assert_close(got_grads[0], want_x.grad)
        torch.testing.assert_close(got_grads[1], lin.weight.grad)
    assert tt.counts["dynamo"] - before.get("dynamo", 0) == 2           # the static graph, then a dynamic one
    assert all(not r.fallback for r in reports), [dict(r.fallback) for r in reports]
    assert tt.counts["traces"] - before.get("traces", 0) == 2 * 2      # forward and backward: at 5, then at 3 for all


def test_a_dynamic_size_tracecomp_needs_as_a_number_compiles_each_shape(caplog, monkeypatch):
    """A graph whose dynamic size cannot stay symbolic (here sin's rule, made to need its
    input's sizes as numbers) runs by tc.trace's rule instead: one compile per shape,
    logged once, right at every size."""
    import dataclasses
    from tracecomp.core.symbolic import DynamicShapeError, is_dynamic
    rule = aten.rule_for(torch.ops.aten.sin.default)

    def needs_numbers(**arguments):
        if any(is_dynamic(d) for d in arguments["self"].shape):
            raise DynamicShapeError("sin wants numbers here")
        return rule.convert(**arguments)
    monkeypatch.setitem(aten.table(), torch.ops.aten.sin.default, dataclasses.replace(rule, convert=needs_numbers))
    f = torch.compile(lambda x: torch.sin(x) * 2, backend="tracecomp", options={"strict": True})
    before = dict(tt.counts)
    with caplog.at_level(logging.INFO, logger="tracecomp"):
        for batch in (4, 5, 6, 9, 6):
            x = torch.randn(batch, 3)
            close(f(x), torch.sin(x) * 2)
    assert sum("cannot stay symbolic" in r.getMessage() for r in caplog.records) == 1
    # the static graph at 4, the failed symbolic trace at 5, then per shape: 5, 6, 9
    assert tt.counts["traces"] - before.get("traces", 0) == 5


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_models_compile_strictly_and_match_eager(dtype):
    """bfloat16 and float16 tensors enter compiled code as NumPy views (bfloat16 through its
    bits, as ml_dtypes'): forward and every gradient of a half model within the dtype's
    rounding of eager's, and a float32 model under torch.autocast gives eager's bfloat16."""
    dt = getattr(torch, dtype)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                torch.nn.Linear(32, 4)).to(dt)
    x = torch.randn(8, 16, dtype=dt)
    out = torch.compile(model, backend="tracecomp", options={"strict": True})(x)
    out.float().square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want = model(x)
    want.float().square().sum().backward()
    tol = {"bfloat16": 2e-2, "float16": 2e-3}[dtype]
    assert out.dtype == dt
    torch.testing.assert_close(out, want, rtol=tol, atol=tol)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=tol, atol=tol * float(p.grad.abs().max()))
    if dtype == "bfloat16":
        mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        x = torch.randn(8, 16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, want = torch.compile(mlp, backend="tracecomp", options={"strict": True})(x), mlp(x)
        assert got.dtype == want.dtype == torch.bfloat16
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
