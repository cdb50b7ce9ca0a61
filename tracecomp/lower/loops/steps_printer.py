"""The `loops` stage of a Program: its kernels (printer.py), and, for a Program with loops
and branches, one more `func.func @<name>_driver` that runs its steps (control.py) as
upstream MLIR, the loop around the kernels' calls:

  Scan   `scf.for` over the steps, the current carry of each carry an `iter_args` memref:
         the step writes into `arith.select` of the result buffer and its spare (the
         result when length-1-i is even) and yields it; xs and ys rows are
         `memref.subview`s cast to the kernels' identity layout;
  While  `scf.while` over the carries and the parity: the before-region runs the cond's
         kernels and `scf.condition`s on the predicate's `memref.load`, the after-region
         runs the body into the selected buffer; after the loop a carry not in its result
         buffer (compared as `memref.extract_aligned_pointer_as_index`) is `memref.copy`d;
  If     `scf.if` on the predicate.
Kernel calls are `func.call`s with every buffer of the kernel.  The driver takes every
buffer that is not bound, in the Program's order.  This is what llvm/control.py emits.
"""
from __future__ import annotations

import re

from . import control as C
from .printer import memref_type, print_kernels

_BARE_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_$.]*$")


def print_program(program, notes: dict[str, list[str]] | None = None) -> str:
    """`program`'s kernels as one module, with its driver when it has steps."""
    text = print_kernels(program.kernels, notes)
    if program.steps is None:
        return text
    driver = _Driver(program).function(f"{program.name}_driver", depth=1)
    return text[:text.rindex("}")] + driver + "}\n"


def _symbol(name: str) -> str:
    return name if _BARE_ID.match(name) else '"' + name.replace('"', '\\"') + '"'


