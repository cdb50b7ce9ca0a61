"""Row fusion: a reduction over the innermost dims is computed inside the kernel that
consumes it, one row at a time, its result kept in a register.

A *row reduction* reduces the input dims k..ndim-1 (reductions.row_rank): its result is
indexed by the k outer dims.  The scheduler defers it (`defer`) instead of giving it a
kernel of its own.  The next kernel that reads its buffer (`absorb`) takes it in when
every Load of the buffer is at the kernel's own outer index, (i0, ..., i{k-1}) plus zeros
for kept dims, where i0, i1, ... are the loops of the kernel's nest: then, for each outer
index, the kernel first runs the reduction's Reduce loops and binds the result to a Let,
and its Loads of the buffer become that name:

    parallel Loop i0:                         softmax(x, dim=1)
        Reduce r -> acc_0 (max of x[i0, r]);  Let amax_0
        Reduce r -> acc_1 (sum of exp(x[i0, r] - amax_0));  Let sum_1
        Loop i1:  Store out[i0, i1] = exp(x[i0, i1] - amax_0) / sum_1

A row of the input is read once per pass, and stays in L1/L2 between passes, so the
kernel moves about one read and one write of memory.  (`reuse_output_row` then computes
exp(x - amax_0) once: into the output row, which the sum and the division read back.)
A reduction read inside another absorbed reduction at the same outer index (the max
inside the sum above) is absorbed too, first.  Reductions with another outer rank than
the first one absorbed, or read at any other index, get their own kernel first (`flush`),
as do those still deferred at the end (`finish`); so does one a Matmul reads (a view of
the whole buffer).  The reduced value is stored to its buffer as well only when a later
kernel or the function's outputs read it.  Loops of extent 1 index only 0, and indices
are compared that way (a (n, 1) value reads a (n, 1) reduction at [i0, 0]).

`recomputable(...)`: an elementwise value materialized only because it has several uses,
all of them inside one row kernel (exp(x - max) in softmax, x - mean in layernorm), is
better recomputed in each pass over the row (from cache) than written to and read back
from memory; schedule() drops such values from the materialized set and schedules again.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ...ir import Op, Value
from ..loops import index as I, ir as L
from ..loops.walk import buffers_read, count_exprs, loads, statements, substitute, walk
from ...core.symbolic import Dim
from .tiles import parallel_min_work
from .reductions import output_index, row_rank, statements_at



class RowFusion:
    """The deferred row reductions of one Scheduler run, and the kernels that host them."""

    def __init__(self, sched):
        self.sched = sched
        self.pending: dict[str, Op] = {}             # buffer of a deferred result -> its op
        self.hosts: dict[str, list[Op]] = {}         # kernel name -> row reductions it computes
        self._order = {op: i for i, op in enumerate(sched.graph.ops)}
        self.hints = size_hints(sched.graph)          # (mark_parallel)

    def defer(self, op: Op) -> bool:
        """Hold back a row reduction until a kernel reads it; False for other ops."""
        if row_rank(op) == 0:
            return False
        for r in op.results:
            self.pending[self.sched.names[r]] = op
        return True

    def flush(self, op: Op) -> None:
        """Give a deferred reduction its own kernel, now (before the kernel being built)."""
        if self._take(op):
            self.sched._emit(op)

    def finish(self) -> None:
        """Flush what no kernel read; then drop the stores of absorbed results nobody loads."""
        for op in sorted(set(self.pending.values()), key=self._order.__getitem__):
            self.flush(op)
        program = self.sched.program
        loaded: set[str] = set()
        for k in program.kernels:
            loaded |= buffers_read(k.body)
        outputs = {self.sched.names[v] for v in self.sched.graph.outputs if v in self.sched.names}
        for k in program.kernels:
            ops = self.hosts.get(k.name, [])
            unused = {self.sched.names[r] for op in ops for r in op.results} - loaded - outputs
            if unused:
                k.body = _without_stores(k.body, unused)
                k.buffers = self.sched._kernel_buffers(k.body)
                for name in unused:
                    del self.sched.buffers[name]
                for v in [v for v, name in self.sched.names.items() if name in unused]:
                    del self.sched.names[v]

    def absorb(self, body: list) -> tuple[list, list[Op]]:
        """`body` (a kernel being built) with the deferred reductions it reads at its outer
        index computed inside it; the others flushed.  Returns (body, absorbed ops)."""
        for buffer in _matmul_operands(body):        # a Matmul reads whole buffers
            if buffer in self.pending:
                self.flush(self.pending[buffer])
        reads = self._pending_reads(body)
        if not reads:
            return body, []
        nest = _nest(body)
        outer = tuple(L.Var(lp.var, L.INDEX) for lp in nest)
        unit = frozenset(lp.var for lp in nest if lp.extent == 1)     # these index only 0
        rank, take = None, []
        for op in self._ops(reads):
            k = row_rank(op)
            if k <= len(nest) and rank in (None, k) and _covers(op, nest) and \
                    _read_at(op, reads, self.sched, outer[:k], unit):
                rank = k
                take.append(op)
            else:
                self.flush(op)
        work = _Absorbed(outer[:rank] if rank else (), unit, nest)
        for op in take:
            self._compute(op, work)
        if not work.ops:
            return body, []
        body = substitute(body, work.replace)
        stmts = substitute(work.stmts, work.replace)
        level = _nest(body)[rank - 1]
        level.body = reuse_output_row(stmts + level.body, outer[:rank])
        return mark_parallel(body, self.hints), work.ops

    # ----------------------------------------------------------------------------------
    def _take(self, op: Op) -> bool:
        """Remove `op` from the deferred ones; False if it was not deferred (any more)."""
        found = False
        for r in op.results:
            found |= self.pending.pop(self.sched.names[r], None) is not None
        return found

    def _pending_reads(self, stmts: list) -> dict[str, list[tuple]]:
        reads: dict[str, list[tuple]] = {}
        for load in loads(stmts):
            if load.buffer in self.pending:
                reads.setdefault(load.buffer, []).append(load.index)
        return reads

    def _ops(self, reads: dict) -> list[Op]:
        return sorted({self.pending[b] for b in reads}, key=self._order.__getitem__)

    def _compute(self, op: Op, work: "_Absorbed") -> None:
        """Append the statements of `op` at the outer index (its deferred inputs first)."""
        if not self._take(op):
            return                       # flushed meanwhile (a flushed kernel absorbed it)
        tag = f"_{work.count}"
        work.count += 1
        index = output_index(op, work.outer)
        stmts, values = statements_at(self.sched, op, index, tag)
        reads = self._pending_reads(stmts)
        for dep in self._ops(reads):
            if row_rank(dep) == len(work.outer) and _covers(dep, work.nest) and \
                    _read_at(dep, reads, self.sched, work.outer, work.unit):
                self._compute(dep, work)
            else:
                self.flush(dep)
        work.stmts += stmts
        short = op.name.split(".")[1]
        for j, (r, v) in enumerate(zip(op.results, values)):
            name = f"{short}{tag}" if len(op.results) == 1 else f"{short}{tag}_{j}"
            buffer = self.sched.names[r]
            work.stmts += [L.Let(name, v), L.Store(buffer, index, L.Var(name, v.dtype))]
            work.values[buffer] = (index, L.Var(name, v.dtype))
        work.ops.append(op)


@dataclasses.dataclass
class _Absorbed:
    """The row reductions being absorbed into one kernel: their statements, in order."""
    outer: tuple
    unit: frozenset                                            # loop vars of extent 1
    nest: list                                                 # the kernel's loops
    stmts: list = dataclasses.field(default_factory=list)
    values: dict = dataclasses.field(default_factory=dict)     # buffer -> (index, Var)
    ops: list = dataclasses.field(default_factory=list)
    count: int = 0

    def replace(self, e: L.Expr) -> Optional[L.Expr]:
        if isinstance(e, L.Load) and e.buffer in self.values and \
                _canonical(e.index, self.unit) == _canonical(self.values[e.buffer][0], self.unit):
            return self.values[e.buffer][1]
        return None


def _read_at(op: Op, reads: dict, sched, outer: tuple, unit: frozenset) -> bool:
    """Whether every read of `op`'s results is at its output index for `outer`."""
    want = _canonical(output_index(op, outer), unit)
    return all(_canonical(index, unit) == want for r in op.results for index in reads.get(sched.names[r], ()))


