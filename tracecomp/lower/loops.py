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
  Store     writes one element.
Expressions are typed scalars: Const, Var (loop indices are int64 `index` values), Load,
Unary/Binary ops named after ops/scalar.py's primitives plus arithmetic and comparisons,
Select and Cast.  Extents may be ints or Var names of runtime sizes (dynamic dims).
Invariants (checked by `check_kernel`): names are defined before use and only once; loads
and stores index every dim of their buffer; a Store's value has the buffer's dtype.
Select evaluates both arms (code generators emit branch-free selects), so every Load in
either arm must be in bounds whatever the condition: the scheduler clamps such indices.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from ..dtypes import DType

INDEX = "index"    # the dtype name of loop indices and index arithmetic (64-bit)

UNARY = ("neg", "abs", "sign", "exp", "exp2", "expm1", "log", "log2", "log1p", "sin", "cos", "tan",
         "tanh", "erf", "sqrt", "rsqrt", "floor", "ceil", "round", "not", "logical_not")
BINARY = ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "atan2", "floordiv", "mod",
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
    extent: Union[int, str]          # a constant trip count, or the name of a size parameter
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
    extent: Union[int, str]
    accumulators: list[Accumulator]
    body: list                       # Lets (and nested Reduces) evaluated each iteration
    update: list[Expr]               # new value of each accumulator, may read the old ones


Stmt = Union[Let, Store, Loop, Reduce]


@dataclass(frozen=True)
class Buffer:
    name: str
    dtype: DType
    shape: tuple[Union[int, str], ...]     # ints, or size-parameter names for dynamic dims
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
