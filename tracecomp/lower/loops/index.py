"""Index arithmetic for views: the input index an output index of a view op reads.

Views never copy: reshape, permute, expand, squeeze/unsqueeze, select, slice and split
become integer expressions on loop indices (loop-IR `index` dtype), which the producer's
expression is then evaluated at.
"""
from __future__ import annotations

from ...core.symbolic import Dim, FloorDiv
from . import ir as L

Index = tuple[L.Expr, ...]


def ic(value) -> L.Expr:
    """An index constant; a symbolic size (symbolic.Dim) becomes its size expression."""
    return expr(value) if isinstance(value, Dim) else L.Const(int(value), L.INDEX)


def size_var(name: str) -> L.Var:
    """The loop-IR name of the dynamic size `name`: a size parameter of the kernels."""
    return L.Var(L.SIZE_PREFIX + name, L.INDEX)


def dim(d):
    """A graph dim in the loop IR: an int stays one; a symbolic size (symbolic.Dim) becomes
    an index expression of size parameters (`784*batch` -> mul(784, size_batch); a
    symbolic.FloorDiv -> floordiv(its polynomial, k), never of a negative number)."""
    if not isinstance(d, Dim):
        return d
    total = None
    for names, coeff in d.terms.items():
        term = None
        for n in names:
            factor = floordiv(expr(n.inner), n.divisor) if isinstance(n, FloorDiv) else size_var(n)
            term = factor if term is None else mul(term, factor)
        term = ic(coeff) if term is None else mul(term, coeff)
        total = term if total is None else add(total, term)
    return total


def symbolic(d):
    """The inverse of `dim`: a loop-IR dim (int, or an expression of size parameters) as an
    int or symbolic.Dim, for arithmetic on strides.  (Hints are not kept: 1.)"""
    if isinstance(d, (int, Dim)):
        return d
    if isinstance(d, L.Const):
        return d.value
    if isinstance(d, L.Var) and d.name.startswith(L.SIZE_PREFIX):
        return Dim.named(d.name[len(L.SIZE_PREFIX):], 1)
    if isinstance(d, L.Binary) and d.fn in ("add", "sub", "mul"):
        a, b = symbolic(d.a), symbolic(d.b)
        return a + b if d.fn == "add" else a - b if d.fn == "sub" else a * b
    if isinstance(d, L.Binary) and d.fn == "floordiv" and isinstance(d.b, L.Const) and d.b.value > 0:
        return symbolic(d.a) // d.b.value
    raise ValueError(f"not a size expression: {d!r}")


def expr(d) -> L.Expr:
    """A dim (int, Dim or loop-IR expression) as an index expression."""
    d = dim(d)
    return ic(d) if isinstance(d, int) else d


_FOLD = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
         "floordiv": lambda x, y: x // y, "mod": lambda x, y: x % y, "minimum": min, "maximum": max}


def _op(fn: str, a: L.Expr, b) -> L.Expr:
    a = ic(a) if isinstance(a, Dim) else a
    b = ic(b) if isinstance(b, (int, Dim)) else b
    if isinstance(a, L.Const) and isinstance(b, L.Const) and (fn not in ("floordiv", "mod") or b.value):
        return ic(_FOLD[fn](a.value, b.value))
    if fn in ("mul", "floordiv") and isinstance(b, L.Const) and b.value == 1:
        return a
    if fn == "mod" and isinstance(b, L.Const) and b.value == 1:
        return ic(0)
    if fn in ("add", "sub") and isinstance(b, L.Const) and b.value == 0:
        return a
    if fn == "add" and isinstance(a, L.Const) and a.value == 0:
        return b
    return L.Binary(fn, a, b, L.INDEX)


def add(a, b): return _op("add", a, b)
def sub(a, b): return _op("sub", a, b)
def mul(a, b): return _op("mul", a, b)
def floordiv(a, b): return _op("floordiv", a, b)
def mod(a, b): return _op("mod", a, b)
def at_least(a, lo): return _op("maximum", a, lo)
def clamp(a, lo: int, hi: int): return _op("minimum", _op("maximum", a, lo), hi)


def broadcast(index: Index, out_shape: tuple[int, ...], in_shape: tuple[int, ...]) -> Index:
    """NumPy broadcasting: trailing dims align; size-1 input dims read element 0 (also where
    the output dim has size 1: the constant index says so to later passes, like row fusion)."""
    lead = len(out_shape) - len(in_shape)
    return tuple(ic(0) if n == 1 else index[lead + j] for j, n in enumerate(in_shape))


