"""The IR passes: golden text in -> text out for each pass and each simplify pattern, the
PassManager, the graph views (networkx, DOT), and the pipeline on traced functions
compared with eager execution."""
from __future__ import annotations

import io
import shutil
import subprocess
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tracecomp as tc
from tracecomp.transforms.decompose import decompose
from tracecomp.core.errors import IRError
from tracecomp.ir import Graph, TensorType
from tracecomp.ir.nx import to_dot, to_networkx, topological_order
from tracecomp.ir.parser import parse_graph
from tracecomp.ir.passes import PassManager, cse, dce, fold_constants, simplify
from tracecomp.ir.printer import print_graph
from tracecomp.ir.verifier import verify
from tracecomp.ops.numpy_kernels import run as numpy_run
from tracecomp.transforms.pipeline import optimize, pipeline
from tracecomp.runtime.interpreter import run_graph


def fold(graph: Graph) -> Graph:
    return fold_constants(graph, numpy_run)


def simplify_dce(graph: Graph) -> Graph:
    """simplify leaves replaced ops without users; DCE drops them so the golden text is short."""
    return dce(simplify(graph))


def check(pass_fn, before: str, after: str) -> None:
    graph = parse_graph(textwrap.dedent(before))
    verify(graph)
    out = pass_fn(graph)
    verify(out)
    assert print_graph(out) == textwrap.dedent(after).strip()


def unchanged(pass_fn, text: str) -> None:
    check(pass_fn, text, text)


# ---------------------------------------------------------------- dce

def test_dce_removes_unused_ops_and_unused_rand():
    check(dce, """
        func.func @f(%x: tensor<4xf32>) -> (tensor<4xf32>) {
          %0 = "tc.exp"(%x) : (tensor<4xf32>) -> tensor<4xf32>
          %1 = "tc.rand"() {size = array<i64: 4>, dtype = f32} : () -> tensor<4xf32>
          %2 = "tc.neg"(%x) : (tensor<4xf32>) -> tensor<4xf32>
          %3 = "tc.add"(%2, %1) {alpha = 1 : i64} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
          return %0 : tensor<4xf32>
        }""", """
        func.func @f(%arg0: tensor<4xf32>) -> (tensor<4xf32>) {
          %0 = "tc.exp"(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
          return %0 : tensor<4xf32>
        }""")


def test_dce_keeps_multi_result_op_with_one_used_result_and_used_rand():
    unchanged(dce, """
        func.func @f(%arg0: tensor<4x3xf32>) -> (tensor<4xi64>, tensor<4x3xf32>) {
          %0:2 = "tc.max.dim"(%arg0) {dim = 1 : i64, keepdim = false} : (tensor<4x3xf32>) -> (tensor<4xf32>, tensor<4xi64>)
          %1 = "tc.rand"() {size = array<i64: 4, 3>, dtype = f32} : () -> tensor<4x3xf32>
          return %0#1, %1 : tensor<4xi64>, tensor<4x3xf32>
        }""")


# ---------------------------------------------------------------- cse

def test_cse_merges_repeated_ops_and_chains():
    check(cse, """
        func.func @f(%arg0: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
          %0 = "tc.exp"(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
          %1 = "tc.mul"(%0) {other = 2 : i64} : (tensor<4xf32>) -> tensor<4xf32>
          %2 = "tc.exp"(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
          %3 = "tc.mul"(%2) {other = 2 : i64} : (tensor<4xf32>) -> tensor<4xf32>
          return %1, %3 : tensor<4xf32>, tensor<4xf32>
        }""", """
        func.func @f(%arg0: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
          %0 = "tc.exp"(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
          %1 = "tc.mul"(%0) {other = 2 : i64} : (tensor<4xf32>) -> tensor<4xf32>
          return %1, %1 : tensor<4xf32>, tensor<4xf32>
        }""")


def test_cse_merges_equal_constants_only():
    check(cse, """
        func.func @f() -> (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) {
          %0 = "tc.constant"() {value = dense<[1.0, 2.0]> : tensor<2xf32>} : () -> tensor<2xf32>
          %1 = "tc.constant"() {value = dense<[1.0, 2.0]> : tensor<2xf32>} : () -> tensor<2xf32>
          %2 = "tc.constant"() {value = dense<[1.0, 3.0]> : tensor<2xf32>} : () -> tensor<2xf32>
          return %0, %1, %2 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
        }""", """
        func.func @f() -> (tensor<2xf32>, tensor<2xf32>, tensor<2xf32>) {
          %0 = "tc.constant"() {value = dense<[1.0, 2.0]> : tensor<2xf32>} : () -> tensor<2xf32>
          %1 = "tc.constant"() {value = dense<[1.0, 3.0]> : tensor<2xf32>} : () -> tensor<2xf32>
          return %0, %0, %1 : tensor<2xf32>, tensor<2xf32>, tensor<2xf32>
        }""")


