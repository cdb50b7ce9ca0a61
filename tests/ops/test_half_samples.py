"""The shared op samples (tests/tables/op_samples.py) in bfloat16 and float16: every sample
with a float32 input runs with those inputs rounded to the half dtype, eagerly, through the
loop-IR interpreter and compiled, and is compared with the sample's float64 reference on
the rounded inputs within PyTorch's own tolerances for the dtype (torch.testing's
defaults: bfloat16 rtol 1.6e-2, float16 rtol 1e-3, both atol 1e-5).  Elementwise ops agree
bit for bit between the three; the interpreter agrees bit for bit with eager everywhere.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tracecomp as tc
from tracecomp.ops.table import default_table

from tables.op_samples import SAMPLES, Sample, expected_dtypes, leaves
from tables.sweeps import sweep

HALF = {"bfloat16": (ml_dtypes.bfloat16, 1.6e-2), "float16": (np.float16, 1e-3)}
ATOL = 1e-5
SAMPLED = [s for samples in SAMPLES.values() for s in samples
           if not s.nondeterministic and any(np.asarray(a).dtype == np.float32 for a in s.inputs)]
# Samples whose meaning does not survive rounding the inputs (the reference is exact only
# for the float32 values the sample chose), each with why.
NOT_IN_HALF = {
    "nan_to_num:edge values f32: infinities become float32's extremes": "its reference gives float32's "
    "extremes; a half dtype's own are checked against torch in tests/core/test_half_dtypes.py",
}


def _half_inputs(s: Sample, half) -> list[np.ndarray]:
    with np.errstate(over="ignore"):
        return [np.asarray(a).astype(half) if np.asarray(a).dtype == np.float32 else a for a in s.inputs]


def _reference(s: Sample, inputs) -> list[np.ndarray]:
    wide = [a.astype(np.float64) if a.dtype.itemsize == 2 and a.dtype != np.int16 else
            a.astype(np.int64) if a.dtype.kind in "iu" else a for a in map(np.asarray, inputs)]
    with np.errstate(all="ignore"):
        want = s.ref(*wide)
    return list(want) if isinstance(want, tuple) else [want]


def _run(s: Sample, inputs, backend: str | None) -> list[np.ndarray]:
    if backend is None:
        outs = leaves(s.call(*[tc.tensor(a) for a in inputs]))
    else:
        outs = leaves(tc.trace(s.call, backend=backend)(*inputs))
    return [np.asarray(t) for t in outs]


def _exact(a: np.ndarray) -> np.ndarray:
    """Half values widened exactly to float32, to compare by value (NaN equal to NaN)."""
    return a.astype(np.float32) if a.dtype.itemsize == 2 else a


def _assert_close(s: Sample, got: np.ndarray, want, rtol: float, half, what: str) -> None:
    """Within PyTorch's tolerance for a half result; float32's and float64's as test_ops.py
    allows them for others (a half input promoted with a float64 one, say)."""
    want = np.asarray(want)
    assert got.shape == want.shape, f"{s.id} ({what}): shape {got.shape}, reference {want.shape}"
    if got.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=f"{s.id} ({what})")
        return
    with np.errstate(all="ignore"):
        want = want.astype(got.dtype).astype(np.float64)
    tol = (max(rtol, s.rtol or 0), max(ATOL, s.atol or 0)) if got.dtype == half else \
        (max(1e-5, s.rtol or 0), max(1e-6, s.atol or 0))
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol[0], atol=tol[1], equal_nan=True,
                               err_msg=f"{s.id} ({what})")


# The default run takes each op's first sample (in both dtypes), the others are marked
# slow (TRACECOMP_SLOW=1).
_FIRST = {id(s) for s in {s.op: s for s in reversed(SAMPLED)}.values()}
SWEPT = sweep([pytest.param(s, id=s.id) for s in SAMPLED], lambda p: id(p.values[0]) in _FIRST)


@pytest.mark.parametrize("dtype", list(HALF))
@pytest.mark.parametrize("s", SWEPT)
def test_half_sample_matches_reference_eager_interpreted_and_compiled(s: Sample, dtype: str):
    if s.id in NOT_IN_HALF:
        pytest.skip(NOT_IN_HALF[s.id])
    half, rtol = HALF[dtype]
    inputs = _half_inputs(s, half)
    want = _reference(s, inputs)
    eager = _run(s, inputs, None)
    assert len(eager) == len(want) == len(expected_dtypes(s))
    for i, (g, w) in enumerate(zip(eager, want)):
        _assert_close(s, g, w, rtol, half, f"eager result {i}")
    elementwise = default_table()[s.op].kind == "elementwise"
    for backend in ("interp", "cpu"):
        for i, (e, c) in enumerate(zip(eager, _run(s, inputs, backend))):
            assert (c.dtype, c.shape) == (e.dtype, e.shape), f"{s.id}: {backend} result {i}"
            if backend == "interp" or (elementwise and e.dtype == half):   # bit for bit (but a zero's sign)
                np.testing.assert_array_equal(_exact(c), _exact(e), err_msg=f"{s.id} ({backend})", strict=True)
            else:
                _assert_close(s, c, e, rtol, half, f"{backend} result {i}")
