"""The text form of ops with regions (tc.scan, tc.while_loop, tc.cond): golden text, round
trips, unique names, mlir-opt, and located parse errors."""
from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from region_graphs import GRAPHS, T, rnn_scan
from test_ir_text import attr_values, identifiers, locations, tensor_types
from tracecomp.core.errors import IRError
from tracecomp.ir import Graph
from tracecomp.ir.mlir_tool import check_with_mlir_opt, find_mlir_opt
from tracecomp.ir.parser import MAX_NESTING, parse_graph
from tracecomp.ir.printer import block_label, print_graph, value_names
from tracecomp.ir.regions import walk_graphs

needs_mlir_opt = pytest.mark.skipif(find_mlir_opt() is None, reason="mlir-opt not found")

RNN = """\
func.func @rnn(%arg0: tensor<3x3xf32>, %arg1: tensor<3xf32>, %arg2: tensor<2x3xf32>, %arg3: tensor<5x2x3xf32>) -> (tensor<2x3xf32>, tensor<5x2x3xf32>) {
  %0:2 = "tc.scan"(%arg0, %arg1, %arg2, %arg3) ({
  ^body(%b0: tensor<3x3xf32>, %b1: tensor<3xf32>, %b2: tensor<2x3xf32>, %b3: tensor<2x3xf32>):
    %1 = "tc.matmul"(%b2, %b0) : (tensor<2x3xf32>, tensor<3x3xf32>) -> tensor<2x3xf32>
    %2 = "tc.add"(%1, %b3) {alpha = 1 : i64} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
    %3 = "tc.add"(%2, %b1) {alpha = 1 : i64} : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32>
    %4 = "tc.tanh"(%3) : (tensor<2x3xf32>) -> tensor<2x3xf32> loc("rnn.py":7:9)
    "tc.yield"(%4, %4) : (tensor<2x3xf32>, tensor<2x3xf32>) -> ()
  }) {length = 5 : i64, num_consts = 2 : i64, num_carry = 1 : i64, reverse = false, remat = false} : (tensor<3x3xf32>, tensor<3xf32>, tensor<2x3xf32>, tensor<5x2x3xf32>) -> (tensor<2x3xf32>, tensor<5x2x3xf32>) loc("rnn.py":5:1)
  return %0#0, %0#1 : tensor<2x3xf32>, tensor<5x2x3xf32>
}"""


def test_golden_text_of_a_scan():
    assert print_graph(rnn_scan()) == RNN
    assert parse_graph(RNN) == rnn_scan()


@pytest.mark.parametrize("make", GRAPHS, ids=lambda f: f.__name__)
def test_round_trip(make):
    g = make()
    text = print_graph(g)
    back = parse_graph(text)
    assert back == g
    assert print_graph(back) == text
    assert [r.name for op in back.ops for r in op.regions] == [r.name for op in g.ops for r in op.regions]


def test_round_trip_notices_a_changed_region():
    g, text = rnn_scan(), RNN.replace('"tc.tanh"', '"tc.sigmoid"')
    assert parse_graph(text) != g
    assert parse_graph(RNN.replace("^body", "^loop")) != g      # the region's name counts


@pytest.mark.parametrize("make", GRAPHS, ids=lambda f: f.__name__)
def test_value_names_are_unique_in_the_whole_function(make):
    g = make()
    names = value_names(g)
    values = [v for r in walk_graphs(g) for v in r.inputs + [x for op in r.ops for x in op.results]]
    assert len({names[v] for v in values}) == len(values)
    defined = re.findall(r"(%\w+)(?::\d+)? = |(%\w+): tensor", print_graph(g))
    defined = [a or b for a, b in defined]
    assert len(defined) == len(set(defined))


@needs_mlir_opt
@pytest.mark.parametrize("make", GRAPHS, ids=lambda f: f.__name__)
def test_mlir_opt_accepts(make):
    check_with_mlir_opt(print_graph(make()))


