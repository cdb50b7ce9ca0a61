"""Innermost loops split where their body divides the loop variable by a constant.

A loop over a flattened dim, `for i < a*c`, whose body reads `i // c` and `i % c` (im2col's
window column `oh*ow_count + ow`, a reshape that un-flattens) computes a division per
element, and its loads are gathers: the address is not affine in `i`.  Split into
`for io < a: for ii < c` with `i // c = io`, `i % c = ii` and `i = io*c + ii` elsewhere, the
inner loop reads and writes consecutive elements and vectorizes as a plain copy
(W7's im2col: BENCHMARKS.md, "Tuned from the host").

Only innermost loops with one divisor c that divides the extent exactly are split: with
constant ones, where c >= MIN_INNER (a shorter inner loop would not fill a vector); with
sizes known at run time (`for i < h*w` by w: a dynamic image's window column) always,
since a division by a run-time value per element costs more than a short inner loop.
"""
from __future__ import annotations

from ...core.symbolic import DynamicShapeError
from ..loops import index as I
from ..loops import ir as L
from ..loops.walk import substitute, walk

MIN_INNER = 16


def split_divided_loops(body: list) -> list:
    """`body` with every qualifying innermost Loop split (statements are rebuilt in place)."""
    out = []
    for s in body:
        if isinstance(s, L.Loop):
            if any(isinstance(c, (L.Loop, L.Reduce, L.Matmul)) for c in s.body):
                s.body = split_divided_loops(s.body)
            else:
                s = _split(s)
        out.append(s)
    return out


def _divisors(loop: L.Loop, var: L.Var) -> list:
    """The divisors of `var` in the body: constants, or size expressions (a dynamic width)."""
    out: list = []
    for n in walk(loop.body):
        if isinstance(n, L.Binary) and n.fn in ("floordiv", "mod") and n.a == var and n.b not in out \
                and (isinstance(n.b, L.Const) and isinstance(n.b.value, int) or _size(n.b) is not None):
            out.append(n.b)
    return out


def _size(e):
    """A loop-IR extent or divisor as an int or symbolic.Dim; None for other expressions."""
    try:
        return I.symbolic(e)
    except ValueError:
        return None


def _split(loop: L.Loop) -> L.Loop:
    var = L.Var(loop.var, L.INDEX)
    divisors = _divisors(loop, var)
    extent = _size(loop.extent)
    if len(divisors) != 1 or extent is None:
        return loop
    c = divisors.pop()
    size = _size(c)
    if isinstance(extent, int):
        if not isinstance(size, int) or size < MIN_INNER or size >= extent or extent % size:
            return loop
        outer_extent = extent // size
    else:       # dynamic: split where the divisor divides the extent for every size (h*w by w)
        try:
            outer_extent = I.dim(extent.divided_exactly(size))
        except DynamicShapeError:
            return loop
    outer, inner = L.Var(f"{loop.var}o", L.INDEX), L.Var(f"{loop.var}i", L.INDEX)
    whole = I.add(I.mul(outer, c), inner)

    def rule(node):
        if isinstance(node, L.Binary) and node.a == var and node.b == c:
            return outer if node.fn == "floordiv" else inner if node.fn == "mod" else None
        return whole if node == var else None
    body = substitute(loop.body, rule)
    inner_extent = size if isinstance(size, int) else c
    return L.Loop(outer.name, outer_extent, [L.Loop(inner.name, inner_extent, body)], parallel=loop.parallel)
