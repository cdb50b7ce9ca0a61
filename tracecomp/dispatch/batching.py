"""The Batched dispatch key: how each op kind of ops.yaml runs on the tensors of tc.vmap.

Inside `tc.vmap(fn)`, fn sees one batch item: a batched tensor has the item's type (shape
and dtype) and holds, in `_batch`, the whole batch (batch dim first) and the level of the
vmap that made it.  Its ops reach this key, which checks them at the item's shapes with the
op's own shape rule (so errors speak of what the user wrote), turns each argument batched
at the innermost level into its whole batch, runs the kind's rule below (one op on whole
batches, never a Python loop over items) and wraps the results back.  Arguments of outer
levels, and unbatched ones, are passed as they are: the op called on the whole batches
dispatches again, so nested vmaps peel one level each, and autograd and tracing see
ordinary ops.  Composite ops never get here: the dispatcher runs their programs.

Each rule gets the arguments with the batched ones as `_Batched` (whole batch, batch dim
0) and returns the op's results with the batch dim first; the kernel checks those against
the item types the shape rule gave, so a rule cannot silently return a wrong shape.
"""
from __future__ import annotations

import itertools
import math
import threading
from typing import Any, Callable

from .dispatcher import DispatchKey, dispatcher, level_of, state, tensor_arguments
from ..core.errors import VmapError
from ..core.types import TensorType
from ..ops import rules
from ..ops.table import OpDef, default_table, per_kind
from ..tensors.results import outputs, package, type_args
from . import api as tc
from ..tensors.tensor import Tensor


# ---------------------------------------------------------------- levels

class _Frame:
    """One active tc.vmap: its level (outer vmaps have lower ones), size and randomness."""
    __slots__ = ("level", "size", "randomness")

    def __init__(self, level: int, size: int, randomness: str):
        self.level, self.size, self.randomness = level, size, randomness


class _Frames(threading.local):
    def __init__(self):
        self.active: list[_Frame] = []


_frames = _Frames()
_levels = itertools.count(1)


def push(size: int, randomness: str) -> _Frame:
    frame = _Frame(next(_levels), size, randomness)
    _frames.active.append(frame)
    state.included.add(DispatchKey.Batched)
    return frame


def pop(frame: _Frame) -> None:
    _frames.active.remove(frame)
    if not _frames.active:
        state.included.discard(DispatchKey.Batched)


def hide_frames() -> list:
    """Make no tc.vmap active (a loop body being traced sees none of those around it);
    returns them for `show_frames`."""
    hidden, _frames.active = _frames.active, []
    return hidden


def show_frames(hidden: list) -> None:
    _frames.active = hidden


def _active(level: int) -> _Frame:
    for f in _frames.active:
        if f.level == level:
            return f
    raise VmapError("a batched tensor of a tc.vmap that has returned was used (did it escape the "
                    "mapped function through a global, a closure or an attribute?)")


def wrap(whole, level: int, batched: bool = True):
    """The tensor tc.vmap's function sees at `level`: one item of `whole` (batch dim first),
    or, with batched=False, `whole` itself lifted to that level (an unbatched value that a
    transform inside the vmap tracks: a parameter tc.grad differentiates per item)."""
    t = Tensor(None, TensorType(tuple(whole.shape[1:] if batched else whole.shape), whole.dtype))
    t._batch = (whole, level, batched)
    return t


def lift(t, level: int):
    """`t` at `level` (a no-op for a tensor of that level): what grad, vjp and jvp do to their
    inputs inside tc.vmap, so that their autograd history and tangents belong to that level
    while the value stays unbatched (tensors of outer levels keep theirs, untouched)."""
    return t if level_of(t) >= level else wrap(t, level, batched=False)


def current_level() -> int:
    """The level of the innermost active tc.vmap (0 outside any)."""
    return _frames.active[-1].level if _frames.active else 0


def detach_level(t):
    """`t` without the autograd history of its own level: a tensor of tc.vmap keeps its whole
    batch (whose history belongs to the levels outside), a plain tensor is detached."""
    return wrap(*t._batch) if t._batch is not None else t.detach()


