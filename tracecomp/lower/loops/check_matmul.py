"""The checker's rule for a Matmul statement (loops/ir.py describes the statement).

Checked, each failure an IRError through the checker's `fail` (kernel and statement path):
- extents are ints >= 0 or size parameters; each View names a known buffer and has one
  stride per dim of (batch..., rows, cols); offsets and strides are `index` expressions;
- out, a and b hold one dtype among f32, f64, i32, i64 (or out f32 and a, b each f32,
  bf16 or f16: half operands read widened, without b_packed); out is writable
  and is neither a nor b; a workspace is a writable 1-D buffer of that dtype distinct from the three;
- a View whose offset, strides and extents are all constants stays inside its buffer
  (when the buffer's shape is static), and such an `out` View is one-to-one (no two
  output elements share memory: threads write them independently);
- `index` has no names or one per dim; the epilogue sees the accumulator and the index
  names (plus every name visible at the statement), has the buffers' dtype, and reads
  neither out nor the workspace (other tiles of out are being written meanwhile);
A Matmul inside a parallel Loop is allowed: it runs on the thread that reaches it, in
that thread's slice of the workspace (it parallelizes itself only outside one).
- `b_windows`: a known buffer of the same dtype (or, out f32, bf16 or f16: a half
  input's windows, widened when read), one batch stride per batch dim, k_shape
  and n_shape multiplying to k and n, every element it names inside its buffer (static
  offset and shape), run-time windows' int32 offset tables, b's buffer distinct from
  the windows', and not inside a parallel Loop (the CPU skips b's fill, which the
  per-thread fallback there would read).
- `b_packed`: a known 1-D buffer of the same dtype holding at least k * n elements, for a
  Matmul without batch dims or windows.  PackB: a rank-2 View (k, n) of a known buffer
  inside it, packed into a writable 1-D buffer of its dtype with at least k * n elements.
"""
from __future__ import annotations

import math

from ...core.dtypes import DType
from .ir import INDEX, Const, Matmul, PackB, View, Windows
from .matmul import const_view, index_names, view_extents
from .walk import buffers_read

MATMUL_DTYPES = (DType.float32, DType.float64, DType.int32, DType.int64)


def check_matmul(c, s: Matmul) -> None:
    """`c` is loops/check.py's _Checker; see the module docstring for the rules."""
    for e in s.extents():
        c.extent(e)
    rank = len(s.batch) + 2
    extents = view_extents(s)
    buffers = {}
    for role, view in zip(("out", "a", "b"), s.views()):
        buffers[role] = _view(c, s, role, view, rank, extents[role])
    dtype = buffers["out"].dtype
    if dtype not in MATMUL_DTYPES:
        c.fail(f"Matmul on {dtype.label} buffers; it takes f32, f64, i32 or i64")
    for role in ("a", "b"):
        half = buffers[role].dtype.is_half and dtype is DType.float32
        if half and s.b_packed is not None:
            c.fail(f"Matmul operand {role} ('{buffers[role].name}') holds {buffers[role].dtype.label}: "
                   "half operands take no b_packed")
        if buffers[role].dtype != dtype and not half:
            c.fail(f"Matmul operand {role} ('{buffers[role].name}') holds {buffers[role].dtype.label} "
                   f"but out ('{buffers['out'].name}') holds {dtype.label}; all three share one dtype (half operands: out f32)")
    if buffers["out"].role in ("input", "constant"):
        c.fail(f"Matmul writes buffer '{s.out.buffer}', whose role is '{buffers['out'].role}' (read-only)")
    if s.out.buffer in (s.a.buffer, s.b.buffer):
        c.fail(f"Matmul out '{s.out.buffer}' is also an operand; write the product to another buffer")
    _out_one_to_one(c, s, extents["out"])
    _workspace(c, s, dtype)
    _epilogue(c, s, dtype, rank)
    if s.b_windows is not None:
        _windows(c, s, dtype)
    if s.b_packed is not None:
        if s.batch or s.b_windows is not None:
            c.fail(f"Matmul with b_packed '{s.b_packed}' has batch dims or windows; it packs one matrix")
        _packed(c, "Matmul b_packed", s.b_packed, dtype, s.k, s.n)


