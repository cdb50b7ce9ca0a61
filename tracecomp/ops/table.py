"""Load ops.yaml into OpDefs: the one table that drives API, kernels, shape rules and lowering.

Each entry declares a schema, how Python reaches it (variants, operators, properties)
and its semantics: exactly one of
  elementwise: <scalar expression over the arguments>   (see formula.py)
  composite:   <program over other ops>                 (decomposed before compiling)
  kind:        <name of a shape rule and kernel family>  (reduction, matmul, reshape, ...)
An op of `kind: region` (tc.scan, tc.while_loop, tc.cond) also names its `regions`, the
graphs it holds (ir/regions.py); tracecomp/control/, not bindings.py, gives it its Python API.
Errors name ops.yaml, the line, the entry and what is wrong.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..core.errors import TableError
from . import formula
from .schema import Schema, parse_schema

ELEMENTWISE_DTYPE_RULES = ("promote", "float", "bool", "logical")
ACCEPTED_DTYPES = ("any", "numeric", "float", "integral")
KNOWN_KEYS = {"func", "variants", "operators", "reflected", "properties", "elementwise",
              "composite", "kind", "dtype", "promote", "accepts", "nondeterministic",
              "doc", "impl", "choices", "torch", "regions", "opmath", "autocast"}
AUTOCAST_POLICIES = ("lower", "fp32", "promote")   # PyTorch's lower_precision_fp, fp32, promote
VARIANTS = ("function", "method", "inplace")    # inplace: a `name_` method too (elementwise methods get one anyway)
OPERATORS = {"__add__", "__sub__", "__mul__", "__truediv__", "__pow__", "__matmul__", "__neg__",
             "__abs__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__and__",
             "__or__", "__invert__", "__floordiv__", "__mod__", "__xor__"}
REFLECTED = {"__radd__", "__rsub__", "__rmul__", "__rtruediv__", "__rpow__", "__rmatmul__",
             "__rand__", "__ror__", "__rxor__", "__rmod__", "__rfloordiv__"}


@dataclass(frozen=True)
class OpDef:
    """One overload of one operator, as ops.yaml declares it."""
    schema: Schema
    file: str
    line: int
    kind: str                                  # "elementwise", "composite" or a kind name
    variants: tuple[str, ...] = ("function",)
    operators: tuple[str, ...] = ()
    reflected: tuple[str, ...] = ()
    properties: tuple[str, ...] = ()
    expr: formula.Expr | None = None           # elementwise semantics
    program: tuple | None = None               # composite semantics
    dtype_rule: str = "promote"
    promote: tuple[str, ...] = ()              # arguments that take part in type promotion
    accepts: str = "any"
    impl: str | None = None                    # which member of a kind family (sum, amax, ...)
    nondeterministic: bool = False
    choices: tuple[tuple[str, tuple[str, ...]], ...] = ()   # allowed values of str arguments
    doc: str = ""
    torch: str = ""                            # PyTorch's name when not torch.<name> ("-": none)
    regions: tuple[str, ...] = ()              # kind "region": the names of the graphs it holds
    opmath: bool = False                       # composite: half inputs run the program in float32
    autocast: str = ""                         # what tc.autocast casts its inputs to ("": nothing)
    source: str = field(default="", compare=False)   # the schema text, for round-trip tests

    @property
    def name(self) -> str:
        return self.schema.name

    @property
    def full_name(self) -> str:
        return self.schema.full_name

    @property
    def ir_name(self) -> str:
        return "tc." + self.schema.full_name

    @property
    def inplace(self) -> bool:
        """Whether Tensor gets a `name_` method writing the result into self, as PyTorch's
        in-place variants: declared, or any elementwise method whose first argument is self."""
        return "inplace" in self.variants or (self.kind == "elementwise" and "method" in self.variants
                                               and self.schema.arguments[0].name == "self")

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def __repr__(self) -> str:
        return f"<OpDef {self.full_name} ({self.where})>"

    def arguments_from(self, operands: list, attrs: dict[str, Any]) -> dict[str, Any]:
        """Rebuild the arguments by name from an IR op: Tensors not in `attrs` are operands,
        in schema order, a Tensor[] taking whatever operands the others leave."""
        fixed = [a for a in self.schema.arguments
                 if a.type.is_tensor and not a.type.is_list and a.name not in attrs]
        n_list = len(operands) - len(fixed)
        if n_list < 0 or (n_list and not any(a.type.is_tensor_list for a in self.schema.arguments)):
            raise ValueError(f"{self.ir_name} expects {len(fixed)} tensor operand(s), got {len(operands)}")
        rest, out = iter(operands), {}
        for a in self.schema.arguments:
            if a.binding_only:        # checked when the call bound; no op sees it
                continue
            if a.type.is_tensor_list and a.type.elem_optional:   # Tensor?[]: the attribute says which entries are tensors
                present = attrs.get(a.name)
                if not isinstance(present, (list, tuple)) or sum(map(bool, present)) != n_list:
                    raise ValueError(f"{self.ir_name} needs attribute '{a.name}', a list saying which of "
                                     f"its entries are the {n_list} remaining tensor operand(s)")
                out[a.name] = [next(rest) if p else None for p in present]
            elif a.name in attrs:
                out[a.name] = attrs[a.name]
            elif a.type.is_tensor_list:
                out[a.name] = [next(rest) for _ in range(n_list)]
            elif a.type.is_tensor:
                out[a.name] = next(rest)
            else:
                raise ValueError(f"{self.ir_name} is missing attribute '{a.name}' ({a.type})")
        unknown = set(attrs) - {a.name for a in self.schema.arguments}
        if unknown:
            raise ValueError(f"{self.ir_name} has unknown attribute(s) {', '.join(sorted(unknown))}")
        return out


def per_kind(registry: dict):
    """The decorator that registers a function for op kinds in `registry` (the shape rules,
    the NumPy kernels, the vmap rules): `@rule("scan", "sort")`."""
    def for_kinds(*kinds: str):
        def register(fn):
            for k in kinds:
                registry[k] = fn
            return fn
        return register
    return for_kinds


class _LineLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """SafeLoader that records each mapping's line as `__line__`.  On libyaml's parser when
    PyYAML has it: ops.yaml parses in 11 ms instead of 88 (every process, at import)."""

    file_name = "<yaml>"

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:      # PyYAML would silently keep the last of two keys
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise TableError(f"key '{key}' appears twice in one entry (lines {seen[key]} and {line})",
                                 self.file_name, node.start_mark.line + 1)
            seen[key] = line
        mapping = super().construct_mapping(node, deep=deep)
        mapping["__line__"] = node.start_mark.line + 1
        return mapping


def _as_tuple(entry: dict, key: str, allowed, err) -> tuple[str, ...]:
    value = entry.get(key, ())
    value = (value,) if isinstance(value, str) else tuple(value)
    for v in value:
        if allowed is not None and v not in allowed:
            err(f"'{key}' has unknown value '{v}' (allowed: {', '.join(sorted(allowed))})")
    return value


def _semantics(entry: dict, schema: Schema, err) -> dict[str, Any]:
    given = [k for k in ("elementwise", "composite", "kind") if k in entry]
    if len(given) != 1:
        err("needs exactly one of 'elementwise', 'composite' or 'kind' "
            f"(found {', '.join(given) or 'none'})")
    where = schema.full_name
    try:
        if "elementwise" in entry:
            if len(schema.returns) != 1:
                err("an elementwise op returns exactly one Tensor")
            return {"kind": "elementwise", "expr": formula.parse_expr(str(entry["elementwise"]), where)}
        if "composite" in entry:
            return {"kind": "composite", "program": formula.parse_program(str(entry["composite"]), where)}
    except TableError as e:
        err(str(e).split(": ", 1)[-1])
    return {"kind": str(entry["kind"])}


def _build(entry: dict, file: str) -> OpDef:
    line = entry.pop("__line__")
    label = str(entry.get("func", "?"))

    def err(msg: str):
        raise TableError(msg, file, line, label)

    if "func" not in entry:
        err("entry has no 'func' schema")
    unknown = set(entry) - KNOWN_KEYS
    if unknown:
        err(f"unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(KNOWN_KEYS))})")
    try:
        schema = parse_schema(label)
    except TableError as e:
        raise TableError(str(e), file, line, label) from None
    if sum(a.type.is_tensor_list for a in schema.arguments) > 1:
        err("at most one Tensor[] argument per op")
    sem = _semantics(entry, schema, err)
    tensor_args = tuple(a.name for a in schema.arguments if a.type.is_tensor and not a.type.is_list)
    promote = _as_tuple(entry, "promote", set(tensor_args), err) or tensor_args
    dtype_rule = entry.get("dtype", "promote")
    if dtype_rule not in ELEMENTWISE_DTYPE_RULES:
        err(f"'dtype' must be one of {', '.join(ELEMENTWISE_DTYPE_RULES)}, not '{dtype_rule}'")
    accepts = entry.get("accepts", "any")
    if accepts not in ACCEPTED_DTYPES:
        err(f"'accepts' must be one of {', '.join(ACCEPTED_DTYPES)}, not '{accepts}'")
    choices = {k: v for k, v in entry.get("choices", {}).items() if k != "__line__"}
    for name, allowed in choices.items():
        if name not in {a.name for a in schema.arguments if a.type.base == "str"}:
            err(f"'choices' names '{name}', which is not a str argument")
    variants = _as_tuple(entry, "variants", set(VARIANTS), err) or ("function",)
    regions = _as_tuple(entry, "regions", None, err)
    if bool(regions) != (sem["kind"] == "region"):
        err("an op of kind 'region' names its 'regions', and only such an op does")
    if regions:
        variants = ()       # reached through tracecomp/control, not bound from the schema
    if ({"method", "inplace"} & set(variants) or entry.get("properties")) and "self" not in {a.name for a in schema.arguments}:
        err("a method, inplace or property variant needs an argument named 'self'")
    return OpDef(
        schema=schema, file=file, line=line, variants=variants,
        operators=_as_tuple(entry, "operators", OPERATORS | REFLECTED, err),
        reflected=_as_tuple(entry, "reflected", OPERATORS | REFLECTED, err),
        properties=_as_tuple(entry, "properties", None, err),
        dtype_rule=dtype_rule, promote=promote, accepts=accepts,
        impl=entry.get("impl"),
        nondeterministic=bool(entry.get("nondeterministic", False)),
        choices=tuple((k, tuple(map(str, v))) for k, v in choices.items()),
        doc=str(entry.get("doc", "")), torch=str(entry.get("torch", "")), regions=regions,
        opmath=_opmath(entry, sem["kind"], err), autocast=_autocast(entry, err), source=label, **sem)


def _opmath(entry: dict, kind: str, err) -> bool:
    value = entry.get("opmath", False)
    if not isinstance(value, bool) or (value and kind != "composite"):
        err("'opmath' is true or false, and only a composite op may set it")
    return value


def _autocast(entry: dict, err) -> str:
    value = entry.get("autocast", "")
    if value and value not in AUTOCAST_POLICIES:
        err(f"'autocast' must be one of {', '.join(AUTOCAST_POLICIES)}, not '{value}'")
    return value


def _check_references(ops: dict[str, OpDef]) -> None:
    """Elementwise expressions may call scalar primitives or other elementwise ops."""
    from .elementwise import BUILTINS, CONSTANTS   # (derived from the table: imported once it is read)
    from .special import SPECIAL
    from .scalar import PRIMITIVES   # names every backend implements
    elementwise = {op.name for op in ops.values() if op.kind == "elementwise"}
    for op in ops.values():
        if op.kind != "elementwise":
            continue
        args = {a.name for a in op.schema.arguments}
        for name in formula.free_names(op.expr):
            if name.endswith("()"):
                fn = name[:-2]
                if fn not in PRIMITIVES and fn not in elementwise and fn not in BUILTINS and fn not in SPECIAL:
                    raise TableError(f"elementwise formula calls '{fn}', which is neither a scalar "
                                     "primitive nor an elementwise op", op.file, op.line, op.source)
            elif name not in args and name not in ("True", "False", "None") and name not in CONSTANTS:
                raise TableError(f"elementwise formula uses '{name}', which is not an argument "
                                 f"(arguments: {', '.join(sorted(args))})", op.file, op.line, op.source)


def read_entries(path: Path) -> list:
    """A YAML table's entries, each mapping with its `__line__`; errors name file and line."""
    loader = type("Loader", (_LineLoader,), {"file_name": path.name})
    text = path.read_text()
    try:
        entries = yaml.load(text, Loader=loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        # libyaml puts the end of a file without a final newline on a line past the last
        line = min(mark.line + 1, text.count("\n") + 1) if mark else None
        raise TableError(f"not valid YAML: {getattr(e, 'problem', e)}", path.name, line) from None
    return [] if entries is None else entries


def load_table(path: str | Path) -> dict[str, OpDef]:
    """Parse and validate an ops.yaml file into {full_name: OpDef} in file order."""
    path = Path(path)
    entries = read_entries(path)
    if not isinstance(entries, list):
        raise TableError("the table must be a YAML list of entries", path.name, 1)
    ops: dict[str, OpDef] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise TableError(f"entry is not a mapping: {entry!r}", path.name)
        op = _build(entry, path.name)
        if op.full_name in ops:
            raise TableError(f"'{op.full_name}' is declared twice (first at line "
                             f"{ops[op.full_name].line})", op.file, op.line, op.source)
        ops[op.full_name] = op
    _check_references(ops)
    return ops


def table_path(name: str = "ops.yaml") -> Path:
    """The table shipped in the wheel, or the repository's copy in a source checkout."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / name, here.parent / name):
        if candidate.exists():
            return candidate
    raise TableError(f"cannot find {name} next to the tracecomp package")


@functools.cache
def default_table() -> dict[str, OpDef]:
    return load_table(table_path())


# Kinds whose result is a view of their input in PyTorch (index arithmetic when compiled)
VIEW_KINDS = ("reshape", "squeeze", "unsqueeze", "permute", "expand", "select", "slice", "split", "flip")


def by_ir_name() -> dict[str, OpDef]:
    return _IR_NAMES()


@functools.cache
def _IR_NAMES() -> dict[str, OpDef]:
    return {op.ir_name: op for op in default_table().values()}
