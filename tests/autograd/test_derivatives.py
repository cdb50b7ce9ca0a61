"""derivatives.yaml: coverage of ops.yaml, located errors for malformed entries, node names,
and that formulas only use ops that are differentiable themselves (so backward graphs can
be differentiated again)."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.autograd import helpers
from tracecomp.autograd.derivatives import default_derivatives, load_derivatives, uncovered_ops
from tracecomp.core.errors import TableError
from tracecomp.ops import formula
from tracecomp.ops.table import default_table

TABLE = default_table()
DERIVATIVES = default_derivatives()


def _functions() -> set[str]:
    return set(helpers.HELPERS) | {n for n in dir(tc) if callable(getattr(tc, n))}


def _load(tmp_path, text: str):
    path = tmp_path / "derivatives.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return load_derivatives(path, TABLE, _functions())


# ---------------------------------------------------------------- coverage

def test_every_non_composite_op_with_tensor_inputs_has_an_entry():
    missing = uncovered_ops(TABLE, DERIVATIVES)
    assert not missing, f"ops of ops.yaml without a derivatives.yaml entry: {missing}"


def test_entries_name_only_non_composite_ops_with_tensor_inputs():
    for name, d in DERIVATIVES.items():
        assert d.op.kind != "composite", f"{name} is composite: it decomposes and needs no entry"
        assert d.op.schema.tensor_arguments, f"{name} has no Tensor inputs"


def test_every_differentiable_entry_has_a_forward_formula():
    """Forward mode (tc.jvp) and forward-over-reverse need `result:` wherever backward exists."""
    missing = [name for name, d in DERIVATIVES.items()
               if any(f.expr is not None for f in d.formulas) and d.forward is None]
    assert not missing, f"entries with backward formulas but no `result:`: {missing}"


def test_auto_element_wise_only_for_single_input_ops():
    for name, d in DERIVATIVES.items():
        if d.forward == "auto_element_wise":
            assert [a.name for a in d.op.schema.tensor_arguments] == ["self"], name


def _called_ops(expr) -> set[str]:
    return {n[:-2] for n in formula.free_names(expr) if n.endswith("()") and n[:-2] not in helpers.HELPERS}


def test_formulas_call_only_differentiable_ops():
    """An op called by a formula has an entry with a formula, or is composite, or has no
    Tensor inputs (a factory); helpers are covered by the double-backward tests."""
    bad = []
    for name, d in DERIVATIVES.items():
        exprs = [f.expr for f in d.formulas if f.expr is not None]
        if not isinstance(d.forward, (str, type(None))):
            exprs.append(d.forward)
        for expr in exprs:
            for fn in _called_ops(expr):
                ops = [op for op in TABLE.values() if op.name == fn]
                assert ops, f"{name}: formula calls '{fn}', which is no op"
                for op in ops:
                    entry = DERIVATIVES.get(op.full_name)
                    ok = (op.kind == "composite" or not op.schema.tensor_arguments
                          or (entry is not None and any(f.expr is not None for f in entry.formulas)))
                    if not ok and op.name not in ("eq", "ne", "lt", "le", "gt", "ge", "logical_and",
                                                  "logical_or", "logical_not"):
                        bad.append(f"{name} -> {op.full_name}")
    assert not bad, f"formulas call ops that have no derivative: {bad}"


# ---------------------------------------------------------------- malformed entries

BAD = [
    ("wrong schema", """
     - name: sin(Tensor x) -> Tensor
       x: grad * cos(x)
     """, r"derivatives.yaml:1: in entry 'sin\(Tensor x\) -> Tensor': names no op of ops.yaml with exactly "
          r"this schema \(ops.yaml has 'sin\(Tensor self\) -> Tensor'\)"),
    ("unknown op", """
     - name: frobnicate(Tensor self) -> Tensor
       self: grad
     """, r"derivatives.yaml:1: in entry 'frobnicate\(Tensor self\) -> Tensor': names no op"),
    ("unknown input name", """
     - name: sin(Tensor self) -> Tensor
       selff: grad * cos(self)
     """, r"derivatives.yaml:1: in entry 'sin\(Tensor self\) -> Tensor': 'selff' is not a Tensor "
          r"argument of sin"),
    ("a non-Tensor argument as input", """
     - name: sum(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
       self: sum_backward(grad, self.shape, dim, keepdim)
       dim: grad
     """, r"derivatives.yaml:1: in entry 'sum\(.*-> Tensor': 'dim' is not a Tensor argument of sum"),
    ("two formulas for one input", """
     - name: mul(Tensor self, Tensor other) -> Tensor
       self: grad * other
       self, other: grad
     """, r"derivatives.yaml:1: in entry 'mul\(Tensor self, Tensor other\) -> Tensor': input 'self' "
          r"has two formulas"),
    ("uncovered input", """
     - name: mul(Tensor self, Tensor other) -> Tensor
       self: grad * other
     """, r"derivatives.yaml:1: in entry 'mul\(Tensor self, Tensor other\) -> Tensor': input\(s\) other "
          r"have no formula; give one, mark them non_differentiable, or write not_implemented"),
    ("unknown name in a formula", """
     - name: sin(Tensor self) -> Tensor
       self: gard * cos(self)
     """, r"derivatives.yaml:1: in entry 'sin\(Tensor self\) -> Tensor': formula for 'self' uses unknown "
          r"name 'gard'"),
    ("unknown function", """
     - name: sin(Tensor self) -> Tensor
       self: grad * cosine(self)
     """, r"derivatives.yaml:1: in entry 'sin\(Tensor self\) -> Tensor': formula for 'self' calls unknown "
          r"function 'cosine'"),
    ("formula is not Python", """
     - name: sin(Tensor self) -> Tensor
       self: grad * (cos(self)
     """, r"derivatives.yaml:1: in entry 'sin\(Tensor self\) -> Tensor': formula for 'self'.*not valid Python"),
    ("unknown name in the forward formula", """
     - name: sin(Tensor self) -> Tensor
       self: grad * cos(self)
       result: self_q * cos(self_p)
     """, r"derivatives.yaml:1: in entry 'sin\(Tensor self\) -> Tensor': forward formula 'result' uses "
          r"unknown name 'self_q'"),
    ("bad output_differentiability length", """
     - name: max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)
       output_differentiability: [True, False, False]
       self: grad
     """, r"derivatives.yaml:1: in entry 'max\.dim\(.*indices\)': output_differentiability has 3 entries "
          r"for 2 outputs"),
    ("non_differentiable names a non-Tensor", """
     - name: gather(Tensor self, int dim, Tensor index) -> Tensor
       non_differentiable: [dim]
       self: grad
     """, r"derivatives.yaml:1: in entry 'gather\(.*-> Tensor': non_differentiable names 'dim', which is not a "
          r"Tensor argument"),
    ("two entries for one op, on a later line", """
     - name: sin(Tensor self) -> Tensor
       self: grad * cos(self)

     - name: sin(Tensor self) -> Tensor
       self: grad
     """, r"derivatives.yaml:4: in entry 'sin\(Tensor self\) -> Tensor': 'sin' has two entries "
          r"\(first at line 1\)"),
    ("the line of a later entry", """
     - name: sin(Tensor self) -> Tensor
       self: grad * cos(self)

     - name: cos(Tensor self) -> Tensor
       self: -grad * sin(self)

     - name: tanh(Tensor self) -> Tensor
       self: grad * (1 - result * reslt)
     """, r"derivatives.yaml:7: in entry 'tanh\(Tensor self\) -> Tensor': formula for 'self' uses "
          r"unknown name 'reslt'"),
    ("bad YAML", """
     - name: sin(Tensor self) -> Tensor
       self: [grad
     """, r"derivatives.yaml:\d+: not valid YAML"),
    ("entry without a name", """
     - self: grad
     """, r"derivatives.yaml: entry without 'name'"),
]


@pytest.mark.parametrize("text, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_malformed_entries_name_file_line_entry_and_input(tmp_path, text, message):
    with pytest.raises(TableError, match=message):
        _load(tmp_path, text)


def test_repeated_key_for_one_input_is_an_error(tmp_path):
    with pytest.raises(TableError, match=r"derivatives.yaml:1: .*'self'"):
        _load(tmp_path, """
         - name: sin(Tensor self) -> Tensor
           self: grad * cos(self)
           self: grad
         """)


def test_well_formed_entries_load(tmp_path):
    out = _load(tmp_path, """
     - name: max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)
       output_differentiability: [True, False]
       self: value_selecting_reduction_backward(grad, dim, indices, self.shape, keepdim)
       result: gather_with_keepdimed_indices(self_t, dim, indices, keepdim)

     - name: atan2(Tensor self, Tensor other) -> Tensor
       self, other: atan2_backward(grad, self, other, grad_input_mask)
       result: auto_linear

     - name: pow(Tensor self, Tensor exponent) -> Tensor
       self: grad
       exponent: not_implemented("not today")
     """)
    assert out["max.dim"].differentiable_outputs() == [True, False]
    assert out["atan2"].formula_for("other").inputs == ("self", "other")
    assert out["pow"].formula_for("exponent").not_implemented == "not today"


def test_not_implemented_raises_when_the_gradient_is_needed(tmp_path, monkeypatch):
    from tracecomp.autograd import kernels
    patched = _load(tmp_path, """
     - name: sin(Tensor self) -> Tensor
       self: not_implemented("sin is not differentiable today")
     """)
    monkeypatch.setattr(kernels, "default_derivatives", lambda: {**DERIVATIVES, **patched})
    x = tc.tensor(np.ones(2), requires_grad=True)
    with pytest.raises(tc.autograd.AutogradError, match="not implemented: sin is not differentiable today"):
        tc.sin(x).sum().backward()


# ---------------------------------------------------------------- node names

def test_node_class_names_follow_pytorch():
    names = {name: d.node_name for name, d in DERIVATIVES.items()}
    assert names["add"] == "AddBackward0" and names["mul"] == "MulBackward0"
    assert names["max"] == "MaxBackward0" and names["max.dim"] == "MaxBackward1"
    assert names["min"] == "MinBackward0" and names["min.dim"] == "MinBackward1"
    assert names["split"] == "SplitBackward0" and names["split.sizes"] == "SplitBackward1"
    assert names["where.self"] == "WhereBackward0" and names["index_select"] == "IndexSelectBackward0"
    assert names["logical_not"] == "LogicalNotBackward0"


def test_grad_fn_names_on_tensors():
    x = tc.tensor(np.array([[1.0, 5.0, 2.0], [4.0, 0.5, 3.0]]), requires_grad=True)
    y = tc.tensor(np.ones(3), requires_grad=True)
    assert type((x + y).grad_fn).__name__ == "AddBackward0"
    assert type((x * 2).grad_fn).__name__ == "MulBackward0"
    assert type(tc.max(x).grad_fn).__name__ == "MaxBackward0"
    values, indices = tc.max(x, 1)
    assert type(values.grad_fn).__name__ == "MaxBackward1"
    assert indices.grad_fn is None and not indices.requires_grad
    assert type(x.split(1)[1].grad_fn).__name__ == "SplitBackward0"
    assert type(x.split([1, 1])[0].grad_fn).__name__ == "SplitBackward1"
    assert type(tc.gelu(x).grad_fn).__name__ == "GeluBackward0"
    assert type(x[0, 1:].grad_fn).__name__ == "SliceBackward0"
    assert type(x.to(tc.float32).grad_fn).__name__ == "ToBackward0"
    assert type(tc.softmax(x, 1).grad_fn).__name__ == "DivBackward0"    # composites decompose
    assert (x > 1).grad_fn is None and tc.argmax(x).grad_fn is None


# ---------------------------------------------------------------- behaviour the formulas promise

def _grad(f, *arrays):
    return [np.asarray(g) for g in tc.grad(f, argnums=tuple(range(len(arrays))))(*arrays)]


def test_ties_split_the_gradient_like_pytorch():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    (g,) = _grad(lambda x: x.amax(1).sum(), x)
    np.testing.assert_allclose(g, [[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    (g,) = _grad(lambda x: tc.max(x), x)
    np.testing.assert_allclose(g, [[0, 0.5, 0.5], [0, 0, 0]])
    ga, gb = _grad(lambda a, b: tc.maximum(a, b).sum(), np.array([1.0, 2.0, 3.0]), np.array([2.0, 2.0, 1.0]))
    np.testing.assert_allclose(ga, [0, 0.5, 1]) and np.testing.assert_allclose(gb, [1, 0.5, 0])
    (g,) = _grad(lambda x: tc.max(x, 1).values.sum(), x)         # max.dim: the selected index only
    np.testing.assert_allclose(g, [[0, 1, 0], [1, 0, 0]])


def test_prod_gradient_with_zeros():
    x = np.array([[2.0, 0.0, 3.0], [0.0, 5.0, 0.0], [1.0, 2.0, 4.0]])
    (g,) = _grad(lambda x: x.prod(1).sum(), x)
    np.testing.assert_allclose(g, [[0, 6, 0], [0, 0, 0], [8, 4, 2]])
    (g,) = _grad(lambda x: x.prod(), np.array([3.0, 0.0, 2.0]))
    np.testing.assert_allclose(g, [0, 6, 0])


def test_kinks_follow_pytorch():
    x = np.array([-1.0, 0.0, 2.0])
    for f, want in ((tc.relu, [0, 0, 1]), (tc.abs, [-1, 0, 1]), (tc.sign, [0, 0, 0]),
                    (tc.floor, [0, 0, 0]), (lambda x: tc.clamp(x, 0.0, 2.0), [0, 1, 1])):
        np.testing.assert_allclose(_grad(lambda x: f(x).sum(), x)[0], want)
    (g,) = _grad(lambda x: (x ** 0.0).sum(), np.array([0.0, 1.0]))           # 0 ** 0: gradient 0
    np.testing.assert_allclose(g, [0, 0])
    (g,) = _grad(lambda e: (tc.tensor(np.array([0.0, 2.0])) ** e).sum(), np.array([2.0, 1.0]))
    np.testing.assert_allclose(g, [0, 2 * np.log(2)])                         # d/de 0**e is 0
    (g,) = _grad(lambda x: x.std(), np.array([1.0, 1.0]))                    # std == 0: gradient 0
    np.testing.assert_allclose(g, [0, 0])


def test_python_numbers_for_tensor_arguments():
    x = np.array([0.5, 1.5, 2.5])
    checks = [
        (lambda x: (2 ** x).sum(), np.log(2) * 2 ** x),
        (lambda x: (x ** 3).sum(), 3 * x ** 2),
        (lambda x: (1 - x * 2).sum(), -2 * np.ones(3)),
        (lambda x: (3 / x).sum(), -3 / x ** 2),
        (lambda x: tc.atan2(x, 2.0).sum(), 2 / (x ** 2 + 4)),
        (lambda x: tc.where(x > 1, x, 0.0).sum(), (x > 1).astype(float)),
        (lambda x: tc.clamp(x, max=2).sum(), (x <= 2).astype(float)),
        (lambda m: tc.clamp(2.0, m).sum(), (x > 2).astype(float)),         # a number clamped by a tensor
        (lambda x: tc.maximum(x, 1.0).sum(), (x > 1).astype(float)),
        (lambda x: x.prod(dtype=tc.float64), np.prod(x) / x),
    ]
    for f, want in checks:
        np.testing.assert_allclose(_grad(f, x)[0], want, rtol=1e-12)
        _, tangent = tc.jvp(f, (x,), (np.ones(3),))
        np.testing.assert_allclose(np.asarray(tangent), want.sum(), rtol=1e-12)


def test_unused_split_pieces_and_int_outputs():
    x = tc.tensor(np.arange(5.0), requires_grad=True)
    x.split(2)[1].sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0, 0, 1, 1, 0])
    _, tangent = tc.jvp(lambda x: x.split(2)[2], (np.arange(5.0),), (np.arange(5.0) + 1,))
    np.testing.assert_allclose(np.asarray(tangent), [5])
    out, tangents = tc.jvp(lambda x: tc.max(x, 0), (np.array([1.0, 3.0]),), (np.array([10.0, 20.0]),))
    assert np.asarray(tangents.values) == 20.0 and np.asarray(out.indices) == 1
