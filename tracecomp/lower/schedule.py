"""Scheduling a verified, decomposed graph into loop-IR kernels: the fusion decisions.

A value gets a buffer (is *materialized*) when it is a function output, the result of a
reduction or matmul, a random draw (filled by the runtime), a non-splat constant, or an
elementwise value read by more than one op (computing it once beats recomputing it).
Every other value is inlined into its consumers' loops: chains of elementwise ops with
their broadcasts and views fuse into one loop nest, and a reduction's producers fuse
into the reduction's loop.  One kernel per materialized op, in graph order; then a
matmul's lone pointwise consumer folds into it as its epilogue (schedule_matmul.py).

`Program.kernel_ops` records, per kernel, the graph ops it computes (the materialized op
and every op inlined into its loops), and kernel names lead back to the user's code:
`k3_mlp_py18_sub_exp` is kernel 3, computing tc.sub and tc.exp, stored at mlp.py line 18.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

import numpy as np

from .. import dtypes as dt
from ..ir import Graph, Op, Value
from ..ops import rules
from ..ops.table import by_ir_name
from . import index_maps as I
from . import loops as L
from .exprs import cast, const
from .pointwise import CONSTANT, VIEW_KINDS, Inliner
from .schedule_matmul import fuse_epilogues, matmul_body

PARALLEL_MIN_WORK = 1 << 15        # smaller loop nests stay on one core
REDUCE_KINDS = ("reduction", "arg_reduction", "variance", "matmul", "scatter_add", "index_add")


@dataclass
class HostFill:
    """A buffer the runtime fills before the kernels run (random draws)."""
    buffer: str
    impl: str          # "uniform" | "normal"
    dtype: dt.DType
    shape: tuple[int, ...]


@dataclass(frozen=True)
class IndexCheck:
    """A function input whose values index a dim (gather, index_select, scatter): checked
    before the kernels run, so a bad index raises instead of reading out of bounds."""
    op: str
    dim: int
    size: int
    loc: object = None


@dataclass
class Program:
    name: str
    kernels: list[L.Kernel]
    buffers: dict[str, L.Buffer]               # every buffer; roles input/output/temp/constant
    inputs: list[str]                          # buffer of each function input
    outputs: list[str]                         # buffer of each function output (may repeat)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    fills: list[HostFill] = field(default_factory=list)
    index_checks: dict[str, list[IndexCheck]] = field(default_factory=dict)   # by input buffer
    kernel_ops: dict[str, list[Op]] = field(default_factory=dict)  # kernel -> graph ops, graph order


def short_location(op: Op) -> str:
    """`mlp_py18` for an op at mlp.py:18: an identifier fragment ("" without a location)."""
    if op.loc is None:
        return ""
    stem, ext = os.path.splitext(os.path.basename(op.loc.file))
    stem = re.sub(r"[^A-Za-z0-9_]", "_", stem).strip("_")[:16] or "src"
    return f"{stem}_{ext.lstrip('.')[:4] or 'l'}{op.loc.line}"


def kernel_name(number: int, ops: list[Op]) -> str:
    """`k{number}_{where}_{what}`: where the kernel's last op was called, and the names of
    the ops it computes (views and casts left out; at most three: first, second, last)."""
    table = by_ir_name()
    names: list[str] = []
    for op in ops:
        short = op.name.split(".")[-1]
        kind = table[op.name].kind if op.name in table else None
        if kind not in VIEW_KINDS + ("cast",) and short not in names:
            names.append(short)
    if len(names) > 3:
        names = names[:2] + names[-1:]
    if not names:           # only views: name the last one
        names = [ops[-1].name.split(".")[-1] if ops else "copy"]
    where = short_location(ops[-1]) if ops else ""
    return "_".join(p for p in (f"k{number}", where, *names) if p)


def _materialized(graph: Graph) -> set[Value]:
    table = by_ir_name()
    uses: dict[Value, int] = {}
    for op in graph.ops:
        for v in op.operands:
            uses[v] = uses.get(v, 0) + 1
    keep = set(graph.outputs)
    for op in graph.ops:
        if op.name == CONSTANT:
            continue
        opdef = table[op.name]
        if opdef.kind in REDUCE_KINDS or opdef.kind == "random":
            keep.update(op.results)
        elif opdef.kind not in VIEW_KINDS:
            keep.update(r for r in op.results if uses.get(r, 0) > 1 and r.type.numel > 1)
    return keep


class Scheduler:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.table = by_ir_name()
        self.buffers: dict[str, L.Buffer] = {}
        self.names: dict[Value, str] = {}
        self.program = Program(graph.name, [], self.buffers, [], [])
        self._order = {op: i for i, op in enumerate(graph.ops)}

    def _buffer(self, v: Value, role: str, prefix: str) -> str:
        name = f"{prefix}{sum(1 for b in self.buffers.values() if b.role == role)}"
        self.buffers[name] = L.Buffer(name, v.type.dtype, v.type.shape, role)
        self.names[v] = name
        return name

    def run(self) -> Program:
        g, p = self.graph, self.program
        p.inputs = [self._buffer(v, "input", "in") for v in g.inputs]
        keep = _materialized(g)
        for op in g.ops:
            if op.name == CONSTANT:
                self._constant(op)
            elif any(r in keep and r not in self.names for r in op.results):
                for r in op.results:
                    if r in keep or len(op.results) > 1 and self.table[op.name].kind in REDUCE_KINDS:
                        self._buffer(r, "temp", "t")
        for v in g.outputs:           # outputs are computed straight into their own buffers
            if v in self.names and self.buffers[self.names[v]].role == "temp":
                b = self.buffers[self.names[v]]
                self.buffers[b.name] = L.Buffer(b.name, b.dtype, b.shape, "output")
        self.inliner = Inliner(self.names)
        for op in g.ops:
            if op.name != CONSTANT and any(r in self.names for r in op.results):
                self._emit(op)
        p.outputs = [self._output_buffer(v) for v in g.outputs]
        fuse_epilogues(p)
        self._mark_index_inputs()
        return p

    def _constant(self, op: Op) -> None:
        value = op.attrs["value"]
        flat = value.reshape(-1)
        splat = flat.size == 0 or np.array_equal(flat, np.full_like(flat, flat[0]),
                                                 equal_nan=flat.dtype.kind == "f")
        if not splat:
            name = self._buffer(op.result, "constant", "c")
            self.program.constants[name] = np.array(value, copy=True, order="C")

    def _output_buffer(self, v: Value) -> str:
        if v in self.names:
            return self.names[v]
        # a splat constant returned directly: give it a buffer filled once
        name = self._buffer(v, "constant", "c")
        self.program.constants[name] = np.array(v.op.attrs["value"], copy=True, order="C")
        return name

    def _emit(self, op: Op) -> None:
        opdef = self.table[op.name]
        if opdef.kind == "random":
            r = op.result
            self.program.fills.append(HostFill(self.names[r], opdef.impl, r.type.dtype, r.type.shape))
            return
        builder = {"reduction": _reduction, "arg_reduction": _arg_reduction, "variance": _variance,
                   "matmul": _matmul, "scatter_add": _scatter, "index_add": _scatter}.get(opdef.kind, _pointwise)
        body = builder(self, op, opdef.arguments_from(op.operands, op.attrs))
        self.add_kernel(self.inlined_ops([op]), body)

    def add_kernel(self, ops: list[Op], body: list) -> L.Kernel:
        """Append the kernel running `body`, which computes `ops` (graph order), named after them."""
        kernel = L.Kernel(kernel_name(len(self.program.kernels), ops), self._kernel_buffers(body), body)
        self.program.kernels.append(kernel)
        self.program.kernel_ops[kernel.name] = ops
        return kernel

    def inlined_ops(self, roots: list[Op]) -> list[Op]:
        """`roots` and every op the inliner folds into their loops: producers, through
        operands, up to materialized values, inputs and constants.  In graph order."""
        found, stack = set(roots), [v for op in roots for v in op.operands]
        while stack:
            v = stack.pop()
            if v in self.names or v.op is None or v.op.name == CONSTANT or v.op in found:
                continue
            found.add(v.op)
            stack.extend(v.op.operands)
        return sorted(found, key=self._order.__getitem__)

    def _kernel_buffers(self, body: list) -> list[L.Buffer]:
        loads, stores = set(), set()
        _collect_buffers(body, loads, stores)
        out = []
        for name, b in self.buffers.items():
            if name in stores:
                out.append(L.Buffer(name, b.dtype, b.shape, "output"))
            elif name in loads:
                out.append(L.Buffer(name, b.dtype, b.shape, "input"))
        return out

    def _mark_index_inputs(self) -> None:
        """Function inputs that reach gather/index_select indices through views or casts: the
        runtime bounds-checks them, so out-of-range indices raise as they do eagerly."""
        for op in self.graph.ops:
            opdef = self.table.get(op.name)
            if opdef is None or opdef.kind not in ("gather", "index_select", "scatter_add", "index_add"):
                continue
            args = opdef.arguments_from(op.operands, op.attrs)
            src, idx = args["self"].type, self._view_source(args["index"])
            if idx in self.names and self.buffers[self.names[idx]].role == "input":
                dim = args["dim"] % src.ndim if src.ndim else 0
                check = IndexCheck(opdef.full_name, dim, src.shape[dim] if src.ndim else 1, op.loc)
                self.program.index_checks.setdefault(self.names[idx], []).append(check)

    def _view_source(self, v: Value) -> Value:
        while v.op is not None and v.op.name != CONSTANT and \
                self.table[v.op.name].kind in VIEW_KINDS + ("cast",) and v not in self.names:
            v = v.op.operands[0]
        return v


def schedule(graph: Graph) -> Program:
    return Scheduler(graph).run()


# ---------------------------------------------------------------- loop nests

def _loops(shape: tuple[int, ...], inner, prefix: str = "i") -> list:
    """Nested Loops over `shape`; `inner(index)` gives the innermost statements.
    The outermost loop is parallel when the nest is big enough to pay for threads."""
    index = tuple(L.Var(f"{prefix}{d}", L.INDEX) for d in range(len(shape)))
    body = inner(index)
    for d in reversed(range(len(shape))):
        body = [L.Loop(f"{prefix}{d}", shape[d], body)]
    if shape and math.prod(shape) >= PARALLEL_MIN_WORK and shape[0] > 1:
        body[0].parallel = True
    return body


def _collect_buffers(body, loads: set, stores: set) -> None:
    def expr(e):
        if isinstance(e, L.Load):
            loads.add(e.buffer)
        for f in ("index", "x", "a", "b", "cond"):
            sub = getattr(e, f, None)
            if isinstance(sub, tuple):
                for s in sub:
                    expr(s)
            elif isinstance(sub, L.Expr):
                expr(sub)
    for s in body:
        if isinstance(s, L.Store):
            stores.add(s.buffer)
            for i in s.index:
                expr(i)
            expr(s.value)
        elif isinstance(s, L.Let):
            expr(s.value)
        elif isinstance(s, L.Loop):
            _collect_buffers(s.body, loads, stores)
        elif isinstance(s, L.Reduce):
            for a in s.accumulators:
                expr(a.init)
            _collect_buffers(s.body, loads, stores)
            for u in s.update:
                expr(u)
        elif isinstance(s, L.Matmul):
            loads.update((s.a.buffer, s.b.buffer))
            stores.update(b for b in (s.out.buffer, s.workspace) if b is not None)
            for e in (s.epilogue, *(x for v in s.views() for x in (v.offset, *v.strides))):
                if e is not None:
                    expr(e)


def _pointwise(sched: Scheduler, op: Op, args: dict) -> list:
    """One loop nest per stored result (split stores several pieces)."""
    body = []
    for k, r in enumerate(op.results):
        if r in sched.names:
            def inner(index, k=k, r=r):
                return [L.Store(sched.names[r], index, sched.inliner.op_at(op, k, index))]
            body += _loops(r.type.shape, inner, prefix=f"i{k}_" if len(op.results) > 1 else "i")
    return body


def _reduced_index(out_index, in_shape, dims, keepdim, r: L.Var):
    """The input index of a reduction: reduced dims walk the flattened reduce var `r`."""
    dims = sorted(dims)
    red = iter(I.delinearize(r, tuple(in_shape[d] for d in dims)))
    outs = iter(out_index)
    index = []
    for d in range(len(in_shape)):
        if d in dims:
            index.append(next(red))
            if keepdim:
                next(outs)
        else:
            index.append(next(outs))
    return tuple(index)


_LIMITS = {"amax": lambda t: -math.inf if t.is_floating_point else (False if t is dt.BOOL else np.iinfo(t.np).min),
           "amin": lambda t: math.inf if t.is_floating_point else (True if t is dt.BOOL else np.iinfo(t.np).max)}
_COMBINE = {"sum": "add", "mean": "add", "prod": "mul", "amax": "maximum", "amin": "minimum",
            "all": "and", "any": "or"}
_INIT = {"sum": 0, "mean": 0, "prod": 1, "all": True, "any": False}


def _reduce_loop(sched, x: Value, dims, keepdim, out_index, accs, update):
    """A Reduce over `dims` of `x`: `update(accs, value)` gives the accumulators' new values."""
    r = L.Var("r", L.INDEX)
    value = sched.inliner.value_at(x, _reduced_index(out_index, x.type.shape, dims, keepdim, r))
    extent = math.prod(x.type.shape[d] for d in dims)
    return L.Reduce("r", extent, accs, [L.Let("x", value)], update([L.Var(a.name, a.dtype) for a in accs],
                                                                   L.Var("x", value.dtype), r))


