"""PyTorch-style operator schemas parsed into frozen dataclasses.

    name.overload(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor

Invariant: `str(parse_schema(text)) == text` for every schema in ops.yaml (tested), so
the dataclasses hold everything the text says, and nothing is lost or normalised.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from ..core.errors import SchemaError

BASE_TYPES = ("Tensor", "Scalar", "int", "float", "bool", "str", "ScalarType", "Device", "MemoryFormat")
# Accepted for PyTorch compatibility, checked when a call binds, and then dropped: they
# can only say what tracecomp does anyway (the CPU, a contiguous layout), so no op sees them.
BINDING_ONLY_TYPES = ("Device", "MemoryFormat")
_TYPE_RE = re.compile(
    r"^(?P<base>[A-Za-z]+)"
    r"(?:\((?P<alias>[a-z]+)(?P<write>!)?(?: -> (?P<after>\*|[a-z]+))?\))?"
    r"(?:(?P<elem_optional>\?)?\[(?P<size>\d*)\])?"
    r"(?P<optional>\?)?$"
)
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Annotation:
    """A view/alias annotation: `(a)`, `(a!)` for writes, `(a -> *)` for aliases into a list."""
    alias: str
    is_write: bool = False
    after: str | None = None

    def __str__(self) -> str:
        after = f" -> {self.after}" if self.after else ""
        return f"({self.alias}{'!' if self.is_write else ''}{after})"


@dataclass(frozen=True)
class Type:
    base: str                       # one of BASE_TYPES
    is_list: bool = False
    list_size: int | None = None    # int[2] -> 2; int[] -> None
    optional: bool = False
    annotation: Annotation | None = None
    elem_optional: bool = False     # Tensor?[]: a list whose elements may be None (index_put)

    def __str__(self) -> str:
        s = self.base + (str(self.annotation) if self.annotation else "")
        if self.is_list:
            s += f"{'?' if self.elem_optional else ''}[{self.list_size if self.list_size is not None else ''}]"
        return s + ("?" if self.optional else "")

    @property
    def is_tensor(self) -> bool:
        return self.base == "Tensor"

    @property
    def is_tensor_list(self) -> bool:
        return self.base == "Tensor" and self.is_list


@dataclass(frozen=True)
class Argument:
    name: str
    type: Type
    default: str | None = None      # the default exactly as written
    kwarg_only: bool = False

    def __str__(self) -> str:
        return f"{self.type} {self.name}" + (f"={self.default}" if self.default is not None else "")

    @property
    def has_default(self) -> bool:
        return self.default is not None

    @property
    def binding_only(self) -> bool:
        return self.type.base in BINDING_ONLY_TYPES

    def default_value(self):
        """The default as a Python value: None, True/False, numbers, strings, int lists."""
        if self.default is None:
            raise KeyError(self.name)
        text = self.default
        if text == "None":
            return None
        if text in ("True", "False"):
            return text == "True"
        value = ast.literal_eval(text)
        if self.type.is_list and isinstance(value, list):
            return tuple(value)
        if self.type.is_list and isinstance(value, int):
            return (value,) * (self.type.list_size or 1)
        if self.type.base == "float" and isinstance(value, int):
            return float(value)
        return value


@dataclass(frozen=True)
class Return:
    type: Type
    name: str | None = None

    def __str__(self) -> str:
        return f"{self.type} {self.name}" if self.name else str(self.type)


@dataclass(frozen=True)
class Schema:
    name: str
    overload: str
    arguments: tuple[Argument, ...]
    returns: tuple[Return, ...]
    returns_tuple: bool = False     # written as `(Tensor a, Tensor b)` or `()`

    def __str__(self) -> str:
        args, seen_star = [], False
        for a in self.arguments:
            if a.kwarg_only and not seen_star:
                args.append("*")
                seen_star = True
            args.append(str(a))
        rets = ", ".join(map(str, self.returns))
        if self.returns_tuple:
            rets = f"({rets})"
        return f"{self.full_name}({', '.join(args)}) -> {rets}"

    @property
    def full_name(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name

    def argument(self, name: str) -> Argument:
        for a in self.arguments:
            if a.name == name:
                return a
        raise KeyError(name)

    @property
    def tensor_arguments(self) -> tuple[Argument, ...]:
        return tuple(a for a in self.arguments if a.type.is_tensor)


def _split_commas(text: str) -> list[str]:
    """Split on top-level commas (commas inside [] or () stay)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def parse_type(text: str) -> Type:
    m = _TYPE_RE.match(text)
    if not m or m.group("base") not in BASE_TYPES:
        raise SchemaError(f"unknown type '{text}' (expected one of {', '.join(BASE_TYPES)}, "
                          "optionally with (a) annotation, [] or [N] list and ? suffix)")
    ann = None
    if m.group("alias"):
        ann = Annotation(m.group("alias"), bool(m.group("write")), m.group("after"))
    size = m.group("size")
    is_list = size is not None
    return Type(m.group("base"), is_list, int(size) if size else None, bool(m.group("optional")), ann,
                bool(m.group("elem_optional")))


def _parse_argument(text: str, kwarg_only: bool) -> Argument:
    decl, eq, default = text.partition("=")
    pieces = decl.rsplit(" ", 1)
    if len(pieces) != 2 or not _NAME_RE.match(pieces[1]):
        raise SchemaError(f"argument '{text}' is not of the form 'Type name[=default]'")
    arg = Argument(pieces[1], parse_type(pieces[0]), default if eq else None, kwarg_only)
    if eq:
        try:
            arg.default_value()
        except (ValueError, SyntaxError):
            raise SchemaError(f"argument '{arg.name}' has a default that is not a literal: '{default}'") from None
    return arg


def _parse_return(text: str) -> Return:
    pieces = text.rsplit(" ", 1)
    if len(pieces) == 2 and _NAME_RE.match(pieces[1]) and not pieces[1].startswith("Tensor"):
        return Return(parse_type(pieces[0]), pieces[1])
    return Return(parse_type(text))


def parse_schema(text: str) -> Schema:
    """Parse `name[.overload](args) -> returns`; raise SchemaError saying what is wrong."""
    m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z0-9_]+))?\((.*)\) -> (.+)$", text)
    if not m:
        raise SchemaError(f"schema '{text}' is not of the form 'name[.overload](args) -> returns'")
    name, overload, args_text, rets_text = m.group(1), m.group(2) or "", m.group(3), m.group(4)
    arguments, kwarg_only, names = [], False, set()
    for piece in _split_commas(args_text):
        if piece == "*":
            if kwarg_only:
                raise SchemaError(f"schema '{text}' has two '*' markers")
            kwarg_only = True
            continue
        arg = _parse_argument(piece, kwarg_only)
        if arg.name in names:
            raise SchemaError(f"schema '{text}' declares argument '{arg.name}' twice")
        names.add(arg.name)
        arguments.append(arg)
    returns_tuple = rets_text.startswith("(")
    if returns_tuple:
        if not rets_text.endswith(")"):
            raise SchemaError(f"schema '{text}': unbalanced parentheses in returns")
        returns = tuple(_parse_return(r) for r in _split_commas(rets_text[1:-1]))
    else:
        returns = (_parse_return(rets_text),)
    schema = Schema(name, overload, tuple(arguments), returns, returns_tuple)
    if str(schema) != text:
        raise SchemaError(f"schema '{text}' is not in canonical form; write it as '{schema}'")
    return schema
