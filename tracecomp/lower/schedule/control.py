"""Region ops in the scheduler: tc.scan, tc.while_loop and tc.cond as control steps
(loops/control.py) around the kernels of their regions.

Each region graph is scheduled on its own, recursively, as a Program (the scheduler's
`schedule_region`, so this module needs no import of the scheduler: `schedule(...,
region=True)`: its inputs are the block arguments, its outputs the yields; an index it
reads from a block argument is checked in the kernels, since no runtime check happens
between iterations).  While the enclosing graph is scheduled, the op holds a place in its
kernel list as a `Pending` kernel with no statements whose buffers are the outer buffers
the op reads (role "input") and writes ("output"), so the passes that reason about which
kernel reads what (epilogue fusion, update in place, row fusion) see the loop as one
kernel that touches them.  When scheduling ends, `expand` replaces each Pending kernel
with its regions' kernels and gives the Program its `steps`: the regions' buffers and
kernels are renamed under the op's kernel number (`k3r0_t1` is temp t1 of region 0 of
the op that kernel 3 would have been), their block arguments and yields become buffers of
role "bound" (no memory of their own: the runner points them at the operand, row or carry
of the moment), their computed-index checks join the Program's error record, numbered
after its own.

Random draws.  The runtime fills random buffers before the kernels run, once per call
(scheduler.HostFill), while a loop needs a new draw per step.  A scan's draws are made
for all of its steps at once: a fill of shape S in the body becomes a fill of the
enclosing program of shape (length, *S), passed to the body row by row as one more
scanned operand (a scan in a scan stacks twice).  A branch's draws are made before the
branch runs (one fill each, passed to both branches as extra operands; the branch not
taken ignores them).  So every step reads numbers of its own, from the generator
tc.manual_seed sets, though in another order than the interpreter draws them.  A while
loop cannot know its trip count beforehand: random draws in one raise BackendError, as
do dynamic sizes.
"""
from __future__ import annotations

import dataclasses

from ...core import dtypes as dt
from ...core.errors import BackendError
from ...core.symbolic import is_dynamic
from ...ir import CONSTANT, Graph, Op, Value
from ...ir import regions as R
from ..loops import ir as L
from ..loops import control as C
from ..loops import walk as W
from .nests import fresh_name, kernel_name, loop_nest


@dataclasses.dataclass
class Pending(L.Kernel):
    """A region op's place among the kernels until `expand`: no statements; `buffers` are
    the outer buffers its step uses; `step` names them and holds the regions' Programs."""
    step: object = None
    programs: list = dataclasses.field(default_factory=list)


W.CHILDREN.setdefault(Pending, W.CHILDREN[L.Kernel])


def operands_in_memory(graph: Graph) -> set[Value]:
    """Values a region op reads: each needs a buffer (constants get theirs when emitted)."""
    return {v for op in graph.ops if op.regions for v in op.operands
            if v.op is None or v.op.name != CONSTANT}


def emit(sched, op: Op) -> None:
    """Schedule `op`'s regions and append its Pending kernel to the program."""
    where = f" at {op.loc}" if op.loc is not None else ""
    if any(is_dynamic(d) for v in op.operands + op.results for d in v.type.shape):
        raise BackendError(f"{op.name}{where}: loops and branches with dynamic sizes cannot be "
                           "compiled yet")
    operands = [_buffer_of(sched, v) for v in op.operands]
    results = [sched.names[r] for r in op.results]
    programs = []
    for g in op.regions:
        p = sched.schedule_region(g)
        if p.fills and op.name == R.WHILE:
            raise BackendError(f"{op.name}{where}: random draws inside a compiled while loop are not "
                               "supported (its trip count is not known before it runs, and the runtime "
                               "draws before the kernels); draw outside the loop and pass the numbers in")
        programs.append(p)
    number = len(sched.program.kernels)
    if op.name == R.SCAN:
        k, c = op.attrs["num_consts"], op.attrs["num_carry"]
        length = op.attrs["length"]
        draws = _draws_per_step(sched, programs[0], length)
        kept = _fresh_outputs(programs[0], k, c)
        step = C.Scan(length, bool(op.attrs.get("reverse", False)), operands[:k], operands[k:k + c],
                      operands[k + c:] + draws, results[:c],
                      [_spare(sched, r) if length >= 2 and i not in kept else None
                       for i, r in enumerate(op.results[:c])], results[c:], None)
    elif op.name == R.WHILE:
        k = op.attrs["num_consts"]
        kept = _fresh_outputs(programs[1], k, len(op.results))
        step = C.While(operands[:k], operands[k:], results,
                       [None if i in kept else _spare(sched, r) for i, r in enumerate(op.results)], None, None)
    elif op.name == R.COND:
        draws = _draws_before(sched, programs)
        for p in programs:
            _fresh_outputs(p)
        step = C.If(operands[0], operands[1:] + draws, results, None, None)
    else:
        raise BackendError(f"{op.name}{where}: no compiled form for this op with regions")
    reads = dict.fromkeys(n for n in C.outer_buffers(step) if n not in results and n not in _spares(step))
    writes = dict.fromkeys(n for n in C.outer_buffers(step) if n in results or n in _spares(step))
    buffers = [dataclasses.replace(sched.buffers[n], role="input") for n in reads] + \
              [dataclasses.replace(sched.buffers[n], role="output") for n in writes]
    pending = Pending(kernel_name(number, [op]), buffers, [], step=step, programs=programs)
    sched.program.kernels.append(pending)
    sched.program.kernel_ops[pending.name] = [op]


