"""bfloat16 and float16: conversions on every bit pattern against ml_dtypes and torch, eager
and compiled; PyTorch's promotion table; NumPy, torch and text interop; the compiled
loops' vectors."""
from __future__ import annotations

import itertools
import re

import ml_dtypes
import numpy as np
import pytest

import tracecomp as tc
from tracecomp.core import dtypes as dt
from tracecomp.lower import hostcpu

torch = pytest.importorskip("torch")

HALVES = [(tc.bfloat16, ml_dtypes.bfloat16, torch.bfloat16), (tc.float16, np.float16, torch.float16)]
ALL = [tc.bool, tc.int32, tc.int64, tc.bfloat16, tc.float16, tc.float32, tc.float64]


def _torch_dtype(d):
    return getattr(torch, d.label)


def _float32_sample() -> np.ndarray:
    """Every 4099th float32 bit pattern, and the ones that decide rounding: halfway between
    two bfloat16/float16 values (ties) and next to them, subnormals, overflow, inf, NaN."""
    bits = np.arange(0, 2 ** 32, 4099, dtype=np.uint64).astype(np.uint32)
    base = np.arange(0, 2 ** 16, 37, dtype=np.uint32) << 16
    ties = np.concatenate([base | 0x8000, base | 0x7FFF, base | 0x8001])           # bfloat16 ties
    f16 = np.arange(2 ** 16, dtype=np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    f16_ties = np.concatenate([f16 + 0x1000, f16 + 0xFFF, f16 + 0x1001])        # normal float16 ties
    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001,
                         0x477FEFFF, 0x477FF000, 0x33000000, 0x33000001, 0x33800000, 0x387FE000,
                         0x38800000, 0x00000001, 0x807FFFFF, 0x7F7FFFFF, 0xFF7FFFFF], np.uint32)
    return np.concatenate([bits, ties, f16_ties, specials]).view(np.float32)


def _same_bits_or_both_nan(got: np.ndarray, want: np.ndarray, what: str) -> None:
    got_f, want_f = got.astype(np.float32), want.astype(np.float32)
    nan = np.isnan(want_f)
    assert np.array_equal(np.isnan(got_f), nan), what
    g, w = got.view(np.uint16)[~nan], want.view(np.uint16)[~nan]
    bad = np.flatnonzero(g != w)
    assert not bad.size, f"{what}: {bad.size} differ, first {want_f[~nan][bad[0]]!r}: {g[bad[0]]:#06x} != {w[bad[0]]:#06x}"


@pytest.mark.parametrize("d, np_type, torch_type", HALVES, ids=["bfloat16", "float16"])
def test_every_bit_pattern_widens_and_narrows_back_exactly(d, np_type, torch_type):
    bits = np.arange(2 ** 16, dtype=np.uint16)
    halves = bits.view(np_type)
    want = torch.from_numpy(bits.view(np.int16).copy()).view(torch_type).float().numpy()
    widen, narrow = tc.trace(lambda x: x.float()), tc.trace(lambda x: x.to(d))
    for label, wide in (("eager", np.asarray(tc.tensor(halves).float())), ("compiled", np.asarray(widen(halves)))):
        np.testing.assert_array_equal(wide.view(np.uint32), want.view(np.uint32), err_msg=label)
    nan = np.isnan(want)
    for label, back in (("eager", np.asarray(tc.tensor(want).to(d))), ("compiled", np.asarray(narrow(want)))):
        assert back.dtype == np_type
        np.testing.assert_array_equal(back.view(np.uint16)[~nan], bits[~nan], err_msg=label)
        assert np.isnan(back[nan].astype(np.float32)).all()
        quiet = 0x40 if d is tc.bfloat16 else 0x200
        assert np.all(back.view(np.uint16)[nan] & quiet), f"{label}: a NaN was not made quiet"
        assert np.array_equal(back.view(np.uint16)[nan] >> 15, bits[nan] >> 15), f"{label}: a NaN lost its sign"


@pytest.mark.parametrize("d, np_type, torch_type", HALVES, ids=["bfloat16", "float16"])
def test_float32_rounds_to_nearest_even_as_ml_dtypes_and_torch(d, np_type, torch_type):
    x = _float32_sample()
    with np.errstate(all="ignore"):
        by_ml_dtypes = x.astype(np_type)
    by_torch = torch.from_numpy(x.copy()).to(torch_type).view(torch.int16).numpy().view(np_type)
    eager = np.asarray(tc.tensor(x).to(d))
    compiled = np.asarray(tc.trace(lambda t: t.to(d))(x))
    for label, got in (("eager", eager), ("compiled", compiled)):
        _same_bits_or_both_nan(got, by_ml_dtypes, f"{label} vs ml_dtypes")
        _same_bits_or_both_nan(got, by_torch, f"{label} vs torch")


