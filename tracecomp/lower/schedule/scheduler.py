"""Scheduling a verified, decomposed graph into loop-IR kernels: the fusion decisions.

A value gets a buffer (is *materialized*) when it is a function output, the result of a
reduction or matmul, a random draw (filled by the runtime), a non-splat constant, or an
elementwise value read by more than one op (computing it once beats recomputing it), or
one that ends a chain of inlined ops too long to inline further (schedule/depth.py: an
unrolled loop would otherwise make one expression as deep as the loop).
Every other value is inlined into its consumers' loops: chains of elementwise ops with
their broadcasts and views fuse into one loop nest, and a reduction's producers fuse
into the reduction's loop.  One kernel per materialized op, in graph order; then a
matmul's lone pointwise consumer folds into it as its epilogue (schedule/matmul.py).
A reduction over the innermost dims (softmax's max and sum, layernorm's mean and
variance) is computed inside the kernel of its consumers, row by row, its result kept in
a register (schedule/rows.py); values that such a row kernel alone reads are recomputed
in its passes over the row rather than materialized.

Loops and branches (tc.scan, tc.while_loop, tc.cond) are not fused with anything: their
operands and results live in buffers, each region is scheduled as a Program of its own,
and the Program gets `steps` (loops/control.py) that run the regions' kernels inside
native loops and branches (schedule/control.py says how).

`Program.kernel_ops` records, per kernel, the graph ops it computes (the materialized op
and every op inlined into its loops), and kernel names lead back to the user's code:
`k3_mlp_py18_sub_exp` is kernel 3, computing tc.sub and tc.exp, stored at mlp.py line 18.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ...core import dtypes as dt
from ...ir import CONSTANT, Graph, Op, Value
from ...ir.passes.widen_half import CAST
from ...ops import elementwise
from ...ops.table import by_ir_name
from ...core.symbolic import DynamicShapeError, hint, is_dynamic
from ..loops import index as I
from ..loops import ir as L
from ..loops.exprs import PRIMITIVES, X, cast, const
from ..loops.check import check_kernel
from ..loops.walk import buffers_accessed, size_params, var_names
from . import attention, control, reductions, sort
from .pointwise import VIEW_KINDS, Inliner
from .depth import too_deep
from .donation import update_in_place
from .index_checks import IndexCheck, IndexChecks
from .matmul import fuse_epilogues, matmul_body
from .nests import BufferTable, kernel_name, loop_nest
from .rows import RowFusion, expression_size, mark_parallel, recomputable
from .pieces import split_piecewise_loops
from .split import split_divided_loops

# Kinds with a loop nest of their own whose results always live in memory (never inlined)
REDUCE_KINDS = ("reduction", "arg_reduction", "variance", "matmul", "scatter", "index_add", "scan",
                "sort", "search", "attention", "region")
# Kinds that read their operands at computed positions, many times: operands live in memory
REREAD_KINDS = ("sort", "search", "region")
MAX_COPIES = 4         # copies of a value inlined into one op (_materialized's one_consumer)


@dataclass
class HostFill:
    """A buffer the runtime fills before the kernels run (random draws)."""
    buffer: str
    impl: str          # "uniform" | "normal"
    dtype: dt.DType
    shape: tuple[int, ...]


@dataclass
class Program:
    name: str
    kernels: list[L.Kernel]
    buffers: dict[str, L.Buffer]               # every buffer; roles input/output/temp/constant/errors/bound
    inputs: list[str]                          # buffer of each function input
    outputs: list[str]                         # buffer of each function output (may repeat)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    fills: list[HostFill] = field(default_factory=list)
    index_checks: dict[str, list[IndexCheck]] = field(default_factory=dict)   # by input buffer
    computed_checks: list[IndexCheck] = field(default_factory=list)   # CheckedIndex.check -> its check
    index_errors: Optional[str] = None         # the error record of the computed checks (role "errors")
    kernel_ops: dict[str, list[Op]] = field(default_factory=dict)  # kernel -> graph ops, graph order
    donated: list[str] = field(default_factory=list)   # input buffers outputs are written into (donation.py)
    steps: Optional[list] = None      # loops and branches around the kernels (loops/control.py); None: none


def _materialized(graph: Graph) -> set[Value]:
    table = by_ir_name()
    users: dict[Value, list[Op]] = {}
    for op in graph.ops:
        for v in op.operands:
            users.setdefault(v, []).append(op)
    uses = {v: len(ops) for v, ops in users.items()}
    keep = set(graph.outputs)

    copied: set[Value] = set()          # values inlined as several copies (one_consumer)
    holds_copies: dict[Value, bool] = {}   # v's inlined expression holds a copied value
    ends: dict[Op, Op] = {}                # chain_end, memoized

    def passes_on(op: Op) -> bool:
        # (a heuristic only: a memoized chain ignores a later op's operand kept afterwards)
        return table[op.name].kind in ("elementwise", "cast") and len(op.results) == 1 \
            and uses.get(op.results[0], 0) == 1 and op.results[0] not in keep

    def chain_end(op: Op) -> Op:
        """Where a chain of elementwise ops used once each, starting at `op`, ends. Memoized:
        walking every chain to its end anew made scheduling quadratic in an unrolled loop."""
        path = []
        while op not in ends and passes_on(op):
            path.append(op)
            op = users[op.results[0]][0]
        end = ends.get(op, op)
        ends.update((o, end) for o in path)
        return end

    def one_consumer(v: Value) -> bool:
        """Every use of v leads, through elementwise ops used once each, into one op (`t * t`,
        the wrap `where(t < 0, t + n, t)`), at most MAX_COPIES times: inlined there, v's
        copies are computed at one position per element, and LLVM merges them into one.
        Not when v's own expression holds such copies: a chain (`t = t * t` ten times) would
        give 2^10 of them, so every other link of it gets a buffer."""
        if holds_copies.get(v) or len(users[v]) > MAX_COPIES:
            return False
        return len({chain_end(op) for op in users[v]}) == 1

    for op in graph.ops:
        if op.name == CONSTANT:
            continue
        opdef = table[op.name]
        inlined = any(u in copied or (u not in keep and holds_copies.get(u)) for u in op.operands)
        holds_copies.update((r, inlined) for r in op.results)
        if opdef.kind in REDUCE_KINDS or opdef.kind == "random":
            keep.update(op.results)
        elif opdef.kind not in VIEW_KINDS and op.operands:      # (a factory recomputes for free)
            for r in op.results:
                if uses.get(r, 0) > 1 and hint(r.type.numel) > 1:
                    if one_consumer(r):
                        copied.add(r)
                    elif _widened(op):
                        base = _narrow_base(op.operands[0])
                        keep.update([base] if base.op is not None and base.op.name != CONSTANT else [])
                    else:
                        keep.add(r)
        if opdef.kind in REREAD_KINDS:
            keep.update(v for v in op.operands if v.op is not None and v.op.name != CONSTANT)
        if opdef.kind in ("scatter", "index_add") and len(op.operands) == 3:
            # a source computed from the tensor it updates (`y[1:3] += 1`) gets a buffer of its
            # own, so that the update can happen in the tensor's memory (donation.update_in_place)
            target, source = op.operands[0], op.operands[2]
            if target in keep and _depends_on(source, target):
                keep.add(source)
    return keep


def _widened(op: Op) -> bool:
    """Whether `op` widens a half tensor to float32.  Its multi-use result is not kept: the
    half source is (half the bytes), each user reads it through an exact conversion, and a
    packed matmul reads it in its half dtype (schedule/matmul.py `_half_source`), where a
    float32 buffer had sent the product to the float32 kernel."""
    return op.name == CAST and op.results[0].type.dtype is dt.FLOAT32 and op.operands[0].type.dtype.is_half


def _narrow_base(v: Value) -> Value:
    """The value under `v`'s views (a view of a kept value reads that value's buffer)."""
    while v.op is not None and len(v.op.results) == 1 and by_ir_name()[v.op.name].kind in VIEW_KINDS:
        v = v.op.operands[0]
    return v


def _depends_on(value: Value, on: Value) -> bool:
    seen, stack = set(), [value]
    while stack:
        v = stack.pop()
        if v is on:
            return True
        if v.op is not None and v not in seen:
            seen.add(v)
            stack.extend(v.op.operands)
    return False


class Scheduler:
    def schedule_region(self, graph: Graph) -> "Program":
        """A region's own Program (control.py schedules loops and branches with it)."""
        return schedule(graph, self.check_indices, region=True)

    def add_fill(self, buffer: str, impl: str, dtype: dt.DType, shape: tuple) -> None:
        """A buffer the runtime fills with random numbers before the kernels run."""
        self.program.fills.append(HostFill(buffer, impl, dtype, tuple(shape)))

    def __init__(self, graph: Graph, keep: set[Value] | None = None, check_indices: bool = True,
                 region: bool = False):
        self.graph = graph
        self.check_indices = check_indices
        self.region = region          # a region's graph: its inputs are block arguments (control.py)
        keep = _materialized(graph) if keep is None else keep
        # values given buffers (a loop reads its operands from memory, whatever recomputable says)
        self.keep = keep | too_deep(graph, keep) | control.operands_in_memory(graph)   # depth.py
        self.table = by_ir_name()
        self.buffers: dict[str, L.Buffer] = BufferTable()
        self.names: dict[Value, str] = {}
        self._count: dict[str, int] = {}        # buffers per role (their names' numbers)
        self._position: dict[str, int] = {}     # buffer name -> its place in self.buffers
        self.program = Program(graph.name, [], self.buffers, [], [])
        self._order = {op: i for i, op in enumerate(graph.ops)}
        self.rows = RowFusion(self)
        self.indices = IndexChecks(self, check_indices)

    def _buffer(self, v: Value, role: str, prefix: str) -> str:
        n = self._count.get(role, 0)
        while f"{prefix}{n}" in self.buffers:      # (fresh_name's temps share the prefix)
            n += 1
        self._count[role] = n + 1
        name = f"{prefix}{n}"
        self.buffers[name] = L.Buffer(name, v.type.dtype, tuple(I.dim(d) for d in v.type.shape), role)
        self.names[v] = name
        return name

    def run(self) -> Program:
        g, p = self.graph, self.program
        p.inputs = [self._buffer(v, "input", "in") for v in g.inputs]
        keep = self.keep
        for op in g.ops:
            if op.name == CONSTANT:
                self._constant(op)
            elif any(r in keep and r not in self.names for r in op.results):
                for r in op.results:
                    if r in keep or len(op.results) > 1 and self.table[op.name].kind in REDUCE_KINDS:
                        self._buffer(r, "temp", "t")
        self._promote_outputs()       # outputs are computed straight into their own buffers
        self.inliner = Inliner(self.names, self.indices)
        for op in g.ops:
            if op.name != CONSTANT and any(r in self.names for r in op.results) and not self.rows.defer(op):
                self._emit(op)
        self.rows.finish()
        self._promote_outputs()       # and those given a buffer while emitting (a splat constant a matmul reads)
        p.outputs = [self._output_buffer(v) for v in g.outputs]
        fuse_epilogues(p)
        for k in p.kernels:
            k.body = split_piecewise_loops(split_divided_loops(k.body))
        self._mark_index_inputs()
        self.indices.finish(self.program)
        if any(is_dynamic(d) for v in g.inputs for d in v.type.shape):
            for k in p.kernels:
                k.sizes = size_params(k)    # dynamic dims: sizes the kernel takes at run time
        return p

    def _promote_outputs(self) -> None:
        """A function output's buffer is an output, never a temp whose memory is reused."""
        for v in self.graph.outputs:
            if v in self.names and self.buffers[self.names[v]].role == "temp":
                b = self.buffers[self.names[v]]
                self.buffers[b.name] = L.Buffer(b.name, b.dtype, b.shape, "output")

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
        if opdef.kind == "region":
            control.emit(self, op)
            return
        if opdef.kind == "random":
            r = op.result
            self.program.fills.append(HostFill(self.names[r], opdef.impl, r.type.dtype, r.type.shape))
            return
        builder = {"reduction": _reduction, "arg_reduction": _arg_reduction, "variance": _variance,
                   "matmul": _matmul, "scatter": _scatter, "index_add": _scatter,
                   "scan": _scan, "sort": sort.argsort, "search": sort.searchsorted,
                   "attention": attention.attention}.get(opdef.kind, _pointwise)
        try:
            body = builder(self, op, opdef.arguments_from(op.operands, op.attrs))
        except DynamicShapeError as e:
            where = f" at {op.loc}" if op.loc is not None else ""
            raise DynamicShapeError(f"{op.name}{where}: {e}") from None
        self.add_kernel(self.inlined_ops([op]), body)

    def add_kernel(self, ops: list[Op], body: list) -> L.Kernel:
        """Append the kernel running `body`, which computes `ops` (graph order), named after them.
        Deferred row reductions it reads are computed inside it or before it (schedule/rows.py)."""
        body, absorbed = self.rows.absorb(body)
        if absorbed:
            ops = sorted(set(ops) | set(self.inlined_ops(absorbed)), key=self._order.__getitem__)
        kernel = L.Kernel(kernel_name(len(self.program.kernels), ops), self._kernel_buffers(body), body)
        self.program.kernels.append(kernel)
        self.program.kernel_ops[kernel.name] = ops
        if absorbed:
            self.rows.hosts[kernel.name] = absorbed
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
        loads, stores = buffers_accessed(body)
        out = []
        # in the buffers' order, without a scan of all of them per kernel (quadratic)
        names = (loads | stores) & self.buffers.keys()
        if not names <= self._position.keys():
            self._number_new_buffers(names)
        for name in sorted(names, key=self._position.__getitem__):
            b = self.buffers[name]
            if name in stores:
                out.append(L.Buffer(name, b.dtype, b.shape, "errors" if b.role == "errors" else "output"))
            elif name in loads:
                out.append(L.Buffer(name, b.dtype, b.shape, "input"))
        return out

    def _number_new_buffers(self, names: set[str]) -> None:
        """Extend `_position` to the buffers added since (they come last in the dict)."""
        new = []
        for name in reversed(self.buffers):
            if name in self._position:
                break
            new.append(name)
        if not all(n in self._position for n in names - set(new)):   # (a name deleted and added again)
            self._position = {}
            new = list(reversed(self.buffers))
        for name in reversed(new):
            self._position[name] = len(self._position)

    def _mark_index_inputs(self) -> None:
        """Function inputs that reach gather/index_select/scatter indices through views or
        integer casts: the runtime bounds-checks them, so out-of-range indices raise as they
        do eagerly (computed indices are checked in the kernels: index_checks.py)."""
        for op in self.graph.ops:
            opdef = self.table.get(op.name)
            if opdef is None or opdef.kind not in ("gather", "index_select", "scatter", "index_add"):
                continue
            args = opdef.arguments_from(op.operands, op.attrs)
            src = args["self"].type
            dim = args["dim"] % src.ndim if src.ndim else 0
            size = src.shape[dim] if src.ndim else 1
            found = self.checked_input(args["index"], size)
            if found is not None:
                idx, wraps, allowed = found
                check = IndexCheck(opdef.full_name, dim, size, op.loc, allowed, wraps)
                self.program.index_checks.setdefault(self.names[idx], []).append(check)

    def checked_input(self, index: Value, size) -> Optional[tuple[Value, bool, Optional[int]]]:
        """(input, wraps, allowed) when the index values `index` are those of an integer
        function input, through views, casts, the negative-index wrap and an ignore_index
        (`_unless_wrapped`, `_unless_ignored`): the runtime checks that input before the
        kernels run.  None otherwise (a float input cast to an index is checked where it is
        used, NaN included).  None in a region: its inputs change between iterations."""
        if self.region:
            return None
        idx, wraps = self._unless_wrapped(self._view_source(index), size)
        idx, allowed = self._unless_ignored(self._view_source(idx), size)
        if idx in self.names and self.buffers[self.names[idx]].role == "input" and \
                (idx.type.dtype == dt.BOOL or not idx.type.dtype.is_floating_point):
            return idx, wraps, allowed
        return None

    def wrapped_index(self, index: Value, size) -> bool:
        """Whether the graph computes `index` as `where(t < 0, t + size, t)` (the negative-index wrap)."""
        return self._unless_wrapped(self._view_source(index), size)[1]

    def made_by(self, v, full_name: str) -> Optional[dict]:
        """The arguments of the op `full_name` that computes `v`; None if another op (or
        nothing) gives v."""
        op = getattr(v, "op", None)
        if op is None or op.name == CONSTANT or self.table[op.name].full_name != full_name:
            return None
        return self.table[op.name].arguments_from(op.operands, op.attrs)

    def _unless_ignored(self, v: Value, size) -> tuple[Value, Optional[int]]:
        """(t, k) when `v` is `where(t != k, t, c)` with c a scalar in range (nll_loss's
        ignore_index): the index input is t, which may hold k as well; else (v, None)."""
        args = None if v in self.names else self.made_by(v, "where.self")
        cond = args and self.made_by(args["condition"], "ne")
        if not cond or not isinstance(args["other"], int) or not (isinstance(size, int) and 0 <= args["other"] < size):
            return v, None
        t, k = self._view_source(args["self"]), cond["other"]
        if self._view_source(cond["self"]) is not t or not isinstance(k, int) or isinstance(k, bool):
            return v, None
        return t, k

    def _unless_wrapped(self, v: Value, size) -> tuple[Value, bool]:
        """(t, True) when `v` is `where(t < 0, t + size, t)` (negative indices counted from
        the end, composites.wrapped): the index input is t, which may lie in [-size, size)."""
        args = None if v in self.names else self.made_by(v, "where.self")
        cond = args and self.made_by(args["condition"], "lt")
        shifted = args and self.made_by(args["self"], "add")
        t = args and args["other"]
        if cond and shifted and isinstance(t, Value) and cond["self"] is t and cond["other"] == 0 and shifted["self"] is t \
                and shifted["other"] == size and shifted.get("alpha", 1) == 1:
            return self._view_source(t), True
        return v, False

    def _view_source(self, v: Value) -> Value:
        while v.op is not None and v.op.name != CONSTANT and \
                self.table[v.op.name].kind in _WHOLE_VIEWS + ("cast",) and v not in self.names:
            v = v.op.operands[0]
        return v


