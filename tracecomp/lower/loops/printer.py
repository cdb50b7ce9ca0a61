"""Print loop-IR Kernels as upstream MLIR (`func`, `arith`, `math`, `scf`, `memref`), text
that `mlir-opt` parses and verifies without `--allow-unregistered-dialect`.

A Kernel becomes `func.func @name(%buf: memref<4x?xf32>, ..., %n: index)`: every buffer is
an argument (dynamic dims print as `?`), then one `index` argument per size parameter.
Loop -> `scf.for` (`scf.parallel` when parallel), Reduce -> `scf.for` with `iter_args`
and `scf.yield` (its results take the accumulators' names), Let -> the SSA value of its
expression (named after the Let), Load/Store -> `memref.load`/`memref.store`, Matmul ->
its loop expansion (loops/matmul.py) on 1-D `memref.reinterpret_cast` views of its buffers,
CheckedIndex -> an unsigned compare, an `scf.if` that records the failure with
`memref.atomic_rmw` (maxu of the value, ori of the flags), and the index clamped.

Unary, Binary and Cast lower through tables keyed by fn and operand kind (f float,
i integer, x index, b bool; see loops.check.UNARY_KINDS): an MLIR op name, a comparison
predicate, or a short expansion.  The semantics they fix, for every code generator:
`div` on integers truncates (arith.divsi), `floordiv` floors (arith.floordivsi, floor of
divf), `mod` is the floored remainder with the divisor's sign (Python's %, NumPy's mod),
matching loops/interp.py; `maximum`/`minimum` propagate NaN; `ne` on floats is true for NaN
(une), the other comparisons are false for NaN (ordered); bools compare unsigned
(false < true), add/maximum are `or`, mul/minimum are `and`; `round` rounds half to even;
`sign` keeps 0 and -0 and gives 0 for NaN; floor/ceil/round of integers and sign of bools
are the identity; a Cast to bool is `!= 0` (NaN -> true); a float -> int Cast truncates and
gives INT_MIN for NaN, infinities and values out of range (select around arith.fptosi).

Kernels print in order, each preceded by its source notes as `//` comments when given:
`// mlp.py:18: tc.matmul tc.add` (mlir-opt ignores comments).

Names: `%` + the IR name where there is one (loop variables, Lets, accumulators, buffers,
sizes), `%vN` for other values, `%cN`/`%cN_i32`/`%cst`/`%true` for constants, made unique
among the names visible at that point.  Each constant is emitted once, at the function's
entry (as mlir-opt's own output has them).  One op per line, two spaces of indent per
nesting level.
"""
from __future__ import annotations

import math
import re
import struct
from typing import Callable, Iterable, Union

from ...core.dtypes import DType
from ...core.errors import IRError
from .ir import (COMPARISONS, INDEX, Binary, Buffer, Cast, CheckedIndex, Const, Expr, GuardedLoad, Kernel, Let, Load, Loop, Matmul, PackB, Reduce, Select, Store, Unary, Var)
from .check import check_kernel, dtype_kind
from .matmul import expand_matmul, flat_name, operand_dtypes
from .source_notes import annotate

DTypeLike = Union[DType, str]
# A lowering: an op name ("arith.addf"), a comparison ("arith.cmpf", "olt"), or an
# expansion f(printer, operands, dtype, result name) -> SSA value.
Lowering = Union[str, tuple[str, str], Callable]


def print_kernel(kernel: Kernel) -> str:
    """The kernel as one `func.func` (checked first with check_kernel)."""
    check_kernel(kernel)
    return _Printer().kernel(kernel, depth=0)


def print_kernels(kernels: Iterable[Kernel], notes: dict[str, list[str]] | None = None,
                  gpu_mapping: dict[str, dict[str, str]] | None = None) -> str:
    """Several kernels (distinct names) as one `module { ... }`; `notes` (kernel name ->
    lines, see source_notes.py) print as `//` comments above each kernel's func.func.
    `gpu_mapping` (kernel name -> loop var -> processor: block_x, thread_x, sequential, ...)
    prints those loops as `scf.parallel` with the upstream GPU mapping attribute
    (`#gpu.loop_dim_map`, what MLIR's convert-parallel-loops-to-gpu takes): the GPU variant."""
    kernels = list(kernels)
    seen: set[str] = set()
    for k in kernels:
        if k.name in seen:
            raise IRError(f"two kernels are named '{k.name}'; a module needs distinct names")
        seen.add(k.name)
        check_kernel(k)
    mapping = gpu_mapping or {}
    text = "module {\n" + "".join(_Printer(mapping.get(k.name)).kernel(k, depth=1) for k in kernels) + "}\n"
    return annotate(text, notes, "//") if notes else text


