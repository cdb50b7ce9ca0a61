"""The IR verifier: a table of broken graphs and the message each must produce, and graphs
that must verify."""
from __future__ import annotations

import textwrap

import numpy as np
import pytest

from tracecomp.core.dtypes import DType
from tracecomp.core.errors import IRError
from tracecomp.ir import Graph, Location, TensorType
from tracecomp.ir.parser import parse_graph
from tracecomp.ir.verifier import verify

F32, I64 = DType.float32, DType.int64
T4 = TensorType((4,), F32)


def text(body: str, result: str = "tensor<4xf32>") -> Graph:
    """A graph of input %arg0: tensor<4xf32> and the ops in `body`; returns its last result."""
    body = textwrap.dedent(body).strip()
    last = body.splitlines()[-1].split("=")[0].strip()
    return parse_graph(f"func.func @f(%arg0: tensor<4xf32>) -> ({result}) {{\n"
                       f"{textwrap.indent(body, '  ')}\n  return {last} : {result}\n}}")


def exp_then_neg() -> Graph:
    g = Graph("f", [T4])
    a = g.add_op("tc.exp", [g.inputs[0]], {}, [T4], Location("model.py", 3))
    g.add_op("tc.neg", [a.result], {}, [T4], Location("model.py", 4))
    g.outputs = [g.ops[-1].result]
    return g


def use_before_def() -> Graph:
    g = exp_then_neg()
    g.ops.reverse()
    return g


def cycle() -> Graph:
    g = exp_then_neg()
    g.ops[0].operands[0] = g.ops[1].result
    return g


def foreign_operand() -> Graph:
    g = exp_then_neg()
    g.ops[1].operands[0] = Graph("other", [T4]).inputs[0]
    return g


def undefined_output() -> Graph:
    g = exp_then_neg()
    g.outputs = [Graph("other", [T4]).inputs[0]]
    return g


def unwired_result() -> Graph:
    g = exp_then_neg()
    g.ops[1].results = list(g.ops[0].results)
    return g


def repeated_input() -> Graph:
    g = Graph("f", [T4])
    g.inputs.append(g.inputs[0])
    return g


def constant_of_wrong_shape() -> Graph:
    g = Graph("f")
    g.add_op("tc.constant", [], {"value": np.zeros(3, np.float32)}, [T4], Location("model.py", 9))
    g.outputs = [g.ops[0].result]
    return g


def constant_with_operand() -> Graph:
    g = Graph("f", [T4])
    g.add_op("tc.constant", [g.inputs[0]], {"value": np.zeros(4, np.float32)}, [T4])
    return g