# views that keep every element: an input checked through them is checked exactly (a column
# that select takes of an input must not be checked as the whole input: nonzero's rows)
_WHOLE_VIEWS = tuple(k for k in VIEW_KINDS if k not in ("select", "slice", "split"))


def schedule(graph: Graph, check_indices: bool = True, region: bool = False) -> Program:
    """Schedule with the materialized set of `_materialized`, then again without the values
    that row kernels recompute (schedule.rows.recomputable), until nothing changes.
    `check_indices` False clamps computed indices without checking them (index_checks.py).
    With TRACECOMP_VERIFY=1 (the test suite) every kernel goes through the loop-IR checker."""
    sched = Scheduler(graph, check_indices=check_indices, region=region)
    program = sched.run()
    while True:
        drop = recomputable(sched, sched.table)
        if not drop:
            break
        trial = Scheduler(graph, sched.keep - drop, check_indices, region)
        if trial.keep == sched.keep:
            break                   # too_deep gave them buffers back
        candidate = trial.run()
        if expression_size(candidate.kernels) > 2 * expression_size(program.kernels) + 1000:
            break                   # recomputing would multiply the code: keep the buffers
        sched, program = trial, candidate
    update_in_place(program)
    control.expand(program)       # region ops' kernels and the steps around them
    if os.environ.get("TRACECOMP_VERIFY") == "1":
        for kernel in program.kernels:
            check_kernel(kernel)
    return program


