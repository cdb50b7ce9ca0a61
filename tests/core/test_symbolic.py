"""symbolic.Dim: the dynamic sizes of exported libraries, as shape rules see them."""
from __future__ import annotations

import pickle

import pytest
from hypothesis import given, strategies as st

from tracecomp.core.symbolic import Dim, DynamicShapeError, evaluate, hint, size_names

B = Dim.named("batch", 8)
N = Dim.named("n", 3)


def test_arithmetic_is_polynomial_and_structural():
    assert 784 * B == B * 784 and str(784 * B) == "784*batch"
    assert B - B == 0 and isinstance(B - B, int)
    assert (B + 1) * (B - 1) == B * B - 1
    assert str(B * N + 2 * B - 3) == "batch*n + 2*batch - 3"
    assert (784 * B) // 784 == B and (784 * B) // B == 784 and (6 * B * N) % (3 * N) == 0
    assert hash(B * 2) == hash(2 * B)
    assert hint(784 * B) == 784 * 8 and hint(5) == 5


def test_never_equal_to_an_int_so_it_does_not_broadcast():
    assert B != 1 and not (B == 8) and B != N


@pytest.mark.parametrize("expr, expected", [
    (lambda: B >= 1, True), (lambda: B > 0, True), (lambda: 10 * B > 1, True),
    (lambda: B < 1, False), (lambda: B + 1 > B, True), (lambda: 4 * B >= 3 * B, True),
    (lambda: -B < 0, True), (lambda: 0 > B - 1, False),
])
def test_comparisons_that_hold_for_every_size(expr, expected):
    assert expr() is expected


@pytest.mark.parametrize("expr, message", [
    (lambda: B > 4, "cannot decide whether batch > 4"),
    (lambda: B > 1, "cannot decide whether batch > 1"),
    (lambda: B * 20 <= 4096, "cannot decide"),
    (lambda: int(B), "has no value at trace time"),
    (lambda: range(B), "has no value at trace time"),
    (lambda: (20 * B) // -3, "cannot divide the dynamic size 20\\*batch by -3 exactly"),
    (lambda: (20 * B) % N, "depends on its value"),
    (lambda: bool(B % 2), "cannot decide whether batch - 2\\*floor\\(batch/2\\) > 0"),
    (lambda: B // N, "cannot divide"),
    (lambda: B / 2, "to a float"),
])
def test_undecidable_or_concrete_uses_raise(expr, message):
    with pytest.raises(DynamicShapeError, match=message):
        expr()


def test_floor_division_by_a_positive_int_is_a_size_expression():
    H = Dim.named("h", 10)
    out = (H + 2 * 1 - 1 * (3 - 1) - 1) // 2 + 1          # a window count: stride 2, kernel 3, padding 1
    assert str(out) == "floor((h + 1)/2)" and out.hint() == 5 and out.names() == ["h"]
    assert (H + 2) // 2 == H // 2 + 1 and (2 * H + 2) // 4 == (H + 1) // 2      # by structure
    assert ((H + 1) // 2) // 3 == (H + 1) // 6 and (4 * H + 6) // 2 == 2 * H + 3
    assert hash((H + 2) // 2) == hash(H // 2 + 1) and (H + 1) // 2 != H // 2
    assert -(-H // 2) == H - H // 2                          # ceil
    assert (H + 1) // 2 >= 1 and H // 2 >= 0 and (3 * H + 3) // 2 > H    # monotone in h
    with pytest.raises(DynamicShapeError, match="cannot decide"):
        H // 2 > 1
    for h in range(1, 40):
        assert [evaluate(e, {"h": h}) for e in (out, H % 3, divmod(H * H + 5, 4)[1], -(-H // 3))] == \
            [(h + 1) // 2, h % 3, (h * h + 5) % 4, -(-h // 3)]
    assert pickle.loads(pickle.dumps((H + 1) // 2)) == (H + 1) // 2


def test_bad_names_and_size_names_order():
    with pytest.raises(DynamicShapeError, match="identifier"):
        Dim.named("not a name", 1)
    assert size_names([(3, N), (B * N, B)]) == ["n", "batch"]


@given(st.lists(st.tuples(st.integers(-5, 5), st.integers(0, 2), st.integers(0, 2)), max_size=5),
       st.integers(1, 50), st.integers(1, 50))
def test_evaluate_matches_integer_arithmetic(terms, b, n):
    """A Dim built from random terms evaluates like the same arithmetic on ints, and every
    comparison with 0 it decides is right at these sizes."""
    d, want = 0, 0
    for c, pb, pn in terms:
        d = d + c * _power(B, pb) * _power(N, pn)
        want += c * b ** pb * n ** pn
    assert evaluate(d, {"batch": b, "n": n}) == want
    for op in (lambda x: x > 0, lambda x: x >= 0, lambda x: x < 0, lambda x: x <= 0):
        try:
            decided = op(d)
        except DynamicShapeError:
            continue
        assert decided == op(want)


def _power(d, k):
    out = 1
    for _ in range(k):
        out = out * d
    return out


def test_divmod_of_a_dynamic_size_is_exact_a_floor_or_a_dynamic_shape_error():
    from tracecomp.core.symbolic import Dim, DynamicShapeError
    n = Dim.named("n", 8)
    assert divmod(6 * n, 3) == (2 * n, 0)
    assert divmod(n, 3) == (n // 3, n - 3 * (n // 3))
    with pytest.raises(DynamicShapeError, match="cannot divide"):
        divmod(n, Dim.named("m", 2))
    with pytest.raises(DynamicShapeError):
        divmod(7, n)