def test_cse_keeps_attrs_that_differ_only_in_kind_or_sign_of_zero():
    unchanged(cse, """
        func.func @f(%arg0: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) {
          %0 = "tc.add"(%arg0) {other = 0.0 : f64, alpha = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>
          %1 = "tc.add"(%arg0) {other = -0.0 : f64, alpha = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>
          %2 = "tc.add"(%arg0) {other = 0 : i64, alpha = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>
          return %0, %1, %2 : tensor<4xf32>, tensor<4xf32>, tensor<4xf32>
        }""")


def test_cse_never_merges_rand():
    unchanged(cse, """
        func.func @f() -> (tensor<3xf32>, tensor<3xf32>) {
          %0 = "tc.rand"() {size = array<i64: 3>, dtype = f32} : () -> tensor<3xf32>
          %1 = "tc.rand"() {size = array<i64: 3>, dtype = f32} : () -> tensor<3xf32>
          return %0, %1 : tensor<3xf32>, tensor<3xf32>
        }""")


# ---------------------------------------------------------------- fold

def test_fold_evaluates_constant_chains():
    check(lambda g: dce(fold(g)), """
        func.func @f(%arg0: tensor<2xf32>) -> (tensor<2xf32>) {
          %0 = "tc.constant"() {value = dense<[1.0, 2.0]> : tensor<2xf32>} : () -> tensor<2xf32>
          %1 = "tc.mul"(%0) {other = 3 : i64} : (tensor<2xf32>) -> tensor<2xf32>
          %2 = "tc.add"(%1, %0) {alpha = 1 : i64} : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
          %3 = "tc.add"(%arg0, %2) {alpha = 1 : i64} : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
          return %3 : tensor<2xf32>
        }""", """
        func.func @f(%arg0: tensor<2xf32>) -> (tensor<2xf32>) {
          %0 = "tc.constant"() {value = dense<[4.0, 8.0]> : tensor<2xf32>} : () -> tensor<2xf32>
          %1 = "tc.add"(%arg0, %0) {alpha = 1 : i64} : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
          return %1 : tensor<2xf32>
        }""")


def test_fold_small_factories_and_multi_result_ops():
    check(fold, """
        func.func @f() -> (tensor<2xi64>, tensor<1xi64>) {
          %0 = "tc.arange"() {end = 3 : i64, dtype} : () -> tensor<3xi64>
          %1:2 = "tc.split.sizes"(%0) {split_size = array<i64: 2, 1>, dim = 0 : i64} : (tensor<3xi64>) -> (tensor<2xi64>, tensor<1xi64>)
          return %1#0, %1#1 : tensor<2xi64>, tensor<1xi64>
        }""", """
        func.func @f() -> (tensor<2xi64>, tensor<1xi64>) {
          %0 = "tc.constant"() {value = dense<[0, 1, 2]> : tensor<3xi64>} : () -> tensor<3xi64>
          %1 = "tc.constant"() {value = dense<[0, 1]> : tensor<2xi64>} : () -> tensor<2xi64>
          %2 = "tc.constant"() {value = dense<[2]> : tensor<1xi64>} : () -> tensor<1xi64>
          return %1, %2 : tensor<2xi64>, tensor<1xi64>
        }""")


