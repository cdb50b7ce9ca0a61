"""AMX micro-kernels for bfloat16 and float16 products (schedule/tiles.py's "amx" and
"amx-fp16" paths; llvm/gemm/nest.py calls them on 32 x 32 tiles of C).

    void tracecomp.matmul.uk.amx.<bfloat16|float16>.32x32(i64 kc, ptr a, ptr b, ptr c, i64 ldc, i1 add)

computes the 32 x 32 float32 tile c[r * ldc + j] (+)= sum_p a(r, p) * b(p, j) with
- `a`: 32 rows of halfs, each `kcp` = kc rounded up to 32 elements (zero-padded), row after
  row (AMX's A tiles are rows of K, unlike the vdpbf16ps kernel's K-pair A panels):
  halfpack.pack_rows_function;
- `b`: K-pairs of halfs as halfpack.pack_pairs_function packs a 32-wide B micro-panel (pair
  pp's 32 lanes at b + pp * 128 bytes), zero-padded to kcp / 2 pairs: a B tile is 16 pairs
  x 16 lanes of it, 64 bytes per row with a 128-byte stride;
- tiles: tmm0-3 the four 16 x 16 float32 blocks of C, tmm4-5 the two A tiles (16 rows x 32
  halfs), tmm6-7 the two B tiles; per 32 steps of K, four tileloadd and four tdpbf16ps
  (bfloat16, AMX-BF16) or tdpfp16ps (float16, AMX-FP16: Granite Rapids).
Both products multiply pairs of halfs and accumulate in float32, as the issue's "matmuls
accumulate in float32" asks.  AVX512-FP16 (Sapphire Rapids' vfmadd*ph) is deliberately
not used for products: its FMAs round every partial sum to float16 (11-bit significand),
so a host with AVX512-FP16 but no AMX-FP16 runs float16 products on the "widen" path
(converted to float32 in the packing).
The tile configuration is a 64-byte struct on the stack (palette 1; bytes 16-47: bytes per
row of each tile, 48-63: rows): the caller loads it (configure_tiles: ldtilecfg) once before
its first kernel call and releases the tiles (release_tiles: tilerelease) after the last,
as the nest does once per call rather than per 32 x 32 tile.  Linux
hands out the tile data state only on request: runtime/amx.py asks (arch_prctl) before
anything is scheduled (runtime/tuning.py), and the AMX paths are chosen only if granted.
"""
from __future__ import annotations

import functools

import llvmlite.ir as ir

from ....core.dtypes import DType
from .. import scalar as S
from ..emitter import counted_loop
from .microkernel import helper_function
from ...schedule.tiles import AMX_K_STEP, AMX_TILE

_PTR = ir.PointerType()
I8 = ir.IntType(8)
MR = NR = AMX_TILE               # (two tile registers of 16 rows each way)
K_STEP = AMX_K_STEP              # halfs of K per tile product (64-byte tile rows)
C_TILES = {(0, 0): 0, (0, 1): 1, (1, 0): 2, (1, 1): 3}
A_TILES, B_TILES = (4, 5), (6, 7)
c64 = functools.partial(ir.Constant, S.I64)
# Linux x86-64: arch_prctl's syscall number, the request for an extended state, the tile data
SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18


PRODUCTS = {DType.bfloat16: "llvm.x86.tdpbf16ps", DType.float16: "llvm.x86.tdpfp16ps"}


def amx_microkernel_name(dtype: DType = DType.bfloat16) -> str:
    return f"tracecomp.matmul.uk.amx.{dtype.label}.{MR}x{NR}"


def tile_config() -> list[int]:
    """The 64 bytes ldtilecfg reads: palette 1, eight tiles of 16 rows x 64 bytes."""
    config = [0] * 64
    config[0] = 1
    for tile in range(8):
        config[16 + 2 * tile] = 64            # bytes per row (little-endian u16)
        config[48 + tile] = 16                # rows
    return config


def _call(b: ir.IRBuilder, name: str, args: list) -> None:
    fn = S.declare(b.module, name, ir.VoidType(), [a.type for a in args])
    b.call(fn, args)


def _tile(n: int) -> ir.Constant:
    return ir.Constant(I8, n)


