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

A dynamic length n (issue 36) is known only at run time, and so are the pass count and the
search lengths: the Lets of `bit_length` count them, and a Reduce may take such a Let as its
trip count.  The dynamic sort keeps the static one's vectorized passes for lengths up to 16x
the example's (_argsort_dynamic); a dynamic searchsorted counts its steps from n.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ...core import dtypes as dt
from ...ir import Op
from ...core.symbolic import hint, is_dynamic, shape_hint
from ..loops import index as I
from ..loops import ir as L
from ..loops.exprs import X, cast
from .nests import fresh_name, loop_nest
from .tiles import parallel_min_work


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


def count_prefix(goes_right, start: X, length: X, steps, last, tag: str) -> tuple[L.Reduce, X]:
    """A binary search: how many of the positions start, start + 1, ..., start + length - 1
    satisfy `goes_right(position)`, a predicate true on a prefix of them.  `steps` (an int,
    or an index X computed at run time) must be at least log2(length + 1); probes are
    clamped into [0, last] (an int or index expression: Selects read both arms)."""
    lo, hi = f"lo{tag}", f"hi{tag}"
    vlo, vhi = X(L.Var(lo, L.INDEX)), X(L.Var(hi, L.INDEX))
    mid = (vlo + vhi) // 2
    probe = X(I.clamp((start + _min(mid, length - 1)).e, 0, last))
    active = vlo < vhi
    right = X(L.Var(f"go{tag}", dt.BOOL))
    body = [L.Let(right.e.name, (active & goes_right(probe)).e)]
    update = [_select(right, mid + 1, vlo).e, _select(active & ~right, mid, vhi).e]
    accs = [L.Accumulator(lo, L.INDEX, I.ic(0)), L.Accumulator(hi, L.INDEX, length.e)]
    return L.Reduce(f"b{tag}", steps.e if isinstance(steps, X) else steps, accs, body, update), vlo


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
        return _argsort_dynamic(sched, x, name, out, d, descending)
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


UNROLLED_PASSES_OVER_HINT = 4     # a length up to 16x the example's sorts in unrolled passes only


