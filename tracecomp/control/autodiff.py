"""Gradients of region ops: the Autograd and ForwardAD rules of tc.scan, tc.while_loop, tc.cond.

Reverse mode of a scan (JAX's approach, with tracecomp's own engine): the body is
evaluated once more under autograd in a forward region F, and the engine's backward
pass from F's outputs is traced into a backward region B.  Every value of F that B reads
(a residual: the carry at the step's start, an activation a formula saved) becomes an
extra y of F, stacked over the steps by the forward scan; B scans them in the other
direction, its carry the carries' cotangents plus running sums of the consts' gradients.
B reads consts and xs directly, never stacked copies.  The backward is itself a scan
bound through the keys, so grad of grad works the same way; there the residuals' own
dependence on the operands matters too, so a backward run with create_graph computes
them again under autograd (only then: a first-order gradient reuses the forward's).
A cond's backward is a cond over the branches' VJPs, which evaluate the chosen branch
again (a checkpoint: it keeps no residuals).  A while_loop has no reverse mode (its trip
count is unknown when the forward is traced): the error says to bound it, as JAX's does.
Forward mode (jvp) of all three: the region op on primals and tangents together, its
regions the jvp of the old ones.
"""
from __future__ import annotations

from ..autograd.backward import gradient_edge, run_backward
from ..autograd.grad_mode import enable_grad, is_grad_enabled
from ..autograd.kernels import primal
from ..autograd.node import AutogradError, Node
from ..core.locations import user_location
from ..dispatch import api as tc
from ..dispatch.batching import top_level
from ..dispatch.dispatcher import DispatchKey, level_of
from ..dispatch.tracer import RegionTrace, current
from ..autograd.functional import jvp
from ..ir import Graph
from ..ir import regions as R
from .primitives import bind, eval_graph, rule, share_captures, trace_region

AUTOGRAD, FORWARD = DispatchKey.Autograd, DispatchKey.ForwardAD


def _zeros(t):
    return tc.zeros(tuple(t.shape), dtype=t.dtype)


def _floating(t) -> bool:
    return t.dtype.is_floating_point


class RegionBackward(Node):
    """The backward of one region op: `backward(grads)` binds the op of its VJP."""

    def __init__(self, op_name: str, edges: list, num_outputs: int, backward):
        ctx = current()
        super().__init__(edges, num_outputs, ctx.location() if ctx is not None else user_location())
        self.op_name = op_name
        self._backward = backward
        # the operands with their tangents, when the op ran below a jvp (forward over reverse):
        # the backward runs on these, so its results carry tangents (autograd/kernels.py's
        # _save_duals does the same for formula nodes)
        self.duals = None

    def name(self) -> str:
        return {R.SCAN: "ScanBackward0", R.COND: "CondBackward0"}.get(self.op_name, "RegionBackward0")

    @property
    def source_op(self) -> str:
        return self.op_name

    def apply(self, grads: list) -> list:
        if self._backward is None:
            raise AutogradError(f"trying to backward through {self.name()} a second time; pass "
                                "retain_graph=True to the first backward() if you need to")
        return self._backward(grads)

    def release(self) -> None:
        self._backward = None


def _attach(node: Node, results: list) -> None:
    for i, out in enumerate(results):
        if _floating(out):
            out.requires_grad = True
            out.grad_fn = node
            out._output_nr = i


def _wants(operands: list) -> list[bool]:
    top = top_level({"operands": operands})
    return [t.requires_grad and level_of(t) == top and _floating(t) for t in operands]


# ---------------------------------------------------------------- scan, reverse mode

