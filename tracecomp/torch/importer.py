"""An ATen FX graph as a tracecomp function: the graph replayed on tc tensors inside tc.trace.

`CompiledGraph(gm)` is what the backend returns for a graph (or a partition of one) whose
every node the table (aten.py) maps.  Its traced function walks the FX nodes in order and
calls each node's rule on tc tensors, so tc.trace records the graph into tracecomp's IR
and compiles it with the usual pipeline, once per input signature (shapes and dtypes).

    torch tensors --DLPack/NumPy views, no copy--> tc.trace(replay) --> NumPy arrays
        --torch.from_numpy, no copy--> torch tensors

The compiled code reads C-contiguous arrays: an input that is contiguous in another order
of its dims (a transposed weight saved for the backward) is passed in that order and
permuted back inside the graph, any other layout is copied (per call, logged once per graph
input).  Dynamo's dynamic sizes are tracecomp's: a tensor input's dim whose example size is a
SymInt of one symbol is traced as a symbolic size of that name (tc.trace(dynamic=...): equal
symbols, one size), so one compile serves every size Dynamo's graph does; a SymInt input
that is such a symbol is not passed to tc.trace but read from the tensor dim it equals (it
would key a compile per value).  Sizes that the graph returns (AOTAutograd saves them for
the backward) are computed per call from the inputs' sizes, by the graph's shape arithmetic.
Where the trace with symbolic sizes fails, the graph compiles once per shape, and the log
says why.  Outputs that are views in PyTorch's graph of
an input or of another output (the graph returns `x` and `x.t()`) are taken in PyTorch from
the tensor they view, so they alias what eager's would, with eager's strides: AOTAutograd
rebuilds views of inputs from those.  An output of another dim order in memory than its
shape's (attention's, behind a transposed query) that such views are taken of is returned
in eager's order, since a view may rely on it.  Get_attr constants are read from the module at every
call, as inputs.

`probe(gm)` decides, before anything compiles, which nodes tracecomp takes: a node whose
target has no rule, whose tensors have a dtype tracecomp lacks, a device other than the CPU
or a size that depends on the data, whose rule's check refuses the call, or whose rule raises
or gives another shape or dtype than the graph's example value when traced on stand-ins of
its inputs' example values (one tc trace for the whole graph that compiles nothing, each
node on stand-ins of its own, at the example sizes).  The partitioner (partition.py) leaves the nodes it refuses to PyTorch.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import math
import operator
import os
import re
from typing import Any, Callable

import numpy as np
import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import guarding_hint_or_throw, has_guarding_hint

from ..core.dtypes import DType
from ..core.locations import Location
from ..core.symbolic import DynamicShapeError, evaluate, is_dynamic
from ..dispatch import api as tc
from ..dispatch import tracer
from ..runtime.cache import settings as compile_cache
from ..transforms.stages import Lowered
from ..transforms.trace import ShapeDtype, TracedFunction
from .aten import rule_for

log = logging.getLogger("tracecomp.torch")

MAX_RETRACES = 64       # a graph with dynamic sizes traces once per size; tc.trace warns past this

# How many graphs the backend received (Dynamo's), compiled (AOTAutograd's, by kind) and
# traced (tc.trace signatures of the compiled graphs and partitions).
counts: collections.Counter = collections.Counter()

# Refusals that are no fallback of an op the user wrote: sizes computed in Python.
QUIET = ("shape arithmetic (runs in Python)",)

DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.int32: np.int32,
          torch.int64: np.int64, torch.bool: np.bool_, torch.bfloat16: DType.bfloat16.np,
          torch.float16: np.float16}


def tensor_refusal(value) -> str | None:
    """Why a tensor (an example value) cannot enter compiled code, or None."""
    if value.dtype not in DTYPES:
        return (f"dtype {str(value.dtype).removeprefix('torch.')} (tracecomp has float32, float64, "
                f"bfloat16, float16, int32, int64, bool)")
    if value.device.type != "cpu":
        return f"a tensor on {value.device}"
    if value.layout != torch.strided:
        return f"a {value.layout} tensor"
    if any(hint(d) is None for d in value.shape):
        return "a size that depends on the data"
    return None


def hint(v):
    """The value a size has in the example inputs: an int for an int or a backed SymInt
    (Dynamo's dynamic sizes), None for an unbacked one (a size that depends on data).
    Asking adds no guard."""
    if isinstance(v, torch.SymFloat):
        return v.node.hint if v.node.has_hint() else None
    if isinstance(v, (torch.SymInt, torch.SymBool)):
        return guarding_hint_or_throw(v) if has_guarding_hint(v) else None
    return v


def _concrete(value):
    """An example value with its symbolic sizes and scalars replaced by their hints."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return hint(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_concrete(v) for v in value)
    return value


# Shape arithmetic: nodes of sizes (Dynamo's dynamic sizes) computed in Python, at trace
# time inside tracecomp's graphs: the compiled code is specialized to the sizes it sees,
# one trace per distinct size, as for any Python int that a tc.trace'd function takes.
SHAPE_FUNCTIONS = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv,
                   operator.mod, operator.neg, operator.pow, operator.eq, operator.ne, operator.lt,
                   operator.le, operator.gt, operator.ge, operator.and_, operator.or_, math.ceil, math.floor,
                   torch.sym_max, torch.sym_min, torch.sym_float, torch.sym_int, torch.sym_not}