def take_over_batch(t, updated) -> None:
    """An in-place change of `t` to `updated` (Tensor._take_over): a batched value cannot go
    into an unbatched tensor, as in PyTorch's vmap."""
    if level_of(updated) > level_of(t):
        raise VmapError(
            f"an in-place op would write a batched value into a tensor that is not batched at that "
            f"tc.vmap level (shape {t.shape}): each batch item would need its own copy. Use the "
            "out-of-place op (x = x + y instead of x.add_(y)), or map that tensor too")
    t._batch = updated._batch


def top_level(args: dict) -> int:
    return max(map(level_of, tensor_arguments(args)), default=0)


# ---------------------------------------------------------------- the kernel

class _Batched:
    """A batched argument inside a rule: `t` is the whole batch, batch dim first; `shape`
    and `ndim` are one item's."""
    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t

    @property
    def shape(self) -> tuple:
        return tuple(self.t.shape[1:])

    @property
    def ndim(self) -> int:
        return self.t.ndim - 1

    @property
    def dtype(self):
        return self.t.dtype


Rule = Callable[[OpDef, dict, int, list], Any]
BATCH_RULES: dict[str, Rule] = {}


batch_rule = per_kind(BATCH_RULES)


def batched_kernel(op: OpDef, args: dict[str, Any]):
    level = top_level(args)
    if level == 0:            # nothing batched: only randomness cares that a vmap is active
        if op.kind == "random":
            return _random(op, args)
        return dispatcher.redispatch(op, args, DispatchKey.Batched)
    frame = _active(level)
    inner = _unwrap(args, level)
    if not any(isinstance(v, _Batched) for v in _flat(inner)):    # only lifted tensors at this level
        result = dispatcher.call(op, inner)
        return package(op, [wrap(o, level, batched=False) for o in outputs(result)])
    rule = BATCH_RULES.get(op.kind)
    if rule is None:
        raise VmapError(f"{op.full_name}: tc.vmap has no batching rule for ops of kind '{op.kind}' "
                        f"({op.where})")
    want = rules.infer(op, type_args(args))     # the item's types; errors at the item's shapes
    result = rule(op, inner, frame.size, want)
    outs = outputs(result)
    for out, w in zip(outs, want):
        if tuple(out.shape) != (frame.size,) + tuple(w.shape) or out.dtype != w.dtype:
            raise VmapError(f"{op.full_name}: the batching rule of kind '{op.kind}' returned "
                            f"{out.dtype.label} {tuple(out.shape)}, expected {w.dtype.label} "
                            f"{(frame.size,) + tuple(w.shape)} (a bug in tracecomp/dispatch/batching.py)")
    return package(op, [wrap(o, level) for o in outs])


def _flat(args: dict) -> list:
    return [t for v in args.values() for t in (v if isinstance(v, list) else (v,))]


def _unwrap(args: dict, level: int) -> dict:
    """The arguments of `level` as their whole batch (_Batched) or, lifted, as themselves."""
    def one(v):
        b = getattr(v, "_batch", None)
        if b is None or b[1] != level:
            return v
        return _Batched(b[0]) if b[2] else b[0]
    return {k: [one(t) for t in v] if isinstance(v, list) else one(v) for k, v in args.items()}


def _call(op: OpDef, args: dict, **changes):
    """`op` on whole batches: the arguments with `changes`, batched ones as their batch."""
    new = {**args, **changes}
    new = {k: [_whole_or_self(t) for t in v] if isinstance(v, list) else _whole_or_self(v)
           for k, v in new.items()}
    return dispatcher.call(op, new)


def _whole_or_self(v):
    return v.t if isinstance(v, _Batched) else v


def _op(name: str) -> OpDef:
    return default_table()[name]


def _whole(v, size: int):
    """The batch of `v`: its own if batched, else `v` repeated (a broadcast, no copy when traced)."""
    if isinstance(v, _Batched):
        return v.t
    return tc.unsqueeze(v, 0).expand((size,) + tuple(v.shape))


def _whole_vector(v, size: int):
    """The batch of `v`, a 0-d item as a one-element vector (for the index rules)."""
    whole = _whole(v, size)
    return whole if v.ndim else tc.reshape(whole, (size, 1))


def _lift(v: _Batched, rank: int):
    """The batch of `v` with 1s after the batch dim up to `rank` item dims, so that it
    broadcasts against unbatched tensors of that rank as the item would."""
    extra = rank - v.ndim
    return v.t if extra <= 0 else tc.reshape(v.t, (v.t.shape[0],) + (1,) * extra + v.shape)


