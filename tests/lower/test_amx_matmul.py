"""The AMX matmul paths ("amx": bfloat16, "amx-fp16": float16; schedule/tiles.py) on any host.

- Compiled: a product forced onto the path, compiled for a CPU with its features, has the
  tile instructions in its assembly, for several shapes, a batched matmul and a linear
  layer; its run is skipped, naming what the host lacks, unless the host has AMX.
- Emulated: the real loop nest (llvm/gemm/nest.py: packing, 32 x 32 tiling, edges, K
  blocks, the merge of partial tiles) compiled for this host with each tile instruction
  renamed to a Python function that does what the instruction does (TileUnit below, from
  Intel's description of ldtilecfg, tileloadd, tilestored, tilezero, tdpbf16ps/tdpfp16ps),
  run on real operands and compared with the float64 product: a layout or tiling bug shows
  here, without a Xeon.
"""
from __future__ import annotations

import ctypes
import re
import threading

import llvmlite.binding as llvm
import llvmlite.ir as ir
import numpy as np
import pytest

import tracecomp as tc
from tracecomp.core.dtypes import DType
from tracecomp.core.errors import BackendError
from tracecomp.lower import hostcpu
from tracecomp.lower.llvm import target
from tracecomp.lower.llvm.gemm.microkernel import defining_exported_helpers
from tracecomp.lower.llvm.gemm.nest import nest_function, nest_name
from tracecomp.lower.schedule import tiles
from tracecomp.runtime import tuning
from tracecomp.runtime.jit import load_system_library

pytestmark = pytest.mark.skipif(not hostcpu.host_target().triple.startswith("x86_64"),
                                reason="AMX code is generated for x86-64 hosts only")
PATHS = {DType.bfloat16: "amx", DType.float16: "amx-fp16"}
PRODUCT = {DType.bfloat16: "tdpbf16ps", DType.float16: "tdpfp16ps"}
TILE_OPS = ("ldtilecfg", "tileloadd64", "tilestored64", "tilezero", "tdpbf16ps", "tdpfp16ps", "tilerelease")


@pytest.fixture
def forced():
    """force(path): the path chosen for products from now on (restored after the test)."""
    tuning.ensure_tuned()
    before = hostcpu.tuned()

    def force(path: str) -> None:
        hostcpu.set_tuned({**before, tiles.HALF_PATH_KEY: path})
    yield force
    hostcpu.set_tuned(before)


# ---------------------------------------------------------------- compiled

def _assembly(lowered, path: str) -> str:
    """`lowered`'s LLVM IR compiled for the host's CPU with the path's features turned on."""
    target.initialize()
    host = hostcpu.host_target()
    on = "".join(f",+{f}" for f in tiles.PATH_NEEDS[path][1])
    tm = llvm.Target.from_triple(host.triple).create_target_machine(cpu=host.cpu, features=host.features + on)
    module = llvm.parse_assembly(lowered.as_text("llvm"))
    module.triple, module.data_layout = tm.triple, str(tm.target_data)
    return tm.emit_assembly(module)


def _calls(asm: str, function: str) -> int:
    """How often the assembly takes `function`'s address to call it (the large code model)."""
    return len(re.findall(r'movabsq\s+\$"?' + re.escape(function) + r'"?,', asm))


def _skip_unless_runs(path: str) -> None:
    missing = tiles.missing_for(path)
    if missing:
        pytest.skip(f"the host lacks {', '.join(missing)}: the {path} path is compiled and emulated, not run")


def _close(got, a, b) -> None:
    """Within float32 accumulation of exact half products (one float32 rounding per K block
    and tile store), relative to the sum of magnitudes."""
    want = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64))
    err = np.abs(np.asarray(got, np.float64) - want)
    assert np.all(err <= 1e-5 * scale + 1e-30), err.max()


SHAPES = [((64, 64), (64, 64)), ((37, 131), (131, 45)), ((40, 1), (1, 33)), ((3, 20, 33), (33, 70)),
          ((1, 300), (300, 17)), ((96, 600), (600, 64))]


