"""Scheduling the fused attention (ops.yaml kind `attention`): one kernel per op, a parallel
loop over the batch items (batch x heads), each walking tiles of BLOCK query rows by BLOCK
keys on its own thread, so the L x S scores never exist in memory whole.

Forward, per batch item, for query rows q (L, E), keys k (S, E) and values v (S, Ev):
    m = -inf, l = 0, out = 0                              (per query row)
    for each query block Q, for each key block K (serial Loops; shorter last blocks after):
        s = q[Q] @ k[K]^T * scale, masked                  Matmul, the mask in its epilogue
        per row: m' = max(m, max_j s); p = exp(s - m'); l = l e^(m - m') + sum_j p;
                 out[Q] *= e^(m - m'); m = m'              (the online softmax)
        out[Q] += p @ v[K]                                 Matmul, accumulating
    out /= l; logsumexp = m + log l                        (0 and -inf for a row masked throughout)
Backward, per batch item, the probabilities recomputed from logsumexp:
    delta = rowsum(grad_out * out); dq = dk = dv = 0
    for each tile: p = exp(q[Q] @ k[K]^T * scale - logsumexp)      Matmul + epilogue
                   dv[K] += p^T @ grad_out[Q]                      Matmul
                   ds = p * (grad_out[Q] @ v[K]^T - delta) * scale Matmul + epilogue
                   dk[K] += ds^T @ q[Q];  dq[Q] += ds @ k[K]       Matmuls
With is_causal, a query block visits only the key blocks up to its diagonal (the key loop's
trip count is min(qb + 1, blocks): a triangular nest), so causal attention does about half
the products.  The products run on the packed GEMM kernel, each on its thread's slice of the
workspace, with the operands read in place (transposes are strides); the temporaries hold
one tile per batch item.  One parallel region per call: products parallelized one by one
were a region per tile, and on a loaded machine every region waits for a descheduled
thread.  A length unknown until run time is tiled alike: the count of full blocks and the
length of the last (perhaps empty) one are computed at run time.
"""
from __future__ import annotations

import math

from ...core import dtypes as dt
from ...ir import Op
from ...core.symbolic import hint, is_dynamic
from ..loops import index as I
from ..loops import ir as L
from ..loops.exprs import PRIMITIVES, X
from .operands import dense_strides, half_source, operand_view
from .nests import fresh_name
from .tiles import max_threads, uses_packed, workspace_elements

BLOCK = 64             # query rows and keys per tile: (..., 64, 64) temps instead of (..., L, S) scores
NEG_INF = float("-inf")
where = PRIMITIVES["where"]


def attention(sched, op: Op, args: dict) -> list:
    plan = _Plan(sched, op, args)
    return plan.forward() if sched.table[op.name].impl == "forward" else plan.backward()


