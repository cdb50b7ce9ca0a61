"""Closed-over tensors: found when a function is traced, read again at every call.

A tc.Tensor that a traced function reaches without receiving it as an argument (a
parameter of a tc.nn module in its closure, a tensor in a global it names) becomes a
hidden input of the graph instead of a constant, so the compiled call reads its current
value on every call: an optimizer step, an in-place write, or rebinding the attribute to
another tensor of the same shape and dtype is seen without a recompile.

`find(fn)` walks what fn can reach and gives each tensor a `Source`: a root that does not
move (a closure cell, a module's globals dict, the callable itself) and the lookups from it
(attributes, items).  `Reader` turns the sources of one trace into one generated function
that repeats those lookups, checks that every object on the way still has the class it had
when traced and that each tensor still has its traced type (shape, dtype), and returns
their arrays.  Any difference raises `ClosureMoved`, and tc.trace traces again.

What the walk enters: functions (closure cells and default arguments; for code outside the
libraries also the globals its code names, and the attributes of a module global that its
code names), bound methods, functools.partial, the classes registered with `register`
(tc.nn modules: parameters, buffers, submodules, attributes, and the globals of a user
class's methods; traced functions: their function), lists, tuples, dicts and other
objects' `__dict__`: at most MAX_OBJECTS objects, at most
MAX_DEPTH lookups from a root.  A tensor reached some other way (made inside the function,
or hidden from the walk) stays a constant, as before.  NumPy arrays stay constants (as in
JAX); `baked_array` names the closed-over ones so tc.trace can warn about large ones.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import keyword
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..core.errors import TraceError, TracecompError
from ..tensors.tensor import Tensor

MAX_OBJECTS = 20_000      # objects the walk visits per trace (it stops there, silently)
MAX_DEPTH = 12            # lookups from a root
MAX_ITEMS = 4_096         # entries of one list, tuple or dict
MAX_ALIASES = 4           # other paths to one tensor that each call checks still lead to it
WARN_ELEMENTS = 16        # a baked-in closed-over NumPy array larger than this warns once

_LIBRARIES = frozenset(sys.stdlib_module_names) | {"numpy", "builtins"}
_OWN = "tracecomp"        # its functions' globals are not the user's state; its objects are walked


class ClosureMoved(TraceError):
    """A closed-over tensor is no longer where, or what, the trace found.  tc.trace catches
    it and traces again; a caller of a Lowered signature's run() sees it."""

    def __init__(self, index: int | None, reason: str = ""):
        super().__init__(f"closed-over tensor #{index} of this signature was replaced, changed type or "
                         f"is gone{f' ({reason})' if reason else ''}; call the tc.trace'd function, "
                         "which traces again (a Lowered signature cannot)")
        self.index = index
        self.reason = reason


@dataclass(frozen=True)
class Step:
    """One lookup: `getattr(obj, key)` ("attr") or `obj[key]` ("item"); `cls` is the class of
    what it reached when the function was traced."""
    kind: str
    key: Any
    cls: type


@dataclass(frozen=True)
class Source:
    """Where a closed-over tensor lives: `root` followed by `steps`; `where` reads like the
    user's code ("model.fc1.weight", "params[0]")."""
    root: Any
    steps: tuple[Step, ...]
    where: str
    aliases: tuple["Source", ...] = ()     # other ways the function reaches the same tensor

    def resolve(self) -> Any:
        """What the steps reach now (slow; the Reader's generated code does this per call)."""
        obj = self.root
        for step in self.steps:
            obj = getattr(obj, step.key) if step.kind == "attr" else obj[step.key]
        return obj


def _module_of(obj) -> str:
    return (getattr(obj, "__module__", None) or "").partition(".")[0]


@dataclass(frozen=True)
class Container:
    """How the walk enters an instance of a class registered with `register`.  `tables`:
    attributes holding {name: member} dicts (a Module's parameters, buffers, submodules),
    walked first as `where.name`; the other attributes and the class's methods follow, as
    for any object.  `wraps`: instead, the one attribute that holds what the object runs (a
    traced function's `fn`), walked under the object's own name.  `state`: what
    pickling.same_state compares between two copies (None: their `__dict__`)."""
    tables: tuple[str, ...] = ()
    wraps: str | None = None
    state: Callable[[Any], Any] | None = None


