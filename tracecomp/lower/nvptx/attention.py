"""The fused attention (ops.yaml kind `attention`) as dedicated CUDA kernels, in place of
the unrolled plan (launch.unrolled: a launch per tile and statement, thousands of them).

The scheduled kernel (schedule/attention.py) is read, not re-derived: its first product's
views give q and k (q[Q] @ k[K]^T), the others v, grad_out and the outputs, each View's
offset evaluated at the block's batch item with the tile loops' vars at 0 (the first
tile starts at row 0 and key 0); the scaled, masked score is the first product's
epilogue, evaluated at the global (row, key).  So the op's scale, is_causal, a bool or an
additive attn_mask (any broadcast, even an inlined expression) and broadcast key/value
batch dims come for free.  Dropout never reaches the fused op (the composite keeps its
softmax path); float64, dynamic sizes or a kernel of another shape fall back to the
unrolled plan (plan_attention returns None).

Layout (both kernels): 256 threads, tiles of 64 query rows x 64 keys; thread t owns
"its" row (forward) or key (backward) t >> 2 and lane t & 3 of it, i.e. 16 of the tile's
64 scores (the other index = lane + 4u).  q/k/v/grad_out tiles are staged through two
shared [64][33] buffers in chunks of at most 32 features (any head dim: the chunks are
unrolled, the accumulators are registers at static indices, ceil(d/4) per thread), the
64 x 65 probability tile through a third (34 KiB in all, under the 48 KiB static limit).
Blocks stride over the work items, so any grid covers everything.

Forward (kind "attention_fwd", one launch): one item per (batch item, query block),
the last query blocks (the heaviest when causal) first.  Per key block: s = q k^T
(chunks), the epilogue's masked scores (keys past S: -inf), the row max over the 4
lanes by shuffles, the online softmax exactly as the CPU schedule (m' = max(m, max s),
safe = 0 where m' = -inf, alpha = exp(m - safe), p = exp(s - safe)); each lane keeps a
partial row sum (alpha is the row's), p goes to shared memory, acc = acc * alpha +
p @ v (v in chunks).  is_causal: a query block visits key blocks up to its diagonal
only (the epilogue masks inside it).
Then l = the 4 partial sums; out = acc / l and logsumexp = m + log l, or 0 and -inf for
a row masked throughout (l = 0), as the CPU finish.

Backward (three launches): the schedule's own delta = rowsum(grad_out * out) and dq = 0
statements, planned as ordinary launches (launch.plan_kernel), then "attention_bwd":
one item per (batch item, key block), the first key blocks (the heaviest when causal)
first, dK and dV in registers over the query blocks (causal: from the diagonal block on),
per query block
    p  = the first product's epilogue (exp(s - logsumexp), 0 where masked or lse = -inf)
    dp = grad_out v^T; dV += p^T grad_out (same chunks of grad_out)
    ds = the third product's epilogue, p * (dp - delta) * scale
    dK += ds^T q; dq += ds k, added to global memory with atomics (a float add per
    element and key block: S/64 adds per dq element, against a second pass that would
    recompute p and ds per query block; the order of those adds, so dq's last bits,
    may differ from run to run).
dK and dV are stored once (keys no query sees: 0), so their zero-fill launches are dropped.

Launches for B*H = 64, T = 256, d = 64, causal, forward and backward: 4 (the unrolled
plan: 2048 + 3456).  ptxas (sm_90): the forward 128 registers (2 blocks per SM asked),
the backward 255 (it spilled under a 128 cap: 1 block per SM), no spills up to d = 128.
Expected cost, not measured (no GPU here): each FMA of the tile products reads about one
shared float, so both kernels are bound by shared-memory load issue (about one warp-wide
load per cycle per SM), roughly a quarter of the H100's FMA rate: for that size about
50-80 us forward and 150-250 us backward.  What would do better: register tiles of
several rows and keys per thread (fewer shared loads per FMA), tensor cores (TF32
mma.sync), cp.async staging.
"""
from __future__ import annotations

import math
from typing import Optional

import llvmlite.ir as ir