@pytest.mark.parametrize("dtype", [DType.bfloat16, DType.float16], ids=str)
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_forced_amx_product_has_the_tile_instructions(forced, dtype, shapes):
    path = PATHS[dtype]
    forced(path)
    assert tiles.half_path(dtype, dtype) == path
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(dtype.np) for s in shapes)
    f = tc.trace(lambda x, y: x @ y)
    asm = _assembly(f.lower(a, b), path)
    m, n = shapes[0][-2] if len(shapes[0]) > 1 else 1, shapes[1][-1]
    if not tiles.uses_packed(DType.float32, m, n, shapes[0][-1]):     # (M = 1: plain loops, no tiles)
        assert "tileloadd" not in asm
    else:
        counts = {op: len(re.findall(rf"\b{op}\b", asm)) for op in
                  ("ldtilecfg", "tileloadd", PRODUCT[dtype], "tilestored", "tilerelease")}
        assert all(counts.values()), counts
        assert _calls(asm, nest_name(DType.float32, dtype, dtype)) >= 1
    _skip_unless_runs(path)
    out = f(a, b)
    assert out.dtype == dtype
    _close(np.asarray(out), a, b)


def test_batched_matmul_and_linear_take_the_amx_nest(forced):
    """The path flows to every product that reaches the packed nest: a batched matmul and a
    linear layer under autocast (forward and both gradients)."""
    forced("amx")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 40, 72)).astype(DType.bfloat16.np)
    b = rng.standard_normal((4, 72, 50)).astype(DType.bfloat16.np)
    name = nest_name(DType.float32, DType.bfloat16, DType.bfloat16)
    assert name.endswith(".amx.32x32")
    batched = tc.trace(lambda x, y: x @ y)
    assert _calls(_assembly(batched.lower(a, b), "amx"), name) >= 1
    x = rng.standard_normal((2, 48, 96)).astype(np.float32)
    w = (rng.standard_normal((80, 96)) / 10).astype(np.float32)
    bias = rng.standard_normal(80).astype(np.float32)

    def loss(x, w, bias):
        with tc.autocast(tc.bfloat16):
            y = tc.nn.functional.linear(x, w, bias)
        return (y.float() * y.float()).mean()
    step = tc.trace(tc.grad(loss, argnums=(0, 1, 2)))
    assert _calls(_assembly(step.lower(x, w, bias), "amx"), name) == 3
    _skip_unless_runs("amx")
    for got, want_a, want_b in zip(np.asarray(batched(a, b)), a, b):
        _close(got, want_a, want_b)


def test_missing_amx_names_the_features():
    for path, (_, needs) in tiles.PATH_NEEDS.items():
        missing = tiles.missing_for(path)
        assert set(missing) - set(needs) <= {m for m in missing if "permission" in m}
        assert all(not hostcpu.host_target().has(f) for f in missing if f in needs)