def _reshaped(result, size: int, want: list):
    """Results reshaped to the batch of the item types (the rules that flattened items)."""
    shaped = [tc.reshape(o, (size,) + tuple(w.shape)) for o, w in zip(outputs(result), want)]
    return shaped if isinstance(result, (tuple, list)) else shaped[0]


# ---------------------------------------------------------------- rules by kind

@batch_rule("elementwise")
def _elementwise(op, args, size, want):
    names = [a.name for a in op.schema.tensor_arguments if hasattr(args[a.name], "shape")]
    rank = max(args[n].ndim for n in names)
    new = {n: _lift(args[n], rank) for n in names if isinstance(args[n], _Batched)}
    # A 0-d item promotes like a 0-d tensor, its batch would not: compute in the item's dtype.
    compute = rules.elementwise_dtypes(op, _types(args))[0]
    if rules.elementwise_dtypes(op, _types({**args, **new}))[0] != compute:
        for n in names:
            if n in op.promote and args[n].dtype != compute:
                new[n] = _whole_or_self(new.get(n, args[n])).to(compute)
    return _call(op, args, **new)


def _types(args: dict) -> dict:
    """Arguments as TensorTypes: batched ones at their whole-batch shape when given as
    tensors, at the item's as _Batched."""

    def one(v):
        if isinstance(v, _Batched):
            return TensorType(v.shape, v.dtype)
        return v._type if isinstance(v, Tensor) else v
    return {k: one(v) for k, v in args.items()}


def _as_vector(x: _Batched) -> _Batched:
    """A 0-d item as a one-element vector (the rules below then reduce, scan or index dim 0)."""
    return _Batched(tc.reshape(x.t, (x.t.shape[0], 1))) if x.ndim == 0 else x


@batch_rule("reduction", "variance")
def _reduction(op, args, size, want):
    x = args["self"]
    dims = rules.normalize_dims(op, args.get("dim"), x.shape)
    keepdim = bool(args.get("keepdim", False))
    if x.ndim == 0:
        x, dims, keepdim = _as_vector(x), (0,), False
    dims = tuple(d + 1 for d in dims)
    if "dim" not in args:                         # max(x) is amax over every dim
        return _call(_op(op.impl), {"self": x, "dim": dims, "keepdim": False})
    return _call(op, {**args, "self": x}, dim=dims, keepdim=keepdim)


@batch_rule("arg_reduction")
def _arg_reduction(op, args, size, want):
    x = args["self"]
    if args.get("dim") is None:                       # argmax over every element
        flat = _Batched(tc.reshape(x.t, (size, -1)))
        return _reshaped(_call(op, args, self=flat, dim=1, keepdim=False), size, want)
    d = rules.normalize_dim(op, args["dim"], x.shape)
    if x.ndim == 0:
        return _reshaped(_call(op, args, self=_as_vector(x), dim=1, keepdim=False), size, want)
    return _call(op, args, dim=d + 1)


@batch_rule("scan", "sort")
def _along_dim(op, args, size, want):
    x = args["self"]
    d = rules.normalize_dim(op, args["dim"], x.shape)
    if x.ndim == 0:
        return _reshaped(_call(op, args, self=_as_vector(x), dim=1), size, want)
    return _call(op, args, dim=d + 1)


@batch_rule("squeeze")
def _squeeze(op, args, size, want):
    x = args["self"]
    given = args["dim"]
    if given is not None and not isinstance(given, int) and len(given) == 0:
        dims = []                                   # squeeze(x, ()) squeezes nothing
    else:
        dims = [d for d in rules.normalize_dims(op, given, x.shape) if x.shape[d] == 1]
    if not dims:
        return tc.reshape(x.t, tuple(x.t.shape))        # a new tensor, as squeeze gives
    return _call(op, args, dim=tuple(d + 1 for d in dims))


@batch_rule("unsqueeze")
def _unsqueeze(op, args, size, want):
    return _call(op, args, dim=rules.normalize_dim(op, args["dim"], args["self"].ndim, extra=1) + 1)


@batch_rule("select", "slice", "split")
def _dim_shifted(op, args, size, want):
    return _call(op, args, dim=rules.normalize_dim(op, args["dim"], args["self"].shape) + 1)