@pytest.mark.parametrize("name", ["body", "", "0", "007", "0a", "a b", "é€", "$", "$24", "x.y-z_", "\n"])
def test_region_names_round_trip_as_block_labels(name):
    g = Graph("f", [T(2)])
    inner = Graph(name, [T(2)])
    inner.outputs = list(inner.inputs)
    g.add_op("tc.thing", [g.inputs[0]], {}, [], regions=[Graph(name), inner])
    text = print_graph(g)
    assert re.fullmatch(r"[a-zA-Z_.$-][\w.$-]*|\d+", block_label(name))     # an MLIR suffix-id
    assert parse_graph(text) == g
    if find_mlir_opt():
        check_with_mlir_opt(text)


def test_parser_reads_unlabelled_regions_and_foreign_labels():
    text = """func.func @f(%x: tensor<2xf32>) -> () {
      "tc.thing"(%x) ({
        "tc.yield"() : () -> ()
      }, {
      ^bb7(%y: tensor<2xf32>):
        %z = "tc.neg"(%y) : (tensor<2xf32>) -> tensor<2xf32>
        "tc.yield"(%z) : (tensor<2xf32>) -> () loc("f.py":1:1)
      }) {k = 1 : i64} : (tensor<2xf32>) -> ()
      return
    }"""
    g = parse_graph(text)
    first, second = g.ops[0].regions
    assert (first.name, first.inputs, first.ops, first.outputs) == ("bb0", [], [], [])
    assert second.name == "bb7" and second.outputs == [second.ops[0].result]
    assert second.ops[0].operands == second.inputs and g.ops[0].attrs == {"k": 1}


def test_a_region_may_name_an_outer_value_in_the_text():
    """Isolation is the verifier's to check: the parser reads such a graph as it stands."""
    text = RNN.replace('"tc.matmul"(%b2, %b0)', '"tc.matmul"(%b2, %arg0)')
    g = parse_graph(text)
    assert g.ops[0].regions[0].ops[0].operands[1] is g.inputs[0]
    assert print_graph(g) == text


# -- random graphs with regions ----------------------------------------------------------

@st.composite
def region_graphs(draw, depth=0, name=None):
    """A random graph whose ops may hold regions, themselves random graphs (isolated: they
    use only their own inputs and ops), to depth 2."""
    names = st.text(min_size=1, max_size=6)
    g = Graph(name if name is not None else draw(names | identifiers),
              draw(st.lists(tensor_types, max_size=3)))
    values = list(g.inputs)
    for _ in range(draw(st.integers(0, 4))):
        operands = draw(st.lists(st.sampled_from(values), max_size=3)) if values else []
        attrs = draw(st.dictionaries(names | identifiers, attr_values, max_size=2))
        regions = []
        if depth < 2:
            regions = draw(st.lists(region_graphs(depth + 1, draw(st.text(max_size=4))), max_size=2))
        op_name = "tc." + draw(identifiers.filter(lambda n: n != "yield"))
        op = g.add_op(op_name, operands, attrs, draw(st.lists(tensor_types, max_size=3)),
                      draw(st.none() | locations), regions)
        values += op.results
    g.outputs = draw(st.lists(st.sampled_from(values), max_size=3)) if values else []
    return g


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(region_graphs())
def test_random_graphs_with_regions_round_trip(g):
    text = print_graph(g)
    assert parse_graph(text) == g
    assert print_graph(parse_graph(text)) == text


@needs_mlir_opt
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(region_graphs())
def test_mlir_opt_accepts_random_graphs_with_regions(g):
    check_with_mlir_opt(print_graph(g))


# -- malformed text ----------------------------------------------------------------------

HEAD = "func.func @f(%arg0: tensor<4xf32>) -> (tensor<4xf32>) {\n"
OPEN = '  %0 = "tc.cond"(%p, %arg0) ({\n  ^then(%b0: tensor<4xf32>):\n'
CLOSE = '  }) : (tensor<i1>, tensor<4xf32>) -> tensor<4xf32>\n  return %0 : tensor<4xf32>\n}'
YIELD = '    "tc.yield"(%b0) : (tensor<4xf32>) -> ()\n'
NEG = '    %1 = "tc.neg"(%b0) : (tensor<4xf32>) -> tensor<4xf32>\n'
PRED = '  %p = "tc.constant"() {value = dense<true> : tensor<i1>} : () -> tensor<i1>\n'
TOP = HEAD + PRED + OPEN

