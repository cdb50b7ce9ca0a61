"""Rewrites of the ops with regions: tc.scan, tc.while_loop and tc.cond (ir/regions.py).

Before: a well-formed graph.  After, for each op with regions (innermost first: the
rewrite driver rewrites an op's regions before the op):
- a tc.cond whose predicate is a `tc.constant` is replaced by the chosen branch's ops,
  inlined; a tc.scan of length 0 by its init and empty ys (constants);
- loop-invariant code motion (scan, while): a body op that depends only on the consts
  (and on `tc.constant`s) and draws no random numbers runs once before the loop, and the
  body receives what it still needs of it as new consts.  `tc.constant`s themselves stay
  (folding and simplification inside the body see them), copied out when a hoisted op
  needs one;
- scanned-input hoisting (scan): a body op that depends on x rows and consts but on no
  carry, a matmul whose other operand is invariant or elementwise, runs once over the
  whole stacked xs before the loop ((xs @ W)[i] = xs[i] @ W, a batched matmul), and the
  body receives its rows as new xs; a y that is such a row is the stacked value itself.
  An elementwise op moves only for a hoisted matmul or where the body no longer needs
  its row (_worth_hoisting);
- sums of products (scan): a carry that only accumulates a product of per-step rows,
  acc + a_i @ b_i (a weight's gradient in a backward scan: dW += h_i^T da_i), is one
  product after the loop over the stacked rows, sum_i a_i @ b_i = [a_1 .. a_T] @ [b_1; ..;
  b_T]: one large matmul instead of T small ones, and no T reads and writes of the sum.
  The rows must be x rows or ys already (a new y would hold T rows in memory); a row's
  transpose is read as a transposed view of the stack;
- dead results: a carry whose result is unused and that no kept carry, y or while
  condition depends on is dropped (its init, block argument and yield), and so are unused
  ys and unused cond results; an op none of whose results is used is dropped;
- operands: a const (a cond operand, a scanned input) that no region uses is dropped,
  and a value passed twice is passed once.
The graph computes the same values (the tests run it with the interpreter before and
after).  An op hoisted out of a tc.while_loop's body runs even when the loop runs no step
(speculation, as LICM does for ops without side effects), so only ops that cannot raise
(no run-time index checks) and hold no loop of their own (it might not end) leave a while
body; a while condition and a scan body (length >= 1 by then) always run.  A graph without
region ops is returned as it is.
"""
from __future__ import annotations

import numpy as np

from ...core.types import TensorType
from ...ops import rules
from ...ops.table import by_ir_name
from .. import regions as R
from ..graph import CONSTANT, Graph, Op, Value
from .rewrite import DROP, RuleResult, Rewriter, is_constant, rewrite

MATMUL, ADD, PERMUTE, RESHAPE = "tc.matmul", "tc.add", "tc.permute", "tc.reshape"


def control(graph: Graph) -> Graph:
    """The graph with its region ops simplified as the module docstring says."""
    if not any(op.regions for op in graph.ops):
        return graph
    return rewrite(graph, _rule)


def _rule(op: Op, rw: Rewriter) -> RuleResult:
    if op.regions and op.results and not any(rw.old_uses.get(r, 0) for r in op.results):
        return DROP
    if op.name == R.COND and len(op.regions) == 2:
        return _cond(op, rw)
    if op.name == R.SCAN and len(op.regions) == 1:
        return _scan(op, rw)
    if op.name == R.WHILE and len(op.regions) == 2:
        return _while(op, rw)
    return None


# ---------------------------------------------------------------- helpers

def _rebuild(region: Graph, inputs: list[list[Value]], outputs: list[Value]) -> Graph:
    """A new region whose input k stands for the old values `inputs[k]` (block arguments,
    several when merged, or body values computed outside now), holding copies of the old
    ops that `outputs` still need and yielding their copies.  Nested regions are shared:
    no pass changes a graph in place."""
    new = Graph(region.name, [values[0].type for values in inputs])
    env: dict[Value, Value] = {}
    for arg, values in zip(new.inputs, inputs):
        env.update((v, arg) for v in values)
    need = {v for v in outputs if v not in env}
    keep = []
    for op in reversed(region.ops):
        if any(r in need for r in op.results):
            keep.append(op)
            need.update(v for v in op.operands if v not in env)
    for op in reversed(keep):
        copy = new.add_op(op.name, [env[v] for v in op.operands], op.attrs,
                          [r.type for r in op.results], op.loc, op.regions)
        env.update(zip(op.results, copy.results))
    new.outputs = [env[v] for v in outputs]
    return new


