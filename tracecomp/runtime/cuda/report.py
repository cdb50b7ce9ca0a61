"""The PTX of a GpuModule with a header that says how to run it and what ptxas thinks of it:
per launch, in order, its kind, block, grid and shared memory, and the registers, spills,
stack and barriers `ptxas -v` reports for the module's architecture (or why there are
no figures).  The header is PTX comments, so the text still assembles."""
from __future__ import annotations

from ...core.errors import BackendError
from ...lower.nvptx.target import ptx_isa
from ...lower.nvptx.program import GpuModule
from .ptxas import assemble, find_ptxas


def _dims(d) -> str:
    return "x".join(str(n) for n in d)


def annotated_ptx(gpu: GpuModule) -> str:
    p = gpu.program
    launches = gpu.launches
    figures, note = {}, ""
    if find_ptxas() is None:
        note = "ptxas not found: no register figures (install the CUDA toolkit's ptxas)"
    else:
        try:
            figures = assemble(gpu.ptx, gpu.arch)
        except BackendError as e:
            note = str(e).replace("\n", "\n// ")
    lines = [f"// tracecomp: @{p.name} for {gpu.arch} (PTX ISA {ptx_isa(gpu.arch)})",
             f"// {len(launches)} launch(es), run in this order on one stream:"]
    for launch in launches:
        lines.append(f"// {launch.name}: {launch.kind}, block {_dims(launch.block)}, grid {_dims(launch.grid)}"
                     f", {launch.shared_bytes} bytes static shared" + (" (empty: skipped)" if launch.empty else ""))
        if launch.name in figures:
            lines.append(f"//   ptxas -v: {figures[launch.name].summary()}")
    if note:
        lines.append(f"// {note}")
    return "\n".join(lines) + "\n" + gpu.ptx