# The classes that later folders define (nn.Module, trace.TracedFunction) register here at
# import, so that this module, which they import, need not import them.
_CONTAINERS: dict[type, Container] = {}


def register(cls: type, container: Container) -> None:
    """Enter instances of `cls` (and of its subclasses) as `container` says."""
    _CONTAINERS[cls] = container


def container_of(obj) -> Container | None:
    """The registration of `obj`'s class or of its nearest registered base."""
    for klass in type(obj).__mro__:
        found = _CONTAINERS.get(klass)
        if found is not None:
            return found
    return None


class Closure:
    """What a function reaches: tensors by id (with their Source) and NumPy arrays by id."""

    def __init__(self):
        self.tensors: dict[int, tuple[Tensor, Source]] = {}
        self.arrays: dict[int, tuple[np.ndarray, str]] = {}

    def source_of(self, t: Tensor) -> Source | None:
        found = self.tensors.get(id(t))
        return found[1] if found is not None and found[0] is t else None

    def baked_array(self, t: Tensor) -> str | None:
        """The name of the closed-over NumPy array that the constant `t` wraps (None if it
        wraps none: a Python scalar, an array made inside the function)."""
        data = t._data
        for a in (data, getattr(data, "base", None)):
            found = self.arrays.get(id(a)) if a is not None else None
            if found is not None and found[0] is a:
                return found[1]
        return None


def find(fn: Callable) -> Closure:
    """Every tensor and NumPy array `fn` can reach (see the module docstring), breadth first,
    so each gets its shortest path."""
    walk = _Walk()
    walk.push(fn, fn, (), getattr(fn, "__name__", None) or type(fn).__name__)
    visited = 0
    while walk.queue and visited < MAX_OBJECTS:
        visited += 1
        try:
            walk.visit(*walk.queue.popleft())
        except Exception:           # noqa: BLE001 - a hostile object (a raising __dict__, a
            continue                # dict changed meanwhile) is not entered; the trace goes on
    return walk.closure