def mlir_type(dtype: DTypeLike) -> str:
    """`f32`, `i64`, `i1`, `index`."""
    return "index" if dtype == INDEX else dtype.mlir


def memref_type(buffer: Buffer) -> str:
    """`memref<4x?xf32>`; a 0-d buffer is `memref<f32>`."""
    dims = "".join(f"{d}x" if isinstance(d, int) else "?x" for d in buffer.shape)
    return f"memref<{dims}{buffer.dtype.mlir}>"


# --- expansions: ops that take more than one MLIR op --------------------------------------
def _identity(p: _Printer, args: list[str], t: DTypeLike, name: str | None) -> str:
    return args[0]


def _float_sign(p: _Printer, args: list[str], t: DTypeLike, name: str | None) -> str:
    x, ty = args[0], mlir_type(t)
    ones = p.op(f"math.copysign {p.const(1.0, t)}, {x} : {ty}")
    zero = p.const(0.0, t)
    nonzero = p.op(f"arith.cmpf one, {x}, {zero} : {ty}")      # false for 0, -0, NaN
    is_zero = p.op(f"arith.cmpf oeq, {x}, {zero} : {ty}")      # 0 and -0 stay, NaN -> 0
    rest = p.op(f"arith.select {is_zero}, {x}, {zero} : {ty}")
    return p.op(f"arith.select {nonzero}, {ones}, {rest} : {ty}", name)


def _int_sign(p: _Printer, args: list[str], t: DTypeLike, name: str | None) -> str:
    x, ty, zero = args[0], mlir_type(t), p.const(0, t)
    positive = p.op(f"arith.cmpi sgt, {x}, {zero} : {ty}")
    negative = p.op(f"arith.cmpi slt, {x}, {zero} : {ty}")
    one_or_zero = p.op(f"arith.select {positive}, {p.const(1, t)}, {zero} : {ty}")
    return p.op(f"arith.select {negative}, {p.const(-1, t)}, {one_or_zero} : {ty}", name)


def _int_neg(p: _Printer, args: list[str], t: DTypeLike, name: str | None) -> str:
    return p.op(f"arith.subi {p.const(0, t)}, {args[0]} : {mlir_type(t)}", name)


def _logical_not(p: _Printer, args: list[str], t: DTypeLike, name: str | None) -> str:
    return p.op(f"arith.xori {args[0]}, {p.const(True, t)} : i1", name)


def _int_mod(p: _Printer, args: list[str], t: DTypeLike, name: str | None) -> str:
    a, b, ty = args[0], args[1], mlir_type(t)                  # a - floordiv(a, b) * b
    quotient = p.op(f"arith.floordivsi {a}, {b} : {ty}")
    return p.op(f"arith.subi {a}, {p.op(f'arith.muli {quotient}, {b} : {ty}')} : {ty}", name)


def _float_mod(p: _Printer, args: list[str], t: DTypeLike, name: str | None) -> str:
    a, b, ty, zero = args[0], args[1], mlir_type(t), p.const(0.0, t)
    r = p.op(f"arith.remf {a}, {b} : {ty}")                     # the dividend's sign
    r_negative = p.op(f"arith.cmpf olt, {r}, {zero} : {ty}")
    b_negative = p.op(f"arith.cmpf olt, {b}, {zero} : {ty}")
    differ = p.op(f"arith.xori {r_negative}, {b_negative} : i1")
    nonzero = p.op(f"arith.cmpf one, {r}, {zero} : {ty}")
    fix = p.op(f"arith.andi {differ}, {nonzero} : i1")
    return p.op(f"arith.select {fix}, {p.op(f'arith.addf {r}, {b} : {ty}')}, {r} : {ty}", name)


