"""The one exception hierarchy every user-facing error comes from.

Each class also derives from the built-in exception a Python user would expect
(TypeError for wrong argument types, ValueError for bad values, RuntimeError for
graph and engine problems), so `except TypeError` keeps working.
"""
from __future__ import annotations


class TracecompError(Exception):
    """Root of every error tracecomp raises on purpose."""


class TableError(TracecompError, ValueError):
    """An entry of ops.yaml or derivatives.yaml is malformed (names file, line, entry)."""

    def __init__(self, message: str, file: str | None = None, line: int | None = None,
                 entry: str | None = None):
        where = ""
        if file is not None:
            where = f"{file}:{line}: " if line is not None else f"{file}: "
        if entry:
            where += f"in entry '{entry}': "
        super().__init__(where + message)
        self.file, self.line, self.entry = file, line, entry


class SchemaError(TableError):
    """An operator schema string could not be parsed."""


class ArgumentError(TracecompError, TypeError):
    """A call matched no overload, or an argument has the wrong type."""


class ShapeError(TracecompError, ValueError):
    """Shapes, dims or dtypes of an op's arguments are incompatible."""


class DTypeError(ShapeError):
    """An op does not accept the dtype it was given."""


class IndexingError(ShapeError, IndexError):
    """An index does not fit the tensor it indexes: a mask of the wrong shape, too many
    indices, an index out of range (PyTorch and NumPy raise IndexError)."""


class IndexTypeError(ArgumentError, IndexError):
    """Something tensors cannot be indexed with: a float, a string, a float tensor
    (PyTorch raises IndexError for most, TypeError for some; this is both)."""


class TraceError(TracecompError, RuntimeError):
    """A traced function did something tracing cannot record (e.g. Python control flow on a traced value)."""


class VmapError(TracecompError, ValueError):
    """tc.vmap cannot map this (an op without a batching rule, a data-dependent shape,
    inconsistent batch sizes, a batched tensor used outside its vmap)."""


class IRError(TracecompError, ValueError):
    """Malformed IR text (names line and column) or a graph that fails verification."""


class BackendError(TracecompError, RuntimeError):
    """A backend cannot run what it was given."""


class OutOfMemoryError(TracecompError, MemoryError):
    """The memory a tensor needs could not be allocated (names the op, shape and bytes)."""


def add_location(err: TracecompError, where: str | None) -> TracecompError:
    """Append the user's source location to an error once (errors bubble through nested calls)."""
    if where and not getattr(err, "_located", False):
        err.args = (f"{err.args[0] if err.args else ''}\n  at {where}",) + tuple(err.args[1:])
        err._located = True
    return err
