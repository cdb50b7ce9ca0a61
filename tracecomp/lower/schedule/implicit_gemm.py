"""A convolution's window matrix as a Matmul operand read in place (implicit GEMM).

conv2d multiplies the weight by im2col's window matrix, reshaped to (N, groups, K, L):
row p = (c, ki, kj) and column j = (oh, ow) of it is the input element at
    x[n, g*Cg + c, oh*s - pad + ki*d, ow*s - pad + kj*d],
so its address is (the row's offset) + (the column's offset) once the padding is part of
the buffer.  Materialized, that matrix is kh*kw times the input (W7's second conv: 42 MB
from 5.5 MB), written once by im2col and read again from memory when the product packs it.

`window_operand(sched, v, batch)` gives, for such a `b` operand, (statements, view,
windows): the statements fill a temp with the matrix as before (what code generators
that ignore `Matmul.b_windows` read, through `view`), and `windows` (loops.ir.Windows)
says where each element sits in the input, which the CPU code generator packs from
directly and skips the statements.  The input must be a buffer (with non-negative
strides): a computed one is materialized first, and a padded one copied with its zero
border (both kh*kw times smaller than the window matrix).  Sizes may be run-time ones (a
dynamic N, H, W, channel count or kernel size): the windows' offsets then go into two
int32 tables that statements before the product fill per call (_offset_tables), where a
static conv's are constants.  A float32 cast of a bfloat16/float16
input (widen_half's) is read, and padded, in its half dtype: the packing converts it
(llvm/gemm/halfwindows.py), never a float32 copy.  None when `v` is not such a matrix, or when
another op reads the matrix as well (a train step's weight gradient): then it is
materialized once, for both, as before.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ...core import dtypes as dt
from ...ir import Value
from ...core.symbolic import Dim, DynamicShapeError, hint, shape_hint
from ..loops import index as I
from ..loops import ir as L
from ..loops.exprs import const
from .nests import fresh_name, loop_nest
from .operands import dense_strides, half_source, in_memory
from .tiles import parallel_min_work


def window_operand(sched, v: Value, batch: tuple) -> Optional[tuple[list, L.View, L.Windows]]:
    if v in sched.names or v.op is None or getattr(sched.table.get(v.op.name), "kind", None) != "reshape":
        return None
    cols = v.op.operands[0]
    args = None if cols in sched.names else sched.made_by(cols, "im2col")
    if args is None or _used_elsewhere(sched, v) or _used_elsewhere(sched, cols) or v.type.ndim != 4 \
            or tuple(v.type.shape[:2]) != tuple(batch):
        return None
    x = half_source(sched, args["self"])       # a half input: its windows are packed from it in place
    if x.type.ndim != 4:
        return None
    (kh, kw), dilation, padding, stride = args["kernel_size"], args["dilation"], args["padding"], args["stride"]
    n, groups, k, length = v.type.shape
    c = x.type.shape[1]
    if not _provably(lambda: groups * k == c * kh * kw and c % groups == 0):
        return None
    source = _padded(sched, x, padding) if any(padding) else _buffer_of(sched, x)
    if source is None:
        return None
    buffer, offset, (sn, sc, sh, sw) = source
    oh, ow = (_out_width(size, kk, d, p, st) for size, kk, d, p, st
              in zip(x.type.shape[2:], (kh, kw), dilation, padding, stride))
    if not _provably(lambda: oh * ow == length):
        return None
    sizes = (c // groups, kh, kw), (sc, dilation[0] * sh, dilation[1] * sw), (oh, ow), (stride[0] * sh, stride[1] * sw)
    k_shape, k_strides, n_shape, n_strides = (tuple(I.dim(d) for d in part) for part in sizes)
    windows = L.Windows(buffer, I.expr(offset), (I.dim(sn), I.dim((c // groups) * sc)),
                        k_shape, k_strides, n_shape, n_strides)
    tables = [] if windows.is_static() else _offset_tables(sched, sizes)
    if tables:
        windows = dataclasses.replace(windows, row_table=tables[0][0], column_table=tables[1][0])
    # the window matrix as before, for code generators that read `b`
    name = fresh_name(sched.buffers, "t")
    sched.buffers[name] = L.Buffer(name, v.type.dtype, tuple(I.dim(d) for d in v.type.shape), "temp")
    value = lambda ix: [L.Store(name, ix, sched.inliner.value_at(v, ix))]     # noqa: E731
    fills = [st for _, fill in tables for st in fill] + loop_nest(v.type.shape, value, prefix="w")
    strides = dense_strides(v.type.shape)
    view = L.View(name, I.ic(0), tuple(I.expr(st) for st in strides))
    return fills, view, windows


def _provably(claim) -> bool:
    """Whether `claim()` holds for every value of the run-time sizes in it (a comparison
    that depends on them raises DynamicShapeError or answers False: not provable)."""
    try:
        return claim() is True
    except DynamicShapeError:
        return False


def _offset_tables(sched, sizes) -> list[tuple[str, list]]:
    """Run-time windows' row and column offset tables: (int32 buffer, statements filling
    it) for (k_shape, k_strides) and (n_shape, n_strides), computed per call from the sizes
    (a few thousand elements: the CPU's tables of a static conv are module constants)."""
    k_shape, k_strides, n_shape, n_strides = sizes
    out = []
    for shape, strides, prefix in ((k_shape, k_strides, "wr"), (n_shape, n_strides, "wc")):
        name = fresh_name(sched.buffers, "t")
        sched.buffers[name] = L.Buffer(name, dt.INT32, tuple(I.dim(d) for d in shape), "temp")

        def store(ix, name=name, strides=strides):
            at = I.ic(0)
            for i, st in zip(ix, strides):
                at = I.add(at, I.mul(i, I.expr(st)))
            return [L.Store(name, ix, L.Cast(at, dt.INT32))]
        fill = loop_nest(shape, store, prefix=prefix)
        fill[0].parallel = False            # microseconds of work: not worth a thread team
        out.append((name, fill))
    return out


def _used_elsewhere(sched, v: Value) -> bool:
    """Whether another op than the product reads `v` (a train step's weight gradient reads
    the window matrix too): then the matrix is materialized once for both, as before,
    rather than read in place here and copied transposed there (W7's step: 28 -> 32 ms)."""
    if v in sched.graph.outputs:
        return True
    return sum(u is v for op in sched.graph.ops for u in op.operands) > 1


def _out_width(size: int, k: int, d: int, p: int, s: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _buffer_of(sched, x: Value) -> Optional[tuple[str, object, tuple]]:
    """(buffer, offset, strides) of x (ints, or symbolic sizes for run-time dims),
    materializing it when it is computed; None when a stride is negative."""
    found = in_memory(sched, x)
    if found is None or not all(_provably(lambda e=e: e >= 0) for e in (found[1], *found[2])):
        return None
    return found


def _padded(sched, x: Value, padding) -> tuple[str, int, tuple]:
    """A copy of x with `padding` zeros around its last two dims, by a kernel of its own:
    per (n, c) plane, the zero rows above and below, and each row's zeros either side of
    its copied elements: plain loops, where a select on the bounds in every element made
    the conv of benchmarks/conv_dynamic.py 84 -> 77 ms static, 86 -> 79 ms dynamic."""
    ph, pw = padding
    n, c, h, w = x.type.shape
    shape = (n, c, h + 2 * ph, w + 2 * pw)
    name = fresh_name(sched.buffers, "t")
    sched.buffers[name] = L.Buffer(name, x.type.dtype, tuple(I.dim(d) for d in shape), "temp")
    zero = const(0, x.type.dtype)
    bn, bc, i, j = (L.Var(f"q{d}", L.INDEX) for d in range(4))

    def zeros(var: str, row, count, start, width) -> list:
        """count x width zeros from (row, start) of the plane (nothing when count is 0)."""
        if not isinstance(count, Dim) and count == 0:
            return []
        inner = L.Var(var + "j", L.INDEX)
        at = (bn, bc, I.add(row(L.Var(var, L.INDEX)), start[0]), I.add(inner, start[1]))
        return [L.Loop(var, I.dim(count), [L.Loop(inner.name, I.dim(width), [L.Store(name, at, zero)])])]
    copy = L.Store(name, (bn, bc, I.add(i, ph), I.add(j, pw)), sched.inliner.value_at(x, (bn, bc, i, j)))
    row = zeros("ql", lambda _: i, 1, (ph, 0), pw) + [L.Loop(j.name, I.dim(w), [copy])] + \
        zeros("qr", lambda _: i, 1, (ph, w + pw), pw) if pw else [L.Loop(j.name, I.dim(w), [copy])]
    plane = zeros("qt", lambda r: r, ph, (0, 0), shape[3]) + [L.Loop(i.name, I.dim(h), row)] + \
        zeros("qb", lambda r: r, ph, (h + ph, 0), shape[3])
    nest = [L.Loop(bn.name, I.dim(n), [L.Loop(bc.name, I.dim(c), plane)])]
    nest[0].parallel = math.prod(shape_hint(shape)) >= parallel_min_work() and hint(n) > 1
    ops = sched.inlined_ops([x.op]) if x.op is not None and x not in sched.names else []
    sched.add_kernel(ops, nest)
    return name, 0, dense_strides(shape)
