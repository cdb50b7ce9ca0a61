"""Graphs with regions (tc.scan, tc.while_loop, tc.cond) built by hand, shared by the
text, verifier and pass tests of tests/ir; every graph here verifies, and `inputs_for`
draws random inputs for running one with the interpreter."""
from __future__ import annotations

import numpy as np

from tracecomp.core.dtypes import DType
from tracecomp.ir import Graph, Location, TensorType
from tracecomp.ir import regions as R
from tracecomp.ir.graph import Op, Value
from tracecomp.ops import rules
from tracecomp.ops.table import by_ir_name

F32, F64, I64, BOOL = DType.float32, DType.float64, DType.int64, DType.bool


def T(*shape_and_dtype) -> TensorType:
    """T(4, 3) is tensor<4x3xf32>; T(4, I64) names the dtype."""
    if shape_and_dtype and isinstance(shape_and_dtype[-1], DType):
        *shape, dtype = shape_and_dtype
    else:
        shape, dtype = shape_and_dtype, F32
    return TensorType(tuple(shape), dtype)


def op(g: Graph, name: str, operands: list[Value], loc: Location | None = None, **attrs) -> Op:
    """Add an ops.yaml op, its result types from the shape rule (as the tracer does)."""
    opdef = by_ir_name()[name]
    types = rules.infer(opdef, opdef.arguments_from([v.type for v in operands], attrs))
    return g.add_op(name, operands, attrs, types, loc)


def const(g: Graph, value, dtype=np.float32) -> Value:
    array = np.asarray(value, dtype)
    dt = {np.dtype(d.np): d for d in DType}[array.dtype]
    return g.add_op("tc.constant", [], {"value": array}, [TensorType(array.shape, dt)]).result


def region(name: str, *types: TensorType) -> Graph:
    return Graph(name, types)


def scan(g: Graph, consts, init, xs, body: Graph, reverse: bool = False, loc=None,
         length: int | None = None) -> Op:
    operands = [*consts, *init, *xs]
    attrs = {"length": xs[0].type.shape[0] if length is None else length,
             "num_consts": len(consts), "num_carry": len(init), "reverse": reverse,
             "remat": False}
    sig = R.signature(R.SCAN, [v.type for v in operands], attrs, [[v.type for v in body.outputs]])
    return g.add_op(R.SCAN, operands, attrs, list(sig.results), loc, [body])


def while_loop(g: Graph, consts, init, cond: Graph, body: Graph, loc=None) -> Op:
    operands = [*consts, *init]
    return g.add_op(R.WHILE, operands, {"num_consts": len(consts)}, [v.type for v in init], loc,
                    [cond, body])


def cond(g: Graph, pred: Value, operands, then: Graph, other: Graph, loc=None) -> Op:
    return g.add_op(R.COND, [pred, *operands], {}, [v.type for v in then.outputs], loc, [then, other])


# ---------------------------------------------------------------- the graphs

def rnn_scan() -> Graph:
    """h = tanh(h @ W + x + b) over 5 steps; results the last h and every h."""
    g = Graph("rnn", [T(3, 3), T(3), T(2, 3), T(5, 2, 3)])
    w, b, h0, xs = g.inputs
    body = region("body", T(3, 3), T(3), T(2, 3), T(2, 3))
    bw, bb, h, x = body.inputs
    hw = op(body, "tc.matmul", [h, bw])
    s = op(body, "tc.add", [hw.result, x], alpha=1)
    s = op(body, "tc.add", [s.result, bb], alpha=1)
    hn = op(body, "tc.tanh", [s.result], Location("rnn.py", 7, 9))
    body.outputs = [hn.result, hn.result]
    loop = scan(g, [w, b], [h0], [xs], body, loc=Location("rnn.py", 5, 1))
    g.outputs = list(loop.results)
    return g


def reverse_cumsum() -> Graph:
    """A reversed scan with two carries, no consts and two scanned inputs."""
    g = Graph("cumsum", [T(4), T(4, I64), T(6, 4), T(6, 4, I64)])
    a0, n0, xs, ks = g.inputs
    body = region("step", T(4), T(4, I64), T(4), T(4, I64))
    a, n, x, k = body.inputs
    a2 = op(body, "tc.add", [a, x], alpha=1)
    n2 = op(body, "tc.add", [n, k], alpha=1)
    body.outputs = [a2.result, n2.result, a2.result]
    loop = scan(g, [], [a0, n0], [xs, ks], body, reverse=True)
    g.outputs = list(loop.results)
    return g


