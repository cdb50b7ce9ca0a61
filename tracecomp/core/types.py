"""Static types and source locations of the graph IR."""
from __future__ import annotations

from dataclasses import dataclass, replace

from .dtypes import DType


@dataclass(frozen=True)
class TensorType:
    """A tensor's static shape and dtype; prints as MLIR's `tensor<4x8xf32>`."""
    shape: tuple[int, ...]         # ints, or symbolic.Dim for sizes known at run time
    dtype: DType

    def __str__(self) -> str:
        dims = "".join(f"{d}x" if isinstance(d, int) else "?x" for d in self.shape)   # ?: dynamic
        return f"tensor<{dims}{self.dtype.mlir}>"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


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
