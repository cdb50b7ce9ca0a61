"""How a product's operand reaches memory: in place when its expression at a symbolic
index is a Load at an affine index (a buffer, or views of one), else computed into a temp
by a copy kernel of its own.  Shared by the matmul (schedule/matmul.py) and the implicit
GEMM's input (schedule/implicit_gemm.py)."""
from __future__ import annotations

import math
from typing import Optional

from ...core.errors import BackendError
from ...core.dtypes import FLOAT32
from ...ir import Value
from ...ir.passes.widen_half import CAST
from ..loops import index as I
from ..loops import ir as L
from .nests import fresh_name, loop_nest


def operand_view(sched, v: Value, batch: tuple[int, ...], row: bool, col: bool) -> L.View:
    """The View of `v` over (batch..., rows, cols); `row`/`col` say whether v has that dim."""
    buffer, offset, strides = in_memory(sched, v)
    shape = v.type.shape
    own = list(strides)
    mat = [own.pop() if col else 0]
    mat.insert(0, own.pop() if row else 0)
    lead = len(batch) - len(own)
    batch_strides = [0 if d < lead or shape[d - lead] == 1 else own[d - lead] for d in range(len(batch))]
    return L.View(buffer, I.expr(offset), tuple(I.expr(st) for st in batch_strides + mat))


def half_source(sched, v: Value) -> Value:
    """The bfloat16/float16 tensor that float32 operand `v` is a cast of (widen_half's
    `to(x, float32)`), else `v`.  The packed kernel converts x in its packing
    (llvm/gemm/halfpack.py): x is read in place, or (computed: relu(x)) its copy kernel
    writes it in its half dtype, never a float32 copy."""
    if v in sched.names or v.op is None or v.op.name != CAST or v.type.dtype is not FLOAT32:
        return v
    x = v.op.operands[0]
    return x if x.type.dtype.is_half else v


def strided(sched, v: Value) -> Optional[tuple[str, int, tuple[int, ...]]]:
    """(buffer, offset, strides) when `v` reads a buffer at an affine index, else None.
    A reshape of a dense value is dense too (its index arithmetic is not affine, its
    addresses are: conv2d's weight (O, C, kh, kw) read as (O, C*kh*kw))."""
    kind = getattr(sched.table.get(v.op.name), "kind", None) if v.op is not None and v not in sched.names else None
    if kind in ("reshape", "squeeze", "unsqueeze", "permute"):
        source = v.op.operands[0]
        inner = strided(sched, source) if source in sched.names or source.op is not None else None
        if inner is not None and kind == "permute":
            # the transpose of a reshape (a scan's stacked rows read as one matrix, transposed
            # for a weight gradient): its address stays affine although its index is not
            return inner[0], inner[1], tuple(inner[2][d % source.type.ndim] for d in v.op.attrs["dims"])
        if inner is not None and _dense(inner[2], source.type.shape):
            return inner[0], inner[1], dense_strides(v.type.shape)
    syms = tuple(L.Var(f"s{d}", L.INDEX) for d in range(v.type.ndim))
    try:
        e = sched.inliner.value_at(v, syms)
    except BackendError:       # no inline form: the caller materializes it
        return None
    if not isinstance(e, L.Load) or e.dtype != v.type.dtype:
        return None
    shape = [I.symbolic(d) for d in sched.buffers[e.buffer].shape]
    dense = [math.prod(shape[c + 1:]) for c in range(len(shape))]
    offset, strides = 0, [0] * len(syms)
    for c, index in enumerate(e.index):
        terms = affine(index)
        if terms is None:
            return None
        for name, coef in terms.items():
            if name is None:
                offset += coef * dense[c]
            else:
                strides[int(name[1:])] += coef * dense[c]
    return e.buffer, offset, tuple(strides)


def dense_strides(shape) -> tuple:
    """Row-major strides of `shape`, in elements (symbolic for dynamic dims)."""
    return tuple(math.prod(I.symbolic(d) for d in shape[c + 1:]) for c in range(len(shape)))


def _dense(strides, shape) -> bool:
    """Row-major with no gaps (a size-1 dim's stride does not matter)."""
    return all(n == 1 or st == want for st, want, n in zip(strides, dense_strides(shape), shape))


def affine(e: L.Expr) -> Optional[dict]:
    """{var name: coefficient, None: constant} for an affine index expression, else None.
    Sizes of dynamic dims are constants here: coefficients may be symbolic.Dim values."""
    if isinstance(e, L.Const):
        return {None: e.value}
    if isinstance(e, L.Var) and e.name.startswith(L.SIZE_PREFIX):
        return {None: I.symbolic(e)}
    if isinstance(e, L.Var):
        return {e.name: 1}
    if isinstance(e, L.Binary) and e.fn in ("add", "sub", "mul"):
        a, b = affine(e.a), affine(e.b)
        if a is None or b is None:
            return None
        if e.fn == "mul":
            if set(b) == {None}:
                return {name: c * b[None] for name, c in a.items()}
            if set(a) == {None}:
                return {name: c * a[None] for name, c in b.items()}
            return None
        sign = 1 if e.fn == "add" else -1
        out = dict(a)
        for name, c in b.items():
            out[name] = out.get(name, 0) + sign * c
        return out
    return None


def materialize(sched, v: Value) -> None:
    """Compute `v` into a new temp buffer with a copy kernel emitted now."""
    index = tuple(L.Var(f"m{d}", L.INDEX) for d in range(v.type.ndim))
    value = sched.inliner.value_at(v, index)
    name = fresh_name(sched.buffers, "t")
    sched.buffers[name] = L.Buffer(name, v.type.dtype, tuple(I.dim(d) for d in v.type.shape), "temp")
    sched.names[v] = name
    body = loop_nest(v.type.shape, lambda ix: [L.Store(name, ix, value)], prefix="m")
    sched.add_kernel(sched.inlined_ops([v.op]) if v.op is not None else [], body)


def in_memory(sched, v: Value) -> tuple:
    """(buffer, offset, strides) of `v`, computed into a temp first when it is not a view of
    a buffer."""
    found = strided(sched, v) if v in sched.names or v.op is not None else None
    if found is None:
        materialize(sched, _reshaped_source(sched, v))
        found = strided(sched, v)
    return found


def _reshaped_source(sched, v: Value) -> Value:
    """What to compute into memory for `v`: the source of a reshape that is inlined (a
    layer norm's rows flattened for a product) in its own shape, so the kernel keeps the
    source's loops (a row kernel absorbs its reductions); the reshape reads it in place.
    Likewise under permutes on top of those (a weight gradient's transposed operand): the
    product reads the source transposed in place, where a copy kernel of the permuted
    value would read every input across its rows (and recompute a value that the other
    product of the same gradient computes again)."""
    views = ("permute", "reshape", "squeeze", "unsqueeze")
    while v not in sched.names and v.op is not None and \
            getattr(sched.table.get(v.op.name), "kind", None) in views and \
            v.op.operands[0] not in sched.names and v.op.operands[0].op is not None:
        if sched.table[v.op.name].kind != "permute":
            views = views[1:]       # a reshape of a transposed value is not a view of it
        v = v.op.operands[0]
    return v