def test_amx_tiles_pad_k_to_the_tile_step(forced):
    t = tiles.amx_tiles(48 << 10, 2 << 20)
    assert (t.mr, t.nr, t.k_step, t.kc, t.mc) == (32, 32, 32, 512, 384)
    assert [t.panel_depth(k) for k in (1, 32, 33, 64)] == [16, 16, 32, 32]
    forced("amx")
    bl = tiles.blocks(DType.float32, 37, 45, 131, (DType.bfloat16, DType.bfloat16))
    k_blocks = -(-131 // bl.tiles.kc)                   # equal K blocks, each padded to 32
    assert (bl.tiles.mr, bl.mc, bl.nc, bl.kc) == (32, 64, 64, -(-(-(-131 // k_blocks)) // 32) * 32)
    assert bl.a_elements == 64 * bl.kc // 2 and bl.b_elements == bl.kc // 2 * 64
    assert tiles.blocks(DType.float32, 37, 45, 131, (DType.float32, DType.bfloat16)).tiles.mr != 32


# ---------------------------------------------------------------- emulated

class Registers:
    def __init__(self):
        self.tiles = np.zeros((8, 16, 64), np.uint8)
        self.rows = self.colsb = None


class TileUnit:
    """Eight tile registers and a tile configuration, as the instructions see them (Intel
    SDM: rows and bytes per row from the palette-1 config; loads zero the rest of a tile;
    a tile product requires C.rows == A.rows, A.colsb / 4 == B.rows, B.colsb == C.colsb, and
    adds the float32 products of pairs of halfs).  Memory is read and written at the raw
    addresses the compiled code passes; an access that starts inside a known buffer must
    end inside it too.  Problems are collected in `errors` (a callback cannot raise).  Each
    thread (an OpenMP worker running its work items) has registers of its own."""

    def __init__(self, dtype: DType, buffers: list[np.ndarray]):
        self.dtype = dtype
        self.threads: dict[int, Registers] = {}         # by OS thread: each core has its own tiles
        self.ranges = [(x.ctypes.data, x.ctypes.data + x.nbytes) for x in buffers]
        self.errors: list[str] = []
        self.products = self.configs = 0

    @property
    def r(self) -> "Registers":
        return self.threads.setdefault(threading.get_ident(), Registers())

    def ldtilecfg(self, at: int) -> None:
        self.configs += 1
        config = np.frombuffer(ctypes.string_at(at, 64), np.uint8)
        assert config[0] == 1, f"palette {config[0]}"
        self.r.colsb = config[16:32].view(np.uint16).copy()
        self.r.rows = config[48:56].copy()
        assert np.all(self.r.colsb <= 64) and np.all(self.r.rows <= 16)

    def configured(self, t: int) -> tuple[int, int]:
        assert self.r.rows is not None, "tile instruction without ldtilecfg"
        return int(self.r.rows[t]), int(self.r.colsb[t])

    def check(self, start: int, end: int) -> None:
        for lo, hi in self.ranges:
            if lo <= start < hi:
                assert end <= hi, f"access [{start:#x}, {end:#x}) runs past a buffer ending at {hi:#x}"

    def tileloadd64(self, t: int, at: int, stride: int) -> None:
        rows, colsb = self.configured(t)
        self.r.tiles[t] = 0
        for r in range(rows):
            self.check(at + r * stride, at + r * stride + colsb)
            self.r.tiles[t, r, :colsb] = np.frombuffer(ctypes.string_at(at + r * stride, colsb), np.uint8)

    def tilestored64(self, t: int, at: int, stride: int) -> None:
        rows, colsb = self.configured(t)
        for r in range(rows):
            self.check(at + r * stride, at + r * stride + colsb)
            ctypes.memmove(at + r * stride, self.r.tiles[t, r, :colsb].tobytes(), colsb)

    def tilezero(self, t: int) -> None:
        self.configured(t)
        self.r.tiles[t] = 0

    def halves(self, t: int, rows: int, colsb: int) -> np.ndarray:
        bits = self.r.tiles[t, :rows, :colsb].copy().view(np.uint16)
        if self.dtype is DType.float16:
            return bits.view(np.float16).astype(np.float64)
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)

    def product(self, c: int, a: int, b: int, dtype: DType) -> None:
        assert dtype is self.dtype, f"{PRODUCT[dtype]} on {self.dtype} operands"
        (cr, cc), (ar, ac), (br, bc) = (self.configured(t) for t in (c, a, b))
        assert cr == ar and ac // 4 == br and bc == cc, f"tile shapes C {cr}x{cc} A {ar}x{ac} B {br}x{bc}"
        av = self.halves(a, ar, ac).reshape(ar, br, 2)            # row m: pairs k
        bv = self.halves(b, br, bc).reshape(br, bc // 4, 2)       # pair row k: columns n
        acc = self.r.tiles[c, :cr, :cc].copy().view(np.float32).astype(np.float64)
        acc += np.einsum("mke,kne->mn", av, bv)
        self.r.tiles[c, :cr, :cc] = acc.astype(np.float32).view(np.uint8).reshape(cr, cc)
        self.products += 1

    def tilerelease(self) -> None:
        self.r.rows = self.r.colsb = None
        self.r.tiles[:] = 0


_unit: list = [None]         # the TileUnit the compiled code's tile instructions reach


def _forward(name: str, *extra):
    def call(*args):
        unit = _unit[0]
        try:
            getattr(unit, name)(*args, *extra)
        except Exception as e:          # noqa: BLE001 (reported through `errors`)
            unit.errors.append(f"{name}{args}: {e!r}")
    return call


_sig, _i8, _p = ctypes.CFUNCTYPE, ctypes.c_int8, ctypes.c_void_p
CALLBACKS = {
    "ldtilecfg": _sig(None, _p)(_forward("ldtilecfg")),
    "tileloadd64": _sig(None, _i8, _p, ctypes.c_int64)(_forward("tileloadd64")),
    "tilestored64": _sig(None, _i8, _p, ctypes.c_int64)(_forward("tilestored64")),
    "tilezero": _sig(None, _i8)(_forward("tilezero")),
    "tdpbf16ps": _sig(None, _i8, _i8, _i8)(_forward("product", DType.bfloat16)),
    "tdpfp16ps": _sig(None, _i8, _i8, _i8)(_forward("product", DType.float16)),
    "tilerelease": _sig(None)(_forward("tilerelease")),
}
_engines: dict = {}


def _emulated_engine(text: str):
    """LLVM IR `text` compiled for this host with its tile instructions calling the current
    TileUnit (an MCJIT engine, which owns its target machine)."""
    text = re.sub(r'@"?llvm\.x86\.(' + "|".join(TILE_OPS) + r')"?', r'@"emu.\1"', text)
    # plain functions now: no intrinsic-only `immarg`, no attributes that promise less than a call does
    text = re.sub(r'^(declare [^@]*@"emu\.\w+")\(([^)]*)\).*$',
                  lambda m: m.group(1) + "(" + m.group(2).replace(" immarg", "") + ")", text, flags=re.M)
    assert '"emu.ldtilecfg"' in text and "llvm.x86.t" not in text
    target.initialize()
    load_system_library("gomp")          # (a parallel product's team)
    for name, callback in CALLBACKS.items():
        llvm.add_symbol(f"emu.{name}", ctypes.cast(callback, ctypes.c_void_p).value)
    parsed = llvm.parse_assembly(text)
    parsed.verify()
    host = hostcpu.host_target()
    tm = llvm.Target.from_triple(host.triple).create_target_machine(cpu=host.cpu, features=host.features,
                                                                     codemodel="jitdefault")
    engine = llvm.create_mcjit_compiler(parsed, tm)
    engine.finalize_object()
    return engine


def _emulated_nest(dtype: DType):
    """The AMX nest of `dtype` operands compiled (once) by _emulated_engine, as a ctypes
    function (nest.py's signature)."""
    if dtype not in _engines:
        module = ir.Module("amx_emulated")
        with defining_exported_helpers():
            fn = nest_function(module, DType.float32, dtype, dtype)
        engine = _emulated_engine(str(module))
        p, i = ctypes.c_void_p, ctypes.c_int64
        signature = ctypes.CFUNCTYPE(None, p, i, i, p, i, i, p, i, i, i, i, i, i, i, i, i, i, p, i, ctypes.c_bool,
                                     p, p, p, p, p, p)
        _engines[dtype] = engine, signature(engine.get_function_address(fn.name))
    return _engines[dtype][1]


def _aligned(shape: tuple, dtype) -> np.ndarray:
    """A 64-byte aligned array (the kernels assume it of their buffers)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _run_program_emulated(lowered, dtype: DType, args: list) -> dict:
    """Every kernel of a lowered program with static shapes and no loops, in order, from
    its LLVM IR compiled by _emulated_engine: the scheduler's workspace, the code
    generator's blocks and work items and the nest, with the tile instructions emulated.
    Returns the buffers by name (inputs in0, in1, ...)."""
    program = lowered.cpu_program
    assert not program.steps and all(not k.sizes for k in program.kernels)
    engine = _emulated_engine(lowered.as_text("llvm"))
    unit = _unit[0] = TileUnit(dtype, [])
    buffers = {f"in{i}": a for i, a in enumerate(args)}
    for k in program.kernels:
        for buf in k.buffers:
            if buf.name not in buffers:
                buffers[buf.name] = _aligned(buf.shape, buf.dtype.np)
                if np.issubdtype(buffers[buf.name].dtype, np.floating) or buf.dtype.is_half:
                    buffers[buf.name].fill(np.nan)        # (stale workspace bytes: NaN)
        unit.ranges = [(x.ctypes.data, x.ctypes.data + x.nbytes) for x in buffers.values()]
        call = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * len(k.buffers))(engine.get_function_address(k.name))
        call(*[buffers[buf.name].ctypes.data for buf in k.buffers])
    assert not unit.errors, unit.errors[:3]
    assert unit.products and all(r.rows is None for r in unit.threads.values())
    del engine
    return buffers


def _run_emulated(dtype, a, b, c, *, kc=None, mc=None, nc=None, m_range=None, n_range=None, accumulate=False):
    """C (+)= A @ B through the emulated nest; a, b, c any strided NumPy views."""
    m, k = a.shape
    n = b.shape[1]
    bl = tiles.blocks(DType.float32, m, n, k, (dtype, dtype))
    t = bl.tiles
    kc, mc, nc = kc or bl.kc, mc or bl.mc, nc or bl.nc
    a_elements = -(-mc * t.panel_depth(kc) // 16) * 16
    ws = np.full(a_elements + t.panel_depth(kc) * nc, np.nan, np.float32)     # stale bytes: NaN
    nest = _emulated_nest(dtype)
    unit = _unit[0] = TileUnit(dtype, [x if x.base is None else x.base for x in (a, b, c)] + [ws])
    m_lo, m_hi = m_range or (0, m)
    n_lo, n_hi = n_range or (0, n)
    step = [s // a.itemsize for s in a.strides] + [s // b.itemsize for s in b.strides]
    nest(a.ctypes.data, *step[:2], b.ctypes.data, *step[2:], c.ctypes.data, c.strides[0] // 4, c.strides[1] // 4,
         m_lo, m_hi, n_lo, n_hi, k, kc, mc, nc, ws.ctypes.data, a_elements, accumulate, *[None] * 6)
    assert not unit.errors, unit.errors[:3]
    assert unit.configs == 1 and unit.r.rows is None, "one ldtilecfg per nest call, tilerelease at its end"
    return unit


CASES = [  # (m, n, k), block overrides
    ((64, 64, 64), {}), ((37, 45, 131), {}), ((1, 1, 1), {}), ((1, 40, 7), {}), ((33, 95, 1), {}),
    ((70, 33, 600), {"kc": 96, "mc": 64, "nc": 64}), ((100, 130, 70), {"kc": 32, "mc": 32, "nc": 32}),
]


@pytest.mark.parametrize("dtype", [DType.bfloat16, DType.float16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_emulated_amx_nest_computes_the_product(forced, dtype, case):
    """Row-major operands: edge tiles in m and n, K padded to 32, several K, M and N blocks."""
    forced(PATHS[dtype])
    (m, n, k), overrides = case
    rng = np.random.default_rng(m * 1000 + n + k)
    a = rng.standard_normal((m, k)).astype(dtype.np)
    b = rng.standard_normal((k, n)).astype(dtype.np)
    c = np.full((m, n), np.nan, np.float32)
    unit = _run_emulated(dtype, a, b, c, **overrides)
    _close(c, a, b)
    kc = overrides.get("kc") or tiles.blocks(DType.float32, m, n, k, (dtype, dtype)).kc
    k_blocks = -(-k // kc)
    per_block = sum(-(-min(kc, k - p) // 32) for p in range(0, k, kc))
    assert unit.products == 4 * -(-m // 32) * -(-n // 32) * per_block, (unit.products, k_blocks)


@pytest.mark.parametrize("dtype", [DType.bfloat16, DType.float16], ids=str)
def test_emulated_amx_nest_reads_views_and_accumulates(forced, dtype):
    """A transposed (the element-by-element packing), B with strided rows, C transposed
    (every tile through the scratch tile and the merge), one work item's sub-range, and
    accumulation into C."""
    forced(PATHS[dtype])
    rng = np.random.default_rng(7)
    m, n, k = 50, 70, 45
    a = rng.standard_normal((k + 3, m)).astype(dtype.np)[3:].T              # (m, k), column-major
    b = rng.standard_normal((k, 2 * n)).astype(dtype.np)[:, ::2]            # row stride 2n, col stride 2
    c_mem = rng.standard_normal((n, m)).astype(np.float32)
    c = c_mem.T                                                             # (m, n), column-major
    before = c.astype(np.float64).copy()
    _run_emulated(dtype, a, b, c, m_range=(32, 50), n_range=(0, 64), accumulate=True, kc=32)
    want = before.copy()
    want[32:50, 0:64] += a[32:50].astype(np.float64) @ b[:, 0:64].astype(np.float64)
    scale = np.abs(before) + 1.0
    scale[32:50, 0:64] += np.abs(a[32:50].astype(np.float64)) @ np.abs(b[:, 0:64].astype(np.float64))
    assert np.all(np.abs(c - want) <= 1e-5 * scale)


@pytest.mark.parametrize("dtype", [DType.bfloat16, DType.float16], ids=str)
@pytest.mark.parametrize("k", [1, 31, 33, 77])
def test_emulated_amx_nest_reads_a_transposed_weight(forced, dtype, k):
    """x @ w.T as a linear layer reads it: B's columns contiguous (the pairs packing's 32-bit
    loads along K), its padding pairs zeroed, a ragged N."""
    forced(PATHS[dtype])
    rng = np.random.default_rng(k)
    a = rng.standard_normal((40, k)).astype(dtype.np)
    w = rng.standard_normal((45, k)).astype(dtype.np)
    c = np.full((40, 45), np.nan, np.float32)
    _run_emulated(dtype, a, w.T, c)
    _close(c, a, w.T)


def test_an_exported_library_with_amx_asks_for_the_tiles_when_loaded():
    """Its constructor (.ctors, which the linker folds into .init_array) calls arch_prctl through libc's syscall, since a C
    program loading it asks nothing; modules without AMX kernels get none."""
    from tracecomp.lower.llvm.gemm.amx import amx_microkernel, request_tiles_on_load, uses_amx
    plain = ir.Module("plain")
    assert not uses_amx(plain)
    module = ir.Module("exported")
    amx_microkernel(module)
    assert uses_amx(module)
    request_tiles_on_load(module)
    target.initialize()
    host = hostcpu.host_target()
    tm = llvm.Target.from_triple(host.triple).create_target_machine(
        cpu=host.cpu, features=host.features + ",+amx-tile,+amx-bf16", reloc="pic")
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    asm = tm.emit_assembly(parsed)
    assert re.search(r"\.section\s+\.(init_array|ctors)", asm) and re.search(r"\$syscall\b", asm) and "$158," in asm


@pytest.mark.parametrize("dtype", [DType.bfloat16, DType.float16], ids=str)
@pytest.mark.parametrize("m, k", [(64, 45), (96, 600), (70, 1)])
def test_emulated_amx_nest_reads_a_transposed_a(forced, dtype, m, k):
    """x.mT @ g as a weight gradient reads it: A's rows contiguous (whole panels transposed
    in registers, K padded with zero rows), the last panel element by element."""
    forced(PATHS[dtype])
    rng = np.random.default_rng(m + k)
    a = rng.standard_normal((k, m)).astype(dtype.np).T
    b = rng.standard_normal((k, 40)).astype(dtype.np)
    c = np.full((m, 40), np.nan, np.float32)
    _run_emulated(dtype, a, b, c, kc=min(k, 256) if k > 1 else None)
    _close(c, a, b)


def _half_close(got, want, dtype: DType) -> None:
    ulp = np.spacing(np.abs(want).astype(dtype.np)).astype(np.float64)
    assert np.all(np.abs(np.asarray(got, np.float64) - want) <= ulp + 1e-6 * np.abs(want).max())


@pytest.mark.parametrize("dtype", [DType.bfloat16, DType.float16], ids=str)
@pytest.mark.parametrize("case", ["matmul", "batched", "epilogue", "transposed"])
def test_emulated_amx_program(forced, case, dtype):
    """Whole compiled programs on the AMX paths, tile instructions emulated: a ragged
    product rounded to the half dtype, a batched one run by a team of threads, a float32
    product with a fused bias and relu, and x @ w.T (a linear layer's weight read transposed)."""
    forced(PATHS[dtype])
    rng = np.random.default_rng(11)
    bf = dtype.np
    if case == "matmul":
        fn, args = (lambda x, y: x @ y), [rng.standard_normal(s).astype(bf) for s in ((70, 45), (45, 33))]
    elif case == "batched":
        fn, args = (lambda x, y: x @ y), [rng.standard_normal(s).astype(bf) for s in ((4, 70, 72), (4, 72, 150))]
    elif case == "epilogue":
        fn = (lambda x, y, b: tc.relu(x.float() @ y.float() + b))
        args = [rng.standard_normal(s).astype(bf) for s in ((40, 96), (96, 50))] + \
            [rng.standard_normal(50).astype(np.float32)]
    else:
        fn, args = (lambda x, w: x @ w.T), [rng.standard_normal(s).astype(bf) for s in ((40, 96), (66, 96))]
    lowered = tc.trace(fn).lower(*args)
    out = lowered.cpu_program.kernels[-1].buffers[-1]
    got = _run_program_emulated(lowered, dtype, args)[out.name]
    x, y = (v.astype(np.float64) for v in args[:2])
    want = {"matmul": lambda: x @ y, "batched": lambda: x @ y, "transposed": lambda: x @ y.T,
            "epilogue": lambda: np.maximum(x @ y + args[2], 0)}[case]()
    if got.dtype == bf:
        _half_close(got, want, dtype)
    else:
        assert np.all(np.abs(got - want) <= 1e-5 * (np.abs(x) @ np.abs(y if case != "transposed" else y.T)) + 1e-6)


CONV_CASES = [  # (N, C, H, W), (O, kh, kw), stride, padding, dilation, groups
    ((2, 8, 9, 37), (40, 3, 3), (1, 1), (1, 1), (1, 1), 1),       # micro-panels across output rows
    ((2, 7, 14, 13), (12, 3, 3), (2, 1), (2, 2), (2, 2), 1),      # stride, dilation, ragged channels
    ((2, 12, 10, 10), (66, 3, 3), (1, 1), (1, 1), (1, 1), 3),     # groups: M = 22, K = 36 (padded to 64)
]


def _conv_inputs(dtype: DType, xs, ws, groups):
    rng = np.random.default_rng(sum(xs))
    x = rng.standard_normal(xs).astype(dtype.np)
    w = (rng.standard_normal((ws[0], xs[1] // groups, ws[1], ws[2])) / 4).astype(dtype.np)
    return x, w


@pytest.mark.parametrize("dtype", [DType.bfloat16, DType.float16], ids=str)
@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", CONV_CASES)
def test_emulated_amx_conv2d(forced, dtype, xs, ws, stride, padding, dilation, groups):
    """A half conv2d as implicit GEMM on the AMX path, tile instructions emulated: B's
    K-pairs packed from the half input's windows (zero-padded to 32 deep), A's rows of K;
    values as torch's float32 conv of the same half values, rounded once."""
    torch = pytest.importorskip("torch")
    forced(PATHS[dtype])
    x, w = _conv_inputs(dtype, xs, ws, groups)
    lowered = tc.trace(lambda x, w: tc.conv2d(x, w, None, stride, padding, dilation, groups)).lower(x, w)
    llvm_text = lowered.as_text("llvm")
    assert nest_name(DType.float32, dtype, dtype) in llvm_text
    assert f"tracecomp.matmul.pack_windows.{dtype.label}.pairs.32.k32" in llvm_text
    got = _run_program_emulated(lowered, dtype, [x, w])[lowered.cpu_program.kernels[-1].buffers[-1].name]
    tx, tw = (torch.from_numpy(v.astype(np.float32)) for v in (x, w))
    want = torch.nn.functional.conv2d(tx, tw, None, stride, padding, dilation, groups).double().numpy()
    _half_close(got, want, dtype)


@pytest.mark.parametrize("dtype", [DType.bfloat16, DType.float16], ids=str)
def test_forced_amx_conv2d_has_the_tile_instructions(forced, dtype):
    """Compiled for a CPU with AMX, the conv's product calls the AMX nest, which packs the
    windows of the half input; run only where the host has AMX."""
    forced(PATHS[dtype])
    x, w = _conv_inputs(dtype, (2, 8, 12, 12), (16, 3, 3), 1)
    fn = tc.trace(lambda x, w: tc.conv2d(x, w, None, 1, 1))
    asm = _assembly(fn.lower(x, w), PATHS[dtype])
    nest = nest_name(DType.float32, dtype, dtype)
    assert _calls(asm, nest) >= 1 and PRODUCT[dtype] in asm and "tileloadd" in asm
    assert f"tracecomp.matmul.pack_windows.{dtype.label}.pairs.32.k32:" in asm
    _skip_unless_runs(PATHS[dtype])
    got = np.asarray(fn(x, w)).astype(np.float64)
    want = np.asarray(tc.trace(lambda x, w: tc.conv2d(x.float(), w.float(), None, 1, 1))(x, w), np.float64)
    _half_close(got, want, dtype)


def test_emulated_amx_attention_under_autocast(forced):
    """The fused attention's products (q k^T and p v per batch item, on the thread that runs
    it: one workspace slice per thread) reach the amx nest; values as torch.autocast's."""
    torch = pytest.importorskip("torch")
    forced("amx")
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 2, 128, 64)).astype(np.float32) for _ in range(3))

    def attention(q, k, v):
        with tc.autocast(tc.bfloat16):
            return tc.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    lowered = tc.trace(attention).lower(q, k, v)
    assert nest_name(DType.float32, DType.bfloat16, DType.bfloat16) in lowered.as_text("llvm")
    got = _run_program_emulated(lowered, DType.bfloat16, [q, k, v])[lowered.cpu_program.kernels[-1].buffers[-1].name]
    with torch.autocast("cpu", torch.bfloat16):
        want = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), is_causal=True)
    want = want.double().numpy()
    assert np.abs(got.astype(np.float64) - want).max() <= 1e-2 * np.abs(want).max()


def test_forced_amx_without_amx_is_a_clear_error(forced):
    """Compiling a forced AMX product for a CPU without AMX raises BackendError naming the
    features (LLVM's instruction selection would abort the process)."""
    if not tiles.missing_for("amx"):
        pytest.skip("this host has AMX: the forced path compiles")
    forced("amx")
    a = np.ones((64, 64), DType.bfloat16.np)
    missing = [f for f in ("amx-tile", "amx-bf16") if not hostcpu.host_target().has(f)]
    with pytest.raises(BackendError, match=f"no {', '.join(missing)}"):
        tc.trace(lambda x, y: x @ y)(a, a)


def test_info_names_each_dtypes_path_and_why_not_a_faster_one():
    from tracecomp.runtime import host
    info = host.describe()
    line = next(x for x in host.report(info).splitlines() if x.startswith("matmul paths: "))
    for dtype, path in tiles.half_paths().items():
        assert f"{dtype}: {host.PATH_TEXT[path]}" in line
    sapphire = {"vector_features": ["avx512fp16", "amx-tile", "amx-bf16"], "amx_tile_data": False}
    assert "Linux refused" in host.path_text(sapphire, "bfloat16", "dpbf16ps")
    assert "accumulate in float16" in host.path_text(sapphire, "float16", "widen")
    assert host.path_text({**sapphire, "amx_tile_data": True}, "bfloat16", "amx") == host.PATH_TEXT["amx"]


def test_an_exported_library_refused_the_tile_state_returns_an_error_before_any_kernel(forced, tmp_path):
    """Where Linux does not grant the tile state (here: no AMX), the exported library's
    constructor records the refusal and its entry point returns ERR_NO_TILES, which its
    error string explains, instead of faulting on the first tile instruction; tc.load
    raises it as a BackendError.  (Compiled for a CPU with AMX, linked with cc, loaded.)"""
    import shutil
    import subprocess
    from tracecomp.aot.loader import ExportedFunction
    from tracecomp.aot.shared_library import lower_for_export
    from tracecomp.lower.llvm.entry_point import ERR_NO_TILES, build_module
    from tracecomp.runtime import amx as runtime_amx
    if runtime_amx.request_tile_data():
        pytest.skip("Linux granted this process the AMX tile state: the refusal cannot be seen here")
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to link the library")
    forced("amx")
    a = np.ones((40, 64), DType.bfloat16.np)
    b = np.ones((64, 48), DType.bfloat16.np)
    _, program = lower_for_export(lambda a, b: a @ b, [a, b])
    module = build_module(program, "product", {"format": 1}, [])
    target.initialize()
    host = hostcpu.host_target()
    tm = llvm.Target.from_triple(host.triple).create_target_machine(
        cpu=host.cpu, features=host.features + ",+amx-tile,+amx-bf16", reloc="pic", codemodel="default")
    parsed = llvm.parse_assembly(str(module))          # (for a CPU with AMX: not target.py's host check)
    parsed.triple, parsed.data_layout = tm.triple, str(tm.target_data)
    (tmp_path / "product.o").write_bytes(tm.emit_object(parsed))
    subprocess.run(["cc", "-shared", "-o", str(tmp_path / "libproduct.so"), str(tmp_path / "product.o"),
                    "-lm", "-lgomp"], check=True)
    library = ctypes.CDLL(str(tmp_path / "libproduct.so"))
    entry, error_string = library.product, library.product_error_string
    entry.restype, entry.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]
    error_string.restype, error_string.argtypes = ctypes.c_char_p, [ctypes.c_int]
    out = np.zeros((40, 48), program.buffers[program.outputs[0]].dtype.np)
    inputs = (ctypes.c_void_p * 2)(a.ctypes.data, b.ctypes.data)
    outputs = (ctypes.c_void_p * 1)(out.ctypes.data)
    assert entry(inputs, outputs) == ERR_NO_TILES
    message = error_string(ERR_NO_TILES).decode()
    assert "AMX tile state" in message
    stand_in = ExportedFunction.__new__(ExportedFunction)
    stand_in.name, stand_in._error_string = "product", error_string
    with pytest.raises(BackendError, match="AMX tile state"):
        raise stand_in._failure(ERR_NO_TILES, {})
