"""Issue 19's silent wrong answers and unbounded growth, each a regression test: static
scalars keyed by type and bits, outputs that do not share memory, sizes past int64, huge
factories, uint64 values, gradients of integer outputs, and the signature cache's bound."""
from __future__ import annotations

import math

import numpy as np
import pytest

import tracecomp as tc


# ------------------------------------------------------------------ 1: static scalars

def test_equal_scalars_of_different_types_trace_separately():
    f = tc.trace(lambda x, s: x + s)
    x = np.arange(4)
    assert f(x, 1).dtype == tc.int64
    assert f(x, 1.0).dtype == tc.float32          # PyTorch: int64 tensor + float -> float32
    assert f(x, True).dtype == tc.int64
    branches = tc.trace(lambda x, s: x * 2 if isinstance(s, float) else x * 3)
    assert branches(x, 1).numpy().tolist() == [0, 3, 6, 9]
    assert branches(x, 1.0).numpy().tolist() == [0, 2, 4, 6]


def test_signed_zeros_differ_and_nan_is_one_signature():
    f = tc.trace(lambda x, s: x * s)
    one = np.ones(1)
    assert math.copysign(1, f(one, 0.0).numpy()[0]) == 1
    assert math.copysign(1, f(one, -0.0).numpy()[0]) == -1
    g = tc.trace(lambda x, s: x + s)
    for _ in range(20):
        assert np.isnan(g(one, float("nan")).numpy()[0])
    assert len(g._cache) == 1


def test_static_values_inside_pytrees_and_dict_keys_are_typed_too():
    f = tc.trace(lambda x, cfg: x + cfg["shift"])
    x = np.arange(3)
    assert f(x, {"shift": 2}).dtype == tc.int64
    assert f(x, {"shift": 2.0}).dtype == tc.float32


# ------------------------------------------------------------------ 2: outputs do not alias

@pytest.mark.parametrize("backend", ["cpu", "interp"])
def test_two_equal_outputs_are_two_buffers(backend):
    a, b = tc.trace(lambda x: (x * 2, x * 2), backend=backend)(np.ones(3, np.float32))
    assert not np.shares_memory(a.numpy(), b.numpy())
    a.numpy()[0] = 7.0
    assert b.numpy()[0] == 2.0


@pytest.mark.parametrize("backend", ["cpu", "interp"])
def test_the_same_object_returned_twice_is_one_tensor_as_eager(backend):
    def f(x):
        y = x * 2
        return y, {"again": y}, x * 2
    a, b, c = tc.trace(f, backend=backend)(np.ones(3, np.float32))
    assert a is b["again"]
    assert not np.shares_memory(a.numpy(), c.numpy())


def test_exported_equal_outputs_are_each_written(tmp_path):
    path = str(tmp_path / "libtwo.so")
    tc.export(lambda x: (x * 2, x * 2), [np.arange(3, dtype=np.float32)], path)
    a, b = tc.load(path)(np.arange(3, dtype=np.float32))
    assert np.array_equal(np.asarray(a), [0, 2, 4]) and np.array_equal(np.asarray(b), [0, 2, 4])


# ------------------------------------------------------------------ 3: sizes past int64

@pytest.mark.parametrize("fn", [lambda x: x.expand(2 ** 32, 2 ** 32 + 1).sum(),
                                lambda x: x.expand(2 ** 33, 2 ** 33).mean()], ids=["sum", "mean"])
def test_element_counts_past_int64_are_a_shape_error_in_every_path(fn):
    x = np.ones(1, np.float32)
    for run in (lambda: fn(tc.tensor(x)), lambda: tc.trace(fn)(x), lambda: tc.trace(fn, backend="interp")(x)):
        with pytest.raises(tc.ShapeError, match="64-bit size"):
            run()


