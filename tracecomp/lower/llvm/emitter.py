"""The function emitter: one loop-IR Kernel's body as LLVM IR (llvmlite.ir).

codegen.py builds a module from it (`codegen_kernels`), with, per Kernel, a C-ABI function

    void name(T0* buf0, ..., i64 size0, ...)

with external linkage: one pointer per buffer in `kernel.buffers` order, then one i64 per
`kernel.sizes` entry.  What the caller guarantees, and the attributes that say so:
- pointers are `noalias captures(none)`: the runtime never passes one array as two buffers
  when either is written (outputs and temps are fresh allocations; two *input* buffers may
  share memory, which noalias allows since neither is written), and no pointer escapes;
- pointers are `align 64` (BUFFER_ALIGN): every buffer is allocated 64-byte aligned by the
  runtime (runtime/memory.py), and inputs that are not are copied before the call.  With
  the alignment LLVM uses aligned vector moves, so a misaligned pointer would fault; pass
  `align=None` to drop the assumption.
Buffers are dense and row-major: an element's offset is the dot product of its index with
the strides, constants for static dims and products of size parameters for dynamic ones.

Loops are counted loops in LLVM's canonical shape (preheader, header with the i64
induction phi and the exit test, body, latch with `i + 1`), which the loop vectorizer
recognizes.  A Reduce is the same loop with one more header phi per accumulator; floating
accumulations are marked reassociable (see `_accumulate`), and long floating sums are
summed in blocks (see `_blocked_sum`).  Two statements have hooks that later modules fill
in (codegen.py's KernelEmitter): the outermost parallel Loop (`parallel_loop`: outlined and
run on all cores through libgomp, llvm/parallel.py; here, serially) and Matmul (`matmul`:
a packed, blocked, parallel kernel, llvm/gemm/matmul.py; here, its loop expansion).
Scalar semantics live in llvm/scalar.py.

A Select evaluates both arms (an LLVM `select`, which vectorizes), unlike loops/interp.py's
lazy one: a Load in either arm must be in bounds whatever the condition, which the
scheduler guarantees by clamping such indices (pointwise.py: cat, gather, *_backward).

A CheckedIndex costs an unsigned max per index (llvm/index_checks.py), written to the
error buffer when the function returns: every function an emitter builds must end with
`finish()`, not a bare `ret void`.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

import llvmlite.ir as ir

from ...core.dtypes import DType
from ...core.errors import BackendError
from . import loop_ids
from .index_checks import IndexCheckSlots
from . import scalar as S
from ..loops.ir import (Binary, Buffer, Cast, CheckedIndex, Const, Expr, GuardedLoad, Kernel, Let, Load, Loop, Matmul, PackB, Reduce, Select, Store, Unary, Var)
from ..loops.matmul import expand_matmul, flat_name, operand_dtypes
from ..loops.walk import var_names

BUFFER_ALIGN = 64
SUM_BLOCK = 4096        # terms per block of a blocked floating sum (see _blocked_sum)
FULL_UNROLL_MAX = 8     # trips of an innermost constant loop asked to unroll fully (see _unroll_if_small)


def kernel_function_type(buffers: Sequence[Buffer], sizes: Sequence[str],
                         extra: Sequence[ir.Type] = ()) -> ir.FunctionType:
    """void (ptr per buffer, i64 per size, extra...): a kernel's C signature."""
    return ir.FunctionType(ir.VoidType(), [ir.PointerType()] * len(buffers) + [S.I64] * len(sizes)
                           + list(extra))


def declare_kernel_function(module: ir.Module, name: str, buffers: Sequence[Buffer],
                            sizes: Sequence[str], align: Optional[int], linkage: str,
                            extra: Sequence[tuple[str, ir.Type]] = ()) -> ir.Function:
    """`void name(buffers..., sizes..., extra...)` with the pointer attributes above."""
    fn = ir.Function(module, kernel_function_type(buffers, sizes, [t for _, t in extra]), name)
    fn.linkage = linkage
    fn.attributes.add("nounwind")
    names = [b.name for b in buffers] + list(sizes) + [n for n, _ in extra]
    for arg, arg_name in zip(fn.args, names):
        arg.name = arg_name
    for arg in fn.args[:len(buffers)]:
        arg.add_attribute("noalias")
        arg.add_attribute("captures(none)")
        if align:
            arg.attributes.align = align
    return fn


