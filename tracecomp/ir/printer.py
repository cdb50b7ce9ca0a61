"""Print a Graph as MLIR generic-op text in the `tc` dialect inside one `func.func`.

Invariants of the output (relied on by ir/parser.py and by `mlir-opt
--allow-unregistered-dialect`):
- inputs are named %arg0, %arg1, ...; op results %0, %1, ... in print order, one
  number per op that has results, counted over the whole function (ops inside regions
  too); a K-result op prints `%N:K = ...` and its results are used as `%N#i`;
- one op per line: `"name"(operands) {attrs} : (types) -> types loc(...)`, with no
  `{}` for empty attrs and no `loc(...)` when the op has no location;
- an op with regions (tc.scan, tc.while_loop, tc.cond) prints them between its operands
  and its attributes, as MLIR's generic grammar has it:
      %3:2 = "tc.scan"(%arg0, %1, %2) ({
      ^body(%b0: tensor<4xf32>, %b1: tensor<4xf32>, %b2: tensor<4xf32>):
        %4 = "tc.add"(%b1, %b2) {alpha = 1 : i64} : (...) -> tensor<4xf32>
        "tc.yield"(%4, %4) : (tensor<4xf32>, tensor<4xf32>) -> ()
      }) {length = 5 : i64, ...} : (...) -> (...) loc(...)
  several regions as `({ ... }, { ... })`; each region is one block labelled with the
  region graph's name (see block_label) whose arguments are the region's inputs, named
  %b0, %b1, ... counted over the whole function; its ops are indented two more spaces
  and it ends with `"tc.yield"(outputs)`, the terminator that exists only in the text.
  Every name is unique in the function: mlir-opt treats an unregistered op's regions as
  not isolated, so a name reused inside a region would be a redefinition;
- attributes keep the dict's insertion order and each value kind has exactly one
  spelling (see format_attr), so `parse_graph(print_graph(g)) == g`.
The printer never fails on a graph whose wiring is broken: a value with no definition
prints as `%undefN` (so the verifier's reports can show the graph; parsing it fails).
A region value used outside its region, or an outer value used inside a region, prints
by its own name (the text parses; the verifier rejects the graph).
"""
from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from ..core.dtypes import DType
from ..core.errors import IRError
from ..core.symbolic import Dim
from .graph import Graph, Op, Value
from ..core.locations import Location

# Arrays up to this many elements print as literal lists; larger ones as hex bytes.
DENSE_LITERAL_LIMIT = 16
_NUMPY_TO_MLIR = {d.np: d.mlir for d in DType}
_INT64_MIN, _INT64_MAX = -2**63, 2**63 - 1


YIELD = "tc.yield"   # a region's terminator: only in the text (a region's outputs in the Graph)


def print_graph(graph: Graph) -> str:
    """The graph as a `func.func` in MLIR generic-op syntax (no trailing newline)."""
    names = value_names(graph)
    lines = [_func_header(graph, names)]
    for op in graph.ops:
        _op_lines(op, names, "  ", lines)
    lines.append("  " + return_line(graph, names))
    lines.append("}")
    return "\n".join(lines)


def value_names(graph: Graph) -> dict[Value, str]:
    """The printed name of each value: %arg<i> for inputs, %<n> for the result of the n-th
    op with results, %<n>#<j> for result j of a multi-result op, %b<k> for the k-th block
    argument (a region's input); ops and regions count in print order over the whole
    function, regions included (the drawing and the verifier's reports use them too).  A
    region graph two ops share prints twice with the names of its last visit: a region's
    names are scoped to it, so the text still parses (as two equal regions)."""
    names = {v: f"%arg{i}" for i, v in enumerate(graph.inputs)}
    counts = {"op": 0, "arg": 0}
    stack = [iter(graph.ops)]     # an iterator per open region: nesting needs no recursion
    while stack:
        op = next(stack[-1], None)
        if op is None:
            stack.pop()
            continue
        for j, r in enumerate(op.results):
            names[r] = f"%{counts['op']}" if len(op.results) == 1 else f"%{counts['op']}#{j}"
        counts["op"] += 1 if op.results else 0
        for region in reversed(op.regions):     # regions print first to last
            stack.append(_region_ops(region, names, counts))
    return names


def _region_ops(region: Graph, names: dict[Value, str], counts: dict[str, int]):
    """The region's ops, naming its block arguments when the walk reaches the region."""
    for v in region.inputs:
        names[v] = f"%b{counts['arg']}"
        counts["arg"] += 1
    yield from region.ops


def _use(value: Value, names: dict[Value, str]) -> str:
    if value not in names:
        names[value] = f"%undef{sum(n.startswith('%undef') for n in names.values())}"
    return names[value]


