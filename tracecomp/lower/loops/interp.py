"""A slow, obviously-correct interpreter of the loop IR on NumPy scalars.

It pins down what each loop-IR construct means (the code generators must agree with it)
and lets the scheduler be tested on every op without any code generator.  Scalars carry
their dtype as NumPy scalar types; loop indices are Python ints.
"""
from __future__ import annotations

import math

import numpy as np

from ...core import dtypes as dt
from . import ir as L


def _sign(x):
    """sign with sign(NaN) = 0 (PyTorch), bools unchanged."""
    if isinstance(x, np.bool_):
        return x
    s = np.sign(x)
    return s.dtype.type(0) if s != s else s
from .matmul import expand_matmul, flat_name, operand_dtypes

_UNARY = {
    "neg": np.negative, "abs": np.abs, "sign": _sign, "exp": np.exp, "exp2": np.exp2,
    "expm1": np.expm1, "log": np.log, "log2": np.log2, "log1p": np.log1p, "sin": np.sin,
    "cos": np.cos, "tan": np.tan, "tanh": np.tanh, "sqrt": np.sqrt, "floor": np.floor,
    "ceil": np.ceil, "round": np.round, "not": np.logical_not, "logical_not": np.logical_not,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "erf": lambda x: type(x)(math.erf(x)) if np.isfinite(x) else type(x)(np.sign(x)),
}
_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
    "pow": np.power, "maximum": np.maximum, "minimum": np.minimum, "atan2": np.arctan2,
    "floordiv": np.floor_divide, "mod": np.mod, "fmod": np.fmod, "and": np.bitwise_and,
    "or": np.bitwise_or, "xor": np.bitwise_xor, "eq": np.equal, "ne": np.not_equal, "lt": np.less,
    "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
}


def _np_type(dtype):
    return None if dtype == L.INDEX else dtype.np.type


def _typed(value, dtype):
    if dtype == L.INDEX:
        return int(value)
    if dtype is dt.BOOL:
        return np.bool_(value)
    if dtype.is_half:          # rounded as the eager kernels and the compiled code round
        return dt.cast_array(np.asarray(value), dtype.np)[()]
    return dtype.np.type(value)


class LoopInterpreter:
    def __init__(self, kernel: L.Kernel, arrays: dict[str, np.ndarray]):
        self.kernel = kernel
        self.arrays = arrays

    def run(self) -> None:
        with np.errstate(all="ignore"):
            self.block(self.kernel.body, {})

    def block(self, body: list, env: dict) -> None:
        for s in body:
            if isinstance(s, L.Let):
                env[s.name] = self.expr(s.value, env)
            elif isinstance(s, L.Store):
                self.arrays[s.buffer][tuple(self.expr(i, env) for i in s.index)] = self.expr(s.value, env)
            elif isinstance(s, L.Loop):
                for i in range(s.extent if isinstance(s.extent, int) else int(self.expr(s.extent, env))):
                    self.block(s.body, {**env, s.var: i})
            elif isinstance(s, L.Reduce):
                accs = {a.name: self.expr(a.init, env) for a in s.accumulators}
                for i in range(s.extent if isinstance(s.extent, int) else int(self.expr(s.extent, env))):
                    inner = {**env, **accs, s.var: i}
                    self.block(s.body, inner)
                    new = [self.expr(u, inner) for u in s.update]
                    accs = {a.name: _typed(v, a.dtype) for a, v in zip(s.accumulators, new)}
                env.update(accs)
            elif isinstance(s, L.Matmul):
                self.matmul(s, env)          # reads b (b_packed holds the same, packed)
            # a PackB only serves the CPU's packed kernel: nothing to do here

    def matmul(self, s: L.Matmul, env: dict) -> None:
        """Run the statement's loop expansion on flat views of its buffers."""
        for view in s.views():
            flat = self.arrays[view.buffer].reshape(-1)
            if view is s.out and flat.size and not np.shares_memory(flat, self.arrays[view.buffer]):
                raise ValueError(f"Matmul out buffer '{view.buffer}' is not contiguous")
            self.arrays[flat_name(view.buffer)] = flat
        self.block(expand_matmul(s, self.kernel.buffer(s.out.buffer).dtype,
                                 operand_dtypes=operand_dtypes(self.kernel, s)), dict(env))

    def expr(self, e: L.Expr, env: dict):
        if isinstance(e, L.Const):
            return _typed(e.value, e.dtype)
        if isinstance(e, L.Var):
            return env[e.name]
        if isinstance(e, L.GuardedLoad) and not self.expr(e.guard, env):
            return _typed(0, e.dtype)
        if isinstance(e, L.Load):
            return self.arrays[e.buffer][tuple(self.expr(i, env) for i in e.index)]
        if isinstance(e, L.Unary):
            return _typed(_UNARY[e.fn](self.expr(e.x, env)), e.dtype)
        if isinstance(e, L.Binary):
            a, b = self.expr(e.a, env), self.expr(e.b, env)
            if e.dtype == L.INDEX or (e.a.dtype == L.INDEX):
                return _index_op(e.fn, a, b)
            return _typed(_BINARY[e.fn](a, b), e.dtype)
        if isinstance(e, L.Select):
            return self.expr(e.a, env) if self.expr(e.cond, env) else self.expr(e.b, env)
        if isinstance(e, L.CheckedIndex):
            return self.checked_index(e, env)
        if isinstance(e, L.Cast):
            x = self.expr(e.x, env)
            if e.dtype == L.INDEX:
                return int(x)
            if e.dtype is dt.BOOL:
                return _typed(x != 0, e.dtype)
            return dt.cast_array(np.asarray(x), e.dtype.np)[()]
        raise TypeError(f"unknown expression {e!r}")


    def checked_index(self, e: L.CheckedIndex, env: dict) -> int:
        """The index, or, out of range, the failure recorded (loops/ir.py) and the index clamped."""
        i = self.expr(e.index, env)
        size = e.size if isinstance(e.size, int) else int(self.expr(e.size, env))
        if 0 <= i < size:
            return i
        record = self.arrays[e.buffer]
        unsigned = i % 2 ** 64
        if record[1 + 2 * e.check] == 0 or unsigned > int(record[2 + 2 * e.check]) % 2 ** 64:
            record[2 + 2 * e.check] = np.int64(np.uint64(unsigned).view(np.int64))
        record[0] = record[1 + 2 * e.check] = 1
        return min(max(i, 0), max(size - 1, 0))