SIZE_OPS = {torch.ops.aten.sym_size.int: lambda self, dim: self.shape[dim],
            torch.ops.aten.sym_numel.default: lambda self: self.numel()}
SCALARS = (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


def shape_step(target) -> Callable | None:
    """How a node of shape arithmetic computes its int (None: not one tracecomp knows)."""
    if target in SIZE_OPS:
        fn = SIZE_OPS[target]
        return lambda args, kwargs: fn(*args, **kwargs)
    if target in SHAPE_FUNCTIONS:
        return lambda args, kwargs: target(*args, **kwargs)
    return None


def example_values(gm: torch.fx.GraphModule) -> dict:
    """Each node's example value: what FakeTensor propagation recorded (`meta["val"]`), or
    for a get_attr constant without one, the constant itself."""
    values = {}
    for n in gm.graph.nodes:
        value = n.meta.get("val")
        if value is None and n.op == "get_attr":
            value = getattr(gm, n.target, None)
        values[n] = value
    return values


def _tensors_in(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v)]
    return []


def _is_tensor_valued(value) -> bool:
    """A tensor, or a tuple/list of tensors and Nones (a multi-output op)."""
    if isinstance(value, torch.Tensor):
        return True
    return isinstance(value, (list, tuple)) and all(v is None or isinstance(v, torch.Tensor) for v in value) \
        and any(isinstance(v, torch.Tensor) for v in value)


def static_refusal(node: torch.fx.Node, values: dict) -> str | None:
    """Why `node` cannot be compiled, judged from its target and example values alone."""
    def example(n):
        return values.get(n) if isinstance(n, torch.fx.Node) else n
    if node.target is operator.getitem:
        return None if isinstance(example(node.args[0]), (list, tuple)) else "indexing a value that is not a tuple"
    out = example(node)
    inputs = node.all_input_nodes
    if isinstance(out, SCALARS):
        if shape_step(node.target) is None:
            return QUIET[0]
        if hint(out) is None or any(not isinstance(example(i), (torch.Tensor,) + SCALARS) for i in inputs):
            return "a size that depends on the data"
        return None
    if not _is_tensor_valued(out):
        return "no example value" if out is None else f"a result of type {type(out).__name__}"
    rule = rule_for(node.target)
    if rule is None:
        return "no tracecomp rule"
    for i in inputs:
        value = example(i)
        if not isinstance(value, torch.Tensor) and not (isinstance(value, SCALARS) and hint(value) is not None):
            return f"an argument of type {type(value).__name__}"
    for t in _tensors_in(out) + [t for i in inputs for t in _tensors_in(example(i))]:
        why = tensor_refusal(t)
        if why is not None:
            return why
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), example)
    return rule.refusal(args, kwargs)