@dataclass
class LoopState:
    """A counted loop being emitted: its index, its carried values (header phis), and the
    values they take on the next iteration, which the body sets."""
    index: ir.Value
    carried: list[ir.PhiInstr]
    next: list[ir.Value] = field(default_factory=list)


@contextlib.contextmanager
def counted_loop(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, name: str,
                 carried: Sequence[ir.Value] = (), step: Optional[ir.Value] = None) -> Iterator[LoopState]:
    """`for name in range(start, stop, step)` (step > 0, default 1; the index has start's
    type) carrying values: the body goes inside the `with`; after it the builder is at the
    exit, where `state.carried` hold the final values."""
    fn = b.function
    preheader = b.block
    header = fn.append_basic_block(f"{name}.header")
    body = fn.append_basic_block(f"{name}.body")
    exit_block = fn.append_basic_block(f"{name}.exit")
    b.branch(header)
    b.position_at_end(header)
    index = b.phi(start.type, name)
    index.add_incoming(start, preheader)
    state = LoopState(index, [b.phi(v.type, f"{name}.carry") for v in carried])
    for phi, init in zip(state.carried, carried):
        phi.add_incoming(init, preheader)
    b.cbranch(b.icmp_signed("<", index, stop), body, exit_block)
    b.position_at_end(body)
    yield state
    if len(state.next) != len(state.carried):
        raise BackendError(f"loop {name}: {len(state.carried)} carried values, {len(state.next)} updates")
    latch = b.block          # the body may have opened blocks of its own: branch from the last
    # A unit step cannot wrap below `stop`; a runtime step (grid strides) only promises nsw.
    flags = ("nuw", "nsw") if step is None else ("nsw",)
    step = ir.Constant(start.type, 1) if step is None else step
    index.add_incoming(b.add(index, step, name=f"{name}.next", flags=flags), latch)
    for phi, nxt in zip(state.carried, state.next):
        phi.add_incoming(nxt, latch)
    b.branch(header)
    fn.blocks.remove(exit_block)      # keep blocks in source order for readable dumps
    fn.blocks.append(exit_block)
    b.position_at_end(exit_block)


