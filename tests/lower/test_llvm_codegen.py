"""The LLVM code generator: hand-built loop-IR kernels, compiled with the JIT and called
through ctypes on 64-byte aligned NumPy arrays, against NumPy.

Every Unary/Binary fn runs on every dtype kind loops_check says it is defined for (the
contract), on small arrays with special values (±0, ±inf, NaN, INT_MIN, ...); every cast;
elementwise, broadcast, transposed and dynamically sized loop nests; reductions (row sums,
argmax with two accumulators, a 2**24-term float32 sum against float64); parallel loops;
and the optimized IR: vectorized elementwise loops, GOMP_parallel in parallel kernels.
"""
from __future__ import annotations

import ctypes
import math
import re

import numpy as np
import pytest

from tracecomp.core.dtypes import DType
from tracecomp.core.errors import BackendError
from tracecomp.lower.llvm import scalar as llvm_scalar
from tracecomp.lower.llvm.codegen import BUFFER_ALIGN, codegen_kernels
from tracecomp.lower.loops.ir import (INDEX, Accumulator, Binary, Buffer, Cast, Const, Kernel, Let,
                                   Load, Loop, Reduce, Select, Store, Unary, Var)
from tracecomp.lower.loops.check import BINARY_KINDS, UNARY_KINDS, check_kernel
from tracecomp.runtime import jit
from tracecomp.lower.llvm import target

F32, F64, I32, I64, BOOL = DType.float32, DType.float64, DType.int32, DType.int64, DType.bool
KIND_DTYPES = {"f": (F32, F64), "i": (I32, I64), "b": (BOOL,)}
i, j, r = Var("i", INDEX), Var("j", INDEX), Var("r", INDEX)


# ---------------------------------------------------------------- helpers

def aligned(values, dtype) -> np.ndarray:
    """A copy of `values` in a 64-byte aligned buffer: over-allocate, slice at the boundary."""
    values = np.asarray(values, dtype=dtype)
    raw = np.empty(values.nbytes + BUFFER_ALIGN, np.uint8)
    start = (-raw.ctypes.data) % BUFFER_ALIGN
    out = raw[start:start + values.nbytes].view(values.dtype).reshape(values.shape)
    out[...] = values
    return out


def compile_kernels(kernels: list[Kernel]) -> jit.JitLibrary:
    for k in kernels:
        check_kernel(k)
    return jit.compile_module(codegen_kernels(kernels, "test"))


def run(lib: jit.JitLibrary, kernel: Kernel, arrays: dict[str, np.ndarray], sizes=()) -> None:
    for b in kernel.buffers:
        a = arrays[b.name]
        assert a.size == 0 or a.ctypes.data % BUFFER_ALIGN == 0
        assert a.dtype == b.dtype.np and a.flags.c_contiguous
    argtypes = [ctypes.c_void_p] * len(kernel.buffers) + [ctypes.c_int64] * len(kernel.sizes)
    fn = lib.function(kernel.name, None, *argtypes)
    fn(*[arrays[b.name].ctypes.data for b in kernel.buffers], *sizes)


def map_kernel(name: str, dtypes: list[DType], out: DType, n, body) -> Kernel:
    """y[i] = body(x0[i], x1[i], ...) over n elements (n an int, or the name of a size)."""
    sizes, n = size_of(n)
    ins = [Buffer(f"x{k}", t, (n,), "input") for k, t in enumerate(dtypes)]
    loads = [Load(b.name, (i,), b.dtype) for b in ins]
    return Kernel(name, ins + [Buffer("y", out, (n,), "output")],
                  [Loop("i", n, [Store("y", (i,), body(*loads))])], sizes)


def size_of(*dims):
    """(the size parameters, the dims as the loop IR takes them): a name becomes an index Var."""
    sizes = [d for d in dims if isinstance(d, str)]
    out = tuple(Var(d, INDEX) if isinstance(d, str) else d for d in dims)
    return (sizes, *out)


def optimized_ir(kernels: list[Kernel]) -> str:
    module = jit.as_module_ref(codegen_kernels(kernels, "test"))
    return str(target.optimize(module, target.host_target_machine()))


# ---------------------------------------------------------------- values and references

FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1.5, 2.5, -2.5, 3.7, -3.7, 7.0, -7.0, 0.1, 1e-3, 30.0,
          -30.0, 100.0, math.inf, -math.inf, math.nan]
