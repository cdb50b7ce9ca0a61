"""The CPU backend (scheduler + LLVM codegen + JIT) against eager execution, op by op."""
import numpy as np
import pytest

import tracecomp as tc

from tables.op_samples import SAMPLES, assert_outputs_match
from tables.sweeps import sweep

CASES = [s for name, ss in SAMPLES.items() if name not in ("rand", "randn") for s in ss]
# The default run takes each op's first sample per dtype of its first input; the others are
# marked slow (TRACECOMP_SLOW=1).
_FIRST = {id(s) for s in {(s.op, str(np.asarray(s.inputs[0]).dtype) if s.inputs else ""): s
                          for s in reversed(CASES)}.values()}
SWEPT = sweep([pytest.param(s, id=s.id) for s in CASES], lambda p: id(p.values[0]) in _FIRST)


def _as_list(out):
    return [np.asarray(t) for t in (out if isinstance(out, (tuple, list)) else [out])]


@pytest.mark.parametrize("s", SWEPT)
def test_compiled_matches_eager(s):
    try:
        eager = _as_list(tc.trace(s.call, backend="interp")(*s.inputs))
    except tc.TracecompError:
        pytest.skip("an error case")
    assert_outputs_match(_as_list(tc.trace(s.call, backend="cpu")(*s.inputs)), eager)


def test_random_draws_are_fresh_per_call_and_follow_manual_seed():
    f = tc.trace(lambda x: x + tc.randn(1000), backend="cpu")
    x = np.zeros(1000, np.float32)
    a, b = np.asarray(f(x)), np.asarray(f(x))
    assert a.dtype == np.float32 and not np.array_equal(a, b)
    assert abs(a.mean()) < 0.2 and 0.8 < a.std() < 1.2
    tc.manual_seed(5)
    c = np.asarray(f(x))
    tc.manual_seed(5)
    np.testing.assert_array_equal(c, np.asarray(f(x)))


def test_out_of_range_indices_raise_before_native_code_runs():
    f = tc.trace(lambda x, t: tc.cross_entropy(x, t), backend="cpu")
    with pytest.raises(tc.ShapeError, match="gather: index 3 is out of bounds for dim 1 with size 3"):
        f(np.ones((2, 3), np.float32), np.array([0, 3]))


def test_an_ignored_target_passes_the_index_check_and_others_do_not():
    f = tc.trace(lambda x, t: tc.cross_entropy(x, t, ignore_index=7), backend="cpu")
    x = np.random.default_rng(0).normal(size=(3, 3)).astype(np.float32)
    want = tc.cross_entropy(tc.tensor(x), tc.tensor([0, 7, 2]), ignore_index=7)
    np.testing.assert_allclose(f(x, np.array([0, 7, 2])).numpy(), want.numpy(), rtol=1e-6)
    for bad in (3, -100):
        with pytest.raises(tc.ShapeError, match=f"gather: index {bad} is out of bounds for dim 1 with size 3"):
            f(x, np.array([0, bad, 2]))


def test_wrong_inputs_to_a_compiled_program_are_refused():
    low = tc.trace(lambda x: x + 1, backend="cpu").lower(np.ones(3, np.float32))
    with pytest.raises(tc.ArgumentError, match=r"input 0 must be float32\[3\], got float64\[3\]"):
        low.compiled([np.ones(3)])
    with pytest.raises(tc.ArgumentError, match="takes 1 inputs, got 2"):
        low.compiled([np.ones(3, np.float32)] * 2)


def test_misaligned_and_strided_inputs_are_handled():
    f = tc.trace(lambda x: x * 2, backend="cpu")
    base = np.arange(40, dtype=np.float32)
    for x in (base[1:33], base[::2][:16].reshape(4, 4).T):
        np.testing.assert_array_equal(np.asarray(f(x)), x * 2)


def test_stages_print():
    low = tc.trace(lambda x: (x * 2).exp().sum(), backend="cpu").lower(np.ones((64, 64), np.float32))
    assert "scf.for" in low.as_text("loops")
    assert "define" in low.as_text("llvm")
    assert "ret" in low.as_text("asm")