class _Plan:
    def __init__(self, sched, op: Op, args: dict):
        self.sched, self.args = sched, args
        q, k = args["query"], args["key"]
        self.batch = tuple(q.type.shape[:-2])
        self.rows, self.features = q.type.shape[-2], q.type.shape[-1]
        self.keys = k.type.shape[-2]
        self.dtype = q.type.dtype
        self.causal = bool(args["is_causal"])
        self.scale = 1 / math.sqrt(self.features) if args["scale"] is None else args["scale"]
        self.results = [sched.names[r] for r in op.results]
        self.row_block = BLOCK if is_dynamic(self.rows) else min(self.rows, BLOCK)
        self.key_block = BLOCK if is_dynamic(self.keys) else min(self.keys, BLOCK)
        self.tile = self.batch + (self.row_block, self.key_block)
        self.workspace = None
        self.reads_half = uses_packed(self.dtype, *(_hint(d) for d in (self.row_block, self.key_block, self.features)))
        self.b: tuple = ()              # the batch item's index (loop vars), while building

    # ---------------------------------------------------------------- pieces
    def items(self, build) -> list:
        """build() for one batch item inside a loop nest over the batch, parallel over its
        first dim that is not 1."""
        index = tuple(L.Var(f"bt{d}", L.INDEX) for d in range(len(self.batch)))
        self.b = index
        body = build()
        for d in reversed(range(len(self.batch))):
            body = [L.Loop(index[d].name, I.dim(self.batch[d]), body)]
        loop = body[0] if body and self.batch else None
        while loop is not None and loop.extent == 1 and isinstance(loop.body[0], L.Loop):
            loop = loop.body[0]
        if loop is not None and loop.extent != 1:
            loop.parallel = True
        return body

    def temp(self, prefix: str, shape: tuple) -> str:
        name = fresh_name(self.sched.buffers, prefix)
        self.sched.buffers[name] = L.Buffer(name, self.dtype, tuple(I.dim(d) for d in shape), "temp")
        return name

    def _at(self, offset, lead, row, col, start, transposed: bool) -> tuple:
        for b, stride in zip(self.b, lead):
            offset = I.add(offset, I.mul(b, stride))
        if start is not None:
            offset = I.add(offset, I.mul(start, row))
        return offset, ((col, row) if transposed else (row, col))

    def view(self, value, start=None, transposed: bool = False) -> L.View:
        """The batch item's (rows, cols) View of an operand, from row `start`, or its transpose."""
        if self.reads_half:     # q, k, v, grad_out widened from bf16: products read the bf16 (schedule/matmul.py)
            value = half_source(self.sched, value)
        v = operand_view(self.sched, value, self.batch, row=True, col=True)
        *lead, row, col = v.strides
        return L.View(v.buffer, *self._at(v.offset, lead, row, col, start, transposed))

    def dense(self, buffer: str, shape: tuple, start=None, transposed: bool = False) -> L.View:
        """The batch item's View of a dense buffer of `shape` (batch..., rows, cols) from row `start`."""
        *lead, row, col = (I.expr(st) for st in dense_strides(shape))
        return L.View(buffer, *self._at(I.ic(0), lead, row, col, start, transposed))

    def product(self, out: L.View, a: L.View, b: L.View, m, n, k, epilogue=None, accumulate=False) -> L.Matmul:
        """One matrix product on the batch item's thread, sharing the kernel's workspace."""
        workspace = None
        if uses_packed(self.dtype, *(_hint(d) for d in (m, n, k))):
            workspace = self.workspace = self.workspace or fresh_name(self.sched.buffers, "w")
            known = [d if isinstance(d, int) else None for d in (m, n, k)]
            operands = tuple(self.sched.buffers[v.buffer].dtype for v in (a, b))
            size = workspace_elements(self.dtype, *known, max_threads(), operands)      # a slice per thread
            old = self.sched.buffers.get(workspace)
            if old is None or old.shape[0] < size:
                self.sched.buffers[workspace] = L.Buffer(workspace, self.dtype, (size,), "temp")
        return L.Matmul(out, a, b, I.dim(m), I.dim(n), I.dim(k), accumulate=accumulate, epilogue=epilogue,
                        index=("i", "j"), workspace=workspace)

    def row_loop(self, inner, var: str, count=None, start=None) -> list:
        """A serial loop over `count` query rows from `start` (all of them by default);
        inner(local row, row) gives its statements."""
        i = L.Var(var, L.INDEX)
        row = i if start is None else I.add(i, start)
        return [L.Loop(var, I.dim(self.rows if count is None else count), inner(i, row))]

    def tiles(self, tile) -> list:
        """tile(q_start, q_count, k_start, k_count, tag) over every tile: full blocks in
        serial Loops (qb, kb), then the shorter last ones; causal: only up to the diagonal."""
        body = []
        for qi, (qs, qn, q_loop) in enumerate(_spans(self.rows, self.row_block, "qb")):
            inner = []
            last_row = None if q_loop is not None or not isinstance(qn, int) else qs.value + qn - 1
            # (causal, equal lengths: the short last key block lies past every full query block)
            past = self.causal and q_loop is not None and self.rows == self.keys and self.row_block == self.key_block
            for ki, (ks, kn, k_loop) in enumerate(_spans(self.keys, self.key_block, "kb")):
                if k_loop is None:         # the last key block, or all the keys
                    if not (self.causal and last_row is not None and ks.value > last_row) and not (past and ki):
                        inner += tile(qs, qn, ks, kn, f"{qi}{ki}")
                    continue
                trips = k_loop
                if self.causal and last_row is not None:
                    trips = min(last_row // self.key_block + 1, k_loop)
                elif self.causal and q_loop is not None and self.row_block == self.key_block:
                    trips = L.Binary("minimum", I.add(L.Var("qb", L.INDEX), 1), I.expr(k_loop), L.INDEX)
                if trips != 0:
                    inner.append(L.Loop("kb", trips, tile(qs, qn, ks, kn, f"{qi}{ki}")))
            body += [L.Loop("qb", q_loop, inner)] if q_loop is not None else inner
        return body

    def scores(self, acc: L.Expr, q_start, k_start) -> tuple[X, X | None]:
        """(the scaled, additively masked score at the epilogue's index (i, j), whether it is
        kept (None: always)) for the product q[q_start:] @ k[k_start:]^T accumulated in `acc`."""
        value = X(acc) * self.scale
        row, key = I.add(L.Var("i", L.INDEX), q_start), I.add(L.Var("j", L.INDEX), k_start)
        if self.causal:
            return value, X(key) <= X(row)
        mask = self.args.get("attn_mask")
        if mask is None:
            return value, None
        full = self.batch + (self.rows, self.keys)
        m = X(self.sched.inliner.value_at(mask, I.broadcast(self.b + (row, key), full, mask.type.shape)))
        return (value, m) if mask.type.dtype is dt.BOOL else (value + m, None)

    # ---------------------------------------------------------------- forward
    def forward(self) -> list:
        out, lse = self.results
        ev = self.args["value"].type.shape[-1]
        t = self.dtype
        top, total = self.temp("am", self.batch + (self.rows,)), self.temp("al", self.batch + (self.rows,))
        p = self.temp("ap", self.tile)
        out_shape = self.batch + (self.rows, ev)
        zero, minus_inf = X(L.Const(0.0, t)), X(L.Const(NEG_INF, t))

        def init(_, i):
            d, at = L.Var("d", L.INDEX), self.b + (i,)
            return [L.Store(top, at, minus_inf.e), L.Store(total, at, zero.e),
                    L.Loop("d", I.dim(ev), [L.Store(out, at + (d,), zero.e)])]

        def tile(qs, qn, ks, kn, tag):
            value, keep = self.scores(L.Var("acc", t), qs, ks)
            scores = value if keep is None else where(keep, value, minus_inf)

            def online(local, i):
                j, d = L.Var("j" + tag, L.INDEX), L.Var("d" + tag, L.INDEX)
                ix, at = self.b + (i,), self.b + (local, j)
                old, new, safe, alpha = (X(L.Var(n + tag, t)) for n in ("m_old", "m_new", "m_safe", "alpha"))
                mx, acc = "mx" + tag, "sum" + tag
                return [
                    L.Reduce(j.name, I.dim(kn), [L.Accumulator(mx, t, minus_inf.e)], [],
                             [L.Binary("maximum", L.Var(mx, t), L.Load(p, at, t), t)]),
                    L.Let(old.e.name, L.Load(top, ix, t)),
                    L.Let(new.e.name, L.Binary("maximum", old.e, L.Var(mx, t), t)),
                    L.Let(safe.e.name, where(new == NEG_INF, zero, new).e),
                    L.Let(alpha.e.name, L.Unary("exp", (old - safe).e, t)),
                    L.Loop(j.name, I.dim(kn), [L.Store(p, at, L.Unary("exp", (X(L.Load(p, at, t)) - safe).e, t))]),
                    L.Reduce(j.name, I.dim(kn), [L.Accumulator(acc, t, zero.e)], [],
                             [L.Binary("add", L.Var(acc, t), L.Load(p, at, t), t)]),
                    L.Store(total, ix, (X(L.Load(total, ix, t)) * alpha + X(L.Var(acc, t))).e),
                    L.Store(top, ix, new.e),
                    L.Loop(d.name, I.dim(ev), [L.Store(out, ix + (d,), (X(L.Load(out, ix + (d,), t)) * alpha).e)]),
                ]
            return ([self.product(self.dense(p, self.tile), self.view(self.args["query"], qs),
                                  self.view(self.args["key"], ks, True), qn, kn, self.features, epilogue=scores.e)]
                    + self.row_loop(online, "r" + tag, qn, qs)
                    + [self.product(self.dense(out, out_shape, qs), self.dense(p, self.tile),
                                    self.view(self.args["value"], ks), qn, ev, kn, accumulate=True)])

        def finish(_, i):
            d, ix = L.Var("d", L.INDEX), self.b + (i,)
            sum_, empty = X(L.Var("l", t)), X(L.Var("empty", dt.BOOL))
            return [L.Let("l", L.Load(total, ix, t)), L.Let("empty", (sum_ == 0.0).e),
                    L.Store(lse, ix, where(empty, minus_inf, X(L.Load(top, ix, t)) + X(L.Unary("log", sum_.e, t))).e),
                    L.Loop("d", I.dim(ev), [L.Store(out, ix + (d,), where(
                        empty, zero, X(L.Load(out, ix + (d,), t)) / sum_).e)])]
        return self.items(lambda: self.row_loop(init, "z") + self.tiles(tile) + self.row_loop(finish, "f"))

    # ---------------------------------------------------------------- backward
    def backward(self) -> list:
        dq, dk, dv = self.results
        a, t = self.args, self.dtype
        ev = a["value"].type.shape[-1]
        q_shape, k_shape, v_shape = (a[n].type.shape for n in ("query", "key", "value"))
        delta, p, ds = self.temp("ad", self.batch + (self.rows,)), self.temp("ap", self.tile), self.temp("as", self.tile)
        inliner = self.sched.inliner

        def rowsum(_, i):
            d, ix = L.Var("d", L.INDEX), self.b + (i,)
            term = X(inliner.value_at(a["grad_out"], ix + (d,))) * X(inliner.value_at(a["out"], ix + (d,)))
            return [L.Reduce("d", I.dim(ev), [L.Accumulator("dot", t, L.Const(0.0, t))], [],
                             [(X(L.Var("dot", t)) + term).e]),
                    L.Store(delta, ix, L.Var("dot", t))]

        def zeros(name, shape, var):
            i, d = L.Var(var, L.INDEX), L.Var(var + "d", L.INDEX)
            return [L.Loop(var, I.dim(shape[-2]), [L.Loop(d.name, I.dim(shape[-1]),
                                                          [L.Store(name, self.b + (i, d), L.Const(0.0, t))])])]

        def tile(qs, qn, ks, kn, tag):
            row = I.add(L.Var("i", L.INDEX), qs)
            value, keep = self.scores(L.Var("acc", t), qs, ks)
            lse = X(inliner.value_at(a["logsumexp"], self.b + (row,)))
            dead = lse == NEG_INF if keep is None else (lse == NEG_INF) | ~keep
            prob = where(dead, X(L.Const(0.0, t)), X(L.Unary("exp", (value - lse).e, t)))
            at = self.b + (L.Var("i", L.INDEX), L.Var("j", L.INDEX))
            grad_p = X(L.Load(p, at, t)) * (X(L.Var("acc", t)) - X(L.Load(delta, self.b + (row,), t))) * self.scale
            return [
                self.product(self.dense(p, self.tile), self.view(a["query"], qs), self.view(a["key"], ks, True),
                             qn, kn, self.features, epilogue=prob.e),
                self.product(self.dense(dv, v_shape, ks), self.dense(p, self.tile, transposed=True),
                             self.view(a["grad_out"], qs), kn, ev, qn, accumulate=True),
                self.product(self.dense(ds, self.tile), self.view(a["grad_out"], qs), self.view(a["value"], ks, True),
                             qn, kn, ev, epilogue=grad_p.e),
                self.product(self.dense(dk, k_shape, ks), self.dense(ds, self.tile, transposed=True),
                             self.view(a["query"], qs), kn, self.features, qn, accumulate=True),
                self.product(self.dense(dq, q_shape, qs), self.dense(ds, self.tile), self.view(a["key"], ks),
                             qn, self.features, kn, accumulate=True),
            ]
        return self.items(lambda: self.row_loop(rowsum, "r") + zeros(dq, q_shape, "zq") + zeros(dk, k_shape, "zk")
                          + zeros(dv, v_shape, "zv") + self.tiles(tile))


def _spans(n, block, var: str) -> list:
    """(start, count, trips) covering range(n): the full blocks as a loop over `var` (trips
    of them, start an expression of var), then the rest (trips None).  A dynamic n: both,
    their trips and count computed at run time (the rest may be empty)."""
    if is_dynamic(n):
        full = I.floordiv(I.expr(n), block)
        start = I.mul(full, block)
        return [(I.mul(L.Var(var, L.INDEX), block), block, full), (start, I.sub(I.expr(n), start), None)]
    full, rest = divmod(n, block)
    spans = [(I.mul(L.Var(var, L.INDEX), block), block, full)] if full else []
    return spans + ([(I.ic(full * block), rest, None)] if rest else [])


def _hint(d) -> int:
    """A stand-in size for heuristics: a tile's run-time count is at most a block."""
    return hint(d) if isinstance(d, int) or is_dynamic(d) else BLOCK
