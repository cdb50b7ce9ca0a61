"""Hostile indices (issue 33, item 3): boolean masks of every shape, and every index form of
PyTorch and NumPy, run through PyTorch and through tracecomp eagerly, traced, and as item
assignment.  Where PyTorch raises, tracecomp raises the same class, and its message starts
with PyTorch's (which names the shapes); where PyTorch succeeds, values and dtypes agree."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracecomp as tc

torch = pytest.importorskip("torch", reason="torch not installed (the test-only oracle)")
# PyTorch warns that it may one day read a list of lists as one array; it reads it as a tuple
pytestmark = pytest.mark.filterwarnings("ignore:Using a non-tuple sequence:UserWarning")

B = lambda *v: np.array(v, bool)        # noqa: E731  a bool array
I = lambda *v: np.array(v, np.int64)    # noqa: E731  an int array
M34 = np.array([[1, 0, 1, 0], [0, 0, 1, 1], [1, 1, 0, 0]], bool)

# (id, tensor shape, index builder): the builder gets T, which makes each library's tensor
# from a NumPy array; Python values and NumPy arrays go to both libraries as they are
CASES = [
    # masks of the wrong shape
    ("(3,) mask on (10,)", (10,), lambda T: T(B(1, 0, 1))),
    ("(3,) bool array on (10,)", (10,), lambda T: B(1, 0, 1)),
    ("(3,) bool list on (10,)", (10,), lambda T: [True, False, True]),
    ("(2,2) mask on (3,4)", (3, 4), lambda T: T(np.ones((2, 2), bool))),
    ("(3,5) mask on (3,4)", (3, 4), lambda T: T(np.ones((3, 5), bool))),
    ("(3,) mask on dim 1", (3, 4), lambda T: (slice(None), T(B(1, 0, 1)))),
    ("(3,5) mask on dims 1-2", (2, 3, 4), lambda T: (slice(None), T(np.ones((3, 5), bool)))),
    ("mask after a narrowing slice", (2, 3, 4), lambda T: (slice(1, None), T(np.ones((3, 5), bool)))),
    ("mask after an int", (2, 3, 4), lambda T: (0, T(np.ones((2, 4), bool)))),
    ("mask before an int", (3, 4), lambda T: (T(B(1, 0)), 0)),
    ("mask before None", (3, 4), lambda T: (T(B(1, 0)), None)),
    ("mask after True", (3, 4), lambda T: (True, T(B(1, 0, 1, 1, 0)))),
    ("mask after ...", (3, 4), lambda T: (Ellipsis, T(B(1, 0, 1)))),
    ("empty mask", (3, 4), lambda T: T(np.zeros(0, bool))),
    ("(1,1) mask does not broadcast", (3, 4), lambda T: T(np.ones((1, 1), bool))),
    ("(1,3) mask on (3,): too many dims", (3,), lambda T: T(np.ones((1, 3), bool))),
    ("(2,) bool array on (3,4)", (3, 4), lambda T: B(1, 0)),
    ("a list of three masks", (3, 4), lambda T: [[True, False, True, False]] * 3),
    ("mask and index do not broadcast", (3, 4), lambda T: (T(B(1, 0, 1)), T(I(0, 1, 2)))),
    ("two masks do not broadcast", (3, 4), lambda T: (T(B(1, 0, 1)), T(B(1, 0, 1, 1)))),
    ("False with an index", (3, 4), lambda T: (False, [0, 1])),
    ("mask on a dim of size 0", (3, 0), lambda T: (slice(None), T(B(1)))),
    # masks of the right shape
    ("(10,) mask", (10,), lambda T: T(B(1, 0, 0, 1, 1, 0, 1, 0, 0, 1))),
    ("(3,4) mask", (3, 4), lambda T: T(M34)),
    ("(3,4) bool array", (3, 4), lambda T: M34),
    ("mask on dim 1", (3, 4), lambda T: (slice(None), T(B(0, 1, 1, 0)))),
    ("(3,4) mask on dims 1-2", (2, 3, 4), lambda T: (slice(None), T(M34))),
    ("mask after an int", (2, 3, 4), lambda T: (1, T(M34))),
    ("mask, None and ...", (2, 3, 4), lambda T: (None, T(B(1, 0)), Ellipsis, 1)),
    ("mask and an index", (3, 4), lambda T: (T(B(1, 0, 1)), T(I(1, 0)))),
    ("index and a mask apart", (3, 2, 4), lambda T: (T(I(2, 0)), slice(None), T(B(0, 1, 1, 0)))),
    ("two masks", (3, 4), lambda T: (T(B(1, 0, 1)), T(B(1, 0, 1, 0)))),
    ("all-False mask", (3, 4), lambda T: T(np.zeros((3, 4), bool))),
    ("empty mask on an empty dim", (0,), lambda T: T(np.zeros(0, bool))),
    ("mask on (3,0)", (3, 0), lambda T: T(B(1, 0, 1))),
    ("bool list", (3, 4), lambda T: [True, False, True]),
    ("bool list in a list", (3, 4), lambda T: [[True, False, True]]),
    ("True", (3, 4), lambda T: True),
    ("False", (3, 4), lambda T: False),
    ("True, True, int", (3, 4), lambda T: (True, True, 0)),
    ("None, True, ..., False", (3, 4), lambda T: (None, True, Ellipsis, False)),
    ("True with an index", (3, 4), lambda T: (True, [0, 1])),
    ("index with True", (3, 4), lambda T: ([0, 1], True)),
    ("0-d True tensor with an index", (3, 4), lambda T: (T(np.array(True)), [0, 1])),
    ("0-d False tensor", (3, 4), lambda T: T(np.array(False))),
    ("bool tensor", (3, 4), lambda T: T(B(1, 0, 1))),
    ("int tensor of the same values", (3, 4), lambda T: T(I(1, 0, 1))),
    ("int32 tensor", (3, 4), lambda T: T(np.array([2, 0], np.int32))),
    # other index forms
    ("x[[]]", (3, 4), lambda T: []),
    ("x[[[]]]", (3, 4), lambda T: [[]]),
    ("x[[]] on (0,)", (0,), lambda T: []),
    ("empty int tensor", (3, 4), lambda T: T(np.zeros(0, np.int64))),
    ("index with leading size-1 dims", (3, 4), lambda T: T(np.array([[[1, 2]]]))),
    ("array with leading size-1 dims", (10,), lambda T: np.array([[[1]]])),
    ("list of one list: a tuple", (3, 4), lambda T: [[0, 1]]),
    ("nested list: a tuple", (3, 4), lambda T: [[0, 1], [1, 2]]),
    ("tuple of lists", (3, 4), lambda T: ([0, 1], [1, 2])),
    ("ragged list: a tuple that broadcasts", (3, 4), lambda T: [[0, 1], [1]]),
    ("list with a slice", (3, 4), lambda T: [0, slice(None)]),
    ("list with None", (3, 4), lambda T: [None, 0]),
    ("list with a tensor", (3, 4), lambda T: [T(I(0, 1))]),
    ("32 ints", (3, 4), lambda T: [0] * 32),
    ("32 lists: one array", (3, 4), lambda T: [[0]] * 32),
    ("31 lists: too many indices", (3, 4), lambda T: [[0]] * 31),
    ("range", (3, 4), lambda T: range(2)),
    ("bools and ints in a list", (3, 4), lambda T: [True, 1]),
    ("NumPy int", (3, 4), lambda T: np.int64(1)),
    ("0-d int array", (3, 4), lambda T: np.array(1)),
    ("negative ints", (3, 4), lambda T: (-1, -4)),
    ("negative index values", (3, 4), lambda T: T(I(-1, -3))),
    # refused
    ("int out of range", (3, 4), lambda T: 3),
    ("negative int out of range", (3, 4), lambda T: -4),
    ("second int out of range", (3, 4), lambda T: (0, 4)),
    ("int out of range after None", (3, 4), lambda T: (None, 5)),
    ("int out of range after a slice", (3, 4), lambda T: (slice(1, None), 7)),
    ("too many indices", (3, 4), lambda T: (0, 0, 0)),
    ("index value out of range", (3, 4), lambda T: T(I(5))),
    ("second index value out of range", (3, 4, 5), lambda T: (slice(None), T(I(0)), T(I(0, 7)))),
    ("float", (3, 4), lambda T: 1.0),
    ("NumPy float", (3, 4), lambda T: np.float64(1)),
    ("float tensor", (3, 4), lambda T: T(np.array([1.0], np.float32))),
    ("object", (3, 4), lambda T: object()),
    ("zero step", (3, 4), lambda T: slice(None, None, 0)),
]
IDS = [c[0] for c in CASES]


def _x(lib, shape, dtype=np.float32):
    a = np.arange(int(np.prod(shape))).reshape(shape).astype(dtype)
    return torch.from_numpy(a) if lib is torch else tc.tensor(a)


def _torch_T(a):
    return torch.from_numpy(np.array(a))       # a copy that keeps a 0-d array 0-d


def _outcome(fn):
    """("ok", values) or ("raised", the exception)."""
    try:
        out = fn()
    except Exception as e:      # noqa: BLE001 -- the oracle's exception is the expectation
        return "raised", e
    return "ok", out


def _same(got, want) -> None:
    """tracecomp's outcome agrees with PyTorch's: the same values and dtype, or an exception
    of PyTorch's class whose message starts with PyTorch's."""
    if want[0] == "raised":
        assert got[0] == "raised", f"PyTorch raised {want[1]!r}; tracecomp returned {got[1]!r}"
        assert isinstance(got[1], type(want[1])), f"{got[1]!r} is not a {type(want[1]).__name__}"
        assert isinstance(got[1], tc.TracecompError), f"not tracecomp's own error: {got[1]!r}"
        if not str(want[1]).startswith("new():"):      # torch's TypeError for a str names no shape
            assert str(got[1]).startswith(str(want[1])), f"{got[1]} / PyTorch: {want[1]}"
        return
    assert got[0] == "ok", f"PyTorch returned shape {tuple(want[1].shape)}; tracecomp raised {got[1]!r}"
    w, g = want[1].numpy(), np.asarray(got[1].numpy())
    assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
    np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
@pytest.mark.parametrize("desc, shape, build", CASES, ids=IDS)
def test_read_eagerly(desc, shape, build, dtype):
    want = _outcome(lambda: _x(torch, shape, dtype)[build(_torch_T)])
    _same(_outcome(lambda: _x(tc, shape, dtype)[build(tc.tensor)]), want)


@pytest.mark.parametrize("desc, shape, build", CASES, ids=IDS)
def test_read_traced(desc, shape, build):
    """The index is built inside the traced function: its masks are constants there."""
    want = _outcome(lambda: _x(torch, shape)[build(_torch_T)])
    _same(_outcome(lambda: tc.trace(lambda x: x[build(tc.tensor)])(_x(tc, shape))), want)


def _torch_write(shape, build, value):
    x = _x(torch, shape)
    x[build(_torch_T)] = value if np.isscalar(value) else torch.from_numpy(value)
    return x


def _tc_write(x, build, value):
    x = x.clone()
    x[build(tc.tensor)] = value if np.isscalar(value) else tc.tensor(value)
    return x


@pytest.mark.parametrize("desc, shape, build", CASES, ids=IDS)
def test_write_eagerly_and_traced(desc, shape, build):
    """`x[index] = -1`, and `x[index] = v` with v of the indexed shape behind an extra
    leading size-1 dim (PyTorch drops it)."""
    read = _outcome(lambda: _x(torch, shape)[build(_torch_T)])
    values = [-1.0] + ([np.full((1,) + tuple(read[1].shape), -2, np.float32)] if read[0] == "ok" else [])
    for value in values:
        want = _outcome(lambda: _torch_write(shape, build, value))
        _same(_outcome(lambda: _tc_write(_x(tc, shape), build, value)), want)
        _same(_outcome(lambda: tc.trace(lambda x: _tc_write(x, build, value))(_x(tc, shape))), want)


MASK_INPUTS = [(c[0], c[1], c[2]) for c in CASES
               if "mask" in c[0] and "list" not in c[0] and "array" not in c[0]]


@pytest.mark.parametrize("desc, shape, build", MASK_INPUTS, ids=[c[0] for c in MASK_INPUTS])
def test_traced_masks_as_inputs_check_their_shape_first(desc, shape, build):
    """Masks passed in are symbolic in a trace: a read whose size they set is refused with a
    TraceError, but a mask of the wrong shape raises PyTorch's IndexError first.  (Whether a
    mask's picks broadcast against another index depends on its values: that one is a
    TraceError too.)"""
    leaves = []
    build(lambda a: leaves.append(a) or a)

    def fn(x, *idx):
        it = iter(idx)
        return x[build(lambda a: next(it))]
    want = _outcome(lambda: _x(torch, shape)[build(_torch_T)])
    got = _outcome(lambda: tc.trace(fn)(_x(tc, shape), *leaves))
    value_dependent = want[0] == "ok" or str(want[1]).startswith("shape mismatch: indexing tensors")
    if value_dependent and got[0] == "raised":
        assert isinstance(got[1], tc.TraceError) and "x[mask]" in str(got[1]), got[1]
    else:
        _same(got, want)


def test_a_wrong_mask_written_in_a_trace_raises_before_the_values_are_needed():
    x, m = np.zeros(10, np.float32), B(1, 0, 1)
    message = r"The shape of the mask \[3\] at index 0 does not match the shape of the indexed tensor \[10\]"

    def write(x, m):
        x = x.clone()
        x[m] = 5.0
        return x
    with pytest.raises(IndexError, match=message):
        tc.trace(write)(x, m)
    with pytest.raises(IndexError, match=message):
        tc.trace(lambda x, m: x[m])(x, m)
    ok = B(*([1, 0] * 5))
    np.testing.assert_array_equal(tc.trace(write)(x, ok).numpy(), np.where(ok, 5.0, 0.0))


@pytest.mark.parametrize("indices", [
    lambda T: (T(B(1, 0, 1)),),
    lambda T: (T(np.ones(10, bool)),),
    lambda T: (T(I(0)), T(B(1, 0, 1))),
    lambda T: (T(B(1, 0, 1)), T(I(0, 3))),
], ids=["(3,) mask on (10,)", "(10,) mask", "index and wrong mask", "mask and index"])
def test_index_put_checks_masks(indices):
    shape = (10,) if len(indices(np.asarray)) == 1 else (3, 4)
    for accumulate in (False, True):
        want = _outcome(lambda: _x(torch, shape).index_put(indices(_torch_T), torch.tensor(1.0), accumulate))
        got = _outcome(lambda: _x(tc, shape).index_put(indices(tc.tensor), tc.tensor(np.float32(1.0)), accumulate))
        if got[0] == "raised":          # index_put's errors say which call failed, then the cause
            got = ("raised", type(got[1])(str(got[1]).split(": ", 1)[-1]))
        _same(got, want)


@pytest.mark.parametrize("desc, shape, build", CASES, ids=IDS)
def test_gradients_of_the_reads_that_pytorch_accepts(desc, shape, build):
    xt = _x(torch, shape).double().requires_grad_(True)
    try:
        out = xt[build(_torch_T)]
    except Exception:               # noqa: BLE001 -- refused: the other tests check the error
        return
    w = np.random.default_rng(0).uniform(0.5, 1.5, tuple(out.shape))
    (want,) = torch.autograd.grad((out * torch.from_numpy(w)).sum(), xt)
    got = tc.grad(lambda x: (x[build(tc.tensor)] * tc.tensor(w)).sum())(_x(tc, shape, np.float64))
    np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.parametrize("op", ["masked_fill", "masked_select"])
def test_masked_ops_refuse_a_mask_that_does_not_broadcast(op):
    """PyTorch raises RuntimeError (a broadcast error); tracecomp's ShapeError names both shapes."""
    call = {"masked_fill": lambda x, m: x.masked_fill(m, 1.0), "masked_select": lambda x, m: x.masked_select(m)}[op]
    x, m = np.zeros(10, np.float32), B(1, 0, 1)
    with pytest.raises(RuntimeError):
        call(torch.from_numpy(x), torch.from_numpy(m))
    for run in (lambda: call(tc.tensor(x), tc.tensor(m)), lambda: tc.trace(call)(x, m)):
        with pytest.raises(tc.ShapeError, match=r"\(10,\).*\(3,\)"):
            run()