def _clone(rw: Rewriter, ops: list[Op], env: dict[Value, Value]) -> None:
    """Copy `ops` into the graph being built, their operands looked up in `env`."""
    for op in ops:
        copy = rw.add(op.name, [env[v] for v in op.operands], op.attrs,
                      [r.type for r in op.results], op.loc, op.regions)
        env.update(zip(op.results, copy.results))


def _used(regions: list[Graph]) -> set[Value]:
    return {v for g in regions for v in [x for op in g.ops for x in op.operands] + g.outputs}


def _distinct_used(values: list[Value], offset: int, regions: list[Graph],
                   used: set[Value]) -> list[tuple[Value, list[list[Value]]]]:
    """The operands `values` (block arguments offset, offset + 1, ... of every region) kept:
    one per distinct value that some region uses, with each region's arguments it stands for."""
    positions: dict[Value, list[int]] = {}
    for i, v in enumerate(values):
        positions.setdefault(v, []).append(i)
    kept = []
    for v, ps in positions.items():
        args = [[g.inputs[offset + p] for p in ps] for g in regions]
        if any(a in used for per_region in args for a in per_region):
            kept.append((v, args))
    return kept


def _dependencies(region: Graph) -> list[int]:
    """For each output, the block arguments it depends on, as a bit mask."""
    mask = {v: 1 << i for i, v in enumerate(region.inputs)}
    for op in region.ops:
        m = 0
        for v in op.operands:
            m |= mask.get(v, 0)
        for r in op.results:
            mask[r] = m
    return [mask.get(v, 0) for v in region.outputs]


def _deterministic(op: Op) -> bool:
    table = by_ir_name()
    inner = [o for r in op.regions for g in R.walk_graphs(r) for o in g.ops]
    return not any(table[o.name].nondeterministic for o in [op, *inner] if o.name in table)


# Kinds whose ops check indices computed from data at run time, so they can raise.
_RAISING_KINDS = ("gather", "index_add", "index_select", "scatter")


def _safe_to_speculate(op: Op) -> bool:
    """Whether `op` may run where the program might not have run it (hoisted out of a while
    loop that takes no step): it cannot raise, and it holds no loop (which might not end)."""
    opdef = by_ir_name().get(op.name)
    return not op.regions and (opdef is None or opdef.kind not in _RAISING_KINDS)


def _static(t: TensorType) -> bool:
    return all(isinstance(d, int) for d in t.shape)


def _unused(t: TensorType) -> Value:
    """A stand-in for a result nothing uses (the driver wants a value per result)."""
    return Value(t)


# ---------------------------------------------------------------- tc.cond

def _cond(op: Op, rw: Rewriter) -> RuleResult:
    pred, operands, branches = op.operands[0], op.operands[1:], op.regions
    if is_constant(pred):
        branch = branches[0] if bool(pred.op.attrs["value"]) else branches[1]
        env = dict(zip(branch.inputs, operands))
        _clone(rw, branch.ops, env)
        return [env[v] for v in branch.outputs]
    results = [j for j, r in enumerate(op.results) if rw.old_uses.get(r, 0)]
    kept = _distinct_used(operands, 0, branches, _used(branches))
    if len(kept) == len(operands) and len(results) == len(op.results):
        return None
    new_branches = [_rebuild(g, [args[k] for _, args in kept], [g.outputs[j] for j in results])
                    for k, g in enumerate(branches)]
    new = rw.add(op.name, [pred] + [v for v, _ in kept], op.attrs,
                 [op.results[j].type for j in results], op.loc, new_branches)
    out = [_unused(r.type) for r in op.results]
    for j, r in zip(results, new.results):
        out[j] = r
    return out


# ---------------------------------------------------------------- loops