def _int_fmod(p: _Printer, args: list[str], t: DTypeLike, name: str | None) -> str:
    a, b, ty = args[0], args[1], mlir_type(t)                  # y == 0 gives 0, as in the CPU code
    zero = p.const(0, t)
    b_zero = p.op(f"arith.cmpi eq, {b}, {zero} : {ty}")
    safe = p.op(f"arith.select {b_zero}, {p.const(1, t)}, {b} : {ty}")
    return p.op(f"arith.select {b_zero}, {zero}, {p.op(f'arith.remsi {a}, {safe} : {ty}')} : {ty}", name)


def _float_floordiv(p: _Printer, args: list[str], t: DTypeLike, name: str | None) -> str:
    ty = mlir_type(t)
    return p.op(f"math.floor {p.op(f'arith.divf {args[0]}, {args[1]} : {ty}')} : {ty}", name)


_MATH_UNARY = ("exp", "exp2", "expm1", "log", "log2", "log1p", "sin", "cos", "tan", "tanh", "erf",
               "sqrt", "rsqrt", "floor", "ceil")
_UNARY_BY_KIND: dict[str, dict[str, Lowering]] = {
    "f": {**{fn: f"math.{fn}" for fn in _MATH_UNARY},
          "neg": "arith.negf", "abs": "math.absf", "round": "math.roundeven", "sign": _float_sign},
    "i": {"neg": _int_neg, "abs": "math.absi", "sign": _int_sign,
          "floor": _identity, "ceil": _identity, "round": _identity},
    "b": {"sign": _identity, "not": _logical_not, "logical_not": _logical_not},
    "x": {},
}

_PREDICATES = {"f": ("arith.cmpf", ("oeq", "une", "olt", "ole", "ogt", "oge")),
               "i": ("arith.cmpi", ("eq", "ne", "slt", "sle", "sgt", "sge")),
               "x": ("arith.cmpi", ("eq", "ne", "slt", "sle", "sgt", "sge")),
               "b": ("arith.cmpi", ("eq", "ne", "ult", "ule", "ugt", "uge"))}
_BINARY_BY_KIND: dict[str, dict[str, Lowering]] = {
    "f": {"add": "arith.addf", "sub": "arith.subf", "mul": "arith.mulf", "div": "arith.divf",
          "pow": "math.powf", "maximum": "arith.maximumf", "minimum": "arith.minimumf",
          "atan2": "math.atan2", "floordiv": _float_floordiv, "mod": _float_mod,
          "fmod": "arith.remf"},
    "i": {"add": "arith.addi", "sub": "arith.subi", "mul": "arith.muli", "div": "arith.divsi",
          "pow": "math.ipowi", "maximum": "arith.maxsi", "minimum": "arith.minsi",
          "floordiv": "arith.floordivsi", "mod": _int_mod, "fmod": _int_fmod,
          "and": "arith.andi", "or": "arith.ori", "xor": "arith.xori"},
    "b": {"add": "arith.ori", "mul": "arith.andi", "maximum": "arith.ori", "minimum": "arith.andi",
          "and": "arith.andi", "or": "arith.ori", "xor": "arith.xori"},
}
_BINARY_BY_KIND["x"] = {fn: _BINARY_BY_KIND["i"][fn]
                        for fn in ("add", "sub", "mul", "floordiv", "mod", "maximum", "minimum")}
for _kind, (_cmp, _preds) in _PREDICATES.items():
    _BINARY_BY_KIND[_kind].update({fn: (_cmp, pred) for fn, pred in zip(COMPARISONS, _preds)})

UNARY_OPS: dict[tuple[str, str], Lowering] = {
    (fn, kind): low for kind, table in _UNARY_BY_KIND.items() for fn, low in table.items()}
BINARY_OPS: dict[tuple[str, str], Lowering] = {
    (fn, kind): low for kind, table in _BINARY_BY_KIND.items() for fn, low in table.items()}

