"""tc.vmap of region ops: the Batched rules of tc.scan, tc.while_loop and tc.cond.

Each rule takes the operands of the innermost vmap level as whole batches and binds the
op once on them (through every key again, as the Batched kernel calls an op on whole
batches: their own gradients and outer vmap levels act there), its regions the vmap of the old ones (so the loop runs once for the
whole batch, never once per item).  Every carry is batched as soon as any operand is (an
unbatched init is broadcast): a carry that one batched value reaches is batched from then
on, and batching all of them costs a broadcast, not a fixpoint search.
- scan: a batched xs is scanned along its second axis (the batch stays first per row);
  the ys come back with the batch first.
- while_loop: the loop runs while any item's predicate holds; an item whose predicate
  is false keeps its carry (a select per step), so every item ends where its own loop would.
- cond: an unbatched predicate keeps the branch; a batched one runs both branches on the
  whole batch and selects per item.
"""
from __future__ import annotations

from ..dispatch import api as tc
from ..dispatch.batching import top_level, wrap
from ..dispatch.dispatcher import DispatchKey
from ..ir import regions as R
from ..transforms.vmap import vmap
from .primitives import bind, eval_graph, rule, share_captures, trace_region

BATCHED = DispatchKey.Batched


def _unwrap(operands: list, level: int) -> tuple[list, list[bool]]:
    """Each operand as its whole batch (batch dim first) and whether it is batched there."""
    wholes, batched = [], []
    for t in operands:
        b = t._batch
        if b is not None and b[1] == level:
            wholes.append(b[0])
            batched.append(bool(b[2]))
        else:
            wholes.append(t)
            batched.append(False)
    return wholes, batched


def _mapped(region, axes: list):
    """The region's function mapped over `axes` (0 or None per block argument)."""
    def fn(*args):
        return list(vmap(lambda *z: eval_graph(region, list(z)), in_axes=tuple(axes))(*args))
    return fn


def _broadcast(t, size: int):
    return tc.broadcast_to(tc.unsqueeze(t, 0), (size, *t.shape))


def _lifted(name, wholes, attrs, regions, level):
    """Only lifted tensors at this level (no batch): run on them, the results lifted too."""
    return [wrap(o, level, batched=False) for o in bind(name, wholes, attrs, regions)]


def _select(pred, a, b):
    """Per item of the batch: a where pred (shape (size,)) holds, else b."""
    return tc.where(tc.reshape(pred, (pred.shape[0],) + (1,) * (a.ndim - 1)), a, b)


def batch_rule(op_name: str):
    """Register `fn(wholes, batched, size, attrs, regions) -> results on whole batches` as the
    op's Batched rule: the operands of the innermost vmap level come as whole batches (and
    whether each is batched), the results go back as that level's batched tensors."""
    def register(fn):
        @rule(op_name, BATCHED)
        def run(name, operands, attrs, regions):
            level = top_level({"operands": operands})
            if level == 0:
                return bind(name, operands, attrs, regions, below=BATCHED)
            wholes, batched = _unwrap(operands, level)
            if not any(batched):
                return _lifted(name, wholes, attrs, regions, level)
            size = next(w.shape[0] for w, b in zip(wholes, batched) if b)
            return [wrap(t, level) for t in fn(wholes, batched, size, attrs, regions)]
        return fn
    return register


@batch_rule(R.SCAN)
def _scan_vmap(wholes, batched, size, attrs, regions):
    k, c = attrs["num_consts"], attrs["num_carry"]
    body, = regions
    ops = list(wholes[:k])
    ops += [w if b else _broadcast(w, size) for w, b in zip(wholes[k:k + c], batched[k:k + c])]
    ops += [tc.movedim(w, 0, 1) if b else w for w, b in zip(wholes[k + c:], batched[k + c:])]
    axes = [0 if b else None for b in batched[:k]] + [0] * c + [0 if b else None for b in batched[k + c:]]
    types = [t._type for t in ops[:k + c]] + [R.row_type(t._type) for t in ops[k + c:]]
    region = trace_region(_mapped(body, axes), types, "body")
    out = bind(R.SCAN, region.captured + ops, dict(attrs, num_consts=len(region.captured) + k),
               [region.graph])
    return out[:c] + [tc.movedim(y, 1, 0) for y in out[c:]]


@batch_rule(R.WHILE)
def _while_vmap(wholes, batched, size, attrs, regions):
    k = attrs["num_consts"]
    cond_region, body = regions
    ops = list(wholes[:k]) + [w if b else _broadcast(w, size) for w, b in zip(wholes[k:], batched[k:])]
    axes = [0 if b else None for b in batched[:k]] + [0] * (len(ops) - k)
    types = [t._type for t in ops]
    mapped_cond, mapped_body = _mapped(cond_region, axes), _mapped(body, axes)

    def any_cond(*a):
        return [tc.any(mapped_cond(*a)[0])]

    def masked_body(*a):
        keep_going = mapped_cond(*a)[0]
        new = mapped_body(*a)
        return [_select(keep_going, n, old) for n, old in zip(new, a[k:])]

    regions2 = [trace_region(any_cond, types, "cond"), trace_region(masked_body, types, "body")]
    captured = share_captures(regions2)
    return bind(R.WHILE, captured + ops, {"num_consts": len(captured) + k}, [r.graph for r in regions2])


@batch_rule(R.COND)
def _cond_vmap(wholes, batched, size, attrs, regions):
    pred, ops = wholes[0], wholes[1:]
    axes = [0 if b else None for b in batched[1:]]
    if batched[0]:             # a predicate per item: both branches, then a select
        mapped = any(a is not None for a in axes)
        a, b = [_mapped(r, axes)(*ops) if mapped else [_broadcast(t, size) for t in eval_graph(r, ops)]
                for r in regions]
        return [_select(pred, x, y) for x, y in zip(a, b)]
    types = [t._type for t in ops]
    branches = [trace_region(_mapped(r, axes), types, label) for r, label in zip(regions, ("then", "else"))]
    captured = share_captures(branches)
    return bind(R.COND, [pred] + captured + ops, {}, [r.graph for r in branches])
