"""bfloat16 and float16 on the PTX path (issue 37), without a GPU: representative programs
exported with target="cuda" are (a) assembled by ptxas for the export's arch (skipped
where ptxas is missing), (b) run on the host emulator against eager tracecomp on the CPU:
bit for bit where both compute in float32 and round once (elementwise chains, casts),
within the half dtype's tolerance where the order of a float32 accumulation may differ
(reductions, softmax, norms, matmuls), and (c) described with their half dtypes in the
launch JSON."""
import json

import numpy as np
import pytest

import tracecomp as tc
from tracecomp.aot.ptx import export_ptx
from tracecomp.lower.nvptx.target import DEFAULT_ARCH
from tracecomp.runtime.cuda.emulator import EmulatedContext
from tracecomp.runtime.cuda.ptxas import assemble, find_ptxas
from tracecomp.runtime.cuda.runner import CudaProgram

HALVES = [tc.bfloat16, tc.float16]
RNG = np.random.default_rng(37)
# A few ulps of the half dtype at magnitude ~1: float32 sums in another order, rounded once.
TOL = {tc.bfloat16: 2e-2, tc.float16: 2e-3}


def _h(d, *shape):
    return RNG.standard_normal(shape).astype(np.float32).astype(d.np)


def _layernorm(x, w, b):
    return tc.layer_norm(x, (x.shape[-1],), w, b)


def _linear_gelu(x, w, b):
    return tc.gelu(tc.linear(x, w, b))


def _autocast_mlp(x, w):
    # float32 operands: autocast runs the matmul in bfloat16, the rest stays float32.
    with tc.autocast(dtype=tc.bfloat16):
        h = x @ w
    return h, h.float().relu().sum(dim=1)


# name -> (function, inputs for dtype d, exact): exact programs round once per output
# from the same float32 arithmetic on both sides, so they must agree bit for bit.
PROGRAMS = {
    "elementwise": (lambda x, y: (x.exp() * y + 1.5, (x * 0.25).tanh() - y),
                    lambda d: [_h(d, 5, 33), _h(d, 5, 33)], True),
    "reductions": (lambda x: (x.sum(), x.mean(dim=1), x.amax(dim=0), x.sum(dim=-1, keepdim=True)),
                   lambda d: [_h(d, 6, 70)], False),
    "softmax": (lambda x: tc.softmax(x, dim=-1), lambda d: [_h(d, 7, 45)], False),
    "layernorm": (_layernorm, lambda d: [_h(d, 5, 48), _h(d, 48), _h(d, 48)], False),
    "matmul": (lambda x, y: (x @ y).relu() + x.sum(), lambda d: [_h(d, 4, 8), _h(d, 8, 4)], False),
    "linear_gelu": (_linear_gelu, lambda d: [_h(d, 9, 24), _h(d, 16, 24), _h(d, 16)], False),
    "cast_in_out": (lambda x, y: (x.float() * 3, (y * 1.25).to(x.dtype), (x.float() + y).to(x.dtype)),
                    lambda d: [_h(d, 4, 17), RNG.standard_normal((4, 17)).astype(np.float32)], True),
}


def _eager(fn, inputs):
    out = fn(*[tc.tensor(v) for v in inputs])
    return [np.asarray(o.numpy()) for o in (out if isinstance(out, tuple) else (out,))]


def _emulated(fn, inputs):
    low = tc.trace(fn).lower(*inputs)
    return CudaProgram(low.program, EmulatedContext()).on_host(list(inputs))


