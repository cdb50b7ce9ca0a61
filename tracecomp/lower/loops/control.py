"""Control steps: the order in which a Program with loops and branches runs its kernels.

A Program whose graph has region ops (ir/regions.py: tc.scan, tc.while_loop, tc.cond)
has `steps`, a list of
  Run(kernel)           call one kernel (all of its buffers are named in the program);
  Scan, While, If       run the Blocks they hold, as the region op says;
a Program without region ops has `steps` None and runs its kernels in order.

A Block is a region's sub-program, scheduled on its own (schedule/control.py) and merged
into the Program: its kernels are among `Program.kernels` (which lists every kernel, in
the order of a walk of the steps), its buffers among `Program.buffers`.  Its `inputs`
(one per block argument) and, except for a while loop's cond, its `outputs` (one per
yield) are buffers of role "bound": they own no memory, a control step points them at
memory before it runs the block's steps.  For every block whose outputs are bound, each
output is a distinct buffer that the block's steps write (the scheduler adds a copy
kernel where a yield is a block argument, a constant or another yield; but for an
invariant carry, below), so pointing it anywhere never makes two names of one buffer.  A while loop's cond block yields its
predicate in any buffer (bound, temp or constant): the runner reads that byte.

Binding (the same in every runner: llvm/control.py, loops/interp.py, runtime/cuda/runner.py,
and the MLIR of loops/steps_printer.py):
  Scan   body.inputs = consts (the outer buffers themselves), the carries, the rows
         xs[r] (pointer offsets into the stacked buffers; the last xs may be random draws
         made for all steps, schedule/control.py);  body.outputs = the new
         carries, the rows ys[r].  Step s runs row r = s (reversed: length-1-s).  Carries
         ping-pong between `carry` (the op's result buffers) and `spare` (temps of the
         same types): step 0 reads `init` in place, step s writes `carry` when
         length-1-s is even and `spare` otherwise, so the last step writes `carry` and
         no step copies a carry.  Length 0 copies init into carry; spare is None where
         the length is below 2.
  While  cond.inputs = body.inputs = consts, the current carries; body.outputs alternate
         between `carry` and `spare` (the first iteration writes `carry`); after the
         loop, a carry not in `carry` (no iteration ran, or an even count of them) is
         copied there.
  If     then.inputs = orelse.inputs = operands; their outputs are `results`.
A carry that the body yields unchanged (its yield is its own block argument: `invariant`)
stays where `init` is for every step, its spare None, and is copied into `carry` once,
after the loop: such a carry (a tc.fori_loop's upper bound) costs no copy per step.

`outer_buffers(step)` names the buffers of the enclosing scope a control step uses: the
workspace planner keeps them alive across the step's whole span.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Union


@dataclass
class Run:
    kernel: str


@dataclass
class Block:
    steps: list                                  # Run | Scan | While | If
    inputs: list[str]                            # bound to the block arguments
    outputs: list[str]                           # the yields (bound, but for a while's cond)


@dataclass
class Scan:
    length: int
    reverse: bool
    consts: list[str]
    init: list[str]
    xs: list[str]
    carry: list[str]                             # the op's carry results
    spare: list[Optional[str]]                   # ping-pong partners (None: length < 2)
    ys: list[str]                                # the op's stacked results
    body: Block


@dataclass
class While:
    consts: list[str]
    init: list[str]
    carry: list[str]
    spare: list[Optional[str]]                   # (None: an invariant carry)
    cond: Block
    body: Block


@dataclass
class If:
    pred: str
    operands: list[str]
    results: list[str]
    then: Block
    orelse: Block


Step = Union[Run, Scan, While, If]
CONTROL = (Scan, While, If)


def blocks(step) -> list[Block]:
    """The blocks a control step runs, in the order a runner meets them."""
    if isinstance(step, Scan):
        return [step.body]
    if isinstance(step, While):
        return [step.cond, step.body]
    if isinstance(step, If):
        return [step.then, step.orelse]
    return []


def outer_buffers(step) -> list[str]:
    """The enclosing scope's buffers a control step reads or writes (not its blocks')."""
    if isinstance(step, Scan):
        names = step.consts + step.init + step.xs + step.carry + step.ys + [s for s in step.spare if s]
    elif isinstance(step, While):
        names = step.consts + step.init + step.carry + [s for s in step.spare if s]
    elif isinstance(step, If):
        names = [step.pred] + step.operands + step.results
    else:
        return []
    return list(dict.fromkeys(names))


def invariant(step) -> list[bool]:
    """Per carry of a Scan or While: whether its body yields it unchanged (module docstring)."""
    at = len(step.consts)
    return [step.body.outputs[k] == step.body.inputs[at + k] for k in range(len(step.init))]


def scan_row(step: Scan, i: int) -> int:
    """The row of the xs and ys that the i-th step to run (0-based) reads and writes."""
    return step.length - 1 - i if step.reverse else i


def carry_targets(step, carry: list, into_results: bool, buffer: Callable) -> list:
    """Where one step of a Scan or While writes each carry: an invariant carry stays where it
    is (its entry in `carry`), the others go into their result buffer or into their spare, as
    `into_results` says (the runners alternate it so that a scan's last step writes the
    results); `buffer(name)` is a buffer's memory in the runner's terms."""
    return [a if keep else buffer(c if into_results else sp)
            for a, keep, c, sp in zip(carry, invariant(step), step.carry, step.spare)]


def kernels_run(steps: list) -> Iterator[str]:
    """The names of the kernels under `steps`, in the order of the walk (each once: a
    kernel belongs to one block)."""
    for s in steps:
        if isinstance(s, Run):
            yield s.kernel
        else:
            for b in blocks(s):
                yield from kernels_run(b.steps)


def has_control(steps: Optional[list]) -> bool:
    return bool(steps) and any(isinstance(s, CONTROL) for s in steps)


def renamed(steps: list, rename: Callable[[str], str], kernel: Callable[[str], str] = lambda n: n) -> list:
    """`steps` with every buffer name through `rename` and every kernel name through `kernel`."""
    out = []
    for s in steps:
        if isinstance(s, Run):
            out.append(Run(kernel(s.kernel)))
            continue
        changes = {}
        for f in dataclasses.fields(s):
            v = getattr(s, f.name)
            if isinstance(v, Block):
                changes[f.name] = Block(renamed(v.steps, rename, kernel), [rename(n) for n in v.inputs],
                                        [rename(n) for n in v.outputs])
            elif isinstance(v, list):
                changes[f.name] = [rename(n) if isinstance(n, str) else n for n in v]
            elif isinstance(v, str):
                changes[f.name] = rename(v)
        out.append(dataclasses.replace(s, **changes))
    return out


def to_json(steps: list) -> list:
    """The steps as JSON-ready dicts, each with its "kind" (run, scan, while, if) and its
    fields (blocks as {"steps", "inputs", "outputs"}): what tc.export(target="cuda") writes."""
    out = []
    for s in steps:
        d = {"kind": {Run: "run", Scan: "scan", While: "while", If: "if"}[type(s)]}
        for f in dataclasses.fields(s):
            v = getattr(s, f.name)
            d[f.name] = ({"steps": to_json(v.steps), "inputs": list(v.inputs), "outputs": list(v.outputs)}
                         if isinstance(v, Block) else list(v) if isinstance(v, list) else v)
        out.append(d)
    return out


def describe(steps: list, depth: int = 0) -> str:
    """The steps as indented text (for messages and tests)."""
    pad, lines = "  " * depth, []
    for s in steps:
        if isinstance(s, Run):
            lines.append(f"{pad}run {s.kernel}")
            continue
        head = {Scan: lambda: f"scan length={s.length}{' reverse' if s.reverse else ''}",
                While: lambda: "while", If: lambda: f"if {s.pred}"}[type(s)]()
        lines.append(f"{pad}{head}")
        for label, b in zip({Scan: ["body"], While: ["cond", "body"], If: ["then", "else"]}[type(s)], blocks(s)):
            lines.append(f"{pad}  {label}({', '.join(b.inputs)}) -> ({', '.join(b.outputs)})")
            lines.append(describe(b.steps, depth + 2))
    return "\n".join(x for x in lines if x)