@pytest.mark.parametrize("text", [
    pytest.param("""
        func.func @f() -> (tensor<100x100xf32>) {
          %0 = "tc.full"() {size = array<i64: 100, 100>, fill_value = 1.0 : f64, dtype = f32} : () -> tensor<100x100xf32>
          return %0 : tensor<100x100xf32>
        }""", id="large-factory"),
    pytest.param("""
        func.func @f() -> (tensor<3xf32>) {
          %0 = "tc.rand"() {size = array<i64: 3>, dtype = f32} : () -> tensor<3xf32>
          %1 = "tc.mul"(%0) {other = 2 : i64} : (tensor<3xf32>) -> tensor<3xf32>
          return %1 : tensor<3xf32>
        }""", id="rand"),
    pytest.param("""
        func.func @f(%arg0: tensor<2xf32>) -> (tensor<2xf32>) {
          %0 = "tc.constant"() {value = dense<[1.0, 2.0]> : tensor<2xf32>} : () -> tensor<2xf32>
          %1 = "tc.add"(%arg0, %0) {alpha = 1 : i64} : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
          return %1 : tensor<2xf32>
        }""", id="non-constant-operand"),
    pytest.param("""
        func.func @f() -> (tensor<2xf32>) {
          %0 = "tc.constant"() {value = dense<[1.0, 2.0]> : tensor<2xf32>} : () -> tensor<2xf32>
          %1 = "tc.softmax"(%0) {dim = 0 : i64, dtype} : (tensor<2xf32>) -> tensor<2xf32>
          return %1 : tensor<2xf32>
        }""", id="composite"),
    pytest.param("""
        func.func @f() -> (tensor<1xf32>) {
          %0 = "tc.constant"() {value = dense<[1.0, 2.0]> : tensor<2xf32>} : () -> tensor<2xf32>
          %1 = "tc.constant"() {value = dense<[5]> : tensor<1xi64>} : () -> tensor<1xi64>
          %2 = "tc.index_select"(%0, %1) {dim = 0 : i64} : (tensor<2xf32>, tensor<1xi64>) -> tensor<1xf32>
          return %2 : tensor<1xf32>
        }""", id="evaluator-error-stays-for-run-time"),
])
def test_fold_leaves(text):
    unchanged(fold, text)


def test_fold_uses_the_injected_evaluator():
    calls = []

    def evaluate(opdef, args, types):
        calls.append((opdef.full_name, sorted(args)))
        return [np.full(t.shape, 7, t.dtype.np) for t in types]
    check(lambda g: fold_constants(g, evaluate), """
        func.func @f() -> (tensor<2xi64>) {
          %0 = "tc.full"() {size = array<i64: 2>, fill_value = 1 : i64, dtype = i64} : () -> tensor<2xi64>
          return %0 : tensor<2xi64>
        }""", """
        func.func @f() -> (tensor<2xi64>) {
          %0 = "tc.constant"() {value = dense<[7, 7]> : tensor<2xi64>} : () -> tensor<2xi64>
          return %0 : tensor<2xi64>
        }""")
    assert calls == [("full", ["dtype", "fill_value", "size"])]


def test_fold_refuses_an_evaluator_result_of_the_wrong_type():
    g = parse_graph("""func.func @f() -> (tensor<2xi64>) {
      %0 = "tc.full"() {size = array<i64: 2>, fill_value = 1 : i64, dtype = i64} : () -> tensor<2xi64>
      return %0 : tensor<2xi64>
    }""")
    with pytest.raises(IRError, match=r"folding 'tc.full'.*shape \(3,\).*expected tensor<2xi64>"):
        fold_constants(g, lambda opdef, args, types: [np.zeros(3, np.int64)])


# ---------------------------------------------------------------- simplify, one test per pattern

def _unary_graph(in_type: str, line: str, out_type: str) -> str:
    """A graph of one input and the ops in `line` (the last result is returned)."""
    last = line.strip().splitlines()[-1].split("=")[0].strip()
    return f"""
        func.func @f(%arg0: {in_type}) -> ({out_type}) {{
{textwrap.indent(textwrap.dedent(line).strip(), " " * 10)}
          return {last} : {out_type}
        }}"""


def _identity(in_type: str) -> str:
    return f"""
        func.func @f(%arg0: {in_type}) -> ({in_type}) {{
          return %arg0 : {in_type}
        }}"""


