"""Static types of the graph IR (their source locations: core/locations.py)."""
from __future__ import annotations

from dataclasses import dataclass

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
