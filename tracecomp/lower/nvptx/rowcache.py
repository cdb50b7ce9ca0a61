"""Rows held in registers: a `rows` launch (softmax, layernorm, row sums) whose Reduces and
Loops all run over one static row length E (at most CACHE_MAX_EXTENT) reads each row
element from global memory once and writes each once.

Every thread owns the same elements of the row in every pass: with E % 4 == 0 the 4
consecutive elements 4 (t + T c) .. +3 for c = 0, 1, ... (one ld.global.v4 / st.global.v4
per chunk where the access is `buf[..., r]` on a row-major buffer), else t + T c.  The
4-wide rows run only where every buffer starts 16-byte aligned (a scan's row may not);
kernels.py emits the rows a second time, 1-wide, for the other case.  The
passes are unrolled over the thread's chunks, so the elements are plain SSA values:
  - a Load inside a pass whose index depends on the pass var is read the first time and
    reused by later passes (keyed by buffer and index with the var renamed);
  - a Store inside a Loop pass is kept as the new value of its key (later passes read
    it) and written to memory once, after the row (`flush`).
So softmax reads x once and writes its result once instead of four passes over memory,
and no barrier is needed around its Loops (each thread rereads only its own elements).
Partial chunks (E not a multiple of the block's span) read clamped in-bounds elements and
mask them out of folds and stores.  Reductions across threads are reduce.py's.

The plan (launch.py) checks the conditions (rowplan.py's `cache_extent`): every buffer written by a
pass is accessed only inside passes and through one index, so registers and memory never
disagree for a thread; passes hold no nested Loop or Reduce.
Measured on an H100, 8192 x 4096 float32: softmax 0.093 ms (torch 0.119), row sum 0.046
(0.054), layernorm 0.093 (0.141); from memory they took 0.148, 0.064 and 0.128 ms.
"""
from __future__ import annotations

from typing import Optional

import llvmlite.ir as ir

from ...core.dtypes import DType
from ..llvm import scalar as S
from ..loops.ir import INDEX, Load, Loop, Reduce, Store, Var
from ..loops.walk import var_names
from .reduce import Combiner, block_allreduce
from .rowplan import canonical
from .vector import load_vector, store_vector

class RowCache:
    """The registers of one row (see the module docstring); made per row by kernels.py."""

    def __init__(self, em, extent: int, width: int):
        self.em, self.extent = em, extent
        self.width = width
        self.units = extent // self.width
        self.threads = em.threads
        self.values: dict[tuple, dict] = {}          # key -> {(c, q): value}
        self.pending: dict[tuple, tuple] = {}        # key -> (store, var, env) to write back
        self.lane = None                             # (c, q) while a pass body is emitted
        self.var = None

    # ------------------------------------------------------------ lanes
    def lanes(self):
        """(c, q, r, valid) for each element this thread owns, in increasing r."""
        b, em = self.em.builder, self.em
        tid = em.sreg64("tid.x")
        for c in range(-(-self.units // self.threads)):
            unit = b.add(tid, ir.Constant(S.I64, self.threads * c))
            valid = None
            if (c + 1) * self.threads > self.units:
                valid = b.icmp_signed("<", unit, ir.Constant(S.I64, self.units))
                unit = S.intrinsic(b, "smin", [unit, ir.Constant(S.I64, self.units - 1)])
            base = b.mul(unit, ir.Constant(S.I64, self.width))
            for q in range(self.width):
                yield c, q, (base if q == 0 else b.add(base, ir.Constant(S.I64, q))), valid

    def _vector(self, node, var: str) -> bool:
        """Can the key's 4 elements of a chunk move as one 16-byte access?"""
        if self.width != 4 or type(node) not in (Load, Store) or node.index[-1] != Var(var, INDEX):
            return False
        if any(var in var_names(i) for i in node.index[:-1]):
            return False
        buf = self.em.kernel.buffer(node.buffer)
        last = buf.shape[-1] if buf.shape else None
        return buf.dtype in (DType.float32, DType.int32) and isinstance(last, int) and last % 4 == 0

    # ------------------------------------------------------------ passes
    def reduce(self, s: Reduce, env: dict) -> None:
        em, b = self.em, self.em.builder
        comb = Combiner(em, s, env)
        acc = comb.starts()
        saved, em.uniform = em.uniform, False
        for c, q, r, valid in self.lanes():
            em.forget_values()
            inner = {**env, s.var: r}
            self.lane, self.var = (c, q), s.var
            em.emit_body(s.body, inner)
            new = comb.fold(acc, inner)
            acc = new if valid is None else [b.select(valid, x, y) for x, y in zip(new, acc)]
        self.lane = None
        em.uniform = saved
        em.forget_values()
        comb.finish(block_allreduce(em, comb, acc))

    def loop(self, s: Loop, env: dict) -> None:
        em = self.em
        saved, em.uniform = em.uniform, False
        for c, q, r, valid in self.lanes():
            em.forget_values()
            self.lane, self.var = (c, q), s.var
            em.emit_body(s.body, {**env, s.var: r})
        self.lane = None
        em.uniform = saved
        em.forget_values()

    # ------------------------------------------------------------ accesses
    def load(self, e: Load, env: dict) -> Optional[ir.Value]:
        """The lane's cached element of a pass Load (read on first use), else None."""
        if self.lane is None or type(e) is not Load or not any(self.var in var_names(i) for i in e.index):
            return None
        key = (e.buffer, canonical(e.index, self.var))
        slot = self.values.setdefault(key, {})
        if self.lane not in slot:
            em, b = self.em, self.em.builder
            buf, _ = em._buffer(e.buffer)
            c, q = self.lane
            ptr = em.address(e.buffer, e.index, env)
            if self._vector(e, self.var) and q == 0:
                for k, v in enumerate(load_vector(b, ptr, S.memory_type(buf.dtype))):
                    slot[(c, k)] = v
            else:
                slot[self.lane] = S.load_value(b, ptr, buf.dtype)
        return slot[self.lane]

    def store(self, s: Store, env: dict) -> bool:
        """Keep a pass Store's value for later passes and the write-back."""
        if self.lane is None:
            return False
        key = (s.buffer, canonical(s.index, self.var))
        self.values.setdefault(key, {})[self.lane] = self.em.expr(s.value, env)
        self.pending[key] = (s, self.var, env)
        return True

    def flush(self) -> None:
        """Write every kept Store once (16 bytes at a time where it can)."""
        em, b = self.em, self.em.builder
        for key, (s, var, env) in self.pending.items():
            buf, _ = em._buffer(s.buffer)
            values = self.values[key]
            vector = self._vector(s, var)
            for c, q, r, valid in self.lanes():
                if vector and q:
                    continue
                em.forget_values()
                ptr = em.address(s.buffer, s.index, {**env, var: r})
                with b.if_then(valid if valid is not None else ir.Constant(S.I1, 1)):
                    if vector:
                        store_vector(b, ptr, [values[(c, k)] for k in range(4)])
                    else:
                        S.store_value(b, values[(c, q)], ptr, buf.dtype)
        em.forget_values()
        self.pending.clear()