INTS = {I32: [0, 1, -1, 2, -2, 3, -3, 7, -7, 100, -100, 2**31 - 1, -2**31],
        I64: [0, 1, -1, 2, -2, 3, -3, 7, -7, 100, -100, 2**63 - 1, -2**63]}
TRANSCENDENTAL = ("exp", "exp2", "expm1", "log", "log2", "log1p", "sin", "cos", "tan", "tanh",
                  "erf", "pow", "atan2")


def _wrap(values, dtype: DType) -> np.ndarray:
    bits = 8 * dtype.itemsize
    return np.array([(v + 2 ** (bits - 1)) % 2 ** bits - 2 ** (bits - 1) for v in values], dtype.np)


def _int_div(x, y, dtype):
    def div(a, b):
        if b == 0:
            return 0
        q = abs(a) // abs(b)
        return q if (a < 0) == (b < 0) else -q
    return _wrap([div(int(a), int(b)) for a, b in zip(x, y)], dtype)


def _int_pow(x, y, dtype):
    def power(a, b):
        if b < 0:
            return 1 if a == 1 else (-1) ** (-b) if a == -1 else 0
        return pow(a, b, 2 ** (8 * dtype.itemsize))
    return _wrap([power(int(a), int(b)) for a, b in zip(x, y)], dtype)


UNARY_REF = {
    "neg": np.negative, "abs": np.abs, "sign": lambda x: np.where(np.isnan(x), 0, np.sign(x)).astype(x.dtype),
    "exp": np.exp, "exp2": np.exp2,
    "expm1": np.expm1, "log": np.log, "log2": np.log2, "log1p": np.log1p, "sin": np.sin,
    "cos": np.cos, "tan": np.tan, "tanh": np.tanh, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "floor": np.floor, "ceil": np.ceil, "round": np.round, "not": np.logical_not,
    "logical_not": np.logical_not,
    "erf": np.vectorize(lambda v: math.erf(v) if not math.isnan(v) else v, otypes=[np.float64]),
}
BINARY_REF = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum, "atan2": np.arctan2, "floordiv": np.floor_divide,
    "mod": np.remainder, "fmod": np.fmod, "and": np.bitwise_and, "or": np.bitwise_or,
    "xor": np.bitwise_xor,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal,
}


def unary_reference(fn: str, x: np.ndarray, t: DType) -> np.ndarray:
    if t is BOOL and fn == "sign":
        return x
    with np.errstate(all="ignore"):
        return np.asarray(UNARY_REF[fn](x.astype(np.float64) if fn == "erf" else x)).astype(t.np)


def binary_reference(fn: str, x: np.ndarray, y: np.ndarray, t: DType) -> np.ndarray:
    if t in (I32, I64) and fn == "div":
        return _int_div(x, y, t)
    if t in (I32, I64) and fn == "pow":
        return _int_pow(x, y, t)
    with np.errstate(all="ignore"):
        out = BINARY_REF[fn](x, y)
    return np.asarray(out).astype(BOOL.np if fn in ("eq", "ne", "lt", "le", "gt", "ge") else t.np)


def unary_inputs(fn: str, t: DType) -> np.ndarray:
    if t is BOOL:
        return np.array([False, True, True, False])
    if t in (I32, I64):
        return np.array(INTS[t], t.np)
    return np.array(FLOATS, t.np)


def binary_inputs(fn: str, t: DType) -> tuple[np.ndarray, np.ndarray]:
    if t is BOOL:
        base = [False, True]
    elif t in (I32, I64):
        base = INTS[t] if fn != "pow" else [0, 1, -1, 2, -2, 3, 7, -7]
    else:
        base = FLOATS
    x, y = np.meshgrid(np.array(base, t.np), np.array(base, t.np), indexing="ij")
    if fn == "pow" and t in (I32, I64):
        y = np.tile(np.array([0, 1, 2, 3, 5, 31, -1, -2], t.np), (len(base), 1))
    return x.ravel(), y.ravel()


def _tolerance(fn: str, t: DType) -> dict:
    if fn in TRANSCENDENTAL or fn in ("sqrt", "rsqrt"):
        return dict(rtol=2e-6 if t is F32 else 1e-13, atol=1e-30)
    return {}


def _check(got: np.ndarray, want: np.ndarray, fn: str, t: DType, x, y=None) -> None:
    tol = _tolerance(fn, t)
    where = f"{fn} on {t.label}: inputs {x}" + ("" if y is None else f", {y}")
    if tol and got.dtype.kind == "f":
        np.testing.assert_allclose(got, want, equal_nan=True, err_msg=where, **tol)
    else:
        np.testing.assert_array_equal(got, want, err_msg=where)


