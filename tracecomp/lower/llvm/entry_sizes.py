"""Dims and byte counts in an exported library's entry point, as LLVM values.

A library exported with dynamic dims (`dynamic={"x": {0: "batch"}}`) takes each size as an
`int64_t` argument of its entry point; buffer dims in the loop IR are then index
expressions of those sizes (`size_batch`, `784*size_batch`).  `EntrySizes` evaluates such
dims, byte counts and workspace offsets with an IRBuilder; static dims stay constants, so
a library without dynamic dims gets exactly the constants it had before.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ...core.symbolic import Dim
from ..loops import ir as L
from ..loops.index import dim as loop_dim, symbolic
from ..loops.walk import size_params

I64 = ir.IntType(64)


def size_names(program) -> list[str]:
    """The program's size parameters (`size_batch`, ...) in order of first appearance in
    its inputs' shapes: the order of the entry point's size arguments."""
    out: list[str] = []
    for n in program.inputs:
        for name in size_params(list(program.buffers[n].shape)):
            if name not in out:
                out.append(name)
    loose = sorted({s for k in program.kernels for s in k.sizes} - set(out))
    if loose:
        raise AssertionError(f"kernels take sizes no input carries: {loose}")
    return out


def public_name(size_param: str) -> str:
    return size_param[len(L.SIZE_PREFIX):]


def describe_dim(d):
    """A loop-IR dim for metadata and messages: an int, or the size expression's text."""
    return d if isinstance(d, int) else str(symbolic(d))


class EntrySizes:
    """Evaluates dims for the entry point being built with `builder`; `values` maps each
    size parameter to its i64 argument."""

    def __init__(self, builder: ir.IRBuilder, values: dict[str, ir.Value]):
        self.b, self.values = builder, values

    def dim(self, d) -> ir.Value:
        """An int, a symbolic.Dim or a loop-IR index expression of size parameters."""
        if isinstance(d, Dim):
            d = loop_dim(d)
        if isinstance(d, int):
            return ir.Constant(I64, d)
        if isinstance(d, L.Const):
            return ir.Constant(I64, d.value)
        if isinstance(d, L.Var):
            return self.values[d.name]
        a, c = self.dim(d.a), self.dim(d.b)
        return {"add": self.b.add, "sub": self.b.sub, "mul": self.b.mul}[d.fn](a, c)

    def approx_nbytes(self, buffer) -> ir.Value:
        """A buffer's bytes in double precision: exact enough to compare with a limit, and
        unable to wrap around as the int64 product of huge sizes would."""
        f64 = ir.DoubleType()

        def value(d):
            if isinstance(d, Dim):
                d = loop_dim(d)
            if isinstance(d, int):
                return ir.Constant(f64, float(d))
            if isinstance(d, L.Const):
                return ir.Constant(f64, float(d.value))
            if isinstance(d, L.Var):
                return self.b.sitofp(self.values[d.name], f64)
            a, c = value(d.a), value(d.b)
            return {"add": self.b.fadd, "sub": self.b.fsub, "mul": self.b.fmul}[d.fn](a, c)
        total = ir.Constant(f64, float(buffer.dtype.itemsize))
        for d in buffer.shape:
            total = self.b.fmul(total, value(d))
        return total

    def count(self, buffer) -> ir.Value:
        """Elements of a buffer (constant operands fold when LLVM optimizes the module)."""
        total = ir.Constant(I64, 1)
        for d in buffer.shape:
            total = self.b.mul(total, self.dim(d))
        return total

    def nbytes(self, buffer) -> ir.Value:
        return self.b.mul(self.count(buffer), ir.Constant(I64, buffer.dtype.itemsize))

    def aligned(self, nbytes: ir.Value, align: int) -> ir.Value:
        """nbytes rounded up to a multiple of `align` (a power of two), at least `align`."""
        up = self.b.and_(self.b.add(nbytes, ir.Constant(I64, align - 1)), ir.Constant(I64, -align))
        return self.b.select(self.b.icmp_unsigned("<", up, ir.Constant(I64, align)), ir.Constant(I64, align), up)
