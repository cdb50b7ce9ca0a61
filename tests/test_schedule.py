"""The scheduler (graph -> loop-IR kernels) against eager execution, through the loop-IR
interpreter, for the shared op samples; and the fusion decisions it makes."""
import numpy as np
import pytest

import tracecomp as tc
from tracecomp.lower.loops_interp import run_program
from tracecomp.lower.schedule import schedule

from op_samples import SAMPLES

SMALL = [s for name, ss in SAMPLES.items() if name not in ("rand", "randn") for s in ss[:3]
         if all(np.asarray(a).size <= 400 for a in s.inputs)]


def _eager(s):
    out = tc.trace(s.call)(*s.inputs)
    return [np.asarray(t) for t in (out if isinstance(out, (tuple, list)) else [out])]


@pytest.mark.parametrize("s", SMALL, ids=[s.id for s in SMALL])
def test_scheduled_program_matches_eager(s):
    try:
        graph = tc.trace(s.call).lower(*s.inputs).optimized
    except tc.TracecompError:
        pytest.skip("the sample is an error case")
    got = run_program(schedule(graph), [np.asarray(a) for a in s.inputs])
    for e, o in zip(_eager(s), got):
        assert (e.dtype, e.shape) == (o.dtype, o.shape)
        np.testing.assert_allclose(o.astype(float), e.astype(float), rtol=1e-5, atol=1e-6, equal_nan=True)


def _kernels(fn, *inputs):
    return schedule(tc.trace(fn).lower(*inputs).optimized).kernels


def test_elementwise_chain_with_broadcast_is_one_kernel():
    x, b = np.ones((4, 8), np.float32), np.ones(8, np.float32)
    ks = _kernels(lambda x, b: ((x + b) * 2).tanh().sigmoid() - x.T.T, x, b)
    assert len(ks) == 1


def test_reduction_fuses_its_producers_and_views():
    x = np.ones((4, 8), np.float32)
    ks = _kernels(lambda x: (x.T * 3).exp().sum(0), x)
    assert len(ks) == 1 and ks[0].name.endswith("sum")


def test_multi_use_values_are_computed_once():
    x = np.ones((4, 8), np.float32)
    ks = _kernels(lambda x: tc.softmax(x, 1), x)
    assert [k.name.rsplit("_", 1)[1] for k in ks] == ["amax", "exp", "sum", "div"]


def test_out_of_range_index_inputs_are_marked_for_checking():
    p = schedule(tc.trace(lambda x, t: tc.cross_entropy(x, t)).lower(
        np.ones((4, 3), np.float32), np.zeros(4, np.int64)).optimized)
    [(name, [check])] = p.index_checks.items()
    assert (check.op, check.dim, check.size) == ("gather", 1, 3)