def _reduction(sched: Scheduler, op: Op, args: dict) -> list:
    opdef, x, out = sched.table[op.name], args["self"], op.result.type
    dims = rules.normalize_dims(opdef, args.get("dim"), x.type.ndim)
    keep, impl, acc_t = bool(args.get("keepdim")), opdef.impl, out.dtype
    init = _LIMITS[impl](acc_t) if impl in _LIMITS else _INIT[impl]

    def update(accs, v, r):
        return [L.Binary(_COMBINE[impl], accs[0], cast(v, acc_t), acc_t)]

    def inner(index):
        loop = _reduce_loop(sched, x, dims, keep, index, [L.Accumulator("acc", acc_t, const(init, acc_t))], update)
        value: L.Expr = L.Var("acc", acc_t)
        if impl == "mean":
            n = math.prod(x.type.shape[d] for d in dims)
            value = L.Binary("div", value, const(n, acc_t), acc_t)
        return [loop, L.Store(sched.names[op.result], index, value)]
    return _loops(out.shape, inner)


def _arg_reduction(sched: Scheduler, op: Op, args: dict) -> list:
    """argmax/argmin and max.dim/min.dim: the first extreme element; NaN counts as extreme."""
    opdef, x = sched.table[op.name], args["self"]
    t = x.type.dtype
    dim = args.get("dim")
    dims = tuple(range(x.type.ndim)) if dim is None else ((dim % x.type.ndim,) if x.type.ndim else ())
    keep = bool(args.get("keepdim")) and (dim is not None or x.type.ndim > 0)
    better = "gt" if opdef.impl == "max" else "lt"
    limit = _LIMITS["amax" if opdef.impl == "max" else "amin"](t)

    def update(accs, v, r):
        take: L.Expr = L.Binary(better, v, accs[0], dt.BOOL)
        if t.is_floating_point:   # NaN wins, once
            nan_now = L.Binary("and", L.Binary("ne", v, v, dt.BOOL),
                               L.Binary("eq", accs[0], accs[0], dt.BOOL), dt.BOOL)
            take = L.Binary("or", take, nan_now, dt.BOOL)
        return [L.Select(take, v, accs[0], t), L.Select(take, r, accs[1], L.INDEX)]

    def inner(index):
        accs = [L.Accumulator("best", t, const(limit, t)), L.Accumulator("at", L.INDEX, I.ic(0))]
        loop = _reduce_loop(sched, x, dims, keep and dim is not None, index, accs, update)
        stores = [loop]
        results = op.results
        if len(results) == 2 and results[0] in sched.names:
            stores.append(L.Store(sched.names[results[0]], index, L.Var("best", t)))
        stores.append(L.Store(sched.names[results[-1]], index, L.Cast(L.Var("at", L.INDEX), dt.INT64)))
        return stores
    return _loops(op.results[-1].type.shape, inner)