def amx_microkernel(module: ir.Module, dtype: DType = DType.bfloat16) -> ir.Function:
    """The 32 x 32 AMX micro-kernel of `dtype` operands (module docstring), defined on first use."""
    fn, b = helper_function(module, dtype, amx_microkernel_name(dtype),
                            [("kc", S.I64), ("a", _PTR), ("b", _PTR), ("c", _PTR), ("ldc", S.I64), ("add", S.I1)])
    if b is None:
        return fn
    kc, a, bp, c, ldc, add = fn.args
    c_stride = b.mul(ldc, c64(4))

    def c_block(i: int, j: int) -> ir.Value:
        return b.gep(c, [b.add(b.mul(ldc, c64(16 * i)), c64(16 * j))], source_etype=S.F32)
    with b.if_else(add) as (accumulate, overwrite):
        with accumulate:
            for (i, j), t in C_TILES.items():
                _call(b, "llvm.x86.tileloadd64", [_tile(t), c_block(i, j), c_stride])
        with overwrite:
            for t in C_TILES.values():
                _call(b, "llvm.x86.tilezero", [_tile(t)])
    kcp = b.mul(b.udiv(b.add(kc, c64(K_STEP - 1)), c64(K_STEP)), c64(K_STEP))
    a_stride = b.mul(kcp, c64(2))
    with counted_loop(b, c64(0), b.udiv(kcp, c64(K_STEP)), "ks") as step:
        for r, t in enumerate(A_TILES):
            at = b.gep(a, [b.add(b.mul(c64(16 * r), kcp), b.mul(step.index, c64(K_STEP)))], source_etype=S.I16)
            _call(b, "llvm.x86.tileloadd64", [_tile(t), at, a_stride])
        for j, t in enumerate(B_TILES):       # 16 pairs of 32 lanes (128 bytes) per K step
            at = b.gep(bp, [b.add(b.mul(step.index, c64(16 * NR)), c64(16 * j))], source_etype=S.I32)
            _call(b, "llvm.x86.tileloadd64", [_tile(t), at, c64(4 * NR)])
        for (i, j), t in C_TILES.items():
            _call(b, PRODUCTS[dtype], [_tile(t), _tile(A_TILES[i]), _tile(B_TILES[j])])
    for (i, j), t in C_TILES.items():
        _call(b, "llvm.x86.tilestored64", [_tile(t), c_block(i, j), c_stride])
    b.ret_void()
    return fn


def configure_tiles(b: ir.IRBuilder) -> None:
    """Load the tile configuration (tile_config) from a stack copy: once per nest call, before
    its first micro-kernel (ldtilecfg is costly; nothing between the kernels touches tiles)."""
    config_type = ir.ArrayType(I8, 64)
    config = b.alloca(config_type, name="tilecfg")
    config.align = 64
    b.store(ir.Constant(config_type, tile_config()), config)
    _call(b, "llvm.x86.ldtilecfg", [config])


def release_tiles(b: ir.IRBuilder) -> None:
    """Back to the init state after the nest's last tile (so a context switch saves no tiles)."""
    _call(b, "llvm.x86.tilerelease", [])


def uses_amx(module: ir.Module) -> bool:
    return any(f.name.startswith("tracecomp.matmul.uk.amx.") for f in module.functions)


def request_tiles_on_load(module: ir.Module) -> ir.GlobalVariable:
    """Make `module` (an exported library's) ask Linux for the AMX tile state when it is
    loaded: a constructor calling arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) through
    libc's syscall, as runtime/amx.py does for the JIT (a C program that loads the library
    asks nothing itself; a tile instruction without the grant faults).  Returns the i8
    global the constructor sets to 1 where Linux granted it: the entry point checks it
    before any kernel runs (entry_point.ERR_NO_TILES) instead of faulting."""
    granted = ir.GlobalVariable(module, S.I8, "tracecomp.amx.granted")
    granted.linkage = "internal"
    granted.initializer = ir.Constant(S.I8, 0)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "tracecomp.amx.request_tile_data")
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    syscall = module.globals.get("syscall") or ir.Function(module, ir.FunctionType(S.I64, [S.I64], var_arg=True),
                                                           "syscall")
    answer = b.call(syscall, [c64(SYS_ARCH_PRCTL), c64(ARCH_REQ_XCOMP_PERM), c64(XFEATURE_XTILEDATA)])
    b.store(b.zext(b.icmp_signed("==", answer, c64(0)), S.I8), granted)
    b.ret_void()
    entry = ir.LiteralStructType([S.I32, _PTR, _PTR])
    ctors = ir.GlobalVariable(module, ir.ArrayType(entry, 1), "llvm.global_ctors")
    ctors.linkage = "appending"
    ctors.initializer = ir.Constant(ir.ArrayType(entry, 1),
                                    [ir.Constant(entry, [ir.Constant(S.I32, 65535), fn, ir.Constant(_PTR, None)])])
    return granted
