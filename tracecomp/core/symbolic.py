"""Symbolic dimensions: sizes known only at run time, such as an exported model's batch.

A `Dim` is a polynomial with integer coefficients in named sizes (`batch`, `784*batch`,
`batch + 1`).  It stands in a TensorType's shape where an int would, so the table's shape
rules, the autograd formulas and the scheduler mostly work on it unchanged:

- `+`, `-`, `*` with ints and Dims give Dims (or an int when the names cancel);
- `==` is structural (`784*batch == batch*784`), and a Dim never equals an int: the
  shape rules then treat it as neither 1 (so it does not broadcast) nor any fixed size;
- `//` and `%` work where the division is exact for every value (`(784*batch) // 784`);
  by a positive int they always do: what is not exact becomes a `FloorDiv` factor
  (`(h + 2) // 2` is `floor(h/2) + 1`, a window count), evaluated wherever sizes are;
- ordering comparisons hold when they hold for every size >= 1 (the sizes a library
  accepts): `batch >= 1` is True, `batch > 8` cannot be decided and raises;
- `int(d)` raises: code that needs a concrete number must not silently take one.

Every error is a DynamicShapeError naming the size, so a program the dynamic size cannot
flow through fails at trace/export time with a message, never with wrong code.  Heuristics
(is this loop big enough for threads?) use `hint(x)`: the example input's size.

An `==` that answers False (`seq == 8`, `seq == other`) is true of the example but not of
every size: inside `recording_guards()` each one the user's code makes (outside the
tracecomp package, whose shape rules compare sizes only to refuse what does not fit) is
kept, and tc.trace runs a program traced with dynamic sizes only at sizes where all of them
still hold (PyTorch's guards), so `if x.shape[1] == 8:` never takes the wrong branch at 8.
An order comparison that holds for some sizes only (`seq > 4`, a shape rule's bounds check)
raises, except inside `answering_at(sizes)`: there it is answered at the call's sizes and
kept as a guard.
Where tracecomp's own code needs a size as a number (an attention kernel's head dim, a
LayerNorm's normalized size against the input's), `recording_fixed_wanted()` collects it,
and tc.trace traces again with that size fixed (specialized), the others still dynamic.
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import math
import operator
import os
import sys
from typing import Union

from .locations import PACKAGE_DIR, user_location
from .errors import ShapeError, add_location


class DynamicShapeError(ShapeError):
    """A dynamic size reached code that needs a concrete number.  Raised while a function
    is being traced, it names the user's line."""

    def __init__(self, message: str):
        super().__init__(message)
        self.reason = message
        where = user_location()     # dynamic sizes exist only while tracing: the user's traced line
        if where is not None:
            add_location(self, str(where))


Monomial = tuple[str, ...]          # sorted names, repeated for powers; () is the constant


class FloorDiv(str):
    """floor(inner / divisor), a factor of a Dim's monomials: a size that is a floor division
    of a polynomial by a positive int (PyTorch's and sympy's FloorDiv).  It is a str, its
    canonical text, so monomials sort, hash and compare by structure as before: `inner`
    has every coefficient in [0, divisor) (Dim.__floordiv__ takes the rest out), so it is
    never negative and grows with every size, and equal text is the same expression."""

    def __new__(cls, inner: "Dim", divisor: int):
        text = f"({inner})" if len(inner.terms) > 1 else str(inner)
        self = super().__new__(cls, f"floor({text}/{divisor})")
        self.inner, self.divisor = inner, divisor
        return self

    def __reduce__(self):
        return FloorDiv, (self.inner, self.divisor)


def _factor(name: str, sizes) -> int:
    """One factor of a monomial at these sizes: a size's value, or its floor division's."""
    if isinstance(name, FloorDiv):
        return evaluate(name.inner, sizes) // name.divisor
    return sizes[name]


