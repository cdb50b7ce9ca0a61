"""Fallback, never failure: nodes tracecomp cannot compile run in PyTorch, the rest stays
compiled; each fallback is logged once with the user's line; explain() lists both."""
import logging

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (a test-only dependency)")
if not hasattr(torch, "compile"):          # tests/torch/ itself, seen as a namespace package
    pytest.skip("torch not installed (a test-only dependency)", allow_module_level=True)

import tracecomp.torch as tt  # noqa: E402
from tracecomp.torch import importer  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class WithBessel(torch.nn.Module):
    """A linear layer, i0 and erfcx (ATen ops ops.yaml has no entry for), another layer."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 6)
        self.fc2 = torch.nn.Linear(6, 3)

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        h = torch.special.i0(h) * 2 + torch.special.erfcx(h)      # not in tracecomp: PyTorch runs these
        return (self.fc2(h) + 1).relu().sum(1)


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_an_unsupported_op_falls_back_and_the_results_match(dtype, caplog):
    torch.manual_seed(0)
    model = WithBessel().to(dtype)
    eager = WithBessel().to(dtype)
    eager.load_state_dict(model.state_dict())
    x = torch.randn(4, 6, dtype=dtype)
    with caplog.at_level(logging.WARNING, logger="tracecomp"):
        out = torch.compile(model, backend="tracecomp")(x)
        out.sum().backward()
    expected = eager(x)
    expected.sum().backward()
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, expected, **tol)
    for g, e in zip(_grads(model), _grads(eager)):
        torch.testing.assert_close(g, e, **tol)
    if dtype == torch.float32:        # logged once per op and line in a process: the first run says it
        said = [r.getMessage() for r in caplog.records if "runs in PyTorch" in r.getMessage()]
        assert any("aten.i0.default" in m and "test_torch_fallback.py" in m and "torch.special.i0(h)" in m
                   for m in said), said
        assert len([m for m in said if "aten.i0.default" in m]) == 1


def test_explain_lists_the_compiled_and_the_fallen_back_ops():
    torch.manual_seed(0)
    model = WithBessel()
    x = torch.randn(4, 6)
    report = tt.explain(model, x)
    assert all(p.grad is None for p in model.parameters())        # explain leaves .grad alone
    kinds = [g.kind for g in report.graphs]
    assert kinds == ["forward", "backward"]
    fallback = report.fallback_ops
    assert fallback["aten.i0.default"] == 1 and fallback["aten.special_erfcx.default"] == 1
    assert "aten.special_i1.default" in fallback                  # i0's backward
    assert report.compiled_ops["aten.addmm.default"] == 2 and report.compiled_ops["aten.tanh.default"] == 1
    assert report.graphs[0].partitions == 2                      # before and after the PyTorch ops
    text = str(report)
    assert "aten.i0.default: no tracecomp rule" in text and "torch.special.i0(h)" in text
    with torch.no_grad():
        inference = tt.explain(model, x)
    assert [g.kind for g in inference.graphs] == ["inference"]


def test_a_model_without_unsupported_ops_has_no_fallback():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    report = tt.explain(model, torch.randn(3, 4))
    assert not report.fallback_ops
    assert sum(g.partitions for g in report.graphs) == 2


def test_strict_refuses_instead_of_falling_back():
    f = torch.compile(lambda x: torch.special.i0(x) + 1, backend="tracecomp", options={"strict": True})
    with pytest.raises(Exception, match="strict"):
        f(torch.randn(3))


def test_a_dtype_tracecomp_lacks_falls_back():
    def f(x, y):
        return (x.to(torch.int8) * 2).to(torch.float32) + y.sin()

    x, y = torch.randn(5) * 10, torch.randn(5)
    report = tt.explain(f, x, y)
    assert "int8" in report.reason("aten._to_copy.default") or "int8" in str(report)
    assert report.compiled_ops["aten.sin.default"] == 1
    torch.testing.assert_close(torch.compile(f, backend="tracecomp")(x, y), f(x, y))


def test_a_rule_that_fails_when_traced_leaves_its_node_to_pytorch(monkeypatch):
    rule = tt.rules()["aten.tanh.default"]

    def broken(target):
        found = importer_rule_for(target)
        if target is torch.ops.aten.tanh.default:
            return type(rule)(rule.overload, "tanh", lambda **kw: 1 / 0, "test")
        return found
    importer_rule_for = importer.rule_for
    monkeypatch.setattr(importer, "rule_for", broken)
    f = lambda x: torch.tanh(x * 2) + 1      # noqa: E731
    x = torch.randn(4)
    report = tt.explain(f, x)
    assert "ZeroDivisionError" in report.reason("aten.tanh.default")
    assert report.compiled_ops["aten.mul.Tensor"] == 1
    torch.testing.assert_close(torch.compile(f, backend="tracecomp")(x), f(x))


def test_a_graph_that_fails_to_compile_on_its_first_call_runs_in_pytorch(caplog):
    gm = torch.fx.symbolic_trace(lambda x: torch.ops.aten.add.Tensor(x, 1))
    compiled = importer.CompiledGraph(gm, "broken")

    def fail(traced, values):
        raise RuntimeError("no code for you")
    compiled._call = fail
    x = torch.ones(3)
    with caplog.at_level(logging.WARNING, logger="tracecomp"):
        torch.testing.assert_close(compiled(x), x + 1)
        torch.testing.assert_close(compiled(x), x + 1)
    assert sum("could not compile" in r.getMessage() for r in caplog.records) == 1
    assert compiled.failed.startswith("RuntimeError")


def test_a_partition_returns_attention_in_eager_layout_for_the_views_pytorch_takes():
    """Llama's forward before grouped-query attention compiled: a partition returned the
    attention output (laid out as its transposed query) and a transposed view of it that
    PyTorch takes from it; the view relies on eager's layout (was: RuntimeError, view
    size is not compatible)."""
    def f(x, w):
        b, t, _ = x.shape
        q = (x @ w).view(b, t, 4, 8).transpose(1, 2)
        a = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        return a, torch.special.i0(a.transpose(1, 2).view(b, t, -1))     # i0: PyTorch

    x, w = torch.randn(2, 8, 32) / 4, torch.randn(32, 32)
    reports = []
    got = torch.compile(f, backend="tracecomp", options={"report": reports.append})(x, w)
    for g, e in zip(got, f(x, w)):
        torch.testing.assert_close(g, e)
        assert g.stride() == e.stride()
    assert [dict(r.fallback) for r in reports] == [{"aten.i0.default": 1}]