def doubling_while() -> Graph:
    """while i < limit: (i + 1, acc * 2 + c)."""
    g = Graph("doubling", [T(I64), T(4), T(4)])
    limit, acc0, c = g.inputs
    zero = const(g, 0, np.int64)
    cnd = region("cond", T(I64), T(4), T(I64), T(4))
    climit, _, ci, _ = cnd.inputs
    cnd.outputs = [op(cnd, "tc.lt", [ci, climit]).result]
    body = region("body", T(I64), T(4), T(I64), T(4))
    _, bc, i, acc = body.inputs
    one = const(body, 1, np.int64)
    two = const(body, 2.0)
    i2 = op(body, "tc.add", [i, one], alpha=1)
    acc2 = op(body, "tc.add", [op(body, "tc.mul", [acc, two]).result, bc], alpha=1)
    body.outputs = [i2.result, acc2.result]
    loop = while_loop(g, [limit, c], [zero, acc0], cnd, body, loc=Location("w.py", 2, 5))
    g.outputs = list(loop.results)
    return g


def branch() -> Graph:
    """exp(x) if sum(x) > 0 else -x * y."""
    g = Graph("branch", [T(4), T(4)])
    x, y = g.inputs
    total = op(g, "tc.sum", [x], dim=None, keepdim=False, dtype=None)
    pred = op(g, "tc.gt", [total.result, const(g, 0.0)])
    then = region("then", T(4), T(4))
    then.outputs = [op(then, "tc.exp", [then.inputs[0]]).result]
    other = region("else", T(4), T(4))
    neg = op(other, "tc.neg", [other.inputs[0]])
    other.outputs = [op(other, "tc.mul", [neg.result, other.inputs[1]]).result]
    c = cond(g, pred.result, [x, y], then, other, loc=Location("b.py", 3))
    g.outputs = [c.result]
    return g


def nested() -> Graph:
    """A scan whose body holds a cond whose 'then' branch holds a while loop."""
    g = Graph("nested", [T(4), T(3, 4), T(I64)])
    s0, xs, n = g.inputs
    body = region("body", T(I64), T(4), T(4))
    bn, s, x = body.inputs
    pred = op(body, "tc.gt", [op(body, "tc.sum", [x], dim=None, keepdim=False, dtype=None).result,
                              const(body, 0.0)])
    then = region("then", T(I64), T(4), T(4))
    tn, ts, tx = then.inputs
    wc = region("cond", T(I64), T(4))
    wc.outputs = [op(wc, "tc.gt", [wc.inputs[0], const(wc, 0, np.int64)]).result]
    wb = region("body", T(I64), T(4))
    k, acc = wb.inputs
    wb.outputs = [op(wb, "tc.sub", [k, const(wb, 1, np.int64)], alpha=1).result,
                  op(wb, "tc.mul", [acc, const(wb, 0.5)]).result]
    loop = while_loop(then, [], [tn, tx], wc, wb)
    then.outputs = [op(then, "tc.add", [ts, loop.results[1]], alpha=1).result]
    other = region("else", T(I64), T(4), T(4))
    other.outputs = [op(other, "tc.sub", [other.inputs[1], other.inputs[2]], alpha=1).result]
    c = cond(body, pred.result, [bn, s, x], then, other)
    body.outputs = [c.result, op(body, "tc.exp", [c.result]).result]
    loop = scan(g, [n], [s0], [xs], body)
    g.outputs = list(loop.results)
    return g


def empty_regions() -> Graph:
    """A cond whose branches take nothing and yield nothing, and one passing values through."""
    g = Graph("empty", [T(BOOL), T(2)])
    p, x = g.inputs
    cond(g, p, [], region("then"), region("else"))
    then, other = region("then", T(2)), region("else", T(2))
    then.outputs, other.outputs = [then.inputs[0]], [other.inputs[0]]
    c = cond(g, p, [x], then, other)
    g.outputs = [c.result]
    return g


GRAPHS = [rnn_scan, reverse_cumsum, doubling_while, branch, nested, empty_regions]


def inputs_for(graph: Graph, rng: np.random.Generator) -> list[np.ndarray]:
    """Random inputs of the graph's input types (small ints: loop counts stay short)."""
    out = []
    for v in graph.inputs:
        dtype = v.type.dtype.np
        if dtype.kind == "f":
            out.append(rng.standard_normal(v.type.shape).astype(dtype))
        elif dtype.kind == "b":
            out.append(rng.random(v.type.shape) < 0.5)
        else:
            out.append(rng.integers(0, 6, v.type.shape).astype(dtype))
    return out
