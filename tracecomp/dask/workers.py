"""One compile-cache folder for every worker of a cluster."""
from __future__ import annotations

import os

from distributed import Client
from distributed.diagnostics.plugin import WorkerPlugin


class SharedCache(WorkerPlugin):
    """Points a worker's compile cache at `folder` when it starts (and workers that join or
    replace a lost one later).  Entries are written atomically and checked before use, so
    workers compiling the same function at once each write a whole entry; the HMAC key
    (`TRACECOMP_CACHE_KEY`, see runtime/cache_auth.py) must be the same file for all of them
    for one worker to use what another wrote: on one machine it is, across machines put it
    on the shared file system too."""

    def __init__(self, folder: str):
        self.folder = folder

    def setup(self, worker) -> None:
        import tracecomp as tc
        tc.compile_cache.directory = self.folder


def share_cache(client: Client, folder) -> None:
    """Every worker of `client`'s cluster, present and future, compiles into `folder`: a
    path on a file system the workers share.  One worker's compile then serves the others,
    and a worker that replaces a lost one loads instead of compiling."""
    folder = os.path.abspath(os.fspath(folder))
    client.register_plugin(SharedCache(folder), name="tracecomp-shared-cache")