class _Loop:
    """A scan or while loop being rewritten: its operand groups (new-graph values), its
    regions (each taking consts, carries and, for a scan body, x rows), and where each
    of the op's original results now comes from."""

    def __init__(self, op: Op, rw: Rewriter):
        self.op, self.rw, self.scan = op, rw, op.name == R.SCAN
        if self.scan:
            consts, init, xs = R.scan_groups(op)
        else:
            (consts, init), xs = R.while_groups(op), []
        self.consts, self.init, self.xs = list(consts), list(init), list(xs)
        self.regions = list(op.regions)
        c = len(init)
        # per carry and per y: its original result, then (scan) which y the body yields
        self.carry_results = list(op.results[:c])
        self.y_results = list(op.results[c:]) if self.scan else []
        self.replaced: dict[Value, Value] = {}     # original result -> value computed outside
        self.summed: list[tuple] = []             # (carry result, init, [(stack, transposed)] of a and b)
        self.needed: set[Value] = set()           # ys that the sums read after the loop
        self.changed = False

    @property
    def body(self) -> Graph:
        return self.regions[-1]

    def group_args(self, g: Graph) -> tuple[list[Value], list[Value], list[Value]]:
        k, c = len(self.consts), len(self.init)
        return g.inputs[:k], g.inputs[k:k + c], g.inputs[k + c:]

    def used(self, result: Value) -> bool:
        return bool(self.rw.old_uses.get(result, 0)) or result in self.needed

    # -- hoisting ------------------------------------------------------------------------
    def hoist(self) -> None:
        """Loop-invariant ops out of every region; for a scan, ops on x rows too."""
        new_consts: list[tuple[Value, list[Value]]] = []      # outer value, the region value per region
        new_xs: list[tuple[Value, Value]] = []                  # the body's row, the stacked value
        for n, g in enumerate(self.regions):
            # a while loop's body may run no step: what it hoists must be safe to run anyway
            hoisted = self.hoist_region(g, n == len(self.regions) - 1 and self.scan,
                                        speculative=not self.scan and n == 1)
            if hoisted is None:
                continue
            invariant, rows = hoisted
            for inner, outer in invariant:
                per_region = [Value(inner.type) for _ in self.regions]     # unused elsewhere
                per_region[n] = inner
                new_consts.append((outer, per_region))
            new_xs += rows
        if not new_consts and not new_xs and not self.replaced:
            return
        self.changed = True
        for n, g in enumerate(self.regions):
            consts, carry, xs = self.group_args(g)
            inputs = ([[v] for v in consts] + [[per_region[n]] for _, per_region in new_consts]
                      + [[v] for v in carry] + [[v] for v in xs])
            if self.scan:
                inputs += [[inner] for inner, _ in new_xs]
            outputs = list(g.outputs)
            if self.scan:
                c = len(self.init)
                keep = [j for j, y in enumerate(self.y_results) if y not in self.replaced]
                outputs = outputs[:c] + [outputs[c + j] for j in keep]
            self.regions[n] = _rebuild(g, inputs, outputs)
        if self.scan:
            self.y_results = [y for y in self.y_results if y not in self.replaced]
        self.consts += [outer for outer, _ in new_consts]
        self.xs += [outer for _, outer in new_xs]

    def hoist_region(self, g: Graph, rows: bool, speculative: bool = False):
        """Emit before the loop the ops of `g` that do not need a step; the body values they
        stand for, with their outer values (invariant ones, then stacked x rows), or None."""
        consts, _, xs = self.group_args(g)
        outer = dict(zip(consts, self.consts))
        stacked = dict(zip(xs, self.xs)) if rows else {}
        constants: dict[Value, Op] = {}
        invariant, row_values = [], []
        invariant_ops, over_rows = _movable(g, consts, xs if rows else [], self.op.attrs.get("length"), speculative)
        worth = _worth_hoisting(g, len(self.init), list(over_rows)) if rows else set()

        def outside(v: Value) -> Value:
            if v not in outer:      # a tc.constant of the body: copied out
                c = constants[v]
                outer[v] = self.rw.constant(c.attrs["value"], v.type, c.loc)
            return outer[v]

        for inner in g.ops:
            if inner.name == CONSTANT:
                constants[inner.result] = inner
            elif inner in invariant_ops:
                copy = self.rw.add(inner.name, [outside(v) for v in inner.operands], inner.attrs,
                                   [r.type for r in inner.results], inner.loc, inner.regions)
                outer.update(zip(inner.results, copy.results))
                invariant += zip(inner.results, copy.results)
            elif inner in worth:
                copy = self.rw.add(inner.name, [stacked[v] if v in stacked else outside(v) for v in inner.operands],
                                   inner.attrs, over_rows[inner], inner.loc)
                stacked.update(zip(inner.results, copy.results))
                row_values += zip(inner.results, copy.results)
        if rows:       # a y that is a row of a value computed outside is that value
            c = len(self.init)
            for y, v in zip(self.y_results, g.outputs[c:]):
                if v in stacked:
                    self.replaced[y] = stacked[v]
        if not invariant and not row_values and not self.replaced:
            return None
        return invariant, row_values

    # -- sums of products -------------------------------------------------------------------
    def sum_products(self) -> None:
        """Carries that accumulate a product of rows become one product after the loop
        (module docstring)."""
        length = self.op.attrs.get("length")
        if not self.scan or not isinstance(length, int) or length < 1:
            return
        body, k, c = self.body, len(self.consts), len(self.init)
        uses: dict[Value, int] = {}
        for v in [v for op in body.ops for v in op.operands] + list(body.outputs):
            uses[v] = uses.get(v, 0) + 1
        xs_args, ys = body.inputs[k + c:], body.outputs[c:]
        plans = []
        for j in range(c):
            product = _accumulated_product(body.inputs[k + j], body.outputs[j], uses)
            rows = [_row(v, xs_args, ys) for v in product.operands] if product is not None else [None]
            if None not in rows:
                plans.append((j, rows))
        if not plans:
            return
        self.changed = True
        planned = {j for j, _ in plans}
        kept = [j for j in range(c) if j not in planned]
        consts, carry, xs = self.group_args(body)
        inputs = [[v] for v in consts] + [[carry[j]] for j in kept] + [[v] for v in xs]
        self.regions[-1] = _rebuild(body, inputs, [body.outputs[j] for j in kept] + list(ys))
        for j, rows in plans:
            stacks = [(self.xs[xs_args.index(v)] if kind == "x" else self.y_results[ys.index(v)], t)
                      for kind, v, t in rows]
            self.summed.append((self.carry_results[j], self.init[j], stacks))
            self.needed.update(s for s, _ in stacks)
        self.init = [self.init[j] for j in kept]
        self.carry_results = [self.carry_results[j] for j in kept]

    def emit_sums(self, results: dict[Value, Value]) -> None:
        """After the loop: each summed carry as init + one product of the stacked rows."""
        rw, loc, length = self.rw, self.op.loc, self.op.attrs.get("length")
        for result, init, ((sa, ta), (sb, tb)) in self.summed:
            a, b = (results.get(v, v) for v in (sa, sb))
            m, n = result.type.shape
            kk = (a.type.shape[1] if ta else a.type.shape[2])
            # a_i (m, kk): its stack (T, m, kk), or a_i^T's (T, kk, m), as (m, T*kk)
            a = (_permute(rw, _reshape(rw, a, (length * kk, m), loc), (1, 0), loc) if ta
                 else _reshape(rw, _permute(rw, a, (1, 0, 2), loc), (m, length * kk), loc))
            # b_i (kk, n): its stack (T, kk, n), or b_i^T's (T, n, kk), as (T*kk, n)
            b = (_reshape(rw, _permute(rw, b, (0, 2, 1), loc), (length * kk, n), loc) if tb
                 else _reshape(rw, b, (length * kk, n), loc))
            total = rw.add(MATMUL, [a, b], {}, [result.type], loc).result
            results[result] = rw.add(ADD, [init, total], {"alpha": 1}, [result.type], loc).result

    # -- dead carries and ys ---------------------------------------------------------------
    def drop_dead(self) -> None:
        k, c = len(self.consts), len(self.init)
        deps = [_dependencies(g) for g in self.regions]
        ys = [j for j, y in enumerate(self.y_results) if self.used(y)]
        needed_args = 0
        if not self.scan:
            needed_args |= deps[0][0]          # what the while condition reads
        for j in ys:
            needed_args |= deps[-1][c + j]
        carries = {j for j, r in enumerate(self.carry_results) if self.used(r)}
        while True:       # a carry a needed output depends on is needed: to the fixed point
            for j in carries:
                needed_args |= deps[-1][j]
            more = {j for j in range(c) if needed_args >> (k + j) & 1} - carries
            if not more:
                break
            carries |= more
        carries = sorted(carries)
        if len(carries) == c and len(ys) == len(self.y_results):
            return
        self.changed = True
        for n, g in enumerate(self.regions):
            consts, carry, xs = self.group_args(g)
            inputs = [[v] for v in consts] + [[carry[j]] for j in carries] + [[v] for v in xs]
            if g is self.body:
                outputs = [g.outputs[j] for j in carries] + [g.outputs[c + j] for j in ys]
            else:
                outputs = list(g.outputs)
            self.regions[n] = _rebuild(g, inputs, outputs)
        self.init = [self.init[j] for j in carries]
        self.carry_results = [self.carry_results[j] for j in carries]
        self.y_results = [self.y_results[j] for j in ys]

    # -- operands --------------------------------------------------------------------------
    def drop_operands(self) -> None:
        """Consts and scanned inputs no region reads, or passed twice."""
        used = _used(self.regions)
        k, c = len(self.consts), len(self.init)
        consts = _distinct_used(self.consts, 0, self.regions, used)
        xs = _distinct_used(self.xs, k + c, [self.body], used) if self.scan else []
        if len(consts) == k and len(xs) == len(self.xs):
            return
        self.changed = True
        for n, g in enumerate(self.regions):
            carry = self.group_args(g)[1]
            inputs = [args[n] for _, args in consts] + [[v] for v in carry]
            if g is self.body and self.scan:
                inputs += [args[0] for _, args in xs]
            self.regions[n] = _rebuild(g, inputs, list(g.outputs))
        self.consts = [v for v, _ in consts]
        self.xs = [v for v, _ in xs]

    # -- the op ------------------------------------------------------------------------------
    def emit(self) -> RuleResult:
        if not self.changed:
            return None
        op = self.op
        attrs = {**op.attrs, "num_consts": len(self.consts)}
        if self.scan:
            attrs["num_carry"] = len(self.init)
        length = op.attrs.get("length")
        types = [v.type for v in self.init] + [R.stacked_type(y.type, length) for y in self.body.outputs[len(self.init):]]
        results: dict[Value, Value] = dict(self.replaced)
        if types:
            new = self.rw.add(op.name, self.consts + self.init + self.xs, attrs, types, op.loc, self.regions)
            results.update(zip(self.carry_results + self.y_results, new.results))
        self.emit_sums(results)
        return [results.get(r) or _unused(r.type) for r in op.results]


