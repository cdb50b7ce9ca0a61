"""Block sizes of the CPU matmul (llvm/gemm/matmul.py) and the workspace they need, derived
from the CPU code is generated for (hostcpu.py: its vector ISA and its caches).

The packed kernel (GotoBLAS/BLIS structure) computes C in register tiles of MR x NR from
panels it copies into the workspace: a KC x NC panel of B (in micro-panels of NR columns)
and an MC x KC block of A (in micro-panels of MR rows).  `choose_tiles` derives them:
- L (lanes): one vector register of the target's widest ISA (AVX-512: 16 f32 or 8 f64;
  AVX/AVX2: 8 or 4; else 4 or 2);
- MR x NR, NR = 2 L: the MR * 2 accumulators, the two B vectors of a step and one
  broadcast of A must fit the vector registers, and there must be >= 8 accumulators to
  hide the FMA latency (two pipes x four cycles).  With AVX-512's 32 registers that is
  8 x 2L (16 accumulators; on Zen 5 every tile from 6 x 32 to 14 x 32 ran at the FMA peak
  in L1, and 8 x 32 was best on whole products by a few percent: BENCHMARKS.md, "Figures
  that were in the code"); with AVX2's 16 it is 6 x 2L (12 + 2 + 1 = 15 registers, as
  BLIS's Haswell kernel); an 8 x 2L tile there needs 19 and spills;
- KC: the B micro-panel (KC x NR) stays in L1 while the A micro-panels stream past it: 2/3
  of L1d, the rest for the A micro-panel and the C tile (Zen 5, 48 KB: 256 * 32 * 4 =
  32 KB); a KC of 384 or 512 gained nothing there.  Each K-block reads and writes C once
  more, which the micro-kernel hides by prefetching its C tile;
- MC: the A block (MC x KC) stays in L2 while B's micro-panels stream through L1: 3/16 of
  L2 (Zen 5, 1 MB: f32 192 x 256 -> 192 KB), well under it because each core's L2 also
  holds B micro-panels and C lines in flight;
- NC: the B panel (KC x NC) is read from L3 (shared) once per A block: 2048 columns ->
  2 MB (f32, KC 256) per thread, a fraction of a server L3.
For a small problem each block shrinks to the problem (rounded up to whole tiles), and so
does the workspace: `workspace_elements` is what the scheduler allocates, per-thread
panels (each 64-byte aligned) for up to `max_threads()` threads.  The tiles are part of the
compile cache's key (runtime/cache.py), since the same CPU name can come with other caches.
Products of half operands on an AMX path (half_path) block by `amx_tiles` instead: 32 x 32
tiles of C, K-blocks padded to 32 (product_tiles, Tiles.panel_depth).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Optional

from .. import hostcpu
from ...core.dtypes import DType

MIN_PACKED_SIDE = 8             # thinner products run faster as vectorized plain loops...
THIN_PACKED_FLOPS = 1 << 22     # ...unless big enough that reading B once wins (m, n >= 2)
SPLIT_MIN_TILES = 4             # register tiles a dim needs for threads to split it (2 x 2 items)


@dataclass(frozen=True)
class Tiles:
    mr: int           # register tile rows
    nv: int           # register tile columns, in vectors
    lanes: int        # elements per vector register
    mc: int           # A block rows (a multiple of mr)
    kc: int           # depth of a packed panel
    nc: int           # B panel columns (a multiple of nr)
    itemsize: int     # bytes per element
    k_step: int = 1       # K granule of the micro-kernel: each packed K-block is zero-padded to it
    k_per_slot: int = 1   # K elements per `itemsize` slot of a packed row (2: pairs of halfs in a float32)

    @property
    def nr(self) -> int:
        return self.nv * self.lanes

    def panel_depth(self, kc: int) -> int:
        """Workspace elements per row (or column) of a micro-panel kc deep."""
        return _round_up(kc, self.k_step) // self.k_per_slot

    @property
    def vector_bytes(self) -> int:
        return self.lanes * self.itemsize


PACKED_DTYPES = (DType.float32, DType.float64)
# when sysfs does not say: Zen 5's per-core L1d and L2
DEFAULT_L1D, DEFAULT_L2 = 48 << 10, 1 << 20


@dataclass(frozen=True)
class VectorUnit:
    """What the register tile depends on: the vector width and the register count."""
    bytes: int
    registers: int


VECTOR_BYTES = (16, 32, 64)          # SSE, AVX, AVX-512


def vector_unit(target: hostcpu.HostTarget) -> VectorUnit:
    """The widest vectors of the target's ISA and how many registers of them it has."""
    if target.has("avx512f"):
        return VectorUnit(64, 32)
    if target.has("avx"):
        return VectorUnit(32, 16)
    return VectorUnit(16, 16)