# ---------------------------------------------------------------- loop nests

def _pointwise(sched: Scheduler, op: Op, args: dict) -> list:
    """One loop nest per stored result (split stores several pieces)."""
    body = []
    for k, r in enumerate(op.results):
        if r in sched.names:
            def inner(index, k=k, r=r):
                return [L.Store(sched.names[r], index, sched.inliner.op_at(op, k, index))]
            body += loop_nest(r.type.shape, inner, prefix=f"i{k}_" if len(op.results) > 1 else "i")
    return body


def _reduction(sched: Scheduler, op: Op, args: dict) -> list:
    """A reduction kernel of its own: the statements of reductions.py at every output index,
    their values stored.  Parallel over the outputs when the reduce loops make it worth it.
    Column reductions (reductions.column_plan) accumulate in the output instead."""
    plan = reductions.column_plan(sched, op)
    if plan is not None:
        return _column_reduction(sched, op, *plan)
    plan = reductions.column_arg_plan(op)
    if plan is not None and all(r in sched.names for r in op.results):
        return _column_arg_reduction(sched, op, *plan)

    def inner(index):
        stmts, values = reductions.statements_at(sched, op, index)
        return stmts + [L.Store(sched.names[r], index, v) for r, v in zip(op.results, values) if r in sched.names]
    return mark_parallel(loop_nest(op.results[-1].type.shape, inner), sched.rows.hints)