def _index_op(fn: str, a: int, b: int):
    return {"add": a + b, "sub": a - b, "mul": a * b, "floordiv": a // b if b else 0,
            "mod": a % b if b else 0, "minimum": min(a, b), "maximum": max(a, b),
            "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": a != b}[fn]


def run_program(program, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Execute a scheduled Program with the interpreter (fills use the global generator)."""
    from ...core import random as tc_random
    arrays: dict[str, np.ndarray] = {}
    for name, b in program.buffers.items():
        arrays[name] = np.zeros(b.shape, b.dtype.np)
    for name, a in zip(program.inputs, inputs):
        arrays[name] = np.asarray(a)
    arrays.update(program.constants)
    for f in program.fills:
        draw = tc_random.generator().random if f.impl == "uniform" else tc_random.generator().standard_normal
        arrays[f.buffer] = draw(f.shape, dtype=f.dtype.np)
    if program.steps is None:
        for k in program.kernels:
            LoopInterpreter(k, arrays).run()
    else:
        _run_steps(program.steps, {k.name: k for k in program.kernels}, arrays)
    if program.index_errors is not None:          # a computed index out of range: raise as eagerly
        from ..schedule.index_checks import recorded_error
        err = recorded_error(program.computed_checks, arrays[program.index_errors])
        if err is not None:
            raise err
    return [arrays[name].copy() for name in program.outputs]


def _run_steps(steps: list, kernels: dict, arrays: dict) -> None:
    """Control steps (loops/control.py) on NumPy arrays: bound buffers are views (a row of
    xs or ys) or the arrays of the moment (operands, carries), set before each block runs."""
    from . import control as C

    def run(block, inputs, outputs=()):
        arrays.update(zip(block.inputs, inputs))
        arrays.update(zip(block.outputs, outputs))
        _run_steps(block.steps, kernels, arrays)

    for s in steps:
        if isinstance(s, C.Run):
            LoopInterpreter(kernels[s.kernel], arrays).run()
        elif isinstance(s, C.Scan):
            carry = [arrays[n] for n in s.init]
            for step in range(s.length):
                r = C.scan_row(s, step)
                out = C.carry_targets(s, carry, (s.length - 1 - step) % 2 == 0, arrays.__getitem__)
                run(s.body, [arrays[n] for n in s.consts] + carry + [arrays[x][r, ...] for x in s.xs],
                    out + [arrays[y][r, ...] for y in s.ys])
                carry = out
            for c, a in zip(s.carry, carry):
                if a is not arrays[c]:
                    arrays[c][...] = a
        elif isinstance(s, C.While):
            carry, parity = [arrays[n] for n in s.init], 0
            consts = [arrays[n] for n in s.consts]
            while True:
                run(s.cond, consts + carry)
                if not bool(arrays[s.cond.outputs[0]]):
                    break
                out = C.carry_targets(s, carry, not parity, arrays.__getitem__)
                run(s.body, consts + carry, out)
                carry, parity = out, 1 - parity
            for c, a in zip(s.carry, carry):
                if a is not arrays[c]:
                    arrays[c][...] = a
        else:
            block = s.then if bool(arrays[s.pred]) else s.orelse
            run(block, [arrays[n] for n in s.operands], [arrays[n] for n in s.results])