# Casts by (source kind, target kind): an op name, "resize" (ext/trunc by width), "nonzero"
# (compare with 0), or a DType to go through.  A cast to the same dtype prints nothing.
_CASTS: dict[tuple[str, str], Union[str, DType]] = {
    ("f", "f"): "resize", ("i", "i"): "resize",
    ("i", "f"): "arith.sitofp", ("f", "i"): "arith.fptosi",
    ("b", "f"): "arith.uitofp", ("b", "i"): "arith.extui", ("b", "x"): "arith.index_castui",
    ("i", "x"): "arith.index_cast", ("x", "i"): "arith.index_cast",
    ("x", "f"): DType.int64, ("f", "x"): DType.int64,
    ("f", "b"): "nonzero", ("i", "b"): "nonzero", ("x", "b"): "nonzero",
}
_RESIZE = {"f": ("arith.extf", "arith.truncf"), "i": ("arith.extsi", "arith.trunci")}


def _float_literal(value: float, dtype: DType) -> str:
    """A decimal MLIR float literal (it needs a '.'), or the bit pattern for inf and NaN."""
    if not math.isfinite(value):
        packed = struct.pack(">f" if dtype == DType.float32 else ">d", value)
        return "0x" + packed.hex().upper()
    text = repr(float(value))
    return text if "." in text else text.replace("e", ".0e")


_BARE_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*\Z")


def _ssa_base(name: str) -> str:
    """`name` with characters MLIR does not allow in SSA names replaced by '_'."""
    base = re.sub(r"[^A-Za-z0-9_$.\-]", "_", name)
    return base if base and not base[0].isdigit() and base[0] != "-" else "v" + base


class _Scope:
    def __init__(self) -> None:
        self.names: dict[str, str] = {}              # IR name -> SSA value
        self.used: set[str] = set()                  # SSA names defined here