@pytest.mark.parametrize("index", [np.s_[::-1], np.s_[1:3, ::-2], np.bool_(True), np.bool_(False),
                                   (np.array(False), 0, 0)],
                         ids=["negative step", "negative step on dim 1", "np.True_", "np.False_",
                              "0-d bool array then two ints"])
def test_forms_numpy_accepts_and_pytorch_refuses_read_as_numpy(index):
    """tracecomp reads these as NumPy does (PyTorch refuses them)."""
    a = np.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(tc.tensor(a)[index].numpy(), a[index])


def test_two_ellipses_raise_as_numpy():
    """NumPy refuses them; PyTorch's reading is inconsistent (x[..., ..., 0] indexes a dim of size 0)."""
    with pytest.raises(IndexError, match=r"single ellipsis"):
        tc.ones(2, 3)[..., ...]


# ------------------------------------------------------------------ random masks

@st.composite
def _masked_index(draw):
    """A shape, and an index of slices with one mask whose dims mostly match the dims it
    covers: each dim off by one now and then, or one dim more or fewer."""
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=3)))
    at = draw(st.integers(0, len(shape) - 1))
    k = draw(st.integers(0, len(shape) - at))
    mask_shape = [n + draw(st.sampled_from([0, 0, 0, 1, -1])) for n in shape[at:at + k]]
    if at + k < len(shape) and draw(st.booleans()) and draw(st.booleans()):
        mask_shape.append(draw(st.integers(0, 3)))      # one dim more than intended
    mask_shape = [max(n, 0) for n in mask_shape]
    seed = draw(st.integers(0, 2**16))
    values = np.asarray(np.random.default_rng(seed).random(mask_shape) < 0.5)
    room = at + len(mask_shape) < len(shape)       # a dim left for an int (too many: in CASES)
    after = draw(st.sampled_from([(), (None,), (Ellipsis,)] + [(0,)] * room))
    return shape, (slice(None),) * at, values, after


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_masked_index(), st.sampled_from(["tensor", "array", "list"]))
def test_random_masks_read_and_write_as_pytorch(case, form):
    shape, before, values, after = case
    if form == "array" and values.ndim == 0:
        form = "tensor"     # PyTorch counts a 0-d array as an indexed dim, a 0-d tensor not (NumPy: not)
    as_index = {"tensor": lambda T: T(values), "array": lambda T: values, "list": lambda T: values.tolist()}[form]
    build = lambda T: before + (as_index(T),) + after      # noqa: E731
    want = _outcome(lambda: _x(torch, shape)[build(_torch_T)])
    _same(_outcome(lambda: _x(tc, shape)[build(tc.tensor)]), want)
    want = _outcome(lambda: _torch_write(shape, build, -1.0))
    _same(_outcome(lambda: _tc_write(_x(tc, shape), build, -1.0)), want)
