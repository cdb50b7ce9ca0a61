"""Innermost loops split where a select's condition changes.

cat, slice_backward and sums of them (an LSTM's gate gradients placed into one row of
four slices), pad and select_backward store a select per element whose conditions
compare the loop variable with constants: `i < 256 ? a[i] : (i < 512 ? b[i - 256] : ...)`.
Every element then evaluates every piece, through clamped indices that are not affine,
so the vectorizer gathers.  Split at the points where some condition changes, each
piece's loop has constant conditions: its selects fold to the one branch taken, its clamps
to the index itself, and it reads consecutive elements (W12's gate-gradient kernel:
BENCHMARKS.md, "Loops").

Only innermost loops with a constant extent whose body is stores (pointwise nests), and
only where at most MAX_PIECES pieces come out and every piece folds a select.
"""
from __future__ import annotations

from typing import Optional

from ..loops import index as I
from ..loops import ir as L
from ..loops.walk import substitute, walk
from .operands import affine

MAX_PIECES = 8
# a comparison of a and b as a test of the sign of a - b
_SIGN_TESTS = {"lt": lambda x: x < 0, "le": lambda x: x <= 0, "gt": lambda x: x > 0,
               "ge": lambda x: x >= 0, "eq": lambda x: x == 0, "ne": lambda x: x != 0}


def split_piecewise_loops(body: list) -> list:
    """`body` with every qualifying innermost Loop split into pieces (statements are
    rebuilt in place)."""
    out = []
    for s in body:
        if isinstance(s, L.Loop) and any(isinstance(c, (L.Loop, L.Reduce, L.Matmul)) for c in s.body):
            s.body = split_piecewise_loops(s.body)
            out.append(s)
        elif isinstance(s, L.Loop) and isinstance(s.extent, int) and all(isinstance(c, L.Store) for c in s.body):
            out += _split(s)
        else:
            out.append(s)
    return out


def _linear(node: L.Binary, var: str) -> Optional[tuple[int, int]]:
    """(k, c) with node.a - node.b = k*var + c, k = +-1, for an index comparison or
    min/max of `var` alone; else None."""
    a, b = affine(node.a), affine(node.b)
    if a is None or b is None:
        return None
    diff = dict(a)
    for name, coef in b.items():
        diff[name] = diff.get(name, 0) - coef
    k, c = diff.pop(var, 0), diff.pop(None, 0)
    if k not in (1, -1) or not isinstance(c, int) or any(diff.values()):
        return None
    return k, c


def _breakpoints(loop: L.Loop) -> set[int]:
    """The values of the loop variable at which some comparison of it changes its result."""
    points = set()
    for n in walk(loop.body):
        if isinstance(n, L.Binary) and n.fn in L.COMPARISONS and n.a.dtype == L.INDEX:
            found = _linear(n, loop.var)
            if found is not None:
                k, c = found
                root = -c * k              # k*v + c == 0 at v = root: lt/ge flip there when k = 1
                if n.fn in ("eq", "ne"):
                    points.update((root, root + 1))
                else:
                    points.add(root + ((k == 1) == (n.fn in ("le", "gt"))))
    return {p for p in points if 0 < p < loop.extent}


def _fold(body: list, var: str, lo: int, hi: int) -> tuple[list, int]:
    """`body` for var in [lo, hi): comparisons and clamps of var decided, selects on
    decided conditions replaced by their branch; and how many selects went."""
    folded = [0]

    def decide(node: L.Binary) -> Optional[bool]:
        found = _linear(node, var)
        if found is None:
            return None
        k, c = found
        low, high = sorted((k * lo + c, k * (hi - 1) + c))       # the range of a - b
        test = _SIGN_TESTS.get(node.fn)
        if test is not None:
            if node.fn in ("eq", "ne") and low != high:
                return (node.fn == "ne") if not low <= 0 <= high else None
            at_low, at_high = test(low), test(high)
            return at_low if at_low == at_high else None
        if low >= 0:
            return node.fn == "maximum"        # a >= b: max is a, min is b
        if high <= 0:
            return node.fn == "minimum"
        return None

    def rule(node):
        if isinstance(node, L.Binary) and node.a.dtype == L.INDEX and \
                node.fn in L.COMPARISONS + ("minimum", "maximum"):
            a, b = go(node.a), go(node.b)       # inner clamps first: min(max(j, 0), n - 1)
            if a is not node.a or b is not node.b:
                node = L.Binary(node.fn, a, b, node.dtype)
            got = decide(node)
            if got is None:
                return node
            if node.fn in L.COMPARISONS:
                return L.Const(got, node.dtype)
            return node.a if got else node.b
        if isinstance(node, L.Binary) and node.fn in ("and", "or"):
            a, b = go(node.a), go(node.b)
            for x, y in ((a, b), (b, a)):
                if isinstance(x, L.Const):
                    keep = bool(x.value) == (node.fn == "and")      # true and y, false or y: y
                    return y if keep else x
            return node if a is node.a and b is node.b else L.Binary(node.fn, a, b, node.dtype)
        if isinstance(node, L.Select):
            cond = go(node.cond)
            if isinstance(cond, L.Const):
                folded[0] += 1
                return go(node.a if cond.value else node.b)
            return None
        return None

    memo: dict = {}

    def go(node):
        return substitute(node, rule, memo)
    return go(body), folded[0]


def _split(loop: L.Loop) -> list:
    points = sorted(_breakpoints(loop))
    if not points or len(points) + 1 > MAX_PIECES:
        return [loop]
    bounds = [0] + points + [loop.extent]
    var = L.Var(loop.var, L.INDEX)
    pieces = []
    for lo, hi in zip(bounds, bounds[1:]):
        body, folded = _fold(loop.body, loop.var, lo, hi)
        if not folded:
            return [loop]
        shifted = I.add(var, lo)
        body = substitute(body, lambda node: shifted if node == var else None)
        pieces.append(L.Loop(loop.var, hi - lo, body, parallel=loop.parallel))
    return pieces