class Dim:
    __slots__ = ("terms", "hints")

    def __init__(self, terms: dict[Monomial, int], hints: dict[str, int]):
        self.terms = {m: c for m, c in sorted(terms.items()) if c}
        self.hints = hints

    @staticmethod
    def named(name: str, hint: int) -> "Dim":
        if not name.isidentifier():
            raise DynamicShapeError(f"a dynamic size needs a name that is an identifier, got {name!r}")
        return Dim({(name,): 1}, {name: int(hint)})

    # ------------------------------------------------------------------ arithmetic
    @staticmethod
    def _lift(x) -> "Dim":
        if isinstance(x, Dim):
            return x
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError
        return Dim({(): int(x)}, {})

    def _make(self, terms: dict, other: "Dim") -> Union["Dim", int]:
        d = Dim(terms, {**self.hints, **other.hints})
        if not d.terms:
            return 0
        if list(d.terms) == [()]:
            return d.terms[()]
        return d

    def __add__(self, o):
        try:
            o = Dim._lift(o)
        except TypeError:
            return NotImplemented
        terms = dict(self.terms)
        for m, c in o.terms.items():
            terms[m] = terms.get(m, 0) + c
        return self._make(terms, o)

    __radd__ = __add__

    def __neg__(self):
        return Dim({m: -c for m, c in self.terms.items()}, self.hints)

    def __sub__(self, o):
        try:
            return self + -Dim._lift(o)
        except TypeError:
            return NotImplemented

    def __rsub__(self, o):
        return -self + o

    def __mul__(self, o):
        try:
            o = Dim._lift(o)
        except TypeError:
            return NotImplemented
        terms: dict[Monomial, int] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in o.terms.items():
                m = tuple(sorted(m1 + m2))
                terms[m] = terms.get(m, 0) + c1 * c2
        return self._make(terms, o)

    __rmul__ = __mul__

    def _quotient(self, o) -> Union["Dim", int, None]:
        """self / o when it is a polynomial for every value, else None.  Divisors are ints
        or single terms (`784`, `batch`, `2*batch`): what shape arithmetic divides by; or
        sums (a diagonal's stride n + 1), by long division."""
        o = Dim._lift(o)
        if len(o.terms) != 1:
            return self._long_division(o)
        (dm, dc), = o.terms.items()
        terms = {}
        for m, c in self.terms.items():
            rest = list(m)
            for name in dm:
                if name not in rest:
                    return None
                rest.remove(name)
            if c % dc:
                return None
            terms[tuple(rest)] = c // dc
        return self._make(terms, o)

    def _long_division(self, o: "Dim") -> Union["Dim", int, None]:
        """self / o for a divisor of several terms, where the quotient is a polynomial with
        integer coefficients (`(n*m + m) / (n + 1)` is m), else None: the leading term (in
        graded lexicographic order) of what is left, divided by o's leading term, at each step."""
        if not o.terms:
            return None
        names = sorted({n for m in (*self.terms, *o.terms) for n in m})

        def order(m):
            counts = collections.Counter(m)
            return len(m), tuple(counts[n] for n in names)
        lead = max(o.terms, key=order)
        rest, quotient = dict(self.terms), collections.Counter()
        while rest:
            m = max(rest, key=order)
            left = list(m)
            for name in lead:
                if name not in left:
                    return None
                left.remove(name)
            if rest[m] % o.terms[lead]:
                return None
            term, c = tuple(left), rest[m] // o.terms[lead]
            quotient[term] += c
            for om, oc in o.terms.items():
                product = tuple(sorted(term + om))
                rest[product] = rest.get(product, 0) - c * oc
                if rest[product] == 0:
                    del rest[product]
        return self._make({m: c for m, c in quotient.items() if c}, o)

    def _exactly(self, o, failure: str):
        """self / o (_quotient), or NotImplemented for a non-integer o; raises `failure`
        where the division is not exact for every value."""
        try:
            q = self._quotient(o)
        except TypeError:
            return NotImplemented
        if q is None:
            # a retrace may fix the sizes that make it exact: a dynamic divisor's (a grouped
            # conv's out_channels // groups), else the dividend's
            _want_fixed(o if isinstance(o, Dim) else self, True)
            raise DynamicShapeError(failure)
        return q

    def divided_exactly(self, o) -> Union["Dim", int]:
        """self / o where that is a polynomial for every value (`(784*batch) / 784`), else a
        DynamicShapeError: `//` by an int would give a floor division instead."""
        return self._exactly(o, f"the remainder of the dynamic size {self} divided by {o} depends on its value")

    def __floordiv__(self, o):
        if isinstance(o, int) and not isinstance(o, bool) and o > 0:
            return self._floor(o)
        return self._exactly(o, f"cannot divide the dynamic size {self} by {o} exactly")

    def _floor(self, k: int) -> Union["Dim", int]:
        """floor(self / k): the terms k divides, plus a FloorDiv of what is left (each
        coefficient's remainder in [0, k), the constant's too; their common factor with k
        cancelled), so that equal floor divisions have equal structure."""
        whole, rest = {}, {}
        for m, c in self.terms.items():
            whole[m], rest[m] = divmod(c, k)
        left = Dim(rest, self.hints)
        if not left.terms or list(left.terms) == [()]:
            return self._make(whole, self)
        g = functools.reduce(math.gcd, left.terms.values(), k)
        inner, k = Dim({m: c // g for m, c in left.terms.items()}, self.hints), k // g
        if k == 1:
            return Dim(whole, self.hints) + inner
        if list(inner.terms.items()) == [((m := next(iter(inner.terms))), 1)] and len(m) == 1 \
                and isinstance(m[0], FloorDiv):   # floor(floor(x/a)/b) = floor(x/(ab))
            inner, k = m[0].inner, m[0].divisor * k
        return Dim(whole, self.hints) + Dim({(FloorDiv(inner, k),): 1}, self.hints)

    def __mod__(self, o):
        if isinstance(o, int) and not isinstance(o, bool) and o > 0:
            return self - o * self._floor(o)
        q = self._exactly(o, f"the remainder of the dynamic size {self} divided by {o} depends on its value")
        return q if q is NotImplemented else 0

    def __divmod__(self, o):
        q = self.__floordiv__(o)
        return q if q is NotImplemented else (q, self - q * o)

    def __rdivmod__(self, o):
        return self._reflected(o, divmod)

    def _reflected(self, o, op):
        try:
            return op(Dim._lift(o), self)
        except TypeError:
            return NotImplemented

    def __rfloordiv__(self, o):
        return self._reflected(o, operator.floordiv)

    def __rmod__(self, o):
        return self._reflected(o, operator.mod)

    def __truediv__(self, o):
        raise DynamicShapeError(f"cannot divide the dynamic size {self} by {o} to a float at "
                                "trace time (divide a tensor by it instead)")

    __rtruediv__ = __truediv__

    # ------------------------------------------------------------------ comparisons
    def __eq__(self, o):
        return self._equals(o)

    def __ne__(self, o):
        r = self._equals(o)
        return r if r is NotImplemented else not r

    def _equals(self, o):
        if isinstance(o, Dim):
            same = self.terms == o.terms
        elif isinstance(o, int):
            same = False
        else:
            return NotImplemented
        if not same:
            guards = _guards.get()
            if guards is not None and _users(_caller(sys._getframe(2)).f_code.co_filename):
                # keyed by plain tuples: no Dim.__eq__ while adding
                key = (tuple(self.terms.items()), o if isinstance(o, int) else tuple(o.terms.items()))
                guards.setdefault(key, Guard(self, o, "==", False))
            elif _fixed_wanted.get() is not None:
                _want_fixed(self - o, False)     # a shape rule needs these equal: maybe they are here
        return same

    def __hash__(self):
        return hash(tuple(self.terms.items()))

    def _holds(self, o, op: str) -> bool:
        """Whether `self op o` for every size >= 1, decided from the difference's terms: when
        every non-constant coefficient has one sign, it is monotone in every size and its
        value at all sizes 1 bounds it.  Undecidable comparisons raise."""
        diff = self - o
        if isinstance(diff, int):
            return {"<": diff < 0, "<=": diff <= 0, ">": diff > 0, ">=": diff >= 0}[op]
        varying = [c for m, c in diff.terms.items() if m]
        at_one = evaluate(diff, dict.fromkeys(diff.names(), 1))
        rising, falling = all(c >= 0 for c in varying), all(c <= 0 for c in varying)
        # the difference's range is [at_one, inf) when rising, (-inf, at_one] when falling
        positive = {">": rising and at_one > 0, ">=": rising and at_one >= 0,
                    "<": falling and at_one < 0, "<=": falling and at_one <= 0}
        negated = {">": "<=", ">=": "<", "<": ">=", "<=": ">"}
        if positive[op]:
            return True
        if positive[negated[op]]:
            return False
        guards, now = _guards.get(), _sizes_now.get()
        if guards is not None:
            # asked as d > 0 or d >= 0; its negation is -d >= 0 or -d > 0 (one guard for both)
            d, strict = (diff, op == ">") if op in (">", ">=") else (-diff, op == "<")
            key, negation = ("order", tuple(d.terms.items()), strict), ("order", tuple((-d).terms.items()), not strict)
            if key in guards:            # answered while tracing: the compile's sizes all agree
                return guards[key].answer
            if negation in guards:
                return not guards[negation].answer
            if now is not None and all(n in now for n in diff.names()):
                # tracing for a call whose sizes are known: answered at them, and kept as a
                # guard (PyTorch's: the compile serves only sizes where the answer is the same)
                strict_op = ">" if strict else ">="
                guards[key] = Guard(d, 0, strict_op, _ORDER[strict_op](evaluate(d, now), 0))
                return guards[key].answer
        raise DynamicShapeError(f"cannot decide whether {self} {op} {o} for every value of "
                                f"{', '.join(self.names())}")

    def __lt__(self, o): return self._holds(o, "<")
    def __le__(self, o): return self._holds(o, "<=")
    def __gt__(self, o): return self._holds(o, ">")
    def __ge__(self, o): return self._holds(o, ">=")

    # ------------------------------------------------------------------ no concrete value
    def _concrete(self, *_):
        _want_fixed(self, True)
        raise DynamicShapeError(f"the dynamic size {self} has no value at trace time; this "
                                "operation needs a concrete size")

    __int__ = __index__ = __float__ = _concrete

    def __bool__(self):
        if not self._floors():
            return True                 # sizes are >= 1
        return self._holds(0, ">") or self._holds(0, "<")      # (a remainder may be 0)

    def _floors(self) -> list[FloorDiv]:
        return [n for m in self.terms for n in m if isinstance(n, FloorDiv)]

    # ------------------------------------------------------------------ inspection
    def names(self) -> list[str]:
        """The sizes it depends on (inside floor divisions too)."""
        return sorted({x for m in self.terms for n in m
                       for x in (n.inner.names() if isinstance(n, FloorDiv) else (n,))})

    def hint(self) -> int:
        return evaluate(self, self.hints)

    def __repr__(self) -> str:
        parts = [] if self.terms else ["0"]      # (an int lifted for arithmetic may be 0)
        for m, c in sorted(self.terms.items(), key=lambda t: (-len(t[0]), t[0])):
            body = "*".join(m)
            text = (body if c == 1 and body else f"{c}*{body}" if body else str(c)) if c > 0 else \
                   (f"-{body}" if c == -1 and body else f"{c}*{body}" if body else str(c))
            parts.append(text)
        out = parts[0]
        for p in parts[1:]:
            out += f" - {p[1:]}" if p.startswith("-") else f" + {p}"
        return out

    __str__ = __repr__


_guards: contextvars.ContextVar = contextvars.ContextVar("tracecomp_dim_guards", default=None)
_sizes_now: contextvars.ContextVar = contextvars.ContextVar("tracecomp_dim_sizes", default=None)
_ORDER = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq}


class Guard(collections.namedtuple("Guard", "a b op answer")):
    """`a op b` answered `answer` while tracing: a compile serves only sizes where it still does."""

    def holds(self, sizes: dict[str, int]) -> bool:
        return _ORDER[self.op](evaluate(self.a, sizes), evaluate(self.b, sizes)) == self.answer


@contextlib.contextmanager
def recording_guards():
    """Inside: every `==` between a Dim and an int or another Dim that the user's code made
    and that answered False adds a Guard to the dict this yields, among its values (see the
    module docstring), and so does every order comparison answered under `answering_at`."""
    guards: dict = {}
    token = _guards.set(guards)
    try:
        yield guards
    finally:
        _guards.reset(token)


@contextlib.contextmanager
def answering_at(sizes: dict[str, int]):
    """Inside (while a function is traced, not while its program is scheduled, where a
    heuristic's comparison must not narrow the compile): an order comparison that holds for
    some sizes only (`seq > 4`, a shape rule's bounds check) is answered at this call's
    `sizes` and kept as a Guard by the enclosing `recording_guards`, instead of raising."""
    token = _sizes_now.set(sizes)
    try:
        yield
    finally:
        _sizes_now.reset(token)


_fixed_wanted: contextvars.ContextVar = contextvars.ContextVar("tracecomp_dim_fixed", default=None)


@contextlib.contextmanager
def recording_fixed_wanted():
    """Inside: the list this yields collects the sizes that tracecomp's own code needed as
    numbers (int() of one) or equal to something (a shape rule's `==` that answered False):
    where a trace with dynamic sizes fails, tracing again with `sizes_to_fix` of them fixed
    to this call's values may succeed (PyTorch's specialization), the rest staying dynamic."""
    wanted: list = []
    token = _fixed_wanted.set(wanted)
    try:
        yield wanted
    finally:
        _fixed_wanted.reset(token)


def _want_fixed(expr, whole: bool) -> None:
    wanted = _fixed_wanted.get()
    if wanted is not None:
        wanted.append((expr, whole))


def sizes_to_fix(wanted: list, sizes: dict[str, int]) -> set[str]:
    """The sizes `recording_fixed_wanted` collected, at this call's `sizes`: every size of
    one needed as a number, and of a difference that a shape rule needed to be 0 and that
    is 0 here, those whose value alone makes it 0 (`s3` in `s2*s3 - 1152*s2`), else all."""
    out: set[str] = set()
    for expr, whole in wanted:
        if whole:
            out.update(expr.names())
        elif isinstance(expr, Dim) and evaluate(expr, sizes) == 0:
            names = expr.names()
            out.update([n for n in names if _fix(expr, n, sizes[n]) == 0] or names)
    return out


def _fix(d: Dim, name: str, value: int):
    """`d` with the size `name` replaced by `value` (an int where no size is left)."""
    def factor(n):
        if isinstance(n, FloorDiv):
            return _fix(n.inner, name, value) // n.divisor
        return value if n == name else Dim({(n,): 1}, d.hints)
    out = 0
    for m, c in d.terms.items():
        out = out + c * _prod(factor(n) for n in m)
    return out


def _caller(frame):
    """The frame that compared: past the methods dataclasses generate (`<string>`'s dunders:
    a TensorType's __eq__ compares its shape for the pass that called it)."""
    while frame.f_back is not None and frame.f_code.co_filename == "<string>" and \
            frame.f_code.co_name.startswith("__"):
        frame = frame.f_back
    return frame


@functools.lru_cache(maxsize=1024)
def _users(filename: str) -> bool:
    """Whether code in `filename` is the user's: outside the tracecomp package."""
    return not os.path.abspath(filename).startswith(PACKAGE_DIR + os.sep)


def guards_hold(guards, sizes: dict[str, int]) -> bool:
    """Whether the Guards `recording_guards` kept (its dict's values) still hold at these sizes."""
    return all(g.holds(sizes) for g in guards)


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def provably(compare) -> bool:
    """Whether the comparison of sizes `compare()` holds for every size; False where that
    cannot be decided (for code that then keeps its general path, such as a bounds check)."""
    try:
        return bool(compare())
    except DynamicShapeError:
        return False


def is_dynamic(x) -> bool:
    return isinstance(x, Dim)


def hint(x) -> int:
    """A concrete stand-in for heuristics only: the example size of a dynamic one."""
    return x.hint() if isinstance(x, Dim) else x


def shape_hint(shape) -> tuple[int, ...]:
    return tuple(hint(d) for d in shape)


def size_names(shapes) -> list[str]:
    """The names of the dynamic sizes in `shapes`, in order of first appearance."""
    out: list[str] = []
    for shape in shapes:
        for d in shape:
            if isinstance(d, Dim):
                out.extend(n for n in d.names() if n not in out)
    return out


def evaluate(x, sizes: dict[str, int]) -> int:
    """The value of an int or Dim once the sizes are known."""
    if not isinstance(x, Dim):
        return x
    return sum(c * _prod(_factor(n, sizes) for n in m) for m, c in x.terms.items())
