"""The CPU backend (scheduler + LLVM codegen + JIT) against eager execution, op by op."""
import numpy as np
import pytest

import tracecomp as tc

from op_samples import SAMPLES

CASES = [s for name, ss in SAMPLES.items() if name not in ("rand", "randn") for s in ss]


def _as_list(out):
    return [np.asarray(t) for t in (out if isinstance(out, (tuple, list)) else [out])]


@pytest.mark.parametrize("s", CASES, ids=[s.id for s in CASES])
def test_compiled_matches_eager(s):
    try:
        eager = _as_list(tc.trace(s.call, backend="interp")(*s.inputs))
    except tc.TracecompError:
        pytest.skip("an error case")
    got = _as_list(tc.trace(s.call, backend="cpu")(*s.inputs))
    for e, o in zip(eager, got):
        assert (e.dtype, e.shape) == (o.dtype, o.shape)
        if e.dtype.kind == "f":
            tol = 1e-5 if e.dtype == np.float32 else 1e-12
            np.testing.assert_allclose(o, e, rtol=tol * 20, atol=tol, equal_nan=True)
        else:
            np.testing.assert_array_equal(o, e)