def _covers(op: Op, nest: list) -> bool:
    """Whether the kernel's outer loops run over every row of `op`: a kernel over part of
    them (the slice of a gradient that a split hands one input) would compute only those
    rows, and another kernel may read the rest from the result's buffer."""
    shape = op.operands[0].type.shape
    return all(nest[j].extent == I.dim(shape[j]) for j in range(row_rank(op)))


def _canonical(index: tuple, unit: frozenset) -> tuple:
    """The index with the vars of extent-1 loops as the constant 0 they always are."""
    return tuple(L.Const(0, L.INDEX) if isinstance(i, L.Var) and i.name in unit else i for i in index)


_COSTLY = ("exp", "exp2", "expm1", "log", "log2", "log1p", "sin", "cos", "tan", "tanh", "erf", "pow", "atan2")


def reuse_output_row(row: list, outer: tuple) -> list:
    """The statements of one row, with a costly value computed once per element instead of
    twice when a reduction and the final store both need it (softmax: exp(x - max) is summed,
    then divided by the sum): the value is first written to the output's own row, the
    Reduce loads it from there and the store reads it back, all within the row (in cache).

    Applies when the row ends with one loop `Store out[outer, t] = E` and a Reduce before it
    runs over the same extent with one Let `x = X` whose X (at t for the reduce var) holds a
    transcendental, occurs in E, reads nothing of `out` nor the Reduce's accumulators, and
    has out's dtype."""
    if not row or not isinstance(row[-1], L.Loop) or len(row[-1].body) != 1:
        return row
    final, store = row[-1], row[-1].body[0]
    t = L.Var(final.var, L.INDEX)
    if not isinstance(store, L.Store) or store.index != tuple(outer) + (t,):
        return row
    for n, s in enumerate(row[:-1]):
        if not (isinstance(s, L.Reduce) and s.extent == final.extent and len(s.body) == 1
                and isinstance(s.body[0], L.Let)):
            continue
        r = L.Var(s.var, L.INDEX)
        x = substitute(s.body[0].value, lambda e: t if e == r else None)
        found = [e for e in walk(store.value) if e == x]
        exprs = list(walk(x))
        if not found or x.dtype != store.value.dtype or \
                not any(isinstance(e, (L.Unary, L.Binary)) and e.fn in _COSTLY for e in exprs) or \
                any(isinstance(e, L.Load) and e.buffer == store.buffer for e in exprs) or \
                any(isinstance(e, L.Var) and e.name in {a.name for a in s.accumulators} for e in exprs):
            continue
        at = lambda i: L.Load(store.buffer, tuple(outer) + (i,), x.dtype)      # noqa: E731
        fill = L.Loop(final.var, final.extent, [L.Store(store.buffer, store.index, x)])
        reduce = L.Reduce(s.var, s.extent, s.accumulators, [L.Let(s.body[0].name, at(r))], s.update)
        value = substitute(store.value, lambda e: at(t) if e == x else None)
        last = L.Loop(final.var, final.extent, [L.Store(store.buffer, store.index, value)], final.parallel)
        return row[:n] + [fill, reduce] + row[n + 1:-1] + [last]
    return row


