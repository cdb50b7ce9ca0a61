"""In-place methods (`x.add_(y)`, `x.clamp_(0)`, `x.zero_()`...): the op, then its result
written into x as item assignment writes (assignment.inplace), eagerly and under tc.trace.

Which ops have one comes from the table: every elementwise method whose first argument is
self, and the ops that declare `inplace` among their variants (scatter, index_put, tril...).
"""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.ops.table import default_table

TABLE = default_table()
UNARY = sorted({op.name for op in TABLE.values() if op.inplace and op.kind == "elementwise"
                and len(op.schema.tensor_arguments) == 1
                and all(a.has_default for a in op.schema.arguments[1:]) and op.accepts != "integral"})


def test_the_table_decides_which_methods_exist():
    for op in TABLE.values():
        assert hasattr(tc.Tensor, f"{op.name}_") == any(o.inplace for o in TABLE.values() if o.name == op.name), op.name
    assert len(UNARY) > 40
    for name in ("add_", "mul_", "clamp_", "exp_", "masked_fill_", "scatter_", "index_put_", "tril_", "cumsum_",
                 "zero_", "fill_", "copy_"):
        assert hasattr(tc.Tensor, name), name
    assert not hasattr(tc.Tensor, "where_") and not hasattr(tc.Tensor, "sum_")


@pytest.mark.parametrize("name", UNARY)
def test_unary_in_place_is_the_op_written_back(name):
    x = tc.tensor(np.linspace(0.1, 0.9, 6, dtype=np.float32).reshape(2, 3))
    want = getattr(tc, name)(x) if hasattr(tc, name) else getattr(x, name)()
    y = x.clone()
    assert getattr(y, f"{name}_")() is y
    np.testing.assert_array_equal(y.numpy(), want.to(y.dtype).numpy())


CALLS = [
    ("add_ alpha", lambda x, o, T: x.add_(o, alpha=2)),
    ("sub_", lambda x, o, T: x.sub_(o)),
    ("mul_ number", lambda x, o, T: x.mul_(3)),
    ("div_", lambda x, o, T: x.div_(o + 3)),
    ("pow_", lambda x, o, T: x.abs_().pow_(2)),
    ("clamp_", lambda x, o, T: x.clamp_(-0.5, 0.5)),
    ("clamp_ tensor", lambda x, o, T: x.clamp_(max=o)),
    ("masked_fill_", lambda x, o, T: x.masked_fill_(o > 0, 1.5)),
    ("index_put_", lambda x, o, T: x.index_put_((T([0, 1]),), o[0], accumulate=True)),
    ("scatter_ src", lambda x, o, T: x.scatter_(1, T([[2, 0, 1], [1, 2, 0]]), o)),
    ("scatter_ value", lambda x, o, T: x.scatter_(1, T([[2], [0]]), 7.0)),
    ("scatter_add_", lambda x, o, T: x.scatter_add_(0, T([[1, 0, 1]]), o[:1])),
    ("index_add_", lambda x, o, T: x.index_add_(1, T([2, 0]), o[:, :2], alpha=0.5)),
    ("index_fill_", lambda x, o, T: x.index_fill_(1, T([1]), -2.0)),
    ("index_copy_", lambda x, o, T: x.index_copy_(0, T([1, 0]), o)),
    ("tril_", lambda x, o, T: x.tril_(1)),
    ("triu_", lambda x, o, T: x.triu_()),
    ("cumsum_", lambda x, o, T: x.cumsum_(1)),
    ("addmm_", lambda x, o, T: x.addmm_(o, o.mT @ o, beta=0.5)),
    ("zero_", lambda x, o, T: x.zero_()),
    ("fill_ number", lambda x, o, T: x.fill_(2.5)),
    ("fill_ tensor", lambda x, o, T: x.fill_(o[0, 0])),
    ("copy_ broadcast", lambda x, o, T: x.copy_(o[1])),
    ("chain", lambda x, o, T: x.mul_(2).add_(o).relu_()),
]