def _check(fn, inputs, exact, tol):
    got, want = _emulated(fn, inputs), _eager(fn, inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape
        if exact:
            assert np.array_equal(g.view(np.uint8), w.view(np.uint8)), (g, w)
        else:
            np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("name", list(PROGRAMS))
@pytest.mark.parametrize("d", HALVES, ids=str)
def test_emulator_matches_eager(d, name):
    fn, make, exact = PROGRAMS[name]
    _check(fn, make(d), exact, TOL[d])


@pytest.mark.parametrize("d", HALVES, ids=str)
def test_tiled_matmul_of_half_operands_matches_eager(d):
    """Sizes the CPU packs (its program reads the half inputs in place): the GPU's tiles
    load them widened into shared memory."""
    x, y, w, b = _h(d, 40, 48), _h(d, 48, 36), _h(d, 36, 48), _h(d, 36)
    _check(lambda x, y: ((x @ y).relu() + x.sum(),), [x, y], False, TOL[d])
    _check(_linear_gelu, [x, w, b], False, TOL[d])


@pytest.mark.parametrize("shape", [(4, 8, 4), (40, 48, 36), (1, 64, 16)])
@pytest.mark.parametrize("d", HALVES, ids=str)
def test_no_float32_copy_of_a_half_input(d, shape, tmp_path):
    """Products read their half operands widened (small or tiled, a vector too): no
    float32 buffer holds as many elements as a half input."""
    m, k, n = shape
    x, y = _h(d, m, k), _h(d, k, n)
    _, js = _export(lambda x, y: ((x @ y).relu() + x.sum(), x @ y.T.T), [x, y], tmp_path / "m.ptx", DEFAULT_ARCH)
    sizes = {int(np.prod(i["shape"])) for i in js["inputs"]}
    copies = [n for n, b in js["buffers"].items() if b["dtype"] == "float32" and b["role"] == "temp"
              and b["shape"] and int(np.prod(b["shape"])) in sizes and n.startswith("t")]
    assert not copies, js["buffers"]
    _check(lambda x, y: ((x @ y).relu() + x.sum(),), [x, y], False, TOL[d])


def test_autocast_region_matches_eager():
    x = RNG.standard_normal((6, 20)).astype(np.float32)
    w = RNG.standard_normal((20, 12)).astype(np.float32)
    got = _emulated(_autocast_mlp, [x, w])
    assert [np.asarray(g).dtype for g in got] == [tc.bfloat16.np, np.float32]
    _check(_autocast_mlp, [x, w], False, TOL[tc.bfloat16])


@pytest.mark.parametrize("d", HALVES, ids=str)
def test_rounding_to_half_is_eagers_for_every_kind_of_value(d):
    """float32 -> half on store: ties to even, values that round up to infinity, overflow,
    subnormal results and inputs, signed zeros, infinities and NaNs (quiet and signalling,
    with payloads): bit for bit as eager does it, and back to float32 exactly."""
    bits = np.array([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x477FF000, 0x477FE000, 0x7F7FFFFF,
                     0x7F7F8000, 0x00018000, 0x00000001, 0x80000001, 0x33800000, 0x33000001,
                     0x387FC000, 0x80000000, 0x00000000, 0x7F800000, 0xFF800000, 0x7FC00000,
                     0x7F800001, 0xFFA00001, 0x7FBFFFFF, 0x3F7FFFFF, 0xBF808001, 0x3F8FF800],
                    np.uint32)
    sweep = RNG.integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits, sweep]).view(np.float32)
    _check(lambda v: (v.to(d), v.to(d).float()), [x], True, 0)


@pytest.mark.parametrize("d", HALVES, ids=str)
def test_widening_every_half_value_is_exact(d):
    """All 2^16 bit patterns widened, and through a float32 product rounded back.  (Not
    `v * 1` or `-v`: compiled code, CPU or GPU, keeps a signalling NaN's bits there where
    eager quiets it.)"""
    every = np.arange(2 ** 16, dtype=np.uint32).astype(np.uint16).view(d.np)
    _check(lambda v: (v.float(), v * 1.5, v.abs() + 0.5), [every], True, 0)


needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) is not installed")


def _export(fn, inputs, path, arch):
    if arch == DEFAULT_ARCH:
        tc.export(fn, inputs, str(path), target="cuda")
    else:       # tc.export takes no arch; aot/ptx.py does
        export_ptx(fn, inputs, str(path), arch=arch)
    return path.read_text(), json.loads(path.with_suffix(".json").read_text())


@pytest.mark.parametrize("d", HALVES, ids=str)
def test_export_names_half_dtypes(d, tmp_path):
    x, y = _h(d, 4, 8), _h(d, 8, 4)
    ptx, js = _export(lambda x, y: ((x @ y).relu() + x.sum(), (x @ y).float()), [x, y],
                      tmp_path / "m.ptx", "sm_80")
    label = str(d).split(".")[-1]
    assert [i["dtype"] for i in js["inputs"]] == [label, label]
    assert [o["dtype"] for o in js["outputs"]] == [label, "float32"]
    assert {b["dtype"] for b in js["buffers"].values()} >= {label, "float32"}
    # 2-byte elements move as 16-bit loads and stores
    assert "ld.global.nc.b16" in ptx or "ld.global.b16" in ptx
    assert "st.global.b16" in ptx


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("d", HALVES, ids=str)
def test_every_program_assembles(d, arch, tmp_path):
    cases = [(n, fn, make(d)) for n, (fn, make, _) in PROGRAMS.items()]
    cases.append(("autocast", _autocast_mlp, [RNG.standard_normal((6, 20)).astype(np.float32),
                                             RNG.standard_normal((20, 12)).astype(np.float32)]))
    for name, fn, inputs in cases:
        ptx, js = _export(fn, inputs, tmp_path / f"{name}.ptx", arch)
        assert js["arch"] == arch
        figures = assemble(ptx, js["arch"])
        assert {launch["entry"] for launch in js["launches"]} <= set(figures), name


def test_half_conversions_in_ptx_do_not_depend_on_the_host(monkeypatch):
    """float16 converts with cvt (host with F16C or without: the same PTX); bfloat16 with
    integer ops (a shift to widen, nearest-even rounding by an add), no sm_80-only cvt."""
    from tracecomp.lower.llvm import halfs
    from tracecomp.lower.nvptx.program import compile_program

    def ptx(d, f16c):
        monkeypatch.setattr(halfs, "has_f16c", lambda: f16c)
        fn = lambda x, y: (x.float().exp().to(x.dtype), y.to(x.dtype))
        return compile_program(tc.trace(fn).lower(_h(d, 3, 5), _h(tc.float32, 3, 5)).program, "sm_80").ptx
    f16 = ptx(tc.float16, False)
    assert f16 == ptx(tc.float16, True)
    assert "cvt.f32.f16" in f16 and "cvt.rn.f16.f32" in f16
    bf16 = ptx(tc.bfloat16, True)
    assert "bf16" not in bf16 and "shl.b32" in bf16