@rule(R.SCAN, AUTOGRAD)
def _scan_vjp(name, operands, attrs, regions):
    wants = _wants(operands)
    if not any(wants):
        return bind(name, operands, attrs, regions, below=AUTOGRAD)
    body, = regions
    k, c, length = attrs["num_consts"], attrs["num_carry"], attrs["length"]
    consts, init, xs = operands[:k], operands[k:k + c], operands[k + c:]
    types = [v.type for v in body.inputs]
    # which block arguments the backward differentiates: wanted consts and xs, every float carry
    arg_diff = wants[:k] + [_floating(t) for t in init] + wants[k + c:]
    y_types = [v.type for v in body.outputs[c:]]
    carry_ct = [i for i in range(c) if _floating(init[i])]
    y_ct = [j for j, t in enumerate(y_types) if t.dtype.is_floating_point]
    summed = [i for i in range(k) if wants[i]]
    declared = [init[i]._type for i in carry_ct] + [consts[i]._type for i in summed] + [y_types[j] for j in y_ct]
    n_carry = len(carry_ct) + len(summed)

    def step_vjp(ctx, cts: list, args: list, outs: list) -> list:
        """One step's backward, recorded in `ctx`: the new carry cotangents, the running sums
        of the consts' gradients, and the xs' gradients, from the outputs' cotangents."""
        ct_carry, sums, ct_y = cts[:len(carry_ct)], cts[len(carry_ct):n_carry], cts[n_carry:]
        pairs = [(outs[i], g) for i, g in zip(carry_ct, ct_carry)] + [(outs[c + j], g) for j, g in zip(y_ct, ct_y)]
        pairs = [(o, g) for o, g in pairs if o.requires_grad]
        targets = [i for i, d in enumerate(arg_diff) if d]
        grads = run_backward([o for o, _ in pairs], [g for _, g in pairs], True, False,
                             [args[i] for i in targets]) if pairs else [None] * len(targets)
        grad_of = dict(zip(targets, grads))

        def grad(i):
            g = grad_of.get(i)
            return g if g is not None else _zeros(args[i])
        new = [grad(k + i) for i in carry_ct]
        new += [s + grad_of[i] if grad_of.get(i) is not None else s for s, i in zip(sums, summed)]
        new += [grad(k + c + j) for j in range(len(xs)) if wants[k + c + j]]
        return [ctx.value_of(t) for t in new]

    def differentiable(ctx, values) -> list:
        args = [ctx.wrap(v) for v in values]
        for a, d in zip(args, arg_diff):
            a.requires_grad = d
        return args

    backward = Graph("backward", declared)
    bctx = RegionTrace(backward)
    if attrs.get("remat"):
        # the step's forward runs again inside the backward, from the carry it started with:
        # the forward stacks only the carries (the body, yielding its carry inputs too)
        forward = Graph("forward", [])
        forward.inputs, forward.ops = list(body.inputs), list(body.ops)
        forward.outputs = list(body.outputs) + list(body.inputs[k:k + c])
        f_captured, fctx, residuals = [], None, list(range(c))
        with bctx, enable_grad():
            cts = [bctx.wrap(v) for v in backward.inputs]
            own = [backward.add_input(t) for t in types]
            args = differentiable(bctx, own)
            backward.outputs = step_vjp(bctx, cts, args, eval_graph(body, args))
        # B's own arguments: consts and xs read directly, the carries as the stacked residuals
        sources = [(v, i if i < k or i >= k + c else ("residual", i - k)) for i, v in enumerate(own)]
    else:
        forward = Graph("forward", types)
        fctx = RegionTrace(forward)
        with fctx, enable_grad():
            args = differentiable(fctx, forward.inputs)
            outs = eval_graph(body, args)
            out_values = [fctx.value_of(o) for o in outs]
        with bctx:
            backward.outputs = step_vjp(bctx, [bctx.wrap(v) for v in backward.inputs], args, outs)
        sources, residuals = [], []
        f_captured = fctx.captured
    # sort B's captures: consts and xs are read directly, F's other values are residuals
    # (an int: that operand; a tensor: itself; ("residual", r): stacked residual r)
    position = {id(a): i for i, a in enumerate(args)}
    for t, v in zip(bctx.captured, backward.inputs[len(declared) + (len(types) if attrs.get("remat") else 0):]):
        i = position.get(id(t))
        if i is not None and (i < k or i >= k + c):
            sources.append((v, i))
        elif fctx is not None and t._trace is fctx:
            sources.append((v, ("residual", len(residuals))))
            residuals.append(t)
        else:
            sources.append((v, t))
    rows = [(v, src) for v, src in sources if isinstance(src, tuple) or (isinstance(src, int) and src >= k + c)]
    b_consts = [(v, src) for v, src in sources if not any(v is r for r, _ in rows)]
    backward.inputs = ([v for v, _ in b_consts] + backward.inputs[:n_carry] + [v for v, _ in rows]
                       + backward.inputs[n_carry:len(declared)])
    b_consts, rows = [src for _, src in b_consts], [src for _, src in rows]

    if fctx is not None:
        forward.inputs = forward.inputs[len(types):] + forward.inputs[:len(types)]
        forward.outputs = out_values + [fctx.value_of(t) for t in residuals]
    f_attrs = dict(attrs, num_consts=len(f_captured) + k)
    results = bind(name, f_captured + list(operands), f_attrs, [forward], below=AUTOGRAD)
    n_out = c + len(y_types)
    stacks, results = results[n_out:], results[:n_out]

    def scan_backward(grads: list) -> list:
        ops = node.duals if node.duals is not None else operands
        residual = stacks
        if is_grad_enabled() or node.duals is not None:
            # differentiated again (create_graph), or along tangents (forward over reverse):
            # the residuals' own dependence on the operands counts, so the forward runs again
            # with every key this time
            residual = bind(name, f_captured + list(ops), f_attrs, [forward])[n_out:]
        b_rows = [residual[r[1]] if isinstance(r, tuple) else ops[r] for r in rows]
        b_ops = [ops[r] if isinstance(r, int) else r for r in b_consts]
        ct_final = [grads[i] if grads[i] is not None else _zeros(init[i]) for i in carry_ct]
        ct_ys = [grads[c + j] if grads[c + j] is not None else _zeros(results[c + j]) for j in y_ct]
        b_attrs = dict(attrs, length=length, num_consts=len(b_consts), num_carry=n_carry,
                       reverse=not attrs.get("reverse", False))
        out = bind(name, b_ops + ct_final + [_zeros(consts[i]) for i in summed] + b_rows + ct_ys,
                   b_attrs, [backward])
        per_operand = [None] * len(operands)
        for i, g in zip(carry_ct, out[:len(carry_ct)]):
            per_operand[k + i] = g if wants[k + i] else None
        for i, g in zip(summed, out[len(carry_ct):n_carry]):
            per_operand[i] = g
        for j, g in zip([j for j in range(len(xs)) if wants[k + c + j]], out[n_carry:]):
            per_operand[k + c + j] = g
        return per_operand

    edges = [gradient_edge(t) if w else None for t, w in zip(operands, wants)]
    node = RegionBackward(name, edges, len(results), scan_backward)
    _attach(node, results)
    return results