def _standin(value):
    """What the probe's trace takes for an example value: a shape and dtype, or an int."""
    if isinstance(value, torch.Tensor):
        return ShapeDtype(tuple(hint(d) for d in value.shape), np.dtype(DTYPES[value.dtype]))
    return hint(value)


def _mismatch(result, expected) -> str | None:
    """How a rule's result differs from the graph's example value (shape, dtype, arity)."""
    if isinstance(expected, (list, tuple)):
        if not isinstance(result, (list, tuple)) or len(result) != len(expected):
            return f"gives {type(result).__name__} where ATen gives {len(expected)} results"
        for r, e in zip(result, expected):
            why = None if e is None else _mismatch(r, e)
            if why is not None:
                return why
        return None
    shape = getattr(result, "shape", None)
    dtype = getattr(getattr(result, "dtype", None), "name", None)
    want = tuple(hint(d) for d in expected.shape)
    if shape is None or tuple(shape) != want:
        return f"gives shape {shape} where ATen gives {want}"
    if dtype != str(expected.dtype).removeprefix("torch."):
        return f"gives {dtype} where ATen gives {str(expected.dtype).removeprefix('torch.')}"
    return None


def probe(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, str]:
    """The call_function nodes that tracecomp does not take, each with the reason."""
    refused: dict[torch.fx.Node, str] = {}
    candidates = []
    values = example_values(gm)
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        why = static_refusal(node, values)
        if why is not None:
            refused[node] = why
        elif node.target is not operator.getitem and not isinstance(values[node], SCALARS):
            candidates.append(node)
    if candidates:
        refused.update(_traced_refusals(candidates, values))
    for node in gm.graph.nodes:       # a getitem goes with the node it unpacks
        if node.op == "call_function" and node.target is operator.getitem and node.args[0] in refused:
            refused[node] = refused[node.args[0]]
    return refused


def _traced_refusals(candidates: list, values: dict) -> dict:
    """Each candidate's rule traced on stand-ins shaped like its inputs' example values,
    all in one trace that compiles nothing; the nodes whose rule raises or gives another
    shape or dtype than ATen's."""
    feeds = []
    for node in candidates:
        for i in node.all_input_nodes:
            if i not in feeds:
                feeds.append(i)
    found: dict = {}

    def each_node(*standins):
        env = dict(zip(feeds, standins))
        for node in candidates:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
            args, kwargs = _concrete(args), _concrete(kwargs)
            try:
                why = _mismatch(rule_for(node.target)(args, kwargs), values[node])
            except Exception as e:        # noqa: BLE001 - any failure leaves the node to PyTorch
                why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            if why is not None:
                found[node] = why
        return None
    each_node.__name__ = "probe"
    TracedFunction(each_node).eval_shape(*[_standin(values[i]) for i in feeds])
    return found


def _is_view(node) -> bool:
    """Whether PyTorch's result of `node` aliases its first argument (a view op)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return _is_view(node.args[0])
    schema = getattr(node.target, "_schema", None)
    return schema is not None and not schema.is_mutable and any(r.alias_info is not None for r in schema.returns)


def _root(node):
    while _is_view(node):
        node = node.args[0]
    return node


def _views_of_inputs_only(node) -> bool:
    """Whether every view on the way from `node` to its root takes nothing computed but
    the tensor it views (its sizes are constants or graph inputs), so PyTorch can redo it."""
    while _is_view(node):
        if any(i.op not in ("placeholder", "get_attr") for i in node.all_input_nodes[1:]):
            return False
        node = node.args[0]
    return True


def user_frame(node: torch.fx.Node) -> tuple[str, int, str, str] | None:
    """(file, line, function, code) of the innermost frame of the node's recorded stack
    (Dynamo's `meta["stack_trace"]`: the user's line the node comes from), or None."""
    trace = node.meta.get("stack_trace")
    if not trace:
        return None
    lines = trace.rstrip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = re.match(r'\s*File "(.+)", line (\d+), in (.+)', lines[i])
        if m:
            code = lines[i + 1].strip() if i + 1 < len(lines) and not lines[i + 1].lstrip().startswith("File ") else ""
            return m.group(1), int(m.group(2)), m.group(3), code
    return None


def _location(node: torch.fx.Node) -> Location | None:
    """The node's user line as the location of the ops its rule records."""
    frame = user_frame(node)
    if frame is None:
        return None
    rel = os.path.relpath(frame[0]) if os.path.isabs(frame[0]) else frame[0]
    return Location(frame[0] if rel.startswith("..") else rel, frame[1])