from ...core.dtypes import DType
from ..llvm import scalar as S
from ..llvm.emitter import declare_kernel_function
from ..loops import ir as L
from ..loops.ir import Kernel, Load, Loop, Matmul, Store
from ..loops.walk import buffers_written, statements, substitute, walk
from . import intrinsics as X
from .codegen import PARAM_ALIGN, GpuEmitter, strided_loop
from .launch import MAX_BLOCKS, Launch, plan_kernel
from .matmul import i32, i64

FORWARD = "tc._scaled_dot_product_flash_attention_for_cpu"
BACKWARD = "tc._scaled_dot_product_flash_attention_for_cpu_backward"
KINDS = ("attention_fwd", "attention_bwd")
THREADS = 256
BLOCK = 64                 # query rows and keys per tile
LANES = 4                  # threads per row (forward) or key (backward)
PER = BLOCK // LANES       # scores per thread
CHUNK = 32                 # features staged per step
PAD = CHUNK + 1            # shared row of a staged chunk (odd: no bank conflicts down a column)
PPAD = BLOCK + 1           # shared row of the probability tile
F32 = S.F32
FT = DType.float32
NEG_INF = float("-inf")
MIN_BLOCKS = {"attention_fwd": 2, "attention_bwd": 0}   # blocks per SM asked of ptxas (2: <= 128
                           # registers; the backward spilled under that cap, so it takes up to 255)


class _Unsupported(Exception):
    pass


def plan_attention(program, kernel: Kernel) -> Optional[list[Launch]]:
    """The dedicated launches for an attention kernel of `program`, or None (not one, or
    a variant left to the unrolled plan: module docstring)."""
    # other ops of the kernel are views inlined into its operands (an expand of broadcast
    # key/value heads); _Spec checks that the kernel writes the attention's buffers only
    ops = [op for op in program.kernel_ops.get(kernel.name, []) if op.name in (FORWARD, BACKWARD)]
    if len(ops) != 1 or kernel.sizes:
        return None
    try:
        spec = _Spec(kernel, ops[0])
    except _Unsupported:
        return None
    return spec.launches()