class FunctionEmitter:
    """Emits loop-IR statements into one LLVM function whose leading arguments are the
    kernel's buffers and sizes.  `env` maps visible loop-IR names to LLVM values; each
    Loop and Reduce body gets its own copy, so names leave scope with their loop."""

    def __init__(self, module: ir.Module, kernel: Kernel, fn: ir.Function,
                 align: Optional[int], in_parallel: bool = False):
        self.module, self.kernel, self.fn, self.align = module, kernel, fn, align
        self.in_parallel = in_parallel          # inside an outlined parallel loop: no nesting
        self.builder = ir.IRBuilder(fn.append_basic_block("entry"))
        nbuf = len(kernel.buffers)
        self.buffers = {buf.name: (buf, arg) for buf, arg in zip(kernel.buffers, fn.args)}
        self.sizes = dict(zip(kernel.sizes, fn.args[nbuf:nbuf + len(kernel.sizes)]))
        self._cache: dict[int, tuple[Expr, ir.Value]] = {}
        self.strides = {buf.name: self._strides(buf) for buf in kernel.buffers}
        self.parallel_loops = 0
        self.checks = IndexCheckSlots(self)      # CheckedIndex's running maxima (index_checks.py)

    def entry_env(self) -> dict[str, ir.Value]:
        return dict(self.sizes)

    def finish(self) -> None:
        """End the function: record its failed index checks (index_checks.py), `ret void`.
        (The checks' bounds are computed again here: a size product the last statement
        computed inside its loops does not dominate the function's exit.)"""
        self.forget_values()
        self.checks.flush()
        self.builder.ret_void()

    def forget_values(self) -> None:
        """Drop the values built so far for reuse by later expressions: call it where the
        builder moves to a block they may not dominate (a new statement, a loop's exit)."""
        self._cache.clear()

    # ------------------------------------------------------------ statements
    def emit_body(self, body: list, env: dict[str, ir.Value]) -> None:
        for s in body:
            self.forget_values()        # values are shared within a statement only
            if isinstance(s, Let):
                env[s.name] = _named(self.expr(s.value, env), s.name)
            elif isinstance(s, Store):
                self.store(s, env)
            elif isinstance(s, Loop):
                self.loop(s, env)
            elif isinstance(s, Reduce):
                self.reduce(s, env)
            elif isinstance(s, Matmul):
                self.matmul(s, env)
            elif isinstance(s, PackB):
                self.pack_b(s, env)
            else:
                raise BackendError(f"kernel '{self.kernel.name}': {s!r} is not a statement")

    def matmul(self, s: Matmul, env: dict[str, ir.Value]) -> None:
        """A Matmul statement (a hook: the CPU's packed kernel, the PTX code generator's
        tiles); here, its loop expansion."""
        self.matmul_loops(s, env)

    def pack_b(self, s: PackB, env: dict[str, ir.Value]) -> None:
        """A PackB statement (a hook: the CPU's packed kernel); here, nothing, since plain
        loops read b itself."""

    def matmul_loops(self, s: Matmul, env: dict[str, ir.Value]) -> None:
        """A Matmul as plain loops (loops/matmul.py): ikj order, or ijk for a vector."""
        dtype = self.kernel.buffer(s.out.buffer).dtype
        order = "ijk" if s.n == 1 else "ikj"
        self.emit_body(expand_matmul(s, dtype, order, parallel=not self.in_parallel,
                                     operand_dtypes=operand_dtypes(self.kernel, s)), dict(env))

    def store(self, s: Store, env: dict[str, ir.Value]) -> None:
        buf, _ = self._buffer(s.buffer)
        value = self.expr(s.value, env)
        S.store_value(self.builder, value, self.address(s.buffer, s.index, env), buf.dtype)

    def loop(self, s: Loop, env: dict[str, ir.Value]) -> None:
        if s.parallel and not self.in_parallel:
            self.parallel_loop(s, env)
            return
        self.serial_loop(s.var, ir.Constant(S.I64, 0), self.extent(s.extent, env), s.body, env)

    def parallel_loop(self, s: Loop, env: dict[str, ir.Value]) -> None:
        """The outermost parallel Loop (a hook: the CPU's threads); here, serial."""
        self.serial_loop(s.var, ir.Constant(S.I64, 0), self.extent(s.extent), s.body, env)

    def serial_loop(self, var: str, start: ir.Value, stop: ir.Value, body: list,
                    env: dict[str, ir.Value]) -> None:
        with counted_loop(self.builder, start, stop, var) as state:
            self.emit_body(body, {**env, var: state.index})
        self._unroll_if_small(state, start, stop, body)

    def _unroll_if_small(self, state: LoopState, start: ir.Value, stop: ir.Value, body: list) -> None:
        """Ask LLVM to unroll an innermost loop of at most FULL_UNROLL_MAX constant trips
        completely: the pipeline's own unrolling is off (runtime/target.py), and such a loop
        (a pooling window, a short reduction) unrolled lets the loop around it vectorize."""
        if (isinstance(start, ir.Constant) and isinstance(stop, ir.Constant)
                and stop.constant - start.constant <= FULL_UNROLL_MAX
                and not any(isinstance(s, (Loop, Reduce, Matmul)) for s in body)):
            loop_ids.attach(state.index, self.module, loop_ids.unroll_full(self.module))

    def reduce(self, s: Reduce, env: dict[str, ir.Value]) -> None:
        if len(s.update) != len(s.accumulators):
            raise BackendError(f"kernel '{self.kernel.name}': Reduce {s.var} has "
                               f"{len(s.accumulators)} accumulators but {len(s.update)} updates")
        inits = [self.expr(a.init, env) for a in s.accumulators]
        if _is_blockable_sum(s):
            finals = self._blocked_sum(s, inits, env)
        else:
            finals = self._reduce_loop(s, ir.Constant(S.I64, 0), self.extent(s.extent, env), inits, env)
        env.update((a.name, v) for a, v in zip(s.accumulators, finals))

    def _reduce_loop(self, s: Reduce, start: ir.Value, stop: ir.Value, inits: list[ir.Value],
                     env: dict[str, ir.Value]) -> list[ir.Value]:
        """The Reduce's loop over [start, stop) from `inits`; returns the final values."""
        with counted_loop(self.builder, start, stop, s.var, inits) as state:
            inner = {**env, s.var: state.index}
            inner.update((a.name, phi) for a, phi in zip(s.accumulators, state.carried))
            self.emit_body(s.body, inner)
            self.forget_values()
            state.next = [self._accumulate(a.name, a.dtype, u, inner)
                          for a, u in zip(s.accumulators, s.update)]
        self._unroll_if_small(state, start, stop, s.body)
        return list(state.carried)

    def _blocked_sum(self, s: Reduce, inits: list[ir.Value], env: dict[str, ir.Value]) -> list[ir.Value]:
        """A floating sum in blocks of SUM_BLOCK terms: each block is summed from -0.0 by the
        (vectorized) Reduce loop, and the block sums are added into float64 totals.

        One running float32 sum of 2**24 terms loses most of its digits; even vectorized
        (64 partial sums) it is ~1e-6 off.  Blocks keep every partial sum small and the
        float64 carry adds them without loss, so the result is about as close to the exact
        sum as float32 can be, like NumPy's pairwise sum.  Cost: one add per block."""
        b, n = self.builder, self.extent(s.extent, env)
        block = ir.Constant(S.I64, SUM_BLOCK)
        blocks = b.udiv(b.add(n, ir.Constant(S.I64, SUM_BLOCK - 1)), block)
        wide = [S.cast(b, v, a.dtype, DType.float64) for v, a in zip(inits, s.accumulators)]
        with counted_loop(b, ir.Constant(S.I64, 0), blocks, f"{s.var}.block", wide) as outer:
            lo = b.mul(outer.index, block, flags=("nuw", "nsw"))
            hi = S.intrinsic(b, "smin", [b.add(lo, block, flags=("nuw", "nsw")), n])
            zeros = [S.constant(-0.0, a.dtype) for a in s.accumulators]
            sums = self._reduce_loop(s, lo, hi, zeros, env)
            outer.next = [b.fadd(total, S.cast(b, part, a.dtype, DType.float64))
                          for total, part, a in zip(outer.carried, sums, s.accumulators)]
        return [S.cast(b, total, DType.float64, a.dtype) for total, a in zip(outer.carried, s.accumulators)]

    def _accumulate(self, acc: str, dtype, update: Expr, env: dict[str, ir.Value]) -> ir.Value:
        """An accumulator's next value.  A float `acc + x` or `acc * x` is emitted with the
        `reassoc` fast-math flag (that one instruction only, never the values feeding it):
        that lets the vectorizer keep several partial sums in vector lanes and combine
        them at the end.  It is legal because the loop IR defines a reduction's order as
        unspecified, like NumPy's pairwise sum: only the result's closeness to the exact
        sum is promised, and partial sums are at least as accurate as one running sum.
        No `nsz`: the identity for the partial sums is then -0.0, which keeps -0.0 results."""
        if (isinstance(update, Binary) and update.fn in ("add", "mul") and S.kind(dtype) == "f"
                and Var(acc, dtype) in (update.a, update.b)):
            other = update.b if update.a == Var(acc, dtype) else update.a
            op = self.builder.fadd if update.fn == "add" else self.builder.fmul
            return op(env[acc], self.expr(other, env), flags=("reassoc",))
        return self.expr(update, env)

    # ------------------------------------------------------------ memory
    def _buffer(self, name: str) -> tuple[Buffer, ir.Value]:
        if name not in self.buffers and name.endswith(".flat") and name[:-5] in self.buffers:
            self._flat_alias(name[:-5])
        try:
            return self.buffers[name]
        except KeyError:
            raise BackendError(f"kernel '{self.kernel.name}' has no buffer '{name}' "
                               f"(buffers: {', '.join(self.buffers)})") from None

    def buffer_pointer(self, name: str) -> ir.Value:
        """The function's pointer argument of buffer `name`."""
        return self._buffer(name)[1]

    def _flat_alias(self, name: str) -> None:
        """`name.flat` (loops.matmul.flat_name): buffer `name` addressed as 1-D."""
        buf, ptr = self.buffers[name]
        flat = flat_name(name)
        self.buffers[flat] = (Buffer(flat, buf.dtype, (0,), buf.role), ptr)   # extent unused
        self.strides[flat] = [ir.Constant(S.I64, 1)]

    def _strides(self, buf: Buffer) -> list[ir.Value]:
        """Row-major strides in elements, computed once at the function's entry."""
        strides, static, dynamic = [], 1, None
        for d in reversed(buf.shape):
            strides.append(self._scale(dynamic, static))
            if isinstance(d, int):
                static *= d
            else:
                size = self.extent(d)
                dynamic = size if dynamic is None else self.builder.mul(dynamic, size, flags=("nsw",))
        return strides[::-1]

    def _scale(self, dynamic: Optional[ir.Value], static: int) -> ir.Value:
        if dynamic is None:
            return ir.Constant(S.I64, static)
        return dynamic if static == 1 else self.builder.mul(dynamic, ir.Constant(S.I64, static), flags=("nsw",))

    def address(self, buffer: str, index: Sequence[Expr], env: dict[str, ir.Value],
                inbounds: bool = True) -> ir.Value:
        """The element's address; `inbounds=False` for an index that may lie outside the
        buffer where it is not used (a GuardedLoad's, computed before its guard)."""
        flags = ("nsw",) if inbounds else ()
        buf, ptr = self._buffer(buffer)
        if len(index) != len(buf.shape):
            raise BackendError(f"kernel '{self.kernel.name}': {len(index)} indices for buffer "
                               f"'{buffer}' of shape {tuple(buf.shape)}")
        b, offset = self.builder, None
        for i, stride in _merged_terms(index, self.strides[buffer]):
            term = self.expr(i, env)
            if not (isinstance(stride, ir.Constant) and stride.constant == 1):
                term = b.mul(term, stride, flags=flags)
            offset = term if offset is None else b.add(offset, term, flags=flags)
        if offset is None:
            return ptr
        return b.gep(ptr, [offset], inbounds=inbounds, source_etype=S.memory_type(buf.dtype))

    def guarded_load(self, e: GuardedLoad, env: dict[str, ir.Value]) -> ir.Value:
        """The load in a block of its own, entered where the guard holds, and zero else.
        Everything cached for later use (the guard, the index values, the address) is
        computed before the branch, where it dominates the rest of the statement; the
        address without `inbounds`, since it may point outside the buffer where unused.
        (LLVM's vectorizer may make it a masked load; for col2im its cost model keeps the
        loop scalar, which still beat the clamped gathers 2x.)"""
        b = self.builder
        guard = self.expr(e.guard, env)
        ptr = self.address(e.buffer, e.index, env, inbounds=False)
        buf, _ = self._buffer(e.buffer)
        before = b.block
        with b.if_then(guard):
            loaded = S.load_value(b, ptr, buf.dtype)
            inside = b.block
        merged = b.phi(loaded.type)
        merged.add_incoming(loaded, inside)
        merged.add_incoming(S.constant(0, buf.dtype), before)
        return merged

    def extent(self, extent, env: dict[str, ir.Value] | None = None) -> ir.Value:
        """A trip count or dim: an int, or an index expression of size parameters (a
        dynamic dim such as 784*batch) or, for a serial Loop or a Reduce, of the names in `env`."""
        if isinstance(extent, int):
            return ir.Constant(S.I64, extent)
        return self.expr(extent, self.entry_env() if env is None else env)

    # ------------------------------------------------------------ expressions
    def expr(self, e: Expr, env: dict[str, ir.Value]) -> ir.Value:
        """The value of `e`; a subexpression object used twice is emitted once (keyed by
        identity, so DAG-shaped trees stay linear)."""
        hit = self._cache.get(id(e))
        if hit is not None and hit[0] is e:
            return hit[1]
        value = self._expr(e, env)
        self._cache[id(e)] = (e, value)
        return value

    def _expr(self, e: Expr, env: dict[str, ir.Value]) -> ir.Value:
        b = self.builder
        if isinstance(e, Const):
            return S.constant(e.value, e.dtype)
        if isinstance(e, Var):
            if e.name not in env:
                raise BackendError(f"kernel '{self.kernel.name}': '{e.name}' is not defined here")
            return env[e.name]
        if isinstance(e, GuardedLoad):
            return self.guarded_load(e, env)
        if isinstance(e, Load):
            buf, _ = self._buffer(e.buffer)
            return S.load_value(b, self.address(e.buffer, e.index, env), buf.dtype)
        if isinstance(e, Unary):
            return S.unary(b, e.fn, self.expr(e.x, env), e.x.dtype)
        if isinstance(e, Binary):
            return S.binary(b, e.fn, self.expr(e.a, env), self.expr(e.b, env), e.a.dtype)
        if isinstance(e, Select):
            return b.select(self.expr(e.cond, env), self.expr(e.a, env), self.expr(e.b, env))
        if isinstance(e, Cast):
            return S.cast(b, self.expr(e.x, env), e.x.dtype, e.dtype)
        if isinstance(e, CheckedIndex):
            return self.checks.index(e, env)
        raise BackendError(f"kernel '{self.kernel.name}': {e!r} is not an expression")



