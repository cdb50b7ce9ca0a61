"""Synchronous data-parallel training on a Dask cluster.

    dp = DataParallel(loss_fn, params, tc.optim.AdamW(lr=1e-3), client)
    for x, y in batches:
        loss = dp.step(x, y)                 # a Future of the global batch's loss
    params, opt_state = dp.state()

Why `DataParallel(loss_fn, params, optimizer, client)` and not a wrapper of a whole train
step: the gradients must be summed across workers between the backward pass and the
update, so the two are separate compiled functions on each worker:

- `gradients(params, shard, weight)`: value_and_grad of `loss_fn` on this worker's rows of
  the global batch, every gradient flattened into one vector and scaled by the shard's
  share of the batch (rows / global rows), so that the sum over workers is the gradient of
  the global batch's mean loss, as one process stepping on the whole batch computes it;
- `update(params, opt_state, gradient, lr)`: the optimizer's pure update, params and state
  donated.

Each worker keeps a replica (params and optimizer state, in the worker's memory).  A step
submits, without waiting: each worker's gradients on its shard, a tree of pairwise sums of
the gradient vectors (Dask moves each vector between workers, never through this
process), and the update on every worker with the same total, so the replicas stay
identical; a worker's next step depends on its last update.  The tree's top reaches the
workers directly up to FANOUT_MAX of them, beyond that down a binary relay tree
(`_delivered`): log2(workers) levels up and down.  The client waits only to
keep `max_in_flight` steps queued, to take a checkpoint, and for results.

Checkpoints.  Every `checkpoint_every` steps the state of one replica comes to the client
(and is written with tc.save, a safetensors file, when `checkpoint` names a path); the
batches since are kept.  A lost worker is noticed while waiting (its address leaves the
scheduler, or a task fails because the replica is gone): every replica restarts from the
checkpoint on the workers present (the nanny restarts a killed worker; a new one may join)
and the steps since are replayed, so training goes on with the same numbers, after a
warning on the "tracecomp.dask" logger.  No worker in `recover_timeout` seconds raises
WorkerLostError.  `resume=path` starts from a checkpoint file.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from concurrent.futures import CancelledError
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import dask.array as da
import numpy as np
from distributed import Client, Future, wait

from ..tensors import pytree
from ..core.errors import ArgumentError, ShapeError, TracecompError
from ..tensors.tensor import Tensor
from ..transforms.pickling import restore_source_files, source_files

log = logging.getLogger("tracecomp.dask")
MAX_RECOVERIES = 3
INLINE_BYTES = 2 << 20       # NumPy shards up to this size travel inside their task
FANOUT_MAX = 8               # up to this many workers each fetch the tree's top themselves


class WorkerLostError(TracecompError, RuntimeError):
    """Workers were lost and training could not go on (no replacement arrived in time)."""


class _Lost(Exception):
    """Internal: a replica's worker is gone; recover."""


def _is_array(x) -> bool:
    """A leaf of the state the replicas hold and checkpoints store (None stays in the structure)."""
    return isinstance(x, (Tensor, np.ndarray, np.generic))


def _is_leaf(x) -> bool:
    """A leaf when params line up with their gradients (None: a buffer's, or an absent bias)."""
    return x is None or _is_array(x)


# ------------------------------------------------------------------ on the workers
@dataclass
class Plan:
    """What every replica runs; travels once per (re)start."""
    loss_fn: Callable
    optimizer: Any
    structure: Any            # of (params, opt_state)
    loss_files: Optional[dict] = None  # where loss_fn and its helpers were written (trace.source_files)


