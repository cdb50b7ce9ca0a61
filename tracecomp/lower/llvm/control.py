"""A Program's control steps (loops/control.py) as LLVM IR: the native loop around the
kernels, so that a compiled scan or while loop is one native call.

`emit_steps(b, program, steps, env, call)` emits, at the builder, the steps' kernel calls
(through `call(b, kernel, pointers)`, which the user of this module chooses: a direct call
in the exported entry point and the stage dumps, a call through a table of addresses in
the JIT's driver), counted loops for scans, loops that read the predicate's byte for
while loops, and branches for conds.  `env` maps buffer names to pointers; bound buffers
get theirs here, per iteration: consts are the outer pointers, a scan's rows are byte
offsets into the stacked buffers, carries are loop phis that ping-pong between the
result buffer and its spare (loops/control.py), so no step copies a carry (an invariant
carry stays in init and is copied into its result once, after the loop).

`driver_function(module, program, name, positions, call)` wraps them in
`void name(void** buffers, void** kernels)`: every buffer that is not bound is
`buffers[positions[name]]`, the pointer list runtime/compiled.py builds per call;
`kernels` is what `call` reads (the JIT passes its table of kernel addresses).
"""
from __future__ import annotations

from typing import Callable

import llvmlite.ir as ir

from ..loops import control as C
from ..schedule.workspace import buffer_nbytes
from . import scalar as S
from .emitter import counted_loop, kernel_function_type

PTR = ir.PointerType()
I1, I8, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(64)
Call = Callable[[ir.IRBuilder, object, list], None]


def emit_steps(b: ir.IRBuilder, program, steps: list, env: dict, call: Call) -> None:
    _Steps(b, program, call).run(steps, env)


