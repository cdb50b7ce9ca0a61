"""The AMX bf16 micro-kernel (llvm/gemm/amx.py), compiled for a CPU with AMX and checked in
its assembly on any host; its run needs amx-tile and amx-bf16 and Linux's tile permission
(runtime/amx.py), which this test asks for."""
from __future__ import annotations

import re

import llvmlite.binding as llvm
import llvmlite.ir as ir
import pytest

from tracecomp.lower import hostcpu
from tracecomp.lower.llvm import target
from tracecomp.lower.llvm.gemm.amx import amx_microkernel, configure_tiles, release_tiles, tile_config
from tracecomp.runtime import amx


def _assembly() -> str:
    module = ir.Module("amx")
    amx_microkernel(module)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "configured")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    configure_tiles(b)          # (the nest's part around its kernel calls)
    release_tiles(b)
    b.ret_void()
    target.initialize()
    tm = llvm.Target.from_triple(hostcpu.host_target().triple).create_target_machine(
        cpu="sapphirerapids", features="+amx-tile,+amx-bf16,+avx512f,+avx512bf16")
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    return tm.emit_assembly(parsed)


def test_amx_kernel_assembly_has_the_tile_instructions():
    asm = _assembly()
    counts = {op: len(re.findall(rf"\b{op}\b", asm)) for op in ("ldtilecfg", "tileloadd", "tdpbf16ps",
                                                                 "tilestored", "tilezero", "tilerelease")}
    # the loop body: 2 A + 2 B loads and 4 products; C: 4 loads (accumulate) or 4 zeros, 4 stores
    assert counts == {"ldtilecfg": 1, "tileloadd": 8, "tdpbf16ps": 4, "tilestored": 4, "tilezero": 4,
                      "tilerelease": 1}, counts


def test_tile_config_is_palette_one_with_eight_16x64_tiles():
    config = tile_config()
    assert len(config) == 64 and config[0] == 1
    assert config[16:32] == [64, 0] * 8 and config[48:56] == [16] * 8 and not any(config[56:])


def test_tile_permission_follows_the_cpu():
    has_amx = hostcpu.detected_target().has("amx-tile")
    granted = amx.request_tile_data()
    if not has_amx:
        assert granted is False
        pytest.skip("the host CPU has no amx-tile: the AMX kernel is compiled (above), not run")
    assert granted is True
