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
directly and skips the statements.  The input must be a buffer with static strides: a
computed one is materialized first, and a padded one copied with its zero border (both
kh*kw times smaller than the window matrix).  A float32 cast of a bfloat16/float16
input (widen_half's) is read, and padded, in its half dtype: the packing converts it
(llvm/gemm/halfwindows.py), never a float32 copy.  None when `v` is not such a matrix, or when
another op reads the matrix as well (a train step's weight gradient): then it is
materialized once, for both, as before.
"""
from __future__ import annotations

import math
from typing import Optional

from ...core import dtypes as dt
from ...ir import Value
from ...core.symbolic import is_dynamic
from ..loops import index as I
from ..loops import ir as L
from ..loops.exprs import const
from .nests import fresh_name, loop_nest
from .operands import dense_strides, half_source, in_memory


def window_operand(sched, v: Value, batch: tuple) -> Optional[tuple[list, L.View, L.Windows]]:
    if v in sched.names or v.op is None or getattr(sched.table.get(v.op.name), "kind", None) != "reshape":
        return None
    cols = v.op.operands[0]
    args = None if cols in sched.names else sched.made_by(cols, "im2col")
    if args is None or _used_elsewhere(sched, v) or _used_elsewhere(sched, cols) or v.type.ndim != 4 or tuple(v.type.shape[:2]) != tuple(batch) \
            or any(is_dynamic(d) for d in (*v.type.shape, *cols.type.shape, *args["self"].type.shape)):
        return None
    x = half_source(sched, args["self"])       # a half input: its windows are packed from it in place
    if x.type.ndim != 4:
        return None
    (kh, kw), dilation, padding, stride = args["kernel_size"], args["dilation"], args["padding"], args["stride"]
    n, groups, k, length = v.type.shape
    c = x.type.shape[1]
    if groups * k != c * kh * kw or c % groups:
        return None
    source = _padded(sched, x, padding) if any(padding) else _buffer_of(sched, x)
    if source is None:
        return None
    buffer, offset, (sn, sc, sh, sw) = source
    oh, ow = (_out_width(size, kk, d, p, st) for size, kk, d, p, st
              in zip(x.type.shape[2:], (kh, kw), dilation, padding, stride))
    if oh * ow != length:
        return None
    windows = L.Windows(buffer, I.expr(offset), (sn, (c // groups) * sc),
                        (c // groups, kh, kw), (sc, dilation[0] * sh, dilation[1] * sw),
                        (oh, ow), (stride[0] * sh, stride[1] * sw))
    # the window matrix as before, for code generators that read `b`
    name = fresh_name(sched.buffers, "t")
    sched.buffers[name] = L.Buffer(name, v.type.dtype, tuple(v.type.shape), "temp")
    value = lambda ix: [L.Store(name, ix, sched.inliner.value_at(v, ix))]     # noqa: E731
    fills = loop_nest(v.type.shape, value, prefix="w")
    strides = dense_strides(v.type.shape)
    view = L.View(name, I.ic(0), tuple(I.expr(st) for st in strides))
    return fills, view, windows


def _used_elsewhere(sched, v: Value) -> bool:
    """Whether another op than the product reads `v` (a train step's weight gradient reads
    the window matrix too): then the matrix is materialized once for both, as before,
    rather than read in place here and copied transposed there (W7's step: 28 -> 32 ms)."""
    if v in sched.graph.outputs:
        return True
    return sum(u is v for op in sched.graph.ops for u in op.operands) > 1


def _out_width(size: int, k: int, d: int, p: int, s: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _buffer_of(sched, x: Value) -> Optional[tuple[str, int, tuple]]:
    """(buffer, offset, strides) of x, materializing it when it is computed; None when they
    are not all static."""
    found = in_memory(sched, x)
    if found is None or not all(isinstance(e, int) for e in (found[1], *found[2])):
        return None
    return found


def _padded(sched, x: Value, padding) -> tuple[str, int, tuple]:
    """A copy of x with `padding` zeros around its last two dims, by a kernel of its own."""
    ph, pw = padding
    n, c, h, w = x.type.shape
    shape = (n, c, h + 2 * ph, w + 2 * pw)
    name = fresh_name(sched.buffers, "t")
    sched.buffers[name] = L.Buffer(name, x.type.dtype, shape, "temp")

    def store(ix):
        at, inside = list(ix[:2]), []
        for i, p, size in zip(ix[2:], padding, (h, w)):
            if p:
                pos = I.sub(i, p)
                inside += [L.Binary("ge", pos, I.ic(0), dt.BOOL), L.Binary("lt", pos, I.ic(size), dt.BOOL)]
                at.append(I.clamp(pos, 0, size - 1))      # both arms of the Select are evaluated
            else:
                at.append(i)
        value = sched.inliner.value_at(x, tuple(at))
        cond = inside[0]
        for e in inside[1:]:
            cond = L.Binary("and", cond, e, dt.BOOL)
        return [L.Store(name, ix, L.Select(cond, value, const(0, x.type.dtype), x.type.dtype))]
    ops = sched.inlined_ops([x.op]) if x.op is not None and x not in sched.names else []
    sched.add_kernel(ops, loop_nest(shape, store, prefix="q"))
    return name, 0, tuple(math.prod(shape[d + 1:]) for d in range(4))


