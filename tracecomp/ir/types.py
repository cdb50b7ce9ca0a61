"""Static types and source locations of the graph IR."""
from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import DType


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


@dataclass(frozen=True)
class Location:
    """Where the user's code called the op; prints as `loc("file.py":12:0)`."""
    file: str
    line: int
    col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    def mlir(self) -> str:
        escaped = self.file.replace("\\", "\\\\").replace('"', '\\"')
        return f'loc("{escaped}":{self.line}:{self.col})'