# ---------------------------------------------------------------- while_loop and cond, reverse mode

@rule(R.WHILE, AUTOGRAD)
def _while_vjp(name, operands, attrs, regions):
    if any(_wants(operands)):
        raise AutogradError(
            "reverse-mode differentiation does not work through tc.while_loop: its trip count is "
            "only known when it runs, so the steps to save are unknown. Use tc.fori_loop with int "
            "bounds or tc.scan with a length (a bound on the steps), or forward mode (tc.jvp)")
    return bind(name, operands, attrs, regions, below=AUTOGRAD)


@rule(R.COND, AUTOGRAD)
def _cond_vjp(name, operands, attrs, regions):
    wants = _wants(operands)
    results = bind(name, operands, attrs, regions, below=AUTOGRAD)
    if not any(wants):
        return results
    diff = [i for i, w in enumerate(wants[1:]) if w]
    out_ct = [j for j, r in enumerate(results) if _floating(r)]

    def cond_backward(grads: list) -> list:
        pred, ops = (node.duals or operands)[0], (node.duals or operands)[1:]
        cts = [grads[j] if grads[j] is not None else _zeros(results[j]) for j in out_ct]

        def branch_vjp(region):
            def fn(*a):
                xs, gs = list(a[:len(ops)]), a[len(ops):]
                with enable_grad():
                    for i in diff:
                        xs[i].requires_grad = True
                    outs = eval_graph(region, xs)
                    pairs = [(outs[j], g) for j, g in zip(out_ct, gs) if outs[j].requires_grad]
                    got = run_backward([o for o, _ in pairs], [g for _, g in pairs], True, False,
                                       [xs[i] for i in diff]) if pairs else [None] * len(diff)
                return [g if g is not None else _zeros(xs[i]) for g, i in zip(got, diff)]
            return fn

        types = [t._type for t in ops] + [t._type for t in cts]
        branches = [trace_region(branch_vjp(r), types, label) for r, label in zip(regions, ("then", "else"))]
        consts = share_captures(branches)
        out = bind(name, [pred] + consts + list(ops) + cts, {}, [r.graph for r in branches])
        per_operand = [None] * len(operands)
        for i, g in zip(diff, out):
            per_operand[1 + i] = g
        return per_operand

    edges = [gradient_edge(t) if w else None for t, w in zip(operands, wants)]
    node = RegionBackward(name, edges, len(results), cond_backward)
    _attach(node, results)
    return results


