"""A small, safe subset of Python for the formulas in ops.yaml (and derivatives.yaml).

Elementwise semantics are expressions (`self + alpha * other`); composite ops are short
programs (assignments, `if`, `return`).  Text is parsed once with `ast` into the
dataclasses below; anything outside the subset is refused with its line and column.
Evaluation is host-agnostic: operators use Python's operator module on whatever
values the host passes (Tensors, NumPy arrays, IR builders), and calls go to a
`call(name, args, kwargs)` callback, so one formula serves eager, traced and compiled code.
"""
from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..core.errors import TableError

BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
          ast.Div: operator.truediv, ast.Pow: operator.pow, ast.MatMult: operator.matmul,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
          ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor}
UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_, ast.Invert: operator.invert}
COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not}


class Expr:
    """Base of the expression tree."""


@dataclass(frozen=True)
class Const(Expr):
    value: Any


@dataclass(frozen=True)
class Name(Expr):
    id: str


@dataclass(frozen=True)
class Attr(Expr):
    target: Expr
    attr: str


@dataclass(frozen=True)
class Index(Expr):
    target: Expr
    index: Expr


@dataclass(frozen=True)
class Call(Expr):
    func: str
    args: tuple[Expr, ...]
    kwargs: tuple[tuple[str, Expr], ...] = ()
    target: Expr | None = None      # `x.sum(1)` is Call("sum", (1,), target=x)


@dataclass(frozen=True)
class BinOp(Expr):
    op: Callable
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Unary(Expr):
    op: Callable
    operand: Expr


@dataclass(frozen=True)
class Compare(Expr):
    op: Callable
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Logic(Expr):
    is_and: bool
    values: tuple[Expr, ...]


@dataclass(frozen=True)
class IfExp(Expr):
    test: Expr
    body: Expr
    orelse: Expr


@dataclass(frozen=True)
class Seq(Expr):
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Comprehension(Expr):
    """`[elt for var in source]`: one generator, no conditions."""
    elt: Expr
    var: str
    source: Expr


@dataclass(frozen=True)
class Assign:
    targets: tuple[str, ...]    # `a, b = ...` unpacks
    value: Expr


@dataclass(frozen=True)
class Return:
    value: Expr


@dataclass(frozen=True)
class If:
    test: Expr
    body: tuple
    orelse: tuple


class _Converter:
    def __init__(self, where: str):
        self.where = where

    def fail(self, node: ast.AST, what: str):
        raise TableError(f"{what} (at formula line {getattr(node, 'lineno', '?')}, "
                         f"column {getattr(node, 'col_offset', 0) + 1})", entry=self.where)

    def expr(self, n: ast.AST) -> Expr:
        if isinstance(n, ast.Constant):
            return Const(n.value)
        if isinstance(n, ast.Name):
            return Name(n.id)
        if isinstance(n, ast.Attribute):
            return Attr(self.expr(n.value), n.attr)
        if isinstance(n, ast.Subscript):
            return Index(self.expr(n.value), self.expr(n.slice))
        if isinstance(n, ast.BinOp) and type(n.op) in BINARY:
            return BinOp(BINARY[type(n.op)], self.expr(n.left), self.expr(n.right))
        if isinstance(n, ast.UnaryOp) and type(n.op) in UNARY:
            return Unary(UNARY[type(n.op)], self.expr(n.operand))
        if isinstance(n, ast.Compare) and len(n.ops) == 1 and type(n.ops[0]) in COMPARE:
            return Compare(COMPARE[type(n.ops[0])], self.expr(n.left), self.expr(n.comparators[0]))
        if isinstance(n, ast.BoolOp):
            return Logic(isinstance(n.op, ast.And), tuple(self.expr(v) for v in n.values))
        if isinstance(n, ast.IfExp):
            return IfExp(self.expr(n.test), self.expr(n.body), self.expr(n.orelse))
        if isinstance(n, (ast.Tuple, ast.List)):
            return Seq(tuple(self.expr(e) for e in n.elts))
        if isinstance(n, ast.Call):
            return self.call(n)
        if (isinstance(n, ast.ListComp) and len(n.generators) == 1 and not n.generators[0].ifs
                and isinstance(n.generators[0].target, ast.Name)):
            g = n.generators[0]
            return Comprehension(self.expr(n.elt), g.target.id, self.expr(g.iter))
        self.fail(n, f"'{ast.unparse(n)}' is not allowed in a formula")

    def call(self, n: ast.Call) -> Call:
        if any(k.arg is None for k in n.keywords) or any(isinstance(a, ast.Starred) for a in n.args):
            self.fail(n, "*args/**kwargs are not allowed in a formula")
        args = tuple(self.expr(a) for a in n.args)
        kwargs = tuple((k.arg, self.expr(k.value)) for k in n.keywords)
        if isinstance(n.func, ast.Name):
            return Call(n.func.id, args, kwargs)
        if isinstance(n.func, ast.Attribute):
            return Call(n.func.attr, args, kwargs, self.expr(n.func.value))
        self.fail(n, f"cannot call '{ast.unparse(n.func)}'")

    def stmt(self, n: ast.stmt):
        if isinstance(n, ast.Assign) and len(n.targets) == 1:
            t = n.targets[0]
            names = t.elts if isinstance(t, ast.Tuple) else [t]
            if not all(isinstance(x, ast.Name) for x in names):
                self.fail(n, "only names can be assigned to")
            return Assign(tuple(x.id for x in names), self.expr(n.value))
        if isinstance(n, ast.Return) and n.value is not None:
            return Return(self.expr(n.value))
        if isinstance(n, ast.If):
            return If(self.expr(n.test), self.block(n.body), self.block(n.orelse))
        self.fail(n, f"statement '{ast.unparse(n).splitlines()[0]}' is not allowed in a formula")

    def block(self, body: list[ast.stmt]) -> tuple:
        return tuple(self.stmt(s) for s in body)