def choose_tiles(dtype: DType, unit: VectorUnit, l1d: int, l2: int) -> Tiles:
    """The tiles for `dtype` on a CPU with `unit` and these per-core cache sizes (the
    reasons: the module's docstring)."""
    lanes, nv = unit.bytes // dtype.itemsize, 2
    # the largest MR whose accumulators, B vectors and broadcast fit the registers
    mr = min(8, (unit.registers - nv - 1) // nv)
    nr = nv * lanes
    kc = max(64, _round_down(l1d * 2 // 3 // (nr * dtype.itemsize), 32))
    mc = max(4 * mr, _round_down(l2 * 3 // 16 // (kc * dtype.itemsize), mr))
    return Tiles(mr=mr, nv=nv, lanes=lanes, mc=mc, kc=kc, nc=_round_down(2048, nr), itemsize=dtype.itemsize)


def host_tiles() -> dict:
    """The tiles of each packed dtype for the CPU code is generated for: its vector unit,
    narrowed to the vector width measured best on it if one was (hostcpu.tuned(): on an
    AVX-512 CPU, 256-bit vectors can beat 512-bit ones), and its caches."""
    unit = vector_unit(hostcpu.host_target())
    measured = hostcpu.tuned().get("matmul_vector_bytes")
    if measured in VECTOR_BYTES and measured < unit.bytes:
        unit = VectorUnit(measured, unit.registers)
    return _tiles(unit, *_cache_sizes())


@functools.lru_cache(maxsize=None)
def _cache_sizes() -> tuple[int, int]:
    """L1d and L2 per core (read once: tiles are asked for all through code generation)."""
    return hostcpu.cache_bytes(1) or DEFAULT_L1D, hostcpu.cache_bytes(2) or DEFAULT_L2


@functools.lru_cache(maxsize=None)
def _tiles(unit: VectorUnit, l1d: int, l2: int) -> dict:
    return {dtype: choose_tiles(dtype, unit, l1d, l2) for dtype in PACKED_DTYPES}


def tiles_for(dtype: DType) -> Tiles:
    return host_tiles()[dtype]


# How a float32 product reads bfloat16/float16 operands (schedule/matmul.py reads them in
# place): "widen" converts them to float32 inside the packing and runs the f32 micro-kernel;
# "dpbf16ps" (both bfloat16, AVX-512 with AVX512-BF16; zmm, or ymm where 256-bit matmul
# vectors were measured best) packs them as K-pairs of bf16 for vdpbf16ps, which
# multiplies the pairs of each 32-bit lane and adds them in float32; "amx" (both bfloat16)
# and "amx-fp16" (both float16) pack A as rows of K and B as K-pairs, both zero-padded to
# 32 deep, for AMX's tdpbf16ps / tdpfp16ps on 32 x 32 tiles (llvm/gemm/amx.py), which also
# accumulate in float32.  AVX512-FP16 is no path: its FMAs accumulate in float16.
HALF_PATHS = ("amx", "amx-fp16", "dpbf16ps", "widen")
HALF_PATH_KEY = "matmul_half_path"      # hostcpu.tuned() key that forces one path (tests)
AMX_PATHS = ("amx", "amx-fp16")
# per path (in order of preference): the operand dtype it takes, the CPU features it runs on
PATH_NEEDS = {"amx": (DType.bfloat16, ("amx-tile", "amx-bf16")),
              "amx-fp16": (DType.float16, ("amx-tile", "amx-fp16")),
              "dpbf16ps": (DType.bfloat16, ("avx512f", "avx512bf16"))}
AMX_TILE, AMX_K_STEP = 32, 32          # C tile side; K per tile product (64-byte rows of halfs)


def half_path(a: DType, b: DType) -> str:
    """The path of a float32 product of operands of dtypes `a` and `b` (one of them half):
    the forced one (HALF_PATH_KEY) if it takes them, else the first that runs here."""
    if a is not b or not a.is_half:
        return "widen"
    usable = [p for p, (d, _) in PATH_NEEDS.items() if d is a and _generates(p)]
    forced = hostcpu.tuned().get(HALF_PATH_KEY)
    if forced in usable or forced == "widen":
        return forced
    return next((p for p in usable if not missing_for(p)), "widen")


def _generates(path: str) -> bool:
    """Whether code for `path` can be generated for this target (it may not run here):
    the dpbf16ps kernel is built on the f32 tiles' AVX-512 vectors; AMX code needs x86-64."""
    if path == "dpbf16ps":
        return tiles_for(DType.float32).lanes in (8, 16) and hostcpu.host_target().has("avx512f")
    return hostcpu.host_target().triple.startswith("x86_64")


def missing_for(path: str) -> list[str]:
    """What this host lacks to run `path`: CPU features, or Linux's grant of the AMX tile
    state (runtime/amx.py asks, hostcpu.tile_data_granted records the answer)."""
    if path not in PATH_NEEDS:
        return []
    target = hostcpu.host_target()
    missing = [f for f in PATH_NEEDS[path][1] if not target.has(f)]
    if path in AMX_PATHS and not missing and not hostcpu.tile_data_granted():
        missing.append("Linux's AMX tile data permission (arch_prctl ARCH_REQ_XCOMP_PERM)")
    return missing


def half_paths() -> dict:
    """{dtype label: path} of products of two operands of that half dtype (`tracecomp info`,
    the compile cache's key)."""
    return {d.label: half_path(d, d) for d in (DType.bfloat16, DType.float16)}


def amx_tiles(l1d: int, l2: int) -> Tiles:
    """The AMX paths' blocking: 32 x 32 C tiles (four 16 x 16 tile registers); KC keeps the
    B micro-panel (KC x 32 halfs) in 2/3 of L1d, MC the A block (MC x KC halfs) in 3/16 of
    L2, as choose_tiles does for float32.  A packed row holds KC halfs in KC / 2 slots."""
    kc = max(64, _round_down(l1d * 2 // 3 // (AMX_TILE * 2), AMX_K_STEP))
    mc = max(2 * AMX_TILE, _round_down(l2 * 3 // 16 // (kc * 2), AMX_TILE))
    return Tiles(mr=AMX_TILE, nv=AMX_TILE // 16, lanes=16, mc=mc, kc=kc, nc=2048, itemsize=4,
                 k_step=AMX_K_STEP, k_per_slot=2)


def product_tiles(dtype: DType, operands: Optional[tuple] = None) -> Tiles:
    """The tiles of a product into `dtype` of operands of dtypes `operands` (default: dtype)."""
    if operands and dtype is DType.float32 and any(d is not dtype for d in operands) \
            and half_path(*operands) in AMX_PATHS:
        return amx_tiles(*_cache_sizes())
    return tiles_for(dtype)


def parallel_min_work() -> int:
    """Innermost loop iterations below which a loop (or nest) stays on one core: 2^15 with
    AVX-512, halved per halving of the vector.  A team's start and join cost the same
    whatever the vectors, while an iteration of a vectorized loop costs about twice as much
    with half-width vectors.  Measured on Zen 5 (2 cores), exp over float32: with AVX-512,
    2^14 elements ran 6.0 us on one thread and 6.0 on two, 2^15 8.9 and 7.1; as AVX2, 2^14
    ran 8.8 and 8.4, 2^15 14.1 and 9.4 (BENCHMARKS.md, "Tuned from the host")."""
    return (1 << 15) * vector_unit(hostcpu.host_target()).bytes // 64


def max_threads() -> int:
    """Threads a packed matmul may use: its workspace holds panels for this many."""
    return max(1, min(os.cpu_count() or 1, 64))


def uses_packed(dtype: DType, m: int, n: int, k: int) -> bool:
    """Whether the CPU code generator should run the packed kernel: floats, nothing empty,
    and both m and n at least MIN_PACKED_SIDE, where a register tile is mostly used (the
    vectorized loop expansion measured faster on thinner products, and always on vectors),
    or at least 2 in a product so big that streaming B once beats the padding."""
    if dtype not in PACKED_DTYPES or k == 0 or min(m, n) < 2:
        return False
    return min(m, n) >= MIN_PACKED_SIDE or 2 * m * n * k >= THIN_PACKED_FLOPS


@dataclass(frozen=True)
class Blocks:
    """Block sizes for one problem: the tiles' blocks clipped to it."""
    tiles: Tiles
    mc: int
    kc: int
    nc: int
    split_m: bool        # threads split the rows (else the columns) of each matrix

    @property
    def a_elements(self) -> int:
        return _aligned(self.mc * self.tiles.panel_depth(self.kc), self.tiles)

    @property
    def b_elements(self) -> int:
        return _aligned(self.tiles.panel_depth(self.kc) * self.nc, self.tiles)

    @property
    def thread_elements(self) -> int:
        """Workspace elements one thread packs into: its A block, then its B panel."""
        return self.a_elements + self.b_elements

    def split_tiles(self, m: int, n: int) -> int:
        """Register tiles along the split dim (the most parts worth making)."""
        return -(-m // self.tiles.mr) if self.split_m else -(-n // self.tiles.nr)


def _aligned(elements: int, t: Tiles) -> int:
    """Rounded up to whole cache lines, so every panel starts 64-byte aligned."""
    return _round_up(elements, 64 // t.itemsize)


def blocks(dtype: DType, m: Optional[int], n: Optional[int], k: Optional[int],
           operands: Optional[tuple] = None) -> Blocks:
    """Block sizes for an m x k @ k x n product into `dtype` of operands of dtypes
    `operands` (product_tiles); None for a size known only at run time (a dynamic dim of an
    exported library), which the blocks then do not shrink to."""
    t = product_tiles(dtype, operands)
    m_tiles = -(-m // t.mr) if m is not None else None
    n_tiles = -(-n // t.nr) if n is not None else None
    # Each part packs its own panels: split rows and every part packs all of B (k x n),
    # split columns and every part packs all of A (m x k).  So split the dim whose other
    # operand is smaller (W4's 256x784 @ 784x512: the columns), unless that dim has too
    # few register tiles to share out.  A run-time size counts as large.
    if m is None or n is None:
        split_m = m is None
    elif min(m_tiles, n_tiles) >= SPLIT_MIN_TILES:
        split_m = n <= m
    else:
        split_m = m_tiles >= n_tiles
    # K-blocks of equal depth (k = 784: 4 x 196, not 3 x 256 + 16): a thin last block
    # reads and writes all of C for a few FMAs per element.
    kc = _round_up(-(-k // -(-k // t.kc)), t.k_step) if k is not None else t.kc
    mc = min(t.mc, _round_up(m, t.mr)) if m is not None else t.mc
    nc = min(t.nc, _round_up(n, t.nr)) if n is not None else t.nc
    return Blocks(t, mc, kc, nc, split_m)


def _round_up(x: int, step: int) -> int:
    return -(-x // step) * step


def _round_down(x: int, step: int) -> int:
    return x // step * step


def workspace_elements(dtype: DType, m: Optional[int], n: Optional[int], k: Optional[int], batch: int,
                       operands: Optional[tuple] = None) -> int:
    """Elements of the workspace buffer for a packed matmul of this size (None: a run-time
    size, as in `blocks`) and operand dtypes."""
    bl = blocks(dtype, m, n, k, operands)
    split = None if (m if bl.split_m else n) is None else bl.split_tiles(m, n)
    threads = max_threads() if split is None else min(max_threads(), batch * split)
    return bl.thread_elements * max(threads, 1)


def flops(m: int, n: int, k: int, batch: int = 1) -> int:
    return 2 * m * n * k * batch