def _named(value: ir.Value, name: str) -> ir.Value:
    """Give an unnamed instruction the loop-IR name it is bound to (readable IR dumps)."""
    if isinstance(value, ir.Instruction) and value.name[:1] in ("", "."):    # llvmlite's ".N"
        value.name = name
    return value


def _merged_terms(index: Sequence[Expr], strides: list[ir.Value]) -> list[tuple[Expr, ir.Value]]:
    """(index expression, stride) per term of an address, with each pair of neighbouring dims
    indexed (E // c, E mod c) where the first's stride is c times the second's merged into
    E at the second's stride: a reshape's index of a flat position (a conv's (oh, ow) of its
    output column) addresses that position directly.  Exact for every integer E, since
    both are floored; LLVM, not knowing E's sign, kept the division and remainder, and a
    whole tile's loop read such an operand with gathers (a residual add in the conv's
    epilogue cost 0.9x the conv itself)."""
    terms = list(zip(index, strides))
    k = 0
    while k + 1 < len(terms):
        (hi, s_hi), (lo, s_lo) = terms[k], terms[k + 1]
        if isinstance(hi, Binary) and isinstance(lo, Binary) and hi.fn == "floordiv" and lo.fn == "mod" \
                and hi.a == lo.a and hi.b == lo.b and isinstance(lo.b, Const) and lo.b.value > 0 \
                and isinstance(s_hi, ir.Constant) and isinstance(s_lo, ir.Constant) \
                and s_hi.constant == lo.b.value * s_lo.constant:
            terms[k:k + 2] = [(lo.a, s_lo)]
            k = max(k - 1, 0)           # the merged term may pair with the one before it
        else:
            k += 1
    return terms