def _chunks(n: int) -> list[tuple[int, int]]:
    """(start, width) of each staged chunk of n features; widths multiples of 4 but the last."""
    width = min(CHUNK, -(-n // LANES) * LANES)
    return [(s, min(width, n - s)) for s in range(0, n, width)]


class _Spec:
    """What the dedicated kernels read from the scheduled kernel."""

    def __init__(self, kernel: Kernel, op):
        self.kernel, self.op = kernel, op
        self.forward = op.name == FORWARD
        body, dims = kernel.body, []
        while len(body) == 1 and isinstance(body[0], Loop) and body[0].var.startswith("bt"):
            if not isinstance(body[0].extent, int):
                raise _Unsupported
            dims.append((body[0].var, body[0].extent))
            body = body[0].body
        self.dims, self.inner = dims, body
        self.items = math.prod(e for _, e in dims)
        products = [s for s in statements(body) if isinstance(s, Matmul)]
        need = 2 if self.forward else 5
        if len(products) < need or any(p.batch or len(p.a.strides) != 2 or len(p.b.strides) != 2
                                       for p in products[:need]):
            raise _Unsupported
        self.mm = products[:need]
        if self.mm[0].epilogue is None or (not self.forward and self.mm[2].epilogue is None):
            raise _Unsupported
        shapes = [v.type.shape for v in op.operands]
        q, k, v = shapes[:3] if self.forward else shapes[1:4]
        self.L, self.E, self.S, self.Ev = q[-2], q[-1], k[-2], v[-1]
        if not all(isinstance(d, int) for d in (self.L, self.E, self.S, self.Ev)):
            raise _Unsupported
        if any(kernel.buffer(view.buffer).dtype != DType.float32 for p in self.mm for view in p.views()):
            raise _Unsupported
        self.causal = bool(op.attrs.get("is_causal"))
        self.qblocks, self.kblocks = -(-self.L // BLOCK), -(-self.S // BLOCK)
        if self.forward:
            stores = [s for s in statements(body[-1:]) if isinstance(s, Store)]
            if not stores or len(stores[0].index) != len(dims) + 1:
                raise _Unsupported
            self.lse = stores[0].buffer
            if kernel.buffer(self.lse).dtype != DType.float32:
                raise _Unsupported
        else:
            p_buf = self.mm[0].out.buffer
            self.ds_epilogue = substitute(self.mm[2].epilogue, lambda n: L.Var("p.value", FT)
                                          if isinstance(n, Load) and n.buffer == p_buf else None)
            if any(isinstance(n, Load) and n.buffer == p_buf for n in walk(self.ds_epilogue)):
                raise _Unsupported
            # the schedule's delta and dq = 0 statements run first; dk, dv are stored whole
            dq, products_free = self.mm[4].out.buffer, []
            for s in body:
                if any(isinstance(n, Matmul) for n in statements([s])):
                    continue
                written = buffers_written([s])
                if dq in written or self.mm[2].epilogue is not None and written & _loaded(self.mm[2].epilogue):
                    products_free.append(s)
            self.before = products_free
        # nothing but the attention's outputs and temps is written (no other op fused in)
        own = {p.out.buffer for p in self.mm} | {p.workspace for p in self.mm}
        if self.forward:
            own.add(self.lse)
        else:
            own |= _loaded(self.mm[2].epilogue)
        extra = buffers_written(kernel.body) - own
        if len(extra) > (2 if self.forward else 0):       # (forward: the running max and sum)
            raise _Unsupported

    def wrap(self, stmts: list) -> list:
        for var, extent in reversed(self.dims):
            stmts = [Loop(var, extent, stmts)]
        return stmts

    def launches(self) -> list[Launch]:
        k = self.kernel
        out: list[Launch] = []
        if not self.forward:
            for j, s in enumerate(self.before):
                sub = Kernel(k.name, k.buffers, self.wrap([s]), k.sizes)
                for launch in plan_kernel(sub):
                    launch.name = f"{k.name}_pre{j}_{launch.name[len(k.name):].lstrip('_') or 'k'}"
                    out.append(launch)
        items = self.items * (self.qblocks if self.forward else self.kblocks)
        kind = KINDS[0] if self.forward else KINDS[1]
        launch = Launch(f"{k.name}_{'fwd' if self.forward else 'bwd'}", k, kind, list(k.body),
                        (THREADS, 1, 1), (min(items, MAX_BLOCKS), 1, 1))
        launch.attention = self
        return out + [launch]


def _loaded(e) -> set[str]:
    return {n.buffer for n in walk(e) if isinstance(n, Load)}


def is_attention(launch: Launch) -> bool:
    return launch.kind in KINDS


def emit_attention(module: ir.Module, launch: Launch) -> ir.Function:
    k = launch.kernel
    fn = declare_kernel_function(module, launch.name, k.buffers, k.sizes, PARAM_ALIGN, "external", [])
    X.mark_kernel(module, fn, launch.block, MIN_BLOCKS[launch.kind])
    em = GpuEmitter(module, launch, fn)
    _Emitter(em, launch.attention).run()
    em.finish()
    launch.shared_bytes = em.shared_bytes
    return fn


def _f32(v: float) -> ir.Constant:
    return ir.Constant(F32, v)


class _Emitter:
    def __init__(self, em: GpuEmitter, spec: _Spec):
        self.em, self.spec, self.b = em, spec, em.builder

    # ------------------------------------------------------------ helpers
    def ex(self, e: L.Expr, env: dict) -> ir.Value:
        self.em.forget_values()
        return self.em.expr(e, env)

    def unary(self, fn: str, x: ir.Value) -> ir.Value:
        return self.ex(L.Unary(fn, L.Var("x", FT), FT), {"x": x})

    def binary(self, fn: str, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.ex(L.Binary(fn, L.Var("x", FT), L.Var("y", FT), FT), {"x": x, "y": y})

    def fma(self, x, y, z):
        return S.intrinsic(self.b, "fmuladd", [x, y, z])

    def smem(self, array, index: ir.Value) -> ir.Value:
        return X.shared_element(self.b, array, index)

    def lds(self, array, index) -> ir.Value:
        return self.b.load(self.smem(array, index), typ=F32)

    def view(self, view: L.View, env: dict):
        """(offset, row stride, column stride) of a tile View at the item's batch index."""
        self.em.forget_values()
        return self.em.expr(view.offset, env), [self.em.expr(s, env) for s in view.strides]

    def pointer(self, terms, buffer: str, row: ir.Value, col: ir.Value) -> ir.Value:
        b = self.b
        off, (rs, cs) = terms
        flat = b.add(off, b.add(b.mul(row, rs), b.mul(col, cs)))
        return b.gep(self.em.buffer_pointer(buffer), [flat], inbounds=True, source_etype=F32)

    def stage(self, array, terms, buffer: str, row0: ir.Value, rows: int, col0: int, width: int) -> None:
        """array[r][c] = operand[row0 + r][col0 + c] (0 past `rows`) for r < 64, c < width;
        consecutive threads read consecutive columns."""
        b = self.b
        tid = self.tid
        for u in range(-(-BLOCK * width // THREADS)):
            e = b.add(tid, i64(u * THREADS))
            r, c = b.udiv(e, i64(width)), b.urem(e, i64(width))
            row = b.add(row0, r)
            ok = b.and_(b.icmp_unsigned("<", e, i64(BLOCK * width)), b.icmp_signed("<", row, i64(rows)))
            with b.if_then(b.icmp_unsigned("<", e, i64(BLOCK * width))):
                safe = b.select(ok, row, i64(0))
                value = b.load(self.pointer(terms, buffer, safe, b.add(c, i64(col0))), typ=F32)
                value = b.select(ok, value, _f32(0.0))
                b.store(value, self.smem(array, b.trunc(b.add(b.mul(r, i64(PAD)), c), S.I32)))

    def lane_sum(self, x: ir.Value, fn) -> ir.Value:
        for mask in (1, 2):
            x = fn(x, X.shuffle_xor(self.b, x, mask))
        return x

    def item_env(self, flat: ir.Value) -> dict:
        env = self.em.entry_env()
        self.em.delinearize(flat, self.spec.dims, env)
        for var in ("qb", "kb"):
            env[var] = i64(0)
        return env

    # ------------------------------------------------------------ kernels
    def run(self) -> None:
        em, b = self.em, self.b
        self.tid = em.sreg64("tid.x")
        self.me = b.lshr(self.tid, i64(2))          # the thread's row (forward) / key (backward)
        self.lane = b.and_(self.tid, i64(LANES - 1))
        self.a_s = em.shared_array("a", F32, BLOCK * PAD)
        self.b_s = em.shared_array("b", F32, BLOCK * PAD)
        self.p_s = em.shared_array("p", F32, BLOCK * PPAD)
        spec = self.spec
        blocks = spec.qblocks if spec.forward else spec.kblocks
        with strided_loop(b, em.sreg64("ctaid.x"), i64(spec.items * blocks), em.sreg64("nctaid.x"), "item") as it:
            flat = b.udiv(it.index, i64(blocks))
            blk = b.urem(it.index, i64(blocks))
            if spec.forward:        # the heaviest causal items first: late query blocks, early key blocks
                blk = b.sub(i64(blocks - 1), blk)
            env = self.item_env(flat)
            (self.forward_item if spec.forward else self.backward_item)(env, blk)
            em.forget_values()
            it.next = []

    def scores(self, env, q_terms, k_terms, q_buf, k_buf, q0, k0, rows_by_lane: bool) -> list:
        """The 16 dot products of the thread: rows q0 + (me | lane + 4u) with keys
        k0 + (lane + 4u | me): forward (rows_by_lane False) or backward."""
        b, spec = self.b, self.spec
        acc = [_f32(0.0)] * PER
        me32, lane32 = b.trunc(self.me, S.I32), b.trunc(self.lane, S.I32)
        for c0, width in _chunks(spec.E):
            X.barrier(b)
            self.stage(self.a_s, q_terms, q_buf, q0, spec.L, c0, width)
            self.stage(self.b_s, k_terms, k_buf, k0, spec.S, c0, width)
            X.barrier(b)
            for c in range(width):
                if rows_by_lane:
                    mine = self.lds(self.b_s, b.add(b.mul(me32, i32(PAD)), i32(c)))
                    for u in range(PER):
                        other = self.lds(self.a_s, b.add(b.mul(b.add(lane32, i32(LANES * u)), i32(PAD)), i32(c)))
                        acc[u] = self.fma(other, mine, acc[u])
                else:
                    mine = self.lds(self.a_s, b.add(b.mul(me32, i32(PAD)), i32(c)))
                    for u in range(PER):
                        other = self.lds(self.b_s, b.add(b.mul(b.add(lane32, i32(LANES * u)), i32(PAD)), i32(c)))
                        acc[u] = self.fma(mine, other, acc[u])
        return acc

    def epilogue(self, mm: Matmul, expr, env, acc, row, key, extra=None) -> ir.Value:
        """`expr` (a product's epilogue) at global (row, key), both clamped inside."""
        b, spec = self.b, self.spec
        inner = dict(env)
        i, j = (mm.index or ("i", "j"))[-2:]
        inner[i] = S.intrinsic(b, "smin", [row, i64(spec.L - 1)])
        inner[j] = S.intrinsic(b, "smin", [key, i64(spec.S - 1)])
        inner[mm.acc] = acc
        inner.update(extra or {})
        return self.ex(expr, inner)

    def forward_item(self, env, qblk) -> None:
        b, spec = self.b, self.spec
        q_mm, v_mm = spec.mm
        q_t, k_t, v_t, o_t = (self.view(v, env) for v in (q_mm.a, q_mm.b, v_mm.b, v_mm.out))
        k_t = (k_t[0], k_t[1][::-1])                 # k^T's view: (feature, key) strides
        q0 = b.mul(qblk, i64(BLOCK))
        row = b.add(q0, self.me)
        nkb = i64(spec.kblocks)
        if spec.causal:                              # key <= row: up to the block's diagonal
            last = S.intrinsic(b, "smin", [b.add(q0, i64(BLOCK)), i64(spec.L)])
            nkb = S.intrinsic(b, "smin", [nkb, b.add(b.udiv(b.sub(last, i64(1)), i64(BLOCK)), i64(1))])
        vchunks = _chunks(spec.Ev)
        regs = sum(-(-w // LANES) for _, w in vchunks)
        lane32, me32 = b.trunc(self.lane, S.I32), b.trunc(self.me, S.I32)
        init = [_f32(NEG_INF), _f32(0.0)] + [_f32(0.0)] * regs
        with strided_loop(b, i64(0), nkb, i64(1), "kblk", init) as kl:
            m, lsum, acc = kl.carried[0], kl.carried[1], list(kl.carried[2:])
            k0 = b.mul(kl.index, i64(BLOCK))
            dots = self.scores(env, q_t, k_t, q_mm.a.buffer, q_mm.b.buffer, q0, k0, False)
            s = []
            for u in range(PER):
                key = b.add(k0, b.add(self.lane, i64(LANES * u)))
                value = self.epilogue(q_mm, q_mm.epilogue, env, dots[u], row, key)
                s.append(b.select(b.icmp_signed("<", key, i64(spec.S)), value, _f32(NEG_INF)))
            top = s[0]
            for x in s[1:]:
                top = self.binary("maximum", top, x)
            top = self.lane_sum(top, lambda x, y: self.binary("maximum", x, y))
            new = self.binary("maximum", m, top)
            safe = b.select(b.fcmp_ordered("==", new, _f32(NEG_INF)), _f32(0.0), new)
            alpha = self.unary("exp", b.fsub(m, safe))
            total = _f32(0.0)
            for u in range(PER):
                p = self.unary("exp", b.fsub(s[u], safe))
                total = b.fadd(total, p)
                slot = b.add(b.mul(me32, i32(PPAD)), b.add(lane32, i32(LANES * u)))
                b.store(p, self.smem(self.p_s, slot))
            lsum = b.fadd(b.fmul(lsum, alpha), total)
            acc = [b.fmul(a, alpha) for a in acc]
            r = 0
            for c0, width in vchunks:
                X.barrier(b)                          # also shows p to the row's lanes
                self.stage(self.b_s, v_t, v_mm.b.buffer, k0, spec.S, c0, width)
                X.barrier(b)
                cols = -(-width // LANES)
                for j in range(BLOCK):
                    p = self.lds(self.p_s, b.add(b.mul(me32, i32(PPAD)), i32(j)))
                    for c in range(cols):
                        if LANES * c + LANES - 1 < width:
                            vv = self.lds(self.b_s, b.add(lane32, i32(j * PAD + LANES * c)))
                        else:       # the chunk's last columns: not every lane has one
                            col = b.add(lane32, i32(LANES * c))
                            col = b.select(b.icmp_signed("<", col, i32(width)), col, i32(0))
                            vv = self.lds(self.b_s, b.add(col, i32(j * PAD)))
                        acc[r + c] = self.fma(p, vv, acc[r + c])
                r += cols
            kl.next = [new, lsum] + acc
        m, lsum, acc = kl.carried[0], kl.carried[1], list(kl.carried[2:])
        total = self.lane_sum(lsum, b.fadd)
        empty = b.fcmp_ordered("==", total, _f32(0.0))
        with b.if_then(b.icmp_signed("<", row, i64(spec.L))):
            with b.if_then(b.icmp_unsigned("==", self.lane, i64(0))):
                lse = b.select(empty, _f32(NEG_INF), b.fadd(m, self.unary("log", total)))
                names = [v for v, _ in spec.dims]
                inner = {**env, "row.": row, "lse.": lse}
                self.em.store(Store(spec.lse, tuple(L.Var(n, L.INDEX) for n in names) + (L.Var("row.", L.INDEX),),
                                    L.Var("lse.", FT)), inner)
            r = 0
            for c0, width in vchunks:
                for c in range(-(-width // LANES)):
                    col = b.add(self.lane, i64(LANES * c))
                    with b.if_then(b.icmp_signed("<", col, i64(width))):
                        value = b.select(empty, _f32(0.0), b.fdiv(acc[r + c], total))
                        b.store(value, self.pointer(o_t, v_mm.out.buffer, row, b.add(col, i64(c0))))
                r += -(-width // LANES)

    def backward_item(self, env, kblk) -> None:
        b, spec = self.b, self.spec
        p_mm, dv_mm, ds_mm, dk_mm, dq_mm = spec.mm
        q_t, k_t = self.view(p_mm.a, env), self.view(p_mm.b, env)
        k_t = (k_t[0], k_t[1][::-1])
        g_t = self.view(dv_mm.b, env)                 # grad_out (row, d)
        v_t = self.view(ds_mm.b, env)
        v_t = (v_t[0], v_t[1][::-1])                  # v (key, d)
        dv_t, dk_t, dq_t = self.view(dv_mm.out, env), self.view(dk_mm.out, env), self.view(dq_mm.out, env)
        k0 = b.mul(kblk, i64(BLOCK))
        key = b.add(k0, self.me)
        first = kblk if spec.causal else i64(0)     # query blocks with a row >= k0
        echunks, vchunks = _chunks(spec.E), _chunks(spec.Ev)
        nk = sum(-(-w // LANES) for _, w in echunks)
        nv = sum(-(-w // LANES) for _, w in vchunks)
        lane32, me32 = b.trunc(self.lane, S.I32), b.trunc(self.me, S.I32)
        with strided_loop(b, first, i64(spec.qblocks), i64(1), "qblk", [_f32(0.0)] * (nk + nv)) as ql:
            dk, dv = list(ql.carried[:nk]), list(ql.carried[nk:])
            q0 = b.mul(ql.index, i64(BLOCK))
            dots = self.scores(env, q_t, k_t, p_mm.a.buffer, p_mm.b.buffer, q0, k0, True)
            # p goes to shared memory only (read back for ds): few registers live across dp
            for u in range(PER):
                row = self.lane_row(q0, u)
                p = self.epilogue(p_mm, p_mm.epilogue, env, dots[u], row, key)
                b.store(b.select(self.inside(row, key), p, _f32(0.0)), self.smem(self.p_s, self.p_slot(u)))
            dp = [_f32(0.0)] * PER
            r = 0
            for c0, width in vchunks:
                X.barrier(b)                          # also shows p
                self.stage(self.a_s, g_t, dv_mm.b.buffer, q0, spec.L, c0, width)
                self.stage(self.b_s, v_t, ds_mm.b.buffer, k0, spec.S, c0, width)
                X.barrier(b)
                for c in range(width):
                    mine = self.lds(self.b_s, b.add(b.mul(me32, i32(PAD)), i32(c)))
                    for u in range(PER):
                        g = self.lds(self.a_s, b.add(b.mul(b.add(lane32, i32(LANES * u)), i32(PAD)), i32(c)))
                        dp[u] = self.fma(g, mine, dp[u])
                self.transposed_product(dv, r, width)
                r += -(-width // LANES)
            ds = []
            for u in range(PER):
                row = self.lane_row(q0, u)
                p = self.lds(self.p_s, self.p_slot(u))
                value = self.epilogue(ds_mm, spec.ds_epilogue, env, dp[u], row, key, {"p.value": p})
                ds.append(b.select(self.inside(row, key), value, _f32(0.0)))
            X.barrier(b)                              # every lane done reading p
            for u in range(PER):
                b.store(ds[u], self.smem(self.p_s, self.p_slot(u)))
            r = 0
            for c0, width in echunks:
                X.barrier(b)
                self.stage(self.a_s, q_t, p_mm.a.buffer, q0, spec.L, c0, width)
                self.stage(self.b_s, (k_t[0], k_t[1]), p_mm.b.buffer, k0, spec.S, c0, width)
                X.barrier(b)
                self.transposed_product(dk, r, width)
                # dq[q0 + me][c0 + col] += sum_j ds[me][j] k[k0 + j][col]
                cols = -(-width // LANES)
                part = [_f32(0.0)] * cols
                for j in range(BLOCK):
                    d = self.lds(self.p_s, b.add(b.mul(me32, i32(PPAD)), i32(j)))
                    for c in range(cols):
                        col = b.add(lane32, i32(LANES * c))
                        col = b.select(b.icmp_signed("<", col, i32(width)), col, i32(0))
                        part[c] = self.fma(d, self.lds(self.b_s, b.add(col, i32(j * PAD))), part[c])
                qrow = b.add(q0, self.me)
                for c in range(cols):
                    col = b.add(self.lane, i64(LANES * c))
                    ok = b.and_(b.icmp_signed("<", col, i64(width)), b.icmp_signed("<", qrow, i64(spec.L)))
                    with b.if_then(ok):
                        X.atomic_add(b, self.pointer(dq_t, dq_mm.out.buffer, qrow, b.add(col, i64(c0))), part[c])
                r += cols
            ql.next = dk + dv
        dk, dv = list(ql.carried[:nk]), list(ql.carried[nk:])
        with b.if_then(b.icmp_signed("<", key, i64(spec.S))):
            for out, terms, buf, chunks in ((dk, dk_t, dk_mm.out.buffer, echunks), (dv, dv_t, dv_mm.out.buffer, vchunks)):
                r = 0
                for c0, width in chunks:
                    for c in range(-(-width // LANES)):
                        col = b.add(self.lane, i64(LANES * c))
                        with b.if_then(b.icmp_signed("<", col, i64(width))):
                            b.store(out[r + c], self.pointer(terms, buf, key, b.add(col, i64(c0))))
                    r += -(-width // LANES)

    def lane_row(self, q0, u: int) -> ir.Value:
        return self.b.add(q0, self.b.add(self.lane, i64(LANES * u)))

    def inside(self, row, key) -> ir.Value:
        b, spec = self.b, self.spec
        return b.and_(b.icmp_signed("<", row, i64(spec.L)), b.icmp_signed("<", key, i64(spec.S)))

    def p_slot(self, u: int) -> ir.Value:
        """The shared slot of P[lane + 4u][me] (backward: the thread's key column)."""
        b = self.b
        return b.add(b.mul(b.add(b.trunc(self.lane, S.I32), i32(LANES * u)), i32(PPAD)), b.trunc(self.me, S.I32))

    def transposed_product(self, acc: list, r: int, width: int) -> None:
        """acc[r + c] += sum_i P[i][me] * A[i][lane + 4c]: the thread's key row of P^T A,
        P the shared tile, A the staged chunk."""
        b = self.b
        lane32, me32 = b.trunc(self.lane, S.I32), b.trunc(self.me, S.I32)
        for i in range(BLOCK):
            p = self.lds(self.p_s, b.add(me32, i32(i * PPAD)))
            for c in range(-(-width // LANES)):
                col = b.add(lane32, i32(LANES * c))
                if LANES * c + LANES - 1 >= width:
                    col = b.select(b.icmp_signed("<", col, i32(width)), col, i32(0))
                acc[r + c] = self.fma(p, self.lds(self.a_s, b.add(col, i32(i * PAD))), acc[r + c])