SIMPLIFIED_TO_INPUT = {
    "x*1": ("tensor<4xf32>", '%0 = "tc.mul"(%arg0) {other = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>'),
    "x*1.0": ("tensor<4xf32>", '%0 = "tc.mul"(%arg0) {other = 1.0 : f64} : (tensor<4xf32>) -> tensor<4xf32>'),
    "1*x (constant)": ("tensor<4xf32>", """
        %0 = "tc.constant"() {value = dense<1.0> : tensor<f32>} : () -> tensor<f32>
        %1 = "tc.mul"(%0, %arg0) : (tensor<f32>, tensor<4xf32>) -> tensor<4xf32>"""),
    "x*ones (constant)": ("tensor<2xi32>", """
        %0 = "tc.constant"() {value = dense<[1, 1]> : tensor<2xi32>} : () -> tensor<2xi32>
        %1 = "tc.mul"(%arg0, %0) : (tensor<2xi32>, tensor<2xi32>) -> tensor<2xi32>"""),
    "x+0 (int scalar on i32)": ("tensor<4xi32>", '%0 = "tc.add"(%arg0) {other = 0 : i64, alpha = 1 : i64} : (tensor<4xi32>) -> tensor<4xi32>'),
    "x+(-0.0)": ("tensor<4xf32>", '%0 = "tc.add"(%arg0) {other = -0.0 : f64, alpha = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>'),
    "x+0 with alpha -1": ("tensor<4xf32>", '%0 = "tc.add"(%arg0) {other = 0.0 : f64, alpha = -1 : i64} : (tensor<4xf32>) -> tensor<4xf32>'),
    "x+0 (alpha 3)": ("tensor<4xi64>", '%0 = "tc.add"(%arg0) {other = 0 : i64, alpha = 3 : i64} : (tensor<4xi64>) -> tensor<4xi64>'),
    "-0.0+x (constant)": ("tensor<4xf32>", """
        %0 = "tc.constant"() {value = dense<-0.0> : tensor<f32>} : () -> tensor<f32>
        %1 = "tc.add"(%0, %arg0) {alpha = 1 : i64} : (tensor<f32>, tensor<4xf32>) -> tensor<4xf32>"""),
    "x-0": ("tensor<4xf32>", '%0 = "tc.sub"(%arg0) {other = 0.0 : f64, alpha = 2 : i64} : (tensor<4xf32>) -> tensor<4xf32>'),
    "x/1": ("tensor<4xf64>", '%0 = "tc.div"(%arg0) {other = 1 : i64} : (tensor<4xf64>) -> tensor<4xf64>'),
    "x**1": ("tensor<4xf32>", '%0 = "tc.pow"(%arg0) {exponent = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>'),
    "neg(neg(x))": ("tensor<4xf32>", """
        %0 = "tc.neg"(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
        %1 = "tc.neg"(%0) : (tensor<4xf32>) -> tensor<4xf32>"""),
    "reshape to the same shape": ("tensor<2x3xf32>", '%0 = "tc.reshape"(%arg0) {shape = array<i64: -1, 3>} : (tensor<2x3xf32>) -> tensor<2x3xf32>'),
    "reshape(reshape(x)) back": ("tensor<2x3xf32>", """
        %0 = "tc.reshape"(%arg0) {shape = array<i64: 6>} : (tensor<2x3xf32>) -> tensor<6xf32>
        %1 = "tc.reshape"(%0) {shape = array<i64: 2, 3>} : (tensor<6xf32>) -> tensor<2x3xf32>"""),
    "permute identity": ("tensor<2x3xf32>", '%0 = "tc.permute"(%arg0) {dims = array<i64: 0, -1>} : (tensor<2x3xf32>) -> tensor<2x3xf32>'),
    "permute(permute(x)) inverse": ("tensor<2x3x4xf32>", """
        %0 = "tc.permute"(%arg0) {dims = array<i64: 1, 2, 0>} : (tensor<2x3x4xf32>) -> tensor<3x4x2xf32>
        %1 = "tc.permute"(%0) {dims = array<i64: 2, 0, 1>} : (tensor<3x4x2xf32>) -> tensor<2x3x4xf32>"""),
    "squeeze no-op": ("tensor<2x3xf32>", '%0 = "tc.squeeze"(%arg0) {dim = array<i64: 0>} : (tensor<2x3xf32>) -> tensor<2x3xf32>'),
    "squeeze(unsqueeze(x))": ("tensor<2x3xf32>", """
        %0 = "tc.unsqueeze"(%arg0) {dim = 1 : i64} : (tensor<2x3xf32>) -> tensor<2x1x3xf32>
        %1 = "tc.squeeze"(%0) {dim = array<i64: 1>} : (tensor<2x1x3xf32>) -> tensor<2x3xf32>"""),
    "unsqueeze(squeeze(x))": ("tensor<2x1xf32>", """
        %0 = "tc.squeeze"(%arg0) {dim} : (tensor<2x1xf32>) -> tensor<2xf32>
        %1 = "tc.unsqueeze"(%0) {dim = -1 : i64} : (tensor<2xf32>) -> tensor<2x1xf32>"""),
    "cast to the same dtype": ("tensor<4xi32>", '%0 = "tc.to"(%arg0) {dtype = i32} : (tensor<4xi32>) -> tensor<4xi32>'),
    "expand to the same shape": ("tensor<2x3xf32>", '%0 = "tc.expand"(%arg0) {size = array<i64: -1, 3>} : (tensor<2x3xf32>) -> tensor<2x3xf32>'),
}