def _variance(sched: Scheduler, op: Op, args: dict) -> list:
    """Two passes per output element: the mean, then the sum of squared deviations."""
    opdef, x, out = sched.table[op.name], args["self"], op.result.type
    dims = rules.normalize_dims(opdef, args.get("dim"), x.type.ndim)
    keep, t = bool(args.get("keepdim")), out.dtype
    n = math.prod(x.type.shape[d] for d in dims)
    correction = args.get("correction")
    ddof = 1 if correction is None else correction

    def inner(index):
        total = _reduce_loop(sched, x, dims, keep, index, [L.Accumulator("s", t, const(0, t))],
                             lambda a, v, r: [L.Binary("add", a[0], cast(v, t), t)])
        mean = L.Let("mean", L.Binary("div", L.Var("s", t), const(n, t), t))

        def squares(a, v, r):
            d = L.Binary("sub", cast(v, t), L.Var("mean", t), t)
            return [L.Binary("add", a[0], L.Binary("mul", d, d, t), t)]
        m2 = _reduce_loop(sched, x, dims, keep, index, [L.Accumulator("m2", t, const(0, t))], squares)
        var = L.Binary("div", L.Var("m2", t), const(max(n - ddof, 0), t), t)
        value = L.Unary("sqrt", var, t) if opdef.impl == "std" else var
        return [total, mean, m2, L.Store(sched.names[op.result], index, value)]
    return _loops(out.shape, inner)