@batch_rule("flip")
def _flip(op, args, size, want):
    x = args["self"]
    return _call(op, args, dims=tuple(d + 1 for d in rules.flip_dims(op, args["dims"], x.shape)))


@batch_rule("permute")
def _permute(op, args, size, want):
    dims = rules.normalize_dims(op, args["dims"], args["self"].shape, "dims") if args["dims"] else ()
    return _call(op, args, dims=(0,) + tuple(d + 1 for d in dims))


@batch_rule("reshape")
def _reshape(op, args, size, want):
    return _call(op, args, shape=(size,) + tuple(want[0].shape))


@batch_rule("expand")
def _expand(op, args, size, want):
    x = args["self"]
    return _call(op, args, self=_Batched(_lift(x, len(args["size"]))), size=(size,) + tuple(want[0].shape))


@batch_rule("cast", "constant_pad_nd")
def _same(op, args, size, want):
    """Ops on the last dims of one tensor: the batch dim in front is one more leading dim."""
    return _call(op, args)


@batch_rule("matmul")
def _matmul(op, args, size, want):
    a, b = args["self"], args["other"]
    if isinstance(a, _Batched) and not isinstance(b, _Batched) and b.ndim <= 2:
        # the batch dim is more rows of one product (a GEMM), not one product per item
        rows = tc.reshape(a.t, (size * math.prod(a.shape[:-1]), a.shape[-1]))
        return _reshaped(dispatcher.call(op, {"self": rows, "other": b}), size, want)
    # A vector operand is the matrix matmul reads it as: (k,) @ B as (1, k), A @ (k,) as (k, 1).
    pa = tc.unsqueeze(_whole_or_self(a), -2) if a.ndim == 1 else _whole_or_self(a)
    pb = tc.unsqueeze(_whole_or_self(b), -1) if b.ndim == 1 else _whole_or_self(b)
    ra, rb = max(a.ndim, 2), max(b.ndim, 2)
    # Line the batch dim up in front of every broadcast dim of the other operand.
    if isinstance(a, _Batched):
        pa = _lift(_Batched(pa), max(ra, rb))
    if isinstance(b, _Batched):
        pb = _lift(_Batched(pb), max(ra, rb))
    return _reshaped(dispatcher.call(op, {"self": pa, "other": pb}), size, want)


@batch_rule("cat")
def _cat(op, args, size, want):
    ts = args["tensors"]
    kept = rules.cat_kept([t.shape for t in ts])
    d = rules.normalize_dim(op, args["dim"], ts[kept[0]].shape)
    return dispatcher.call(op, {"tensors": [_whole(ts[i], size) for i in kept], "dim": d + 1})


@batch_rule("index_select")
def _index_select(op, args, size, want):
    x, index = args["self"], args["index"]
    d = rules.normalize_dim(op, args["dim"], x.shape)
    if not isinstance(index, _Batched):
        if x.ndim == 0:
            return _reshaped(_call(op, args, self=_as_vector(x), dim=1), size, want)
        return _call(op, args, dim=d + 1)
    # Each item has its own index: gather along dim with the index spread over the other dims.
    whole = _whole_vector(x, size)
    shape = tuple(whole.shape[1:])
    idx = tc.reshape(index.t, (size, -1))
    k = idx.shape[1]
    idx = tc.reshape(idx, (size,) + (1,) * d + (k,) + (1,) * (len(shape) - d - 1))
    idx = idx.expand((size,) + shape[:d] + (k,) + shape[d + 1:])
    return _reshaped(tc.gather(whole, d + 1, idx), size, want)


@batch_rule("gather")
def _gather(op, args, size, want):
    x, index = args["self"], args["index"]
    d = rules.normalize_dim(op, args["dim"], x.shape)
    if x.ndim == 0:
        return _reshaped(dispatcher.call(op, {"self": _whole_vector(x, size), "dim": 1,
                                               "index": tc.reshape(_whole(index, size), (size, -1))}),
                         size, want)
    return dispatcher.call(op, {"self": _whole(x, size), "dim": d + 1, "index": _whole(index, size)})


@batch_rule("scatter")
def _scatter(op, args, size, want):
    x = args["self"]
    d = rules.normalize_dim(op, args["dim"], x.shape)
    parts = {n: _whole(args[n], size) for n in ("self", "index", "src")}
    if x.ndim == 0:
        parts = {n: tc.reshape(t, (size, -1)) for n, t in parts.items()}
    return _reshaped(dispatcher.call(op, {**parts, "dim": d + 1}), size, want)