def _parse(text: str, mode: str, where: str) -> ast.AST:
    try:
        return ast.parse(text.strip(), mode=mode)
    except SyntaxError as e:
        raise TableError(f"formula is not valid Python: {e.msg} (at formula line {e.lineno}, "
                         f"column {e.offset})", entry=where) from None


def parse_expr(text: str, where: str = "") -> Expr:
    """Parse one expression, e.g. `self * sigmoid(self)`."""
    return _Converter(where).expr(_parse(f"(\n{text.strip()}\n)", "eval", where).body)


def parse_program(text: str, where: str = "") -> tuple:
    """Parse statements ending in `return`; a single expression is accepted as its own return."""
    module = _parse(text, "exec", where)
    conv = _Converter(where)
    if len(module.body) == 1 and isinstance(module.body[0], ast.Expr):
        return (Return(conv.expr(module.body[0].value)),)
    program = conv.block(module.body)
    if not program or not isinstance(program[-1], (Return, If)):
        raise TableError("a composite program must end with 'return'", entry=where)
    return program


_METADATA_ATTRS = ("shape", "dtype", "ndim")
_METADATA_CALLS = ("dim", "size", "numel")


def free_names(node, values_only: bool = False) -> set[str]:
    """Names read (not assigned) and functions called by a formula or program.  With
    `values_only`, a name read only for its metadata (`self.shape`, `self.dim()`) is left out."""
    reads, calls, assigned = set(), set(), set()

    def metadata(x) -> bool:
        return values_only and isinstance(getattr(x, "target", None), Name) and (
            (isinstance(x, Attr) and x.attr in _METADATA_ATTRS)
            or (isinstance(x, Call) and x.func in _METADATA_CALLS and not x.args))

    def visit(x):
        if metadata(x):
            return
        if isinstance(x, Name):
            if x.id not in assigned:
                reads.add(x.id)
        elif isinstance(x, Call):
            if x.target is None:
                calls.add(x.func)
            else:
                visit(x.target)
            for a in x.args:
                visit(a)
            for _, a in x.kwargs:
                visit(a)
        elif isinstance(x, Comprehension):
            assigned.add(x.var)
            visit(x.source)
            visit(x.elt)
        elif isinstance(x, Assign):
            visit(x.value)
            assigned.update(x.targets)
        elif isinstance(x, (tuple, list)):
            for y in x:
                visit(y)
        elif hasattr(x, "__dataclass_fields__"):
            for f in x.__dataclass_fields__:
                v = getattr(x, f)
                if isinstance(v, (Expr, tuple, Assign, Return, If)):
                    visit(v)
    visit(node)
    return reads | {f"{c}()" for c in calls}


class Evaluator:
    """Evaluates trees against an environment of names and a `call` callback."""

    def __init__(self, env: dict[str, Any], call: Callable[[str, list, dict], Any]):
        self.env = dict(env)
        self.call_fn = call

    def eval(self, e: Expr) -> Any:
        method = getattr(self, "_" + type(e).__name__)
        return method(e)

    def _Const(self, e):
        return e.value

    def _Name(self, e):
        try:
            return self.env[e.id]
        except KeyError:
            raise NameError(f"formula uses unknown name '{e.id}'") from None

    def _Attr(self, e):
        return getattr(self.eval(e.target), e.attr)

    def _Index(self, e):
        return self.eval(e.target)[self.eval(e.index)]

    def _Call(self, e):
        args = [self.eval(a) for a in e.args]
        kwargs = {k: self.eval(v) for k, v in e.kwargs}
        if e.target is not None:
            return getattr(self.eval(e.target), e.func)(*args, **kwargs)
        return self.call_fn(e.func, args, kwargs)

    def _BinOp(self, e):
        left, right = self.eval(e.left), self.eval(e.right)
        try:
            return e.op(left, right)
        except ZeroDivisionError:   # Python numbers folded (a scalar argument): IEEE's inf or nan, as kernels give
            with np.errstate(all="ignore"):
                return float(e.op(np.float64(left), np.float64(right)))

    def _Unary(self, e):
        return e.op(self.eval(e.operand))

    def _Compare(self, e):
        return e.op(self.eval(e.left), self.eval(e.right))

    def _Logic(self, e):
        value = None
        for v in e.values:
            value = self.eval(v)
            if bool(value) != e.is_and:
                return value
        return value

    def _IfExp(self, e):
        return self.eval(e.body) if self.eval(e.test) else self.eval(e.orelse)

    def _Seq(self, e):
        return [self.eval(x) for x in e.items]

    def _Comprehension(self, e):
        out = []
        for item in self.eval(e.source):
            self.env[e.var] = item
            out.append(self.eval(e.elt))
        return out

    def run(self, program: tuple) -> Any:
        """Run statements; returns the value of the `return` reached."""
        for s in program:
            if isinstance(s, Assign):
                value = self.eval(s.value)
                if len(s.targets) == 1:
                    self.env[s.targets[0]] = value
                else:
                    self.env.update(zip(s.targets, value, strict=True))
            elif isinstance(s, Return):
                return _Returned(self.eval(s.value))
            else:
                out = self.run(s.body if self.eval(s.test) else s.orelse)
                if isinstance(out, _Returned):
                    return out
        return None

    def run_program(self, program: tuple) -> Any:
        out = self.run(program)
        if not isinstance(out, _Returned):
            raise TableError("composite program finished without 'return'")
        return out.value


@dataclass
class _Returned:
    value: Any