# ---------------------------------------------------------------- forward mode

def _save_duals(results: list, duals: list) -> None:
    """The node that the op bound below ForwardAD got (if any) runs its backward on `duals`,
    the same operands with their tangents."""
    for r in results:
        if isinstance(r.grad_fn, RegionBackward):
            r.grad_fn.duals = duals
            return

def _tangents(operands):
    top = top_level({"operands": operands})
    has = [t._tangent is not None and level_of(t) == top for t in operands]
    primals = [primal(t) if level_of(t) == top else t for t in operands]
    return has, primals, [t._tangent if h else None for t, h in zip(operands, has)]


def _jvp_of(region: Graph, args: list, tangents: dict) -> tuple[list, list]:
    """The region's outputs and their tangents at `args`, given the tangents of some of its
    float arguments (the others' are zero)."""
    floats = [p for p, a in enumerate(args) if _floating(a)]

    def f(*values):
        full = list(args)
        for p, v in zip(floats, values):
            full[p] = v
        return eval_graph(region, full)
    outs, touts = jvp(f, [args[p] for p in floats],
                      [tangents[p] if p in tangents else _zeros(args[p]) for p in floats])
    return list(outs), list(touts)


@rule(R.SCAN, FORWARD)
def _scan_jvp(name, operands, attrs, regions):
    has, primals, tangents = _tangents(operands)
    if not any(has):
        return bind(name, operands, attrs, regions, below=FORWARD)
    body, = regions
    k, c = attrs["num_consts"], attrs["num_carry"]
    consts, init, xs = primals[:k], primals[k:k + c], primals[k + c:]
    t_consts = [i for i in range(k) if has[i]]
    t_carry = [i for i in range(c) if _floating(init[i])]
    t_xs = [j for j in range(len(xs)) if has[k + c + j]]
    body_types = [v.type for v in body.inputs]
    row_types = body_types[k + c:]
    types = (body_types[:k] + [body_types[i] for i in t_consts] + body_types[k:k + c]
             + [body_types[k + i] for i in t_carry] + row_types + [row_types[j] for j in t_xs])
    n_y = len(body.outputs) - c

    def jvp_body(*a):
        at = 0
        def take(n):
            nonlocal at
            at += n
            return list(a[at - n:at])
        cs, tcs, carry, tcarry, rows, trows = take(k), take(len(t_consts)), take(c), take(len(t_carry)), take(len(xs)), take(len(t_xs))
        tan = dict(zip(t_consts, tcs))
        tan.update(zip([k + i for i in t_carry], tcarry))
        tan.update(zip([k + c + j for j in t_xs], trows))
        outs, touts = _jvp_of(body, cs + carry + rows, tan)
        y_float = [j for j in range(n_y) if _floating(outs[c + j])]
        return (outs[:c] + [touts[i] for i in t_carry] + outs[c:] + [touts[c + j] for j in y_float])

    region = trace_region(jvp_body, types, "body")
    t_ops = ([tangents[i] for i in t_consts], [tangents[k + i] if has[k + i] else _zeros(init[i]) for i in t_carry],
             [tangents[k + c + j] for j in t_xs])

    def joined(cs, carry, rows):
        return region.captured + cs + t_ops[0] + carry + t_ops[1] + rows + t_ops[2]
    j_attrs = dict(attrs, num_consts=len(region.captured) + k + len(t_consts), num_carry=c + len(t_carry))
    out = bind(name, joined(consts, init, xs), j_attrs, [region.graph], below=FORWARD)
    _save_duals(out, joined(operands[:k], operands[k:k + c], operands[k + c:]))
    carry, carry_t = out[:c], out[c:c + len(t_carry)]
    ys, ys_t = out[c + len(t_carry):c + len(t_carry) + n_y], out[c + len(t_carry) + n_y:]
    for i, t in zip(t_carry, carry_t):
        carry[i]._tangent = t
    for y, t in zip([y for y in ys if _floating(y)], ys_t):
        y._tangent = t
    return carry + ys


