"""Matmuls of bfloat16/float16 operands: every path of schedule/tiles.py's half_path forced
in turn (the `matmul_half_path` tuning key) against torch's CPU matmul of the same dtype,
within one ulp of the result's dtype (different summation orders in float32); the
instructions each path promises are in the assembly; the operands are read in place (no
float32 copy kernel)."""
from __future__ import annotations

import re

import llvmlite.binding as llvm
import numpy as np
import pytest

import tracecomp as tc
from tracecomp.lower import hostcpu
from tracecomp.lower.schedule import tiles
from tracecomp.runtime import tuning

torch = pytest.importorskip("torch")

SHAPES = [((64, 64), (64, 64)), ((37, 131), (131, 45)), ((3, 20, 33), (33, 70)), ((1, 300), (300, 17)),
          ((256, 257), (257, 300))]
# the CPU features a path's code is compiled with where the host lacks them (compile-only route)
FEATURES = {path: needs for path, (_, needs) in tiles.PATH_NEEDS.items()}


@pytest.fixture(params=tiles.HALF_PATHS)
def half_path(request):
    """Each half matmul path forced as the measured choice; a path this host cannot run
    skips naming the CPU feature it lacks."""
    path = request.param
    if path == "dpbf16ps" and not hostcpu.host_target().has("avx512f"):
        pytest.skip("the dpbf16ps path needs AVX-512 (avx512f); this target has none")
    tuning.ensure_tuned()
    before = hostcpu.tuned()
    hostcpu.set_tuned({**before, tiles.HALF_PATH_KEY: path})
    yield path
    hostcpu.set_tuned(before)


def _runs(path: str) -> None:
    missing = tiles.missing_for(path)
    if missing:
        pytest.skip(f"the host lacks {', '.join(missing)}: the {path} path is compiled (test_*_assembly) but not run")


def _torch_dtype(d):
    return torch.bfloat16 if d is tc.bfloat16 else torch.float16


@pytest.mark.parametrize("d", [tc.bfloat16, tc.float16])
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_half_matmul_matches_torch_within_one_ulp(d, shapes, half_path):
    _runs(half_path)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(d.np) for s in shapes)
    out = tc.trace(lambda x, y: x @ y)(a, b)
    assert out.dtype == d
    got = np.asarray(out).astype(np.float64)
    want = (torch.from_numpy(a.astype(np.float32)).to(_torch_dtype(d))
            @ torch.from_numpy(b.astype(np.float32)).to(_torch_dtype(d))).double().numpy()
    ulp = np.spacing(np.abs(want).astype(d.np)).astype(np.float64)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    assert np.all(np.abs(got - want) <= ulp + 1e-6 * scale), np.abs(got - want).max()


def test_transposed_and_offset_half_operands(half_path):
    """Operands read in place through views (a transpose, a slice): every packing branch."""
    _runs(half_path)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((70, 41)).astype(tc.bfloat16.np)
    b = rng.standard_normal((50, 41)).astype(tc.bfloat16.np)
    out = tc.trace(lambda x, y: x[3:, 1:] @ y[:, 1:].mT)(a, b)
    ta, tb = (torch.from_numpy(v.astype(np.float32)).bfloat16() for v in (a, b))
    want = (ta[3:, 1:] @ tb[:, 1:].mT).double().numpy()
    got = np.asarray(out).astype(np.float64)
    ulp = np.spacing(np.abs(want).astype(tc.bfloat16.np)).astype(np.float64)
    assert np.all(np.abs(got - want) <= ulp + 1e-5)


@pytest.mark.parametrize("d", [tc.bfloat16, tc.float16])
def test_half_operands_are_read_in_place(d, half_path):
    """The product's kernel takes the half inputs themselves (the packing converts): the
    only other kernel rounds the float32 result to d."""
    a = np.ones((64, 64), d.np)
    loops = tc.trace(lambda x, y: x @ y).lower(a, a).as_text("loops")
    kernels = re.findall(r"func\.func @(\w+)\(([^)]*)\)", loops)
    assert len(kernels) == 2, loops
    assert f"memref<64x64x{d.mlir}>" in kernels[0][1] and "xf32>" in kernels[0][1]


def _assembly(path: str) -> str:
    """The assembly of a bf16 product on `path`, for a CPU with the path's feature: the
    host, or (feature missing) a target machine of the host's CPU with it turned on."""
    a = np.ones((64, 64), tc.bfloat16.np)
    lowered = tc.trace(lambda x, y: x @ y).lower(a, a)
    features = FEATURES.get(path, ())
    if all(hostcpu.detected_target().has(f) for f in features):
        return lowered.as_text("asm")
    return _assembly_with(lowered, *features)