class _Printer:
    def __init__(self, gpu_mapping: dict[str, str] | None = None) -> None:
        self.gpu_mapping = gpu_mapping or {}              # loop var -> GPU processor
        self.lines: list[str] = []
        self.depth = 0
        self.scopes = [_Scope()]
        self.counter = 0
        self.ever: set[str] = set()                       # every SSA name of the function
        self.buffers: dict[str, tuple[str, str]] = {}     # IR name -> (SSA value, memref type)
        self.consts: dict[tuple[str, str], str] = {}      # (literal, type) -> SSA value
        self.const_lines: list[str] = []                  # hoisted to the function's entry
        self.memo: dict[int, tuple] = {}                  # id(expr) -> (expr, SSA value), per statement

    # --- names and lines -------------------------------------------------------------
    def taken(self, name: str, everywhere: bool) -> bool:
        return name in self.ever if everywhere else any(name in s.used for s in self.scopes)

    def fresh(self, base: str | None = None, everywhere: bool = False, scope: int = -1) -> str:
        """A new SSA value `%base` (or `%base_N`; `%vN` without a base), unique among the
        visible names, or among all names of the function if `everywhere`."""
        if base is None:
            while self.taken(f"v{self.counter}", everywhere):
                self.counter += 1
            name, self.counter = f"v{self.counter}", self.counter + 1
        else:
            name, n = _ssa_base(base), 0
            while self.taken(name, everywhere):
                name, n = f"{_ssa_base(base)}_{n}", n + 1
        self.scopes[scope].used.add(name)
        self.ever.add(name)
        return "%" + name

    def bind(self, ir_name: str, ssa: str) -> None:
        self.scopes[-1].names[ir_name] = ssa

    def lookup(self, ir_name: str) -> str:
        return next(s.names[ir_name] for s in reversed(self.scopes) if ir_name in s.names)

    def line(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    def op(self, text: str, name: str | None = None) -> str:
        """Emit `%result = text`; return the result."""
        result = self.fresh(name)
        self.line(f"{result} = {text}")
        return result

    def const(self, value: Union[int, float, bool], dtype: DTypeLike) -> str:
        """The SSA value of a constant; each is emitted once, at the function's entry."""
        ty, kind = mlir_type(dtype), dtype_kind(dtype)
        literal = {"b": lambda v: "true" if v else "false", "i": lambda v: str(int(v)),
                   "x": lambda v: str(int(v)), "f": lambda v: _float_literal(v, dtype)}[kind](value)
        if (literal, ty) not in self.consts:
            base = {"b": literal, "i": f"c{literal}_{ty}", "x": f"c{literal}", "f": "cst"}[kind]
            result = self.fresh(base, everywhere=True, scope=1)     # the function body's scope
            self.const_lines.append(f"{result} = arith.constant {literal}"
                                    + ("" if kind == "b" else f" : {ty}"))
            self.consts[(literal, ty)] = result
        return self.consts[(literal, ty)]

    def push(self) -> None:
        self.scopes.append(_Scope())
        self.depth += 1

    def pop(self) -> None:
        self.scopes.pop()
        self.depth -= 1

    # --- kernels and statements ------------------------------------------------------
    def kernel(self, k: Kernel, depth: int) -> str:
        """The `func.func` of `k`, its lines indented by `depth` levels."""
        self.depth, self.kernel_ir = depth, k
        args = []
        for b in k.buffers:
            self.buffers[b.name] = (self.fresh(b.name), memref_type(b))
            args.append(f"{self.buffers[b.name][0]}: {self.buffers[b.name][1]}")
        for size in k.sizes:
            self.bind(size, self.fresh(size))
            args.append(f"{self.lookup(size)}: index")
        symbol = k.name if _BARE_ID.match(k.name) else '"' + k.name.replace('"', '\\"') + '"'
        self.line(f"func.func @{symbol}({', '.join(args)}) {{")
        self.push()
        self.block(k.body)
        self.line("func.return")
        self.lines[1:1] = ["  " * (depth + 1) + c for c in self.const_lines]
        self.pop()
        self.line("}")
        return "\n".join(self.lines) + "\n"

    def block(self, stmts: list) -> None:
        outer = self.memo
        for s in stmts:
            self.memo = {}
            _STMT_RULES[type(s)](self, s)
        self.memo = outer

    def let(self, s: Let) -> None:
        self.bind(s.name, self.expr(s.value, s.name))

    def store(self, s: Store) -> None:
        value = self.expr(s.value)
        buf, ty = self.buffers[s.buffer]
        self.line(f"memref.store {value}, {buf}[{self.indices(s.index)}] : {ty}")

    def indices(self, index: tuple[Expr, ...]) -> str:
        return ", ".join(self.expr(i) for i in index)

    def extent(self, extent: Union[int, Expr]) -> str:
        """An int, or an index expression of size parameters."""
        return self.const(extent, INDEX) if isinstance(extent, int) else self.expr(extent)

    def loop(self, s: Loop) -> None:
        lo, hi, step = self.const(0, INDEX), self.extent(s.extent), self.const(1, INDEX)
        self.push()
        var = self.fresh(s.var)
        self.bind(s.var, var)
        processor = self.gpu_mapping.get(s.var)
        header = (f"scf.parallel ({var}) = ({lo}) to ({hi}) step ({step}) {{" if s.parallel or processor
                  else f"scf.for {var} = {lo} to {hi} step {step} {{")
        self.lines.append("  " * (self.depth - 1) + header)
        self.block(s.body)
        self.pop()
        self.line("}" + (f" {{mapping = [#gpu.loop_dim_map<processor = {processor}, map = (d0) -> (d0), "
                         f"bound = (d0) -> (d0)>]}}" if processor else ""))

    def reduce(self, s: Reduce) -> None:
        inits = [self.expr(a.init) for a in s.accumulators]
        lo, hi, step = self.const(0, INDEX), self.extent(s.extent), self.const(1, INDEX)
        results = [self.fresh(a.name) for a in s.accumulators]
        types = ", ".join(mlir_type(a.dtype) for a in s.accumulators)
        self.push()
        var = self.fresh(s.var)
        self.bind(s.var, var)
        carried = []
        for a, init in zip(s.accumulators, inits):
            self.bind(a.name, self.fresh(f"{a.name}_iter"))
            carried.append(f"{self.lookup(a.name)} = {init}")
        header = f"scf.for {var} = {lo} to {hi} step {step}"
        if results:
            header = f"{', '.join(results)} = {header} iter_args({', '.join(carried)}) -> ({types})"
        self.lines.append("  " * (self.depth - 1) + header + " {")
        self.block(s.body)
        if results:
            updates = [self.expr(u, f"{a.name}_next") for a, u in zip(s.accumulators, s.update)]
            self.line(f"scf.yield {', '.join(updates)} : {types}")
        self.pop()
        self.line("}")
        for a, result in zip(s.accumulators, results):
            self.bind(a.name, result)

    def pack_b(self, s: PackB) -> None:
        """A comment: packing changes no value the loops read (Matmul.b_packed)."""
        self.line(f"// pack {s.b.buffer} ({s.k}x{s.n}) into {s.buffer}, for the packed matmul kernel")

    def matmul(self, s: Matmul) -> None:
        """The loop expansion, reading and writing 1-D views of the three buffers."""
        for name in dict.fromkeys(v.buffer for v in s.views()):
            buf = self.kernel_ir.buffer(name)
            ssa, ty = self.buffers[name]
            dynamic = [self.extent(d) for d in buf.shape if not isinstance(d, int)]
            size = str(math.prod(d for d in buf.shape if isinstance(d, int)))
            if dynamic:
                size = self.const(int(size), INDEX)
                for d in dynamic:
                    size = self.op(f"arith.muli {size}, {d} : index")
            flat_ty = f"memref<{'?' if dynamic else size}x{buf.dtype.mlir}>"
            flat = self.op(f"memref.reinterpret_cast {ssa} to offset: [0], sizes: [{size}], "
                           f"strides: [1] : {ty} to {flat_ty}", f"{name}_flat")
            self.buffers[flat_name(name)] = (flat, flat_ty)
        self.block(expand_matmul(s, self.kernel_ir.buffer(s.out.buffer).dtype,
                                 operand_dtypes=operand_dtypes(self.kernel_ir, s)))

    # --- expressions -----------------------------------------------------------------
    def expr(self, e: Expr, name: str | None = None) -> str:
        """Emit `e`; the op that computes it is named `name` when given.  An expression
        object met again within the statement is its first SSA value (a shared
        subexpression prints once; within one statement every load precedes the store)."""
        if id(e) not in self.memo:
            self.memo[id(e)] = (e, _EXPR_RULES[type(e)](self, e, name))
        return self.memo[id(e)][1]

    def e_const(self, e: Const, name: str | None) -> str:
        return self.const(e.value, e.dtype)

    def e_var(self, e: Var, name: str | None) -> str:
        return self.lookup(e.name)

    def e_load(self, e: Load, name: str | None) -> str:
        buf, ty = self.buffers[e.buffer]
        return self.op(f"memref.load {buf}[{self.indices(e.index)}] : {ty}", name)

    def e_guarded_load(self, e: GuardedLoad, name: str | None) -> str:
        """`scf.if` on the guard, loading only where it holds (indices computed before it)."""
        guard, indices = self.expr(e.guard), self.indices(e.index)
        buf, ty = self.buffers[e.buffer]
        t, zero = mlir_type(e.dtype), self.const(0, e.dtype)
        result = self.fresh(name)
        self.line(f"{result} = scf.if {guard} -> ({t}) {{")
        self.depth += 1
        loaded = self.fresh(None)
        self.line(f"{loaded} = memref.load {buf}[{indices}] : {ty}")
        self.line(f"scf.yield {loaded} : {t}")
        self.depth -= 1
        self.line("} else {")
        self.line(f"  scf.yield {zero} : {t}")
        self.line("}")
        return result

    def e_unary(self, e: Unary, name: str | None) -> str:
        x = self.expr(e.x)
        return self.apply(UNARY_OPS[(e.fn, dtype_kind(e.x.dtype))], [x], e.x.dtype, name)

    def e_binary(self, e: Binary, name: str | None) -> str:
        a, b = self.expr(e.a), self.expr(e.b)
        return self.apply(BINARY_OPS[(e.fn, dtype_kind(e.a.dtype))], [a, b], e.a.dtype, name)

    def apply(self, low: Lowering, args: list[str], t: DTypeLike, name: str | None) -> str:
        """Emit one table entry on operands of dtype `t`."""
        if callable(low):
            return low(self, args, t, name)
        if isinstance(low, tuple):
            return self.op(f"{low[0]} {low[1]}, {', '.join(args)} : {mlir_type(t)}", name)
        return self.op(f"{low} {', '.join(args)} : {mlir_type(t)}", name)

    def e_select(self, e: Select, name: str | None) -> str:
        c, a, b = self.expr(e.cond), self.expr(e.a), self.expr(e.b)
        return self.op(f"arith.select {c}, {a}, {b} : {mlir_type(e.dtype)}", name)

    def e_checked_index(self, e: CheckedIndex, name: str | None) -> str:
        """Record an out-of-range index in the error buffer (loops/ir.py), then clamp it."""
        i, size = self.expr(e.index), self.extent(e.size)
        buf, ty = self.buffers[e.buffer]
        bad = self.op(f"arith.cmpi uge, {i}, {size} : index")
        one = self.const(1, DType.int64)
        self.line(f"scf.if {bad} {{")
        self.depth += 1
        value = self.op(f"arith.index_cast {i} : index to i64")
        for slot, how, x in ((2 + 2 * e.check, "maxu", value), (1 + 2 * e.check, "ori", one), (0, "ori", one)):
            self.op(f"memref.atomic_rmw {how} {x}, {buf}[{self.const(slot, INDEX)}] : (i64, {ty}) -> i64")
        self.depth -= 1
        self.line("}")
        zero = self.const(0, INDEX)
        hi = self.const(max(e.size - 1, 0), INDEX) if isinstance(e.size, int) else \
            self.op(f"arith.subi {size}, {self.const(1, INDEX)} : index")
        low = self.op(f"arith.maxsi {i}, {zero} : index")
        return self.op(f"arith.minsi {low}, {hi} : index", name)

    def e_cast(self, e: Cast, name: str | None) -> str:
        return self.cast(self.expr(e.x), e.x.dtype, e.dtype, name)

    def cast(self, x: str, src: DTypeLike, dst: DTypeLike, name: str | None = None) -> str:
        if src == dst:
            return x
        how = _CASTS.get((dtype_kind(src), dtype_kind(dst)))
        if isinstance(how, DType):
            return self.cast(self.cast(x, src, how), how, dst, name)
        if how == "nonzero":
            ne = BINARY_OPS[("ne", dtype_kind(src))]
            return self.apply(ne, [x, self.const(0, src)], src, name)
        if how == "resize":
            how = _RESIZE[dtype_kind(src)][0 if dst.itemsize > src.itemsize else 1]
        if how == "arith.fptosi":
            return self.float_to_int(x, src, dst, name)
        return self.op(f"{how} {x} : {mlir_type(src)} to {mlir_type(dst)}", name)

    def float_to_int(self, x: str, src: DTypeLike, dst: DTypeLike, name: str | None) -> str:
        """Truncation of the values in range; INT_MIN for NaN, infinities and the rest."""
        ty, width = mlir_type(src), 8 * dst.itemsize
        low, high = self.const(-float(2 ** (width - 1)), src), self.const(float(2 ** (width - 1)), src)
        valid = self.op(f"arith.andi {self.op(f'arith.cmpf oge, {x}, {low} : {ty}')}, "
                        f"{self.op(f'arith.cmpf olt, {x}, {high} : {ty}')} : i1")
        safe = self.op(f"arith.select {valid}, {x}, {self.const(0.0, src)} : {ty}")
        converted = self.op(f"arith.fptosi {safe} : {ty} to {mlir_type(dst)}")
        return self.op(f"arith.select {valid}, {converted}, {self.const(-(2 ** (width - 1)), dst)} : "
                       f"{mlir_type(dst)}", name)


_STMT_RULES: dict[type, Callable] = {Let: _Printer.let, Store: _Printer.store,
                                     Loop: _Printer.loop, Reduce: _Printer.reduce,
                                     Matmul: _Printer.matmul, PackB: _Printer.pack_b}
_EXPR_RULES: dict[type, Callable] = {Const: _Printer.e_const, Var: _Printer.e_var,
                                     Load: _Printer.e_load, GuardedLoad: _Printer.e_guarded_load,
                                     Unary: _Printer.e_unary,
                                     Binary: _Printer.e_binary, Select: _Printer.e_select,
                                     Cast: _Printer.e_cast, CheckedIndex: _Printer.e_checked_index}