def test_huge_factories_are_tracecomp_errors():
    with pytest.raises(tc.ShapeError, match="64-bit size"):
        tc.trace(lambda: tc.zeros(2 ** 40, 2 ** 40))()
    with pytest.raises(tc.ShapeError, match="64-bit size"):
        tc.ones(2 ** 40, 2 ** 40)
    with pytest.raises(tc.OutOfMemoryError, match="cannot allocate") as e:
        tc.zeros(2 ** 30, 2 ** 12)                # 16 TiB: fits int64, not the machine
    assert isinstance(e.value, MemoryError)


# ------------------------------------------------------------------ the signature cache's bound

def test_the_signature_cache_keeps_the_most_recently_used():
    f = tc.trace(lambda x: x + 1, cache_size=3, max_retraces=4, dynamic=False)   # a signature per size
    with pytest.warns(UserWarning, match="traced 5 times"):
        for n in range(1, 50):
            f(np.ones(n, np.float32))
    assert len(f._cache) == 3 and len(f._fast) <= 3
    f(np.ones(47, np.float32))                    # a hit keeps its entry
    f(np.ones(50, np.float32))
    assert [k[1][0].shape for k in f._cache] == [(49,), (47,), (50,)]
    assert len(f._history) <= 2                   # past the warning, only the last is kept


def test_cache_size_must_be_positive():
    with pytest.raises(tc.ArgumentError, match="cache_size"):
        tc.trace(lambda x: x, cache_size=0)


# ------------------------------------------------------------------ 4: uint64

@pytest.mark.parametrize("make", [lambda a: tc.tensor(a), lambda a: tc.trace(lambda x: x + 1)(a),
                                  lambda a: tc.ones(2) + a], ids=["tensor", "traced", "operand"])
def test_uint64_is_refused_rather_than_wrapped(make):
    a = np.array([2 ** 63, 1], np.uint64)
    with pytest.raises(tc.DTypeError, match="uint64.*do not fit int64"):
        make(a)


def test_smaller_unsigned_ints_widen_exactly():
    assert tc.tensor(np.array([255], np.uint8)).numpy().tolist() == [255]
    assert tc.tensor(np.array([2 ** 32 - 1], np.uint32)).numpy().tolist() == [2 ** 32 - 1]


# ------------------------------------------------------------------ 5: integer outputs

@pytest.mark.parametrize("fn", [lambda x: (x * 3).long().sum(), lambda x: (x > 0).any(),
                                lambda x: x.argmax()], ids=["int64", "bool", "argmax"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "traced"])
def test_grad_of_an_integer_output_raises(fn, traced):
    grad = tc.grad(fn)
    with pytest.raises(tc.ArgumentError, match="floating-point scalar, got (int64|bool)"):
        (tc.trace(grad) if traced else grad)(np.ones(3, np.float32))
    with pytest.raises(tc.ArgumentError, match="floating-point scalar"):
        tc.value_and_grad(fn)(np.ones(3, np.float32))


def test_grad_of_a_float_output_of_integer_work_is_still_fine():
    g = tc.grad(lambda x: (x * 2).sum().float() + x.sum())(np.ones(3, np.float32))
    assert g.numpy().tolist() == [3.0, 3.0, 3.0]


@pytest.mark.parametrize("fn", [lambda x, m: tc.masked_fill(x, m, m), lambda x, m: tc.where(m, x, 0)],
                         ids=["masked_fill", "where"])
@pytest.mark.parametrize("traced", [False, True])
def test_a_float_mask_is_refused_as_in_pytorch(fn, traced):
    """A float mask was true where nonzero eagerly but false below 1 compiled (0.25 filled
    eagerly, not compiled: the random programs found it).  PyTorch takes bool masks only."""
    x, m = np.array([4], np.int32), np.float32(0.25)
    call = (lambda: tc.trace(fn)(x, m)) if traced else (lambda: fn(tc.tensor(x), tc.tensor(m)))
    with pytest.raises(tc.DTypeError, match="must be a bool tensor"):
        call()
