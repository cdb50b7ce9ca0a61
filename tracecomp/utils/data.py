"""`tc.utils.data`: TensorDataset and a DataLoader, after `torch.utils.data`.

A batch is a tuple of tc.Tensors whose first dim indexes the items.  A TensorDataset's
batch is one fancy-indexing per tensor (no loop over items); any other dataset (a plain
Python sequence whose items are tuples of arrays/tensors/numbers, dicts of them, or single
ones) is indexed item by item and the items are stacked.

Shuffling draws one permutation per epoch, when `iter(loader)` is called:
- from `np.random.default_rng(seed)` made once per loader when `seed=` is given, so the
  k-th epoch's order is the same in every run (and epochs differ from one another);
- from `generator=` (a np.random.Generator, or anything with `.permutation(n)`) if given;
- otherwise from tracecomp's global generator (tracecomp/core/random.py), so `tc.manual_seed`
  makes the shuffled order reproducible, as `torch.manual_seed` does for PyTorch's loader.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Iterator

import numpy as np

from ..core import random as tc_random
from ..core.errors import ArgumentError, ShapeError, TracecompError
from ..tensors.tensor import Tensor, as_tensor


class DataError(TracecompError, ValueError):
    """A DataLoader setting or a dataset's items have a bad value."""


class TensorDataset:
    """Item i is `tuple(t[i] for t in tensors)`; every tensor has one row per item."""

    def __init__(self, *tensors):
        if not tensors:
            raise ArgumentError("TensorDataset: needs at least one tensor")
        self.tensors = tuple(as_tensor(t) for t in tensors)
        for i, t in enumerate(self.tensors):
            if t.ndim == 0:
                raise ShapeError(f"TensorDataset: tensor {i} is 0-d; every tensor needs a first dim "
                                 "that indexes the items")
        if len({t.shape[0] for t in self.tensors}) > 1:
            shapes = ", ".join(f"tensor {i} {t.shape}" for i, t in enumerate(self.tensors))
            raise ShapeError(f"TensorDataset: the tensors' first dims differ ({shapes}); every tensor "
                             "needs one row per item")

    def __len__(self) -> int:
        return self.tensors[0].shape[0]

    def __getitem__(self, index) -> tuple[Tensor, ...]:
        """An int gives one item; a slice, list or integer array gives those items, batched."""
        if isinstance(index, Tensor):
            index = index.numpy()
        return tuple(Tensor.from_numpy(np.asarray(t.numpy()[index])) for t in self.tensors)


class DataLoader:
    """Batches of `batch_size` items of `dataset`, in order or shuffled; `len(loader)` is
    the number of batches (the last one smaller unless `drop_last`), as in PyTorch."""

    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False, drop_last: bool = False,
                 seed: int | None = None, generator=None):
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise ArgumentError(f"DataLoader: batch_size must be a positive int, got "
                                f"{type(batch_size).__name__} {batch_size!r}")
        if batch_size < 1:
            raise DataError(f"DataLoader: batch_size must be a positive int, got {batch_size}")
        if seed is not None and generator is not None:
            raise ArgumentError("DataLoader: pass seed= or generator=, not both")
        if generator is not None and not hasattr(generator, "permutation"):
            raise ArgumentError(f"DataLoader: generator must have a .permutation(n) method (a "
                                f"np.random.Generator), got {type(generator).__name__}")
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise ArgumentError(f"DataLoader: the dataset must support len() and indexing, got "
                                f"{type(dataset).__name__}")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self._generator = np.random.default_rng(seed) if seed is not None else generator

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self) -> Iterator:
        # The order is drawn here, not on the first next(), so that random draws made
        # between iter() and the first batch do not change it.
        order = self._epoch_order()
        return (self._batch(order[start:start + self.batch_size])
                for start in range(0, len(self) * self.batch_size, self.batch_size))

    def _epoch_order(self) -> np.ndarray:
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        generator = self._generator if self._generator is not None else tc_random.generator()
        return np.asarray(generator.permutation(n))

    def _batch(self, indices: np.ndarray):
        if isinstance(self.dataset, TensorDataset):
            return self.dataset[indices]
        if isinstance(self.dataset, (np.ndarray, Tensor)):      # an array is a dataset of its rows
            return Tensor.from_numpy(np.asarray(self.dataset)[indices])
        return collate([self.dataset[int(i)] for i in indices], indices)


def collate(items: Sequence, indices: Sequence[int] | None = None):
    """Stack items into a batch: tuples/lists of fields give a tuple of tensors, dicts a
    dict, single arrays/tensors/numbers one tensor.  Numbers become tensors as in
    `tc.tensor` (a Python float is float32).  `indices` name the items in errors."""
    indices = list(range(len(items))) if indices is None else [int(i) for i in indices]
    first = items[0]
    if isinstance(first, Mapping):
        _check_same_structure(items, indices, lambda item: isinstance(item, Mapping) and item.keys() == first.keys(),
                              f"a dict with keys {list(first.keys())}")
        return {key: _stack([item[key] for item in items], indices, f"field '{key}'") for key in first}
    if isinstance(first, (tuple, list)):
        _check_same_structure(items, indices, lambda item: isinstance(item, (tuple, list)) and len(item) == len(first),
                              f"a tuple of {len(first)} fields")
        return tuple(_stack([item[f] for item in items], indices, f"field {f}") for f in range(len(first)))
    return _stack(items, indices, None)


def _check_same_structure(items, indices, same, description: str) -> None:
    for item, index in zip(items, indices):
        if not same(item):
            raise DataError(f"DataLoader: item {indices[0]} is {description}, but item {index} is "
                            f"{type(item).__name__} {_short(item)}; every item needs the same structure")


def _stack(values: list, indices: list[int], field: str | None) -> Tensor:
    """Stack one field of every item (`field` None: the items themselves)."""
    arrays = []
    for value, index in zip(values, indices):
        try:
            tensor = as_tensor(value)
        except (TypeError, ValueError) as e:     # a str, None, a ragged list, ...
            where = f"item {index}, {field}," if field else f"item {index}"
            raise DataError(f"DataLoader: {where} is a {type(value).__name__}, not an array, "
                            f"tensor or number ({e})") from None
        arrays.append(tensor._concrete(f"DataLoader (item {index}{', ' + field if field else ''})"))
    for array, index in zip(arrays, indices):
        if array.shape != arrays[0].shape:
            what = f"{field} of the items" if field else "the items"
            raise ShapeError(f"DataLoader: cannot stack {what} into a batch: item "
                             f"{indices[0]} has shape {arrays[0].shape}, item {index} has {array.shape}")
    return Tensor.from_numpy(np.stack(arrays))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
