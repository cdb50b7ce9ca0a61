"""A Matmul statement as plain loop IR: its meaning, and the simple lowering of it.

`expand_matmul(s, order)` rewrites a Matmul into Loops, Lets, Reduces and Stores over
*flat aliases* of its three buffers: `flat_name(buf)` is a 1-D view of buffer `buf`'s
elements in row-major order, which each consumer binds to its own representation of
the buffer (a reshaped NumPy view in loops/interp.py, a `memref.reinterpret_cast` in
loops/printer.py, the same pointer in the LLVM code generator).  Views become affine index
expressions on those aliases.  Two loop orders:
- "ikj": per output row, zero it (unless accumulating), then for each p add
  a[i, p] * b[p, :] to the row; the inner j loop walks rows of b and out, which the loop
  vectorizer turns into vector FMAs when those are contiguous.  The epilogue is a last
  pass over the row;
- "ijk": per output element, a Reduce over p (a dot product; floating sums of a Reduce
  are vectorized as reassociable sums), then the epilogue and the store.  Best when n == 1.
The outermost loop is parallel when `parallel` (distinct iterations write distinct output
elements, because the checker demands a one-to-one `out` view).
"""
from __future__ import annotations

from typing import Union

from . import index as I
from . import ir as L


def flat_name(buffer: str) -> str:
    return f"{buffer}.flat"


def index_names(s: L.Matmul) -> tuple[str, ...]:
    """The names of (batch..., i, j): the statement's own, or derived from `acc`."""
    if s.index:
        return s.index
    return tuple(f"{s.acc}.b{d}" for d in range(len(s.batch))) + (f"{s.acc}.i", f"{s.acc}.j")


def dtype_of(s: L.Matmul, kernel: L.Kernel) -> object:
    return kernel.buffer(s.out.buffer).dtype


def flat_index(view: L.View, index: tuple[L.Expr, ...]) -> L.Expr:
    """offset + sum(index[d] * strides[d]), without zero terms and unit factors."""
    terms = [] if _is(view.offset, 0) else [view.offset]
    for i, stride in zip(index, view.strides):
        if not _is(stride, 0):
            terms.append(i if _is(stride, 1) else I.mul(i, stride))
    total = terms[0] if terms else I.ic(0)
    for term in terms[1:]:
        total = I.add(total, term)
    return total


def _widened(load: L.Load, dtype) -> L.Expr:
    """A half operand's element cast (exactly) to the product's dtype."""
    return load if load.dtype == dtype else L.Cast(load, dtype)


def _is(e: L.Expr, value: int) -> bool:
    return isinstance(e, L.Const) and e.value == value


def operand_dtypes(kernel: L.Kernel, s: L.Matmul) -> tuple:
    """(a's dtype, b's dtype): out's, or a half dtype read widened (loops/check_matmul.py)."""
    return kernel.buffer(s.a.buffer).dtype, kernel.buffer(s.b.buffer).dtype


def expand_matmul(s: L.Matmul, dtype, order: str = "ikj", parallel: bool = True,
                  operand_dtypes: tuple = (None, None)) -> list:
    """The loop nest computing `s` (see the module docstring); dtype is out's, and a's and
    b's unless `operand_dtypes` names theirs (half operands: their loads cast to float32)."""
    a_dtype, b_dtype = (d or dtype for d in operand_dtypes)
    names = index_names(s)
    batch = [L.Var(n, L.INDEX) for n in names[:-2]]
    i, j, p = L.Var(names[-2], L.INDEX), L.Var(names[-1], L.INDEX), L.Var(f"{s.acc}.p", L.INDEX)
    out_at = flat_index(s.out, (*batch, i, j))
    a_at = _widened(L.Load(flat_name(s.a.buffer), (flat_index(s.a, (*batch, i, p)),), a_dtype), dtype)
    b_at = _widened(L.Load(flat_name(s.b.buffer), (flat_index(s.b, (*batch, p, j)),), b_dtype), dtype)
    out = flat_name(s.out.buffer)
    old = L.Load(out, (out_at,), dtype)
    acc = L.Var(s.acc, dtype)
    if order == "ijk":
        init = old if s.accumulate else _zero(dtype)
        dot = L.Reduce(p.name, s.k, [L.Accumulator(s.acc, dtype, init)], [],
                       [L.Binary("add", acc, L.Binary("mul", a_at, b_at, dtype), dtype)])
        row = [L.Loop(j.name, s.n, [dot, L.Store(out, (out_at,), acc if s.epilogue is None else s.epilogue)])]
    else:
        a_elem = L.Var(f"{s.acc}.a", dtype)
        update = L.Store(out, (out_at,), L.Binary("add", old, L.Binary("mul", a_elem, b_at, dtype), dtype))
        row = [] if s.accumulate else [L.Loop(j.name, s.n, [L.Store(out, (out_at,), _zero(dtype))])]
        row.append(L.Loop(p.name, s.k, [L.Let(a_elem.name, a_at), L.Loop(j.name, s.n, [update])]))
        if s.epilogue is not None:
            row.append(L.Loop(j.name, s.n, [L.Let(s.acc, old), L.Store(out, (out_at,), s.epilogue)]))
    body: list = [L.Loop(i.name, s.m, row)]
    for d in reversed(range(len(batch))):
        body = [L.Loop(batch[d].name, s.batch[d], body)]
    body[0].parallel = parallel
    return body


def _zero(dtype) -> L.Const:
    return L.Const(0 if dtype.is_integer else 0.0, dtype)


def const_view(view: L.View) -> Union[tuple[int, tuple[int, ...]], None]:
    """(offset, strides) as ints when every one is a Const, else None."""
    parts = (view.offset, *view.strides)
    if all(isinstance(e, L.Const) for e in parts):
        return parts[0].value, tuple(e.value for e in parts[1:])
    return None


def view_extents(s: L.Matmul) -> dict[str, tuple]:
    """The extents each view walks: out (batch, m, n), a (batch, m, k), b (batch, k, n)."""
    return {"out": (*s.batch, s.m, s.n), "a": (*s.batch, s.m, s.k), "b": (*s.batch, s.k, s.n)}