UNARY_CASES = [(fn, t) for fn, kinds in UNARY_KINDS.items() for k in kinds if k in KIND_DTYPES
               for t in KIND_DTYPES[k]]
BINARY_CASES = [(fn, t) for fn, kinds in BINARY_KINDS.items() for k in kinds if k in KIND_DTYPES
                for t in KIND_DTYPES[k]]


@pytest.fixture(scope="module")
def fn_library():
    """Every (fn, dtype) case as one kernel of one module: a single compile for all."""
    kernels = {}
    for fn, t in UNARY_CASES:
        n = len(unary_inputs(fn, t))
        kernels[("u", fn, t)] = map_kernel(f"u_{fn}_{t.label}", [t], t, n, lambda x, fn=fn, t=t: Unary(fn, x, t))
    for fn, t in BINARY_CASES:
        n = len(binary_inputs(fn, t)[0])
        out = BOOL if fn in ("eq", "ne", "lt", "le", "gt", "ge") else t
        kernels[("b", fn, t)] = map_kernel(f"b_{fn}_{t.label}", [t, t], out, n,
                                           lambda x, y, fn=fn, t=t, out=out: Binary(fn, x, y, out))
    return kernels, compile_kernels(list(kernels.values()))


@pytest.mark.parametrize("fn,t", UNARY_CASES, ids=[f"{f}-{t.label}" for f, t in UNARY_CASES])
def test_unary_fn(fn_library, fn, t):
    kernels, lib = fn_library
    k = kernels[("u", fn, t)]
    x = unary_inputs(fn, t)
    arrays = {"x0": aligned(x, t.np), "y": aligned(np.zeros(len(x)), t.np)}
    run(lib, k, arrays)
    _check(arrays["y"], unary_reference(fn, x, t), fn, t, x)


@pytest.mark.parametrize("fn,t", BINARY_CASES, ids=[f"{f}-{t.label}" for f, t in BINARY_CASES])
def test_binary_fn(fn_library, fn, t):
    kernels, lib = fn_library
    k = kernels[("b", fn, t)]
    x, y = binary_inputs(fn, t)
    out = k.buffer("y").dtype
    arrays = {"x0": aligned(x, t.np), "x1": aligned(y, t.np), "y": aligned(np.zeros(len(x)), out.np)}
    run(lib, k, arrays)
    _check(arrays["y"], binary_reference(fn, x, y, t), fn, t, x, y)


def test_every_fn_of_the_contract_is_covered():
    assert {fn for fn, _ in UNARY_CASES} == set(UNARY_KINDS)
    assert {fn for fn, _ in BINARY_CASES} == set(BINARY_KINDS)


def test_index_arithmetic_has_python_semantics():
    """index add/sub/mul/floordiv/mod/maximum/minimum and comparisons, through casts."""
    fns = [fn for fn, kinds in BINARY_KINDS.items() if "x" in kinds]
    x, y = binary_inputs("floordiv", I64)
    x, y = x // 4, y // 4            # keep products of index values in range
    kernels = []
    for fn in fns:
        out = BOOL if fn in ("eq", "ne", "lt", "le", "gt", "ge") else I64
        kernels.append(map_kernel(f"x_{fn}", [I64, I64], out, len(x), lambda a, b, fn=fn, out=out: (
            lambda v: v if out is BOOL else Cast(v, I64))(
            Binary(fn, Cast(a, INDEX), Cast(b, INDEX), BOOL if out is BOOL else INDEX))))
    lib = compile_kernels(kernels)
    for fn, k in zip(fns, kernels):
        out = k.buffer("y").dtype
        arrays = {"x0": aligned(x, np.int64), "x1": aligned(y, np.int64), "y": aligned(np.zeros(len(x)), out.np)}
        run(lib, k, arrays)
        _check(arrays["y"], binary_reference(fn, x, y, I64), fn, I64, x, y)


CAST_VALUES = {F32: [0.0, -0.0, 1.0, -1.0, 2.7, -2.7, 0.5, 1e6, -1e6, 123.456],
               F64: [0.0, -0.0, 1.0, -1.0, 2.7, -2.7, 0.5, 1e9, -1e9, 123.456],
               I32: [0, 1, -1, 7, -7, 2**31 - 1, -2**31, 1000, 2**24 + 1, -3],
               I64: [0, 1, -1, 7, -7, 2**40 + 3, -2**40, 2**63 - 1, -2**63, 5],
               BOOL: [False, True, True, False, True, False, False, True, True, False]}


