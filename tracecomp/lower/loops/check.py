"""The loop-IR checker: `check_kernel(kernel)` re-verifies a Kernel before any code
generator sees it, the way a type checker re-verifies a jaxpr.

Every Expr carries its dtype; nothing is inferred, every recorded dtype is checked:
- names: loop variables, Let names, accumulators and size parameters are defined before
  use and once among the names visible at that point (no shadowing).  A Loop's or
  Reduce's body is a scope of its own; a Reduce's accumulators are visible in its body
  and updates (as the running values) and after it (as the final values);
- buffers: Loads and Stores name a known buffer and index each of its dims with `index`
  expressions; a Store's value has the buffer's dtype; no Store writes a read-only
  ("input" or "constant") buffer;
- ops: Unary/Binary fns are known and defined for the operand kind (UNARY_KINDS,
  BINARY_KINDS below, which every code generator implements; `index` values only take
  add, sub, mul, floordiv, mod, maximum, minimum and comparisons); Binary operands agree and
  the result has their dtype, bool for comparisons; Unary keeps its operand's dtype;
  Select's condition is bool and both arms have the Select's dtype;
- loops: extents are ints >= 0 or kernel.sizes (a serial Loop's or a Reduce's may use enclosing loop vars and index Lets); a Reduce has one update per accumulator
  and its body holds only Lets and Reduces; no parallel Loop is nested in another;
- Matmul: views, dtypes, aliasing and the epilogue (loops/check_matmul.py), and PackB;
- CheckedIndex: an `index` value and an extent as its size, recording into a 1-D int64
  buffer of role "errors" that nothing else writes, at a slot inside it.
Failures raise IRError naming the kernel, the statement (with the loops around it) and
what is wrong.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable, NoReturn, Union

import numpy as np

from ...core.dtypes import DType
from ...core.errors import IRError
from .ir import (BINARY, COMPARISONS, INDEX, UNARY, Binary, Buffer, Cast, CheckedIndex, Const, GuardedLoad, Kernel, Let, Load, Loop, Matmul, PackB, Reduce, Select, Store, Unary, Var)
from .check_matmul import check_matmul, check_pack_b

ROLES = ("input", "output", "temp", "constant", "errors")
READ_ONLY = ("input", "constant", "errors")      # (CheckedIndex alone writes an "errors" buffer)

# The kind of a dtype: f(loat: f32, f64), i(nteger: i32, i64), x (index), b(ool).
KIND_NAMES = {"f": "float", "i": "integer", "x": "index", "b": "bool"}
_A_KIND = {"f": "a float", "i": "an integer", "x": "an index", "b": "a bool"}

# Which operand kinds each fn is defined for: the contract every code generator implements.
UNARY_KINDS: dict[str, str] = {
    "neg": "fi", "abs": "fi", "sign": "fib", "floor": "fi", "ceil": "fi", "round": "fi",
    **{fn: "f" for fn in ("exp", "exp2", "expm1", "log", "log2", "log1p", "sin", "cos", "tan",
                          "tanh", "erf", "sqrt", "rsqrt")},
    "not": "b", "logical_not": "b",
}
BINARY_KINDS: dict[str, str] = {
    "add": "fixb", "sub": "fix", "mul": "fixb", "div": "fi", "pow": "fi",
    "maximum": "fixb", "minimum": "fixb", "atan2": "f", "floordiv": "fix", "mod": "fix",
    "fmod": "fi", "and": "bi", "or": "bi", "xor": "bi",
    **{fn: "fixb" for fn in COMPARISONS},
}
assert set(UNARY_KINDS) == set(UNARY) and set(BINARY_KINDS) == set(BINARY)

DTypeLike = Union[DType, str]
_INT_RANGE = {DType.int32: 2 ** 31, DType.int64: 2 ** 63, INDEX: 2 ** 63}
_FLOAT_MAX = {DType.float32: 3.4028234663852886e38, DType.float64: 1.7976931348623157e308}


def check_kernel(kernel: Kernel) -> None:
    """Raise IRError at the first broken invariant of `kernel`; return None if it holds."""
    _Checker(kernel).run()


def dtype_kind(dtype: DTypeLike) -> str:
    """'f', 'i', 'x' or 'b' for a float, integer, index or bool dtype; ValueError otherwise."""
    if dtype == INDEX:
        return "x"
    if isinstance(dtype, DType):
        return "b" if dtype is DType.bool else "f" if dtype.is_floating_point else "i"
    raise ValueError(f"not a loop-IR dtype: {dtype!r}")


def dtype_name(dtype: DTypeLike) -> str:
    return dtype.label if isinstance(dtype, DType) else str(dtype)


def describe_expr(e: object, limit: int = 80) -> str:
    """A compact one-line form of an expression for messages: `add(x[i, 0], 1.0)`."""
    text = _expr_text(e)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _expr_text(e: object) -> str:
    if isinstance(e, Const):
        return repr(e.value)
    if isinstance(e, Var):
        return e.name
    if isinstance(e, GuardedLoad):
        return f"{_access_text(e.buffer, e.index)} if {_expr_text(e.guard)}"
    if isinstance(e, Load):
        return _access_text(e.buffer, e.index)
    if isinstance(e, Unary):
        return f"{e.fn}({_expr_text(e.x)})"
    if isinstance(e, Binary):
        return f"{e.fn}({_expr_text(e.a)}, {_expr_text(e.b)})"
    if isinstance(e, Select):
        return f"select({_expr_text(e.cond)}, {_expr_text(e.a)}, {_expr_text(e.b)})"
    if isinstance(e, Cast):
        return f"cast<{dtype_name(e.dtype)}>({_expr_text(e.x)})"
    if isinstance(e, CheckedIndex):
        return f"checked<{e.check}>({_expr_text(e.index)} < {_expr_text(e.size)})"
    return repr(e)


def _count(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else plural or word + 's'}"


def _access_text(buffer: str, index: tuple) -> str:
    return f"{buffer}[{', '.join(map(_expr_text, index))}]"


def describe_stmt(s: object) -> str:
    """A short name for a statement in messages: `Store y[i, j]`, `Loop i in range(8)`."""
    if isinstance(s, Let):
        return f"Let {s.name}"
    if isinstance(s, Store):
        return f"Store {_access_text(s.buffer, s.index)}"
    if isinstance(s, Loop):
        return f"{'parallel ' if s.parallel else ''}Loop {s.var} in range({describe_expr(s.extent)})"
    if isinstance(s, Reduce):
        accs = ", ".join(getattr(a, "name", "?") for a in s.accumulators)
        return f"Reduce {s.var} in range({describe_expr(s.extent)}) -> ({accs})"
    if isinstance(s, Matmul):
        dims = "x".join(str(d) for d in s.extents())
        return f"Matmul {s.out.buffer} = {s.a.buffer} @ {s.b.buffer} ({dims})"
    if isinstance(s, PackB):
        return f"PackB {s.buffer} = packed {s.b.buffer} ({describe_expr(s.k)}x{describe_expr(s.n)})"
    return type(s).__name__


def _fits_float(v: numbers.Real, largest: float) -> bool:
    try:
        f = float(v)
    except OverflowError:
        return False
    return not math.isfinite(f) or abs(f) <= largest


@dataclass
class _Name:
    dtype: DTypeLike
    origin: str          # what defined it, for messages: "Loop i in range(8)"


class _Checker:
    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.path: list[str] = []                     # statements around the current one
        self.scopes: list[dict[str, _Name]] = [{}]
        self.buffers: dict[str, Buffer] = {}
        self.in_parallel: str | None = None           # the enclosing parallel Loop
        self.checked: dict[int, object] = {}          # expressions checked in this statement

    def fail(self, what: str) -> NoReturn:
        where = f" at {' > '.join(self.path)}" if self.path else ""
        raise IRError(f"kernel '{self.kernel.name}'{where}: {what}")

    def run(self) -> None:
        k = self.kernel
        if not isinstance(k.name, str) or not k.name:
            self.fail("the kernel name must be a non-empty string")
        for size in k.sizes:
            if not isinstance(size, str) or not size:
                self.fail(f"size parameter {size!r} is not a name")
            self.define(size, INDEX, "size parameter")
        for b in k.buffers:
            self.check_buffer(b)
        self.block(k.body)

    def check_buffer(self, b: Buffer) -> None:
        if b.name in self.buffers:
            self.fail(f"two buffers are named '{b.name}'")
        if not isinstance(b.dtype, DType):
            self.fail(f"buffer '{b.name}' has dtype {b.dtype!r}; buffers hold a tracecomp DType")
        if b.role not in ROLES:
            self.fail(f"buffer '{b.name}' has role {b.role!r}, expected one of {', '.join(ROLES)}")
        for d in b.shape:
            if not self.is_extent(d):
                self.fail(f"buffer '{b.name}' has dim {d!r} in shape {tuple(b.shape)}, "
                          f"neither an int >= 0 nor a size parameter{self.sizes_hint()}")
        self.buffers[b.name] = b

    def is_extent(self, d: object) -> bool:
        """An int >= 0, a size parameter, or an index expression (add/sub/mul, floordiv by
        a positive constant) of those and of constants (a dynamic dim such as 784*size_batch,
        size_seq - 1; the count of whole 64-blocks in a dynamic length, floordiv(size_seq,
        64)).  An expression's sign is the shape rules' to keep (and the guards': s >= 3
        where a slice ends at 3); it cannot be told here."""
        if isinstance(d, Binary):
            return d.dtype == INDEX and self._size_term(d)
        return self._size_term(d) and not (isinstance(d, Const) and d.value < 0) and not \
            (isinstance(d, int) and d < 0)

    def _size_term(self, d: object) -> bool:
        if isinstance(d, bool):
            return False
        if isinstance(d, Var):
            return d.dtype == INDEX and d.name in self.kernel.sizes
        if isinstance(d, Const):
            return d.dtype == INDEX and isinstance(d.value, int) and not isinstance(d.value, bool)
        if isinstance(d, Binary) and d.fn == "floordiv":
            return d.dtype == INDEX and self._size_term(d.a) and isinstance(d.b, Const) and d.b.value > 0
        if isinstance(d, Binary):
            return d.fn in ("add", "sub", "mul") and d.dtype == INDEX and self._size_term(d.a) and \
                self._size_term(d.b)
        return isinstance(d, int)

    def sizes_hint(self) -> str:
        sizes = self.kernel.sizes
        return f" (sizes: {', '.join(sizes)})" if sizes else " (no sizes declared)"

    # --- names -----------------------------------------------------------------------
    def lookup(self, name: str) -> _Name | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def define(self, name: object, dtype: DTypeLike, origin: str) -> None:
        if not isinstance(name, str) or not name:
            self.fail(f"{origin} defines {name!r}, which is not a name")
        old = self.lookup(name)
        if old is not None:
            self.fail(f"'{name}' is defined twice: by {old.origin} and by {origin}")
        self.scopes[-1][name] = _Name(dtype, origin)

    # --- statements ------------------------------------------------------------------
    def block(self, stmts: list, allowed: tuple[type, ...] = (Let, Store, Loop, Reduce, Matmul, PackB)) -> None:
        outer = self.checked
        for s in stmts:
            self.checked = {}
            rule = _STMT_RULES.get(type(s))
            if rule is None:
                self.fail(f"{describe_expr(s)} ({type(s).__name__}) is not a statement "
                          "(expected Let, Store, Loop, Reduce, Matmul or PackB)")
            self.path.append(describe_stmt(s))
            if not isinstance(s, allowed):
                self.fail("a Reduce body holds only Let and Reduce statements, "
                          f"not {type(s).__name__}")
            rule(self, s)
            self.path.pop()
        self.checked = outer

    def let(self, s: Let) -> None:
        self.expr(s.value)
        self.define(s.name, s.value.dtype, f"Let {s.name}")

    def store(self, s: Store) -> None:
        b = self.access(s.buffer, s.index, "Store")
        if b.role in READ_ONLY:
            self.fail(f"writes buffer '{b.name}', whose role is '{b.role}' (read-only)")
        self.expr(s.value)
        if s.value.dtype != b.dtype:
            self.fail(f"the stored value {describe_expr(s.value)} has dtype "
                      f"{dtype_name(s.value.dtype)}, but buffer '{b.name}' holds "
                      f"{dtype_name(b.dtype)} (Cast the value)")

    def access(self, buffer: str, index: tuple, what: str) -> Buffer:
        """Check a Load's or Store's buffer and indices; return the buffer."""
        b = self.buffers.get(buffer)
        if b is None:
            known = ", ".join(self.buffers) or "none"
            self.fail(f"{what} {_access_text(buffer, index)} names an unknown buffer '{buffer}' "
                      f"(buffers: {known})")
        if len(index) != len(b.shape):
            count = _count(len(index), "index", "indices")
            self.fail(f"{what} {_access_text(buffer, index)} has {count}, but buffer '{buffer}' "
                      f"has {_count(len(b.shape), 'dim')} (shape {tuple(b.shape)})")
        for n, i in enumerate(index):
            self.expr(i)
            if i.dtype != INDEX:
                self.fail(f"index {n} of {what} {_access_text(buffer, index)} has dtype "
                          f"{dtype_name(i.dtype)}, expected index (Cast it to index)")
        return b

    def extent(self, extent: object) -> None:
        if not self.is_extent(extent):
            self.fail(f"extent {describe_expr(extent)} is neither an int >= 0 nor a size parameter"
                      f"{self.sizes_hint()}")

    def loop_extent(self, s: Loop) -> None:
        """A serial Loop's extent may also use the loop vars and index Lets around it, with min
        and max (a triangular nest: the fused attention's causal key blocks, `kb < min(qb + 1, n)`)."""
        if self.is_extent(s.extent):
            return
        if s.parallel or not self.is_bound(s.extent):
            self.extent(s.extent)

    def is_bound(self, d: object) -> bool:
        if self.is_extent(d):
            return True
        if isinstance(d, Var):
            found = self.lookup(d.name)
            return d.dtype == INDEX and (d.name in self.kernel.sizes or found is not None and found.dtype == INDEX)
        if isinstance(d, Binary):
            return d.fn in ("add", "sub", "mul", "minimum", "maximum") and d.dtype == INDEX and \
                self.is_bound(d.a) and self.is_bound(d.b)
        return self.is_extent(d)

    def loop(self, s: Loop) -> None:
        self.loop_extent(s)
        outer = self.in_parallel
        if s.parallel:
            if outer is not None:
                self.fail(f"parallel Loop {s.var} is nested inside {outer}; only one loop of a "
                          "nest may be parallel (make the inner one sequential)")
            self.in_parallel = describe_stmt(s)
        self.scopes.append({})
        self.define(s.var, INDEX, describe_stmt(s))
        self.block(s.body)
        self.scopes.pop()
        self.in_parallel = outer

    def reduce(self, s: Reduce) -> None:
        if not self.is_bound(s.extent):     # (a Reduce is serial: its trip count may be a Let's)
            self.extent(s.extent)
        if len(s.update) != len(s.accumulators):
            self.fail(f"{_count(len(s.accumulators), 'accumulator')} but "
                      f"{_count(len(s.update), 'update')}; give one update per accumulator")
        for a in s.accumulators:
            if not isinstance(a.dtype, DType) and a.dtype != INDEX:
                self.fail(f"accumulator '{a.name}' has dtype {a.dtype!r}, expected a tracecomp "
                          "DType or 'index'")
            self.expr(a.init)
            if a.init.dtype != a.dtype:
                self.fail(f"accumulator '{a.name}' of dtype {dtype_name(a.dtype)} has init "
                          f"{describe_expr(a.init)} of dtype {dtype_name(a.init.dtype)}")
        origin = describe_stmt(s)
        self.scopes.append({})
        self.define(s.var, INDEX, origin)
        for a in s.accumulators:
            self.define(a.name, a.dtype, origin)
        self.block(s.body, allowed=(Let, Reduce))
        for a, u in zip(s.accumulators, s.update):
            self.expr(u)
            if u.dtype != a.dtype:
                self.fail(f"accumulator '{a.name}' of dtype {dtype_name(a.dtype)} has update "
                          f"{describe_expr(u)} of dtype {dtype_name(u.dtype)}")
        self.scopes.pop()
        for a in s.accumulators:
            self.define(a.name, a.dtype, origin)

    # --- expressions -----------------------------------------------------------------
    def expr(self, e: object) -> None:
        if id(e) in self.checked:       # a shared subexpression, met again in this statement
            return
        self.checked[id(e)] = e
        rule = _EXPR_RULES.get(type(e))
        if rule is None:
            self.fail(f"{describe_expr(e)} ({type(e).__name__}) is not an expression (expected "
                      "Const, Var, Load, Unary, Binary, Select, Cast or CheckedIndex)")
        try:
            dtype_kind(e.dtype)
        except ValueError:
            self.fail(f"{describe_expr(e)} has dtype {e.dtype!r}; expected a tracecomp DType "
                      "or 'index'")
        rule(self, e)

    def const(self, e: Const) -> None:
        kind, v = dtype_kind(e.dtype), e.value
        is_bool = isinstance(v, (bool, np.bool_))
        ok = {"b": is_bool,
              "i": isinstance(v, numbers.Integral) and not is_bool,
              "x": isinstance(v, numbers.Integral) and not is_bool,
              "f": isinstance(v, numbers.Real) and not is_bool}[kind]
        if not ok:
            self.fail(f"Const {v!r} is not {_A_KIND[kind]} value, but has dtype "
                      f"{dtype_name(e.dtype)}")
        if kind in "ix" and not -_INT_RANGE[e.dtype] <= int(v) < _INT_RANGE[e.dtype]:
            self.fail(f"Const {v!r} is out of range for {dtype_name(e.dtype)}")
        if kind == "f" and not _fits_float(v, _FLOAT_MAX[e.dtype]):
            self.fail(f"Const {v!r} is out of range for {dtype_name(e.dtype)} (use inf explicitly)")

    def var(self, e: Var) -> None:
        known = self.lookup(e.name)
        if known is None:
            self.fail(f"'{e.name}' is used before it is defined")
        if known.dtype != e.dtype:
            self.fail(f"Var '{e.name}' has dtype {dtype_name(e.dtype)}, but {known.origin} defines "
                      f"it with dtype {dtype_name(known.dtype)}")

    def guarded_load(self, e: GuardedLoad) -> None:
        self.expr(e.guard)
        if e.guard.dtype is not DType.bool:
            self.fail(f"the guard of {describe_expr(e)} has dtype {dtype_name(e.guard.dtype)}, not bool")
        self.load(e)

    def load(self, e: Load) -> None:
        b = self.access(e.buffer, e.index, "Load")
        if e.dtype != b.dtype:
            self.fail(f"Load {describe_expr(e)} has dtype {dtype_name(e.dtype)}, but buffer "
                      f"'{b.name}' holds {dtype_name(b.dtype)}")

    def fn_kind(self, e: Unary | Binary, table: dict[str, str], operand: DTypeLike) -> None:
        what = type(e).__name__
        if e.fn not in table:
            self.fail(f"unknown {what} fn '{e.fn}' in {describe_expr(e)} "
                      f"(known: {', '.join(table)})")
        kind = dtype_kind(operand)
        if kind not in table[e.fn]:
            takes = " or ".join(KIND_NAMES[k] for k in table[e.fn])
            self.fail(f"{what} '{e.fn}' is not defined for {dtype_name(operand)} in "
                      f"{describe_expr(e)} (it takes {takes}; Cast the operand)")

    def unary(self, e: Unary) -> None:
        self.expr(e.x)
        self.fn_kind(e, UNARY_KINDS, e.x.dtype)
        if e.dtype != e.x.dtype:
            self.fail(f"{describe_expr(e)} has dtype {dtype_name(e.dtype)}, but Unary '{e.fn}' "
                      f"keeps its operand's dtype {dtype_name(e.x.dtype)}")

    def binary(self, e: Binary) -> None:
        self.expr(e.a)
        self.expr(e.b)
        if e.a.dtype != e.b.dtype:
            self.fail(f"operand dtypes of {describe_expr(e)} disagree: {dtype_name(e.a.dtype)} vs "
                      f"{dtype_name(e.b.dtype)} (Cast one of them)")
        self.fn_kind(e, BINARY_KINDS, e.a.dtype)
        expected = DType.bool if e.fn in COMPARISONS else e.a.dtype
        if e.dtype != expected:
            self.fail(f"{describe_expr(e)} has dtype {dtype_name(e.dtype)}, expected "
                      f"{dtype_name(expected)}")

    def select(self, e: Select) -> None:
        for x in (e.cond, e.a, e.b):
            self.expr(x)
        if e.cond.dtype != DType.bool:
            self.fail(f"the condition of {describe_expr(e)} has dtype {dtype_name(e.cond.dtype)}, "
                      "expected bool")
        if not e.a.dtype == e.b.dtype == e.dtype:
            self.fail(f"{describe_expr(e)} has dtype {dtype_name(e.dtype)} but its arms have "
                      f"{dtype_name(e.a.dtype)} and {dtype_name(e.b.dtype)}")

    def cast(self, e: Cast) -> None:
        self.expr(e.x)

    def checked_index(self, e: CheckedIndex) -> None:
        self.expr(e.index)
        if e.index.dtype != INDEX or e.dtype != INDEX:
            self.fail(f"{describe_expr(e)} checks a {dtype_name(e.index.dtype)} value as "
                      f"{dtype_name(e.dtype)}; both must be index (Cast the index)")
        self.extent(e.size)
        b = self.buffers.get(e.buffer)
        if b is None or b.role != "errors" or b.dtype is not DType.int64 or len(b.shape) != 1:
            self.fail(f"{describe_expr(e)} records into '{e.buffer}', which is not a 1-D int64 "
                      "buffer of role 'errors' among the kernel's buffers")
        slots = b.shape[0]
        if not isinstance(e.check, int) or e.check < 0 or isinstance(slots, int) and 2 + 2 * e.check >= slots:
            self.fail(f"{describe_expr(e)}: check {e.check!r} has no slot in '{e.buffer}' "
                      f"of shape {tuple(b.shape)}")


_STMT_RULES: dict[type, Callable] = {Let: _Checker.let, Store: _Checker.store,
                                     Loop: _Checker.loop, Reduce: _Checker.reduce,
                                     Matmul: check_matmul, PackB: check_pack_b}
_EXPR_RULES: dict[type, Callable] = {Const: _Checker.const, Var: _Checker.var, Load: _Checker.load,
                                     GuardedLoad: _Checker.guarded_load,
                                     Unary: _Checker.unary, Binary: _Checker.binary,
                                     Select: _Checker.select, Cast: _Checker.cast,
                                     CheckedIndex: _Checker.checked_index}
