"""Compile time per stage: where the seconds of a first call go.

`recording(times)` makes the dict `times` the active record of this thread (and context);
`stage(name)` adds the time spent in its body to `times[name]`, *exclusive* of the stages
nested inside it, so that nested stages never count twice and the values add up to the
time spent inside the outermost stages.  With no active record, `stage` only reads a clock.

The stages of a compile, in order (STAGES): trace (running the user's function under the
Tracer, less the autograd engine; recording the forward pass's autograd history counts
here), autodiff (the backward engine run while tracing grad / value_and_grad), passes (the graph pipeline), lowering (scheduling into loop IR, LLVM IR
building and parsing; the compile cache's lookups fall here too), llvm_opt (LLVM's pass
pipeline), machine_code (instruction selection to object code), jit_link (linking the
object into a JIT library).  A module compiled in parts (runtime/compile_worker.py) records
this process's own stages; the time it then waits for a worker's part counts as
machine_code.
"""
from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Iterator, Optional

STAGES = ("trace", "autodiff", "passes", "lowering", "llvm_opt", "machine_code", "jit_link")


class _Record:
    def __init__(self, times: dict[str, float]):
        self.times = times
        self.nested = [0.0]        # per open stage: seconds spent in stages nested in it


_active: contextvars.ContextVar[Optional[_Record]] = contextvars.ContextVar("tracecomp_timings", default=None)


@contextlib.contextmanager
def recording(times: dict[str, float]) -> Iterator[dict[str, float]]:
    """Stages entered in the body add their seconds to `times`."""
    token = _active.set(_Record(times))
    try:
        yield times
    finally:
        _active.reset(token)


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Count the body's time, less its nested stages, as `name` in the active record."""
    record = _active.get()
    if record is None:
        yield
        return
    record.nested.append(0.0)
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        inner = record.nested.pop()
        record.nested[-1] += elapsed
        record.times[name] = record.times.get(name, 0.0) + elapsed - inner


def add(name: str, seconds: float) -> None:
    """Move `seconds` already counted in the enclosing stage to `name` (for time measured by
    other means, e.g. the autograd engine inside tracing)."""
    record = _active.get()
    if record is not None:
        record.times[name] = record.times.get(name, 0.0) + seconds
        record.nested[-1] += seconds


def summary(times: dict[str, float]) -> str:
    """`trace 1.2 ms, passes 3.4 ms, ... (total 5.6 ms)` in STAGES order."""
    names = [s for s in STAGES if s in times] + sorted(set(times) - set(STAGES))
    parts = [f"{n} {times[n] * 1e3:.1f} ms" for n in names]
    return ", ".join(parts) + f" (total {sum(times.values()) * 1e3:.1f} ms)"