def _cast_reference(x: np.ndarray, dst: DType) -> np.ndarray:
    if dst is BOOL:
        return x != 0
    if x.dtype.kind == "f" and dst in (I32, I64):
        info = np.iinfo(dst.np)      # truncation; NaN, infinities, out of range -> INT_MIN (x86)
        ok = np.isfinite(x) & (x >= info.min) & (x < -float(info.min))
        return np.where(ok, np.trunc(np.where(ok, x, 0)), info.min).astype(dst.np)
    return x.astype(dst.np)


@pytest.mark.parametrize("src", [F32, F64, I32, I64, BOOL], ids=lambda t: t.label)
def test_casts(src):
    dsts = [t for t in (F32, F64, I32, I64, BOOL) if t is not src]
    kernels = [map_kernel(f"c_{src.label}_{d.label}", [src], d, 10, lambda x, d=d: Cast(x, d)) for d in dsts]
    lib = compile_kernels(kernels)
    x = np.array(CAST_VALUES[src], src.np)
    for d, k in zip(dsts, kernels):
        arrays = {"x0": aligned(x, src.np), "y": aligned(np.zeros(10), d.np)}
        run(lib, k, arrays)
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(arrays["y"], _cast_reference(x, d), err_msg=f"{src} -> {d}")


def test_float_to_int_of_nan_inf_and_out_of_range_is_int_min():
    k = map_kernel("sat", [F32], I32, 6, lambda x: Cast(x, I32))
    x = np.array([math.nan, 1e10, -1e10, math.inf, 2.0 ** 31, -2.0 ** 31], np.float32)
    arrays = {"x0": aligned(x, np.float32), "y": aligned(np.zeros(6), np.int32)}
    run(compile_kernels([k]), k, arrays)
    assert arrays["y"].tolist() == [-2**31] * 5 + [-2**31]


def test_select_and_bool_buffers():
    k = map_kernel("sel", [BOOL, F64, F64], F64, 5, lambda c, a, b: Select(c, a, b, F64))
    c = np.array([True, False, True, False, False])
    a, b = np.arange(5.0), -np.arange(5.0)
    arrays = {"x0": aligned(c, np.bool_), "x1": aligned(a, np.float64), "x2": aligned(b, np.float64),
              "y": aligned(np.zeros(5), np.float64)}
    run(compile_kernels([k]), k, arrays)
    np.testing.assert_array_equal(arrays["y"], np.where(c, a, b))


# ---------------------------------------------------------------- loop nests

def _elementwise(name: str, t: DType, n, parallel: bool = False) -> Kernel:
    """y[i] = x[i] * 2 + 1 (the shape the vectorizer must handle)."""
    x = Load("x", (i,), t)
    value = Binary("add", Binary("mul", x, Const(2.0, t), t), Const(1.0, t), t)
    sizes, n = size_of(n)
    return Kernel(name, [Buffer("x", t, (n,), "input"), Buffer("y", t, (n,), "output")],
                  [Loop("i", n, [Store("y", (i,), value)], parallel=parallel)], sizes)


@pytest.mark.parametrize("t", [F32, F64], ids=lambda t: t.label)
def test_elementwise(t):
    k = _elementwise("ew", t, 1000)
    x = np.linspace(-3, 3, 1000).astype(t.np)
    arrays = {"x": aligned(x, t.np), "y": aligned(np.zeros(1000), t.np)}
    run(compile_kernels([k]), k, arrays)
    np.testing.assert_array_equal(arrays["y"], x * t.np.type(2) + t.np.type(1))


def test_broadcast_add_with_index_arithmetic():
    """y[i, j] = x[i, j] + b[j], and z[k] = x[k // 5, k % 5] (a flat view of x)."""
    k = Kernel("bcast", [Buffer("x", F32, (4, 5), "input"), Buffer("b", F32, (5,), "input"),
                         Buffer("y", F32, (4, 5), "output"), Buffer("z", F32, (20,), "output")], [
        Loop("i", 4, [Loop("j", 5, [Store("y", (i, j), Binary("add", Load("x", (i, j), F32),
                                                                Load("b", (j,), F32), F32))])]),
        Loop("i", 20, [Store("z", (i,), Load("x", (Binary("floordiv", i, Const(5, INDEX), INDEX),
                                                    Binary("mod", i, Const(5, INDEX), INDEX)), F32))])])
    x, b = np.arange(20, dtype=np.float32).reshape(4, 5), np.arange(5, dtype=np.float32) * 10
    arrays = {"x": aligned(x, np.float32), "b": aligned(b, np.float32),
              "y": aligned(np.zeros((4, 5)), np.float32), "z": aligned(np.zeros(20), np.float32)}
    run(compile_kernels([k]), k, arrays)
    np.testing.assert_array_equal(arrays["y"], x + b)
    np.testing.assert_array_equal(arrays["z"], x.ravel())


