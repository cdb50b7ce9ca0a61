"""The verifier on ops with regions: every hand-built region graph verifies; each broken one
gives its message (what, where in the nesting, expected versus actual, the op's line)."""
from __future__ import annotations

import numpy as np
import pytest

from region_graphs import (F64, GRAPHS, T, branch, cond, const, doubling_while, nested, op, region,
                           reverse_cumsum, rnn_scan)
from tracecomp.core.errors import IRError
from tracecomp.ir import Graph
from tracecomp.ir.graph import Value
from tracecomp.ir.parser import parse_graph
from tracecomp.ir.printer import print_graph
from tracecomp.ir.verifier import verify


@pytest.mark.parametrize("make", GRAPHS, ids=lambda f: f.__name__)
def test_region_graphs_verify(make):
    g = make()
    verify(g)
    verify(parse_graph(print_graph(g)))


def body_of(g: Graph, i: int = 0, k: int = 0) -> Graph:
    return g.ops[i].regions[k]


# ---------------------------------------------------------------- broken graphs

def wrong_carry_type() -> Graph:
    """The body yields an f64 carry for an f32 init."""
    g = reverse_cumsum()
    body = body_of(g)
    body.outputs[0] = op(body, "tc.to", [body.outputs[0]], dtype=F64).result
    return g


def wrong_carry_result() -> Graph:
    g = rnn_scan()
    g.ops[0].results[0].type = T(2, 3, F64)
    return g


def wrong_yield_count() -> Graph:
    """'else' yields two values, 'then' one."""
    g = branch()
    other = body_of(g, 3, 1)
    other.outputs.append(other.inputs[0])
    return g


def too_few_carries() -> Graph:
    g = doubling_while()
    body_of(g, 1, 1).outputs.pop()
    return g


def non_bool_predicate() -> Graph:
    g = branch()
    g.ops[3].operands[0] = g.ops[0].result        # sum(x): tensor<f32>
    return g


def non_bool_while_condition() -> Graph:
    g = doubling_while()
    cnd = body_of(g, 1, 0)
    cnd.outputs = [cnd.inputs[2]]
    return g


def missing_region() -> Graph:
    g = rnn_scan()
    g.ops[0].regions = []
    return g


def missing_else() -> Graph:
    g = branch()
    g.ops[3].regions.pop()
    return g


def outer_value_inside() -> Graph:
    """The body reads W, an input of the function, instead of its block argument."""
    g = rnn_scan()
    body_of(g).ops[0].operands[1] = g.inputs[0]
    return g


def outer_value_yielded() -> Graph:
    g = rnn_scan()
    body_of(g).outputs[1] = g.inputs[2]
    return g


def outer_op_result_inside() -> Graph:
    """A branch reads a result of an op before the cond: still from outside."""
    g = branch()
    body_of(g, 3, 0).ops[0].operands[0] = g.ops[0].result.op.operands[0]
    then = body_of(g, 3, 0)
    then.ops[0].operands[0] = g.ops[1].result          # the constant 0.0 outside
    return g


def enclosing_block_argument_inside() -> Graph:
    """The while loop inside a cond branch inside a scan body reads the scan's block argument."""
    g = nested()
    scan_body = body_of(g)
    loop_body = scan_body.ops[3].regions[0].ops[0].regions[1]
    loop_body.ops[1].operands[0] = scan_body.inputs[0]
    return g


def op_result_inside_its_own_region() -> Graph:
    g = rnn_scan()
    body_of(g).outputs[0] = g.ops[0].results[0]
    return g


def broken_op_inside_nested_region() -> Graph:
    g = nested()
    loop_cond = body_of(g).ops[3].regions[0].ops[0].regions[0]
    loop_cond.ops[0].attrs["value"] = np.zeros(3, np.int64)     # its type says tensor<i64>
    return g


def use_before_def_inside() -> Graph:
    g = rnn_scan()
    body_of(g).ops.reverse()
    return g


def region_on_plain_op() -> Graph:
    g = Graph("f", [T(4)])
    r = region("body", T(4))
    r.outputs = list(r.inputs)
    e = g.add_op("tc.exp", [g.inputs[0]], {}, [T(4)], regions=[r])
    g.outputs = [e.result]
    return g