def _draw_input(p, fill) -> None:
    """The buffer region Program `p` filled with random numbers becomes one more input."""
    b = p.buffers[fill.buffer]
    p.buffers[fill.buffer] = L.Buffer(b.name, b.dtype, b.shape, "input")
    p.inputs.append(fill.buffer)


def _draws_per_step(sched, p, length: int) -> list[str]:
    """A scan body's random fills as stacked fills of the enclosing program, one row per
    step (see the module docstring); returns those buffers, scanned after the xs."""
    out = []
    for f in p.fills:
        name = fresh_name(sched.buffers, "draws")
        sched.buffers[name] = L.Buffer(name, f.dtype, (length, *f.shape), "temp")
        sched.add_fill(name, f.impl, f.dtype, (length, *f.shape))
        _draw_input(p, f)
        out.append(name)
    p.fills = []
    return out


def _draws_before(sched, programs: list) -> list[str]:
    """The branches' random fills as fills of the enclosing program, passed to both
    branches as extra operands (a branch gets an unused input for each of the other's)."""
    out = []
    for j, p in enumerate(programs):
        for f in p.fills:
            name = fresh_name(sched.buffers, "draws")
            sched.buffers[name] = L.Buffer(name, f.dtype, tuple(f.shape), "temp")
            sched.add_fill(name, f.impl, f.dtype, f.shape)
            for i, other in enumerate(programs):
                if i == j:
                    _draw_input(other, f)
                else:
                    unused = fresh_name(other.buffers, "unused")
                    other.buffers[unused] = L.Buffer(unused, f.dtype, tuple(f.shape), "input")
                    other.inputs.append(unused)
            out.append(name)
        p.fills = []
    return out


def _spares(step) -> list[str]:
    return [s for s in getattr(step, "spare", []) if s]


def _buffer_of(sched, v: Value) -> str:
    """The buffer holding operand `v`: its own, a constant's (made now), or a deferred row
    reduction's, given its kernel now (a loop reads it from memory)."""
    if v not in sched.names:
        if v.op is not None and v.op.name == CONSTANT:
            return sched._output_buffer(v)
        raise BackendError(f"a loop or branch reads {v}, which has no buffer (a bug in tracecomp)")
    name = sched.names[v]
    if name in sched.rows.pending:
        sched.rows.flush(sched.rows.pending[name])
    return name


def _spare(sched, result: Value) -> str:
    """A temp of the carry's type: the other half of its ping-pong pair."""
    b = sched.buffers[sched.names[result]]
    name = fresh_name(sched.buffers, "spare")
    sched.buffers[name] = L.Buffer(name, b.dtype, b.shape, "temp")
    return name


def _fresh_outputs(p, consts: int = 0, carries: int = 0) -> set[int]:
    """Give every yield of region Program `p` a distinct buffer its kernels write: a yield
    of a block argument, a constant or a value yielded before is copied into one.  Except
    an invariant carry (one of the first `carries` yields that is its own block argument,
    after `consts` others): returns their positions, which the runners keep in place."""
    if p.steps is None:
        p.steps = [C.Run(k.name) for k in p.kernels]
    kept = {j for j in range(carries) if p.outputs[j] == p.inputs[consts + j]}
    for j, name in enumerate(list(p.outputs)):
        b = p.buffers[name]
        if j in kept or b.role == "output" and name not in p.outputs[:j]:
            continue
        new = fresh_name(p.buffers, "yield")
        p.buffers[new] = L.Buffer(new, b.dtype, b.shape, "output")

        def copy(index, new=new, b=b):
            return [L.Store(new, index, L.Load(b.name, index, b.dtype))]
        kernel = L.Kernel(f"k{len(p.kernels)}_yield{j}", [dataclasses.replace(b, role="input"),
                                                           L.Buffer(new, b.dtype, b.shape, "output")],
                          loop_nest(tuple(b.shape), copy, prefix="y"))
        p.kernels.append(kernel)
        p.kernel_ops[kernel.name] = []
        p.steps.append(C.Run(kernel.name))
        p.outputs[j] = new
    return kept