def _accumulated_product(arg: Value, out: Value, uses: dict[Value, int]) -> Op | None:
    """The matmul of 2-d rows that carry `arg` adds to itself (out = arg + a @ b, each
    value used only there), or None."""
    add = out.op
    if add is None or add.name != ADD or add.attrs.get("alpha", 1) != 1 or len(add.operands) != 2 \
            or uses.get(arg, 0) != 1 or uses.get(out, 0) != 1 or out.type != arg.type or arg.type.ndim != 2:
        return None
    a, b = add.operands
    product = b if a is arg else a if b is arg else None
    if product is None or product.op is None or product.op.name != MATMUL or uses.get(product, 0) != 1 \
            or product.type != arg.type or any(v.type.ndim != 2 for v in product.op.operands):
        return None
    return product.op


def _row(v: Value, xs_args: list[Value], ys: list[Value]):
    """How a matmul operand of a summed product is stacked outside the loop: ("x", block
    argument, transposed) or ("y", yielded value, transposed); None when it is not."""
    transposed = v.op is not None and v.op.name == PERMUTE and tuple(v.op.attrs["dims"]) == (1, 0)
    source = v.op.operands[0] if transposed else v
    if source in xs_args:
        return "x", source, transposed
    if source in ys:
        return "y", source, transposed
    return None


