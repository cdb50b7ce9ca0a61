"""tracecomp on a Dask cluster: compiled functions over Dask arrays, and synchronous
data-parallel training (issue 16).

    pip install "tracecomp[dask]"

- `share_cache(client, folder)`: every worker, present and future, compiles into one
  compile-cache folder (on a file system they share), so one compile serves all.
- `map_blocks(fn, *arrays)`, `map_rows(fn, *arrays)`, `reduce_rows(fn, *arrays, how=...)`:
  a tc.trace'd function over blocks or chunks of rows, with the output chunks' shapes and
  dtype from tracecomp's own shape rules; NumPy chunks out.  `from_npy(path, rows)` reads an
  .npy file in chunks on the workers, never whole.
- `DataParallel(loss_fn, params, optimizer, client)`: a replica of the model and optimizer
  state per worker, gradients summed in a tree across the workers, the same update on each.

Dask stays optional: `import tracecomp` never imports it, and this module says how to
install it when it is missing.
"""
from __future__ import annotations

import importlib

for _needed in ("dask", "dask.array", "distributed"):
    try:
        importlib.import_module(_needed)
    except ImportError as e:
        raise ImportError(f"tracecomp.dask needs Dask ({_needed} cannot be imported: {e}): "
                          'pip install "tracecomp[dask]"  (dask[array] and distributed)') from e

from .arrays import from_npy, map_blocks, map_rows, reduce_rows
from .training import DataParallel, WorkerLostError
from .workers import share_cache

__all__ = ["share_cache", "map_blocks", "map_rows", "reduce_rows", "from_npy", "DataParallel",
           "WorkerLostError"]