@pytest.mark.parametrize("name", SIMPLIFIED_TO_INPUT)
def test_simplify_to_input(name):
    in_type, ops = SIMPLIFIED_TO_INPUT[name]
    check(simplify_dce, _unary_graph(in_type, ops, in_type), _identity(in_type))


STAYS = {   # looks like a pattern, but the replacement would change the type or the value
    "int * 1.0 changes dtype": ("tensor<4xi64>", '%0 = "tc.mul"(%arg0) {other = 1.0 : f64} : (tensor<4xi64>) -> tensor<4xf32>', "tensor<4xf32>"),
    "x * ones broadcasts": ("tensor<3xf32>", """
        %0 = "tc.constant"() {value = dense<[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]> : tensor<2x3xf32>} : () -> tensor<2x3xf32>
        %1 = "tc.mul"(%arg0, %0) : (tensor<3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>""", "tensor<2x3xf32>"),
    "x * 2": ("tensor<4xf32>", '%0 = "tc.mul"(%arg0) {other = 2 : i64} : (tensor<4xf32>) -> tensor<4xf32>', "tensor<4xf32>"),
    "x + 0.0 (-0.0 + 0.0 is +0.0)": ("tensor<4xf32>", '%0 = "tc.add"(%arg0) {other = 0 : i64, alpha = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>', "tensor<4xf32>"),
    "0.0 + x": ("tensor<4xf32>", """
        %0 = "tc.constant"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
        %1 = "tc.add"(%0, %arg0) {alpha = 1 : i64} : (tensor<f32>, tensor<4xf32>) -> tensor<4xf32>""", "tensor<4xf32>"),
    "x - (-0.0)": ("tensor<4xf32>", '%0 = "tc.sub"(%arg0) {other = -0.0 : f64, alpha = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>', "tensor<4xf32>"),
    "bool + 0 changes dtype": ("tensor<4xi1>", '%0 = "tc.add"(%arg0) {other = 0 : i64, alpha = 1 : i64} : (tensor<4xi1>) -> tensor<4xi64>', "tensor<4xi64>"),
    "0 + x with alpha 2": ("tensor<4xf32>", """
        %0 = "tc.constant"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
        %1 = "tc.add"(%0, %arg0) {alpha = 2 : i64} : (tensor<f32>, tensor<4xf32>) -> tensor<4xf32>""", "tensor<4xf32>"),
    "x + 0 * inf": ("tensor<4xf32>", '%0 = "tc.add"(%arg0) {other = 0 : i64, alpha = 0x7FF0000000000000 : f64} : (tensor<4xf32>) -> tensor<4xf32>', "tensor<4xf32>"),
    "0 - x": ("tensor<4xf32>", """
        %0 = "tc.constant"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
        %1 = "tc.sub"(%0, %arg0) {alpha = 1 : i64} : (tensor<f32>, tensor<4xf32>) -> tensor<4xf32>""", "tensor<4xf32>"),
    "int / 1 changes dtype": ("tensor<4xi64>", '%0 = "tc.div"(%arg0) {other = 1 : i64} : (tensor<4xi64>) -> tensor<4xf32>', "tensor<4xf32>"),
    "permute that swaps equal dims": ("tensor<3x3xf32>", '%0 = "tc.permute"(%arg0) {dims = array<i64: 1, 0>} : (tensor<3x3xf32>) -> tensor<3x3xf32>', "tensor<3x3xf32>"),
    "squeeze that removes a dim": ("tensor<1x3xf32>", '%0 = "tc.squeeze"(%arg0) {dim} : (tensor<1x3xf32>) -> tensor<3xf32>', "tensor<3xf32>"),
    "cast to another dtype": ("tensor<4xi32>", '%0 = "tc.to"(%arg0) {dtype = f32} : (tensor<4xi32>) -> tensor<4xf32>', "tensor<4xf32>"),
    "x ** 1.0 on ints changes dtype": ("tensor<4xi32>", '%0 = "tc.pow"(%arg0) {exponent = 1.0 : f64} : (tensor<4xi32>) -> tensor<4xf32>', "tensor<4xf32>"),
    "bool ** 2 changes dtype": ("tensor<4xi1>", '%0 = "tc.pow"(%arg0) {exponent = 2 : i64} : (tensor<4xi1>) -> tensor<4xi64>', "tensor<4xi64>"),
    "bool ** 1 changes dtype": ("tensor<4xi1>", '%0 = "tc.pow"(%arg0) {exponent = 1 : i64} : (tensor<4xi1>) -> tensor<4xi64>', "tensor<4xi64>"),
    "x ** 3": ("tensor<4xf32>", '%0 = "tc.pow"(%arg0) {exponent = 3 : i64} : (tensor<4xf32>) -> tensor<4xf32>', "tensor<4xf32>"),
    "expand to a larger shape": ("tensor<3xf32>", '%0 = "tc.expand"(%arg0) {size = array<i64: 2, 3>} : (tensor<3xf32>) -> tensor<2x3xf32>', "tensor<2x3xf32>"),
}


