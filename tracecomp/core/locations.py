"""Where things come from: an op's Location, and the user's call site (the innermost stack
frame outside the tracecomp package).

Errors name the call site (`add_location`), the tracer records it on every op, and warnings
point at it (`stacklevel`).  Frames of the package's own files are skipped, wherever they lie.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace

FORWARD, BACKWARD = "forward", "backward"


@dataclass(frozen=True)
class Location:
    """An op's origin: the user's line that made it, whether it is part of the forward or
    the backward pass, and the op it was derived from (the composite it was decomposed
    from, or the forward op whose derivative formula made it; None for an op the user
    called).  Every pass keeps an op's location on what it makes from that op.  Prints as
    `loc("file.py":12:0)`, or, with a phase or source, as an MLIR name location wrapping
    it: `loc("backward:tc.tanh"("file.py":12:0))` (see `label`)."""
    file: str
    line: int
    col: int = 0
    phase: str = FORWARD
    source: str | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}"
        return where if self.label is None else f"{where} ({self.label})"

    @property
    def label(self) -> str | None:
        """`phase[:source]`, the name of the printed name location; None for a plain one."""
        if self.phase == FORWARD and self.source is None:
            return None
        return self.phase if self.source is None else f"{self.phase}:{self.source}"

    @property
    def is_backward(self) -> bool:
        return self.phase == BACKWARD

    def derived(self, phase: str | None = None, source: str | None = None) -> "Location":
        """This location for an op made from another: the phase and source given replace
        ours, but a source already set (the op the user called) is kept."""
        return replace(self, phase=phase or self.phase, source=self.source or source)


def parse_label(label: str) -> tuple[str, str | None]:
    """(phase, source) of a name location's `phase[:source]`; ValueError if malformed."""
    phase, _, source = label.partition(":")
    if phase not in (FORWARD, BACKWARD) or (_ and not source):
        raise ValueError(f"an op origin is 'forward' or 'backward', optionally followed by "
                         f"':' and the source op, got {label!r}")
    return phase, source or None


PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # tracecomp/


def _user_frame(frame):
    """(the first frame from `frame` outward outside the tracecomp package, its path), or
    (None, None); and how many frames out from `frame` it lies."""
    depth = 0
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(PACKAGE_DIR + os.sep) and not path.startswith("<frozen"):
            return frame, path, depth
        frame, depth = frame.f_back, depth + 1
    return None, None, depth


def user_location() -> Location | None:
    """The innermost stack frame outside the tracecomp package: the user's call site."""
    frame, path, _ = _user_frame(sys._getframe(1))
    if frame is None:
        return None
    try:
        rel = os.path.relpath(path)
        path = rel if not rel.startswith("..") else path
    except ValueError:
        pass
    return Location(path, frame.f_lineno, 0)


def user_stacklevel() -> int:
    """The stacklevel that makes its caller's warnings.warn name the user's frame."""
    return _user_frame(sys._getframe(1))[2] + 1