class _Replay:
    """The FX graph as the traced function replays it: slotted, so that tc.trace's walk of
    what the function closes over (closures.py) finds no tensors in it.

    The traced function returns the outputs that are tensors; the others (sizes and
    constants) are kept per signature in `scalars`, under the key that the caller puts in
    `pending` before the call: {signature: {position: value}} (CompiledGraph computes the
    sizes per call instead where the graph's shape arithmetic gives them).  `derived`: the
    SymInt inputs read from a tensor input's dim, {node: (tensor node, dim)}."""
    __slots__ = ("inputs", "steps", "outputs", "orders", "scalars", "pending", "derived")

    def __init__(self, inputs: list, steps: list, outputs: list, orders: dict, derived: dict):
        self.inputs = inputs
        self.steps = steps
        self.outputs = outputs
        self.orders = orders        # output position -> the dim order it is returned in
        self.derived = derived
        self.scalars: dict = {}
        self.pending = None

    def run(self, values: tuple, layouts: tuple | None = None):
        if layouts is not None:      # an input passed as its dims in memory order: put back
            values = tuple(v if p is None else tc.permute(v, _inverse(p)) for v, p in zip(values, layouts))
        env = dict(zip(self.inputs, values))
        for node, (tensor, dim) in self.derived.items():
            env[node] = env[tensor].shape[dim]
        ctx = tracer.current()
        for node, call in self.steps:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
            loc = _location(node) if ctx is not None else None
            with ctx.located(loc) if loc is not None else contextlib.nullcontext():
                env[node] = call(args, kwargs)
        outs = [env[n] if i not in self.orders else tc.permute(env[n], self.orders[i])
                for i, n in enumerate(self.outputs)]
        tensors = [i for i, o in enumerate(outs) if isinstance(o, tc.Tensor)]
        if tensors != [i for i, n in enumerate(self.outputs) if _is_tensor_valued(n.meta.get("val"))]:
            raise TypeError(f"the graph's outputs {[n.name for n in self.outputs]} replayed as "
                            f"{[type(o).__name__ for o in outs]}, not as its example values' kinds")
        self.scalars[self.pending] = {i: o for i, o in enumerate(outs) if i not in tensors}
        return tuple(outs[i] for i in tensors)


def _symbolic_sizes(inputs: list) -> tuple[dict, dict]:
    """Dynamo's dynamic sizes among the graph's inputs: ({input position: {dim: name}} of the
    tensor dims whose example size is a SymInt of one symbol, {SymInt input: (tensor input,
    dim)} for the SymInt inputs that are such a symbol)."""
    dynamic, where = {}, {}
    for k, n in enumerate(inputs):
        for d, name in _symbol_dims(n):
            dynamic.setdefault(k, {})[d] = name
            where.setdefault(name, (n, d))
    derived = {}
    for n in inputs:
        name = _symbol(n.meta.get("val"))
        if name in where:
            derived[n] = where[name]
    kept = [n for n in inputs if n not in derived]
    return {kept.index(inputs[k]): dims for k, dims in dynamic.items()}, derived


