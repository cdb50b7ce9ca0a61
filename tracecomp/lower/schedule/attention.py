"""Scheduling the fused attention (ops.yaml kind `attention`): one kernel per op that walks
the keys a block at a time, so the L x S scores never exist in memory whole.

Forward, for query rows q (..., L, E), keys k (..., S, E) and values v (..., S, Ev):
    m = -inf, l = 0, out = 0                              (per query row)
    for each block of KEY_BLOCK keys (a serial Loop; a shorter last block after it):
        s = q @ k[block]^T * scale, masked                 Matmul, the mask in its epilogue
        per row: m' = max(m, max_j s); p = exp(s - m'); l = l e^(m - m') + sum_j p;
                 out *= e^(m - m'); m = m'                 (the online softmax)
        out += p @ v[block]                                Matmul, accumulating
    out /= l; logsumexp = m + log l                        (0 and -inf for a row masked throughout)
Backward, the probabilities recomputed from logsumexp (FlashAttention-2's order):
    delta = rowsum(grad_out * out); dq = 0
    for each block: p = exp(q @ k[block]^T * scale - logsumexp)     Matmul + epilogue
                    dv[block] = p^T @ grad_out                       Matmul
                    ds = p * (grad_out @ v[block]^T - delta) * scale Matmul + epilogue
                    dk[block] = ds^T @ q;  dq += ds @ k[block]       Matmuls
Every product runs on the packed GEMM kernel with the operands read in place (transposes
are strides), and the temporaries hold one block: (..., L, KEY_BLOCK) each.  A key length
unknown until run time is one block of all the keys.
"""
from __future__ import annotations

import math

from ... import dtypes as dt
from ...ir import Op
from ...symbolic import hint, is_dynamic
from ..loops import index as I
from ..loops import ir as L
from ..loops.exprs import X
from .matmul import operand_view
from .nests import fresh_name, loop_nest
from .tiles import uses_packed, workspace_elements

