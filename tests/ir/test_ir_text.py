"""The IR text form: print/parse round trips, golden text, located errors, mlir-opt."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from tracecomp.core.dtypes import DType
from tracecomp.core.errors import IRError
from tracecomp.ir import Graph, Location, TensorType
from tracecomp.ir.mlir_tool import check_with_mlir_opt, find_mlir_opt
from tracecomp.ir.parser import parse_graph
from tracecomp.ir.printer import format_attr, format_location, print_graph

F32, F64, I1, I32, I64 = (DType.float32, DType.float64, DType.bool, DType.int32, DType.int64)
needs_mlir_opt = pytest.mark.skipif(
    find_mlir_opt() is None,
    reason="mlir-opt not found (neither /usr/lib/llvm-22/bin/mlir-opt nor mlir-opt on PATH)")


def T(*shape_and_dtype) -> TensorType:
    *shape, dtype = shape_and_dtype
    return TensorType(tuple(shape), dtype)


# -- hand-built graphs -------------------------------------------------------------------

def graph_brief_example() -> Graph:
    g = Graph("main", [T(4, 8, F32), T(8, F32)])
    a, b = g.inputs
    add = g.add_op("tc.add", [a, b], {"alpha": 1}, [T(4, 8, F32)], Location("model.py", 12))
    mx = g.add_op("tc.max.dim", [add.result], {"dim": 1, "keepdim": False},
                  [T(4, F32), T(4, I64)], Location("model.py", 13))
    zeros = g.add_op("tc.zeros", [], {"size": (2, 3), "dtype": F32}, [T(2, 3, F32)])
    g.add_op("tc.mul", [zeros.result], {"other": 2.5}, [T(2, 3, F32)], Location("model.py", 14))
    g.outputs = [add.result, mx.results[0]]
    return g


def graph_every_attr_kind() -> Graph:
    g = Graph("attrs", [T(3, F64)])
    g.add_op("tc.kinds", [g.inputs[0]], {
        "t": True, "f": False, "i": -7, "big": 2**63 - 1, "small": -2**63,
        "x": 2.5, "tiny": 1e-05, "huge": 1e300, "neg0": -0.0, "inf": math.inf,
        "ninf": -math.inf, "nan": math.nan, "s": 'quote " back \\ nl \n tab \t nul \0 é €',
        "empty": "", "dims": (1, -2, 3), "none": (), "dt": F64, "b": I1,
        "weird key!": 1, "dtype": I32,
    }, [T(3, F64)])
    g.outputs = [g.ops[0].result]
    return g


def graph_constants() -> Graph:
    g = Graph("consts")
    arrays = {
        "f32": np.array([[1.5, -2.0], [0.1, 3e-8]], np.float32),
        "f64": np.array([0.1, 1e300, -0.0], np.float64),
        "i32": np.array([1, -2, 2**31 - 1], np.int32),
        "i64": np.array([[-2**63], [2**63 - 1]], np.int64),
        "bool": np.array([True, False, True]),
        "bool_big": np.arange(40).reshape(5, 8) % 3 == 0,
        "scalar": np.array(1.5, np.float32),
        "scalar_int": np.array(7, np.int64),
        "scalar_inf": np.array(np.inf, np.float64),
        "large": np.arange(100, dtype=np.float32).reshape(10, 10) / 7,
        "large_int": np.arange(-20, 20, dtype=np.int32),
        "nonfinite": np.array([np.nan, np.inf, -np.inf, 1.0], np.float32),
        "empty": np.zeros((0, 3), np.float32),
    }
    for name, array in arrays.items():
        dtype = {np.dtype(d.np): d for d in DType}[array.dtype]
        g.add_op("tc.constant", [], {"value": array}, [T(*array.shape, dtype)])
    g.outputs = [op.result for op in g.ops]
    return g


def graph_shapes_and_results() -> Graph:
    g = Graph("shapes", [T(F32), T(0, 5, I1), T(1, 1, 1, 1, I32)])
    scalar, empty, ones = g.inputs
    none = g.add_op("tc.noresult", [scalar], {}, [])
    g.add_op("tc.noresult.noloc", [], {}, [], Location("a b/\"c\".py", 7, 3))
    three = g.add_op("tc.split", [ones, ones], {}, [T(1, I32), T(F64), T(0, I1)],
                     Location("s.py", 1, 2))
    g.add_op("tc.use", [three.results[2], empty, three.results[0]], {"k": 1}, [T(2, F32)])
    g.outputs = [three.results[1], scalar, scalar]
    assert none.results == []
    return g


def graph_no_outputs() -> Graph:
    g = Graph("weird name-1")
    g.add_op("tc.effect", [], {}, [])
    return g


GRAPHS = [graph_brief_example, graph_every_attr_kind, graph_constants,
          graph_shapes_and_results, graph_no_outputs, lambda: Graph("empty")]


@pytest.mark.parametrize("make", GRAPHS, ids=lambda f: f.__name__)
def test_round_trip(make):
    g = make()
    text = print_graph(g)
    assert parse_graph(text) == g
    assert print_graph(parse_graph(text)) == text


@needs_mlir_opt
@pytest.mark.parametrize("make", GRAPHS, ids=lambda f: f.__name__)
def test_mlir_opt_accepts(make):
    check_with_mlir_opt(print_graph(make()))


# -- golden text -----------------------------------------------------------------------

CANONICAL = """\
func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4xf32>) {
  %0 = "tc.add"(%arg0, %arg1) {alpha = 1 : i64} : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32> loc("model.py":12:0)
  %1:2 = "tc.max.dim"(%0) {dim = 1 : i64, keepdim = false} : (tensor<4x8xf32>) -> (tensor<4xf32>, tensor<4xi64>) loc("model.py":13:0)
  %2 = "tc.zeros"() {size = array<i64: 2, 3>, dtype = f32} : () -> tensor<2x3xf32>
  %3 = "tc.mul"(%2) {other = 2.5 : f64} : (tensor<2x3xf32>) -> tensor<2x3xf32> loc("model.py":14:0)
  return %0, %1#0 : tensor<4x8xf32>, tensor<4xf32>
}"""


def test_canonical_text_is_a_fixed_point():
    assert print_graph(parse_graph(CANONICAL)) == CANONICAL


def test_printer_matches_golden_text():
    assert print_graph(graph_brief_example()) == CANONICAL
    assert str(graph_brief_example()) == CANONICAL


def test_zero_result_op_and_empty_function():
    g = Graph("f", [T(F32)])
    g.add_op("tc.print", [g.inputs[0]], {}, [])
    assert print_graph(g) == ('func.func @f(%arg0: tensor<f32>) -> () {\n'
                              '  "tc.print"(%arg0) : (tensor<f32>) -> ()\n'
                              '  return\n}')


def test_parser_accepts_other_names_and_module_wrapper():
    text = """module {
      // a comment
      func.func @main(%x: tensor<2xf32>) -> tensor<f32> {
        %y = "tc.neg"(%x) : (tensor<2xf32>) -> tensor<2xf32> loc(unknown)
        %a, %b:2 = "tc.three"(%y) {x = 1.0e+00} : (tensor<2xf32>) -> (tensor<2xf32>, tensor<f32>, tensor<f32>)
        return %b#1 : tensor<f32>
      }
    }"""
    g = parse_graph(text)
    assert [op.name for op in g.ops] == ["tc.neg", "tc.three"]
    assert g.ops[0].loc is None and g.ops[1].attrs == {"x": 1.0}
    assert g.outputs == [g.ops[1].results[2]]
    assert g.ops[1].operands == [g.ops[0].result]


@pytest.mark.parametrize("value, text", [
    (True, "true"), (False, "false"), (3, "3 : i64"), (-3, "-3 : i64"),
    (2.5, "2.5 : f64"), (1e-05, "1.0e-05 : f64"), (1e16, "1.0e+16 : f64"), (3.0, "3.0 : f64"),
    (math.inf, "0x7FF0000000000000 : f64"), (-math.inf, "0xFFF0000000000000 : f64"),
    (math.nan, "0x7FF8000000000000 : f64"),
    ('a"b\\c\n\x7f', '"a\\"b\\\\c\\0A\\7F"'), ("é", '"\\C3\\A9"'),
    ((1, 2), "array<i64: 1, 2>"), ((), "array<i64>"), (F32, "f32"), (I1, "i1"),
    (np.array(1.5, np.float32), "dense<1.5> : tensor<f32>"),
    (np.array([[1, 2]], np.int32), "dense<[[1, 2]]> : tensor<1x2xi32>"),
    (np.array([1.0, 2.0]), "dense<[1.0, 2.0]> : tensor<2xf64>"),
    (np.array([0.1], np.float32), "dense<[0.1]> : tensor<1xf32>"),
    (np.array([True, False]), "dense<[true, false]> : tensor<2xi1>"),
    (np.array([np.inf], np.float32), 'dense<"0x0000807F"> : tensor<1xf32>'),
    (np.ones(17, np.int32), 'dense<"0x' + "01000000" * 17 + '"> : tensor<17xi32>'),
    (np.zeros((2, 0), np.int64), "dense<> : tensor<2x0xi64>"),
])
def test_format_attr(value, text):
    assert format_attr(value) == text


@pytest.mark.parametrize("value", [None, [1, 2], (1, 2.0), (True,), 2**63, {"a": 1},
                                   np.zeros(2, np.complex64), np.zeros(2, np.uint8)])
def test_format_attr_rejects(value):
    with pytest.raises(IRError):
        format_attr(value)


def test_location_text_plain_and_with_an_origin():
    loc = Location('dir/my "file".py', 12, 4)
    assert format_location(loc) == 'loc("dir/my \\"file\\".py":12:4)'
    assert format_location(None) == "loc(unknown)"
    assert (format_location(Location("m.py", 3, 0, "backward", "tc.tanh"))
            == 'loc("backward:tc.tanh"("m.py":3:0))')
    assert format_location(Location("m.py", 3, 0, "forward", "tc.softmax")) == 'loc("forward:tc.softmax"("m.py":3:0))'
    assert format_location(Location("m.py", 3, 0, "backward")) == 'loc("backward"("m.py":3:0))'


ORIGINS = [Location("m.py", 3, 0), Location("m.py", 3, 0, "backward", "tc.tanh"),
           Location("m.py", 3, 0, "forward", "tc.softmax"), Location("m.py", 3, 0, "backward")]


@pytest.mark.parametrize("loc", ORIGINS, ids=str)
def test_origins_round_trip_and_mlir_opt_accepts_them(loc):
    g = Graph("f", [TensorType((4,), F32)])
    g.outputs = g.add_op("tc.tanh", [g.inputs[0]], {}, [TensorType((4,), F32)], loc).results
    text = print_graph(g)
    back = parse_graph(text)
    assert back.ops[0].loc == loc and print_graph(back) == text
    if find_mlir_opt():
        check_with_mlir_opt(text)


@pytest.mark.parametrize("label, message", [("sideways", "'forward' or 'backward'"),
                                            ("backward:", "'forward' or 'backward'")])
def test_malformed_origin_is_an_ir_error(label, message):
    text = ('func.func @f(%arg0: tensor<4xf32>) -> (tensor<4xf32>) {\n'
            f'  %0 = "tc.tanh"(%arg0) : (tensor<4xf32>) -> tensor<4xf32> loc("{label}"("m.py":3:0))\n'
            '  return %0 : tensor<4xf32>\n}\n')
    with pytest.raises(IRError, match=message) as e:
        parse_graph(text)
    assert "line 2, column 64" in str(e.value)    # where the origin's name is


def test_parsed_attr_types():
    g = parse_graph(print_graph(graph_every_attr_kind()))
    attrs = g.ops[0].attrs
    assert type(attrs["i"]) is int and type(attrs["x"]) is float and type(attrs["t"]) is bool
    assert math.isnan(attrs["nan"]) and math.copysign(1, attrs["neg0"]) == -1
    assert attrs["dims"] == (1, -2, 3) and attrs["dt"] is F64


def test_undefined_value_prints_and_is_rejected_by_parser():
    g = Graph("f", [T(F32)])
    stray = Graph("other", [T(F32)]).inputs[0]
    g.add_op("tc.neg", [stray], {}, [T(F32)])
    with pytest.raises(IRError, match="use of undefined value '%undef0'"):
        parse_graph(print_graph(g))


# -- malformed text ----------------------------------------------------------------------

HEAD = "func.func @f(%arg0: tensor<4xf32>) -> (tensor<4xf32>) {\n"
NEG = '  %0 = "tc.neg"(%arg0) : (tensor<4xf32>) -> tensor<4xf32>\n'
TAIL = "  return %0 : tensor<4xf32>\n}"

# (text, line, marker: the error's column is where marker starts on that line, message part)
MALFORMED = [
    ("", 1, "", "expected 'func.func' to start the function, found end of input"),
    (HEAD + '  %0 = "tc.neg"(%arg0) -> tensor<4xf32>\n' + TAIL, 2, "->",
     "expected ':' after operand list, found '->'"),
    (HEAD + '  %0 = "tc.neg"(%arg0) {a = 1} {b = 2} : () -> ()\n' + TAIL, 2, "{b",
     "expected ':' after attributes, found '{'"),
    (HEAD + '  %0 = "tc.neg"(%7) : (tensor<4xf32>) -> tensor<4xf32>\n' + TAIL, 2, "%7",
     "use of undefined value '%7'"),
    (HEAD + NEG + NEG + TAIL, 3, "%0", "redefinition of value '%0' (first defined at line 2, column 3)"),
    (HEAD.replace("%arg0: tensor<4xf32>)", "%a: tensor<4xf32>, %a: tensor<4xf32>)") + NEG + TAIL,
     1, "%a: tensor<4xf32>)", "redefinition of value '%a'"),
    (HEAD + NEG.replace("%0 =", "%0:2 =") + TAIL, 2, "%0", "defines 2 result values but its type has 1"),
    (HEAD + '  %0 = "tc.neg"(%arg0) : (tensor<4xf32>) -> ()\n' + TAIL, 2, "%0",
     "defines 1 result values but its type has 0"),
    (HEAD + '  %0 = "tc.neg"(%arg0, %arg0) : (tensor<4xf32>) -> tensor<4xf32>\n' + TAIL, 2,
     '"tc.neg"', 'op "tc.neg" has 2 operands but 1 operand types'),
    (HEAD + '  %0 = "tc.neg"(%arg0) : (tensor<8xf32>) -> tensor<4xf32>\n' + TAIL, 2,
     "tensor<8", "operand 0 has type tensor<4xf32> but the type list says tensor<8xf32>"),
    (HEAD.replace("tensor<4xf32>)", "tensor<4xf80>)", 1) + NEG + TAIL, 1, "f80",
     "unknown element type 'f80'"),
    (HEAD.replace("tensor<4xf32>)", "tensor<?x4xf32>)", 1) + NEG + TAIL, 1, "?",
     "dynamic dimensions are not supported"),
    (HEAD.replace("tensor<4xf32>)", "tensor<*xf32>)", 1) + NEG + TAIL, 1, "*",
     "unranked tensors are not supported"),
    (HEAD.replace("tensor<4xf32>)", "i32)", 1) + NEG + TAIL, 1, "i32",
     "expected a tensor type like 'tensor<4xf32>' here, found 'i32'"),
    (HEAD + NEG + '  "tc.p"(%0) {s = "abc} : (tensor<4xf32>) -> ()\n' + TAIL, 3, '"abc',
     "unterminated string"),
    (HEAD + NEG + '  "tc.p"(%0) {s = "a\\q"} : (tensor<4xf32>) -> ()\n' + TAIL, 3, "\\q",
     "expected an escape"),
    (HEAD + NEG + '  "tc.p"(%0) {s = @x} : (tensor<4xf32>) -> ()\n' + TAIL, 3, "@x",
     "expected an attribute value, found '@x'"),
    (HEAD + NEG + '  "tc.p"(%0) {s = 1, s = 2} : (tensor<4xf32>) -> ()\n' + TAIL, 3, "s = 2",
     "duplicate attribute 's'"),
    (HEAD + NEG + '  "tc.p"(%0) {s = 9223372036854775808 : i64} : (tensor<4xf32>) -> ()\n' + TAIL,
     3, "9223", "does not fit in i64"),
    (HEAD + NEG + '  "tc.p"(%0) {s = 1 : i32} : (tensor<4xf32>) -> ()\n' + TAIL, 3, "i32",
     "expected 'i64' after an integer or 'f64' after a float, found 'i32'"),
    (HEAD + NEG + '  "tc.p"(%0) {c = dense<[1.0, 2.0]> : tensor<3xf32>} : () -> ()\n' + TAIL, 3,
     "dense", "dense literal has shape (2,) but the type is tensor<3xf32>"),
    (HEAD + NEG + '  "tc.p"(%0) {c = dense<[1, 2]> : tensor<2xf32>} : () -> ()\n' + TAIL, 3,
     "dense", "must be floats with a '.', found 1"),
    (HEAD + NEG + '  "tc.p"(%0) {c = dense<[[1], [2, 3]]> : tensor<2x2xi32>} : () -> ()\n' + TAIL,
     3, "dense", "bad dense constant"),
    (HEAD + NEG + '  "tc.p"(%0) {c = dense<"0x0000"> : tensor<2xf32>} : () -> ()\n' + TAIL, 3,
     '"0x', "hex constant has 2 bytes but tensor<2xf32> needs 8"),
    (HEAD + NEG + '  "tc.p"(%0) {c = dense<[1.0]>} : () -> ()\n' + TAIL, 3, "}",
     "expected ':' after 'dense<...>'"),
    (HEAD + '  %0:2 = "tc.two"(%arg0) : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)\n'
     + TAIL, 3, "%0", "'%0' names 2 results; pick one with '%0#0'"),
    (HEAD + '  %0:2 = "tc.two"(%arg0) : (tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)\n'
     + "  return %0#2 : tensor<4xf32>\n}", 3, "#^2", "'%0' has 2 results, so '#2' is out of range"),
    (HEAD + NEG + "  return %0, %0 : tensor<4xf32>, tensor<4xf32>\n}", 3, "return",
     "'return' has 2 values but the function declares 1 results"),
    (HEAD + NEG + "  return %0 : tensor<4xf32>, tensor<4xf32>\n}", 3, "return",
     "'return' has 1 values but 2 types"),
    (HEAD + NEG + "  return %0 : tensor<4xf64>\n}", 3, "tensor",
     "operand 0 has type tensor<4xf32> but the type list says tensor<4xf64>"),
    (HEAD.replace("-> (tensor<4xf32>)", "-> (tensor<4xi1>)") + NEG + TAIL, 3, "%0",
     "returned value 0 ('%0') has type tensor<4xf32> but the function declares tensor<4xi1>"),
    (HEAD + NEG + "}", 3, "}", "expected an op name like \"tc.add\" or 'return' to start an operation, found '}'"),
    (HEAD + NEG + TAIL + "\nfunc.func", 5, "func", "expected end of input after the function, found 'func.func'"),
    (HEAD + NEG.replace("(%arg0)", "(%arg0 $)") + TAIL, 2, "$", "unexpected character '$'"),
    (HEAD + NEG.replace("tensor<4xf32>\n", 'tensor<4xf32> loc("f.py":3)\n') + TAIL, 2, ":3^)",
     "expected ':' after the location's line number, found ')'"),
    (HEAD + NEG.replace("tensor<4xf32>\n", "tensor<4xf32\n") + TAIL, 2, "-> ^tensor<4xf32",
     "unterminated tensor type"),
]


def _column(text: str, line: int, marker: str) -> int:
    """1-based column of `marker` on `line`, or of the '^' inside it if it has one."""
    source = text.splitlines()[line - 1] if text else ""
    before, caret, after = marker.partition("^")
    if not caret:
        before, after = "", marker
    return source.index(before + after) + len(before) + 1


@pytest.mark.parametrize("text, line, marker, message", MALFORMED,
                         ids=[m[3][:40] for m in MALFORMED])
def test_malformed_text_is_located(text, line, marker, message):
    with pytest.raises(IRError) as info:
        parse_graph(text, filename="bad.mlir")
    col = _column(text, line, marker)
    assert f"bad.mlir: line {line}, column {col}: " in str(info.value)
    assert message in str(info.value)
    assert (info.value.line, info.value.col) == (line, col)


# -- random graphs ---------------------------------------------------------------------

INT64 = st.integers(-2**63, 2**63 - 1)
tensor_types = st.builds(TensorType, st.lists(st.integers(0, 4), max_size=3).map(tuple),
                         st.sampled_from(list(DType)))
# hypothesis knows no bfloat16: its arrays are float32 ones rounded
arrays = st.sampled_from(list(DType)).flatmap(
    lambda d: hnp.arrays(np.float32 if d is DType.bfloat16 else d.np,
                         hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)).map(
        lambda a, d=d: a.astype(d.np)))
attr_values = st.one_of(st.booleans(), INT64, st.floats(), st.text(max_size=8),
                        st.lists(INT64, max_size=4).map(tuple), st.sampled_from(list(DType)),
                        arrays)
identifiers = st.from_regex(r"[a-z_][a-z0-9_.$]{0,6}", fullmatch=True)
locations = st.builds(Location, st.text(max_size=8), st.integers(0, 2**31), st.integers(0, 999))


@st.composite
def graphs(draw, names=st.text(min_size=1, max_size=6)):
    g = Graph(draw(names | identifiers), draw(st.lists(tensor_types, max_size=3)))
    values = list(g.inputs)
    for _ in range(draw(st.integers(0, 5))):
        operands = draw(st.lists(st.sampled_from(values), max_size=3)) if values else []
        attrs = draw(st.dictionaries(names | identifiers, attr_values, max_size=4))
        op_name = "tc." + draw(identifiers)
        op = g.add_op(op_name, operands, attrs, draw(st.lists(tensor_types, max_size=3)),
                      draw(st.none() | locations))
        values += op.results
    g.outputs = draw(st.lists(st.sampled_from(values), max_size=3)) if values else []
    return g


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_random_graphs_round_trip(g):
    text = print_graph(g)
    assert parse_graph(text) == g
    assert print_graph(parse_graph(text)) == text


@needs_mlir_opt
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_mlir_opt_accepts_random_graphs(g):
    check_with_mlir_opt(print_graph(g))