def _func_header(graph: Graph, names: dict[Value, str]) -> str:
    args = ", ".join(f"{names[v]}: {v.type}" for v in graph.inputs)
    results = ", ".join(str(v.type) for v in graph.outputs)
    return f"func.func @{_symbol(graph.name)}({args}) -> ({results}) {{"


def _symbol(name: str) -> str:
    return name if _is_bare_identifier(name) else format_string(name)


def _op_lines(op: Op, names: dict[Value, str], indent: str, lines: list[str]) -> None:
    """Append the op's line, or for an op with regions its lines, at `indent`."""
    if not op.regions:
        lines.append(indent + _op_head(op, names) + _op_tail(op, names))
        return
    lines.append(indent + _op_head(op, names) + " ({")
    for k, region in enumerate(op.regions):
        if k:
            lines.append(indent + "}, {")
        lines.append(indent + _block_header(region, names))
        for inner in region.ops:
            _op_lines(inner, names, indent + "  ", lines)
        lines.append(indent + "  " + yield_line(region, names))
    lines.append(indent + "})" + _op_tail(op, names))


def format_op(op: Op, names: dict[Value, str]) -> str:
    """The op on one line, its regions elided as `({...})` (for messages; not parseable)."""
    regions = " (" + ", ".join("{...}" for _ in op.regions) + ")" if op.regions else ""
    return _op_head(op, names) + regions + _op_tail(op, names)


def _op_head(op: Op, names: dict[Value, str]) -> str:
    text = ""
    if op.results:
        first = names[op.results[0]].split("#")[0]
        text = f"{first} = " if len(op.results) == 1 else f"{first}:{len(op.results)} = "
    return text + f"{format_string(op.name)}({', '.join(_use(v, names) for v in op.operands)})"


def _op_tail(op: Op, names: dict[Value, str]) -> str:
    text = ""
    if op.attrs:
        text += " {" + ", ".join(_attr_entry(k, v) for k, v in op.attrs.items()) + "}"
    operand_types = ", ".join(str(v.type) for v in op.operands)
    text += f" : ({operand_types}) -> {_result_types(op.results)}"
    if op.loc is not None:
        text += " " + format_location(op.loc)
    return text


def _block_header(region: Graph, names: dict[Value, str]) -> str:
    args = ", ".join(f"{names[v]}: {v.type}" for v in region.inputs)
    return f"^{block_label(region.name)}" + (f"({args}):" if args else ":")


def block_label(name: str) -> str:
    """A region graph's name as an MLIR block label (`^body`): a name that is not one
    (other characters, a leading digit) has those bytes written `$XX`, and the empty name
    is `$`; `$` is itself escaped, so the parser reads the name back exactly."""
    out, all_digits = [], name.isascii() and name.isdigit()
    for i, char in enumerate(name):
        plain = char.isascii() and (char.isalpha() or char in "_.-" or (char.isdigit() and (i or all_digits)))
        out.append(char if plain else "".join(f"${b:02X}" for b in char.encode("utf-8")))
    return "".join(out) or "$"


def yield_line(region: Graph, names: dict[Value, str]) -> str:
    """The terminator that ends a region's block: what the region yields."""
    values = ", ".join(_use(v, names) for v in region.outputs)
    types = ", ".join(str(v.type) for v in region.outputs)
    return f"{format_string(YIELD)}({values}) : ({types}) -> ()"


def _result_types(results: list[Value]) -> str:
    if len(results) == 1:
        return str(results[0].type)
    return "(" + ", ".join(str(r.type) for r in results) + ")"


def return_line(graph: Graph, names: dict[Value, str]) -> str:
    if not graph.outputs:
        return "return"
    values = ", ".join(_use(v, names) for v in graph.outputs)
    return f"return {values} : " + ", ".join(str(v.type) for v in graph.outputs)


def _attr_entry(key: str, value: Any) -> str:
    if not key:
        raise IRError("attribute names must not be empty")
    name = key if _is_bare_identifier(key) else format_string(key)
    if value is None:   # an absent optional argument: MLIR's unit attribute, the bare name
        return name
    return f"{name} = {format_attr(value)}"


def _is_bare_identifier(text: str) -> bool:
    """MLIR bare-id: a letter or '_' then letters, digits, '_', '$', '.'."""
    if not text or not (text[0].isascii() and (text[0].isalpha() or text[0] == "_")):
        return False
    return all(c.isascii() and (c.isalnum() or c in "_$.") for c in text)


