"""Graph pictures from `tracecomp dump --format dot|svg`, run as subprocesses: one node per
op with its types, one cluster per fused kernel of the optimized stage, backward ops set
apart from forward ones (class "backward" in the SVG, dashed orange in the DOT text)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import textwrap
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import tracecomp as tc

from test_cli import cli

MODEL = textwrap.dedent('''
    import tracecomp as tc

    def loss(w1, b1, w2, b2, x, y):
        h = tc.relu(x @ w1 + b1)
        return tc.cross_entropy(h @ w2 + b2, y)
''')
SHAPES = [(6, 5), (5,), (5, 3), (3,), (4, 6)]
INPUTS = [a for s in SHAPES for a in ("--input", f"f32[{','.join(map(str, s))}]")] + ["--input", "i64[4]"]
GRAD = ["--grad", "0,1,2,3"]
SVG = "{http://www.w3.org/2000/svg}"
needs_graphviz = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "mlp.py").write_text(MODEL)
    return tmp_path


def dump(workdir, stage: str, fmt: str, out: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(cli() + ["dump", "mlp.py:loss", *INPUTS, *GRAD, "--stage", stage, "--format", fmt,
                                   "-o", out], cwd=workdir, capture_output=True, text=True, env=env, timeout=300)


def lowered_in_process(workdir):
    """The same function and input types, lowered here: what the pictures must show."""
    namespace: dict = {}
    exec(compile(MODEL, str(workdir / "mlp.py"), "exec"), namespace)
    args = [np.zeros(s, np.float32) for s in SHAPES] + [np.zeros(4, np.int64)]
    return tc.trace(tc.value_and_grad(namespace["loss"], argnums=(0, 1, 2, 3))).lower(*args)


# ------------------------------------------------------------ a small DOT reader

STATEMENT = re.compile(r'^\s*"(?P<id>[^"]+)" \[(?P<attrs>.*)\];$')
ATTR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^,\s]+)')


def read_dot(text: str) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """Nodes (id -> attributes) and clusters (id -> member node ids) of to_dot's output."""
    nodes, clusters, current = {}, {}, None
    for line in text.splitlines():
        if m := re.match(r'^\s*subgraph "(cluster_[^"]+)" \{$', line):
            current = clusters.setdefault(m.group(1), [])
        elif line.strip() == "}":
            current = None
        elif m := STATEMENT.match(line):
            nodes[m.group("id")] = {k: v.strip('"') for k, v in ATTR.findall(m.group("attrs"))}
            if current is not None:
                current.append(m.group("id"))
    return nodes, clusters


def ancestors(graph, values) -> set:
    seen, stack = set(), [v.op for v in values if v.op is not None]
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack.extend(v.op for v in op.operands if v.op is not None)
    return seen


# ------------------------------------------------------------ tests

def test_optimized_dot_has_a_cluster_per_kernel_and_marks_backward_ops(workdir):
    proc = dump(workdir, "optimized", "dot", "opt.dot")
    assert proc.returncode == 0, proc.stderr
    nodes, clusters = read_dot((workdir / "opt.dot").read_text())
    lowered = lowered_in_process(workdir)
    graph, program = lowered.optimized, lowered.program
    ops = {n: a for n, a in nodes.items() if n.startswith("op")}
    assert len(ops) == len(graph.ops)
    for i, op in enumerate(graph.ops):            # every op with its name and result types
        assert op.name in ops[f"op{i}"]["label"]
        assert all(str(r.type) in ops[f"op{i}"]["label"] for r in op.results)
    assert len(clusters) == len(program.kernels)
    labels = [re.search(r'label="([^"]+)"', block).group(1)
              for block in re.findall(r'subgraph "cluster_\d+" \{\n(.*)', (workdir / "opt.dot").read_text())]
    number = re.compile(r"k\d+_")        # names also hold the caller's file:line, which differs here
    assert [number.match(n).group() for n in labels] == [number.match(k.name).group() for k in program.kernels]
    for (cluster, members), kernel in zip(clusters.items(), program.kernels):
        assert members, f"{cluster} ({kernel.name}) is empty"
        assert {graph.ops[int(m[2:])] for m in members} <= set(program.kernel_ops[kernel.name])
    # the forward pass (everything the loss depends on) is forward; the ops the loss does not
    # need are the backward pass (constants aside: folded seeds may come from either side)
    forward = ancestors(graph, graph.outputs[:1])
    for i, op in enumerate(graph.ops):
        expected = "forward" if op in forward else "backward"
        if op.name != "tc.constant":
            assert ops[f"op{i}"]["class"] == expected, (i, op)
    backward = [n for n, a in ops.items() if a["class"] == "backward"]
    assert backward and all(ops[n]["style"] == "filled,dashed" for n in backward)
    assert all(a["style"] == "filled" for a in ops.values() if a["class"] == "forward")