class _Driver:
    def __init__(self, program):
        self.program = program
        self.kernels = {k.name: k for k in program.kernels}
        self.lines: list[str] = []
        self.depth = 0
        self.used: set[str] = set()

    def fresh(self, base: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_]", "_", base) or "v"
        name, n = base, 0
        while name in self.used:
            name, n = f"{base}_{n}", n + 1
        self.used.add(name)
        return "%" + name

    def line(self, text: str) -> None:
        self.lines.append("  " * self.depth + text)

    def type_of(self, name: str) -> str:
        return memref_type(self.program.buffers[name])

    def const(self, value: int, ty: str = "index") -> str:
        if ty == "i1":
            v = self.fresh("true" if value else "false")
            self.line(f"{v} = arith.constant {'true' if value else 'false'}")
            return v
        v = self.fresh(f"c{value}")
        self.line(f"{v} = arith.constant {value} : {ty}")
        return v

    def function(self, name: str, depth: int) -> str:
        p = self.program
        used = {b.name for k in p.kernels for b in k.buffers}
        used |= {n for s in _all_steps(p.steps) for n in C.outer_buffers(s)}
        args, env = [], {}
        for n, b in p.buffers.items():
            if b.role != "bound" and n in used:
                env[n] = self.fresh(n)
                args.append(f"{env[n]}: {memref_type(b)}")
        self.depth = depth
        self.line(f"func.func @{_symbol(name)}({', '.join(args)}) {{")
        self.depth += 1
        self.steps(p.steps, env)
        self.line("func.return")
        self.depth -= 1
        self.line("}")
        return "\n".join(self.lines) + "\n"

    def steps(self, steps: list, env: dict) -> None:
        for s in steps:
            if isinstance(s, C.Run):
                k = self.kernels[s.kernel]
                values = ", ".join(env[b.name] for b in k.buffers)
                types = ", ".join(memref_type(b) for b in k.buffers)
                self.line(f"func.call @{_symbol(k.name)}({values}) : ({types}) -> ()")
            elif isinstance(s, C.Scan):
                self.scan(s, env)
            elif isinstance(s, C.While):
                self.while_loop(s, env)
            else:
                self.branch(s, env)

    def block_env(self, env: dict, block: C.Block, inputs: list, outputs: list = ()) -> dict:
        inner = dict(env)
        inner.update(zip(block.inputs, inputs))
        inner.update(zip(block.outputs, outputs))
        return inner

    def row(self, value: str, stacked: str, r: str, bound: str) -> str:
        """Row r of a stacked buffer as a memref of the row's own identity layout."""
        shape = self.program.buffers[stacked].shape
        rest = shape[1:]
        strides, at = [], 1
        for d in reversed(rest):
            strides.insert(0, at)
            at *= d
        dims = "".join(f"{d}x" for d in rest)
        element = self.program.buffers[stacked].dtype.mlir
        strided = f"memref<{dims}{element}, strided<[{', '.join(map(str, strides))}], offset: ?>>"
        view = self.fresh(bound + "_view")
        offsets = ", ".join([r] + ["0"] * len(rest))
        sizes = ", ".join(["1"] + [str(d) for d in rest])
        ones = ", ".join(["1"] * len(shape))
        self.line(f"{view} = memref.subview {value}[{offsets}] [{sizes}] [{ones}] : "
                  f"{memref_type(self.program.buffers[stacked])} to {strided}")
        out = self.fresh(bound)
        self.line(f"{out} = memref.cast {view} : {strided} to memref<{dims}{element}>")
        return out

    def copy(self, src: str, dst: str, name: str) -> None:
        ty = self.type_of(name)
        self.line(f"memref.copy {src}, {dst} : {ty} to {ty}")

    def scan(self, s: C.Scan, env: dict) -> None:
        if s.length == 0:
            for c, i in zip(s.carry, s.init):
                self.copy(env[i], env[c], c)
            return
        zero, one, n, last = self.const(0), self.const(1), self.const(s.length), self.const(s.length - 1)
        i = self.fresh("i")
        carries = [self.fresh("carry") for _ in s.init]
        types = [self.type_of(c) for c in s.carry]
        results = self.fresh("scan")
        iter_args = ", ".join(f"{a} = {env[x]}" for a, x in zip(carries, s.init))
        head = f"scf.for {i} = {zero} to {n} step {one}"
        if carries:
            head = f"{results}:{len(carries)} = {head} iter_args({iter_args}) -> ({', '.join(types)})"
        self.line(head + " {")
        self.depth += 1
        r = i
        if s.reverse:
            r = self.fresh("row")
            self.line(f"{r} = arith.subi {last}, {i} : index")
        outs = []
        if any(s.spare):
            left = r
            if not s.reverse:
                left = self.fresh("left")
                self.line(f"{left} = arith.subi {last}, {i} : index")
            bit = self.fresh("odd")
            self.line(f"{bit} = arith.andi {left}, {one} : index")
            even = self.fresh("even")
            self.line(f"{even} = arith.cmpi eq, {bit}, {zero} : index")
        kept = C.invariant(s)
        for a, keep, c, sp, ty in zip(carries, kept, s.carry, s.spare, types):
            if keep or sp is None:
                outs.append(a if keep else env[c])
                continue
            out = self.fresh("next")
            self.line(f"{out} = arith.select {even}, {env[c]}, {env[sp]} : {ty}")
            outs.append(out)
        nc, nk = len(s.consts), len(s.init)
        xs = [self.row(env[x], x, r, "x") for x in s.xs]
        ys = [self.row(env[y], y, r, "y") for y in s.ys]
        self.steps(s.body.steps, self.block_env(env, s.body, [env[k] for k in s.consts] + carries + xs, outs + ys))
        if carries:
            self.line(f"scf.yield {', '.join(outs)} : {', '.join(types)}")
        self.depth -= 1
        self.line("}")
        assert nc + nk + len(s.xs) == len(s.body.inputs)
        for keep, c, i in zip(kept, s.carry, s.init):         # invariant carries stayed in init
            if keep:
                self.copy(env[i], env[c], c)

    def while_loop(self, s: C.While, env: dict) -> None:
        types = [self.type_of(c) for c in s.carry]
        no = self.const(0, "i1")
        yes = self.const(1, "i1")
        before = [self.fresh("carry") for _ in s.init]
        odd = self.fresh("odd")
        results = self.fresh("loop")
        all_types = ", ".join(types + ["i1"])
        inits = ", ".join([f"{a} = {env[x]}" for a, x in zip(before, s.init)] + [f"{odd} = {no}"])
        self.line(f"{results}:{len(types) + 1} = scf.while ({inits}) : ({all_types}) -> ({all_types}) {{")
        self.depth += 1
        consts = [env[k] for k in s.consts]
        inner = self.block_env(env, s.cond, consts + before)
        self.steps(s.cond.steps, inner)
        pred = self.fresh("go")
        self.line(f"{pred} = memref.load {inner[s.cond.outputs[0]]}[] : {self.type_of(s.cond.outputs[0])}")
        self.line(f"scf.condition({pred}) {', '.join(before + [odd])} : {all_types}")
        self.depth -= 1
        after = [self.fresh("carry") for _ in s.init]
        odd2 = self.fresh("odd")
        args = ", ".join(f"{a}: {t}" for a, t in zip(after + [odd2], types + ["i1"]))
        self.line(f"}} do {{")
        self.line(f"^bb0({args}):")
        self.depth += 1
        outs = []
        for a, keep, c, sp, ty in zip(after, C.invariant(s), s.carry, s.spare, types):
            if keep:
                outs.append(a)
                continue
            out = self.fresh("next")
            self.line(f"{out} = arith.select {odd2}, {env[sp]}, {env[c]} : {ty}")
            outs.append(out)
        self.steps(s.body.steps, self.block_env(env, s.body, consts + after, outs))
        flipped = self.fresh("odd")
        self.line(f"{flipped} = arith.xori {odd2}, {yes} : i1")
        self.line(f"scf.yield {', '.join(outs + [flipped])} : {all_types}")
        self.depth -= 1
        self.line("}")
        for k, (c, ty) in enumerate(zip(s.carry, types)):
            a, b, ne = self.fresh("at"), self.fresh("at"), self.fresh("moved")
            self.line(f"{a} = memref.extract_aligned_pointer_as_index {results}#{k} : {ty} -> index")
            self.line(f"{b} = memref.extract_aligned_pointer_as_index {env[c]} : {ty} -> index")
            self.line(f"{ne} = arith.cmpi ne, {a}, {b} : index")
            self.line(f"scf.if {ne} {{")
            self.depth += 1
            self.copy(f"{results}#{k}", env[c], c)
            self.depth -= 1
            self.line("}")

    def branch(self, s: C.If, env: dict) -> None:
        pred = self.fresh("pred")
        self.line(f"{pred} = memref.load {env[s.pred]}[] : {self.type_of(s.pred)}")
        operands = [env[n] for n in s.operands]
        results = [env[n] for n in s.results]
        self.line(f"scf.if {pred} {{")
        self.depth += 1
        self.steps(s.then.steps, self.block_env(env, s.then, operands, results))
        self.depth -= 1
        self.line("} else {")
        self.depth += 1
        self.steps(s.orelse.steps, self.block_env(env, s.orelse, operands, results))
        self.depth -= 1
        self.line("}")


def _all_steps(steps: list):
    for s in steps:
        yield s
        for b in C.blocks(s):
            yield from _all_steps(b.steps)