def _size_bindings(nodes: list, values: list) -> dict[str, int]:
    """This call's value of each of Dynamo's size symbols (the names of tracecomp's
    symbolic sizes), read from the tensor inputs whose example dims are those symbols."""
    sizes: dict[str, int] = {}
    for n, v in zip(nodes, values):
        if isinstance(v, torch.Tensor):
            for d, name in _symbol_dims(n):
                sizes.setdefault(name, v.shape[d])
    return sizes


def _symbol(value) -> str | None:
    """The name of Dynamo's size symbol that `value` (an example size) is, if it is one."""
    return str(value.node.expr) if isinstance(value, torch.SymInt) and value.node.expr.is_Symbol else None


def _symbol_dims(node: torch.fx.Node) -> list[tuple[int, str]]:
    """(dim, symbol name) of the node's example tensor dims that are one of Dynamo's symbols."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return []
    return [(d, name) for d, size in enumerate(value.shape) if (name := _symbol(size)) is not None]


def _from_shapes(node: torch.fx.Node) -> bool:
    """Whether the node's value is shape arithmetic on the graph's inputs alone."""
    if node.op in ("placeholder", "get_attr"):
        return True
    return node.op == "call_function" and shape_step(node.target) is not None and \
        all(_from_shapes(n) for n in node.all_input_nodes)


def _size_now(node: torch.fx.Node, env: dict):
    """A _from_shapes node's value for this call's inputs (torch tensors and ints in `env`)."""
    if node not in env:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: _size_now(n, env))
        env[node] = shape_step(node.target)(args, kwargs)
    return env[node]


def _getitem(args, kwargs):
    return args[0][args[1]]


def _inverse(perm: tuple) -> list:
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = i
    return out


def example_order(node: torch.fx.Node) -> tuple | None:
    """The dim order of the node's example value in memory where it is dense and not
    contiguous (attention's output behind a transposed query), else None."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor) or any(hint(d) is None for d in (*value.shape, *value.stride())):
        return None
    like = torch.empty_strided([hint(d) for d in value.shape], [hint(d) for d in value.stride()], device="meta")
    perm = memory_order(like)
    return None if perm is None or perm == tuple(range(like.dim())) else perm


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """The NumPy view of a CPU tensor's memory; bfloat16 (which torch's .numpy() refuses)
    through its bits, as ml_dtypes' bfloat16."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(DTYPES[torch.bfloat16])
    return t.numpy()


def as_torch(a: np.ndarray) -> torch.Tensor:
    """A tensor on the array's memory (as_numpy's inverse)."""
    if a.dtype == DTYPES[torch.bfloat16]:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def memory_order(t: torch.Tensor) -> tuple | None:
    """The permutation that makes a dense, non-overlapping tensor contiguous (a transposed
    weight, a channels-last image), or None where none does (expanded, sliced)."""
    perm = tuple(sorted(range(t.dim()), key=lambda d: -t.stride(d)))
    return perm if t.permute(perm).is_contiguous() else None


class CompiledGraph:
    """An FX graph of ATen ops that tracecomp runs whole: call it with the graph's inputs
    (torch tensors, in placeholder order), get its outputs (a tuple of torch tensors and
    Nones, or what the graph's output node holds)."""

    def __init__(self, gm: torch.fx.GraphModule, name: str = "graph", trace_options: dict | None = None,
                 fallback: bool = True, cache: tuple | None = None):
        self.gm = gm
        self.name = name
        self.fallback = fallback
        self.cache = cache          # (enabled, folder) for the compile cache while it compiles; None: as set
        graph = gm.graph
        self.placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        self.attrs = [n for n in graph.nodes if n.op == "get_attr"]
        output = next(n for n in graph.nodes if n.op == "output")
        self.out_tree = output.args[0]
        flat = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
        computed, plan, torch_side = [], [], []
        outputs = set(n for n in flat if isinstance(n, torch.fx.Node))
        for n in flat:
            if not isinstance(n, torch.fx.Node):
                plan.append(("value", n))
            elif n.op in ("placeholder", "get_attr"):
                plan.append(("node", n))
            elif _is_view(n) and (_root(n).op in ("placeholder", "get_attr") or _root(n) in outputs) \
                    and _views_of_inputs_only(n):
                plan.append(("node", n))
                torch_side.append(n)
            else:
                if n not in computed:
                    computed.append(n)
                plan.append(("node", n))
        self.computed = computed
        self.plan = plan
        self.torch_side = self._view_chains(torch_side)
        # an output that PyTorch takes views of comes back in eager's layout, which they may rely on
        bases = {_root(n) for n in torch_side}
        orders = {i: order for i, n in enumerate(computed) if n in bases and (order := example_order(n)) is not None}
        needed = self._needed(computed)
        inputs = self.placeholders + self.attrs
        used = [i for i, n in enumerate(inputs) if n in needed]
        dynamic, derived = _symbolic_sizes([inputs[i] for i in used])
        self.used = [i for i in used if inputs[i] not in derived]
        steps = []
        for node in graph.nodes:
            if node.op == "call_function" and node in needed:
                step = _getitem if node.target is operator.getitem else shape_step(node.target) or rule_for(node.target)
                steps.append((node, step))
        self.replay = _Replay([inputs[i] for i in self.used], steps, computed, orders, derived)
        # the sizes the graph returns, computed per call from the inputs (_size_now)
        self.tensor_outputs = [i for i, n in enumerate(computed) if _is_tensor_valued(n.meta.get("val"))]
        self.shape_outputs = [i for i, n in enumerate(computed) if i not in self.tensor_outputs and _from_shapes(n)]

        self._options = {"max_retraces": MAX_RETRACES, **(trace_options or {})}
        self._dynamic = dynamic if "dynamic" not in self._options and \
            self._options.get("backend", "cpu") == "cpu" else {}
        self._functions: dict[tuple, list] = {}       # per layout: [traced function, the one without dims]
        self.failed: str | None = None
        self._calls = 0
        self._copied: set[int] = set()

    @staticmethod
    def _needed(outputs: list) -> set:
        seen, stack = set(), list(outputs)
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            stack.extend(n.all_input_nodes)
        return seen

    def _view_chains(self, ends: list) -> list:
        """The view nodes, in graph order, that the outputs taken in PyTorch go through."""
        chain = set()
        for n in ends:
            while _is_view(n):
                chain.add(n)
                n = n.args[0]
        return [n for n in self.gm.graph.nodes if n in chain]

    def _array(self, i: int, t) -> tuple[Any, tuple | None]:
        """The NumPy view of input i that the compiled code reads, and the permutation of
        its dims it was taken in (None: as it is).  A tensor whose layout is contiguous
        in some order of its dims (a transposed weight) is read in that order and permuted
        back inside the graph; any other layout is copied, and the first copy logged."""
        if not isinstance(t, torch.Tensor):
            return t, None
        t = t.detach()
        if t.is_contiguous():
            return as_numpy(t), None
        perm = memory_order(t)
        if perm is not None:
            return as_numpy(t.permute(perm)), perm
        if i not in self._copied:
            self._copied.add(i)
            log.info("%s: input %d (shape %s, strides %s) is not dense: copied to a contiguous one at every call",
                     self.name, i, tuple(t.shape), t.stride())
        return as_numpy(t.contiguous()), None

    def _arguments(self, inputs: list) -> tuple:
        """(the traced function to call, its arguments) for the graph's `inputs`."""
        arrays = [self._array(i, inputs[i]) for i in self.used]
        values = [a for a, _ in arrays]
        layouts = tuple(p for _, p in arrays)
        self.replay.pending = (layouts, tuple((a.ndim, a.dtype.str) if isinstance(a, np.ndarray) else (type(a), a)
                                             for a in values))
        return self._traced_for(layouts), tuple(values)

    def _traced_for(self, layouts: tuple) -> TracedFunction:
        """The traced replay for inputs passed in these layouts: Dynamo's dynamic dims
        (in the layout's order of dims) symbolic from the first call, or, once that failed,
        a compile per shape."""
        functions = self._functions.get(layouts)
        if functions is None:
            replay = self.replay
            laid_out = None if all(p is None for p in layouts) else layouts

            def run_graph(*values):          # runs only when tc.trace traces a new signature
                counts["traces"] += 1
                return replay.run(values, laid_out)
            run_graph.__name__ = self.name
            dynamic = {k: {d if layouts[k] is None else layouts[k].index(d): name for d, name in dims.items()}
                       for k, dims in self._dynamic.items()}
            functions = self._functions[layouts] = [TracedFunction(run_graph, **self._options, dynamic=dynamic or None)]
            if dynamic:
                functions.append(TracedFunction(run_graph, **self._options, dynamic=False))
        return functions[0]

    def _cache_scope(self):
        if self.cache is None:
            return contextlib.nullcontext()
        return compile_cache.scoped(*self.cache)

    def lower(self, *args) -> Lowered:
        """The `Lowered` of tc.trace for these inputs (the graph's, as for a call)."""
        traced, values = self._arguments(list(args) + [getattr(self.gm, n.target) for n in self.attrs])
        with self._cache_scope():
            return traced.lower(*values)

    def __call__(self, *args):
        inputs = list(args) + [getattr(self.gm, n.target) for n in self.attrs]
        if self.failed is not None:
            return self.gm(*args)
        traced, values = self._arguments(inputs)
        first = self._calls == 0
        self._calls += 1
        try:
            with self._cache_scope():
                results = self._call(traced, values)
        except Exception as e:            # noqa: BLE001 - a first call that cannot compile runs in PyTorch
            if not first or not self.fallback:
                raise
            self.failed = f"{type(e).__name__}: {e}"
            log.warning("%s: tracecomp could not compile this graph (%s); PyTorch runs it", self.name, self.failed)
            return self.gm(*args)
        env: dict = dict(zip(self.placeholders + self.attrs, inputs))
        scalars = dict(self.replay.scalars.get(self.replay.pending, {}))     # (this call's, not the record)
        if any(is_dynamic(v) for v in scalars.values()):    # a size of an intermediate, traced symbolic
            sizes = _size_bindings(self.placeholders + self.attrs, inputs)
            scalars = {i: evaluate(v, sizes) for i, v in scalars.items()}
        for i in self.shape_outputs:
            scalars[i] = _size_now(self.computed[i], env)
        for i, r in zip(self.tensor_outputs, results):
            a = np.asarray(r)
            t = as_torch(a if a.flags.writeable else a.copy())
            env[self.computed[i]] = t if i not in self.replay.orders else t.permute(_inverse(self.replay.orders[i]))
        for i, v in scalars.items():
            env[self.computed[i]] = v
        for n in self.torch_side:
            a, kw = torch.fx.node.map_arg((n.args, n.kwargs), env.__getitem__)
            env[n] = a[0][a[1]] if n.target is operator.getitem else n.target(*a, **kw)
        out = [env[v] if kind == "node" else v for kind, v in self.plan]
        return type(self.out_tree)(out) if isinstance(self.out_tree, (list, tuple)) else out[0]

    def _call(self, traced, values):
        """traced(*values); where the graph's dynamic dims cannot be symbolic (tracecomp
        needs one as a number), a compile per shape from then on (_traced_for)."""
        try:
            return traced(*values)
        except DynamicShapeError as e:
            functions = next(f for f in self._functions.values() if f[0] is traced)
            if len(functions) == 1:
                raise
            log.info("%s: Dynamo's dynamic sizes cannot stay symbolic here (%s); compiling each shape",
                     self.name, e.reason)
            del functions[0]
            return functions[0](*values)

    @property
    def traces(self) -> int:
        """How many signatures tc.trace traced (and compiled) for this graph."""
        return sum(len(f.signatures) for functions in self._functions.values() for f in functions)