def _reshape(rw: Rewriter, v: Value, shape: tuple, loc) -> Value:
    return rw.add(RESHAPE, [v], {"shape": shape}, [TensorType(shape, v.type.dtype)], loc).result


def _permute(rw: Rewriter, v: Value, dims: tuple, loc) -> Value:
    shape = tuple(v.type.shape[d] for d in dims)
    return rw.add(PERMUTE, [v], {"dims": dims}, [TensorType(shape, v.type.dtype)], loc).result


def _movable(g: Graph, consts: list[Value], xs: list[Value], length, speculative: bool) -> tuple[set[Op], dict]:
    """The ops of region `g` that need no step: (the invariant ones, which read only consts,
    constants and each other; {op over x rows: its result types over all steps}, which read
    x rows too).  No op that draws random numbers; in a while loop's body (`speculative`),
    only ops safe to run when no step would have (_safe_to_speculate)."""
    outer, stacked, invariant, over_rows = set(consts), set(xs), set(), {}
    for inner in g.ops:
        if inner.name == CONSTANT:
            outer.add(inner.result)
            continue
        if not _deterministic(inner) or speculative and not _safe_to_speculate(inner):
            continue
        if all(v in outer for v in inner.operands):
            outer.update(inner.results)
            invariant.add(inner)
        elif all(v in outer or v in stacked for v in inner.operands):
            types = _over_rows(inner, [v in stacked for v in inner.operands], length)
            if types is not None:
                over_rows[inner] = types
                stacked.update(inner.results)
    return invariant, over_rows