def _column_out_index(index, dims, keepdim: bool) -> tuple:
    """The output element a column reduction's input element at `index` updates."""
    if keepdim:
        return tuple(I.ic(0) if d in dims else i for d, i in enumerate(index))
    return tuple(i for d, i in enumerate(index) if d not in dims)


def _column_reduction(sched: Scheduler, op: Op, combine: str, init, divisor) -> list:
    """out = init; for every input element in memory order: out[o] = combine(out[o], x);
    then out /= divisor (mean).  The innermost input dim is kept, so the updates run along
    contiguous rows of both the input and the output and vectorize, where one Reduce per
    output would read a column with a stride.  The sums take NumPy's order for these
    reductions (row after row).  Parallel only over kept outer dims (no two threads update
    one output element)."""
    out, x = sched.names[op.result], op.operands[0]
    t = op.result.type.dtype
    dims, keepdim = reductions.reduced_dims(op)

    def update(index):
        o = _column_out_index(index, dims, keepdim)
        v = cast(sched.inliner.value_at(x, index), t)
        return [L.Store(out, o, L.Binary(combine, L.Load(out, o, t), v, t))]

    shape = op.result.type.shape
    body = loop_nest(shape, lambda o: [L.Store(out, o, const(init, t))], prefix="z")
    nest = loop_nest(x.type.shape, update, prefix="c")
    nest[0].parallel = nest[0].parallel and 0 not in dims
    body += nest
    if divisor is not None:
        body += loop_nest(shape, lambda o: [L.Store(out, o, L.Binary("div", L.Load(out, o, t), const(divisor, t), t))],
                       prefix="m")
    return body