def format_location(loc: Location | None) -> str:
    """`loc("file":line:col)`, `loc("phase:source"("file":line:col))` for an op derived
    from another (an MLIR name location), or `loc(unknown)` for None."""
    if loc is None:
        return "loc(unknown)"
    where = f"{format_string(loc.file)}:{loc.line}:{loc.col}"
    return f"loc({where})" if loc.label is None else f"loc({format_string(loc.label)}({where}))"


def format_string(text: str) -> str:
    """An MLIR string literal: `\\"` and `\\\\` escaped, other non-printables as `\\XX` bytes."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append(f"\\{byte:02X}")
    return '"' + "".join(out) + '"'


def format_attr(value: Any) -> str:
    """The MLIR text of one attribute value (bool, int, float, str, tuple of ints or floats
    (ints may be absent: None), DType, ndarray)."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return f"{_checked_int64(int(value))} : i64"
    if isinstance(value, (float, np.floating)):
        return f"{format_float(float(value))} : f64"
    if isinstance(value, str):
        return format_string(value)
    if isinstance(value, tuple) and value and all(isinstance(v, (float, np.floating)) for v in value):
        return "array<f64: " + ", ".join(format_float(float(v)) for v in value) + ">"
    if isinstance(value, tuple) and any(isinstance(d, Dim) or d is None for d in value):
        # MLIR's generic array; an absent entry (int?[]: None) is the unit attribute
        return "[" + ", ".join("unit" if d is None else format_attr(d) for d in value) + "]"
    if isinstance(value, tuple):
        return _format_int_array(value)
    if isinstance(value, DType):
        return value.mlir
    if isinstance(value, np.ndarray):
        return format_dense(value)
    if isinstance(value, Dim):                 # a dynamic size (symbolic.py), e.g. x.shape[0]
        return f'#tc.size<{format_string(str(value))}>'
    raise IRError(f"cannot print attribute value {value!r} of type {type(value).__name__} "
                  "(expected bool, int, float, str, tuple of ints, DType or ndarray)")


def _checked_int64(n: int) -> int:
    if not _INT64_MIN <= n <= _INT64_MAX:
        raise IRError(f"integer attribute {n} does not fit in i64")
    return n


def _format_int_array(values: tuple) -> str:
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
               for v in values):
        raise IRError(f"tuple attribute {values!r} must hold only ints")
    if not values:
        return "array<i64>"
    return "array<i64: " + ", ".join(str(_checked_int64(int(v))) for v in values) + ">"


def format_float(x: float) -> str:
    """An MLIR float literal: always a '.' before any exponent; non-finite as f64 hex bits."""
    if not math.isfinite(x):
        return "0x" + struct.pack(">d", x).hex().upper()
    return _with_dot(repr(x))


def _with_dot(text: str) -> str:
    mantissa, e, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + e + exponent


def format_dense(array: np.ndarray) -> str:
    """`dense<...> : tensor<...>`: literal lists for small arrays, else hex of LE bytes."""
    if array.dtype not in _NUMPY_TO_MLIR:
        raise IRError(f"cannot print a constant of dtype {array.dtype} "
                      f"(expected one of {', '.join(DType.__members__)})")
    dims = "".join(f"{d}x" for d in array.shape)
    type_text = f"tensor<{dims}{_NUMPY_TO_MLIR[array.dtype]}>"
    return f"dense<{_dense_body(array)}> : {type_text}"


def _dense_body(array: np.ndarray) -> str:
    if array.size == 0:
        return ""
    if array.dtype.itemsize == 2:       # bfloat16, float16: their bits (exact, and NumPy has no bf16 text)
        return '"0x' + array.view(np.uint16).astype("<u2").tobytes().hex().upper() + '"'
    is_float = array.dtype.kind == "f"
    non_finite = is_float and not np.isfinite(array).all()
    if array.dtype.kind != "b" and (array.size > DENSE_LITERAL_LIMIT or non_finite):
        little = array.astype(array.dtype.newbyteorder("<"), copy=False)
        return '"0x' + little.tobytes().hex().upper() + '"'
    if array.ndim == 0:
        return _dense_element(array[()])
    return _nested_list(array)


def _nested_list(array: np.ndarray) -> str:
    if array.ndim == 1:
        return "[" + ", ".join(_dense_element(x) for x in array) + "]"
    return "[" + ", ".join(_nested_list(sub) for sub in array) + "]"


def _dense_element(x: np.generic) -> str:
    if isinstance(x, np.bool_):
        return "true" if x else "false"
    if isinstance(x, np.integer):
        return str(int(x))
    if isinstance(x, np.float32):
        short = _with_dot(str(x))   # shortest text that reads back as this float32
        return short if np.float32(float(short)) == x else _with_dot(repr(float(x)))
    return format_float(float(x))