def _assembly_with(lowered, *features: str) -> str:
    """The assembly of `lowered`'s LLVM IR for the host's CPU with `features` turned on."""
    host = hostcpu.host_target()
    on = "".join(f",+{f}" for f in features)
    tm = llvm.Target.from_triple(host.triple).create_target_machine(cpu=host.cpu, features=host.features + on)
    module = llvm.parse_assembly(lowered.as_text("llvm"))
    module.triple, module.data_layout = tm.triple, str(tm.target_data)
    return tm.emit_assembly(module)


def test_the_compile_only_route_emits_vdpbf16ps(half_path):
    """How a host without AVX512-BF16 checks the dpbf16ps path (_assembly): its IR compiled
    for the host's CPU with the feature on; exercised here whatever the host has."""
    if half_path != "dpbf16ps":
        pytest.skip("the dpbf16ps path only")
    a = np.ones((64, 64), tc.bfloat16.np)
    assert "vdpbf16ps" in _assembly_with(tc.trace(lambda x, y: x @ y).lower(a, a), "avx512bf16")


def test_each_path_uses_its_instructions(half_path):
    taken = tiles.half_path(tc.bfloat16, tc.bfloat16)     # (a float16 path forced: a bf16 product's own)
    assert taken == half_path or tiles.PATH_NEEDS[half_path][0] is tc.float16
    asm = _assembly(taken)
    assert ("vdpbf16ps" in asm) == (taken == "dpbf16ps")
    assert ("tdpbf16ps" in asm) == (taken == "amx")
    assert re.search(r"\bvfmadd\w*ps\b", asm) or taken in ("dpbf16ps", "amx")


def test_float16_packing_converts_with_f16c():
    if not hostcpu.detected_target().has("f16c"):
        pytest.skip("the host CPU has no f16c: float16 widens with integer ops")
    a = np.ones((64, 64), tc.float16.np)
    asm = tc.trace(lambda x, y: x @ y).lower(a, a).as_text("asm")
    assert "vcvtph2ps" in asm and re.search(r"\bvfmadd\w*ps\b", asm)


def test_default_path_follows_the_host():
    host = hostcpu.host_target()
    amx = host.has("amx-tile") and hostcpu.tile_data_granted()
    want = "amx" if amx and host.has("amx-bf16") else \
        "dpbf16ps" if host.has("avx512bf16") and host.has("avx512f") else "widen"
    forced = hostcpu.tuned().get(tiles.HALF_PATH_KEY)
    if forced is None:
        assert tiles.half_paths() == {"bfloat16": want, "float16": "amx-fp16" if amx and host.has("amx-fp16") else "widen"}


@pytest.mark.parametrize("d", [tc.bfloat16, tc.float16])
def test_computed_half_operand_stays_half(d, half_path):
    """relu(a) is computed into a temp of its own dtype d (not a float32 copy), then
    packed like an input."""
    _runs(half_path)
    rng = np.random.default_rng(2)
    a = rng.standard_normal((80, 64)).astype(d.np)
    b = rng.standard_normal((64, 96)).astype(d.np)
    lowered = tc.trace(lambda x, y: tc.relu(x) @ y).lower(a, b)
    assert "xf32>" not in re.search(r"func\.func @\w*relu\w*\(([^)]*)\)", lowered.as_text("loops")).group(1)
    got = np.asarray(tc.trace(lambda x, y: tc.relu(x) @ y)(a, b)).astype(np.float64)
    ta, tb = (torch.from_numpy(v.astype(np.float32)).to(_torch_dtype(d)) for v in (a, b))
    want = (torch.relu(ta) @ tb).double().numpy()
    ulp = np.spacing(np.abs(want).astype(d.np)).astype(np.float64)
    assert np.all(np.abs(got - want) <= ulp + 1e-5), np.abs(got - want).max()


@pytest.mark.parametrize("d", [tc.bfloat16, tc.float16])
def test_float32_times_half_operand(d, half_path):
    """A float32 operand (computed) times a half one cast to float32 (read in place as d):
    each packing feeds the float32 kernel (b was once packed as bf16 K-pairs for it)."""
    _runs(half_path)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((80, 64)).astype(np.float32)
    b = rng.standard_normal((64, 96)).astype(d.np)
    want = (2 * a.astype(np.float64)) @ b.astype(np.float64)
    for fn, expected in ((lambda x, y: (x * 2) @ y.to(tc.float32), want),
                         (lambda x, y: y.to(tc.float32).mT @ (x * 2).mT, want.T)):
        got = np.asarray(tc.trace(fn)(a, b)).astype(np.float64)
        assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_dpbf16ps_on_256_bit_matmul_vectors(half_path):
    """Where 256-bit matmul vectors were measured best (tuning's matmul_vector_bytes), the
    bf16 kernel takes ymm vdpbf16ps on 8-lane tiles."""
    if half_path != "dpbf16ps":
        pytest.skip("the dpbf16ps path only")
    before = hostcpu.tuned()
    hostcpu.set_tuned({**before, "matmul_vector_bytes": 32})
    try:
        assert tiles.tiles_for(tc.float32).lanes == 8
        rng = np.random.default_rng(4)
        a = rng.standard_normal((37, 131)).astype(tc.bfloat16.np)
        b = rng.standard_normal((131, 45)).astype(tc.bfloat16.np)
        f = tc.trace(lambda x, y: x @ y)
        asm = _assembly_with(f.lower(a, b), "avx512bf16")
        assert re.search(r"\bvdpbf16ps\s.*%ymm\d", asm) and not re.search(r"\bvdpbf16ps\s.*%zmm\d", asm)
        _runs(half_path)
        want = (torch.from_numpy(a.astype(np.float32)).bfloat16() @ torch.from_numpy(b.astype(np.float32)).bfloat16())
        want = want.double().numpy()
        got = np.asarray(f(a, b)).astype(np.float64)
        ulp = np.spacing(np.abs(want).astype(tc.bfloat16.np)).astype(np.float64)
        assert np.all(np.abs(got - want) <= ulp + 1e-5)
    finally:
        hostcpu.set_tuned(before)