@pytest.mark.parametrize("name", STAYS)
def test_simplify_leaves(name):
    in_type, ops, out_type = STAYS[name]
    unchanged(simplify_dce, _unary_graph(in_type, ops, out_type))


def test_simplify_squares_become_products():
    check(simplify_dce, _unary_graph("tensor<4xf32>", '%0 = "tc.pow"(%arg0) {exponent = 2 : i64} : (tensor<4xf32>) -> tensor<4xf32>',
                                     "tensor<4xf32>"),
          _unary_graph("tensor<4xf32>", '%0 = "tc.mul"(%arg0, %arg0) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>',
                       "tensor<4xf32>"))


def test_simplify_merges_reshape_chains_into_one_reshape():
    check(simplify_dce, """
        func.func @f(%arg0: tensor<2x3x4xf32>) -> (tensor<4x6xf32>) {
          %0 = "tc.reshape"(%arg0) {shape = array<i64: 24>} : (tensor<2x3x4xf32>) -> tensor<24xf32>
          %1 = "tc.unsqueeze"(%0) {dim = 0 : i64} : (tensor<24xf32>) -> tensor<1x24xf32>
          %2 = "tc.reshape"(%1) {shape = array<i64: 4, -1>} : (tensor<1x24xf32>) -> tensor<4x6xf32> loc("m.py":3:0)
          return %2 : tensor<4x6xf32>
        }""", """
        func.func @f(%arg0: tensor<2x3x4xf32>) -> (tensor<4x6xf32>) {
          %0 = "tc.reshape"(%arg0) {shape = array<i64: 4, -1>} : (tensor<2x3x4xf32>) -> tensor<4x6xf32> loc("m.py":3:0)
          return %0 : tensor<4x6xf32>
        }""")


def test_simplify_merges_permute_chains_into_one_permute():
    check(simplify_dce, """
        func.func @f(%arg0: tensor<2x3x4xf32>) -> (tensor<3x2x4xf32>) {
          %0 = "tc.permute"(%arg0) {dims = array<i64: 2, 0, 1>} : (tensor<2x3x4xf32>) -> tensor<4x2x3xf32>
          %1 = "tc.permute"(%0) {dims = array<i64: 2, 1, 0>} : (tensor<4x2x3xf32>) -> tensor<3x2x4xf32>
          return %1 : tensor<3x2x4xf32>
        }""", """
        func.func @f(%arg0: tensor<2x3x4xf32>) -> (tensor<3x2x4xf32>) {
          %0 = "tc.permute"(%arg0) {dims = array<i64: 1, 0, 2>} : (tensor<2x3x4xf32>) -> tensor<3x2x4xf32>
          return %0 : tensor<3x2x4xf32>
        }""")


def test_simplify_reduces_triple_negation_in_one_walk_and_leaves_dead_ops_to_dce():
    check(simplify, """
        func.func @f(%arg0: tensor<4xf32>) -> (tensor<4xf32>) {
          %0 = "tc.neg"(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
          %1 = "tc.neg"(%0) : (tensor<4xf32>) -> tensor<4xf32>
          %2 = "tc.neg"(%1) : (tensor<4xf32>) -> tensor<4xf32>
          return %2 : tensor<4xf32>
        }""", """
        func.func @f(%arg0: tensor<4xf32>) -> (tensor<4xf32>) {
          %0 = "tc.neg"(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
          %1 = "tc.neg"(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
          return %1 : tensor<4xf32>
        }""")


# ---------------------------------------------------------------- PassManager

EXAMPLE = """
    func.func @f(%arg0: tensor<4xf32>) -> (tensor<4xf32>) {
      %0 = "tc.exp"(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
      %1 = "tc.mul"(%0) {other = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>
      return %1 : tensor<4xf32>
    }"""


