"""Building loop-IR expressions with Python operators, so table formulas lower unchanged.

`X` wraps an Expr of a fixed compute dtype; `x + 1`, `exp(x)`, `where(c, a, b)` build
Binary/Unary/Select nodes, lifting Python numbers to constants of the compute dtype.
PRIMITIVES maps ops/scalar.py's primitive names to builders: the lowering's counterpart
of the NumPy ufunc table in ops/numpy_kernels.py.
"""
from __future__ import annotations

from typing import Any

from ...core import dtypes as dt
from ...core.symbolic import Dim
from . import ir as L
from .index import expr as index_expr


class X:
    __slots__ = ("e",)

    def __init__(self, e: L.Expr):
        self.e = e

    @property
    def dtype(self):
        return self.e.dtype

    def _binary(self, fn: str, other, reverse: bool = False) -> "X":
        a = self.e
        if isinstance(other, float) and isinstance(a.dtype, dt.DType) and not a.dtype.is_floating_point \
                and not other.is_integer():
            a = cast(a, dt.FLOAT64)        # `x < 0.5`, `x == inf` on integers: as NumPy computes it
        b = lift(other, a.dtype)
        if reverse:
            a, b = b, a
        a, b = unify(a, b)
        return X(L.Binary(fn, a, b, dt.BOOL if fn in L.COMPARISONS else a.dtype))

    def __add__(self, o): return self._binary("add", o)
    def __radd__(self, o): return self._binary("add", o, True)
    def __sub__(self, o): return self._binary("sub", o)
    def __rsub__(self, o): return self._binary("sub", o, True)
    def __mul__(self, o): return self._binary("mul", o)
    def __rmul__(self, o): return self._binary("mul", o, True)
    def __truediv__(self, o): return self._binary("div", o)
    def __rtruediv__(self, o): return self._binary("div", o, True)
    def __pow__(self, o): return self._binary("pow", o)
    def __rpow__(self, o): return self._binary("pow", o, True)
    def __eq__(self, o): return self._binary("eq", o)       # noqa: E704
    def __ne__(self, o): return self._binary("ne", o)
    def __lt__(self, o): return self._binary("lt", o)
    def __le__(self, o): return self._binary("le", o)
    def __gt__(self, o): return self._binary("gt", o)
    def __ge__(self, o): return self._binary("ge", o)
    def __mod__(self, o): return self._binary("mod", o)
    def __rmod__(self, o): return self._binary("mod", o, True)
    def __floordiv__(self, o): return self._binary("floordiv", o)
    def __rfloordiv__(self, o): return self._binary("floordiv", o, True)
    def __and__(self, o): return self._binary("and", o)
    def __rand__(self, o): return self._binary("and", o, True)
    def __or__(self, o): return self._binary("or", o)
    def __ror__(self, o): return self._binary("or", o, True)
    def __xor__(self, o): return self._binary("xor", o)
    def __rxor__(self, o): return self._binary("xor", o, True)
    def __neg__(self): return X(L.Unary("neg", self.e, self.dtype))

    def __invert__(self):
        """Bitwise not: logical on bools, `x ^ -1` on integers (NumPy's ~)."""
        if self.dtype is dt.BOOL:
            return X(L.Unary("not", self.e, dt.BOOL))
        return self._binary("xor", -1)
    __hash__ = None


def const(value, dtype) -> L.Expr:
    """A constant whose Python value matches its dtype (1 -> 1.0 for floats).  A symbolic
    size (an attribute such as `x / x.shape[0]` with a dynamic dim) is the size parameter
    converted to `dtype`."""
    if isinstance(value, Dim):
        return cast(index_expr(value), dtype)
    if dtype == L.INDEX or (isinstance(dtype, dt.DType) and dtype.is_integer):
        return L.Const(int(value), dtype)
    if dtype is dt.BOOL:
        return L.Const(bool(value), dtype)
    if isinstance(dtype, dt.DType) and dtype.is_half:     # a float32 literal, rounded as a cast rounds
        return L.Cast(L.Const(float(value), dt.FLOAT32), dtype)
    return L.Const(float(value), dtype)


