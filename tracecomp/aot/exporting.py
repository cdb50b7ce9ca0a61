"""tc.export: a function compiled ahead of time, for the host CPU as a shared library with a C
header (runtime/export.py) or for CUDA as PTX with a JSON of its launches (gpu/ptx.py).
It lives above both so that neither runtime/ nor gpu/ imports the other's exporter."""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence


def export(fn: Callable, example_inputs: Sequence[Any], path: str, name: Optional[str] = None,
           dynamic: Optional[dict] = None, *, target: str = "cpu",
           _metadata_overrides: Optional[dict] = None) -> dict:
    """Write `fn`, compiled for the example inputs' shapes and dtypes, to `path`: with
    target="cpu", a shared library, its header (same stem, `.h`) and its checksum
    (`path`.sha256), and `dynamic` may name sizes known only at run time; with
    target="cuda", PTX and a JSON of its launches (`dynamic` too: sizes become kernel
    parameters and grids expressions of them).  Returns the metadata written."""
    if target != "cpu":
        from .ptx import export_ptx
        return export_ptx(fn, example_inputs, path, name, target, dynamic=dynamic)
    from .shared_library import export_library
    return export_library(fn, example_inputs, path, name, dynamic, _metadata_overrides=_metadata_overrides)