@rule(R.WHILE, FORWARD)
def _while_jvp(name, operands, attrs, regions):
    has, primals, tangents = _tangents(operands)
    if not any(has):
        return bind(name, operands, attrs, regions, below=FORWARD)
    cond_region, body = regions
    k = attrs["num_consts"]
    consts, init = primals[:k], primals[k:]
    c = len(init)
    t_consts = [i for i in range(k) if has[i]]
    t_carry = [i for i in range(c) if _floating(init[i])]
    ts = [v.type for v in body.inputs]
    types = ts[:k] + [ts[i] for i in t_consts] + ts[k:] + [ts[k + i] for i in t_carry]

    def split(a):
        cs, tcs = list(a[:k]), list(a[k:k + len(t_consts)])
        carry, tcarry = list(a[k + len(t_consts):k + len(t_consts) + c]), list(a[k + len(t_consts) + c:])
        return cs, tcs, carry, tcarry

    def jvp_cond(*a):
        cs, _, carry, _ = split(a)
        return eval_graph(cond_region, cs + carry)

    def jvp_body(*a):
        cs, tcs, carry, tcarry = split(a)
        tan = dict(zip(t_consts, tcs))
        tan.update(zip([k + i for i in t_carry], tcarry))
        outs, touts = _jvp_of(body, cs + carry, tan)
        return outs + [touts[i] for i in t_carry]

    regions2 = [trace_region(jvp_cond, types, "cond"), trace_region(jvp_body, types, "body")]
    captured = share_captures(regions2)
    ops = (captured + consts + [tangents[i] for i in t_consts] + init
           + [tangents[k + i] if has[k + i] else _zeros(init[i]) for i in t_carry])
    out = bind(name, ops, {"num_consts": len(captured) + k + len(t_consts)}, [r.graph for r in regions2],
               below=FORWARD)
    carry = out[:c]
    for i, t in zip(t_carry, out[c:]):
        carry[i]._tangent = t
    return carry


@rule(R.COND, FORWARD)
def _cond_jvp(name, operands, attrs, regions):
    has, primals, tangents = _tangents(operands)
    if not any(has[1:]):
        return bind(name, operands, attrs, regions, below=FORWARD)
    pred, ops = primals[0], primals[1:]
    t_ops = [i for i in range(len(ops)) if has[1 + i]]
    types = [t._type for t in ops] + [ops[i]._type for i in t_ops]
    n_out = len(regions[0].outputs)

    def branch(region):
        def fn(*a):
            xs, ts = list(a[:len(ops)]), a[len(ops):]
            outs, touts = _jvp_of(region, xs, dict(zip(t_ops, ts)))
            return outs + [touts[j] for j in range(n_out) if _floating(outs[j])]
        return fn

    branches = [trace_region(branch(r), types, label) for r, label in zip(regions, ("then", "else"))]
    captured = share_captures(branches)
    out = bind(name, [pred] + captured + list(ops) + [tangents[1 + i] for i in t_ops], {},
               [r.graph for r in branches], below=FORWARD)
    _save_duals(out, [operands[0]] + captured + list(operands[1:]) + [tangents[1 + i] for i in t_ops])
    results, touts = out[:n_out], out[n_out:]
    for r, t in zip([r for r in results if _floating(r)], touts):
        r._tangent = t
    return results
