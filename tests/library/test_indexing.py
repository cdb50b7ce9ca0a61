"""Advanced indexing (`x[idx]`, `x[mask]`, mixed with ints, slices, None and ...) against
PyTorch: values eagerly and compiled, gradients, and the errors for bad indices."""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc

torch = pytest.importorskip("torch", reason="torch not installed (the test-only oracle)")

X = np.arange(2 * 3 * 4, dtype=np.float64).reshape(2, 3, 4) / 7
I2 = np.array([1, -1], np.int64)
I22 = np.array([[0, 1], [1, 0]], np.int64)
M3 = np.array([True, False, True])
M34 = np.array([[True, False, True, False], [False, False, True, True], [True, True, False, False]])

# (description, index builder over (tensor module, array -> index value)): the same index
# for both libraries, with index arrays handed over as each library's tensors
CASES = [
    ("one index tensor", lambda T: T(I2)),
    ("a list", lambda T: [1, 0, 1]),
    ("an index per dim, broadcast", lambda T: (T(I22), T(np.array([2, 0], np.int64)))),
    ("three indices", lambda T: (T(I2), T(np.array([0, 2], np.int64)), T(np.array([3, -4], np.int64)))),
    ("slice then index", lambda T: (slice(None), T(I22))),
    ("indices apart: their dims go first", lambda T: (T(I2), slice(None), T(np.array([0, 3], np.int64)))),
    ("adjacent in the middle", lambda T: (slice(None), T(I2), T(np.array([3, 0], np.int64)))),
    ("ellipsis then index", lambda T: (Ellipsis, T(np.array([3, 1, 1], np.int64)))),
    ("None, int and index", lambda T: (None, 1, T(I2))),
    ("int then index then slice", lambda T: (0, T(np.array([2, 2, 0], np.int64)), slice(1, 3))),
    ("0-d index tensor", lambda T: T(np.array(1, np.int64))),
    ("empty index", lambda T: T(np.zeros(0, np.int64))),
    ("a mask over one dim", lambda T: (slice(None), T(M3))),
    ("a mask over two dims", lambda T: (slice(None), T(M34))),
    ("a mask and an index", lambda T: (T(np.array([1, 0], np.int64)), T(M3))),
    ("a 0-d True mask", lambda T: T(np.array(True))),
    ("a 0-d False mask", lambda T: T(np.array(False))),
]
TRACEABLE = [c for c in CASES if "mask" not in c[0]]


def _tc_index(build):
    return build(lambda a: tc.tensor(a))


def _torch_index(build):
    return build(lambda a: torch.from_numpy(a))


@pytest.mark.parametrize("desc, build", CASES, ids=[c[0] for c in CASES])
def test_eager_matches_torch(desc, build):
    want = torch.from_numpy(X)[_torch_index(build)].numpy()
    got = tc.tensor(X)[_tc_index(build)].numpy()
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("desc, build", TRACEABLE, ids=[c[0] for c in TRACEABLE])
def test_compiled_matches_torch_with_index_inputs(desc, build):
    """Index arrays are inputs of the compiled function, so their values vary per call."""
    leaves = []
    build(lambda a: leaves.append(a) or a)

    def fn(x, *idx):
        it = iter(idx)
        return x[build(lambda a: next(it))]
    want = torch.from_numpy(X)[_torch_index(build)].numpy()
    np.testing.assert_array_equal(tc.trace(fn)(X, *leaves).numpy(), want)


@pytest.mark.parametrize("desc, build", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_torch(desc, build):
    xt = torch.from_numpy(X.copy()).requires_grad_(True)
    out = xt[_torch_index(build)]
    w = np.random.default_rng(0).uniform(0.5, 1.5, tuple(out.shape))
    (want,) = torch.autograd.grad((out * torch.from_numpy(w)).sum(), xt)
    grad = tc.grad(lambda x: (x[_tc_index(build)] * tc.tensor(w)).sum())
    if "mask" not in desc:
        grad = tc.trace(grad)
    np.testing.assert_allclose(grad(X).numpy(), want.numpy(), rtol=1e-12)


@pytest.mark.parametrize("index, match", [
    (np.array([2], np.int64), "index 2 is out of bounds for dimension 0 with size 2"),
    (np.array([-3], np.int64), "out of bounds for dimension 0 with size 2"),
])
def test_out_of_range_indices_raise_eagerly_and_compiled(index, match):
    with pytest.raises(IndexError, match=match):        # PyTorch's class and wording
        tc.tensor(X)[tc.tensor(index)]
    with pytest.raises(tc.ShapeError, match="out of bounds for dim 0 with size 2"):
        tc.trace(lambda x, i: x[i])(X, index)


def test_bad_index_types():
    with pytest.raises(tc.ArgumentError, match="integer or bool"):
        tc.tensor(X)[np.array([0.5])]
    with pytest.raises(IndexError, match=r"valid indices \(got float\)"):
        tc.tensor(X)[0.5]


def test_a_mask_in_a_trace_selects_a_value_dependent_number_of_elements():
    """(tests/transforms/test_unbacked_sizes.py tests these sizes in depth.)"""
    m = M3.reshape(1, 3, 1) | np.zeros((2, 3, 4), bool)
    np.testing.assert_array_equal(tc.trace(lambda x, m: x[m])(X, m).numpy(), X[m])
