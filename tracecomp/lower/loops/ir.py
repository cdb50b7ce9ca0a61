"""The loop IR: target-independent loop nests over buffers, the contract between the
scheduler (graph -> kernels) and the code generators (CPU via llvmlite, PTX).

A Kernel reads and writes Buffers (dense, row-major; views of them are index arithmetic
in the Loads) through a body of statements:
  Loop      a counted loop `for var in range(extent)`; `parallel` marks loops whose
            iterations are independent and may run on several cores (outermost only);
  Let       binds a scalar SSA name to an expression (visible to later statements);
  Reduce    a counted loop that carries accumulators (scf.for with iter_args): each
            iteration evaluates `body` then sets every accumulator to its `update` expr;
            after it, the accumulator names hold the final values;
  Store     writes one element;
  Matmul    a (batched) matrix product over strided views of buffers, with an optional
            accumulate and a per-element epilogue (below).
Expressions are typed scalars: Const, Var (loop indices are int64 `index` values), Load,
GuardedLoad (a Load that reads only where its bool `guard` holds and is zero elsewhere),
Unary/Binary ops named after ops/scalar.py's primitives plus arithmetic and comparisons,
Select, Cast and CheckedIndex (an index computed from data, checked against its range:
below).  A size (an extent, a buffer dim, a Matmul's m, n, k) is an int or an
index expression of the kernel's size parameters: `Var("size_batch", INDEX)`, or
`784*size_batch` for a dynamic dim (one form for all; Size below).  A serial Loop's or a
Reduce's extent may also use the loop vars and index Lets around it (add, sub, mul, minimum,
maximum): a triangular nest, a sort's passes over a run-time length.
Invariants (checked by `check_kernel`): names are defined before use and only once; loads
and stores index every dim of their buffer; a Store's value has the buffer's dtype.
Select evaluates both arms (code generators emit branch-free selects), so every Load in
either arm must be in bounds whatever the condition: the scheduler clamps such indices, or
uses a GuardedLoad, whose index need be in bounds only where its guard holds (the code
generators branch around the load).

Index errors.  A CheckedIndex(index, size, buffer, check) is `index` where 0 <= index <
size; elsewhere the index is out of range, and the expression is the index clamped into
[0, size - 1] (so memory stays safe) and the kernel records check `check` as failed in
`buffer`, the program's error record (role "errors", int64[1 + 2 * checks], zero before the
program runs; only CheckedIndex writes it): slot 0 becomes nonzero, slot 1 + 2 * check
nonzero, and slot 2 + 2 * check holds the largest offending index seen, compared as an
unsigned 64-bit number (so a negative index beats every positive one).  The record does not
depend on the order in which elements (or threads) fail.  The caller reads the record after
the kernels and raises (runtime/compiled.py) or returns an error code (an exported library).

Loops and branches.  A Program (schedule/scheduler.py) runs its kernels in order, or,
when the graph has loops and branches, as its `steps` say (loops/control.py): kernels
called inside counted loops, while loops and branches, on buffers a step points at the
operands, rows and carries of the moment.  Kernels do not change: a kernel in a loop body
is a kernel like any other, called once per iteration.

Matmul.  A View is a strided window on a buffer's elements in row-major (flat) order:
element (d0, d1, ...) of the view is flat element `offset + sum(d * stride)` of the buffer,
offset and strides being `index` expressions (a stride may be 0: broadcasting; transposes
and slices are just other strides, so a permuted operand is read in place, never copied).
With batch extents B = (b0, b1, ...), a Matmul computes, for every batch index bt, i < m
and j < n:
    acc = sum(a[bt, i, p] * b[bt, p, j] for p < k)      (+ out[bt, i, j] if accumulate)
    out[bt, i, j] = epilogue   (or acc when there is no epilogue)
where `a` is a View of rank len(B) + 2 over (bt, i, p), `b` over (bt, p, j) and `out` over
(bt, i, j).  All three buffers share one dtype (f32, f64, i32 or i64), which is also the
accumulator's; float sums are taken in an unspecified order (like a Reduce's).  The
epilogue is any expression of that dtype in the accumulator `Var(acc)` and the output
index `Var(index[d])` (one name per batch dim, then i, then j): loads of other buffers at
those indices fuse elementwise consumers (bias, activation, residual) into the store.
`workspace` names a temp buffer the CPU code generator packs panels into (its size comes
from schedule/tiles.py's workspace_elements); without one, code generators use plain loops.
Checked: ranks, dtypes, names, views inside their buffers and `out` one-to-one (for
static views), out/a/b/workspace distinct, the epilogue reads neither out nor workspace.
A Matmul parallelizes itself, except inside a parallel Loop: there it runs on the thread
that reaches it, packing into that thread's slice of the workspace.

`b_windows` (optional, a convolution's window matrix): the same elements of `b`, given
also as Windows of another buffer (below).  It adds nothing to the statement's meaning:
code generators that ignore it read `b`, which the statements before the Matmul in its
kernel fill (im2col).  The CPU code generator packs B's panels straight from the windows
(implicit GEMM) and skips those statements, so `b`'s buffer must be a temp that only this
Matmul reads (the scheduler makes it one; the checker checks it within the kernel).
`b_packed` (optional) likewise adds nothing to the meaning: a buffer into which a PackB
statement, run earlier, packed `b` whole (schedule/prepack.py: a loop's weight is packed
once before the loop, not at every step); the CPU's packed kernel reads its panels there.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from ...core.dtypes import DType

INDEX = "index"    # the dtype name of loop indices and index arithmetic (64-bit)
SIZE_PREFIX = "size_"   # Var names of runtime sizes (dynamic dims) in expressions: size_batch

UNARY = ("neg", "abs", "sign", "exp", "exp2", "expm1", "log", "log2", "log1p", "sin", "cos", "tan",
         "tanh", "erf", "sqrt", "rsqrt", "floor", "ceil", "round", "not", "logical_not")
BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "atan2", "floordiv", "mod", "fmod",
          "and", "or", "xor", "eq", "ne", "lt", "le", "gt", "ge")
COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")


class Expr:
    """A typed scalar expression; `dtype` is a DType or INDEX."""
    dtype: Union[DType, str]


@dataclass(frozen=True)
class Const(Expr):
    value: Union[int, float, bool]
    dtype: Union[DType, str]


@dataclass(frozen=True)
class Var(Expr):
    name: str
    dtype: Union[DType, str]


@dataclass(frozen=True)
class Load(Expr):
    buffer: str
    index: tuple[Expr, ...]
    dtype: DType


@dataclass(frozen=True)
class GuardedLoad(Load):
    """The element when `guard` (bool) holds, else zero; the index need only be in bounds
    where it holds (col2im's taps that fall outside the window matrix).  The CPU code loads
    under a branch; a clamped index made LLVM gather instead (W7's col2im: 5.0 -> 2.3 ms)."""
    guard: Expr


@dataclass(frozen=True)
class Unary(Expr):
    fn: str
    x: Expr
    dtype: Union[DType, str]


@dataclass(frozen=True)
class Binary(Expr):
    fn: str
    a: Expr
    b: Expr
    dtype: Union[DType, str]     # the result's (bool for comparisons)


@dataclass(frozen=True)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr
    dtype: Union[DType, str]


@dataclass(frozen=True)
class Cast(Expr):
    x: Expr
    dtype: Union[DType, str]


@dataclass(frozen=True)
class CheckedIndex(Expr):
    """`index` checked against [0, size) (see the module docstring): in range, its value;
    out of range, recorded in the error buffer and clamped."""
    index: Expr
    size: "Size"                     # an int or an index expression of size parameters
    buffer: str                      # the program's error record (INDEX_ERRORS)
    check: int                       # which check: slots 1 + 2 * check and 2 + 2 * check
    dtype: Union[DType, str] = INDEX


INDEX_ERRORS = "index_errors"        # the error record's buffer name in every program


def error_slots(checks: int) -> int:
    """The length of an error record for `checks` checks: a flag, then (failed, value) per check."""
    return 1 + 2 * checks


@dataclass
class Let:
    name: str
    value: Expr


@dataclass
class Store:
    buffer: str
    index: tuple[Expr, ...]
    value: Expr


@dataclass
class Loop:
    var: str
    extent: "Size"                   # a constant trip count, or an expression of size parameters
    body: list = field(default_factory=list)
    parallel: bool = False


@dataclass
class Accumulator:
    name: str
    dtype: DType
    init: Expr


@dataclass
class Reduce:
    var: str
    extent: "Size"
    accumulators: list[Accumulator]
    body: list                       # Lets (and nested Reduces) evaluated each iteration
    update: list[Expr]               # new value of each accumulator, may read the old ones


@dataclass(frozen=True)
class View:
    """A strided window on `buffer` (see the module docstring): index expressions."""
    buffer: str
    offset: Expr
    strides: tuple[Expr, ...]


@dataclass(frozen=True)
class Windows:
    """Element (bt, p, j) of a Matmul's b as `buffer`'s flat element
        offset + sum(bt[d] * batch_strides[d]) + sum(pd * k_strides) + sum(jd * n_strides)
    where (pd...) is p split row-major over k_shape and (jd...) is j over n_shape: for a
    convolution p = (c, ki, kj) and j = (oh, ow), so each element is the offset of its row
    plus the offset of its column.  Shapes and strides are Sizes: ints, or index expressions
    of size parameters (a run-time H and W).  Such windows name `row_table` and
    `column_table`, int32 buffers of the kernel shaped k_shape and n_shape, which statements
    before the Matmul fill with sum(pd * k_strides) and sum(jd * n_strides) (wrapped to
    32 bits: the CPU reads them only where the offsets fit); static windows have none (the
    CPU's tables are constants of its module)."""
    buffer: str
    offset: Expr
    batch_strides: tuple["Size", ...]
    k_shape: tuple["Size", ...]
    k_strides: tuple["Size", ...]
    n_shape: tuple["Size", ...]
    n_strides: tuple["Size", ...]
    row_table: Optional[str] = None
    column_table: Optional[str] = None

    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in (*self.batch_strides, *self.k_shape, *self.k_strides,
                                                *self.n_shape, *self.n_strides))

    def row_offsets(self) -> list[int]:
        return _split_offsets(self.k_shape, self.k_strides)

    def column_offsets(self) -> list[int]:
        return _split_offsets(self.n_shape, self.n_strides)


def _split_offsets(shape: tuple[int, ...], strides: tuple[int, ...]) -> list[int]:
    """sum(digit * stride) for every index of `shape`, in row-major order."""
    out = [0]
    for n, st in zip(shape, strides):
        out = [o + d * st for o in out for d in range(n)]
    return out


@dataclass
class Matmul:
    out: View                              # (batch..., m, n)
    a: View                                # (batch..., m, k)
    b: View                                # (batch..., k, n)
    m: "Size"
    n: "Size"
    k: "Size"
    batch: tuple["Size", ...] = ()
    accumulate: bool = False               # add the product to out's old value
    epilogue: Optional[Expr] = None        # the stored value, in Var(acc) and Var(index[d])
    acc: str = "acc"
    index: tuple[str, ...] = ()            # names of (batch..., i, j) in the epilogue
    workspace: Optional[str] = None        # temp buffer for packed panels (CPU codegen)
    b_windows: Optional[Windows] = None    # b's elements read in place (CPU codegen: implicit GEMM)
    b_packed: Optional[str] = None         # b already packed whole into this buffer (PackB; CPU codegen)

    def views(self) -> tuple[View, View, View]:
        return self.out, self.a, self.b

    def extents(self) -> tuple["Size", ...]:
        return (*self.batch, self.m, self.n, self.k)


@dataclass
class PackB:
    """Pack the (k, n) matrix `b` (a View of rank 2) whole into `buffer`, in the micro-panels
    of the CPU's packed kernel, for Matmuls whose `b_packed` names that buffer (a loop's
    weight, packed once before the loop instead of at every step).  Code generators
    without a packed kernel do nothing: such a Matmul reads `b`, which holds the same."""
    buffer: str
    b: View
    k: "Size"
    n: "Size"


Stmt = Union[Let, Store, Loop, Reduce, Matmul, PackB]
Size = Union[int, Expr]        # an int, or an `index` expression of Vars naming size parameters


@dataclass(frozen=True)
class Buffer:
    name: str
    dtype: DType
    shape: tuple["Size", ...]              # ints, or expressions of size parameters (dynamic dims)
    role: str                              # "input", "output" or "temp"


@dataclass
class Kernel:
    name: str
    buffers: list[Buffer]
    body: list
    sizes: list[str] = field(default_factory=list)    # runtime size parameters (dynamic dims)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)
