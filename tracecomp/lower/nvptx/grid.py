"""Launch grids over run-time sizes.

With dynamic dims (tc.trace(..., dynamic=...), tc.export(..., dynamic=...)) a kernel's loop
extents are loop-IR index expressions of size parameters (`size_batch`).  A grid dimension
that depends on them is a `Blocks`: min(ceil(points / per_block), cap) blocks, `points` an
expression the host evaluates at each call (runtime/cuda/runner.py) and the PTX exporter
writes as text over the named sizes (aot/ptx.py).  Kernels stride over what a grid does not
cover, so the cap (and the fallback to it for extents that are not size expressions) only
costs blocks that find nothing to do; it never changes a result.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from ..loops import index as I
from ..loops.ir import SIZE_PREFIX, Binary, Const, Var

_FOLD = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
         "floordiv": lambda a, b: a // b, "minimum": min, "maximum": max}
_TEXT = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//"}


def size_value(e, sizes: dict[str, int]) -> Optional[int]:
    """The value of an extent (int or loop-IR index expression) once the size parameters
    `sizes` ({"size_batch": 7}) are known; None where it reads anything else (a loop var)."""
    if isinstance(e, int):
        return e
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Var):
        return sizes.get(e.name)
    if isinstance(e, Binary) and e.fn in _FOLD:
        a, b = size_value(e.a, sizes), size_value(e.b, sizes)
        return None if a is None or b is None or (e.fn == "floordiv" and b == 0) else _FOLD[e.fn](a, b)
    return None


def is_size_expression(e, known=frozenset()) -> bool:
    """Is `e` made of constants, size parameters and the names in `known` (host loop vars)
    only, so that the host can evaluate it?"""
    if isinstance(e, (int, Const)):
        return True
    if isinstance(e, Var):
        return e.name.startswith(SIZE_PREFIX) or e.name in known
    return isinstance(e, Binary) and e.fn in _FOLD and is_size_expression(e.a, known) \
        and is_size_expression(e.b, known)


def size_text(e) -> str:
    """A size expression as text over the public size names and host loop vars
    (`(8 * batch)`, `min((qb + 1), (seq // 64))`): Python syntax, `//` the floor division."""
    if isinstance(e, int):
        return str(e)
    if isinstance(e, Const):
        return str(e.value)
    if isinstance(e, Var):
        return e.name[len(SIZE_PREFIX):] if e.name.startswith(SIZE_PREFIX) else e.name
    if e.fn in ("minimum", "maximum"):
        return f"{e.fn[:3]}({size_text(e.a)}, {size_text(e.b)})"
    return f"({size_text(e.a)} {_TEXT[e.fn]} {size_text(e.b)})"


@dataclass(frozen=True, repr=False)
class Blocks:
    """A grid dimension of min(ceil(points / per_block), cap) blocks, `points` a size expression."""
    points: object
    per_block: int
    cap: int

    def at(self, sizes: dict[str, int]) -> int:
        points = size_value(self.points, sizes)
        if points is None:
            raise KeyError(f"grid points {size_text(self.points)} need sizes {sorted(sizes)} lack")
        return min(-(-points // self.per_block), self.cap)

    def to_json(self) -> dict:
        return {"points": size_text(self.points), "per_block": self.per_block, "max": self.cap}

    def __repr__(self) -> str:          # (as dumps print a grid tuple)
        return f"min(ceil({size_text(self.points)} / {self.per_block}), {self.cap})"


GridDim = Union[int, Blocks]


@dataclass(frozen=True, repr=False)
class When:
    """A launch that runs only where the size expression `value` is at least `least`
    (`above`), or only where it is below (one of two kernels chosen at run time)."""
    value: object
    least: int
    above: bool

    def holds(self, sizes: dict[str, int]) -> bool:
        return (size_value(self.value, sizes) >= self.least) == self.above

    def otherwise(self) -> "When":
        return When(self.value, self.least, not self.above)

    def to_json(self) -> dict:
        return {"value": size_text(self.value), "at_least" if self.above else "below": self.least}

    def __repr__(self) -> str:
        return f"{size_text(self.value)} {'>=' if self.above else '<'} {self.least}"


def ceil_div(e, k: int):
    """ceil(e / k) as a size expression."""
    return I.floordiv(I.add(I.expr(e), k - 1), k)


def grid_dim(extents: Sequence, per_block: int, cap: int, known=frozenset()) -> GridDim:
    """The blocks for the product of `extents`, `per_block` points each, at most `cap`: an
    int where the extents are static, a Blocks where they are size expressions (of sizes
    and the `known` host loop vars), else `cap`."""
    values = [size_value(e, {}) for e in extents]
    if all(v is not None for v in values):
        return min(-(-math.prod(values) // per_block), cap)
    if not all(is_size_expression(e, known) for e in extents):
        return cap
    points = None
    for e in extents:
        points = I.expr(e) if points is None else I.mul(points, I.expr(e))
    return Blocks(points, per_block, cap)


def grid_at(grid: Sequence[GridDim], sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(g.at(sizes) if isinstance(g, Blocks) else g for g in grid)


def grid_json(grid: Sequence[GridDim]) -> list:
    return [g.to_json() if isinstance(g, Blocks) else g for g in grid]
