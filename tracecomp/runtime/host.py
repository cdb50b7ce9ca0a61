"""What tracecomp knows about the host and what it chose for it: `tracecomp info`.

The CPU (its model name, LLVM's name for it and the vector features code is generated
with), its caches (from sysfs), the vector registers the generated loops use (read back
from a probe kernel: the tuning LLVM picks for a CPU may prefer narrower vectors than the
ISA has), the matmul's blocking, the threads and the compile cache.  The probe is written
as the graph tc.trace records for it and compiled to assembly here, as tuning.py's probes
are (tc.trace lies above this stage).
"""
from __future__ import annotations

import os
import re

from ..lower.hostcpu import TARGET_ENV, caches, cpu_model, target_name

VECTOR_FEATURES = ("sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
                   "avx512vnni", "avx512bf16", "avx512fp16", "amx-tile", "amx-bf16", "amx-int8")
# `x * 2.0 + 1.0` over 2^14 floats, as tc.trace records it: a plain loop LLVM vectorizes
REGISTER_PROBE = """func.func @register_probe(%x: ROW) -> (ROW) {
  %0 = "tc.mul"(%x) {other = 2.0 : f64} : (ROW) -> ROW
  %1 = "tc.add"(%0) {other = 1.0 : f64, alpha = 1 : i64} : (ROW) -> ROW
  return %1 : ROW
}""".replace("ROW", "tensor<16384xf32>")


def vector_register() -> str:
    """The widest vector registers a plain elementwise loop is compiled with (zmm, ymm, xmm)."""
    from ..lower.llvm import target
    from ..lower.llvm.codegen import codegen_kernels
    from . import tuning
    tuning.ensure_tuned()        # the measured loop width first, as for any program
    module = codegen_kernels(tuning.probe_program(REGISTER_PROBE).kernels, "tc_register_probe", align=None)
    asm = target.emit_assembly(*target.optimized_for_host(str(module)))
    return next((r for r in ("zmm", "ymm", "xmm") if re.search(rf"%{r}\d", asm)), "none")


def describe() -> dict:
    """Everything `tracecomp info` prints, as data."""
    from . import numpy_blas
    from ..lower.hostcpu import tile_data_granted, tuned
    from ..core.dtypes import DType
    from ..lower.schedule.tiles import half_paths, host_tiles, max_threads, tiles_for
    from . import cache, jit
    from ..lower.llvm import target
    from . import tuning
    tuning.ensure_tuned()
    t = target.host_target()
    features = {f[1:] for f in t.features.split(",") if f.startswith("+")}
    return {
        "cpu": cpu_model(), "cores": os.cpu_count(), "llvm_cpu": t.cpu, "triple": t.triple,
        "target": target_name(),
        "vector_features": [f for f in VECTOR_FEATURES if f in features],
        "caches": caches(), "vector_register": vector_register(),
        "matmul_blocks": {dt.label: {"mr": b.mr, "nr": b.nr, "mc": b.mc, "kc": b.kc, "nc": b.nc}
                          for dt, b in host_tiles().items()},
        "matmul_vector_bits": tiles_for(DType.float32).vector_bytes * 8,
        "matmul_paths": {**{dt.label: "packed, native" for dt in host_tiles()}, **half_paths()},
        "amx_tile_data": tile_data_granted(),
        "vector_measured_ms": tuned().get("measured_ms", {}),     # {"matmul": {"512": ms, ...}, "loop": ...}
        "threads": max_threads(),
        "numpy_blas": numpy_blas.describe(),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT", jit.GOMP_SPINCOUNT),
        "compile_cache": str(cache.settings.directory) if cache.settings.enabled else "off",
    }


# schedule/tiles.py's half_path names, as `tracecomp info` explains them
PATH_TEXT = {"amx": "AMX tiles, tdpbf16ps on 32x32 float32 tiles (AMX-BF16), float32 accumulation",
             "amx-fp16": "AMX tiles, tdpfp16ps on 32x32 float32 tiles (AMX-FP16), float32 accumulation",
             "dpbf16ps": "K-pairs of bf16 into vdpbf16ps (AVX512-BF16), float32 accumulation",
             "widen": "converted to float32 in the packing, float32 micro-kernel"}


def path_text(info: dict, dtype: str, path: str) -> str:
    """A half dtype's matmul path, and why not a faster one the CPU has."""
    text = PATH_TEXT.get(path, path)
    features = info.get("vector_features", ())
    if not path.startswith("amx") and "amx-tile" in features and info.get("amx_tile_data") is False:
        text += " (the CPU has AMX, but Linux refused this process the tile state)"
    if dtype == "float16" and path == "widen" and "avx512fp16" in features:
        text += " (not AVX512-FP16: its FMAs accumulate in float16)"
    return text


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n >> 10} KiB"


def _measured(info: dict, probe: str, otherwise: str) -> str:
    times = info.get("vector_measured_ms", {}).get(probe)
    if not times:
        return f"{otherwise} (nothing measured)"
    return ("measured best here (" + ", ".join(f"{bits}-bit {ms} ms" for bits, ms in
                                              sorted(times.items(), key=lambda kv: -int(kv[0])))
            + "; runtime/tuning.py)")


def report(info: dict) -> str:
    """`describe()` as the lines `tracecomp info` prints."""
    widths = {"zmm": 512, "ymm": 256, "xmm": 128}
    caches_text = ", ".join(f"L{c['level']}{'d' if c['type'] == 'Data' else 'i' if c['type'] == 'Instruction' else ''} "
                            f"{_size(c['bytes'])}" + (f" (shared by CPUs {c['shared_by_cpus']})"
                                                      if "-" in c["shared_by_cpus"] or "," in c["shared_by_cpus"] else "")
                            for c in info["caches"]) or "unknown (no sysfs)"
    blocks = "; ".join(f"{dt}: register tile {b['mr']}x{b['nr']}, MC {b['mc']}, KC {b['kc']}, NC {b['nc']}"
                       for dt, b in info["matmul_blocks"].items())
    reg = info["vector_register"]
    return "\n".join([
        f"cpu: {info['cpu']}, {info['cores']} cores; LLVM targets it as {info['llvm_cpu']} ({info['triple']})"
        + (f"; {TARGET_ENV}={info['target']}" if info.get("target", "host") != "host" else ""),
        f"vector features: {' '.join(info['vector_features']) or 'none'}",
        f"caches: {caches_text}",
        f"generated loops use {reg} registers" + (f" ({widths[reg]}-bit)" if reg in widths else "") + ", "
        + _measured(info, "loop", "LLVM's choice for this CPU"),
        f"matmul blocking: {blocks}",
        f"matmul vectors: {info['matmul_vector_bits']}-bit, " + _measured(info, "matmul", "the ISA's widest"),
        "matmul paths: " + "; ".join(f"{dt}: {path_text(info, dt, p)}" for dt, p in info.get("matmul_paths", {}).items()),
        f"threads: {info['threads']}; idle OpenMP workers spin {info['gomp_spincount']} times, then sleep",
        f"compile cache: {info['compile_cache']}",
        info.get("numpy_blas", ""),
    ])