def yield_as_an_op() -> Graph:
    g = rnn_scan()
    body_of(g).add_op("tc.yield", [body_of(g).outputs[0]], {}, [])
    return g


def scanned_of_wrong_length() -> Graph:
    g = rnn_scan()
    g.ops[0].attrs["length"] = 4
    return g


def unknown_scan_attribute() -> Graph:
    g = rnn_scan()
    g.ops[0].attrs["unroll"] = 2
    return g


def block_argument_of_wrong_type() -> Graph:
    g = rnn_scan()
    body_of(g).inputs[3].type = T(5, 2, 3)        # the whole xs, not one row
    return g


BROKEN = {
    "wrong carry type": (wrong_carry_type, [
        "verify @cumsum: op #0 'tc.scan': tc.scan: region 'body' yields (tensor<4xf64>, tensor<4xi64>, "
        "tensor<4xf32>), expected (tensor<4xf32>, tensor<4xi64>, tensor<4xf32>)",
        "fix: ir/regions.py gives each region op's operands",
        '%0:3 = "tc.scan"(%arg0, %arg1, %arg2, %arg3) ({...}) {length = 6 : i64, num_consts = 0 : i64, '
        'num_carry = 2 : i64, reverse = true, remat = false}']),
    "wrong carry result": (wrong_carry_result, [
        "op #0 'tc.scan' at rnn.py:5: tc.scan: results (tensor<2x3xf64>, tensor<5x2x3xf32>), "
        "expected (tensor<2x3xf32>, tensor<5x2x3xf32>)"]),
    "wrong yield count": (wrong_yield_count, [
        "op #3 'tc.cond' at b.py:3: tc.cond: region 'else' yields (tensor<4xf32>, tensor<4xf32>), "
        "expected (tensor<4xf32>)",
        '%3 = "tc.cond"(%2, %arg0, %arg1) ({...}, {...}) : (tensor<i1>, tensor<4xf32>, tensor<4xf32>) '
        '-> tensor<4xf32> loc("b.py":3:0)']),
    "too few carries": (too_few_carries, [
        "tc.while_loop: region 'body' yields (tensor<i64>), expected (tensor<i64>, tensor<4xf32>)"]),
    "non-bool predicate": (non_bool_predicate, [
        "op #3 'tc.cond' at b.py:3: tc.cond: the predicate must be a 0-d bool tensor, got tensor<f32>"]),
    "non-bool while condition": (non_bool_while_condition, [
        "op #1 'tc.while_loop' at w.py:2: tc.while_loop: region 'cond' yields (tensor<i64>), "
        "expected (tensor<i1>)"]),
    "missing region": (missing_region, [
        "op #0 'tc.scan' at rnn.py:5: tc.scan holds 0 region(s), expected 1 (body)",
        '%0:2 = "tc.scan"(%arg0, %arg1, %arg2, %arg3) {length = 5 : i64']),
    "missing else": (missing_else, ["tc.cond holds 1 region(s), expected 2 (then, else)"]),
    "outer value used inside": (outer_value_inside, [
        "verify @rnn: in op #0 'tc.scan' at rnn.py:5, region 'body': op #0 'tc.matmul': operand #1 "
        "(%arg0) is defined outside the region, by the function's argument #0: regions are isolated "
        "from above",
        "expected: a block argument of the region or a result of an earlier op in it",
        "fix: pass the value in as an operand of the region op (one of its consts) and use the "
        "block argument it becomes",
        '%1 = "tc.matmul"(%b2, %arg0) : (tensor<2x3xf32>, tensor<3x3xf32>) -> tensor<2x3xf32>']),
    "outer value yielded": (outer_value_yielded, [
        "in op #0 'tc.scan' at rnn.py:5, region 'body': output #1 (%arg2) is defined outside the "
        "region, by the function's argument #2: regions are isolated from above",
        "the region's terminator:\n    \"tc.yield\"(%4, %arg2) : (tensor<2x3xf32>, tensor<2x3xf32>) -> ()"]),
    "outer op result used inside": (outer_op_result_inside, [
        "in op #3 'tc.cond' at b.py:3, region 'then': op #0 'tc.exp': operand #0 (%1) is defined "
        "outside the region, by op #1 'tc.constant': regions are isolated from above"]),
    "enclosing block argument used inside": (enclosing_block_argument_inside, [
        "in op #0 'tc.scan', region 'body', op #3 'tc.cond', region 'then', op #0 'tc.while_loop', "
        "region 'body': op #1 'tc.sub': operand #0 (%b0) is defined outside the region, by block "
        "argument #0 of the enclosing region 'body': regions are isolated from above"]),
    "op result used inside its own region": (op_result_inside_its_own_region, [
        "output #0 (%0#0) is defined outside the region, by op #0 'tc.scan' at rnn.py:5"]),
    "broken op inside a nested region": (broken_op_inside_nested_region, [
        "in op #0 'tc.scan', region 'body', op #3 'tc.cond', region 'then', op #0 'tc.while_loop', "
        "region 'cond': op #0 'tc.constant': the constant's value does not match its result type",
        "expected: tensor<i64>", "actual:   an array of shape (3,) and dtype int64",
        '%6 = "tc.constant"() {value = dense<[0, 0, 0]> : tensor<3xi64>} : () -> tensor<i64>']),
    "use before definition inside": (use_before_def_inside, [
        "in op #0 'tc.scan' at rnn.py:5, region 'body': op #0 'tc.tanh' at rnn.py:7: operand #0 is "
        "used before it is defined"]),
    "region on a plain op": (region_on_plain_op, [
        "op #0 'tc.exp': it holds 1 region(s), but only ops of kind 'region' in ops.yaml (tc.scan, "
        "tc.while_loop, tc.cond) hold regions", "expected: no regions"]),
    "tc.yield as an op": (yield_as_an_op, [
        "region 'body': op #4 'tc.yield': unknown op 'tc.yield'",
        "fix: 'tc.yield' exists only in the text, as a region's terminator"]),
    "scanned operand of the wrong length": (scanned_of_wrong_length, [
        "tc.scan: scanned operand #0 has type tensor<5x2x3xf32>, whose leading dim must be the length 4"]),
    "unknown scan attribute": (unknown_scan_attribute, ["tc.scan has unknown attribute(s) unroll"]),
    "block argument of the wrong type": (block_argument_of_wrong_type, [
        "tc.scan: region 'body' takes (tensor<3x3xf32>, tensor<3xf32>, tensor<2x3xf32>, tensor<5x2x3xf32>), "
        "expected (tensor<3x3xf32>, tensor<3xf32>, tensor<2x3xf32>, tensor<2x3xf32>)"]),
}