def _autocast_linear_step(x, w, b):
    """A biased linear and its gradients under autocast, as W4b/W8b's layers compute them:
    linear's w.t() and the backward's x.mT @ g read widened bf16 tensors through views."""
    def loss(x, w, b):
        with tc.autocast(tc.bfloat16):
            y = tc.nn.functional.linear(x, w, b)
        return (y.float() * y.float()).mean()
    return tc.grad(loss, argnums=(0, 1, 2))(x, w, b)


def test_autocast_linear_and_its_gradients_take_the_bf16_kernel(half_path):
    """Every product of the step (forward, input and weight gradients) reads bf16 operands
    in place (no float32 copy of a cast), so it runs on `half_path`; values as
    torch.autocast's within bf16's tolerance."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 48, 96)).astype(np.float32)
    w = (rng.standard_normal((80, 96)) / 10).astype(np.float32)
    b = rng.standard_normal(80).astype(np.float32)
    f = tc.trace(_autocast_linear_step)
    loops = f.lower(x, w, b).as_text("loops")
    products = re.findall(r"func\.func @(\w*_py\d+_matmul\w*)\(([^)]*)\)", loops)
    assert len(products) == 3, loops
    for name, params in products:
        operands = [t for t in re.findall(r"memref<([^>]*)>", params) if t.endswith("bf16")]
        assert len(operands) == 2, (name, params)
    if half_path == "dpbf16ps":
        asm = f.lower(x, w, b).as_text("asm") if hostcpu.detected_target().has("avx512bf16") \
            else _assembly_with(f.lower(x, w, b), "avx512bf16")
        assert "vdpbf16ps" in asm
    if half_path == "amx":
        asm = _assembly_with(f.lower(x, w, b), *FEATURES["amx"])
        assert asm.count("$tracecomp.matmul.nest.float32.bfloat16.bfloat16.amx.32x32") == 3 and "tdpbf16ps" in asm
    _runs(half_path)
    got = [np.asarray(g) for g in f(x, w, b)]
    tx, tw, tb = (torch.from_numpy(v).requires_grad_() for v in (x, w, b))
    with torch.autocast("cpu", torch.bfloat16):
        y = torch.nn.functional.linear(tx, tw, tb)
    (y.float() * y.float()).mean().backward()
    for g, t in zip(got, (tx, tw, tb)):
        want = t.grad.numpy()
        assert g.dtype == np.float32
        assert np.abs(g - want).max() <= 2e-2 * np.abs(want).max(), np.abs(g - want).max()


def test_autocast_attention_reads_bf16_queries_keys_values():
    """Under autocast, the fused attention's products read q, k, v (and the backward's
    grad_out) in bf16, in place or as a bf16 copy, not a float32 copy; values and gradients
    as torch.autocast's within bf16's tolerance."""
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 2, 128, 64)).astype(np.float32) for _ in range(3))

    def loss(q, k, v):
        with tc.autocast(tc.bfloat16):
            o = tc.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return (o.float() * o.float()).mean()
    f = tc.trace(tc.value_and_grad(loss, argnums=(0, 1, 2)))
    loops = f.lower(q, k, v).as_text("loops")
    kernels = re.findall(r"func\.func @(\w*flash_attention\w*)\(([^)]*)\)", loops)
    assert len(kernels) == 2, loops
    for name, params in kernels:
        assert params.count("2x2x128x64xbf16>") >= (4 if "backward" in name else 3), (name, params)
    value, grads = f(q, k, v)
    tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
    with torch.autocast("cpu", torch.bfloat16):
        o = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    want = (o.float() * o.float()).mean()
    want.backward()
    assert abs(float(np.asarray(value)) - want.item()) <= 2e-2 * abs(want.item())
    for g, t in zip(grads, (tq, tk, tv)):
        assert np.abs(np.asarray(g) - t.grad.numpy()).max() <= 3e-2 * np.abs(t.grad.numpy()).max()
