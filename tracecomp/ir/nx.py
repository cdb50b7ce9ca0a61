"""The graph IR as a networkx graph, as Graphviz DOT text, and a topological order.

`to_networkx(graph)` has one node per input ("in<i>"), op ("op<i>", in graph order) and
output ("out<i>"); every node has the attributes kind ("input", "op" or "output"),
label, op (the op name, or None), types (result types as text), loc (text or None) and
attrs (attribute texts; ops only).  Edges follow the data, from producer to user, and
carry label (the value's type), value (its printed name) and operands (the operand
positions that read it, since x * x is one edge).  Value names match the printer's.
`to_dot` draws that networkx graph, optionally with the fused kernels as clusters and the
backward ops set apart; DOT is written here, so no pydot is needed.
"""
from __future__ import annotations

import networkx

from ..core.errors import IRError
from .graph import Graph, Op, Value
from .printer import format_attr, value_names

ATTR_TEXT_LIMIT = 40   # characters of one attribute in a drawing; constants can be huge


def _attr_text(value) -> str:
    if value is None:
        return "(none)"
    try:
        text = format_attr(value)
    except IRError:
        text = repr(value)
    return text if len(text) <= ATTR_TEXT_LIMIT else text[:ATTR_TEXT_LIMIT - 3] + "..."


def to_networkx(graph: Graph) -> networkx.DiGraph:
    """The data-flow graph of inputs, ops and outputs (see the module docstring)."""
    g = networkx.DiGraph(name=graph.name)
    names = value_names(graph)
    # every definition up front, so a graph with ops out of order can still be drawn
    producer = {v: f"in{i}" for i, v in enumerate(graph.inputs)}
    producer.update((r, f"op{i}") for i, op in enumerate(graph.ops) for r in op.results)
    for i, v in enumerate(graph.inputs):
        g.add_node(f"in{i}", kind="input", label=names[v], op=None, types=[str(v.type)], loc=None)
    for i, op in enumerate(graph.ops):
        results = ", ".join(names[r] for r in op.results)
        g.add_node(f"op{i}", kind="op", label=f"{results} = {op.name}" if results else op.name,
                   op=op.name, types=[str(r.type) for r in op.results],
                   loc=str(op.loc) if op.loc else None,
                   attrs={k: _attr_text(v) for k, v in op.attrs.items()})
    for i, v in enumerate(graph.outputs):
        g.add_node(f"out{i}", kind="output", label=f"return #{i}", op=None, types=[str(v.type)], loc=None)
    for i, op in enumerate(graph.ops):     # edges after nodes: the node order is the graph's
        for j, v in enumerate(op.operands):
            _add_use(g, graph, producer, names, v, f"op{i}", j)
    for i, v in enumerate(graph.outputs):
        _add_use(g, graph, producer, names, v, f"out{i}", i)
    return g


def _add_use(g: networkx.DiGraph, graph: Graph, producer: dict, names: dict, v: Value,
             user: str, position: int) -> None:
    if v not in producer:
        raise IRError(f"graph @{graph.name}: {user} reads a value defined by no input or op: "
                      f"{v!r} (run tracecomp.ir.verifier.verify for details)")
    source = producer[v]
    if g.has_edge(source, user):
        g.edges[source, user]["operands"].append(position)
    else:
        g.add_edge(source, user, label=str(v.type), value=names[v], operands=[position])


def topological_order(graph: Graph) -> list[Op]:
    """The ops in a data-flow order, keeping the graph's order wherever the data allows.

    Unlike the verifier, this accepts ops listed out of order; it raises IRError when the
    data flow has a cycle or reads a value no input or op defines."""
    producer = {r: i for i, op in enumerate(graph.ops) for r in op.results}
    inputs = set(graph.inputs)
    deps = networkx.DiGraph()
    deps.add_nodes_from(range(len(graph.ops)))
    for i, op in enumerate(graph.ops):
        for v in op.operands:
            if v in producer:
                deps.add_edge(producer[v], i)
            elif v not in inputs:
                raise IRError(f"graph @{graph.name}: op #{i} '{op.name}' at {op.loc} reads a value "
                              f"that no input or op of the graph defines: {v!r}")
    try:
        order = list(networkx.lexicographical_topological_sort(deps))
    except networkx.NetworkXUnfeasible:
        cycle = networkx.find_cycle(deps)
        ops = " -> ".join(f"#{a} '{graph.ops[a].name}'" for a, _ in cycle)
        raise IRError(f"graph @{graph.name}: the data flow has a cycle: {ops} -> #{cycle[0][0]}") from None
    return [graph.ops[i] for i in order]