@batch_rule("index_add")
def _index_add(op, args, size, want):
    x, index, alpha = args["self"], args["index"], args["alpha"]
    d = rules.normalize_dim(op, args["dim"], x.shape)
    whole = _whole_vector(x, size)
    shape = list(whole.shape[1:])
    shape[d] = index.shape[0] if index.ndim else 1      # the source's item shape (a 0-d one as a vector)
    source = tc.reshape(_whole(args["source"], size), (size, *shape))
    if not isinstance(index, _Batched):
        return _reshaped(dispatcher.call(op, {"self": whole, "dim": d + 1, "index": index,
                                              "source": source, "alpha": alpha}), size, want)
    # Each item has its own index: scatter-add the source, the index spread over its other dims.
    idx = tc.reshape(index.t, (size,) + (1,) * d + (-1,) + (1,) * (len(shape) - d - 1))
    idx = idx.expand((size, *shape))
    if alpha != 1:
        source = source * alpha
    return _reshaped(tc.scatter_add(whole, d + 1, idx, source), size, want)


@batch_rule("search")
def _search(op, args, size, want):
    seq, values, sorter = args["sorted_sequence"], args["self"], args.get("sorter")
    if seq.ndim == 1 and not isinstance(seq, _Batched) and not isinstance(sorter, _Batched):
        return _call(op, args)                # one sequence for every value of every item
    seqs = _whole(seq, size)
    sorters = None if sorter is None else _whole(sorter, size)
    if seq.ndim == 1:                         # one sequence per item: the values as a row each
        vals = tc.reshape(_whole(values, size), (size, -1))
    else:
        vals = _whole(values, size)
    return _reshaped(_call(op, args, sorted_sequence=seqs, self=vals, sorter=sorters), size, want)


@batch_rule("select_backward", "slice_backward")
def _backward_of_view(op, args, size, want):
    sizes = tuple(args["input_sizes"])
    d = rules.normalize_dim(op, args["dim"], sizes)
    return _call(op, args, input_sizes=(size,) + sizes, dim=d + 1)


def _leading_merged(op, args, size, want, item_rank: int):
    """im2col/col2im: an item with a leading batch dim of its own shares it with the vmap's."""
    x = args["self"]
    if x.ndim == item_rank:                  # (C, H, W): the vmap's batch is the op's
        return _call(op, args)
    n = x.shape[0]
    merged = tc.reshape(x.t, (size * n,) + x.shape[1:])
    return _reshaped(_call(op, args, self=merged), size, want)


@batch_rule("im2col")
def _im2col(op, args, size, want):
    return _leading_merged(op, args, size, want, 3)


@batch_rule("col2im")
def _col2im(op, args, size, want):
    return _leading_merged(op, args, size, want, 2)


@batch_rule("attention")
def _attention(op, args, size, want):
    """The batch dims of query, key and value gain the vmap's in front; the mask broadcasts
    against the scores as before, the vmap's dim lined up with theirs."""
    tensors = ("query", "key", "value") + (("grad_out", "out", "logsumexp") if op.impl == "backward" else ())
    new = {n: _whole(args[n], size) for n in tensors}
    mask = args.get("attn_mask")
    if isinstance(mask, _Batched):
        new["attn_mask"] = _lift(mask, args["query"].ndim)
    return _call(op, args, **new)


def _random(op: OpDef, args: dict):
    """rand/randn inside tc.vmap, by each active vmap's `randomness`: 'error' refuses (as
    PyTorch's default), 'same' draws one value for all items, 'different' one per item."""
    frames = [f for f in _frames.active if f.randomness != "same"]
    for f in frames:
        if f.randomness == "error":
            raise VmapError(f"{op.full_name}: a random op inside tc.vmap(randomness='error') (the "
                            "default); pass randomness='different' for independent values per batch "
                            "item or 'same' for one draw shared by all")
    if not frames:
        return dispatcher.redispatch(op, args, DispatchKey.Batched)
    sizes = tuple(f.size for f in frames)
    whole = dispatcher.redispatch(op, {**args, "size": sizes + tuple(args["size"])}, DispatchKey.Batched)
    for f in frames:            # outermost first: each level's tensor is an item of the one before
        whole = wrap(whole, f.level)
    return whole
