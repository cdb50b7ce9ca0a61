"""Exact division of a dynamic size by a sum of terms (symbolic long division): a diagonal's
strided slice of m * n elements with step n + 1 has the length (k * (n + 1)) // (n + 1)."""
from __future__ import annotations

import pytest

from tracecomp.core.symbolic import Dim, DynamicShapeError

a, b, c = Dim.named("a", 3), Dim.named("b", 4), Dim.named("c", 5)


@pytest.mark.parametrize("quotient, divisor", [
    (a, b + 1), (a + b, a + b), (a * b + 3, a - 2), (2 * a * a * c - b, a * c + 7), (a * b * c + 1, b * c - 1),
    (a, 2 * b + 4), (b * b + 2, a * a * a + b + 1),
])
def test_a_product_divided_by_a_sum_gives_the_factor_back(quotient, divisor):
    assert (quotient * divisor) // divisor == quotient
    assert (quotient * divisor).divided_exactly(divisor) == quotient


def test_a_constant_quotient_is_an_int():
    assert (3 * a + 6) // (a + 2) == 3


@pytest.mark.parametrize("dividend, divisor", [
    (a * b + a + 1, b + 1),        # a remainder of 1
    (a * a, a + 1),
    (3 * a + 1, 2 * a + 1),        # 3/2 is no integer coefficient
    (a + b, a + c),
])
def test_an_inexact_division_by_a_sum_raises(dividend, divisor):
    with pytest.raises(DynamicShapeError, match="exactly"):
        dividend // divisor
    with pytest.raises(DynamicShapeError, match="depends on its value"):
        dividend.divided_exactly(divisor)
