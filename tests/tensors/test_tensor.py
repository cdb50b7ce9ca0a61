"""tc.Tensor basics: construction, metadata, conversion, printing, the generated API surface."""
import numpy as np
import pytest

import tracecomp as tc
from tracecomp.ops.table import default_table


def test_tensor_from_python_data_follows_pytorch_dtypes():
    assert tc.tensor([1.0, 2.0]).dtype is tc.float32
    assert tc.tensor([1, 2]).dtype is tc.int64
    assert tc.tensor([True, False]).dtype is tc.bool
    assert tc.tensor(np.zeros(2, np.float64)).dtype is tc.float64
    assert tc.tensor([1, 2], dtype=tc.float64).dtype is tc.float64
    assert tc.tensor(3.5).shape == ()


def test_metadata_and_conversions():
    t = tc.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert (t.shape, t.ndim, t.dim(), t.numel(), t.size(1), len(t)) == ((2, 3), 2, 2, 6, 3, 2)
    assert t.sum().item() == 15.0
    assert float(t[1, 2]) == 5.0 and int(t[1, 0]) == 3
    assert np.asarray(t).dtype == np.float32
    assert t.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert [row.tolist() for row in t] == [[0, 1, 2], [3, 4, 5]]


def test_dlpack_shares_memory_with_numpy():
    t = tc.tensor(np.arange(4, dtype=np.float32))
    view = np.from_dlpack(t)
    assert np.shares_memory(view, t.numpy())
    assert view.tolist() == [0, 1, 2, 3]


def test_repr_looks_like_pytorch():
    assert repr(tc.tensor([1.0, 2.0])) == "tensor([1., 2.])"
    assert repr(tc.tensor([0.5, 0.25])) == "tensor([0.5000, 0.2500])"
    assert repr(tc.tensor([1, 2])) == "tensor([1, 2])"
    assert repr(tc.tensor([1, 2], dtype=tc.int32)) == "tensor([1, 2], dtype=tracecomp.int32)"
    assert repr(tc.tensor([1.0], requires_grad=True)) == "tensor([1.], requires_grad=True)"
    assert repr(tc.tensor([True])) == "tensor([True])"
    assert repr(tc.ones(2, 2)) == "tensor([[1., 1.],\n        [1., 1.]])"


def test_dtype_aliases():
    assert tc.float is tc.float32 and tc.double is tc.float64
    assert tc.long is tc.int64 and tc.int is tc.int32
    assert tc.ones(2).to(tc.float64).dtype is tc.float64
    assert tc.ones(2).double().dtype is tc.float64 and tc.ones(2).long().dtype is tc.int64


def test_api_is_generated_from_the_table():
    for op in default_table().values():
        if "function" in op.variants:
            assert callable(getattr(tc, op.name)), op.full_name
        if "method" in op.variants:
            assert callable(getattr(tc.Tensor, op.name)), op.full_name
        for dunder in op.operators + op.reflected:
            assert getattr(tc.Tensor, dunder).__qualname__ != "object." + dunder
        for prop in op.properties:
            assert isinstance(getattr(tc.Tensor, prop), property)


def test_overload_resolution():
    x = tc.tensor([[1.0, 5.0], [7.0, 2.0]])
    assert x.max().item() == 7.0                         # max()
    values, indices = x.max(1)                           # max.dim -> (values, indices)
    assert values.tolist() == [5, 7] and indices.tolist() == [1, 0]
    assert x.max(1).indices.tolist() == [1, 0]
    assert tc.max(x, tc.zeros(2, 2) + 3).tolist() == [[3, 5], [7, 3]]   # max.other
    assert [p.shape for p in x.split(1)] == [(1, 2), (1, 2)]           # split
    assert [p.shape for p in tc.split(tc.ones(5), [2, 3])] == [(2,), (3,)]   # split.sizes
    assert tc.arange(2, 8, 3).tolist() == [2, 5]                       # arange.start


def test_varargs_int_lists():
    assert tc.zeros(2, 3).shape == (2, 3) and tc.zeros((2, 3)).shape == (2, 3)
    x = tc.ones(2, 3, 4)
    assert x.reshape(4, 6).shape == (4, 6) and x.reshape(-1).shape == (24,)
    assert x.permute(2, 0, 1).shape == (4, 2, 3)
    assert tc.ones(3, 1).expand(3, 4).shape == (3, 4)


def test_indexing():
    a = np.arange(60).reshape(3, 4, 5)
    t = tc.tensor(a)
    for index in [1, -1, (1, 2), slice(1, None), (slice(None), slice(None, None, 2)),
                  (Ellipsis, 1), (None, 0), (1, None, slice(-3, -1)), (slice(None, -1), Ellipsis, None),
                  (slice(5, 10),)]:
        assert np.array_equal(np.asarray(t[index]), a[index]), index


@pytest.mark.parametrize("index, error, match", [
    ((0, 0, 0, 0), tc.ShapeError, "too many indices"),
    (slice(None, None, 0), tc.ShapeError, "slice step cannot be zero"),
    (5, tc.ShapeError, "index 5 is out of bounds for dimension 0 with size 3"),
    ([0.5, 1], tc.ArgumentError, "integer or bool"),
    ("a", tc.ArgumentError, r"valid indices \(got str\)"),
])
def test_bad_indices(index, error, match):
    t = tc.ones(3, 4, 5)
    with pytest.raises(error, match=match) as info:
        t[index]
    assert "test_tensor.py" in str(info.value)


def test_numpy_operands_defer_to_tensor():
    out = np.ones(3, np.float32) + tc.ones(3)
    assert isinstance(out, tc.Tensor) and out.tolist() == [2, 2, 2]


def test_manual_seed_repeats_random_tensors():
    tc.manual_seed(3)
    a = tc.randn(4)
    tc.manual_seed(3)
    assert a.tolist() == tc.randn(4).tolist()
    assert tc.rand(2, 3).dtype is tc.float32 and tc.rand(2, dtype=tc.float64).dtype is tc.float64


def test_factories_take_requires_grad_as_in_pytorch():
    x = tc.randn(3, 4, requires_grad=True)
    assert x.requires_grad and x.is_leaf
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.numpy(), rtol=1e-6)
    assert tc.zeros((2,), dtype=tc.float64, requires_grad=True).requires_grad
    assert not tc.ones(2).requires_grad
    with pytest.raises(tc.DTypeError, match="only floating point tensors can require gradients, got int64"):
        tc.arange(3, requires_grad=True)
    with pytest.raises(tc.ArgumentError, match="add.. received an invalid combination"):
        tc.add(tc.ones(2), 1, requires_grad=True)          # not a factory
