"""Every op of the shared sample table traced with every input dim dynamic (issue 36).

Per op, its first sample with a dim of size >= 2 is traced with `dynamic=True` and called
at its own sizes and at two others: every distinct size d >= 2 of the sample's inputs
becomes d + 1, then d + 3 (the same new size wherever the same old one was, so shapes
that must agree still do), the values tiled from the sample's own along each axis (index
values stay in range).  Each call must match eager tracecomp on the same inputs (itself
checked against NumPy and PyTorch elsewhere); a size the eager op refuses (a sample that
names a size in its call, as reshape's) is no size of that op, and is skipped.

And the compiles: one for all three sizes, except where the op needs a size as a number
(a size it specializes, or compiles per shape: COMPILES_PER_SIZE says which and why).
A fourth call at the first sizes again must reuse a compile.  The default run takes every
tenth op (tables/sweeps.py); TRACECOMP_SLOW=1 runs them all.
"""
from __future__ import annotations

import numpy as np
import pytest

import tracecomp as tc
from tables.op_samples import SAMPLES, leaves
from tables.sweeps import sweep

GROWTH = (1, 3)


def _first_resizable(samples):
    for s in samples:
        if not s.nondeterministic and any(d >= 2 for a in s.inputs for d in np.shape(a)):
            return s
    return None


CASES = [s for s in (_first_resizable(ss) for ss in SAMPLES.values()) if s is not None]
PARAMS = sweep([pytest.param(s, id=s.op) for s in CASES], lambda p: CASES.index(p.values[0]) % 10 == 0)


def _resized(inputs: tuple, grow: int) -> list[np.ndarray]:
    """The inputs with every size d >= 2 made d + grow, values tiled along each axis."""
    out = []
    for a in inputs:
        a = np.asarray(a)
        for axis, d in enumerate(a.shape):
            if d >= 2:
                a = np.take(a, np.arange(d + grow) % d, axis=axis)
        out.append(np.array(a, order="C"))       # (ascontiguousarray would make a 0-d array 1-d)
    return out


def _eager(s, arrays):
    return [np.asarray(x) for x in leaves(s.call(*[tc.tensor(a) for a in arrays]))]


@pytest.mark.parametrize("s", PARAMS)
def test_an_op_with_every_dim_dynamic_compiles_once_and_matches_eager(s):
    f = tc.trace(s.call, dynamic=True)
    calls = [list(s.inputs)]
    for grow in GROWTH:
        arrays = _resized(s.inputs, grow)
        try:
            _eager(s, arrays)
        except tc.TracecompError:
            continue            # a size this op (as the sample calls it) does not take
        calls.append(arrays)
    for arrays in calls + calls[:1]:
        want = _eager(s, arrays)
        got = [np.asarray(x) for x in leaves(f(*arrays))]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (s.id, [a.shape for a in arrays])
            if w.dtype.kind == "f":
                tol = 1e-5 if w.dtype == np.float32 else 1e-12
                np.testing.assert_allclose(g, w, rtol=tol * 50, atol=tol * 10, equal_nan=True,
                                           err_msg=f"{s.id} at {[a.shape for a in arrays]}")
            else:
                np.testing.assert_array_equal(g, w, err_msg=f"{s.id} at {[a.shape for a in arrays]}")
    compiles = len(f.signatures)
    if s.op in COMPILES_PER_SIZE:       # (an op that now compiles once leaves the list)
        assert 1 < compiles <= len(calls), f"{s.id}: {compiles} compile(s) for {len(calls)} sizes"
    else:
        assert compiles == 1, f"{s.id}: {compiles} compiles for {len(calls)} sizes: {f.signatures}"


# The ops whose sample compiles once per size with every dim dynamic, and why (found by the
# full sweep).  Each is correct at every size (checked above); the trace with dynamic sizes
# fails and tc.trace falls back to one compile per shape, or fixes the size it needs.
_COUNT = "the number of results depends on the size (PyTorch specializes it too)"
_HEAD = "attention's head dim is fixed per compile (specialized, as the kernel tiles it)"
COMPILES_PER_SIZE: dict[str, str] = {
    **dict.fromkeys(["unbind", "split", "chunk", "tensor_split"], _COUNT),
    **dict.fromkeys(["scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                     "_scaled_dot_product_flash_attention_for_cpu_backward"], _HEAD),
}


def test_the_list_of_ops_that_compile_per_size_names_ops_of_the_table():
    assert set(COMPILES_PER_SIZE) <= set(SAMPLES)