def _matmul_operands(stmts: list) -> set[str]:
    return {b for s in statements(stmts) if isinstance(s, L.Matmul)
            for b in (s.a.buffer, s.b.buffer) + ((s.b_windows.buffer,) if s.b_windows is not None else ())}


def _nest(body: list) -> list[L.Loop]:
    """The loops of the perfect nest at the top of `body` (empty unless body is one Loop)."""
    nest = []
    while len(body) == 1 and isinstance(body[0], L.Loop):
        nest.append(body[0])
        body = body[0].body
    return nest


def mark_parallel(body: list, hints: Optional[dict] = None) -> list:
    """Make the outermost loop of a single nest parallel (past loops of extent 1: a batch of
    one) when the whole nest does at least parallel_min_work() innermost iterations (Reduce
    loops count); dynamic extents count at their example sizes, `hints` (size_hints), as
    loop_nest decides."""
    nest = _nest(body)
    while nest and nest[0].extent == 1:
        nest = nest[1:]
    first = _hint(nest[0].extent, hints) if nest else None
    if first is not None and not any(lp.parallel for lp in _nest(body)) \
            and first * _work(nest[0].body, hints) >= parallel_min_work():
        nest[0].parallel = True
    return body


def _work(stmts: list, hints: Optional[dict]) -> int:
    total = sum(_hint(s.extent, hints) * _work(s.body, hints) for s in stmts
                if isinstance(s, (L.Loop, L.Reduce)) and _hint(s.extent, hints) is not None)
    return max(total, 1)