def _column_arg_reduction(sched: Scheduler, op: Op, better: str, limit) -> list:
    """max.dim/min.dim as a column reduction: both outputs start at (limit, 0); then for
    every input element in memory order, where it beats the output's value so far
    (reductions.arg_takes) it and its position along the dim replace them.  Memory order
    visits the dim's positions in ascending order for each output: the first extreme wins,
    as in the Reduce.  The rows are contiguous in input and outputs, so the updates
    vectorize, where a Reduce per output read a column (a max-pool's window axis: a
    division per element for the window's place)."""
    values, indices = (sched.names[r] for r in op.results)
    x = op.operands[0]
    t = x.type.dtype
    dims, keepdim = reductions.reduced_dims(op)

    def update(index):
        o = _column_out_index(index, dims, keepdim)
        v, best = L.Var("v_col", t), L.Var("best_col", t)
        take = reductions.arg_takes(better, v, best, t)
        return [L.Let("v_col", sched.inliner.value_at(x, index)), L.Let("best_col", L.Load(values, o, t)),
                L.Store(values, o, L.Select(take, v, best, t)),
                L.Store(indices, o, L.Select(take, L.Cast(index[dims[0]], dt.INT64), L.Load(indices, o, dt.INT64), dt.INT64))]

    shape = op.results[0].type.shape
    body = loop_nest(shape, lambda o: [L.Store(values, o, const(limit, t)), L.Store(indices, o, const(0, dt.INT64))],
                     prefix="z")
    nest = loop_nest(x.type.shape, update, prefix="c")
    nest[0].parallel = nest[0].parallel and 0 not in dims
    return body + nest