def _is_blockable_sum(s: Reduce) -> bool:
    """A Reduce whose every accumulator is a float `acc + x` (either operand order), whose
    accumulators are read nowhere else, and whose body only binds Lets: then its terms can
    be summed in any grouping.  Static extents of one block or less gain nothing."""
    if isinstance(s.extent, int) and s.extent <= SUM_BLOCK:
        return False
    updates = monoid_updates(s)
    return updates is not None and all(fn == "add" and S.kind(a.dtype) == "f"
                                       for (fn, _), a in zip(updates, s.accumulators))


MONOIDS = ("add", "mul", "maximum", "minimum", "and", "or", "xor")


def monoid_updates(r: Reduce) -> Optional[list[tuple[str, Expr]]]:
    """[(fn, term)] when every accumulator is updated as `acc fn term` with an associative,
    commutative fn and a term that reads no accumulator, and the body only binds Lets that
    read none either: then the terms may be combined in any grouping (blocked sums, threads
    reducing subsets).  None otherwise."""
    if not all(isinstance(s, Let) for s in r.body):
        return None
    names = {a.name for a in r.accumulators}
    if any(names & var_names(s.value) for s in r.body):
        return None
    out = []
    for a, u in zip(r.accumulators, r.update):
        acc = Var(a.name, a.dtype)
        if not (isinstance(u, Binary) and u.fn in MONOIDS and acc in (u.a, u.b)):
            return None
        term = u.b if u.a == acc else u.a
        if names & var_names(term):
            return None
        out.append((u.fn, term))
    return out
