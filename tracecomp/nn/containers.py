"""Sequential, ModuleList and ModuleDict: modules that hold modules (PyTorch's)."""
from __future__ import annotations

import collections
from typing import Any, Iterable, Iterator

from ..core.errors import ArgumentError
from .module import Module


def _index(i: int, n: int, what: str) -> int:
    if not -n <= i < n:
        raise IndexError(f"{what}: index {i} is out of range for {n} module(s)")
    return i % n


class _Numbered(Module):
    """Modules registered under their positions "0", "1", ...: Sequential's and ModuleList's
    length, iteration and append."""

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module):
        self.add_module(str(len(self)), module)
        return self


class Sequential(_Numbered):
    """Calls its modules in order, each on the previous one's output."""

    def __init__(self, *modules: Module):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], collections.OrderedDict):
            for name, m in modules[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(modules):
                self.add_module(str(i), m)

    def __getitem__(self, i):
        items = list(self._modules.items())
        if isinstance(i, slice):
            return Sequential(collections.OrderedDict(items[i]))
        return items[_index(i, len(items), "Sequential")][1]

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x


class ModuleList(_Numbered):
    """A list of modules, registered (their parameters are the list's)."""

    def __init__(self, modules: Iterable[Module] | None = None):
        super().__init__()
        self.extend(modules or [])

    def __getitem__(self, i):
        items = list(self._modules.values())
        if isinstance(i, slice):
            return ModuleList(items[i])
        return items[_index(i, len(items), "ModuleList")]

    def __setitem__(self, i: int, module: Module) -> None:
        self.add_module(str(_index(i, len(self), "ModuleList")), module)

    def extend(self, modules: Iterable[Module]) -> "ModuleList":
        for m in modules:
            self.append(m)
        return self

    def insert(self, index: int, module: Module) -> None:
        items = list(self._modules.values())
        items.insert(index, module)
        self._modules.clear()
        self.extend(items)

    def forward(self, *args, **kwargs):
        raise ArgumentError("ModuleList has no forward(): iterate over it and call its modules")


class ModuleDict(Module):
    """A dict of modules by name, registered, in insertion order."""

    def __init__(self, modules: Any = None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def update(self, modules: Any) -> None:
        pairs = modules.items() if hasattr(modules, "items") else modules
        for key, m in pairs:
            self.add_module(key, m)

    def forward(self, *args, **kwargs):
        raise ArgumentError("ModuleDict has no forward(): index it and call its modules")