def test_graph_stage_marks_exactly_the_ops_autograd_recorded(workdir):
    proc = dump(workdir, "graph", "dot", "graph.dot")
    assert proc.returncode == 0, proc.stderr
    nodes, clusters = read_dot((workdir / "graph.dot").read_text())
    lowered = lowered_in_process(workdir)
    marked = {int(n[2:]) for n, a in nodes.items() if n.startswith("op") and a["class"] == "backward"}
    assert marked == {i for i, op in enumerate(lowered.graph.ops) if op in lowered.backward_ops}
    assert marked and not clusters               # the traced graph is not scheduled


def test_backward_stage_is_all_backward(workdir):
    assert dump(workdir, "backward", "dot", "bwd.dot").returncode == 0
    nodes, _ = read_dot((workdir / "bwd.dot").read_text())
    classes = {a["class"] for n, a in nodes.items() if n.startswith("op")}
    assert classes == {"backward"}


@needs_graphviz
def test_optimized_svg_is_valid_xml_with_a_node_per_op_and_kernel_clusters(workdir):
    proc = dump(workdir, "optimized", "svg", "opt.svg")
    assert proc.returncode == 0, proc.stderr
    root = ET.parse(workdir / "opt.svg").getroot()
    lowered = lowered_in_process(workdir)
    groups = [(g.get("class"), g.find(SVG + "title").text) for g in root.iter(SVG + "g") if g.get("class")]
    op_nodes = {title: cls for cls, title in groups if cls.startswith("node") and title.startswith("op")}
    assert sorted(op_nodes) == sorted(f"op{i}" for i in range(len(lowered.optimized.ops)))
    assert set(op_nodes.values()) == {"node forward", "node backward"}
    assert sum(cls == "cluster" for cls, _ in groups) == len(lowered.program.kernels)


def test_dot_file_parses(workdir):
    """Graphviz (or networkx, when pydot or pygraphviz is there) reads the DOT text back."""
    assert dump(workdir, "optimized", "dot", "opt.dot").returncode == 0
    lowered = lowered_in_process(workdir)
    n_nodes = len(lowered.optimized.inputs) + len(lowered.optimized.ops) + len(lowered.optimized.outputs)
    parsed = False
    if shutil.which("dot"):
        layout = json.loads(subprocess.run(["dot", "-Tjson", "opt.dot"], cwd=workdir, capture_output=True,
                                           text=True, check=True).stdout)
        assert layout["_subgraph_cnt"] == len(lowered.program.kernels)
        objects = layout["objects"]
        assert sum(o["name"].startswith("cluster_") for o in objects) == len(lowered.program.kernels)
        assert sum(not o["name"].startswith("cluster_") for o in objects) == n_nodes
        parsed = True
    import networkx
    for reader in (networkx.nx_agraph.read_dot, networkx.nx_pydot.read_dot):
        try:
            g = reader(workdir / "opt.dot")
        except ImportError:
            continue
        assert sum(not str(n).startswith("cluster_") for n in g.nodes) == n_nodes
        parsed = True
    if not parsed:
        pytest.skip("neither Graphviz's dot nor pydot/pygraphviz is installed to parse DOT")


def test_dot_works_without_graphviz_and_svg_says_how_to_install_it(workdir, tmp_path):
    bare = tmp_path / "bin"                      # a PATH with Python but no Graphviz
    bare.mkdir()
    env = dict(os.environ, PATH=str(bare))
    proc = dump(workdir, "optimized", "svg", "x.svg", env=env)
    assert proc.returncode == 2 and "apt-get install graphviz" in proc.stderr and not (workdir / "x.svg").exists()
    proc = dump(workdir, "optimized", "dot", "x.dot", env=env)
    assert proc.returncode == 0 and (workdir / "x.dot").read_text().startswith("digraph")


def test_to_dot_refuses_a_kernel_listing_ops_of_another_graph(workdir):
    from tracecomp.core.errors import IRError
    from tracecomp.ir.nx import to_dot
    lowered = lowered_in_process(workdir)
    with pytest.raises(IRError, match="kernel k_bad lists ops that are not in graph"):
        to_dot(lowered.optimized, kernels={"k_bad": lowered.graph.ops[:1]})