def lift(v: Any, dtype) -> L.Expr:
    """A Python number as a constant of `dtype`; an X as its Expr."""
    if isinstance(v, X):
        return v.e
    if isinstance(v, L.Expr):
        return v
    if dtype is dt.BOOL and not isinstance(v, bool):
        dtype = dt.INT64 if isinstance(v, int) else dt.FLOAT32
    return const(v, dtype)


def cast(e: L.Expr, dtype) -> L.Expr:
    return e if e.dtype == dtype else L.Cast(e, dtype)


def unify(a: L.Expr, b: L.Expr) -> tuple[L.Expr, L.Expr]:
    """Constants adopt the other side's dtype; otherwise both already share the compute dtype."""
    if isinstance(a, L.Const) and not isinstance(b, L.Const):
        return const(a.value, b.dtype), b
    if isinstance(b, L.Const) and not isinstance(a, L.Const):
        return a, const(b.value, a.dtype)
    if a.dtype != b.dtype:
        target = dt.promote_types(a.dtype, b.dtype) if a.dtype != L.INDEX else a.dtype
        return cast(a, target), cast(b, target)
    return a, b


def _unary(fn: str):
    def build(x):
        x = X(lift(x, dt.FLOAT64)) if not isinstance(x, X) else x
        return X(L.Unary(fn, x.e, x.dtype))
    return build


def _binary(fn: str):
    def build(a, b):
        a = a if isinstance(a, X) else X(lift(a, b.dtype if isinstance(b, X) else dt.FLOAT64))
        return a._binary(fn, b)
    return build


def _as_bool(x) -> L.Expr:
    e = x.e if isinstance(x, X) else lift(x, dt.BOOL)
    return e if e.dtype is dt.BOOL else L.Binary("ne", e, L.Const(0, e.dtype), dt.BOOL)


def _logical(fn: str):
    def build(a, b):
        return X(L.Binary(fn, _as_bool(a), _as_bool(b), dt.BOOL))
    return build


def _where(c, a, b):
    ae, be = unify(lift(a, getattr(b, "dtype", dt.FLOAT32)), lift(b, getattr(a, "dtype", dt.FLOAT32)))
    return X(L.Select(_as_bool(c), ae, be, ae.dtype))


def _abs(x):
    """|x|; a bool is its own absolute value (NumPy's abs on bool; the loop IR has none)."""
    if isinstance(x, X) and x.dtype is dt.BOOL:
        return x
    return _unary("abs")(x)


def _pow(a, b):
    """a ** b; on bools (NumPy's power of two bools) that is `a or not b`."""
    if isinstance(a, X) and isinstance(b, X) and a.dtype is dt.BOOL and b.dtype is dt.BOOL:
        return X(L.Binary("or", a.e, L.Unary("not", b.e, dt.BOOL), dt.BOOL))
    return _binary("pow")(a, b)


PRIMITIVES = {name: _unary(name) for name in (
    "exp", "exp2", "expm1", "log", "log2", "log1p", "sin", "cos", "tan", "tanh", "erf", "sqrt",
    "floor", "ceil", "round", "sign")}
PRIMITIVES.update({name: _binary(name) for name in ("maximum", "minimum", "atan2", "fmod")})
PRIMITIVES.update({"abs": _abs, "pow": _pow})
PRIMITIVES.update({"logical_and": _logical("and"), "logical_or": _logical("or"),
                   "logical_xor": _logical("xor"),
                   "logical_not": lambda x: X(L.Unary("not", _as_bool(x), dt.BOOL)),
                   "where": _where,
                   "float64": lambda x: X(cast(x.e, dt.FLOAT64)) if isinstance(x, X) else X(lift(x, dt.FLOAT64))})