BROKEN = {
    "use before definition": (use_before_def, [
        "verify @f: op #0 'tc.neg' at model.py:4: operand #0 is used before it is defined",
        "expected: every operand defined by a graph input or an earlier op",
        "actual:   defined later, by op #1 'tc.exp' at model.py:3",
        "fix: the data flow is acyclic: emit ops in a topological order",
        '%0 = "tc.neg"(%1) : (tensor<4xf32>) -> tensor<4xf32> loc("model.py":4:0)']),
    "cycle": (cycle, [
        "op #0 'tc.exp' at model.py:3: operand #0 is used before it is defined",
        "the data flow itself is broken", "the data flow has a cycle"]),
    "operand from another graph": (foreign_operand, [
        "op #1 'tc.neg' at model.py:4: operand #0 (<Value input#0: tensor<4xf32>>) is not defined in this graph",
        "from an op a pass removed without replacing its uses?",
        '%1 = "tc.neg"(%undef0)']),
    "undefined output": (undefined_output, [
        "verify @f: output #0 (<Value input#0: tensor<4xf32>>) is not defined in the graph",
        "expected: a graph input or a result of one of the graph's ops",
        "the return:\n    return %undef0 : tensor<4xf32>"]),
    "result not wired to its op": (unwired_result, [
        "op #1 'tc.neg' at model.py:4: result #0 is not wired to this op",
        "actual:   value.op is <Op tc.exp at model.py:3>", "fix: create ops with Graph.add_op"]),
    "input listed twice": (repeated_input, ["verify @f: input #1 is not a fresh input value"]),
    "constant of the wrong shape": (constant_of_wrong_shape, [
        "op #0 'tc.constant' at model.py:9: the constant's value does not match its result type",
        "expected: tensor<4xf32>", "actual:   an array of shape (3,) and dtype float32"]),
    "constant with an operand": (constant_with_operand, [
        "a constant takes no operands and exactly one attribute",
        "actual:   1 operand(s) and attrs ['value']"]),
    "unknown op": (lambda: text('%0 = "tc.ad"(%arg0) {other = 1 : i64, alpha = 1 : i64} : (tensor<4xf32>) -> tensor<4xf32>'), [
        "op #0 'tc.ad': unknown op 'tc.ad'",
        "expected: 'tc.constant' or 'tc.' + the full name of an ops.yaml entry",
        "fix: did you mean 'tc.add'",
        '%0 = "tc.ad"(%arg0) {other = 1 : i64, alpha = 1 : i64}']),
    "missing attribute": (lambda: text('%0 = "tc.add"(%arg0, %arg0) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>'), [
        "its operands and attributes do not match the schema: tc.add is missing attribute 'alpha' (Scalar)",
        "expected: the arguments of add(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor (ops.yaml:"]),
    "unknown attribute": (lambda: text('%0 = "tc.exp"(%arg0) {beta = 2 : i64} : (tensor<4xf32>) -> tensor<4xf32>'), [
        "tc.exp has unknown attribute(s) beta"]),
    "too many operands": (lambda: text('%0 = "tc.exp"(%arg0, %arg0) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>'), [
        "tc.exp expects 1 tensor operand(s), got 2"]),
    "wrong result dtype": (lambda: text('%0 = "tc.exp"(%arg0) : (tensor<4xf32>) -> tensor<4xi64>', "tensor<4xi64>"), [
        "the recorded result types do not match the shape rule of 'exp' (ops.yaml:",
        "expected: (tensor<4xf32>)", "actual:   (tensor<4xi64>)",
        "fix: result types must come from tracecomp.ops.rules.infer"]),
    "wrong result shape": (lambda: text('%0 = "tc.sum"(%arg0) {dim, keepdim = true, dtype} : (tensor<4xf32>) -> tensor<f32>', "tensor<f32>"), [
        "expected: (tensor<1xf32>)", "actual:   (tensor<f32>)", '"tc.sum"(%arg0) {dim, keepdim = true, dtype}']),
    "wrong number of results": (lambda: text('%0 = "tc.max.dim"(%arg0) {dim = 0 : i64, keepdim = false} : (tensor<4xf32>) -> tensor<f32>', "tensor<f32>"), [
        "expected: (tensor<f32>, tensor<i64>)", "actual:   (tensor<f32>)"]),
    "shape rule rejects the arguments": (lambda: text('''
            %0 = "tc.reshape"(%arg0) {shape = array<i64: 3>} : (tensor<4xf32>) -> tensor<3xf32>''', "tensor<3xf32>"), [
        "the shape rule of 'reshape' (ops.yaml:", "rejects its arguments: reshape: 'shape' (3,) is invalid "
        "for an input of 4 elements"]),
    "broadcast failure": (lambda: text('''
            %0 = "tc.constant"() {value = dense<[1.0, 2.0, 3.0]> : tensor<3xf32>} : () -> tensor<3xf32>
            %1 = "tc.add"(%arg0, %0) {alpha = 1 : i64} : (tensor<4xf32>, tensor<3xf32>) -> tensor<4xf32>'''), [
        "op #1 'tc.add': the shape rule of 'add'", "shapes cannot broadcast: 'self' (4,), 'other' (3,)"]),
}


@pytest.mark.parametrize("name", BROKEN)
def test_broken_graph_message(name):
    build, fragments = BROKEN[name]
    with pytest.raises(IRError) as info:
        verify(build())
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"


VALID = {
    "scalar attrs and None attrs": '''
        %0 = "tc.mul"(%arg0) {other = 2.5 : f64} : (tensor<4xf32>) -> tensor<4xf32>
        %1 = "tc.clamp"(%0) {min, max = 1.0 : f64} : (tensor<4xf32>) -> tensor<4xf32>''',
    "multi-result op and Tensor[] operands": '''
        %0:2 = "tc.split"(%arg0) {split_size = 2 : i64, dim = 0 : i64} : (tensor<4xf32>) -> (tensor<2xf32>, tensor<2xf32>)
        %1 = "tc.cat"(%0#1, %0#0) {dim = 0 : i64} : (tensor<2xf32>, tensor<2xf32>) -> tensor<4xf32>''',
    "constants and factories": '''
        %0 = "tc.constant"() {value = dense<[1.0, 2.0, 3.0, 4.0]> : tensor<4xf32>} : () -> tensor<4xf32>
        %1 = "tc.rand"() {size = array<i64: 4>, dtype} : () -> tensor<4xf32>
        %2 = "tc.add"(%0, %1) {alpha = 1 : i64} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>''',
    "composite (types not re-checked: they come from its decomposition)": '''
        %0 = "tc.softmax"(%arg0) {dim = 0 : i64, dtype} : (tensor<4xf32>) -> tensor<4xf32>''',
}


@pytest.mark.parametrize("name", VALID)
def test_valid_graph_verifies(name):
    verify(text(VALID[name]))