def check_pack_b(c, s: PackB) -> None:
    for e in (s.k, s.n):
        c.extent(e)
    b = _view(c, s, "b", s.b, 2, (s.k, s.n))
    _packed(c, "PackB", s.buffer, b.dtype, s.k, s.n)
    if c.buffers[s.buffer].role in ("input", "constant") or s.buffer == s.b.buffer:
        c.fail(f"PackB writes '{s.buffer}', which is read-only or its own source")


def _packed(c, what: str, name: str, dtype: DType, k, n) -> None:
    p = c.buffers.get(name)
    if p is None or p.dtype != dtype or len(p.shape) != 1:
        c.fail(f"{what} '{name}' must be a 1-D {dtype.label} buffer of the kernel")
    if all(isinstance(d, int) for d in (k, n, p.shape[0])) and p.shape[0] < k * n:
        c.fail(f"{what} '{name}' holds {p.shape[0]} elements; a {k}x{n} matrix needs {k * n}")


def _windows(c, s: Matmul, dtype: DType) -> None:
    w = s.b_windows
    src = c.buffers.get(w.buffer)
    if not isinstance(w, Windows) or src is None:
        c.fail(f"Matmul b_windows {w!r} must be Windows of a buffer of the kernel")
    half = src.dtype.is_half and dtype is DType.float32
    if (src.dtype != dtype and not half) or w.buffer == s.b.buffer:
        c.fail(f"Matmul b_windows reads '{w.buffer}' ({src.dtype.label}); it must hold {dtype.label} (or a "
               f"half dtype into f32) and differ from b's buffer '{s.b.buffer}'")
    if len(w.batch_strides) != len(s.batch) or len(w.k_shape) != len(w.k_strides) \
            or len(w.n_shape) != len(w.n_strides):
        c.fail(f"Matmul b_windows {w!r}: one batch stride per batch dim, one stride per k and n dim")
    for e in (w.offset, *w.batch_strides, *w.k_shape, *w.k_strides, *w.n_shape, *w.n_strides):
        if not isinstance(e, int):
            c.expr(e)
            if e.dtype != INDEX:
                c.fail(f"Matmul b_windows size or offset {e!r} has dtype {_name(e.dtype)}, expected index")
    _window_tables(c, w)
    if (isinstance(s.k, int) and math.prod(w.k_shape) != s.k) or (isinstance(s.n, int) and math.prod(w.n_shape) != s.n):
        c.fail(f"Matmul b_windows splits k into {w.k_shape} and n into {w.n_shape}; k is {s.k}, n is {s.n}")
    if c.in_parallel is not None:
        c.fail(f"Matmul with b_windows inside parallel {c.in_parallel}; it must be a statement of the kernel")
    if isinstance(w.offset, Const) and w.is_static() and all(isinstance(d, int) for d in (*s.batch, *src.shape)):
        lo, hi = _span(w.offset.value, tuple(w.batch_strides) + tuple(w.k_strides) + tuple(w.n_strides),
                       tuple(s.batch) + tuple(w.k_shape) + tuple(w.n_shape))
        if lo <= hi and (lo < 0 or hi >= math.prod(src.shape)):
            c.fail(f"Matmul b_windows of '{w.buffer}' reach flat elements {lo}..{hi}, outside its "
                   f"{math.prod(src.shape)} elements (shape {tuple(src.shape)})")


def _window_tables(c, w: Windows) -> None:
    """Windows with run-time sizes name their offset tables (int32, shaped k_shape and
    n_shape); static ones name none."""
    tables = (w.row_table, w.column_table)
    if w.is_static():
        if tables != (None, None):
            c.fail(f"Matmul b_windows of static shape names tables {tables}; only run-time windows have them")
        return
    for name, shape in zip(tables, (w.k_shape, w.n_shape)):
        t = c.buffers.get(name) if name is not None else None
        if t is None or t.dtype != DType.int32 or tuple(t.shape) != tuple(shape) or t.role in ("input", "constant"):
            c.fail(f"Matmul b_windows with run-time sizes needs a writable int32 table of shape {tuple(shape)}; "
                   f"got {name!r}" + ("" if t is None else f" ({t.role} {t.dtype.label} {tuple(t.shape)})"))