# ---------------------------------------------------------------- DOT

_SHAPES = {"input": "ellipse", "op": "box", "output": "ellipse"}
FORWARD_STYLE = 'style=filled, fillcolor="#dbe9f6", class="forward"'
BACKWARD_STYLE = 'style="filled,dashed", fillcolor="#fde2c8", color="#c05a00", class="backward"'
TERMINAL_STYLE = 'style=filled, fillcolor="#eeeeee"'


def _quote(text: str) -> str:
    """A DOT double-quoted string; `lines` join with DOT's centered line break."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def _label(data: dict) -> str:
    lines = [data["label"]]
    lines += [f"{k} = {v}" for k, v in data.get("attrs", {}).items()]
    lines += [f"-> {', '.join(data['types'])}" if data["kind"] == "op" else ", ".join(data["types"])]
    lines += [data["loc"]] if data["loc"] else []
    return "\\n".join(_quote(line)[1:-1] for line in lines)


def to_dot(graph: Graph, kernels: dict[str, list[Op]] | None = None,
           backward: set[Op] | frozenset = frozenset()) -> str:
    """Graphviz DOT text: inputs and outputs as grey ellipses, ops as boxes with their types.

    `kernels` (kernel name -> the graph ops it computes) draws each kernel as a cluster
    `cluster_<n>`; an op several kernels recompute (a view, a scalar) is drawn in the first.
    Ops in `backward` are dashed and orange, the others blue; in SVG output the op nodes
    carry the class "backward" or "forward"."""
    g = to_networkx(graph)
    node_of = {op: f"op{i}" for i, op in enumerate(graph.ops)}      # to_networkx's node names
    op_at = {node: op for op, node in node_of.items()}
    out = [f"digraph {_quote(graph.name)} {{",
           '  node [fontname="monospace", fontsize=10];',
           '  edge [fontname="monospace", fontsize=9];']
    legend = _legend(bool(kernels), bool(backward))
    if legend:
        out.append(f"  labelloc=b; fontname=\"sans-serif\"; label={_quote(legend)};")

    def node_line(node: str, indent: str = "  ") -> str:
        data = g.nodes[node]
        if data["kind"] != "op":
            style = TERMINAL_STYLE
        else:
            style = BACKWARD_STYLE if op_at[node] in backward else FORWARD_STYLE
        return f'{indent}{_quote(node)} [shape={_SHAPES[data["kind"]]}, label="{_label(data)}", {style}];'

    drawn: set[str] = set()
    for k, (name, ops) in enumerate((kernels or {}).items()):
        missing = [op for op in ops if op not in node_of]
        if missing:
            raise IRError(f"to_dot: kernel {name} lists ops that are not in graph @{graph.name}: {missing}")
        members = [node_of[op] for op in ops if node_of[op] not in drawn]
        drawn.update(members)
        out.append(f"  subgraph {_quote(f'cluster_{k}')} {{")
        out.append(f'    label={_quote(name)}; style="rounded"; color="#555555"; fontname="monospace";')
        out += [node_line(node, "    ") for node in members]
        out.append("  }")
    out += [node_line(node) for node in g.nodes if node not in drawn]
    for a, b, data in g.edges(data=True):
        out.append(f"  {_quote(a)} -> {_quote(b)} [label={_quote(data['label'])}];")
    out.append("}")
    return "\n".join(out)


def _legend(kernels: bool, backward: bool) -> str:
    parts = (["blue boxes: forward ops", "dashed orange boxes: backward ops (from derivatives.yaml)"]
             if backward else [])
    parts += ["rounded frames: fused kernels"] if kernels else []
    return "; ".join(parts)