class Replica:
    """One worker's params, optimizer state and the two compiled functions."""

    def __init__(self, plan: Plan, leaves: Sequence[np.ndarray]):
        import tracecomp as tc
        restore_source_files(plan.loss_fn, plan.loss_files)
        self.params, self.state = pytree.unflatten(plan.structure, [tc.tensor(np.array(a)) for a in leaves])
        self.has_gradient: list[bool] = []        # per params leaf, found when gradients is traced
        self.gradients = tc.trace(self._gradients_fn(plan.loss_fn))
        self.update = tc.trace(self._update_fn(plan.optimizer), donate_argnums=(0, 1))

    def _gradients_fn(self, loss_fn):
        import tracecomp as tc

        def gradients(params, batch, weight):
            loss, grads = tc.value_and_grad(loss_fn)(params, *batch)
            leaves = pytree.flatten(grads, _is_leaf)[0]
            self.has_gradient = [g is not None for g in leaves]
            present = [g.reshape(-1) for g in leaves if g is not None]
            dtypes = {g.dtype for g in present}
            if len(dtypes) != 1:
                raise ArgumentError(f"DataParallel: the gradients have dtypes {sorted(map(str, dtypes))}; "
                                    "they are summed as one vector, so the params need one float dtype")
            return loss * weight, tc.cat(present) * weight
        return gradients

    def _update_fn(self, optimizer):
        def update(params, state, gradient, lr):
            leaves, structure = pytree.flatten(params, _is_leaf)
            pieces, start = [], 0
            for leaf, has in zip(leaves, self.has_gradient):
                if not has:
                    pieces.append(None)
                    continue
                pieces.append(gradient[start:start + leaf.numel()].reshape(leaf.shape))
                start += leaf.numel()
            return optimizer.update(pytree.unflatten(structure, pieces), state, params, lr=lr)
        return update


_REPLICAS: dict[str, Replica] = {}       # on each worker: the replicas it holds, by name
_LOCK = threading.Lock()


def _start(name: str, plan: Plan, leaves: list) -> int:
    with _LOCK:
        _REPLICAS[name] = Replica(plan, leaves)
    return 0


def _replica(name: str) -> Replica:
    replica = _REPLICAS.get(name)
    if replica is None:
        raise LookupError(f"tracecomp.dask: no replica {name} on this worker (it restarted)")
    return replica


def _gradients(name: str, batch: tuple, weight: np.float32, after) -> tuple:
    r = _replica(name)
    loss, gradient = r.gradients(r.params, tuple(batch), weight)
    return np.asarray(loss), np.asarray(gradient)


def _sum(a: tuple, b: tuple) -> tuple:
    return a[0] + b[0], a[1] + b[1]


def _add_up(parts: list) -> tuple:
    return parts[0] if len(parts) == 1 else _sum(*parts)


def _relay(total: tuple) -> tuple:
    return total                 # a copy on this worker, for the workers below it to fetch


def _apply(name: str, parts: list, lr) -> float:
    """The update with the sum of the tree's top (one or two partial sums)."""
    total = _add_up(parts)
    r = _replica(name)
    r.params, r.state = r.update(r.params, r.state, total[1], lr)
    return float(total[0])


def _leaves(name: str, after) -> list[np.ndarray]:
    r = _replica(name)
    return [np.array(x) for x in pytree.flatten((r.params, r.state), _is_array)[0]]


def _digest(name: str, after) -> str:
    h = hashlib.sha256()
    for a in _leaves(name, after):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _stop(name: str) -> None:
    with _LOCK:
        _REPLICAS.pop(name, None)


# ------------------------------------------------------------------ on the client
def state_names(structure) -> list[str]:
    """A checkpoint name per leaf of (params, opt_state): "params." or "optimizer." and a
    module's state-dict names (`params.0.weight`, `optimizer.exp_avg.0.weight`), a dict's
    keys and a list's positions, so the params load into a tc.nn model by their names."""
    import tracecomp as tc
    from ..nn import Module
    paths = pytree.array_paths(structure)
    # each leaf replaced by its position, so the names need no assumption on leaf order
    params, state = pytree.unflatten(structure, [tc.tensor(np.int64(i)) for i in range(len(paths))])
    names: list = [None] * len(paths)

    def walk(x, prefix: str) -> None:
        if isinstance(x, Module):
            for key, leaf in x.state_dict().items():
                names[int(leaf)] = prefix + key
        elif isinstance(x, dict):
            for key, v in x.items():
                walk(v, f"{prefix}{key}.")
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{prefix}{i}.")
        elif isinstance(x, Tensor):
            names[int(x)] = prefix[:-1]
    walk(params, "params.")
    walk(state, "optimizer.")
    named = [name or f"leaf{path}" for name, path in zip(names, paths)]
    return named if len(set(named)) == len(named) else [f"leaf{path}" for path in paths]


