"""Sorting and searching in the loop IR: argsort (a stable merge sort) and searchsorted.

Neither needs control flow the loop IR lacks. A merge of two sorted runs A and B puts A[k]
at k + (the number of B elements that sort before it) and B[k] at k + (the number of A
elements that do not sort after it); both counts are binary searches of fixed length. So
argsort is ceil(log2 n) passes of a bottom-up merge sort (runs of 1, 2, 4, ...), each a
fully parallel loop in which every element finds its place in the next pass by one binary
search and scatters its index there: n log2(n)^2 / 2 comparisons, no branches. The indices
ping-pong between the output and one temp buffer, and the keys travel with them between
two more (all but the last pass store both), so a probe of the search is one load of a
key, not a load of an index and then of the key it names (W9: 548 -> 432 ms). Ties keep
their order (stable, as PyTorch's CPU sort), and NaN sorts as the largest value: last
ascending, first descending.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ...core import dtypes as dt
from ...ir import Op
from ...core.symbolic import DynamicShapeError, is_dynamic
from ..loops import index as I
from ..loops import ir as L
from ..loops.exprs import X, cast
from .nests import fresh_name, loop_nest


def _select(c: X, a: X, b: X) -> X:
    return X(L.Select(c.e, a.e, b.e, a.dtype))


def _isnan(v: X) -> X:
    return v != v


def before(a: X, b: X, descending: bool) -> X:
    """Whether key `a` sorts strictly before key `b` (NaN is the largest value)."""
    if not (isinstance(a.dtype, dt.DType) and a.dtype.is_floating_point):
        return a > b if descending else a < b
    if descending:
        return (a > b) | (_isnan(a) & ~_isnan(b))
    return (a < b) | (_isnan(b) & ~_isnan(a))


def count_prefix(goes_right, start: X, length: X, steps: int, last: int, tag: str) -> tuple[L.Reduce, X]:
    """A binary search: how many of the positions start, start + 1, ..., start + length - 1
    satisfy `goes_right(position)`, a predicate true on a prefix of them.  `steps` must be
    at least log2(length + 1); probes are clamped into [0, last] (Selects read both arms)."""
    lo, hi = f"lo{tag}", f"hi{tag}"
    vlo, vhi = X(L.Var(lo, L.INDEX)), X(L.Var(hi, L.INDEX))
    mid = (vlo + vhi) // 2
    probe = X(I.clamp((start + _min(mid, length - 1)).e, 0, last))
    active = vlo < vhi
    right = X(L.Var(f"go{tag}", dt.BOOL))
    body = [L.Let(right.e.name, (active & goes_right(probe)).e)]
    update = [_select(right, mid + 1, vlo).e, _select(active & ~right, mid, vhi).e]
    accs = [L.Accumulator(lo, L.INDEX, I.ic(0)), L.Accumulator(hi, L.INDEX, length.e)]
    return L.Reduce(f"b{tag}", steps, accs, body, update), vlo


def _min(a: X, b: X) -> X:
    return X(L.Binary("minimum", a.e, b.e, L.INDEX))


def argsort(sched, op: Op, args: dict) -> list:
    """Stable argsort of `self` along `dim` (see the module docstring)."""
    out, x = op.result.type, args["self"]
    name, descending = sched.names[op.result], bool(args.get("descending"))
    if out.ndim == 0:
        return [L.Store(name, (), L.Const(0, dt.INT64))]
    d = args["dim"] % out.ndim
    n = out.shape[d]
    if is_dynamic(n):
        raise DynamicShapeError(f"cannot sort along dim {d} of dynamic size {n}")
    passes = (n - 1).bit_length() if n > 1 else 0
    if passes == 0:
        return loop_nest(out.shape, lambda ix: [L.Store(name, ix, L.Const(0, dt.INT64))], "s")
    shape = tuple(I.dim(s) for s in out.shape)
    tmp = _temp(sched, dt.INT64, shape)
    keys = [_temp(sched, x.type.dtype, shape) for _ in range(min(passes - 1, 2))]
    body: list = []
    for p in range(passes):
        dst = name if (passes - 1 - p) % 2 == 0 else tmp
        src = tmp if dst == name else name
        runs = _Runs(src if p else None, dst, keys[(p - 1) % 2] if p else None,
                     keys[p % 2] if p < passes - 1 else None)
        body += loop_nest(out.shape, _merge_pass(sched, x, runs, d, n, p, descending), f"s{p}_")
    return body


def _temp(sched, dtype, shape) -> str:
    name = fresh_name(sched.buffers, "w")
    sched.buffers[name] = L.Buffer(name, dtype, shape, "temp")
    return name


@dataclasses.dataclass(frozen=True)
class _Runs:
    """The buffers of one merge pass: the order so far and its keys (None in the first pass:
    the identity, keys read from the input), and where the merged order and keys go (no
    keys out of the last pass)."""
    src: Optional[str]
    dst: str
    src_keys: Optional[str]
    dst_keys: Optional[str]


def _merge_pass(sched, x, runs: _Runs, d: int, n: int, p: int, descending: bool):
    """One pass merging runs of w = 2**p: the statements at output index `ix`."""
    w = 1 << p

    def step(ix):
        def at(j: X) -> tuple:
            return ix[:d] + (j.e,) + ix[d + 1:]

        def index_at(j: X) -> X:
            return j if runs.src is None else X(cast(L.Load(runs.src, at(j), dt.INT64), L.INDEX))

        def key_at(j: X) -> X:
            if runs.src_keys is None:
                return X(sched.inliner.value_at(x, at(j)))
            return X(L.Load(runs.src_keys, at(j), x.type.dtype))

        i = X(ix[d])
        key_value = key_at(i)
        key = X(L.Var(f"key{p}", key_value.dtype))
        base = (i // (2 * w)) * (2 * w)
        left = (i - base) < w
        own = _select(left, i - base, i - base - w)
        start = _select(left, base + w, base)
        length = _select(left, X(I.clamp((X(I.ic(n)) - base - w).e, 0, w)), X(I.ic(w)))

        def goes_right(j: X) -> X:      # A counts B's strictly-before keys, B counts A's not-after
            other = key_at(j)
            return _select(left, before(other, key, descending), ~before(key, other, descending))
        search, count = count_prefix(goes_right, start, length, p + 1, n - 1, str(p))
        value = cast(index_at(i).e, dt.INT64)
        place = at(base + own + count)
        stores = [L.Store(runs.dst, place, value)]
        if runs.dst_keys is not None:
            stores.append(L.Store(runs.dst_keys, place, key.e))
        return [L.Let(key.e.name, key_value.e), search, *stores]
    return step


def searchsorted(sched, op: Op, args: dict) -> list:
    """For each value, a binary search of its row of the sorted sequence: the number of
    elements before it (`right`: not after it), through `sorter` when given."""
    out, seq, values = op.result.type, args["sorted_sequence"], args["self"]
    name, sorter = sched.names[op.result], args.get("sorter")
    right = bool(args.get("right")) or args.get("side") == "right"
    n = seq.type.shape[-1]
    if is_dynamic(n):
        raise DynamicShapeError(f"cannot search a sorted sequence of dynamic length {n}")

    def find(ix):
        lead = tuple(ix[:-1]) if seq.type.ndim > 1 else ()

        def element(j: X) -> X:
            if sorter is not None:
                j = X(sched.inliner.indirect(op, seq.type.ndim - 1, sorter, lead + (j.e,), n))
            return X(sched.inliner.value_at(seq, lead + (j.e,)))
        v = X(L.Var("value", values.type.dtype))

        def goes_right(j: X) -> X:
            return ~before(v, element(j), False) if right else before(element(j), v, False)
        search, count = count_prefix(goes_right, X(I.ic(0)), X(I.ic(n)), n.bit_length(), max(n - 1, 0), "")
        return [L.Let("value", sched.inliner.value_at(values, ix)), search,
                L.Store(name, ix, cast(count.e, out.dtype))]
    return loop_nest(out.shape, find, "q")
