"""Innermost loops split where their body divides the loop variable by a constant.

A loop over a flattened dim, `for i < a*c`, whose body reads `i // c` and `i % c` (im2col's
window column `oh*ow_count + ow`, a reshape that un-flattens) computes a division per
element, and its loads are gathers: the address is not affine in `i`.  Split into
`for io < a: for ii < c` with `i // c = io`, `i % c = ii` and `i = io*c + ii` elsewhere, the
inner loop reads and writes consecutive elements and vectorizes as a plain copy
(W7's im2col: BENCHMARKS.md, "Tuned from the host").

Only innermost loops with a constant extent, one divisor c that divides it exactly, and
c >= MIN_INNER (a shorter inner loop would not fill a vector) are split.
"""
from __future__ import annotations

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


def _divisors(loop: L.Loop, var: L.Var) -> set[int]:
    return {n.b.value for n in walk(loop.body)
            if isinstance(n, L.Binary) and n.fn in ("floordiv", "mod") and n.a == var
            and isinstance(n.b, L.Const) and isinstance(n.b.value, int)}


def _split(loop: L.Loop) -> L.Loop:
    if not isinstance(loop.extent, int):
        return loop
    var = L.Var(loop.var, L.INDEX)
    divisors = _divisors(loop, var)
    if len(divisors) != 1:
        return loop
    c = divisors.pop()
    if c < MIN_INNER or c >= loop.extent or loop.extent % c:
        return loop
    outer, inner = L.Var(f"{loop.var}o", L.INDEX), L.Var(f"{loop.var}i", L.INDEX)
    whole = I.add(I.mul(outer, c), inner)

    def rule(node):
        if isinstance(node, L.Binary) and node.a == var and node.b == L.Const(c, L.INDEX):
            return outer if node.fn == "floordiv" else inner if node.fn == "mod" else None
        return whole if node == var else None
    body = substitute(loop.body, rule)
    return L.Loop(outer.name, loop.extent // c, [L.Loop(inner.name, c, body)], parallel=loop.parallel)