class DataParallel:
    """Synchronous data-parallel training of `loss_fn(params, *batch)` (a scalar: the mean
    loss over the batch's rows) with `optimizer` (tc.optim, functional interface) on the
    workers of `client` (all of them, or `workers`).  See the module docstring."""

    def __init__(self, loss_fn: Callable, params: Any, optimizer, client: Client, *,
                 opt_state: Any = None, workers: Optional[Sequence[str]] = None,
                 checkpoint: Optional[str] = None, checkpoint_every: int = 10, resume: Optional[str] = None,
                 recover_timeout: float = 120.0, max_in_flight: int = 2):
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 1:
            raise ArgumentError(f"DataParallel: checkpoint_every must be a positive int, got {checkpoint_every!r}")
        self.client = client
        self.workers = list(workers) if workers is not None else sorted(client.scheduler_info()["workers"])
        if not self.workers:
            raise ArgumentError("DataParallel: the cluster has no workers")
        self.size = len(self.workers)
        if opt_state is None:
            opt_state = optimizer.init(params)
        leaves, structure = pytree.flatten((params, opt_state), _is_array)
        self._plan = Plan(loss_fn, optimizer, structure, source_files(loss_fn))
        self._names = state_names(structure)
        self.checkpoint_path, self.checkpoint_every = checkpoint, checkpoint_every
        self.recover_timeout, self.max_in_flight = recover_timeout, max_in_flight
        self.steps = 0
        leaves = [np.array(x) for x in leaves]
        if resume is not None:
            leaves, self.steps = self._read_checkpoint(resume, leaves)
        self._checkpoint = (self.steps, leaves)
        self._replay: list[tuple] = []               # (batch, lr) of the steps since the checkpoint
        self._losses: dict[int, Future] = {}
        self._pending: list[Future] = []
        self.recoveries = 0
        self._name = f"tc-dp-{uuid.uuid4().hex[:12]}"
        self._start()

    # -------------------------------------------------------------- stepping
    def step(self, *batch, lr=None) -> Future:
        """One synchronous step on a global batch (NumPy arrays, tensors or Dask arrays that
        share their first axis, split across the workers by rows); `lr` replaces the
        optimizer's (a float: data, not a retrace).  A Future of the batch's mean loss."""
        batch = tuple(x if isinstance(x, da.Array) else np.asarray(x) for x in batch)
        rows = {x.shape[0] if x.ndim else None for x in batch}
        if len(rows) != 1 or None in rows:
            raise ShapeError(f"DataParallel.step: the batch's arrays must share their first axis, got shapes "
                             f"{[list(x.shape) for x in batch]}")
        if rows.pop() < self.size:
            raise ShapeError(f"DataParallel.step: a batch of {batch[0].shape[0]} rows cannot be split across "
                             f"{self.size} workers")
        lr = None if lr is None else np.float64(lr)
        self._replay.append((batch, lr))
        self.steps += 1
        self._guarded(lambda: self._run_step(self.steps, batch, lr), retry=False)    # a recovery replays it
        self._guarded(self._throttle)
        if self.steps - self._checkpoint[0] >= self.checkpoint_every:
            self._guarded(self._take_checkpoint)
        return self._losses[self.steps]

    def fit(self, *data: da.Array, batch_size: int, steps: int, lr=None) -> list[float]:
        """`steps` steps over a Dask-partitioned dataset (arrays sharing their first axis):
        global batch k is rows [k*batch_size, (k+1)*batch_size), cycling over the data
        (a final partial batch is skipped).  `lr`: a float, or a function of the step number.
        The losses, one per step."""
        n = data[0].shape[0]
        per_epoch = n // batch_size
        if per_epoch == 0:
            raise ShapeError(f"DataParallel.fit: {n} rows do not make one batch of {batch_size}")
        first = self.steps + 1
        for _ in range(steps):
            k = self.steps % per_epoch
            rate = lr(self.steps) if callable(lr) else lr
            self.step(*(a[k * batch_size:(k + 1) * batch_size] for a in data), lr=rate)
        return self.losses(range(first, self.steps + 1))

    def losses(self, steps) -> list[float]:
        """The losses of the given step numbers (1-based), waiting for them."""
        def gather():
            values = [self._losses[s] for s in steps]
            self._waited([v for v in values if isinstance(v, Future)])
            return [float(v.result()) if isinstance(v, Future) else v for v in values]
        return self._guarded(gather)

    def state(self) -> tuple[Any, Any]:
        """(params, opt_state) of the first replica, as tc.Tensors in the caller's structure."""
        import tracecomp as tc
        leaves = self._guarded(lambda: self._fetch_leaves())
        return pytree.unflatten(self._plan.structure, [tc.tensor(a) for a in leaves])

    def replica_digests(self) -> list[str]:
        """A sha256 of each replica's params and optimizer state: all equal while in step."""
        def digests():
            futures = [self.client.submit(_digest, self._name, self._last[k], workers=[w],
                                          allow_other_workers=False, pure=False)
                       for k, w in enumerate(self.workers)]
            return [f.result() for f in self._waited(futures)]
        return self._guarded(digests)

    def save(self, path) -> None:
        """Write the current params and optimizer state to `path` (tc.save, safetensors)."""
        import tracecomp as tc
        leaves = self._guarded(lambda: self._fetch_leaves())
        tc.save(dict(zip(self._names, leaves)), path, metadata={"step": str(self.steps)})

    def close(self) -> None:
        """Drop the replicas from the workers."""
        for w in self.workers:
            self.client.submit(_stop, self._name, workers=[w], pure=False)

    # -------------------------------------------------------------- internals
    def _start(self) -> None:
        """A replica on each worker from the checkpoint's values."""
        plan = self.client.scatter(self._plan, broadcast=True, hash=False)
        leaves = self.client.scatter(self._checkpoint[1], broadcast=True, hash=False)
        self._last = [self.client.submit(_start, self._name, plan, leaves, workers=[w],
                                         allow_other_workers=False, pure=False)
                      for w in self.workers]
        self._pending = []

    def _run_step(self, number: int, batch: tuple, lr) -> None:
        client, rows = self.client, batch[0].shape[0]
        bounds = np.linspace(0, rows, self.size + 1).round().astype(int)
        grads = []
        for k, w in enumerate(self.workers):
            lo, hi = int(bounds[k]), int(bounds[k + 1])
            try:
                shard = tuple(self._send(x[lo:hi], w) for x in batch)
            except (KeyError, ValueError, OSError, TimeoutError):    # no worker at w any more
                missing = self._missing()
                if missing:
                    raise _Lost(missing) from None
                raise
            grads.append(client.submit(_gradients, self._name, shard, np.float32((hi - lo) / rows),
                                       self._last[k], workers=[w], allow_other_workers=False, pure=False))
        while len(grads) > 2:                  # a tree of pairwise sums, log2(workers) - 1 rounds ...
            grads = [client.submit(_sum, *grads[i:i + 2], pure=False) if i + 1 < len(grads) else grads[i]
                     for i in range(0, len(grads), 2)]
        self._last = [client.submit(_apply, self._name, top, lr, workers=[w], allow_other_workers=False,
                                    pure=False) for w, top in zip(self.workers, self._delivered(grads))]
        self._losses[number] = self._last[0]
        self._pending.append(self._last[0])

    def _delivered(self, top: list[Future]) -> list[list[Future]]:
        """Per worker, what its update sums: up to FANOUT_MAX workers, the tree's one or two
        top partial sums themselves (each worker fetches them: one hop and one transfer
        fewer than a separate sum); beyond, the total summed once and relayed down a binary
        tree of workers, so no worker sends it more than twice."""
        if self.size <= FANOUT_MAX:
            return [top] * self.size
        on = lambda k: dict(workers=[self.workers[k]], allow_other_workers=False, pure=False)   # noqa: E731
        copies = [self.client.submit(_add_up, top, **on(0))]
        for k in range(1, self.size):
            copies.append(self.client.submit(_relay, copies[(k - 1) // 2], **on(k)))
        return [[c] for c in copies]

    def _send(self, rows, worker: str):
        """A shard of the batch for `worker`: a Dask array's rows computed there; NumPy rows
        up to INLINE_BYTES inside the task (no round trip), bigger ones scattered to it."""
        if isinstance(rows, da.Array):
            return self.client.compute(rows, workers=[worker])
        if rows.nbytes <= INLINE_BYTES:
            return rows
        return self.client.scatter(rows, workers=[worker], hash=False)

    def _throttle(self) -> None:
        """Wait until at most max_in_flight steps are queued."""
        while len(self._pending) > self.max_in_flight:
            self._waited([self._pending[0]])
            self._pending.pop(0)

    def _fetch_leaves(self) -> list[np.ndarray]:
        future = self.client.submit(_leaves, self._name, self._last[0], workers=[self.workers[0]],
                                    allow_other_workers=False, pure=False)
        return self._waited([future])[0].result()

    def _take_checkpoint(self) -> None:
        import tracecomp as tc
        leaves = self._fetch_leaves()
        self._checkpoint = (self.steps, leaves)
        self._replay = []
        for number, loss in self._losses.items():        # results leave the cluster's memory
            if isinstance(loss, Future):
                self._losses[number] = float(loss.result())
        if self.checkpoint_path is not None:
            tc.save(dict(zip(self._names, leaves)), self.checkpoint_path, metadata={"step": str(self.steps)})

    def _read_checkpoint(self, path, leaves: list) -> tuple[list, int]:
        from ..tensors.checkpoint import CheckpointError, load_metadata, load_state
        state, metadata = load_state(path), load_metadata(path)
        missing = [n for n in self._names if n not in state]
        if missing or "step" not in metadata:
            raise CheckpointError(f"DataParallel: {path} is not a DataParallel checkpoint of this model "
                                  f"(missing {missing[:3] or ['the step number']})")
        loaded = [state[n].numpy() for n in self._names]
        for name, a, b in zip(self._names, leaves, loaded):
            if a.shape != b.shape:
                raise CheckpointError(f"DataParallel: {path} holds {name} of shape {list(b.shape)}, "
                                      f"the model's is {list(a.shape)}")
        return loaded, int(metadata["step"])

    def _waited(self, futures: list[Future]) -> list[Future]:
        """`futures` once done; _Lost if a replica's worker left or its replica is gone."""
        while True:
            try:
                wait(futures, timeout=0.5)
                break
            except CancelledError:               # a result it needed was lost with its worker
                raise _Lost(self._missing() or ["(a worker holding its inputs)"]) from None
            except TimeoutError:
                missing = self._missing()
                if missing:
                    raise _Lost(missing) from None
        for f in futures:
            if f.status == "cancelled":          # a result it needed was lost with its worker
                raise _Lost(self._missing() or ["(a worker holding its inputs)"])
            if f.status != "finished":
                error = f.exception()
                if isinstance(error, LookupError) or self._missing() or type(error).__name__ == "KilledWorker":
                    raise _Lost(self._missing()) from error
                raise error
        return futures

    def _missing(self) -> list[str]:
        present = self.client.scheduler_info()["workers"]
        return [w for w in self.workers if w not in present]

    def _guarded(self, action: Callable, retry: bool = True):
        """`action`, recovering from lost workers (restart from the checkpoint, replay the
        steps since) and, if `retry`, doing it again."""
        for _ in range(MAX_RECOVERIES):
            try:
                return action()
            except _Lost as lost:
                self._recover(lost.args[0])
                if not retry:
                    return None
        raise WorkerLostError(f"DataParallel: workers were lost {MAX_RECOVERIES} times in a row; giving up")

    def _recover(self, missing: list[str]) -> None:
        for _ in range(MAX_RECOVERIES):
            try:
                return self._restart(missing)
            except _Lost as again:               # lost another while replaying
                missing = again.args[0]
        raise WorkerLostError(f"DataParallel: workers were lost {MAX_RECOVERIES} times while recovering; "
                              "giving up")

    def _restart(self, missing: list[str]) -> None:
        self.recoveries += 1
        done, replay = self._checkpoint[0], list(self._replay)
        log.warning("tracecomp.dask: lost worker(s) %s at step %d; restarting the %d replicas from the "
                    "checkpoint of step %d and replaying %d step(s)", ", ".join(missing) or "(a replica)",
                    self.steps, self.size, done, len(replay))
        self.client.cancel(self._last + self._pending + [f for s, f in self._losses.items() if s > done])
        deadline = time.monotonic() + self.recover_timeout
        while len(self.client.scheduler_info()["workers"]) < self.size:
            if time.monotonic() > deadline:
                raise WorkerLostError(
                    f"DataParallel: lost worker(s) {', '.join(missing)}; only "
                    f"{len(self.client.scheduler_info()['workers'])} of {self.size} workers after "
                    f"{self.recover_timeout:g} s (recover_timeout). The last checkpoint is step {done}"
                    + (f", in {self.checkpoint_path}" if self.checkpoint_path else ""))
            time.sleep(0.2)
        self.workers = sorted(self.client.scheduler_info()["workers"])[:self.size]
        self._start()
        for number, (batch, lr) in enumerate(replay, done + 1):
            self._run_step(number, batch, lr)
            self._throttle()