def _hint(extent, hints: Optional[dict]) -> Optional[int]:
    """An extent's size, a dynamic one's example size, else None."""
    if isinstance(extent, int) or not hints:
        return extent if isinstance(extent, int) else None
    try:
        d = I.symbolic(extent)
        return d if isinstance(d, int) else Dim(d.terms, hints).hint()
    except (ValueError, KeyError):
        return None


def size_hints(graph) -> dict[str, int]:
    """{size name: example size} of the graph's dynamic input dims."""
    return {name: h for v in graph.inputs for d in v.type.shape if isinstance(d, Dim) for name, h in d.hints.items()}


def _without_stores(stmts: list, buffers: set[str]) -> list:
    out = []
    for s in stmts:
        if isinstance(s, L.Store) and s.buffer in buffers:
            continue
        if isinstance(s, L.Loop):
            s = L.Loop(s.var, s.extent, _without_stores(s.body, buffers), s.parallel)
        out.append(s)
    return out


# ------------------------------------------------------------------- recomputing values

def recomputable(sched, table) -> set[Value]:
    """Temps of elementwise ops (or casts) that one row kernel alone reads: recomputing
    them in its passes beats a round trip through memory.  Not those a matmul computes as
    its epilogue: the product is written anyway, so recomputing would save nothing.

    Also those that become so once the others are recomputed: the row kernel then reads
    what the dropped value's own kernel read (when that kernel computed nothing else), so
    a chain of elementwise temps (W8's layer norms: add, then mul, then mul) goes in one
    round of schedule() instead of one round per link."""
    readers: dict[str, set[str]] = {}
    reads_of: dict[str, tuple[str, set[str]]] = {}    # buffer -> (the kernel writing only it, what it reads)
    products: set[str] = set()
    for k in sched.program.kernels:
        reads = buffers_read(k.body)
        writes = {b.name for b in k.buffers if b.role == "output"}
        for buffer in reads - writes:
            readers.setdefault(buffer, set()).add(k.name)       # (a row kernel reads its own output)
        if len(writes) == 1:
            reads_of[next(iter(writes))] = (k.name, reads - writes)
        products |= {s.out.buffer for s in k.body if isinstance(s, L.Matmul)}
    candidates = {}
    for v, name in sched.names.items():
        b = sched.buffers.get(name)
        if b is None or b.role != "temp" or name in products or v.op is None or v.op.name not in table:
            continue
        if table[v.op.name].kind in ("elementwise", "cast"):
            candidates[name] = v
    found: set[Value] = set()
    pending = list(candidates)
    while pending:
        name = pending.pop()
        v = candidates[name]
        rs = readers.get(name, set())
        if v in found or len(rs) != 1 or next(iter(rs)) not in sched.rows.hosts:
            continue
        found.add(v)
        host = next(iter(rs))
        writer, inputs = reads_of.get(name, (None, ()))
        for u in inputs:                    # the host now reads what v's kernel read
            if writer in readers.get(u, ()):
                readers[u] = (readers[u] - {writer}) | {host}
                if u in candidates:
                    pending.append(u)
    return found


def expression_size(kernels: list) -> int:
    """Expression nodes in all kernels: guards recomputation against blowing up."""
    return sum(count_exprs(k.body) for k in kernels)