KEY_BLOCK = 128        # keys per block: a (..., L, 128) temp instead of (..., L, S) scores
NEG_INF = float("-inf")


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
        self.scale = 1 / math.sqrt(self.features) if args["scale"] is None else args["scale"]
        self.results = [sched.names[r] for r in op.results]
        self.block = self.keys if is_dynamic(self.keys) else min(self.keys, KEY_BLOCK)
        self.workspace = None
        self.index = tuple(f"b{d}" for d in range(len(self.batch))) + ("i", "j")

    # ---------------------------------------------------------------- pieces
    def temp(self, prefix: str, shape: tuple) -> str:
        name = fresh_name(self.sched.buffers, prefix)
        self.sched.buffers[name] = L.Buffer(name, self.dtype, tuple(I.dim(d) for d in shape), "temp")
        return name

    def view(self, value, start=None, transposed: bool = False) -> L.View:
        """A (batch..., rows, cols) View of an operand, from row `start` on, or its transpose."""
        v = operand_view(self.sched, value, self.batch, row=True, col=True)
        *lead, row, col = v.strides
        offset = v.offset if start is None else I.add(v.offset, I.mul(start, row))
        return L.View(v.buffer, offset, tuple(lead) + ((col, row) if transposed else (row, col)))

    def dense(self, buffer: str, shape: tuple, start=None, transposed: bool = False) -> L.View:
        """A View of a dense buffer of `shape` (batch..., rows, cols) from row `start`."""
        strides = [I.expr(math.prod(I.symbolic(d) for d in shape[c + 1:])) for c in range(len(shape))]
        *lead, row, col = strides
        offset = I.ic(0) if start is None else I.mul(start, row)
        return L.View(buffer, offset, tuple(lead) + ((col, row) if transposed else (row, col)))

    def product(self, out: L.View, a: L.View, b: L.View, m, n, k, epilogue=None, accumulate=False) -> L.Matmul:
        if not any(is_dynamic(d) for d in self.batch) and uses_packed(self.dtype, hint(m), hint(n), hint(k)):
            if self.workspace is None:
                self.workspace = fresh_name(self.sched.buffers, "w")
            known = [None if is_dynamic(d) else d for d in (m, n, k)]
            size = workspace_elements(self.dtype, *known, math.prod(self.batch))
            old = self.sched.buffers.get(self.workspace)
            if old is None or old.shape[0] < size:
                self.sched.buffers[self.workspace] = L.Buffer(self.workspace, self.dtype, (size,), "temp")
            workspace = self.workspace
        else:
            workspace = None
        return L.Matmul(out, a, b, I.dim(m), I.dim(n), I.dim(k), tuple(I.dim(d) for d in self.batch),
                        accumulate=accumulate, epilogue=epilogue, index=self.index, workspace=workspace)

    def row_nest(self, inner, prefix: str) -> list:
        """A loop nest over the query rows (batch..., L), parallel when it pays."""
        return loop_nest(self.batch + (self.rows,), inner, prefix)

    def blocks(self, body) -> list:
        """body(start, width, tag) for every key block: full blocks in a serial Loop, then the
        shorter last one."""
        if is_dynamic(self.keys):
            return body(I.ic(0), self.keys, "")
        full, rest = divmod(self.keys, self.block)
        out = []
        if full:
            start = I.mul(L.Var("kb", L.INDEX), self.block)
            out.append(L.Loop("kb", full, body(start, self.block, "")))
        if rest:
            out += body(I.ic(full * self.block), rest, "_last")
        return out

    def scores(self, acc: L.Expr, start) -> tuple[X, X | None]:
        """(the scaled, additively masked score at the epilogue's index, whether it is kept
        (None: always)) for the product q @ k[start:]^T accumulated in `acc`."""
        value = X(acc) * self.scale
        b, i, j = self.epilogue_index()
        key = I.add(j, start)
        if self.args["is_causal"]:
            return value, X(key) <= X(i)
        mask = self.args.get("attn_mask")
        if mask is None:
            return value, None
        full = self.batch + (self.rows, self.keys)
        m = X(self.sched.inliner.value_at(mask, I.broadcast(b + (i, key), full, mask.type.shape)))
        return (value, m) if mask.type.dtype is dt.BOOL else (value + m, None)

    def epilogue_index(self):
        names = [L.Var(n, L.INDEX) for n in self.index]
        return tuple(names[:-2]), names[-2], names[-1]

    # ---------------------------------------------------------------- forward
    def forward(self) -> list:
        out, lse = self.results
        ev = self.args["value"].type.shape[-1]
        t = self.dtype
        top, total = self.temp("am", self.batch + (self.rows,)), self.temp("al", self.batch + (self.rows,))
        p = self.temp("ap", self.batch + (self.rows, self.block))
        out_shape = self.batch + (self.rows, ev)

        def init(ix):
            return [L.Store(top, ix, L.Const(NEG_INF, t)), L.Store(total, ix, L.Const(0.0, t)),
                    L.Loop("d", I.dim(ev), [L.Store(out, ix + (L.Var("d", L.INDEX),), L.Const(0.0, t))])]

        def block(start, width, tag):
            value, keep = self.scores(L.Var("acc", t), start)
            scores = value if keep is None else _select(keep, value, X(L.Const(NEG_INF, t)))
            p_view = self.dense(p, self.batch + (self.rows, self.block))
            s = self.product(p_view, self.view(self.args["query"]), self.view(self.args["key"], start, True),
                             self.rows, width, self.features, epilogue=scores.e)

            def online(ix):
                j, d = L.Var("j" + tag, L.INDEX), L.Var("d" + tag, L.INDEX)
                row = ix + (j,)
                old, new, safe, alpha = (X(L.Var(n + tag, t)) for n in ("m_old", "m_new", "m_safe", "alpha"))
                mx, acc = "mx" + tag, "sum" + tag
                at = X(L.Load(p, row, t))
                return [
                    L.Reduce(j.name, I.dim(width), [L.Accumulator(mx, t, L.Const(NEG_INF, t))], [],
                             [L.Binary("maximum", L.Var(mx, t), L.Load(p, row, t), t)]),
                    L.Let(old.e.name, L.Load(top, ix, t)),
                    L.Let(new.e.name, L.Binary("maximum", old.e, L.Var(mx, t), t)),
                    L.Let(safe.e.name, _select(new == NEG_INF, X(L.Const(0.0, t)), new).e),
                    L.Let(alpha.e.name, L.Unary("exp", (old - safe).e, t)),
                    L.Loop(j.name, I.dim(width), [L.Store(p, row, L.Unary("exp", (at - safe).e, t))]),
                    L.Reduce(j.name, I.dim(width), [L.Accumulator(acc, t, L.Const(0.0, t))], [],
                             [L.Binary("add", L.Var(acc, t), L.Load(p, row, t), t)]),
                    L.Store(total, ix, (X(L.Load(total, ix, t)) * alpha + X(L.Var(acc, t))).e),
                    L.Store(top, ix, new.e),
                    L.Loop(d.name, I.dim(ev), [L.Store(out, ix + (d,), (X(L.Load(out, ix + (d,), t)) * alpha).e)]),
                ]
            pv = self.product(self.dense(out, out_shape), self.dense(p, self.batch + (self.rows, self.block)),
                              self.view(self.args["value"], start), self.rows, ev, width, accumulate=True)
            return [s] + self.row_nest(online, "r" + tag) + [pv]

        def finish(ix):
            d = L.Var("d", L.INDEX)
            sum_, empty = X(L.Var("l", t)), X(L.Var("empty", dt.BOOL))
            return [L.Let("l", L.Load(total, ix, t)), L.Let("empty", (sum_ == 0.0).e),
                    L.Store(lse, ix, _select(empty, X(L.Const(NEG_INF, t)),
                                             X(L.Load(top, ix, t)) + X(L.Unary("log", sum_.e, t))).e),
                    L.Loop("d", I.dim(ev), [L.Store(out, ix + (d,), _select(
                        empty, X(L.Const(0.0, t)), X(L.Load(out, ix + (d,), t)) / sum_).e)])]
        return self.row_nest(init, "z") + self.blocks(block) + self.row_nest(finish, "f")

    # ---------------------------------------------------------------- backward
    def backward(self) -> list:
        dq, dk, dv = self.results
        a, t = self.args, self.dtype
        ev = a["value"].type.shape[-1]
        q_shape, k_shape, v_shape = (a[n].type.shape for n in ("query", "key", "value"))
        delta = self.temp("ad", self.batch + (self.rows,))
        p = self.temp("ap", self.batch + (self.rows, self.block))
        ds = self.temp("as", self.batch + (self.rows, self.block))
        tile = self.batch + (self.rows, self.block)
        inliner = self.sched.inliner

        def rowsum(ix):
            d = L.Var("d", L.INDEX)
            term = X(inliner.value_at(a["grad_out"], ix + (d,))) * X(inliner.value_at(a["out"], ix + (d,)))
            return [L.Reduce("d", I.dim(ev), [L.Accumulator("dot", t, L.Const(0.0, t))], [],
                             [(X(L.Var("dot", t)) + term).e]),
                    L.Store(delta, ix, L.Var("dot", t))]

        def zero(ix):
            return [L.Store(dq, ix, L.Const(0.0, t))]

        def block(start, width, tag):
            b, i, j = self.epilogue_index()
            value, keep = self.scores(L.Var("acc", t), start)
            lse = X(inliner.value_at(a["logsumexp"], b + (i,)))
            dead = lse == NEG_INF if keep is None else (lse == NEG_INF) | ~keep
            prob = _select(dead, X(L.Const(0.0, t)), X(L.Unary("exp", (value - lse).e, t)))
            grad_p = X(L.Load(p, b + (i, j), t)) * (X(L.Var("acc", t)) - X(L.Load(delta, b + (i,), t))) * self.scale
            return [
                self.product(self.dense(p, tile), self.view(a["query"]), self.view(a["key"], start, True),
                             self.rows, width, self.features, epilogue=prob.e),
                self.product(self.dense(dv, v_shape, start), self.dense(p, tile, transposed=True),
                             self.view(a["grad_out"]), width, ev, self.rows),
                self.product(self.dense(ds, tile), self.view(a["grad_out"]), self.view(a["value"], start, True),
                             self.rows, width, ev, epilogue=grad_p.e),
                self.product(self.dense(dk, k_shape, start), self.dense(ds, tile, transposed=True),
                             self.view(a["query"]), width, self.features, self.rows),
                self.product(self.dense(dq, q_shape), self.dense(ds, tile), self.view(a["key"], start),
                             self.rows, self.features, width, accumulate=True),
            ]
        return (self.row_nest(rowsum, "r") + loop_nest(q_shape, zero, "z") + self.blocks(block))


def _select(c: X, a: X, b: X) -> X:
    return X(L.Select(c.e, a.e, b.e, a.dtype))