_arg_reduction = _variance = _reduction


def _matmul(sched: Scheduler, op: Op, args: dict) -> list:
    """One loop-IR Matmul statement (schedule/matmul.py)."""
    return matmul_body(sched, op, args)


def _scan(sched: Scheduler, op: Op, args: dict) -> list:
    """cumsum, cumprod, cummax/cummin and logcumsumexp along `dim`:
    out[i] = combine(out[i-1], x[i]) (x[0] at i == 0), the loop over `dim` serial, the loops
    outside it parallel when worth it, those inside it vectorizable.  cummax/cummin also
    carry the index of the running extreme: the last one reached (`>=`), or the last NaN."""
    impl, out = sched.table[op.name].impl, op.results[0].type
    names, t = [sched.names[r] for r in op.results], out.dtype
    if out.ndim == 0:
        value = cast(sched.inliner.value_at(args["self"], ()), t)
        return [L.Store(names[0], (), value)] + [L.Store(n, (), L.Const(0, dt.INT64)) for n in names[1:]]
    d = args["dim"] % out.ndim

    def step(ix):
        i = ix[d]
        before = ix[:d] + (I.at_least(I.sub(i, 1), 0),) + ix[d + 1:]    # clamped: both arms run
        first = X(L.Binary("eq", i, I.ic(0), dt.BOOL))
        x = X(cast(sched.inliner.value_at(args["self"], ix), t))
        run = X(L.Load(names[0], before, t))
        if impl in ("max", "min"):
            take = first | (x != x) | (x >= run if impl == "max" else x <= run)
            at = X(L.Load(names[1], before, dt.INT64))
            return [L.Store(names[0], ix, PRIMITIVES["where"](take, x, run).e),
                    L.Store(names[1], ix, PRIMITIVES["where"](take, X(cast(i, dt.INT64)), at).e)]
        if impl == "logaddexp":
            combined = elementwise.evaluate(sched.table["tc.logaddexp"], {"self": run, "other": x}, PRIMITIVES)
        else:
            combined = run + x if impl == "sum" else run * x
        return [L.Store(names[0], ix, PRIMITIVES["where"](first, x, combined).e)]
    loops = loop_nest(out.shape, step, "s")
    if d == 0:
        loops[0].parallel = False
    return loops


