"""Which Reduces a block's threads can share (launch.py plans them as `rows`, reduce.py
combines them, rowcache.py holds their rows in registers): monoid updates, or a search for
the first extreme element (argmax).  Analysis only: nothing here emits code."""
from __future__ import annotations

from typing import Optional

from ..llvm import scalar as S
from ..llvm.emitter import monoid_updates
from ..loops.ir import INDEX, Expr, Let, Reduce, Select, Var
from ..loops.walk import var_names


def cooperative(s: Reduce) -> bool:
    """Can a block's threads share `s`?  Monoid updates llvm/scalar.py has for the dtypes, or a
    first-extreme search (arg_update)."""
    monoids = monoid_updates(s)
    if monoids is None:
        return arg_update(s) is not None
    return all(fn in S.BINARY.get(S.kind(a.dtype), {}) for (fn, _), a in zip(monoids, s.accumulators))


def arg_update(r: Reduce) -> Optional[tuple[str, str, str, Expr]]:
    """(value acc, index acc, term, take) when `r` searches the first extreme element, as
    argmax does: its body is one Let `term`, and with one condition `take` that reads only
    the term and the value accumulator, value = take ? term : value and index = take ? r :
    index.  Then two partial searches merge by feeding the later one into the earlier."""
    if len(r.accumulators) != 2 or len(r.body) != 1 or not isinstance(r.body[0], Let):
        return None
    best, at = r.accumulators
    term = r.body[0].name
    u, v = r.update
    if at.dtype != INDEX or not (isinstance(u, Select) and isinstance(v, Select)) or u.cond != v.cond:
        return None
    if (u.a, u.b) != (Var(term, u.dtype), Var(best.name, best.dtype)) or \
            (v.a, v.b) != (Var(r.var, INDEX), Var(at.name, INDEX)):
        return None
    if not var_names(u.cond) <= {term, best.name}:
        return None
    return best.name, at.name, term, u.cond