class _Walk:
    def __init__(self):
        self.closure = Closure()
        self.queue: collections.deque = collections.deque()
        self.seen: dict[int, Any] = {}         # id -> object (kept, so ids stay unique)

    def push(self, obj, root, steps: tuple, where: str) -> None:
        if isinstance(obj, Tensor):
            found = self.closure.tensors.get(id(obj))
            if found is None:
                self.closure.tensors[id(obj)] = (obj, Source(root, steps, where))
            elif len(found[1].aliases) < MAX_ALIASES:      # tied weights: rebinding one path unties them
                source = dataclasses.replace(found[1], aliases=found[1].aliases + (Source(root, steps, where),))
                self.closure.tensors[id(obj)] = (obj, source)
        elif isinstance(obj, np.ndarray):
            self.closure.arrays.setdefault(id(obj), (obj, where))
        elif not isinstance(obj, (type, types.ModuleType, str, bytes, int, float, complex, type(None),
                                  np.generic)) and id(obj) not in self.seen and len(steps) < MAX_DEPTH:
            self.seen[id(obj)] = obj
            self.queue.append((obj, root, steps, where))

    def visit(self, obj, root, steps: tuple, where: str) -> None:
        def down(kind: str, key, value, name: str, path: tuple = steps) -> None:
            self.push(value, root, path + (Step(kind, key, type(value)),), name)

        if isinstance(obj, types.FunctionType):
            self.function(obj)
        elif isinstance(obj, types.MethodType):
            down("attr", "__self__", obj.__self__, where)
            self.push(obj.__func__, obj.__func__, (), where)
        elif isinstance(obj, functools.partial):
            self.push(obj.func, obj.func, (), where)
            down("attr", "args", obj.args, f"{where}.args")
            down("attr", "keywords", obj.keywords, f"{where}.keywords")
        elif (container := container_of(obj)) is not None:
            self.container(obj, container, root, steps, where)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj[:MAX_ITEMS]):
                down("item", i, v, f"{where}[{i}]")
        elif isinstance(obj, dict):
            for k, v in list(obj.items())[:MAX_ITEMS]:
                if isinstance(k, (str, int)):
                    down("item", k, v, f"{where}[{k!r}]")
        elif _module_of(type(obj)) not in _LIBRARIES:
            self.attributes(obj, root, steps, where)
            self.methods(type(obj))

    def container(self, obj, container: Container, root, steps: tuple, where: str) -> None:
        if container.wraps is not None:
            value = getattr(obj, container.wraps)
            self.push(value, root, steps + (Step("attr", container.wraps, type(value)),), where)
            return
        for slot in container.tables:
            table = obj.__dict__[slot]
            path = steps + (Step("attr", slot, type(table)),)
            for k, v in list(table.items()):
                self.push(v, root, path + (Step("item", k, type(v)),), f"{where}.{k}")
        self.attributes(obj, root, steps, where, skip=container.tables)
        self.methods(type(obj))

    def attributes(self, obj, root, steps: tuple, where: str, skip: tuple = ()) -> None:
        attrs = getattr(obj, "__dict__", None)
        if not isinstance(attrs, dict):
            return
        for k, v in list(attrs.items())[:MAX_ITEMS]:
            if isinstance(k, str) and k not in skip:
                self.push(v, root, steps + (Step("attr", k, type(v)),), f"{where}.{k}")

    def methods(self, cls: type) -> None:
        """The functions of a user's class (and its user bases): their globals are state too."""
        for klass in cls.__mro__:
            if _module_of(klass) in _LIBRARIES or _module_of(klass) == _OWN:
                continue
            for v in list(vars(klass).values()):
                v = v.__func__ if isinstance(v, (staticmethod, classmethod)) else v
                if isinstance(v, types.FunctionType):
                    self.push(v, v, (), v.__qualname__)

    def function(self, f: types.FunctionType) -> None:
        """A function's closure cells and defaults, and, outside the libraries, the globals
        (and module attributes) its code names: each one a root of its own."""
        code = f.__code__
        for name, cell in zip(code.co_freevars, f.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:             # a cell not filled yet
                continue
            self.push(value, cell, (Step("attr", "cell_contents", type(value)),), name)
        if f.__defaults__:
            self.push(f.__defaults__, f, (Step("attr", "__defaults__", tuple),), f"{f.__name__} defaults")
        if f.__kwdefaults__:
            self.push(f.__kwdefaults__, f, (Step("attr", "__kwdefaults__", dict),), f"{f.__name__} defaults")
        module = _module_of(f)
        if module in _LIBRARIES or module == _OWN:
            return
        names, scope = code_names(code), f.__globals__
        for name in names:
            if name not in scope:
                continue
            value = scope[name]
            if isinstance(value, types.ModuleType):
                self.module_attributes(value, name, names)
            else:
                self.push(value, scope, (Step("item", name, type(value)),), name)

    def module_attributes(self, module: types.ModuleType, name: str, names: frozenset) -> None:
        """`config.weights` in the code: the module's attributes that the code names."""
        if _module_of(module) in _LIBRARIES or module.__name__.partition(".")[0] == _OWN:
            return
        scope = module.__dict__
        for attr in names:
            if attr in scope and not isinstance(scope[attr], types.ModuleType):
                self.push(scope[attr], scope, (Step("item", attr, type(scope[attr])),), f"{name}.{attr}")


@functools.lru_cache(maxsize=1024)
def code_names(code: types.CodeType) -> frozenset:
    """The global and attribute names a code object (and the code nested in it) uses."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= code_names(c)
    return frozenset(names)


class Reader:
    """The current arrays of one trace's closed-over tensors, in hidden-input order.

    `read()` is generated code: the sources' lookups (shared prefixes looked up once), a
    class check on every object on the way, for each tensor that is not the very object
    traced an isinstance and type check, and for a tensor the function reaches two ways
    (tied weights) a check that both still lead to it.  It raises ClosureMoved when
    anything differs.
    Invariant: when read() returns, the i-th array has the type the i-th hidden input was
    traced with."""

    def __init__(self, sources: list[Source], tensors: list[Tensor]):
        self.sources = sources
        self.types = [t._type for t in tensors]
        self.read: Callable[[], list[np.ndarray]] = _generate(sources, tensors)

    def tensors(self) -> list[Tensor]:
        """The tensors the sources reach now (after a successful read())."""
        return [s.resolve() for s in self.sources]

    def explain(self, moved: ClosureMoved) -> str:
        """What changed, for the log and for errors: the first source that no longer holds a
        tensor of its traced type."""
        for source, expected in zip(self.sources, self.types):
            try:
                now = source.resolve()
            except Exception as e:       # noqa: BLE001 - any failed lookup is "gone"
                return f"closed-over tensor {source.where} can no longer be reached ({type(e).__name__}: {e})"
            if not isinstance(now, Tensor):
                return f"closed-over {source.where} is now a {type(now).__name__}, not a tensor"
            if now._type != expected:
                return f"closed-over tensor {source.where} is now {now._type}, traced as {expected}"
            if now._data is None:
                return f"closed-over tensor {source.where} is a traced value of another trace"
            for alias in source.aliases:
                try:
                    other = alias.resolve()
                except Exception:        # noqa: BLE001 - any failed lookup is "gone"
                    other = None
                if other is not now:
                    return f"closed-over {alias.where} is no longer the tensor {source.where}"
        where = self.sources[moved.index].where if moved.index is not None else "a closed-over tensor"
        return f"an object on the way to {where} changed class" + (f" ({moved.reason})" if moved.reason else "")


def _generate(sources: list[Source], tensors: list[Tensor]) -> Callable[[], list[np.ndarray]]:
    """The Reader's function, as Python source compiled once.  Keys, roots, classes and
    types live in its globals (never in the text), so a user's attribute or dict key cannot
    change the code; only identifier attribute names are written inline."""
    emit = _Emitter()
    for i, (source, t) in enumerate(zip(sources, tensors)):
        x = emit.path(i, source)
        emit.line(f"if {x} is not {emit.const(t)} and not (isinstance({x}, Tensor) and "
                  f"{x}._type == {emit.const(t._type)}): raise ClosureMoved({i})")
        for alias in source.aliases:          # one tensor reached two ways: still one tensor?
            emit.line(f"if {emit.path(i, alias)} is not {x}: raise ClosureMoved({i}, 'aliases')")
        emit.line(f"if {x}._view_of is not None: check_fresh({x})")    # as eager: a stale view raises
        emit.line(f"d{i} = {x}._data")
        emit.line(f"if d{i} is None: raise ClosureMoved({i})")
    body = "\n".join("        " + line for line in emit.lines)
    text = (f"def read():\n    try:\n{body}\n    except TracecompError:\n        raise\n"
            f"    except Exception as e:\n        raise ClosureMoved(None, f'{{type(e).__name__}}: {{e}}') from None\n"
            f"    return [{', '.join(f'd{i}' for i in range(len(sources)))}]\n")
    exec(compile(text, "<tracecomp closure reader>", "exec"), emit.env)   # noqa: S102 - text built above
    return emit.env["read"]


class _Emitter:
    """The reader's lines and globals; each lookup prefix (root and steps) is emitted once."""

    def __init__(self):
        from ..tensors.tensor import check_fresh
        self.env: dict[str, Any] = {"ClosureMoved": ClosureMoved, "Tensor": Tensor, "isinstance": isinstance,
                                    "check_fresh": check_fresh, "TracecompError": TracecompError}
        self.lines: list[str] = []
        self.names: dict[tuple, str] = {}     # (id(root), steps so far) -> variable

    def const(self, value) -> str:
        name = f"k{len(self.env)}"
        self.env[name] = value
        return name

    def line(self, text: str) -> None:
        self.lines.append(text)

    def path(self, i: int, source: Source) -> str:
        """The variable holding what `source` reaches, with a class check on every object on
        the way (raising ClosureMoved(i))."""
        key = (id(source.root), ())
        if key not in self.names:
            self.names[key] = self.const(source.root)
        prev = self.names[key]
        for j, step in enumerate(source.steps):
            key = (id(source.root), source.steps[:j + 1])
            if key in self.names:
                prev = self.names[key]
                continue
            var = self.names[key] = f"v{len(self.names)}"
            if step.kind == "attr" and step.key.isidentifier() and not keyword.iskeyword(step.key):
                self.line(f"{var} = {prev}.{step.key}")
            else:
                how = "getattr({}, {})" if step.kind == "attr" else "{}[{}]"
                self.line(f"{var} = " + how.format(prev, self.const(step.key)))
            if j < len(source.steps) - 1:
                self.line(f"if {var}.__class__ is not {self.const(step.cls)}: raise ClosureMoved({i})")
            prev = var
        return prev