def _worth_hoisting(g: Graph, num_carry: int, over_rows: list[Op]) -> set[Op]:
    """Of the ops over rows, those worth running over all steps: matmuls (one large product
    instead of a small one per step) and what they read; another op only when the body no
    longer needs its row (its uses are hoisted too, or ys).  Otherwise the loop reads a
    stacked row that it could compute from rows it reads anyway, and the stack costs a
    write and a read of every row (W12's backward scan: 7% of the step)."""
    users: dict[Value, list[Op]] = {}
    for op in g.ops:
        for v in op.operands:
            users.setdefault(v, []).append(op)
    carried = set(g.outputs[:num_carry])
    feeds: set[Op] = set()
    for op in reversed(over_rows):       # users come later: a matmul's producers after it
        if op.name == MATMUL or any(u in feeds for r in op.results for u in users.get(r, ())):
            feeds.add(op)
    row_op = set(over_rows)
    hoisted = set(over_rows)
    changed = True
    while changed:
        changed = False
        for op in over_rows:
            if op not in hoisted or op in feeds:
                continue
            needed = any(r in carried or any(u not in hoisted for u in users.get(r, ())) for r in op.results)
            orphan = any(v.op in row_op and v.op not in hoisted for v in op.operands)
            if needed or orphan:
                hoisted.discard(op)
                changed = True
    return hoisted


def _over_rows(op: Op, is_row: list[bool], length) -> list[TensorType] | None:
    """The result types of `op` applied to whole stacked xs where `is_row` marks its operands
    that are x rows, if that computes every step's result at once (row i of the result is
    the op on rows i); None otherwise."""
    opdef = by_ir_name().get(op.name)
    if opdef is None or not isinstance(length, int):
        return None
    ranks = [v.type.ndim for v in op.operands]
    rows = [r for r, x in zip(ranks, is_row) if x]
    if opdef.kind == "elementwise":
        # a row with fewer dims than the result would broadcast against the step dim
        if any(r != op.results[0].type.ndim for r in rows):
            return None
    elif op.name == MATMUL and len(op.operands) == 2 and sum(is_row) == 1:
        x, w = (ranks[0], ranks[1]) if is_row[0] else (ranks[1], ranks[0])
        # x[i] @ W: W must not add batch dims of its own (then the step dim would not lead);
        # W @ x[i]: a 1-d x[i] is a vector, xs a matrix: only for x[i] of 2 dims or more
        if (w > max(2, x)) if is_row[0] else (x < 2 or w > x):
            return None
    else:
        return None
    types = [R.stacked_type(v.type, length) if x else v.type for v, x in zip(op.operands, is_row)]
    try:
        inferred = rules.infer(opdef, opdef.arguments_from(types, op.attrs))
    except Exception:        # any refusal of the shape rule: keep the op in the body
        return None
    want = [R.stacked_type(r.type, length) for r in op.results]
    return want if inferred == want else None


def _scan(op: Op, rw: Rewriter) -> RuleResult:
    length, c = op.attrs.get("length"), op.attrs.get("num_carry")
    if length == 0 and all(_static(r.type) for r in op.results[c:]):
        init = R.scan_groups(op)[1]
        return list(init) + [rw.constant(np.zeros(r.type.shape, r.type.dtype.np), r.type, op.loc)
                             for r in op.results[c:]]
    loop = _Loop(op, rw)
    loop.hoist()
    loop.sum_products()
    loop.drop_dead()
    loop.drop_operands()
    return loop.emit()


def _while(op: Op, rw: Rewriter) -> RuleResult:
    loop = _Loop(op, rw)
    loop.hoist()
    loop.drop_dead()
    loop.drop_operands()
    return loop.emit()