def _view(c, s: Matmul | PackB, role: str, view: View, rank: int, extents: tuple):
    if not isinstance(view, View):
        c.fail(f"Matmul {role} is {view!r}, not a View")
    b = c.buffers.get(view.buffer)
    if b is None:
        c.fail(f"Matmul {role} names an unknown buffer '{view.buffer}' (buffers: {', '.join(c.buffers) or 'none'})")
    if len(view.strides) != rank:
        c.fail(f"Matmul {role} view of '{view.buffer}' has {len(view.strides)} strides; it needs "
               f"{rank} (batch dims, then rows and columns)")
    for what, e in (("offset", view.offset), *(("stride", st) for st in view.strides)):
        c.expr(e)
        if e.dtype != INDEX:
            c.fail(f"Matmul {role} {what} {e!r} has dtype {_name(e.dtype)}, expected index")
    static = const_view(view)
    if static is not None and all(isinstance(d, int) for d in (*extents, *b.shape)):
        lo, hi = _span(static[0], static[1], extents)
        if lo <= hi and (lo < 0 or hi >= math.prod(b.shape)):
            c.fail(f"Matmul {role} view of '{view.buffer}' reaches flat elements {lo}..{hi}, outside "
                   f"its {math.prod(b.shape)} elements (shape {tuple(b.shape)})")
    return b


def _span(offset: int, strides: tuple[int, ...], extents: tuple[int, ...]) -> tuple[int, int]:
    """The lowest and highest flat element a static view touches (lo > hi: empty view)."""
    if any(n == 0 for n in extents):
        return 0, -1
    lo = offset + sum(st * (n - 1) for st, n in zip(strides, extents) if st < 0)
    hi = offset + sum(st * (n - 1) for st, n in zip(strides, extents) if st > 0)
    return lo, hi


def _out_one_to_one(c, s: Matmul, extents: tuple) -> None:
    static = const_view(s.out)
    if static is None or not all(isinstance(n, int) for n in extents) or 0 in extents:
        return
    reach = 0                      # the span of the dims already placed, innermost first
    for stride, n in sorted((abs(st), n) for st, n in zip(static[1], extents) if n > 1):
        if stride <= reach:
            c.fail(f"Matmul out view of '{s.out.buffer}' (strides {static[1]}, extents {extents}) "
                   "maps two output elements to one memory element")
        reach += stride * (n - 1)


def _workspace(c, s: Matmul, dtype: DType) -> None:
    if s.workspace is None:
        return
    w = c.buffers.get(s.workspace)
    if w is None:
        c.fail(f"Matmul workspace '{s.workspace}' is not a buffer of the kernel")
    if w.role in ("input", "constant") or w.dtype != dtype or len(w.shape) != 1:
        c.fail(f"Matmul workspace '{s.workspace}' must be a writable 1-D {dtype.label} buffer, "
               f"got a {w.role} {w.dtype.label} buffer of shape {tuple(w.shape)}")
    if s.workspace in (s.out.buffer, s.a.buffer, s.b.buffer):
        c.fail(f"Matmul workspace '{s.workspace}' is also an operand")


def _epilogue(c, s: Matmul, dtype: DType, rank: int) -> None:
    if s.index and len(s.index) != rank:
        c.fail(f"Matmul index names {s.index} must be none or {rank} (batch dims, i, j)")
    c.scopes.append({})
    origin = "Matmul"
    c.define(s.acc, dtype, origin)
    for name in index_names(s):
        c.define(name, INDEX, origin)
    c.define(f"{s.acc}.p", INDEX, origin)          # the expansion's own names (loops/matmul.py)
    c.define(f"{s.acc}.a", dtype, origin)
    if s.epilogue is not None:
        c.expr(s.epilogue)
        if s.epilogue.dtype != dtype:
            c.fail(f"the Matmul epilogue has dtype {_name(s.epilogue.dtype)}, but out holds {dtype.label} "
                   "(Cast the value)")
        read = buffers_read(s.epilogue) & {s.out.buffer, s.workspace}
        if read:
            c.fail(f"the Matmul epilogue reads '{read.pop()}'; it may read neither out nor the workspace")
    c.scopes.pop()


def _name(dtype) -> str:
    return dtype.label if isinstance(dtype, DType) else str(dtype)