def _matmul(sched: Scheduler, op: Op, args: dict) -> list:
    """One loop-IR Matmul statement (schedule_matmul.py)."""
    return matmul_body(sched, op, args)


def _scatter(sched: Scheduler, op: Op, args: dict) -> list:
    """scatter_add / index_add: copy `self`, then add each source element at its index.
    Serial on purpose: two source elements may hit the same output element."""
    opdef, out = sched.table[op.name], op.result.type
    name, t = sched.names[op.result], out.dtype
    src = args["src"] if opdef.kind == "scatter_add" else args["source"]
    alpha = args.get("alpha", 1)
    if out.ndim == 0:          # one element: the index can only be 0
        value = cast(sched.inliner.value_at(src, ()), t)
        value = L.Binary("mul", value, const(alpha, t), t) if alpha != 1 else value
        return [L.Store(name, (), L.Binary("add", cast(sched.inliner.value_at(args["self"], ()), t), value, t))]
    copy = _loops(out.shape, lambda ix: [L.Store(name, ix, cast(sched.inliner.value_at(args["self"], ix), t))], "c")
    d = args["dim"] % out.ndim
    idx_shape = args["index"].type.shape

    def inner(ix):
        pos = ix if ix else (I.ic(0),) * out.ndim        # a 0-d source adds at one position
        at = ix if opdef.kind == "scatter_add" else ((pos[d],) if idx_shape else ())
        target = sched.inliner._indirect(args["index"], at, out.shape[d])
        where = pos[:d] + (target,) + pos[d + 1:]
        value = cast(sched.inliner.value_at(src, ix), t)
        if alpha != 1:
            value = L.Binary("mul", value, const(alpha, t), t)
        return [L.Store(name, where, L.Binary("add", L.Load(name, where, t), value, t))]
    extent = idx_shape if opdef.kind == "scatter_add" else src.type.shape   # scatter_add walks index
    loops = _loops(extent, inner, "s")
    if loops and isinstance(loops[0], L.Loop):
        loops[0].parallel = False
    return copy + loops