MALFORMED = [
    (TOP + NEG + CLOSE, 6, "})", "the region ends without its terminator"),
    (TOP + YIELD + NEG + CLOSE, 6, "%1", "expected '}' after '\"tc.yield\"' to close the region, found '%1'"),
    (TOP + NEG + "  ^bb1:\n" + YIELD + CLOSE, 6, "^bb1", "a region holds one block"),
    (TOP + '    "tc.yield"(%1) : (tensor<4xf32>) -> ()\n' + CLOSE, 5, "%1", "use of undefined value '%1'"),
    (TOP + '    %arg0 = "tc.neg"(%b0) : (tensor<4xf32>) -> tensor<4xf32>\n' + YIELD + CLOSE, 5, "%arg0 =",
     "redefinition of value '%arg0' (first defined at line 1, column 14)"),
    (TOP + '    %p = "tc.neg"(%b0) : (tensor<4xf32>) -> tensor<4xf32>\n' + YIELD + CLOSE, 5, "%p",
     "redefinition of value '%p' (first defined at line 2, column 3)"),
    (TOP + '    "tc.yield"(%b0) : (tensor<4xf32>) -> (tensor<4xf32>)\n' + CLOSE, 5, '-> (',
     'op "tc.yield" defines 0 result values but its type has 1 result types'),
    (TOP + '    "tc.yield"(%b0) : (tensor<4xf64>) -> ()\n' + CLOSE, 5, "tensor<4xf64>",
     "operand 0 has type tensor<4xf32> but the type list says tensor<4xf64>"),
    (TOP + '    "tc.yield"(%b0) {a = 1 : i64} : (tensor<4xf32>) -> ()\n' + CLOSE, 5, "{a",
     "expected ':' after the operands of '\"tc.yield\"' (it takes no attributes)"),
    (TOP + YIELD + CLOSE.replace("  })", "  ) "), 6, ")", "expected '}' after '\"tc.yield\"'"),
    (TOP + YIELD + CLOSE.replace("  })", "  }"), 6, ":", "expected ')' after the regions, found ':'"),
    (HEAD + PRED + OPEN.replace("(%b0: tensor<4xf32>):", "(%b0: tensor<4xf32>)") + YIELD + CLOSE,
     5, '"tc.yield"', "expected ':' after the block label"),
    (HEAD + PRED + OPEN.replace("^then", "^") + YIELD + CLOSE, 4, "^", "expected a block name after '^'"),
    # an op's own results are not defined inside its regions
    (TOP.replace("%0 = ", "%r = ") + '    "tc.yield"(%r) : (tensor<4xf32>) -> ()\n' + CLOSE.replace("return %0", "return %r"),
     5, "%r", "use of undefined value '%r'"),
    # a region's names end with it
    (TOP + NEG + YIELD + '  }) : (tensor<i1>, tensor<4xf32>) -> tensor<4xf32>\n  return %1 : tensor<4xf32>\n}',
     8, "%1", "use of undefined value '%1'"),
    (TOP + YIELD + CLOSE.replace("  })", "  }) {x = 1 : i64} {y"), 6, "{y", "expected ':' after attributes"),
]


@pytest.mark.parametrize("text, line, marker, message", MALFORMED, ids=[m[3][:40] for m in MALFORMED])
def test_malformed_regions_are_located(text, line, marker, message):
    with pytest.raises(IRError) as info:
        parse_graph(text, filename="bad.mlir")
    source = text.splitlines()[line - 1]
    col = source.index(marker) + 1
    assert f"bad.mlir: line {line}, column {col}: " in str(info.value)
    assert message in str(info.value)


def nested_text(depth: int) -> str:
    op = ""
    for _ in range(depth):
        op = '"tc.r"() ({\n' + op + '"tc.yield"() : () -> ()\n}) : () -> ()\n'
    return "func.func @f() -> () {\n" + op + "return\n}"


def test_regions_nested_too_deep_are_refused():
    with pytest.raises(IRError, match=f"regions nested deeper than {MAX_NESTING}"):
        parse_graph(nested_text(MAX_NESTING + 1))
    assert len(list(walk_graphs(parse_graph(nested_text(MAX_NESTING))))) == MAX_NESTING + 1