# --------------------------------------------------------------------- expansion

def expand(program) -> None:
    """Replace each Pending kernel by its regions' kernels and give `program` its steps
    (None when it has no region op)."""
    if not any(isinstance(k, Pending) for k in program.kernels):
        return
    kernels, steps = [], []
    ops = program.kernel_ops
    program.kernel_ops = {}
    for k in program.kernels:
        if not isinstance(k, Pending):
            kernels.append(k)
            steps.append(C.Run(k.name))
            program.kernel_ops[k.name] = ops.get(k.name, [])
            continue
        number = k.name.split("_", 1)[0]
        merged = [_merge(program, p, f"{number}r{j}_", kernels, cond=isinstance(k.step, C.While) and j == 0)
                  for j, p in enumerate(k.programs)]
        step = k.step
        if isinstance(step, C.Scan):
            step = dataclasses.replace(step, body=merged[0])
        elif isinstance(step, C.While):
            step = dataclasses.replace(step, cond=merged[0], body=merged[1])
        else:
            step = dataclasses.replace(step, then=merged[0], orelse=merged[1])
        steps.append(step)
    program.kernels = kernels
    program.steps = steps
    if program.computed_checks:
        record = L.Buffer(L.INDEX_ERRORS, dt.INT64, (L.error_slots(len(program.computed_checks)),), "errors")
        program.buffers[L.INDEX_ERRORS] = record
        program.index_errors = L.INDEX_ERRORS
        for k in program.kernels:
            k.buffers = [record if b.name == L.INDEX_ERRORS else b for b in k.buffers]


def _merge(program, p, prefix: str, kernels: list, cond: bool) -> C.Block:
    """Region Program `p`'s buffers, constants, kernels and checks into `program`, renamed
    under `prefix` (its kernels appended to `kernels`); returns its Block."""
    def rename(n: str) -> str:
        return n if n == L.INDEX_ERRORS else prefix + n
    for n, b in p.buffers.items():
        if n == L.INDEX_ERRORS:
            continue
        role = b.role
        if role == "input" or role == "output" and not cond:
            role = "bound"
        elif role == "output":
            role = "temp"          # a while's predicate, read by the runner
        program.buffers[rename(n)] = L.Buffer(rename(n), b.dtype, b.shape, role)
    for n, value in p.constants.items():
        program.constants[rename(n)] = value
    offset = len(program.computed_checks)
    program.computed_checks = list(program.computed_checks) + list(p.computed_checks)
    if p.computed_checks and L.INDEX_ERRORS not in program.buffers:
        program.buffers[L.INDEX_ERRORS] = L.Buffer(L.INDEX_ERRORS, dt.INT64, (L.error_slots(0),), "errors")
    mapping = {n: rename(n) for n in p.buffers}

    def rule(node):
        if isinstance(node, L.CheckedIndex):
            return L.CheckedIndex(substitute(node.index), substitute(node.size), node.buffer, node.check + offset)
        fields = {f: mapping[getattr(node, f)] for f in W.NAMING_FIELDS
                  if isinstance(getattr(node, f, None), str) and getattr(node, f) in mapping}
        return W._rebuild(dataclasses.replace(node, **fields), substitute) if fields else None
    memo: dict = {}

    def substitute(node):
        return W.substitute(node, rule, memo)
    for k in p.kernels:
        kernels.append(L.Kernel(prefix + k.name, [dataclasses.replace(b, name=rename(b.name)) for b in k.buffers],
                                substitute(k.body), list(k.sizes)))
        program.kernel_ops[prefix + k.name] = p.kernel_ops.get(k.name, [])
    steps = p.steps if p.steps is not None else [C.Run(k.name) for k in p.kernels]
    return C.Block(C.renamed(steps, rename, lambda n: prefix + n), [rename(n) for n in p.inputs],
                   [rename(n) for n in p.outputs])


def rename_outer(program, old: str, new: str) -> None:
    """Buffer `old` is now `new` (donation's renames) in the Pending kernels' steps."""
    for k in program.kernels:
        if isinstance(k, Pending):
            k.step = _renamed_step(k.step, old, new)


def _renamed_step(step, old: str, new: str):
    changes = {}
    for f in dataclasses.fields(step):
        v = getattr(step, f.name)
        if isinstance(v, list):
            changes[f.name] = [new if x == old else x for x in v]
        elif v == old:
            changes[f.name] = new
    return dataclasses.replace(step, **changes)