def test_pass_manager_runs_in_order_and_records_each_graph():
    out = io.StringIO()
    manager = PassManager([("simplify", simplify), ("dce", dce)], verify_each=True, record=True,
                          print_to=out)
    result = manager.run(parse_graph(EXAMPLE))
    assert list(manager.texts) == ["input", "simplify", "dce"]
    assert '"tc.mul"' in manager.texts["input"] and '"tc.mul"' not in manager.texts["simplify"]
    assert manager.texts["dce"] == print_graph(result)
    assert "// ----- dce\n" in out.getvalue()


def test_pass_manager_names_the_pass_that_broke_the_graph():
    def breaks(graph: Graph) -> Graph:
        graph.ops[0].results[0].type = TensorType((5,), tc.float32)
        return graph
    manager = PassManager([("simplify", simplify), ("breaks", breaks)], verify_each=True)
    with pytest.raises(IRError, match=r"(?s)after pass 'breaks' does not verify.*tc.exp.*"
                                      r"expected: \(tensor<4xf32>\)"):
        manager.run(parse_graph(EXAMPLE))


def test_pass_manager_refuses_duplicate_names():
    with pytest.raises(ValueError, match="repeated: dce"):
        PassManager([("dce", dce), ("dce", dce)])


def test_pipeline_records_every_stage():
    manager = pipeline(record=True)
    manager.run(parse_graph(EXAMPLE))
    assert list(manager.texts) == ["input", "decompose", "widen_half", "fold", "simplify", "summed_products", "narrow_products", "control", "cse", "dce"]
    assert manager.verify_each    # under pytest every pass is verified


# ---------------------------------------------------------------- graph views

def test_to_networkx_nodes_and_edges():
    g = to_networkx(parse_graph("""
        func.func @f(%arg0: tensor<4xf32>) -> (tensor<4xf32>) {
          %0 = "tc.mul"(%arg0, %arg0) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32> loc("m.py":7:0)
          return %0 : tensor<4xf32>
        }"""))
    assert list(g.nodes) == ["in0", "op0", "out0"]
    assert g.nodes["op0"] == {"kind": "op", "label": "%0 = tc.mul", "op": "tc.mul",
                              "types": ["tensor<4xf32>"], "loc": "m.py:7", "attrs": {}}
    assert g.edges["in0", "op0"] == {"label": "tensor<4xf32>", "value": "%arg0", "operands": [0, 1]}
    assert g.has_edge("op0", "out0")


def test_topological_order_repairs_order_and_reports_cycles():
    g = parse_graph(EXAMPLE)
    g.ops.reverse()
    assert [op.name for op in topological_order(g)] == ["tc.exp", "tc.mul"]
    assert list(to_networkx(g).nodes) == ["in0", "op0", "op1", "out0"]   # drawable out of order
    g.ops[0].operands[0], g.ops[1].operands[0] = g.ops[1].result, g.ops[0].result
    with pytest.raises(IRError, match="the data flow has a cycle"):
        topological_order(g)


def test_to_dot_is_valid_graphviz():
    g = parse_graph("""
        func.func @"my \\"graph\\"" (%arg0: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xi64>) {
          %0 = "tc.constant"() {value = dense<"0x0000803F0000803F0000803F0000803F0000803F0000803F0000803F0000803F0000803F0000803F0000803F0000803F0000803F0000803F0000803F0000803F0000803F"> : tensor<17xf32>} : () -> tensor<17xf32>
          %1 = "tc.gelu"(%arg0) {approximate = "tanh \\\\ \\"q\\""} : (tensor<4xf32>) -> tensor<4xf32> loc("a \\"b\\".py":1:0)
          %2 = "tc.arange"() {end = 4 : i64, dtype} : () -> tensor<4xi64>
          return %1, %2 : tensor<4xf32>, tensor<4xi64>
        }""")
    dot = to_dot(g)
    assert '"op1" [shape=box' in dot and '"in0" -> "op1" [label="tensor<4xf32>"]' in dot
    assert "..." in dot    # the long constant is abbreviated
    if shutil.which("dot") is None:
        pytest.skip("graphviz `dot` is not installed")
    done = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "<svg" in done.stdout and "tc.gelu" in done.stdout


# ---------------------------------------------------------------- the pipeline on traced functions