@pytest.mark.parametrize("d", [tc.bfloat16, tc.float16])
def test_float64_and_int_casts_round_as_torch(d):
    x = np.concatenate([np.random.default_rng(1).standard_normal(5000) * 1e3, [1 + 2 ** -8 + 2 ** -40, 65519.999]])
    want = torch.from_numpy(x).to(_torch_dtype(d)).float().numpy()
    for got in (tc.tensor(x).to(d), tc.trace(lambda t: t.to(d))(x)):
        np.testing.assert_array_equal(np.asarray(got).astype(np.float32), want)
    ints = np.array([-(2 ** 40) - 1, -3, 0, 257, 2 ** 24 + 1, 65519], np.int64)
    want = torch.from_numpy(ints).to(_torch_dtype(d)).float().numpy()
    for got in (tc.tensor(ints).to(d), tc.trace(lambda t: t.to(d))(ints)):
        np.testing.assert_array_equal(np.asarray(got).astype(np.float32), want)


@pytest.mark.parametrize("a, b", list(itertools.product(ALL, ALL)), ids=str)
def test_promotion_is_torchs(a, b):
    want = torch.promote_types(_torch_dtype(a), _torch_dtype(b))
    assert dt.promote_types(a, b).label == str(want).removeprefix("torch.")
    x, y = tc.ones((2,), dtype=a), tc.ones((2,), dtype=b)
    tx, ty = torch.ones(2, dtype=_torch_dtype(a)), torch.ones(2, dtype=_torch_dtype(b))
    assert (x + y).dtype.label == str((tx + ty).dtype).removeprefix("torch.")


@pytest.mark.parametrize("d", [tc.bfloat16, tc.float16])
@pytest.mark.parametrize("other", [2.5, 3, True, "0-d float32", "0-d float64", "int tensor"])
def test_scalars_and_0d_tensors_are_weak_as_in_torch(d, other):
    operand = {"0-d float32": (tc.tensor(np.float32(2)), torch.tensor(2.0)),
               "0-d float64": (tc.tensor(np.float64(2)), torch.tensor(2.0, dtype=torch.float64)),
               "int tensor": (tc.ones((2,), dtype=tc.int64), torch.ones(2, dtype=torch.int64))}.get(other, (other, other))
    got = (tc.ones((2,), dtype=d) * operand[0]).dtype
    want = (torch.ones(2, dtype=_torch_dtype(d)) * operand[1]).dtype
    assert got.label == str(want).removeprefix("torch.")


@pytest.mark.parametrize("d, np_type, torch_type", HALVES, ids=["bfloat16", "float16"])
def test_numpy_and_torch_interop(d, np_type, torch_type):
    values = np.array([1.5, -2.0, 3.140625, np.inf], np_type)
    t = tc.tensor(values)
    assert t.dtype is d and np.asarray(t).dtype == np_type and t.numpy().dtype == np_type
    assert tc.tensor(values.astype(np.float32), dtype=d).dtype is d
    assert tc.zeros((2,), dtype=d).dtype is d and tc.ones((2,)).to(d).dtype is d
    assert tc.ones((2,)).to(torch_type).dtype is d
    from_torch = tc.tensor(torch.tensor([1.5, -2.0], dtype=torch_type))
    assert from_torch.dtype is d and from_torch.tolist() == [1.5, -2.0]
    back = torch.from_dlpack(t)
    assert back.dtype == torch_type and back.float().tolist() == [1.5, -2.0, 3.140625, float("inf")]
    assert tc.from_dlpack(back).dtype is d


def test_half_and_bfloat16_methods_and_aliases():
    x = tc.tensor(np.array([1.0, 2.0], np.float32))
    assert x.half().dtype is tc.float16 is tc.half and x.bfloat16().dtype is tc.bfloat16
    assert dt.to_dtype("half") is tc.float16 and dt.to_dtype(ml_dtypes.bfloat16) is tc.bfloat16
    assert "dtype=tracecomp.bfloat16" in repr(x.bfloat16())


@pytest.mark.parametrize("d", [tc.bfloat16, tc.float16])
def test_graph_text_round_trips_and_mlir_opt_accepts_every_stage(d):
    from tracecomp.ir.mlir_tool import check_with_mlir_opt, find_mlir_opt
    from tracecomp.ir.parser import parse_graph
    f = tc.trace(lambda x: x * 3 + tc.tensor(np.array([0.1, 0.2], np.float32)).to(d))
    lowered = f.lower(np.ones(2, d.np))
    for stage in ("graph", "optimized"):
        text = lowered.as_text(stage)
        assert f"tensor<2x{d.mlir}>" in text
        assert str(parse_graph(text)) == text
    assert f"memref<2x{d.mlir}>" in lowered.as_text("loops")
    if find_mlir_opt() is None:
        pytest.skip("mlir-opt is not installed")
    for stage in ("graph", "optimized", "loops"):
        check_with_mlir_opt(lowered.as_text(stage), f"<{stage}>")


def _loops(asm: str) -> list[str]:
    from tests.lower.test_asm import _loops as loops
    return loops(asm)