def _argsort_dynamic(sched, x, name: str, out, d: int, descending: bool) -> list:
    """The merge sort over a run-time length n, row by row (every index but dim d).  Its
    ceil(log2 n) passes: the first `unrolled` (the example length's count and 4 more, an even
    number) as in the static sort, each with a fixed search length so that its loop over the
    row vectorizes, a pass beyond the count running no iterations; any further ones, for a
    length over 16x the example's, in a loop of pairs with run-time widths and search lengths
    (a pair's second pass, past the count, is a copy: its searches take no steps).  The
    passes write the order into the output and a temp by turns, the example length's last
    pass into the output (the keys into two key temps by turns); a length whose last pass
    writes the temp copies it out."""
    shape = tuple(I.dim(s) for s in out.shape)
    tmp = _temp(sched, dt.INT64, shape)
    keys = [_temp(sched, x.type.dtype, shape) for _ in range(2)]
    n = X(I.expr(out.shape[d]))
    rows = out.shape[:d] + out.shape[d + 1:]
    expected = max(hint(out.shape[d]) - 1, 0).bit_length()
    unrolled = expected + UNROLLED_PASSES_OVER_HINT + (expected + UNROLLED_PASSES_OVER_HINT) % 2
    flip = (expected + 1) % 2           # where the example's last pass writes the output
    buffers = (name, tmp)

    def runs(p: int) -> _Runs:
        return _Runs(buffers[(p - 1 + flip) % 2] if p else None, buffers[(p + flip) % 2],
                     keys[(p - 1) % 2] if p else None, keys[p % 2])

    def row(lead):
        lets, passes = bit_length(X(I.at_least((n - 1).e, 0)), "np")
        body = lets
        for p in range(unrolled):
            body += _unrolled_pass(sched, x, runs(p), lead, d, n, passes, p, descending)
        q = X(L.Var("q", L.INDEX))
        pair = [L.Reduce("qw", q.e, [L.Accumulator("wq", L.INDEX, I.ic(1 << unrolled))], [],
                         [I.mul(L.Var("wq", L.INDEX), 4)])]
        wq = X(L.Var("wq", L.INDEX))
        for k in range(2):
            pair += _dynamic_pass(sched, x, runs(unrolled + k), lead, d, n, wq * (1 + k),
                                  q * 2 + (unrolled + 1 + k), f"t{k}", descending)
        pairs = _select(passes > unrolled, (passes - unrolled + 1) // 2, X(I.ic(0)))
        last = _select(passes > unrolled, X(I.ic(unrolled + 1)), _select(passes > 0, passes - 1, X(I.ic(0))))
        in_tmp = (last + flip) % 2 == X(I.ic(1))
        at = lead[:d] + (L.Var("c", L.INDEX),) + lead[d:]
        return body + [L.Let("npairs", pairs.e), L.Loop("q", L.Var("npairs", L.INDEX), pair),
                       L.Let("ncopy", _select(in_tmp, n, X(I.ic(0))).e),
                       L.Loop("c", L.Var("ncopy", L.INDEX), [L.Store(name, at, L.Load(tmp, at, dt.INT64))])]
    body = loop_nest(rows, row, "r")
    if body and isinstance(body[0], L.Loop):
        body[0].parallel = hint(rows[0]) > 1 and math.prod(shape_hint(out.shape)) >= parallel_min_work()
    return body


def _unrolled_pass(sched, x, runs: _Runs, lead: tuple, d: int, n: X, passes: X, p: int,
                   descending: bool) -> list:
    """Pass p of the dynamic sort with its fixed width and search length: over the row where
    p < passes (pass 0 always: it alone writes a row of one), else no iterations."""
    i = L.Var(f"i{p}", L.INDEX)
    extent = n if p == 0 else _select(passes > p, n, X(I.ic(0)))
    step = _merge_pass(sched, x, runs, d, n, p, descending)
    return [L.Let(f"n{p}", extent.e), L.Loop(i.name, L.Var(f"n{p}", L.INDEX), step(lead[:d] + (i,) + lead[d:]))]


def bit_length(v: X, tag: str) -> tuple[list, X]:
    """Lets computing the bit length of the index value v >= 0 (a binary search needs that
    many steps over v positions): six halvings by constant powers of two."""
    lets, count, rest = [], X(I.ic(0)), v
    for k, shift in enumerate((32, 16, 8, 4, 2, 1)):
        big = rest >= X(I.ic(1 << shift))
        c, r = f"{tag}c{k}", f"{tag}r{k}"
        lets += [L.Let(c, _select(big, count + shift, count).e),
                 L.Let(r, _select(big, rest // (1 << shift), rest).e)]
        count, rest = X(L.Var(c, L.INDEX)), X(L.Var(r, L.INDEX))
    lets.append(L.Let(tag, (count + _select(rest >= X(I.ic(1)), X(I.ic(1)), X(I.ic(0)))).e))
    return lets, X(L.Var(tag, L.INDEX))


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


def _merge_pass(sched, x, runs: _Runs, d: int, n, p: int, descending: bool):
    """One pass merging runs of w = 2**p: the statements at output index `ix` (n: the
    length, an int or a run-time index X)."""
    w = 1 << p

    def step(ix):
        i = X(ix[d])
        base = (i // (2 * w)) * (2 * w)
        return _merge_at(sched, x, runs, ix[:d], ix[d + 1:], i, base, i - base, X(I.ic(w)),
                         n if isinstance(n, X) else X(I.ic(n)), p + 1, str(p), descending)
    return step


def _dynamic_pass(sched, x, runs: _Runs, lead: tuple, d: int, n: X, w: X, steps: X, tag: str,
                  descending: bool) -> list:
    """One pass merging runs of the run-time width w along a row: a loop over blocks of 2w
    and one within the block (no division by w); a search takes `steps` steps where w < n
    and none where the pass is a copy."""
    blocks, block, pos = f"nb{tag}", X(L.Var(f"blk{tag}", L.INDEX)), X(L.Var(f"k{tag}", L.INDEX))
    width = w * 2
    base = block * width
    own = _merge_at(sched, x, runs, lead[:d], lead[d:], base + pos, base, pos, w, n,
                    X(L.Var(f"st{tag}", L.INDEX)), tag, descending)
    inner = L.Loop(pos.e.name, _min(width, n - base).e, own)
    return [L.Let(f"st{tag}", _select(w < n, steps, X(I.ic(0))).e),
            L.Let(blocks, ((n + width - 1) // width).e),
            L.Loop(block.e.name, L.Var(blocks, L.INDEX), [inner])]


def _merge_at(sched, x, runs: _Runs, before_d: tuple, after_d: tuple, i: X, base: X, pos: X, w: X, n: X,
              steps, tag: str, descending: bool) -> list:
    """The statements that move element i (at `pos` in its block of 2w starting at `base`)
    to its place in the merged block: one binary search of the other run."""
    def at(j: X) -> tuple:
        return before_d + (j.e,) + after_d

    def index_at(j: X) -> X:
        return j if runs.src is None else X(cast(L.Load(runs.src, at(j), dt.INT64), L.INDEX))

    def key_at(j: X) -> X:
        if runs.src_keys is None:
            return X(sched.inliner.value_at(x, at(j)))
        return X(L.Load(runs.src_keys, at(j), x.type.dtype))

    key_value = key_at(i)
    key = X(L.Var(f"key{tag}", key_value.dtype))
    left = pos < w
    own = _select(left, pos, pos - w)
    start = _select(left, base + w, base)
    length = _select(left, X(I.clamp((n - base - w).e, 0, w.e)), w)

    def goes_right(j: X) -> X:      # A counts B's strictly-before keys, B counts A's not-after
        other = key_at(j)
        return _select(left, before(other, key, descending), ~before(key, other, descending))
    search, count = count_prefix(goes_right, start, length, steps, I.sub(n.e, 1), tag)
    value = cast(index_at(i).e, dt.INT64)
    place = at(base + own + count)
    stores = [L.Store(runs.dst, place, value)]
    if runs.dst_keys is not None:
        stores.append(L.Store(runs.dst_keys, place, key.e))
    return [L.Let(key.e.name, key_value.e), search, *stores]


def searchsorted(sched, op: Op, args: dict) -> list:
    """For each value, a binary search of its row of the sorted sequence: the number of
    elements before it (`right`: not after it), through `sorter` when given."""
    out, seq, values = op.result.type, args["sorted_sequence"], args["self"]
    name, sorter = sched.names[op.result], args.get("sorter")
    right = bool(args.get("right")) or args.get("side") == "right"
    n = seq.type.shape[-1]
    length = X(I.expr(n))

    def find(ix):
        lead = tuple(ix[:-1]) if seq.type.ndim > 1 else ()

        def element(j: X) -> X:
            if sorter is not None:
                j = X(sched.inliner.indirect(op, seq.type.ndim - 1, sorter, lead + (j.e,), n))
            return X(sched.inliner.value_at(seq, lead + (j.e,)))
        v = X(L.Var("value", values.type.dtype))

        def goes_right(j: X) -> X:
            return ~before(v, element(j), False) if right else before(element(j), v, False)
        if is_dynamic(n):       # the steps counted at run time (Lets the loop does not change)
            steps_lets, steps = bit_length(length, "steps")
            last = I.at_least(I.sub(length.e, 1), 0)
        else:
            steps_lets, steps, last = [], n.bit_length(), max(n - 1, 0)
        search, count = count_prefix(goes_right, X(I.ic(0)), length, steps, last, "")
        return [*steps_lets, L.Let("value", sched.inliner.value_at(values, ix)), search,
                L.Store(name, ix, cast(count.e, out.dtype))]
    return loop_nest(out.shape, find, "q")