def _scatter(sched: Scheduler, op: Op, args: dict) -> list:
    """scatter (write), scatter_add, scatter_prod/amax/amin and index_add: copy `self`, then
    combine each source element into the element its index names.  Serial on purpose: two
    source elements may hit the same output element (a write: the last one wins), unless
    every element writes one value (`y[i] = 0`): then any order leaves the same result."""
    opdef, out = sched.table[op.name], op.result.type
    name, t = sched.names[op.result], out.dtype
    src = args["src"] if opdef.kind == "scatter" else args["source"]
    alpha = args.get("alpha", 1)
    impl = opdef.impl if opdef.kind == "scatter" else "add"

    def combine(old: L.Expr, value: L.Expr) -> L.Expr:
        v = X(value) * alpha if alpha != 1 else X(value)
        o = X(old)
        return {"add": lambda: o + v, "assign": lambda: v, "multiply": lambda: o * v,
                "amax": lambda: PRIMITIVES["maximum"](o, v), "amin": lambda: PRIMITIVES["minimum"](o, v)}[impl]().e
    if out.ndim == 0:          # one element: the index can only be 0
        value = cast(sched.inliner.value_at(src, ()), t)
        return [L.Store(name, (), combine(cast(sched.inliner.value_at(args["self"], ()), t), value))]
    copy = loop_nest(out.shape, lambda ix: [L.Store(name, ix, cast(sched.inliner.value_at(args["self"], ix), t))], "c")
    d = args["dim"] % out.ndim
    idx_shape = args["index"].type.shape
    values = []

    def inner(ix):
        pos = ix if ix else (I.ic(0),) * out.ndim        # a 0-d source lands at one position
        at = ix if opdef.kind == "scatter" else ((pos[d],) if idx_shape else ())
        target = sched.inliner.indirect(op, d, args["index"], at, out.shape[d])
        where = pos[:d] + (target,) + pos[d + 1:]
        values.append(cast(sched.inliner.value_at(src, ix), t))
        return [L.Store(name, where, combine(L.Load(name, where, t), values[-1]))]
    extent = idx_shape if opdef.kind == "scatter" else src.type.shape   # scatter walks index
    loops = loop_nest(extent, inner, "s")
    uniform = impl == "assign" and not any(var_names(v) for v in values)    # no loop var in it
    if loops and isinstance(loops[0], L.Loop) and not uniform:
        loops[0].parallel = False
    return copy + loops