@pytest.mark.parametrize("d", [tc.bfloat16, tc.float16])
def test_fused_half_loops_vectorize(d, loop_vector_register):
    """The i16 loads widen and the stores narrow in vector registers, at each loop width the
    host can run, forced (LLVM picks the width from the 16-bit elements, so a host with
    AVX-512 may use zmm even when 256-bit loops were chosen): a vector loop with no scalar
    16-bit load or store and no call."""
    f = tc.trace(lambda x, y: (x * 1.5 + y).exp() - y)
    x = np.ones(1 << 16, d.np)
    regs = "zmm" if loop_vector_register == "zmm" else "[yz]mm"
    loops = _loops(f.lower(x, x).as_text("asm"))
    vector_loops = [body for body in loops if re.search(rf"\bv?(mul|add|sub)ps\s.*%{regs}\d", body)]
    assert vector_loops, "no loop computes on packed floats"
    f16c = d is tc.float16 and hostcpu.host_target().has("f16c")     # F16C converts (llvm/halfs.py)
    widening = r"\bvcvtph2ps\b" if f16c else r"\bv?(pmovzxwd|punpck\w+wd)\b"
    for body in vector_loops:
        assert re.search(widening, body), f"no packed widening in:\n{body}"
        if f16c:
            assert re.search(rf"\bvcvtps2ph\s.*%{regs}\d", body), f"no packed F16C narrowing in:\n{body}"
        assert not re.search(r"\b(movzwl|movw)\b", body), f"a scalar 16-bit access in:\n{body}"
        assert not re.search(r"^\s+call", body, re.M), f"a call inside a vector loop:\n{body}"


@pytest.mark.parametrize("d", [tc.bfloat16, tc.float16])
def test_nan_to_num_gives_the_half_dtypes_own_maximum(d):
    """Computed in float32, yet the default for inf is the result dtype's largest value (as in
    torch), not float32's, which would round back to inf."""
    x = np.array([np.inf, -np.inf, np.nan, 1.0], np.float32)
    want = torch.from_numpy(x).to(_torch_dtype(d)).nan_to_num().float().numpy()
    for backend in (None, "interp", "cpu"):
        fn = (lambda t: t.nan_to_num()) if backend is None else tc.trace(lambda t: t.nan_to_num(), backend=backend)
        np.testing.assert_array_equal(np.asarray(fn(tc.tensor(x).to(d))).astype(np.float32), want)


ERRORS = [
    ("an integer-only op", lambda x: tc.bitwise_and(x, x), tc.DTypeError, ["bitwise_and", "bfloat16", "integral"]),
    ("the same, traced", lambda x: tc.trace(lambda a: tc.bitwise_and(a, a))(x), tc.DTypeError,
     ["bitwise_and", "bfloat16"]),
    ("matmul of bfloat16 with float16", lambda x: x @ x.half(), tc.DTypeError, ["matmul", "bfloat16", "float16"]),
    ("a float8 array", lambda x: tc.tensor(np.ones(2, ml_dtypes.float8_e4m3fn)), tc.DTypeError,
     ["float8_e4m3fn", "bfloat16, float16"]),
    ("a float8 torch tensor", lambda x: tc.tensor(torch.ones(2, dtype=torch.float8_e4m3fn)), tc.TracecompError,
     ["torch.Tensor", "Float8", "bfloat16"]),
    ("an unknown dtype name", lambda x: x.to("bfloat8"), tc.TracecompError, ["bfloat8", "bfloat16, float16"]),
    ("logsumexp of a half attention must stay float32",
     lambda x: tc._scaled_dot_product_flash_attention_for_cpu_backward(
         x, x, x, x, x, x.sum(-1), 0.0, False), tc.ShapeError, ["logsumexp", "float32", "bfloat16"]),
]


@pytest.mark.parametrize("desc, fn, error, needles", ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_half_inputs_raise_errors_naming_op_and_dtype(desc, fn, error, needles):
    x = tc.ones((2, 2), dtype=tc.bfloat16)
    with pytest.raises(error) as info:
        fn(x)
    for needle in needles:
        assert needle in str(info.value), f"{desc}: {needle!r} not in: {info.value}"


def test_float16_integer_conversions_without_f16c(monkeypatch):
    """The integer sequence a target without F16C gets (llvm/halfs.py), forced here on any
    host: every float16 bit pattern widens, and narrows back, as with F16C."""
    from tracecomp.lower.llvm import halfs
    monkeypatch.setattr(halfs, "has_f16c", lambda: False)
    bits = np.arange(2 ** 16, dtype=np.uint16)
    want = torch.from_numpy(bits.view(np.int16).copy()).view(torch.float16).float().numpy()
    with tc.compile_cache.scoped(enabled=False):
        widen, narrow = tc.trace(lambda x: x.float() * 1.0), tc.trace(lambda x: (x * 1.0).to(tc.float16))
        halves = bits.view(np.float16)
        assert "vcvtph2ps" not in widen.lower(halves).as_text("asm")
        np.testing.assert_array_equal(np.asarray(widen(halves)).view(np.uint32)[~np.isnan(want)],
                                      want.view(np.uint32)[~np.isnan(want)])
        nan = np.isnan(want)
        back = np.asarray(narrow(want))
        np.testing.assert_array_equal(back.view(np.uint16)[~nan], bits[~nan])
        assert np.all(back.view(np.uint16)[nan] & 0x200)