def _torch_or_skip():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("call", [c[1] for c in CALLS], ids=[c[0] for c in CALLS])
def test_matches_pytorch_eager_and_traced(call):
    torch = _torch_or_skip()
    rng = np.random.default_rng(0)
    x0, o0 = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    tx = torch.tensor(x0)
    assert call(tx, torch.tensor(o0), torch.tensor) is tx
    ex = tc.tensor(x0)
    assert call(ex, tc.tensor(o0), tc.tensor) is ex
    np.testing.assert_allclose(ex.numpy(), tx.numpy(), rtol=1e-12, atol=1e-12)
    a = x0.copy()          # traced: the argument itself changes, and the result is it
    out = tc.trace(lambda x, o: call(x, o, tc.tensor))(a, o0)
    np.testing.assert_allclose(a, tx.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.numpy(), tx.numpy(), rtol=1e-12, atol=1e-12)


def test_copy_casts_like_pytorch():
    x = tc.zeros(3, dtype=tc.int64)
    x.copy_(tc.tensor([1.7, -2.2, 3.0]))
    assert x.dtype == tc.int64 and x.tolist() == [1, -2, 3]
    x.fill_(2.9)
    assert x.tolist() == [2, 2, 2]
    y = tc.zeros(2, dtype=tc.float64)
    y.fill_(0.1)            # not rounded through float32 on the way
    assert y.tolist() == [0.1, 0.1]


def test_errors_name_the_method_and_the_line():
    x = tc.tensor([1, 2, 3])
    with pytest.raises(tc.DTypeError, match="div_: the result type float32 can't be cast to the tensor's dtype int64"):
        x.div_(2)
    with pytest.raises(tc.ShapeError, match="add_: .*cannot broadcast its target") as e:
        tc.ones(3).add_(tc.ones(2, 3))
    assert "test_inplace_methods.py" in str(e.value)
    with pytest.raises(tc.ArgumentError, match="fill_: the value must be a number or a 0-d tensor"):
        tc.ones(3).fill_(tc.ones(2))


def test_a_value_saved_for_backward_cannot_change():
    """As in PyTorch: exp saves its result; changing it in place makes backward refuse."""
    x = tc.tensor([0.5, 1.0], requires_grad=True)
    y = x.exp()
    y.add_(1)
    with pytest.raises(tc.TracecompError, match="modified by an inplace operation"):
        y.sum().backward()


def test_a_leaf_that_requires_grad_refuses():
    x = tc.tensor([0.5, 1.0], requires_grad=True)
    with pytest.raises(tc.TracecompError, match="leaf"):
        x.mul_(2)


# ---------------------------------------------------------------- negative slice steps, .cpu()

@pytest.mark.parametrize("index", [np.s_[::-1], np.s_[8:2:-2], np.s_[::-3], np.s_[2:8:-1], np.s_[-1:-11:-1],
                                   np.s_[5::-2], np.s_[100:-100:-4], np.s_[1, ::-2], np.s_[::-1, 1::-1]])
def test_negative_steps_read_and_write_as_numpy(index):
    """PyTorch refuses negative steps; NumPy and JAX read them backwards, and so does tracecomp."""
    a = np.arange(20.0).reshape(2, 10) if isinstance(index, tuple) else np.arange(10.0)
    x = tc.tensor(a)
    np.testing.assert_array_equal(x[index].numpy(), a[index])
    np.testing.assert_array_equal(tc.trace(lambda t: t[index])(a).numpy(), a[index])
    b, y = a.copy(), tc.tensor(a)
    b[index] = -1.0
    y[index] = -1.0
    np.testing.assert_array_equal(y.numpy(), b)
    assert tc.gradcheck(lambda t: (t[index] ** 2).sum(), [a])


def test_zero_step_and_cpu():
    with pytest.raises(tc.ShapeError, match="slice step cannot be zero"):
        tc.ones(3)[::0]
    x = tc.ones(3)
    assert x.cpu() is x and x.to("cpu") is not None and x.to(device="cpu").shape == (3,)


def test_an_in_place_change_under_no_grad_keeps_a_leaf_that_requires_grad():
    """As in PyTorch (an optimizer's step): the flag and leafness stay."""
    p = tc.tensor([1.0, 2.0], requires_grad=True)
    with tc.no_grad():
        p.sub_(0.5)
        p.mul_(2.0)
    assert p.requires_grad and p.is_leaf
    (p * p).sum().backward()
    np.testing.assert_allclose(p.grad.numpy(), [2.0, 6.0])
