"""The matmul's tiles derived from the CPU (lower/schedule/tiles.py): the register tile from
the vector unit, KC and MC from the caches, for the hosts tracecomp runs on and for made-up
ones; each target's tiles fit its registers and caches."""
import pytest

from tracecomp.lower import hostcpu
from tracecomp.core.dtypes import DType
from tracecomp.lower.schedule import tiles as T

AVX512, AVX2, SSE = T.VectorUnit(64, 32), T.VectorUnit(32, 16), T.VectorUnit(16, 16)
F32, F64 = DType.float32, DType.float64


def shape(t: T.Tiles) -> tuple:
    return (t.lanes, t.mr, t.nr, t.mc, t.kc, t.nc)


def test_zen5_keeps_the_measured_blocking():
    """48 KiB L1d, 1 MiB L2, AVX-512: the blocking measured best there (BENCHMARKS.md)."""
    assert shape(T.choose_tiles(F32, AVX512, 48 << 10, 1 << 20)) == (16, 8, 32, 192, 256, 2048)
    assert shape(T.choose_tiles(F64, AVX512, 48 << 10, 1 << 20)) == (8, 8, 16, 96, 256, 2048)


def test_avx2_takes_a_six_row_tile_of_two_vectors():
    """16 ymm registers: 6 x 2 accumulators + 2 B vectors + 1 broadcast = 15 (BLIS's Haswell
    shape); 8 rows would need 19 and spill."""
    haswell = T.choose_tiles(F32, AVX2, 32 << 10, 256 << 10)
    assert (haswell.lanes, haswell.mr, haswell.nr) == (8, 6, 16)
    assert (T.choose_tiles(F64, AVX2, 32 << 10, 256 << 10).lanes, T.choose_tiles(F64, AVX2, 32 << 10, 256 << 10).nr) == (4, 8)
    assert T.choose_tiles(F32, SSE, 32 << 10, 256 << 10).lanes == 4


@pytest.mark.parametrize("unit", [AVX512, AVX2, SSE])
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("l1d,l2", [(32 << 10, 256 << 10), (48 << 10, 1 << 20), (48 << 10, 2 << 20),
                                    (64 << 10, 512 << 10), (16 << 10, 128 << 10)])
def test_tiles_fit_the_registers_and_the_caches(unit, dtype, l1d, l2):
    t = T.choose_tiles(dtype, unit, l1d, l2)
    assert t.lanes * dtype.itemsize == unit.bytes and t.itemsize == dtype.itemsize
    assert t.mr * t.nv + t.nv + 1 <= unit.registers       # accumulators, B vectors, a broadcast
    assert t.mr * t.nv >= 8                                # enough to hide the FMA latency
    assert t.kc * t.nr * dtype.itemsize <= l1d * 2 // 3 or t.kc == 64
    assert t.mc * t.kc * dtype.itemsize <= l2 // 4 or t.mc == 4 * t.mr
    assert t.mc % t.mr == 0 and t.nc % t.nr == 0 and t.kc % 32 == 0


def test_bigger_caches_give_bigger_blocks():
    small, big = T.choose_tiles(F32, AVX512, 32 << 10, 512 << 10), T.choose_tiles(F32, AVX512, 48 << 10, 2 << 20)
    assert small.kc < big.kc and small.mc < big.mc


def test_the_vector_unit_follows_the_target_features():
    def unit(features):
        return T.vector_unit(hostcpu.HostTarget("x86_64-unknown-linux-gnu", "generic", features))
    assert unit("+sse4.2,+avx,+avx2,+fma,+avx512f,+avx512bw") == AVX512
    assert unit("+sse4.2,+avx,+avx2,+fma,-avx512f,-avx512bw") == AVX2
    assert unit("+sse4.2,-avx,-avx2") == SSE


def test_host_tiles_are_this_targets():
    """The tiles used here are the model's for this process's target and caches."""
    unit = T.vector_unit(hostcpu.host_target())
    l1d, l2 = hostcpu.cache_bytes(1) or T.DEFAULT_L1D, hostcpu.cache_bytes(2) or T.DEFAULT_L2
    assert T.host_tiles() == {d: T.choose_tiles(d, unit, l1d, l2) for d in T.PACKED_DTYPES}
    assert T.blocks(F32, 1000, 1000, 1000).tiles == T.tiles_for(F32)


def test_the_parallel_grain_follows_the_vectors(monkeypatch):
    """Half-width vectors make an iteration cost about twice as much; a team costs the same:
    so AVX2 parallelizes loops of half as many iterations as AVX-512 does."""
    grains = {}
    for name, features in (("avx512", "+avx,+avx2,+avx512f"), ("avx2", "+avx,+avx2,-avx512f"), ("sse", "-avx")):
        monkeypatch.setattr(hostcpu, "host_target", lambda f=features: hostcpu.HostTarget("x", "generic", f))
        grains[name] = T.parallel_min_work()
    assert grains == {"avx512": 1 << 15, "avx2": 1 << 14, "sse": 1 << 13}