def driver_function(module: ir.Module, program, name: str, positions: dict[str, int],
                    call: Callable[[ir.Function], Call]) -> ir.Function:
    """`void name(ptr buffers, ptr kernels)` running `program.steps`; `call(fn)` gives the
    kernel caller, which may read the function's second argument."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [PTR, PTR]), name)
    fn.args[0].name, fn.args[1].name = "buffers", "kernels"
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    env = {}
    for n, i in positions.items():
        if n in program.buffers and program.buffers[n].role != "bound":
            slot = b.gep(fn.args[0], [ir.Constant(I64, i)], inbounds=True, source_etype=PTR)
            env[n] = b.load(slot, name=n, typ=PTR)
    emit_steps(b, program, program.steps, env, call(fn))
    b.ret_void()
    return fn


def plan_runner(name: str, max_arity: int) -> str:
    """The LLVM IR text of `void name(ptr* buffers, i64* plan)`: the kernels of any program
    without control flow, in one native call.  The plan lists them: its count, then per
    kernel its address, its arity n (at most max_arity: a larger one traps) and the n
    positions in `buffers` of its pointer arguments.  One function for every program,
    compiled once per process, where a driver per program cost a module compile each
    (6-9 ms).  Written as text: llvmlite's builder and printer took 160 ms for its
    quadratic body (a call per arity), the text takes 1 ms."""
    cases = " ".join(f"i64 {n}, label %arity{n}" for n in range(max_arity + 1))
    lines = [f"define void @{name}(ptr %buffers, ptr %plan) nounwind {{",
             "entry:", "  %count = load i64, ptr %plan", "  br label %head",
             "head:", "  %i = phi i64 [0, %entry], [%i.next, %next]", "  %at = phi i64 [1, %entry], [%at.next, %next]",
             "  %more = icmp ult i64 %i, %count", "  br i1 %more, label %kernel, label %done",
             "kernel:", "  %address.at = getelementptr inbounds i64, ptr %plan, i64 %at",
             "  %address = load i64, ptr %address.at", "  %target = inttoptr i64 %address to ptr",
             "  %arity.at = getelementptr inbounds i64, ptr %address.at, i64 1", "  %arity = load i64, ptr %arity.at",
             "  %positions = getelementptr inbounds i64, ptr %address.at, i64 2",
             f"  switch i64 %arity, label %too_many [ {cases} ]"]
    for n in range(max_arity + 1):
        lines.append(f"arity{n}:")
        for j in range(n):
            lines += [f"  %q{n}.{j} = getelementptr inbounds i64, ptr %positions, i64 {j}",
                      f"  %k{n}.{j} = load i64, ptr %q{n}.{j}",
                      f"  %s{n}.{j} = getelementptr inbounds ptr, ptr %buffers, i64 %k{n}.{j}",
                      f"  %b{n}.{j} = load ptr, ptr %s{n}.{j}"]
        lines += [f"  call void %target({', '.join(f'ptr %b{n}.{j}' for j in range(n))})", "  br label %next"]
    lines += ["next:", "  %i.next = add i64 %i, 1", "  %skip = add i64 %arity, 2", "  %at.next = add i64 %at, %skip",
              "  br label %head", "too_many:", "  call void @llvm.trap()", "  unreachable",
              "done:", "  ret void", "}", "declare void @llvm.trap() cold noreturn nounwind"]
    return "\n".join(lines) + "\n"


def table_call(kernel_index: dict[str, int], sizes: Callable[[object], list] = lambda k: [],
               argument: int = 1) -> Callable[[ir.Function], Call]:
    """A caller through the table of kernel addresses in the function's argument `argument`
    (the driver's second; the JIT's dynamic entry point's third), `sizes(kernel)` after the pointers."""
    def make(fn: ir.Function) -> Call:
        def call(b: ir.IRBuilder, kernel, pointers: list) -> None:
            slot = b.gep(fn.args[argument], [ir.Constant(I64, kernel_index[kernel.name])], inbounds=True,
                         source_etype=PTR)
            target = b.load(slot, typ=PTR)           # (unnamed: the IR is the driver's cache key)
            b.call(_Callee(target, kernel_function_type(kernel.buffers, kernel.sizes)), pointers + sizes(kernel))
        return call
    return make


class _Callee:
    """A function pointer as a callee: llvmlite's call takes the function's type from the
    callee, which an opaque pointer does not carry."""

    def __init__(self, pointer: ir.Value, function_type: ir.FunctionType):
        self.pointer = pointer
        self.type = pointer.type
        self.function_type = function_type

    def get_reference(self) -> str:
        return self.pointer.get_reference()


def direct_call(functions: dict[str, ir.Function], sizes: Callable[[object], list] = lambda k: []) -> Call:
    """A caller of the kernels' functions in the same module (`sizes(kernel)`: its size arguments)."""
    def call(b: ir.IRBuilder, kernel, pointers: list) -> None:
        b.call(functions[kernel.name], pointers + sizes(kernel))
    return call


class _Steps:
    def __init__(self, b: ir.IRBuilder, program, call: Call):
        self.b = b
        self.program = program
        self.call = call
        self.kernels = {k.name: k for k in program.kernels}
        self.memcpy = b.module.declare_intrinsic("llvm.memcpy", [PTR, PTR, I64])
        self.count = 0

    def run(self, steps: list, env: dict) -> None:
        for s in steps:
            if isinstance(s, C.Run):
                k = self.kernels[s.kernel]
                self.call(self.b, k, [env[buf.name] for buf in k.buffers])
            elif isinstance(s, C.Scan):
                self.scan(s, env)
            elif isinstance(s, C.While):
                self.while_loop(s, env)
            else:
                self.branch(s, env)

    def nbytes(self, name: str) -> int:
        return buffer_nbytes(self.program.buffers[name])

    def copy(self, dst, src, name: str) -> None:
        n = self.nbytes(name)
        if n:
            self.b.call(self.memcpy, [dst, src, ir.Constant(I64, n), ir.Constant(I1, 0)])

    def block_env(self, env: dict, block: C.Block, inputs: list, outputs: list = ()) -> dict:
        inner = dict(env)
        inner.update(zip(block.inputs, inputs))
        inner.update(zip(block.outputs, outputs))
        return inner

    def row(self, pointer, stacked: str, r):
        """Row r of a stacked buffer: a byte offset."""
        length = self.program.buffers[stacked].shape[0]
        size = self.nbytes(stacked) // length if length else 0
        return self.b.gep(pointer, [self.b.mul(r, ir.Constant(I64, size))], inbounds=True, source_etype=I8)

    def scan(self, s: C.Scan, env: dict) -> None:
        b, n = self.b, s.length
        if n == 0:
            for c, i in zip(s.carry, s.init):
                self.copy(env[c], env[i], c)
            return
        self.count += 1
        last = ir.Constant(I64, n - 1)
        with counted_loop(b, ir.Constant(I64, 0), ir.Constant(I64, n), f"scan{self.count}",
                          carried=[env[i] for i in s.init]) as loop:
            r = b.sub(last, loop.index) if s.reverse else loop.index
            # the last step writes the result buffer: step i writes it when n - 1 - i is even
            even = b.icmp_unsigned("==", b.and_(b.sub(last, loop.index), ir.Constant(I64, 1)), ir.Constant(I64, 0))
            kept = C.invariant(s)
            outs = [a if keep else env[c] if sp is None else b.select(even, env[c], env[sp])
                    for a, keep, c, sp in zip(loop.carried, kept, s.carry, s.spare)]
            inputs = [env[k] for k in s.consts] + list(loop.carried) + [self.row(env[x], x, r) for x in s.xs]
            outputs = outs + [self.row(env[y], y, r) for y in s.ys]
            self.run(s.body.steps, self.block_env(env, s.body, inputs, outputs))
            loop.next = outs
        for keep, c, i in zip(kept, s.carry, s.init):       # invariant carries stayed in init
            if keep:
                self.copy(env[c], env[i], c)

    def while_loop(self, s: C.While, env: dict) -> None:
        b = self.b
        self.count += 1
        fn, before = b.function, b.block
        header = fn.append_basic_block(f"while{self.count}.cond")
        body = fn.append_basic_block(f"while{self.count}.body")
        done = fn.append_basic_block(f"while{self.count}.exit")
        b.branch(header)
        b.position_at_end(header)
        carry = [b.phi(PTR, "carry") for _ in s.init]
        odd = b.phi(I1, "odd")          # iterations so far are odd: the next writes the spare
        for phi, i in zip(carry, s.init):
            phi.add_incoming(env[i], before)
        odd.add_incoming(ir.Constant(I1, 0), before)
        consts = [env[k] for k in s.consts]
        inner = self.block_env(env, s.cond, consts + carry)
        self.run(s.cond.steps, inner)
        pred = b.load(inner[s.cond.outputs[0]], typ=S.memory_type(self.program.buffers[s.cond.outputs[0]].dtype))
        b.cbranch(b.icmp_unsigned("!=", pred, ir.Constant(pred.type, 0)), body, done)
        b.position_at_end(body)
        outs = [phi if keep else b.select(odd, env[sp], env[c])
                for phi, keep, c, sp in zip(carry, C.invariant(s), s.carry, s.spare)]
        self.run(s.body.steps, self.block_env(env, s.body, consts + carry, outs))
        for phi, out in zip(carry, outs):
            phi.add_incoming(out, b.block)
        odd.add_incoming(b.xor(odd, ir.Constant(I1, 1)), b.block)
        b.branch(header)
        fn.blocks.remove(done)          # blocks in source order, for readable dumps
        fn.blocks.append(done)
        b.position_at_end(done)
        for phi, c in zip(carry, s.carry):       # none or an even count of iterations: copy
            with b.if_then(b.icmp_unsigned("!=", phi, env[c])):
                self.copy(env[c], phi, c)

    def branch(self, s: C.If, env: dict) -> None:
        b = self.b
        pred = b.load(env[s.pred], typ=S.memory_type(self.program.buffers[s.pred].dtype))
        operands = [env[n] for n in s.operands]
        results = [env[n] for n in s.results]
        with b.if_else(b.icmp_unsigned("!=", pred, ir.Constant(pred.type, 0))) as (then, orelse):
            with then:
                self.run(s.then.steps, self.block_env(env, s.then, operands, results))
            with orelse:
                self.run(s.orelse.steps, self.block_env(env, s.orelse, operands, results))