def _flat_read(shape) -> Kernel:
    """z[k] = x[(k + s) // 5, (k + s) % 5] for k < 20, s a run-time size (its sign unknown
    to LLVM, as a tile's start in a matmul's epilogue), x of `shape`."""
    k, start = Var("k", INDEX), Var("s", INDEX)
    at = Binary("add", k, start, INDEX)
    return Kernel("flat_read", [Buffer("x", F32, shape, "input"), Buffer("z", F32, (20,), "output")], [
        Loop("k", 20, [Store("z", (k,), Load("x", (Binary("floordiv", at, Const(5, INDEX), INDEX),
                                                    Binary("mod", at, Const(5, INDEX), INDEX)), F32))])], ["s"])


@pytest.mark.parametrize("shape", [(8, 5), (8, 6)])
def test_a_flat_position_split_by_a_dims_size_is_addressed_directly(shape):
    """x[e // 5, e % 5] of an (8, 5) buffer is element e: no division is left in the
    optimized code (emitter._merged_terms).  Of an (8, 6) buffer it is not, and it stays."""
    kernel = _flat_read(shape)
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    lib = compile_kernels([kernel])
    for start in (0, 7, 20):
        arrays = {"x": aligned(x, np.float32), "z": aligned(np.zeros(20), np.float32)}
        run(lib, kernel, arrays, sizes=(start,))
        np.testing.assert_array_equal(arrays["z"], [x[e // 5, e % 5] for e in range(start, start + 20)])
    text = optimized_ir([kernel])
    divides = any(f" {op} " in text for op in ("sdiv", "srem", "udiv", "urem"))
    assert divides == (shape[1] != 5)


def test_transposed_copy():
    k = Kernel("transpose", [Buffer("x", F64, (3, 7), "input"), Buffer("y", F64, (7, 3), "output")],
               [Loop("i", 3, [Loop("j", 7, [Store("y", (j, i), Load("x", (i, j), F64))])])])
    x = np.random.default_rng(0).random((3, 7))
    arrays = {"x": aligned(x, np.float64), "y": aligned(np.zeros((7, 3)), np.float64)}
    run(compile_kernels([k]), k, arrays)
    np.testing.assert_array_equal(arrays["y"], x.T)


def test_dynamic_sizes():
    """y[i, j] = x[i, j] * c[i] with both dims runtime sizes; one function, several shapes."""
    sizes, m, n = size_of("m", "n")
    k = Kernel("dyn", [Buffer("x", F32, (m, n), "input"), Buffer("c", F32, (m,), "input"),
                       Buffer("y", F32, (m, n), "output")],
               [Loop("i", m, [Loop("j", n, [Store("y", (i, j), Binary(
                   "mul", Load("x", (i, j), F32), Load("c", (i,), F32), F32))])])], sizes)
    lib = compile_kernels([k])
    rng = np.random.default_rng(1)
    for m, n in [(3, 5), (1, 100), (17, 33), (0, 4), (4, 0)]:
        x, c = rng.random((m, n), np.float32), rng.random(m, np.float32)
        arrays = {"x": aligned(x, np.float32), "c": aligned(c, np.float32),
                  "y": aligned(np.zeros((m, n)), np.float32)}
        run(lib, k, arrays, sizes=(m, n))
        np.testing.assert_array_equal(arrays["y"], x * c[:, None])


# ---------------------------------------------------------------- reductions

def _row_sum(t: DType, m, n) -> Kernel:
    sizes, m, n = size_of(m, n)
    return Kernel("row_sum", [Buffer("x", t, (m, n), "input"), Buffer("y", t, (m,), "output")], [
        Loop("i", m, [Reduce("r", n, [Accumulator("acc", t, Const(0.0, t))],
                             [Let("v", Load("x", (i, r), t))],
                             [Binary("add", Var("acc", t), Var("v", t), t)]),
                      Store("y", (i,), Var("acc", t))])], sizes)


@pytest.mark.parametrize("m,n", [(6, 10), (3, 10000), ("m", "n")])
def test_row_sum(m, n):
    k = _row_sum(F64, m, n)
    shape = (5, 9001) if m == "m" else (m, n)
    x = np.random.default_rng(2).random(shape)
    arrays = {"x": aligned(x, np.float64), "y": aligned(np.zeros(shape[0]), np.float64)}
    run(compile_kernels([k]), k, arrays, sizes=shape if m == "m" else ())
    np.testing.assert_allclose(arrays["y"], x.sum(axis=1), rtol=1e-13)


def test_float32_sum_of_2_24_terms_stays_close_to_the_float64_sum():
    """Reassociated and blocked: within float32 rounding of the exact sum (a single running
    float32 sum is ~1e-3 off here, 64 vector partial sums ~1e-6; NumPy's pairwise ~1e-7)."""
    n = 1 << 24
    sizes, size = size_of("n")
    k = Kernel("total", [Buffer("x", F32, (size,), "input"), Buffer("y", F32, (), "output")], [
        Reduce("r", size, [Accumulator("acc", F32, Const(0.0, F32))], [Let("v", Load("x", (r,), F32))],
               [Binary("add", Var("acc", F32), Var("v", F32), F32)]),
        Store("y", (), Var("acc", F32))], sizes)
    x = aligned(np.random.default_rng(3).random(n, np.float32), np.float32)
    arrays = {"x": x, "y": aligned(np.zeros(()), np.float32)}
    run(compile_kernels([k]), k, arrays, sizes=(n,))
    exact = x.sum(dtype=np.float64)
    assert abs(float(arrays["y"]) - exact) / exact < 2e-7


def test_only_the_accumulating_fadd_is_reassociable():
    k = _row_sum(F32, 4, 8)
    k.body[0].body[0].body = [Let("v", Binary("mul", Load("x", (i, r), F32), Const(3.0, F32), F32))]
    text = str(codegen_kernels([k], "m"))
    assert text.count("reassoc") == 1 and "fadd reassoc" in text
    assert "fast" not in text and "nsz" not in text


def test_argmax_with_two_accumulators():
    """The scheduler's arg-reduction: the first maximum wins, NaN wins once."""
    t, n = F32, 11
    better = Binary("or", Binary("gt", Var("v", t), Var("best", t), BOOL),
                    Binary("and", Binary("ne", Var("v", t), Var("v", t), BOOL),
                           Binary("eq", Var("best", t), Var("best", t), BOOL), BOOL), BOOL)
    k = Kernel("argmax", [Buffer("x", t, (3, n), "input"), Buffer("y", I64, (3,), "output"),
                          Buffer("m", t, (3,), "output")], [
        Loop("i", 3, [
            Reduce("r", n, [Accumulator("best", t, Const(-math.inf, t)), Accumulator("at", INDEX, Const(0, INDEX))],
                   [Let("v", Load("x", (i, r), t))],
                   [Select(better, Var("v", t), Var("best", t), t), Select(better, r, Var("at", INDEX), INDEX)]),
            Store("y", (i,), Cast(Var("at", INDEX), I64)), Store("m", (i,), Var("best", t))])])
    x = np.array([[1, 5, 2, 5, 0, -1, 3, 4, 5, 1, 0],
                  [1, 2, np.nan, 9, np.nan, 0, 0, 0, 0, 0, 0],
                  [-np.inf] * 11], np.float32)
    arrays = {"x": aligned(x, t.np), "y": aligned(np.zeros(3), np.int64), "m": aligned(np.zeros(3), t.np)}
    run(compile_kernels([k]), k, arrays)
    assert arrays["y"].tolist() == np.argmax(x, axis=1).tolist() == [1, 2, 0]
    np.testing.assert_array_equal(arrays["m"], np.max(x, axis=1))


def test_max_reduction_propagates_nan():
    t = F64
    k = Kernel("amax", [Buffer("x", t, (2, 50), "input"), Buffer("y", t, (2,), "output")], [
        Loop("i", 2, [Reduce("r", 50, [Accumulator("acc", t, Const(-math.inf, t))], [],
                             [Binary("maximum", Var("acc", t), Load("x", (i, r), t), t)]),
                      Store("y", (i,), Var("acc", t))])])
    x = np.random.default_rng(4).random((2, 50))
    x[1, 17] = np.nan
    arrays = {"x": aligned(x, t.np), "y": aligned(np.zeros(2), t.np)}
    run(compile_kernels([k]), k, arrays)
    np.testing.assert_array_equal(arrays["y"], np.max(x, axis=1))


# ---------------------------------------------------------------- parallel loops

def _count_writes(rows, cols) -> Kernel:
    """y[i, j] += 1 and z[i, j] = i * cols + j over a parallel outer loop."""
    sizes, rows, cols = size_of(rows, cols)
    cols_value = cols if isinstance(cols, Var) else Const(cols, INDEX)
    flat = Binary("add", Binary("mul", i, cols_value, INDEX), j, INDEX)
    return Kernel("count", [Buffer("y", I32, (rows, cols), "output"), Buffer("z", I64, (rows, cols), "output")], [
        Loop("i", rows, [Loop("j", cols, [
            Store("y", (i, j), Binary("add", Load("y", (i, j), I32), Const(1, I32), I32)),
            Store("z", (i, j), Cast(flat, I64))])], parallel=True)], sizes)


@pytest.mark.parametrize("rows,cols", [(1000, 1001), (3, 5), (1, 100000)])
def test_parallel_loop_writes_every_element_exactly_once(rows, cols):
    k = _count_writes("rows", "cols")
    lib = compile_kernels([k])
    arrays = {"y": aligned(np.zeros((rows, cols)), np.int32), "z": aligned(np.full((rows, cols), -1), np.int64)}
    run(lib, k, arrays, sizes=(rows, cols))
    assert (arrays["y"] == 1).all()
    np.testing.assert_array_equal(arrays["z"].ravel(), np.arange(rows * cols))


def test_parallel_loop_captures_enclosing_values():
    """A parallel loop after a Let and inside nothing else reads the Let's value."""
    k = Kernel("cap", [Buffer("s", F32, (), "input"), Buffer("y", F32, (4096, 16), "output")], [
        Let("scale", Binary("mul", Load("s", (), F32), Const(2.0, F32), F32)),
        Loop("i", 4096, [Loop("j", 16, [Store("y", (i, j), Binary(
            "mul", Var("scale", F32), Cast(Binary("add", i, j, INDEX), F32), F32))])], parallel=True)])
    arrays = {"s": aligned(np.float32(1.5), np.float32), "y": aligned(np.zeros((4096, 16)), np.float32)}
    run(compile_kernels([k]), k, arrays)
    want = 3.0 * (np.arange(4096)[:, None] + np.arange(16)[None, :])
    np.testing.assert_array_equal(arrays["y"], want.astype(np.float32))


# ---------------------------------------------------------------- optimized IR

def test_elementwise_f32_loop_is_vectorized():
    text = optimized_ir([_elementwise("ew", F32, "n")])
    assert "<16 x float>" in text or "<8 x float>" in text


def test_parallel_kernel_calls_gomp_parallel_and_keeps_a_serial_path():
    text = optimized_ir([_elementwise("ew", F32, "n", parallel=True)])
    assert "@GOMP_parallel(" in text
    assert "@omp_get_thread_num(" in text and "@omp_get_num_threads(" in text
    assert re.search(r"define internal .*@ew\.par0\.range\(ptr noalias", text)
    assert re.search(r"^define void @ew\(.*\n(.*\n)*?.*call .*void @ew\.par0\.range\(", text, re.M)  # serial path


def test_parallel_loops_of_a_module_share_one_runner_and_team():
    """The serial-or-team choice and the team's code are defined once per module, not per
    loop (they were a third of W8's LLVM time); each loop brings its .range and .chunk."""
    text = str(codegen_kernels([_elementwise("a", F32, "n", parallel=True),
                                _elementwise("b", F32, "n", parallel=True)], "m"))
    assert len(re.findall(r'^define .*@"tracecomp\.parallel\.run"\(', text, re.M)) == 1
    assert len(re.findall(r'^define .*@"tracecomp\.parallel\.team"\(', text, re.M)) == 1
    assert text.count("call void @\"GOMP_parallel\"") == 1
    for k in "ab":
        assert re.search(rf'^define internal void @"{k}\.par0\.chunk"\(', text, re.M)
        assert re.search(rf'call void @"tracecomp\.parallel\.run"\(.*@"{k}\.par0\.chunk"', text)


def test_parallel_loop_known_to_be_small_calls_its_range_directly():
    text = str(codegen_kernels([_elementwise("ew", F32, 64, parallel=True)], "m"))
    assert "tracecomp.parallel.run" not in text and "GOMP_parallel" not in text
    assert re.search(r'call void @"ew\.par0\.range"\(.*i64 0, i64 64\)', text)


def test_kernel_signature_and_pointer_attributes():
    k = _count_writes("rows", 7)
    text = str(codegen_kernels([k], "m"))
    line = next(s for s in text.splitlines() if s.startswith('define external void @"count"'))
    assert line.count("noalias") == 2 and line.count("align 64") == 2 and line.count("captures(none)") == 2
    assert 'i64 %"rows"' in line
    unaligned = str(codegen_kernels([k], "m", align=None))
    assert "align 64" not in next(s for s in unaligned.splitlines() if "@\"count\"" in s)


# ---------------------------------------------------------------- errors and the math hook

def test_unsupported_fn_is_a_backend_error():
    k = map_kernel("bad", [I32], I32, 4, lambda x: Unary("exp", x, I32))
    with pytest.raises(BackendError, match="no Unary 'exp' for tracecomp.int32"):
        codegen_kernels([k], "m")


def test_duplicate_kernel_names_are_refused():
    k = _elementwise("same", F32, 4)
    with pytest.raises(BackendError, match="two kernels are named 'same'"):
        codegen_kernels([k, k], "m")


def test_math_functions_come_from_the_polynomials_else_libm(monkeypatch):
    calls = []

    class FakeLlvmMath:
        @staticmethod
        def get_math_function(module, name, suffix):
            calls.append((name, suffix))
            if name == "erf":
                raise NotImplementedError(name)       # a missing one falls back to libm
            import llvmlite.ir as ir
            t = ir.FloatType() if suffix == "f32" else ir.DoubleType()
            return llvm_scalar.declare(module, f"poly_{name}_{suffix}", t, [t])

    monkeypatch.setattr(llvm_scalar, "_polynomials", lambda: FakeLlvmMath)
    k = map_kernel("m", [F32], F32, 4, lambda x: Binary("add", Unary("exp", x, F32), Unary("erf", x, F32), F32))
    text = str(codegen_kernels([k], "m"))
    assert calls == [("exp", "f32"), ("erf", "f32")]
    assert "poly_exp_f32" in text and "@\"erff\"" in text


_THREADS_SCRIPT = """
import os, sys
sys.path.insert(0, {tests!r})
import numpy as np
from test_llvm_codegen import _count_writes, aligned, compile_kernels, run
k = _count_writes("rows", "cols")
lib = compile_kernels([k])
def threads_after(rows, cols):
    arrays = {{"y": aligned(np.zeros((rows, cols)), np.int32), "z": aligned(np.zeros((rows, cols)), np.int64)}}
    run(lib, k, arrays, sizes=(rows, cols))
    assert (arrays["y"] == 1).all()
    return len(os.listdir("/proc/self/task"))
start = len(os.listdir("/proc/self/task"))
print(start, threads_after(10, 10), threads_after(1000, 1000))
"""


def test_small_parallel_loops_stay_on_one_thread_large_ones_use_libgomp():
    """In a fresh process (libgomp's team outlives the call): a 10x10 nest takes the serial
    path and starts no thread; a 1000x1000 one starts libgomp's workers."""
    import os
    import subprocess
    import sys
    script = _THREADS_SCRIPT.format(tests=os.path.dirname(__file__))
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    start, small, large = map(int, out.stdout.split())
    assert small == start and large > start


_FORK_SCRIPT = """
import os, signal, sys
sys.path.insert(0, {tests!r})
import numpy as np
from test_llvm_codegen import _count_writes, aligned, compile_kernels, run
k = _count_writes("rows", "cols")
lib = compile_kernels([k])
def ok():
    arrays = {{"y": aligned(np.zeros((1000, 1000)), np.int32), "z": aligned(np.zeros((1000, 1000)), np.int64)}}
    run(lib, k, arrays, sizes=(1000, 1000))
    return bool((arrays["y"] == 1).all())
assert ok()                      # the parent's libgomp team exists now
pid = os.fork()
if pid == 0:
    signal.alarm(30)             # a hang ends the child with SIGALRM
    os._exit(0 if ok() else 1)
_, status = os.waitpid(pid, 0)
print(status)
"""


def test_parallel_kernels_run_in_a_forked_child():
    """libgomp is not fork-safe; the JIT makes forked children run parallel loops serially."""
    import os
    import subprocess
    import sys
    script = _FORK_SCRIPT.format(tests=os.path.dirname(__file__))
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0"]
