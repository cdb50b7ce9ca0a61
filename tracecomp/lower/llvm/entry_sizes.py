"""Dims and byte counts in an exported library's entry point, as LLVM values.

A library exported with dynamic dims (`dynamic={"x": {0: "batch"}}`) takes each size as an
`int64_t` argument of its entry point; buffer dims in the loop IR are then index
expressions of those sizes (`size_batch`, `784*size_batch`).  `EntrySizes` evaluates such
dims, byte counts and workspace offsets with an IRBuilder; static dims stay constants, so
a library without dynamic dims gets exactly the constants it had before.

`ShapeEquations` is the other side, in Python: the sizes of a call from its inputs' shapes
(each size read where it first stands alone as a dim, every other dim checked against the
value its expression takes), for tc.trace's programs with dynamic sizes, which call the
same entry point from the JIT (runtime/compiled.py DynamicProgram), and for tc.trace's
choice of the compiled program that serves a call (transforms/trace.py).
"""
from __future__ import annotations

import llvmlite.ir as ir

from ...core.errors import ArgumentError
from ...core.symbolic import Dim, evaluate
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
        # (a floor division's dividend is never negative: index.dim)
        return {"add": self.b.add, "sub": self.b.sub, "mul": self.b.mul, "floordiv": self.b.sdiv}[d.fn](a, c)

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
            if isinstance(d, L.Var) or d.fn == "floordiv":
                return self.b.sitofp(self.dim(d), f64)
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


class ShapeEquations:
    """The sizes a call's shapes give, for inputs of the expected `shapes` (per input, each
    dim an int, a symbolic.Dim, a loop-IR size expression, or None for any size); `labels`
    name the inputs in errors ("x", "input 2")."""

    def __init__(self, shapes, labels: list[str]):
        self.labels = labels
        self.ranks = [len(s) for s in shapes]
        self.static: list[tuple[int, tuple]] = []      # (input, shape): no dynamic dim
        self.binds: list[tuple[int, int, str]] = []    # (input, axis, name): where a size is read
        self.checks: list[tuple[int, int, object]] = []   # (input, axis, int or Dim): the others
        self.where: dict[str, tuple[int, int]] = {}
        for i, shape in enumerate(shapes):
            shape = [d if d is None else symbolic(d) for d in shape]
            if all(isinstance(d, int) for d in shape):
                self.static.append((i, tuple(shape)))
                continue
            for axis, d in enumerate(shape):
                if isinstance(d, Dim) and list(d.terms.items()) == [((d.names()[0],), 1)] \
                        and d.names()[0] not in self.where:
                    self.where[d.names()[0]] = (i, axis)
                    self.binds.append((i, axis, d.names()[0]))
                elif d is not None:
                    self.checks.append((i, axis, d))
        loose = {n for _, _, d in self.checks if isinstance(d, Dim) for n in d.names()} - set(self.where)
        if loose:
            raise AssertionError(f"sizes no input dim carries alone: {sorted(loose)}")

    def bind(self, shapes, least: int = 1) -> dict[str, int]:
        """{size name: value} for a call whose inputs have `shapes` (one per input); ArgumentError naming
        the input, axis, expected and actual size where they do not fit, or where a size is
        below `least` (the entry point takes sizes >= 1)."""
        for i, shape in enumerate(shapes):
            if len(shape) != self.ranks[i]:
                raise ArgumentError(f"{self.labels[i]} must have {self.ranks[i]} dims, got shape {list(shape)}")
        sizes = {}
        for i, axis, name in self.binds:
            got = shapes[i][axis]
            if got < least:
                raise ArgumentError(f"{self.labels[i]} axis {axis} is the size {name}, which must be at "
                                    f"least {least}, got {got}")
            sizes[name] = got
        for i, shape in self.static:
            if tuple(shapes[i]) != shape:
                axis = next(a for a, (x, y) in enumerate(zip(shapes[i], shape)) if x != y)
                raise ArgumentError(f"{self.labels[i]} axis {axis} must be {shape[axis]}, got {shapes[i][axis]} "
                                    f"(shape {list(shapes[i])}, expected {list(shape)})")
        for i, axis, d in self.checks:
            want = evaluate(d, sizes)
            if shapes[i][axis] != want:
                raise ArgumentError(f"{self.labels[i]} axis {axis} must be {self._explain(d, want)}, "
                                    f"got {shapes[i][axis]}")
        return sizes

    def _explain(self, d, value: int) -> str:
        """`seq = 7 (seq from x axis 1)` for a size or an expression of sizes, with where
        each is read; the int for a static dim."""
        if not isinstance(d, Dim):
            return str(d)
        where = ", ".join(f"{n} from {self.labels[self.where[n][0]]} axis {self.where[n][1]}" for n in d.names())
        return f"{d} = {value} ({where})"