def linearize(index: Index, shape: tuple[int, ...]) -> L.Expr:
    flat: L.Expr = ic(0)
    for i, n in zip(index, shape):
        flat = add(mul(flat, n), i)
    return flat


def delinearize(flat: L.Expr, shape: tuple[int, ...]) -> Index:
    out = []
    for j in reversed(range(len(shape))):
        n = shape[j]
        out.append(ic(0) if n == 1 else _op("mod", flat, n) if j else flat)
        flat = _op("floordiv", flat, n) if n != 1 else flat
    return tuple(reversed(out))


def reshape(index: Index, out_shape, in_shape) -> Index:
    """Drop/insert size-1 dims directly; otherwise through the flat index of each run of
    dims whose sizes multiply to the same on both sides (a merge or a split), so the
    division and remainder arithmetic stays inside the dims that change."""
    squeezed_out = [i for i, n in zip(index, out_shape) if n != 1]
    if [n for n in out_shape if n != 1] == [n for n in in_shape if n != 1]:
        it = iter(squeezed_out)
        return tuple(ic(0) if n == 1 else next(it) for n in in_shape)
    if any(isinstance(n, int) and n == 0 for n in out_shape):      # no element is read
        return tuple(ic(0) for _ in in_shape)
    groups = _matching_runs(tuple(out_shape), tuple(in_shape))
    if groups is None:
        lead, tail = _equal_ends(tuple(out_shape), tuple(in_shape))
        if lead or tail:     # symbolic: (s0*s1, n) -> (s0, s1, n) divides the row index only
            mid = slice(lead, len(index) - tail)
            inner = reshape(index[mid], tuple(out_shape)[mid], tuple(in_shape)[lead:len(in_shape) - tail])
            return tuple(index[:lead]) + inner + tuple(index[len(index) - tail:])
        return delinearize(linearize(index, out_shape), tuple(in_shape))
    out: list[L.Expr] = []
    for outs, ins in groups:
        flat = linearize(tuple(index[d] for d in outs), tuple(out_shape[d] for d in outs))
        out.extend(delinearize(flat, tuple(in_shape[d] for d in ins)))
    return tuple(out)


def _equal_ends(a: tuple, b: tuple) -> tuple[int, int]:
    """How many leading and trailing dims a and b share, each side keeping a dim between."""
    lead = 0
    while lead < min(len(a), len(b)) - 1 and _same(a[lead], b[lead]):
        lead += 1
    tail = 0
    while tail < min(len(a), len(b)) - lead - 1 and _same(a[-1 - tail], b[-1 - tail]):
        tail += 1
    return lead, tail


def _same(x, y) -> bool:
    return (x == y) is True


def _matching_runs(a: tuple, b: tuple):
    """Consecutive dims of a and of b paired into runs of equal size, or None (symbolic or
    empty shapes: the flat index is always right)."""
    if not all(isinstance(n, int) and n > 0 for n in a + b):
        return None
    runs, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        ra, rb, pa, pb = [i], [j], a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                ra.append(i)
                pa *= a[i]
                i += 1
            else:
                rb.append(j)
                pb *= b[j]
                j += 1
        runs.append((ra, rb))
    if runs:        # trailing size-1 dims join the last run
        runs[-1] = (runs[-1][0] + list(range(i, len(a))), runs[-1][1] + list(range(j, len(b))))
    return runs


def permute(index: Index, dims: tuple[int, ...]) -> Index:
    out = [None] * len(dims)
    for k, d in enumerate(dims):
        out[d] = index[k]
    return tuple(out)


def flip(index: Index, dims: tuple[int, ...], shape) -> Index:
    """Element i of a flipped dim of size n reads n - 1 - i."""
    return tuple(sub(sub(expr(shape[d]), 1), i) if d in dims else i for d, i in enumerate(index))


def select(index: Index, dim: int, at: int) -> Index:
    return index[:dim] + (ic(at),) + index[dim:]


def offset(index: Index, dim: int, start: int, step: int = 1) -> Index:
    """A strided window along `dim`: element i reads start + i * step."""
    return index[:dim] + (add(mul(index[dim], step), start),) + index[dim + 1:]