@pytest.mark.parametrize("name", BROKEN)
def test_broken_region_graph_message(name):
    build, fragments = BROKEN[name]
    with pytest.raises(IRError) as info:
        verify(build())
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"


def test_outer_value_read_from_text_is_refused():
    text = print_graph(rnn_scan()).replace('"tc.matmul"(%b2, %b0)', '"tc.matmul"(%b2, %arg0)')
    with pytest.raises(IRError, match=r"operand #1 \(%arg0\) is defined outside the region"):
        verify(parse_graph(text))


def test_region_contents_are_checked_after_its_interface():
    """A block argument of the wrong type is the region op's error, not its first user's."""
    with pytest.raises(IRError, match="op #0 'tc.scan' at rnn.py:5: tc.scan: region 'body' takes"):
        verify(block_argument_of_wrong_type())


def test_region_inputs_are_checked_as_inputs():
    g = rnn_scan()
    body = body_of(g)
    body.inputs[3] = body.inputs[2]            # of the same type: the signature holds
    with pytest.raises(IRError, match="in op #0 'tc.scan' at rnn.py:5, region 'body': input #3 is not a fresh"):
        verify(g)


def test_foreign_value_in_region_is_not_called_outer():
    g = rnn_scan()
    body_of(g).ops[0].operands[0] = Value(T(2, 3))
    with pytest.raises(IRError) as info:
        verify(g)
    assert "operand #0 (<Value input#0: tensor<2x3xf32>>) is not defined in this graph" in str(info.value)
    assert "outside the region" not in str(info.value)


def test_a_cond_with_constant_predicate_verifies():
    g = Graph("f", [T(4)])
    p = const(g, True, np.bool_)
    then, other = region("then", T(4)), region("else", T(4))
    then.outputs = [then.inputs[0]]
    other.outputs = [op(other, "tc.neg", [other.inputs[0]]).result]
    g.outputs = [cond(g, p, [g.inputs[0]], then, other).result]
    verify(g)