def _mlp(x, w1, b1, w2):
    h = tc.relu(x @ w1 + b1)
    return tc.softmax(h @ w2, 1).reshape([4, 3]).reshape([12]) * 1 + 0


def _shapes(x, w1, b1, w2):
    y = x.permute([1, 0]).permute([1, 0]).unsqueeze(0).squeeze(0)
    return y.sum(dim=1), (x.exp() + x.exp()).mean()


def _constants(x, w1, b1, w2):
    c = tc.tensor(np.arange(8, dtype=np.float32)) * 2 - 1      # folds to one constant
    return x * c + tc.zeros([8]) + tc.ones([4, 8]).sum(dim=0), -(-x)


def _layer_norm(x, w1, b1, w2):
    weight = b1.reshape([1, 16]).expand([8, 16]).sum(dim=1)
    return tc.layer_norm(x, [8], weight, None), x.to(tc.float32)


@pytest.mark.parametrize("fn", [_mlp, _shapes, _constants, _layer_norm])
def test_optimized_traces_verify_and_match_eager(fn):
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in [(4, 8), (8, 16), (16,), (16, 3)]]
    lowered = tc.trace(fn).lower(*inputs)
    verify(lowered.optimized)
    got = run_graph(lowered.optimized, inputs)
    want = fn(*[tc.tensor(a) for a in inputs])
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, np.asarray(w), rtol=1e-5, atol=1e-6)
    assert print_graph(optimize(lowered.optimized)) == print_graph(lowered.optimized)   # a fixpoint


def test_pipeline_removes_identities_and_folds_constants():
    inputs = [np.ones(s, np.float32) for s in [(4, 8), (8, 16), (16,), (16, 3)]]
    text = tc.trace(_constants).lower(*inputs).as_text("optimized")
    assert '"tc.neg"' not in text and '"tc.zeros"' not in text and '"tc.full"' not in text
    # x * c, the folded ones.sum, and the zeros: + 0.0 stays (it turns -0.0 into +0.0)
    assert text.count('"tc.constant"') == 3
    shapes = tc.trace(_shapes).lower(*inputs).as_text("optimized")
    assert '"tc.permute"' not in shapes and '"tc.squeeze"' not in shapes
    assert shapes.count('"tc.exp"') == 1     # CSE


# Steps on a 3x3 float tensor: identities the passes remove, and real work they must keep.
STEPS = [
    lambda x, c: x * 1, lambda x, c: 1.0 * x, lambda x, c: x + 0, lambda x, c: x - 0.0,
    lambda x, c: x / 1, lambda x, c: -(-x), lambda x, c: -x, lambda x, c: x * 2,
    lambda x, c: x.reshape([9]).reshape([3, 3]), lambda x, c: x.permute([1, 0]),
    lambda x, c: x.permute([1, 0]).permute([1, 0]), lambda x, c: x.unsqueeze(0).squeeze(0),
    lambda x, c: x.to(tc.float32), lambda x, c: x + c, lambda x, c: x * (c * 0 + 1),
    lambda x, c: x.exp() + x.exp(), lambda x, c: x + tc.zeros([3, 3]), lambda x, c: x.t(),
]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, len(STEPS) - 1), min_size=1, max_size=6))
def test_random_step_chains_optimize_to_the_same_result(steps):
    def fn(x):
        constant = tc.tensor(np.arange(9, dtype=np.float32).reshape(3, 3) / 8)   # made inside: a constant
        for i in steps:
            x = STEPS[i](x, constant)
        return x
    x = np.linspace(-1, 1, 9, dtype=np.float32).reshape(3, 3)
    lowered = tc.trace(fn).lower(x)
    reference = run_graph(decompose(lowered.graph), [x])     # not optimized
    np.testing.assert_allclose(run_graph(lowered.optimized, [x])[0], reference[0], rtol=1e-6)


def test_adding_zero_keeps_the_sign_of_zero_as_eager_does():
    """x + 0.0 is +0.0 at x = -0.0 (IEEE, eager, PyTorch); x - 0.0 and x + -0.0 are x."""
    x = np.array([-0.0, 0.0, -1.5], np.float32)
    fns = [lambda x: x + 0.0, lambda x: 0.0 + x, lambda x: x - 0.0, lambda x: x + (-0.0), lambda x: x - (-0.0),
           lambda x: x + tc.zeros([3])]
    for fn in fns:
        want = fn(tc.tensor(x)).numpy()
        got = tc.trace(fn)(x).numpy()
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
        np.testing.assert_array_equal(got, want)
