"""tc.scan, tc.fori_loop, tc.while_loop and tc.cond: JAX's signatures over pytrees of tensors.

Eagerly each is a Python loop or branch over the user's functions, so eager autograd,
tc.vmap and tc.jvp see ordinary ops.  Under tc.trace the functions are traced once into
regions and the trace records one region op (ir/regions.py), whatever the trip count;
primitives.bind then runs it through the dispatch keys (autodiff.py, batching.py).

Choices where JAX and PyTorch differ or are silent:
- Leaves may be tensors, NumPy arrays or Python numbers (made tensors, as tc ops take them).
- A carry must keep its structure, shape and dtype; the error names the leaf's path
  (`carry[1]['h']`), both types and the line of the tc.scan call.
- fori_loop passes the index as a 0-d int64 tensor, eagerly too.  With int bounds it is a
  scan (so it has a reverse-mode gradient); a tensor bound makes it a while_loop.
- cond with a Python bool predicate just calls the chosen function (nothing to record).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..core.errors import ArgumentError, TraceError
from ..core.locations import user_location
from ..core import dtypes as dt
from ..dispatch import api as tc
from ..dispatch.tracer import current
from ..ir import regions as R
from ..tensors import pytree
from ..tensors.tensor import Tensor, as_tensor
from . import autodiff, batching  # noqa: F401  (registers the rules of the other keys)
from .primitives import bind, share_captures, trace_region


class ControlFlowError(TraceError, ArgumentError):
    """A loop or branch whose functions do not fit it (a carry that changes type, ...)."""


def _is_leaf(x) -> bool:
    return isinstance(x, (Tensor, np.ndarray, np.generic, bool, int, float))


def _flatten(tree, what: str) -> tuple[list[Tensor], Any]:
    leaves, structure = pytree.flatten(tree, _is_leaf)
    for path, x in zip(pytree.array_paths(structure, what), leaves):
        if not _is_leaf(x):
            raise ControlFlowError(f"{what}: {path} is a {type(x).__name__}, not a tensor")
    return [as_tensor(x) for x in leaves], structure


def _where() -> str:
    return f" (at {user_location()})"


def _check_same(fn_name: str, what: str, before: list[Tensor], before_s, after: list[Tensor], after_s,
                verbs=("went in as", "came out as"), rule="must keep its") -> None:
    """`after` (a function's result) must have the structure and leaf types of `before`."""
    if pytree.cache_key(before_s) != pytree.cache_key(after_s):
        raise ControlFlowError(f"{fn_name}: {what} {rule} structure: it {verbs[0]} "
                               f"{pytree.unflatten(before_s, ['*'] * len(before))} and {verbs[1]} "
                               f"{pytree.unflatten(after_s, ['*'] * len(after))}{_where()}")
    for path, a, b in zip(pytree.array_paths(before_s, what), before, after):
        if a._type != b._type:
            raise ControlFlowError(f"{fn_name}: {path} {verbs[0]} {a._type} and {verbs[1]} {b._type}; "
                                   f"{what} {rule} shape and dtype{_where()}")


def _pair(out, fn_name: str):
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise ControlFlowError(f"{fn_name}: the function must return a pair (carry, y), got "
                               f"{type(out).__name__}{_where()}")
    return out


# ---------------------------------------------------------------- scan

def scan(f: Callable, init, xs=None, length: int | None = None, reverse: bool = False, unroll: int = 1,
         remat: bool = False):
    """Loop `f(carry, x) -> (carry, y)` over the leading axis of `xs`; returns the last carry
    and the ys stacked on axis 0 (JAX's lax.scan).  `xs=None` needs `length`.  `remat=True`:
    reverse mode keeps only each step's carry and runs the step again in the backward (JAX's
    jax.checkpoint of the body), for long loops whose steps have large intermediates."""
    init_leaves, init_s = _flatten(init, "init")
    x_leaves, x_s = _flatten(xs, "xs")
    length = _scan_length(x_leaves, x_s, length)
    if not isinstance(unroll, int) or isinstance(unroll, bool) or unroll < 1:
        raise ControlFlowError(f"tc.scan: unroll must be an int >= 1, got {unroll!r}{_where()}")
    if current() is None:
        return _scan_eagerly(f, init_leaves, init_s, x_leaves, x_s, length, reverse)
    if unroll > 1 and length >= unroll:
        return _scan_unrolled(f, init_leaves, init_s, x_leaves, x_s, length, reverse, unroll, remat)
    ys_structure = []

    def body(*leaves):
        c = len(init_leaves)
        carry = pytree.unflatten(init_s, list(leaves[:c]))
        x = pytree.unflatten(x_s, list(leaves[c:]))
        new, y = _pair(f(carry, x), "tc.scan")
        new_leaves, new_s = _flatten(new, "carry")
        _check_same("tc.scan", "carry", list(leaves[:c]), init_s, new_leaves, new_s)
        y_leaves, y_s = _flatten(y, "y")
        ys_structure.append(y_s)
        return new_leaves + y_leaves

    region = trace_region(body, [t._type for t in init_leaves] + [R.row_type(t._type) for t in x_leaves], "body")
    attrs = {"length": length, "num_consts": len(region.captured), "num_carry": len(init_leaves),
             "reverse": bool(reverse), "remat": bool(remat)}
    out = bind(R.SCAN, region.captured + init_leaves + x_leaves, attrs, [region.graph])
    c = len(init_leaves)
    return pytree.unflatten(init_s, out[:c]), pytree.unflatten(ys_structure[0], out[c:])


def _scan_unrolled(f, init_leaves, init_s, x_leaves, x_s, length: int, reverse: bool, unroll: int, remat: bool):
    """A traced scan whose body runs `unroll` steps: one scan over the whole chunks of xs
    (its rows reshaped to (chunks, unroll, ...)), then one over the rows left."""
    whole = length // unroll * unroll

    def chunk(carry, rows):
        rows = _flatten(rows, "xs")[0]
        ys = [None] * unroll
        for j in (range(unroll - 1, -1, -1) if reverse else range(unroll)):
            x = pytree.unflatten(x_s, [t[j] for t in rows])
            carry, y = _pair(f(carry, x), "tc.scan")
            ys[j] = _flatten(y, "y")
        structure = ys[0][1]
        return carry, pytree.unflatten(structure, [tc.stack([y[0][i] for y in ys], 0) for i in range(len(ys[0][0]))])

    def part(carry, lo, hi, body, shape):
        if lo == hi:
            return carry, None
        rows = [tc.reshape(t[lo:hi], shape(t)) for t in x_leaves]
        return scan(body, carry, pytree.unflatten(x_s, rows) if rows else None,
                    length=len(range(lo, hi)) // (unroll if body is chunk else 1), reverse=reverse, remat=remat)

    carry = pytree.unflatten(init_s, init_leaves)
    chunks = lambda t: (whole // unroll, unroll, *t.shape[1:])   # noqa: E731
    same = lambda t: (length - whole, *t.shape[1:])               # noqa: E731
    if reverse:        # the rows left are the last ones, so they run first
        carry, tail = part(carry, whole, length, f, same)
        carry, head = part(carry, 0, whole, chunk, chunks)
    else:
        carry, head = part(carry, 0, whole, chunk, chunks)
        carry, tail = part(carry, whole, length, f, same)
    head_leaves, y_s = _flatten(head, "y")
    ys = [tc.reshape(h, (whole, *h.shape[2:])) for h in head_leaves]
    if tail is not None:
        ys = [tc.cat([h, t], 0) for h, t in zip(ys, _flatten(tail, "y")[0])]
    return carry, pytree.unflatten(y_s, ys)


def _scan_length(x_leaves: list[Tensor], x_s, length) -> int:
    paths = pytree.array_paths(x_s, "xs")
    for path, x in zip(paths, x_leaves):
        if x.ndim == 0:
            raise ControlFlowError(f"tc.scan: {path} is a 0-d tensor; scanned inputs need a leading axis{_where()}")
        if length is None:
            length = x.shape[0]
        elif x.shape[0] != length:
            raise ControlFlowError(f"tc.scan: {path} has {x.shape[0]} rows but the scan has length "
                                   f"{length} (every leaf of xs must share its leading size){_where()}")
    if length is None:
        raise ControlFlowError(f"tc.scan: give xs or length{_where()}")
    if not isinstance(length, (int, np.integer)) or isinstance(length, bool) or length < 0:
        raise ControlFlowError(f"tc.scan: length must be an int >= 0, got {length!r}{_where()}")
    return int(length)


def _scan_eagerly(f, init_leaves, init_s, x_leaves, x_s, length: int, reverse: bool):
    carry = pytree.unflatten(init_s, init_leaves)
    steps = range(length - 1, -1, -1) if reverse else range(length)
    ys, y_s = [], None
    for i in steps:
        x = pytree.unflatten(x_s, [t[i] for t in x_leaves])
        new, y = _pair(f(carry, x), "tc.scan")
        new_leaves, new_s = _flatten(new, "carry")
        _check_same("tc.scan", "carry", init_leaves, init_s, new_leaves, new_s)
        carry = pytree.unflatten(init_s, new_leaves)
        y_leaves, y_s = _flatten(y, "y")
        ys.append(y_leaves)
    if length == 0:        # no step ran: one call on zeros gives the ys' structure and types
        rows = pytree.unflatten(x_s, [tc.zeros(t.shape[1:], dtype=t.dtype) for t in x_leaves])
        _, y = _pair(f(carry, rows), "tc.scan")
        y_leaves, y_s = _flatten(y, "y")
        return carry, pytree.unflatten(y_s, [tc.zeros((0, *t.shape), dtype=t.dtype) for t in y_leaves])
    if reverse:
        ys.reverse()
    stacked = [tc.stack([step[j] for step in ys], 0) for j in range(len(ys[0]))]
    return carry, pytree.unflatten(y_s, stacked)


# ---------------------------------------------------------------- fori_loop

def fori_loop(lower, upper, body: Callable, init, *, max_steps: int | None = None):
    """`val = body(i, val)` for i in [lower, upper) (JAX's lax.fori_loop).  Bounds are ints or
    0-d integer tensors; i is a 0-d int64 tensor.  With tensor bounds the loop is a
    while_loop (forward mode only), unless `max_steps` bounds its trip count: then it is a
    scan of max_steps steps, those past `upper` keeping the value, which reverse mode can
    differentiate (the trip count must not exceed max_steps: an error at run time would need
    a check in the loop, so more steps are cut off, as in a scan of that length)."""
    static = all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) for b in (lower, upper))
    if not static:
        for name, b in (("lower", lower), ("upper", upper)):
            t = as_tensor(b) if isinstance(b, (Tensor, np.ndarray, int, np.integer)) else None
            if t is None or t.ndim != 0 or t.dtype not in (dt.INT32, dt.INT64):
                raise ControlFlowError(f"tc.fori_loop: {name} must be an int or a 0-d integer tensor, "
                                       f"got {b!r}{_where()}")
    if current() is None:
        val, lo, hi = init, int(as_tensor(lower).item()), int(as_tensor(upper).item())
        if max_steps is not None and not static:
            hi = min(hi, lo + max_steps)           # as the traced loop: cut at max_steps
        for i in range(lo, hi):
            val = body(tc.tensor(i, dtype=dt.INT64), val)
        return val
    if static:
        def step(carry, _):
            i, val = carry
            return (i + 1, body(i, val)), None
        start = tc.tensor(int(lower), dtype=dt.INT64)
        (_, val), _ = scan(step, (start, init), None, length=max(int(upper) - int(lower), 0))
        return val
    lo, hi = (as_tensor(b).to(dt.INT64) for b in (lower, upper))
    if max_steps is not None:
        if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 0:
            raise ControlFlowError(f"tc.fori_loop: max_steps must be an int >= 0, got {max_steps!r}{_where()}")

        def bounded(carry, _):
            i, val = carry
            new_leaves, new_s = _flatten(body(i, val), "val")
            old, old_s = _flatten(val, "val")
            _check_same("tc.fori_loop", "val", old, old_s, new_leaves, new_s)
            running = i < hi
            return (i + 1, pytree.unflatten(old_s, [tc.where(running, n, o) for n, o in zip(new_leaves, old)])), None
        (_, val), _ = scan(bounded, (lo, init), None, length=max_steps)
        return val
    _, _, val = while_loop(lambda c: c[0] < c[1], lambda c: (c[0] + 1, c[1], body(c[0], c[2])), (lo, hi, init))
    return val


# ---------------------------------------------------------------- while_loop

def while_loop(cond_fun: Callable, body_fun: Callable, init_val):
    """`while cond_fun(val): val = body_fun(val)` (JAX's lax.while_loop); cond_fun returns a
    0-d bool tensor."""
    leaves, s = _flatten(init_val, "init_val")
    if current() is None:
        val = pytree.unflatten(s, leaves)
        while bool(_predicate(cond_fun(val), "tc.while_loop: cond_fun")):
            new_leaves, new_s = _flatten(body_fun(val), "carry")
            _check_same("tc.while_loop", "carry", leaves, s, new_leaves, new_s)
            val = pytree.unflatten(s, new_leaves)
        return val

    def cond_region(*xs):
        return [_predicate(cond_fun(pytree.unflatten(s, list(xs))), "tc.while_loop: cond_fun")]

    def body_region(*xs):
        new_leaves, new_s = _flatten(body_fun(pytree.unflatten(s, list(xs))), "carry")
        _check_same("tc.while_loop", "carry", list(xs), s, new_leaves, new_s)
        return new_leaves

    types = [t._type for t in leaves]
    regions = [trace_region(cond_region, types, "cond"), trace_region(body_region, types, "body")]
    consts = share_captures(regions)
    out = bind(R.WHILE, consts + leaves, {"num_consts": len(consts)}, [r.graph for r in regions])
    return pytree.unflatten(s, out)


def _predicate(p, who: str) -> Tensor:
    p = as_tensor(p)
    if p.ndim != 0 or p.dtype != dt.BOOL:
        raise ControlFlowError(f"{who} must return a 0-d bool tensor, got {p.dtype.label}{list(p.shape)}{_where()}")
    return p


# ---------------------------------------------------------------- cond

_BRANCHES = ("is, from true_fun,", "from false_fun")
_SAME = "of both branches must have the same"

def cond(pred, true_fun: Callable, false_fun: Callable, *operands):
    """`true_fun(*operands)` where the 0-d bool `pred` holds, else `false_fun(*operands)`
    (JAX's lax.cond, torch.cond); both must return the same structure and types."""
    if isinstance(pred, (bool, np.bool_)):
        return true_fun(*operands) if pred else false_fun(*operands)
    pred = as_tensor(pred)
    if pred.ndim != 0 or pred.dtype != dt.BOOL:
        raise ControlFlowError(f"tc.cond: pred must be a 0-d bool tensor, got "
                               f"{pred.dtype.label}{list(pred.shape)}{_where()}")
    leaves, s = _flatten(operands, "operands")
    if current() is None:
        if pred._batch is None:
            return true_fun(*operands) if bool(pred) else false_fun(*operands)
        # a batched predicate (eager tc.vmap): both branches, then a select per item
        a_leaves, a_s = _flatten(true_fun(*operands), "true_fun's result")
        b_leaves, b_s = _flatten(false_fun(*operands), "false_fun's result")
        _check_same("tc.cond", "the result", a_leaves, a_s, b_leaves, b_s, _BRANCHES, _SAME)
        return pytree.unflatten(a_s, [tc.where(pred, a, b) for a, b in zip(a_leaves, b_leaves)])
    out_s = []

    def branch(fn, label):
        def traced(*xs):
            res, res_s = _flatten(fn(*pytree.unflatten(s, list(xs))), label)
            out_s.append((res, res_s))
            return res
        return traced

    types = [t._type for t in leaves]
    regions = [trace_region(branch(true_fun, "true_fun's result"), types, "then"),
               trace_region(branch(false_fun, "false_fun's result"), types, "else")]
    (a, a_s), (b, b_s) = out_s
    _check_same("tc.cond", "the result", a, a_s, b, b_s, _BRANCHES, _SAME)
    consts = share_captures(regions)
    out = bind(R.COND, [pred] + consts + leaves, {}, [r.graph for r in regions])
    return pytree.unflatten(a_s, out)

