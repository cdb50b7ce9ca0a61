"""Parse the MLIR generic-op text that ir/printer.py writes back into a Graph.

A hand-written tokenizer (`Lexer`) feeds a recursive-descent parser (`_Parser`) with
one method per construct: func, op, attribute, dense constant, type, location.
Invariants:
- the text holds one `func.func` (optionally inside `module { ... }`); SSA names may be
  anything (`%x`, `%0`, `%arg3`); the graph is built with Graph.add_input/add_op in text
  order, and attributes keep their text order;
- no op table is consulted: checking op names and attrs is the verifier's job; here
  only the text's own consistency is checked (defined-before-use, no redefinition,
  result and operand counts and types agree with the op's function type);
- an op's regions (`({ ... }, { ... })` between its operands and attributes) each hold
  one block: its label names the region Graph (printer.block_label), its arguments are
  the Graph's inputs, and it ends with `"tc.yield"(values)`, which become the Graph's
  outputs.  Names follow MLIR's scoping for ops that are not isolated: a region sees the
  names defined before it (isolation is the verifier's to check, so a graph that breaks
  it can still be read and reported), its own names end with it, and an op's results
  are defined after its regions;
- every malformed input raises IRError whose message starts with
  `<file>: line L, column C:` and says what was expected and what was found; the error
  also carries `.line` and `.col`;
- hostile text is bounded: dense lists and regions nest at most MAX_NESTING deep, a constant holds at
  most MAX_CONSTANT_ELEMENTS elements, a shape's size fits int64.
"""
from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from ..core.dtypes import DType, from_mlir
from ..core.errors import DTypeError, IRError
from .graph import Graph, Value
from .lexer import Lexer, Token, located_error
from .printer import YIELD
from ..core.types import TensorType
from ..core.locations import Location, parse_label

_DTYPE_NAMES = {d.mlir for d in DType}
# Limits on hostile text: nesting deeper than this would exhaust Python's stack, and a
# short `dense<0> : tensor<...>` could otherwise ask for any amount of memory.
MAX_NESTING = 64
MAX_CONSTANT_ELEMENTS = 1 << 26


def parse_graph(text: str, filename: str = "<ir>") -> Graph:
    """The Graph written in `text`; raises IRError (with line and column) if malformed."""
    lines = text.splitlines()
    tokens = Lexer(text, filename, lines).tokenize()
    return _Parser(tokens, filename, lines).parse()


class _Parser:
    """Recursive descent over the tokens, building the Graph as it goes."""

    def __init__(self, tokens: list[Token], filename: str, lines: list[str]):
        self.tokens, self.filename, self.lines, self.pos = tokens, filename, lines, 0
        self.graph = Graph()          # the graph ops go into: the function's, or a region's
        self.values: dict[str, tuple[list[Value], Token]] = {}   # name -> results, definition
        self.scopes: list[list[str]] = []     # per open region, the names it defined
        self.result_types: list[tuple[TensorType, Token]] = []     # the func's declared results

    # -- token helpers ---------------------------------------------------------------
    def peek(self) -> Token:
        return self.tokens[self.pos]

    def advance(self) -> Token:
        token = self.tokens[self.pos]
        self.pos += token.kind != "eof"
        return token

    def at(self, text: str) -> bool:
        token = self.peek()
        return token.kind in ("punct", "id") and token.text == text

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.advance()
            return True
        return False

    def expect(self, text: str, context: str) -> Token:
        if not self.at(text):
            raise self.error(self.peek(), f"expected '{text}' {context}, found {_describe(self.peek())}")
        return self.advance()

    def expect_kind(self, kind: str, what: str, context: str) -> Token:
        if self.peek().kind != kind:
            raise self.error(self.peek(), f"expected {what} {context}, found {_describe(self.peek())}")
        return self.advance()

    def error(self, token: Token, message: str, offset: int = 0) -> IRError:
        return located_error(self.filename, self.lines, token.line, token.col + offset, message)

    def comma_list(self, parse_item, close: str | None = None) -> list:
        """Items separated by ','; empty only if the token `close` comes first."""
        items = [] if close is not None and self.at(close) else [parse_item()]
        while self.accept(","):
            items.append(parse_item())
        return items

    # -- function ----------------------------------------------------------------------
    def parse(self) -> Graph:
        in_module = self.accept("module")
        if in_module:
            self.expect("{", "after 'module'")
        self.parse_func()
        if in_module:
            self.expect("}", "to close the module")
        self.expect_kind("eof", "end of input", "after the function")
        return self.graph

    def parse_func(self) -> None:
        self.expect("func.func", "to start the function")
        self.graph.name = self.expect_kind("symbol", "a function name like '@main'", "after 'func.func'").value
        self.expect("(", "before the function arguments")
        self.comma_list(self.parse_argument, ")")
        self.expect(")", "after the function arguments")
        self.result_types = self.parse_func_results() if self.accept("->") else []
        self.expect("{", "to open the function body")
        while not self.at("return"):
            self.parse_op()
        self.parse_return()
        self.expect("}", "after 'return' to close the function body")

    def parse_argument(self) -> None:
        name = self.expect_kind("value", "an argument name like '%arg0'", "in the argument list")
        self.expect(":", "after the argument name")
        self.define(name, [self.graph.add_input(self.parse_type()[0])])

    def parse_func_results(self) -> list[tuple[TensorType, Token]]:
        if not self.accept("("):
            return [self.parse_type()]
        types = self.comma_list(self.parse_type, ")")
        self.expect(")", "after the function result types")
        return types

    def parse_return(self) -> None:
        keyword = self.advance()
        values = []
        if self.peek().kind == "value":
            values = self.comma_list(self.parse_use)
            self.expect(":", "after the returned values")
            types = self.comma_list(self.parse_type)
            if len(types) != len(values):
                raise self.error(keyword, f"'return' has {len(values)} values but "
                                          f"{len(types)} types")
            self.check_types(values, types)
        if len(values) != len(self.result_types):
            raise self.error(keyword, f"'return' has {len(values)} values but the function "
                                      f"declares {len(self.result_types)} results")
        for i, ((value, name), (type, _)) in enumerate(zip(values, self.result_types)):
            if value.type != type:
                raise self.error(name, f"returned value {i} ('{name.text}') has type "
                                       f"{value.type} but the function declares {type}")
        self.graph.outputs = [v for v, _ in values]

    # -- values --------------------------------------------------------------------------
    def define(self, name: Token, values: list[Value]) -> None:
        if name.value in self.values:
            first = self.values[name.value][1]
            raise self.error(name, f"redefinition of value '{name.text}' "
                                   f"(first defined at line {first.line}, column {first.col})")
        self.values[name.value] = (values, name)
        if self.scopes:
            self.scopes[-1].append(name.value)

    def parse_use(self) -> tuple[Value, Token]:
        name = self.expect_kind("value", "a value like '%0'", "as an operand")
        if name.value not in self.values:
            raise self.error(name, f"use of undefined value '{name.text}'")
        group = self.values[name.value][0]
        if not self.accept("#"):
            if len(group) != 1:
                raise self.error(name, f"'{name.text}' names {len(group)} results; "
                                       f"pick one with '{name.text}#0'")
            return group[0], name
        index = self.expect_kind("int", "a result number", f"after '{name.text}#'")
        if index.value >= len(group):
            raise self.error(index, f"'{name.text}' has {len(group)} results, "
                                    f"so '#{index.value}' is out of range")
        return group[index.value], name

    def check_types(self, values: list, types: list) -> None:
        for i, ((value, _), (type, token)) in enumerate(zip(values, types)):
            if value.type != type:
                raise self.error(token, f"operand {i} has type {value.type} "
                                        f"but the type list says {type}")

    # -- ops -----------------------------------------------------------------------------
    def parse_op(self) -> None:
        groups = []
        if self.peek().kind == "value":
            groups = self.comma_list(self.parse_result_group)
            self.expect("=", "after the result names")
        name = self.expect_kind("string", "an op name like \"tc.add\" or 'return'",
                                "to start an operation")
        self.expect("(", "after the op name")
        operands = self.comma_list(self.parse_use, ")")
        self.expect(")", "after operand list")
        regions = self.parse_regions() if self.at("(") else []
        attrs = self.parse_attr_dict() if self.at("{") else {}
        context = "after attributes" if attrs else "after the regions" if regions else "after operand list"
        self.expect(":", context)
        operand_types, arrow, result_types = self.parse_function_type()
        self.check_counts(name, operands, operand_types, groups, result_types, arrow)
        self.check_types(operands, operand_types)
        loc = self.parse_location() if self.at("loc") else None
        op = self.graph.add_op(name.value, [v for v, _ in operands], attrs,
                               [t for t, _ in result_types], loc, regions)
        self.define_results(groups, op.results)

    # -- regions -------------------------------------------------------------------------
    def parse_regions(self) -> list[Graph]:
        self.advance()
        regions = self.comma_list(self.parse_region)
        self.expect(")", "after the regions")
        return regions

    def parse_region(self) -> Graph:
        """`{ ^label(args): ops... "tc.yield"(values) : (types) -> () }` as a Graph."""
        brace = self.expect("{", "to open a region")
        if len(self.scopes) >= MAX_NESTING:
            raise self.error(brace, f"regions nested deeper than {MAX_NESTING} (MAX_NESTING)")
        outer, self.graph = self.graph, Graph("bb0")   # an unlabelled block: MLIR's first name
        self.scopes.append([])
        if self.peek().kind == "block":
            self.graph.name = _block_name(self.advance().value)
            if self.accept("("):
                self.comma_list(self.parse_argument, ")")
                self.expect(")", "after the block arguments")
            self.expect(":", "after the block label")
        while not (self.peek().kind == "string" and self.peek().value == YIELD):
            token = self.peek()
            if self.at("}") or token.kind == "eof":
                raise self.error(token, f"the region ends without its terminator "
                                        f"'\"{YIELD}\"(values) : (types) -> ()'")
            if token.kind == "block":
                raise self.error(token, "a region holds one block: expected an op or "
                                        f"'\"{YIELD}\"', found a block label")
            self.parse_op()
        self.parse_yield()
        self.expect("}", f"after '\"{YIELD}\"' to close the region")
        for name in self.scopes.pop():     # a region's names are not visible after it
            del self.values[name]
        region, self.graph = self.graph, outer
        return region

    def parse_yield(self) -> None:
        """The region's terminator: its operands are the region's outputs."""
        name = self.advance()
        self.expect("(", "after the op name")
        operands = self.comma_list(self.parse_use, ")")
        self.expect(")", "after operand list")
        self.expect(":", f"after the operands of '\"{YIELD}\"' (it takes no attributes)")
        operand_types, arrow, result_types = self.parse_function_type()
        self.check_counts(name, operands, operand_types, [], result_types, arrow)
        self.check_types(operands, operand_types)
        if self.at("loc"):
            self.parse_location()      # the Graph keeps no location for its outputs
        self.graph.outputs = [v for v, _ in operands]

    def parse_result_group(self) -> tuple[Token, int]:
        name = self.expect_kind("value", "a result name like '%0'", "before '='")
        if not self.accept(":"):
            return name, 1
        count = self.expect_kind("int", "a result count", f"after '{name.text}:'")
        return name, count.value

    def define_results(self, groups: list[tuple[Token, int]], results: list[Value]) -> None:
        start = 0
        for name, count in groups:
            self.define(name, results[start:start + count])
            start += count

    def parse_function_type(self):
        self.expect("(", "to open the operand types")
        operand_types = self.comma_list(self.parse_type, ")")
        self.expect(")", "after the operand types")
        arrow = self.expect("->", "after the operand types")
        if not self.accept("("):
            return operand_types, arrow, [self.parse_type()]
        result_types = self.comma_list(self.parse_type, ")")
        self.expect(")", "after the result types")
        return operand_types, arrow, result_types

    def check_counts(self, name, operands, operand_types, groups, result_types, arrow) -> None:
        if len(operands) != len(operand_types):
            raise self.error(name, f"op {name.text} has {len(operands)} operands but "
                                   f"{len(operand_types)} operand types")
        defined = sum(count for _, count in groups)
        if defined != len(result_types):
            where = groups[0][0] if groups else arrow
            raise self.error(where, f"op {name.text} defines {defined} result values but "
                                    f"its type has {len(result_types)} result types")

    # -- types and locations ----------------------------------------------------------
    def parse_type(self) -> tuple[TensorType, Token]:
        token = self.expect_kind("type", "a tensor type like 'tensor<4xf32>'", "here")
        body, offset, shape = token.value, 0, []
        while offset < len(body) and body[offset] in "0123456789?*":
            end = body.find("x", offset)
            dim = body[offset:end] if end >= 0 else body[offset:]
            column = len("tensor<") + offset
            if dim in ("?", "*"):
                problem = "dynamic dimensions" if dim == "?" else "unranked tensors"
                raise self.error(token, f"{problem} are not supported", column)
            if not (dim.isascii() and dim.isdigit()) or end < 0:
                raise self.error(token, f"expected 'x' and an element type after dimension "
                                        f"'{dim}'", column)
            shape.append(int(dim))
            if math.prod(shape) >= 1 << 63 or shape[-1] >= 1 << 63:
                raise self.error(token, f"dimension '{dim}' makes the shape's size overflow "
                                        f"int64", column)
            offset = end + 1
        try:
            return TensorType(tuple(shape), from_mlir(body[offset:])), token
        except DTypeError as err:
            raise self.error(token, str(err), len("tensor<") + offset) from None

    def parse_location(self) -> Location | None:
        self.advance()
        self.expect("(", "after 'loc'")
        if self.accept("unknown"):
            self.expect(")", "after 'unknown'")
            return None
        first = self.expect_kind("string", "a file name string or 'unknown'", "in 'loc('")
        if self.accept("("):                      # a name location: the op's origin
            try:
                phase, source = parse_label(first.value)
            except ValueError as e:
                raise self.error(first, str(e)) from None
            inner = self.expect_kind("string", "a file name string", "in the origin's location")
            location = self._file_line_col(inner)
            self.expect(")", "to close the location")
            return Location(location.file, location.line, location.col, phase, source)
        return self._file_line_col(first)

    def _file_line_col(self, file: Token) -> Location:
        """The rest of `"file":line:col)` after the file name."""
        self.expect(":", "after the location's file name")
        line = self.expect_kind("int", "a line number", "in the location")
        self.expect(":", "after the location's line number")
        col = self.expect_kind("int", "a column number", "in the location")
        self.expect(")", "to close the location")
        return Location(file.value, line.value, col.value)

    # -- attributes ------------------------------------------------------------------------
    def parse_attr_dict(self) -> dict[str, Any]:
        self.advance()
        attrs: dict[str, Any] = {}
        for key, value in self.comma_list(self.parse_attr_entry, "}"):
            if key.value in attrs:
                raise self.error(key, f"duplicate attribute '{key.value}'")
            attrs[key.value] = value
        self.expect("}", "after the attributes")
        return attrs

    def parse_attr_entry(self) -> tuple[Token, Any]:
        key = self.peek()
        if key.kind not in ("id", "string") or (key.kind == "string" and not key.value):
            raise self.error(key, f"expected an attribute name, found {_describe(key)}")
        self.advance()
        if self.at(",") or self.at("}"):    # a unit attribute: an absent optional argument
            return key, None
        self.expect("=", f"after attribute name '{key.value}'")
        return key, self.parse_attr_value()

    def parse_attr_value(self) -> Any:
        token = self.peek()
        if token.kind == "string":
            return self.advance().value
        if token.kind in ("int", "float") or self.at("-"):
            return self.parse_scalar_attr()
        if token.kind == "id" and token.text in ("true", "false"):
            return self.advance().text == "true"
        if token.kind == "id" and token.text in _DTYPE_NAMES:
            return from_mlir(self.advance().text)
        if self.at("array"):
            return self.parse_array()
        if self.at("["):
            return self.parse_attr_list()
        if self.at("dense"):
            return self.parse_dense()
        raise self.error(token, f"expected an attribute value, found {_describe(token)}")

    def parse_number(self) -> tuple[int | float, Token]:
        """An int or float literal with an optional leading '-'."""
        negative = self.accept("-")
        token = self.peek()
        if token.kind not in ("int", "float"):
            raise self.error(token, f"expected a number, found {_describe(token)}")
        self.advance()
        return (-token.value if negative else token.value), token

    def parse_scalar_attr(self) -> int | float:
        value, token = self.parse_number()
        if not self.accept(":"):
            return value
        type = self.expect_kind("id", "'i64' or 'f64'", "after ':' in a number attribute")
        if type.text == "f64" and token.text.lower().startswith("0x"):
            return _float_from_bits(self, token, value)
        if type.text == "f64":
            return float(value)
        if type.text != "i64" or isinstance(value, float):
            raise self.error(type, f"expected 'i64' after an integer or 'f64' after a float, "
                                   f"found '{type.text}'")
        return _checked_int64(self, token, value)

    def parse_array(self) -> tuple:
        """array<i64: ...> (ints) or array<f64: ...> (floats)."""
        self.advance()
        self.expect("<", "after 'array'")
        floats = self.accept("f64")
        if not floats:
            self.expect("i64", "as the element type of an array attribute ('i64' or 'f64')")
        values: list = []
        if self.accept(":"):
            values = self.comma_list(self.parse_array_float if floats else self.parse_array_int, ">")
        self.expect(">", "to close the array attribute")
        return tuple(values)

    def parse_array_float(self) -> float:
        value, token = self.parse_number()
        if token.text.lower().startswith("0x"):
            return _float_from_bits(self, token, value)
        return float(value)

    def parse_attr_list(self) -> tuple:
        """[a, b, ...]: a generic array, whose `unit` entries are absent values (None)."""
        self.advance()
        values = self.comma_list(lambda: None if self.accept("unit") else self.parse_attr_value(), "]")
        self.expect("]", "to close the array attribute")
        return tuple(values)

    def parse_array_int(self) -> int:
        value, token = self.parse_number()
        if isinstance(value, float):
            raise self.error(token, f"expected an integer in array<i64: ...>, found '{token.text}'")
        return _checked_int64(self, token, value)

    # -- dense constants -------------------------------------------------------------------
    def parse_dense(self) -> np.ndarray:
        keyword = self.advance()
        self.expect("<", "after 'dense'")
        body = self.peek()
        if body.kind == "string":
            content: Any = self.advance()
        elif self.at(">"):
            content = None   # `dense<>`: an empty constant
        else:
            content = self.parse_dense_literal()
        self.expect(">", "to close the dense constant")
        self.expect(":", "after 'dense<...>' (a constant needs its tensor type)")
        type, type_token = self.parse_type()
        if type.numel > MAX_CONSTANT_ELEMENTS:
            raise self.error(type_token, f"constant of {type.numel} elements exceeds the limit "
                                         f"of {MAX_CONSTANT_ELEMENTS} (MAX_CONSTANT_ELEMENTS)")
        if isinstance(content, Token):
            return _dense_from_hex(self, content, type)
        if content is None:
            if type.numel:
                raise self.error(keyword, f"'dense<>' is empty but {type} has {type.numel} elements")
            return np.zeros(type.shape, type.dtype.np)
        return _dense_from_literal(self, keyword, content, type)

    def parse_dense_literal(self, depth: int = 0) -> Any:
        """A nested list of numbers/bools, or one scalar (a splat)."""
        if self.at("[") and depth >= MAX_NESTING:
            raise self.error(self.peek(), f"dense constant nested deeper than {MAX_NESTING} "
                                          f"lists (MAX_NESTING)")
        if self.accept("["):
            items = self.comma_list(lambda: self.parse_dense_literal(depth + 1), "]")
            self.expect("]", "to close the list in a dense constant")
            return items
        if self.at("true") or self.at("false"):
            return self.advance().text == "true"
        return self.parse_number()[0]


def _dense_from_hex(parser: _Parser, token: Token, type: TensorType) -> np.ndarray:
    text, np_type = token.value, type.dtype.np
    digits = text[2:] if text.lower().startswith("0x") else None
    try:
        data = bytes.fromhex(digits) if digits is not None and len(digits) % 2 == 0 else None
    except ValueError:
        data = None
    if data is None:
        raise parser.error(token, f"expected a hex string like \"0x0000803F\" in dense<...>, "
                                  f"found '{token.text}'")
    if len(data) not in (type.numel * np_type.itemsize, np_type.itemsize):
        raise parser.error(token, f"hex constant has {len(data)} bytes but {type} needs "
                                  f"{type.numel * np_type.itemsize}")
    if np_type.itemsize == 2:           # bfloat16, float16: little-endian bits
        array = np.frombuffer(data, "<u2").astype(np.uint16).view(np_type)
    else:
        array = np.frombuffer(data, np_type.newbyteorder("<") if np_type.kind != "b" else np.uint8).astype(np_type)
    return np.full(type.shape, array[0]) if len(array) != type.numel else array.reshape(type.shape)


def _dense_from_literal(parser: _Parser, keyword: Token, content: Any, type: TensorType) -> np.ndarray:
    kind = "f" if type.dtype.is_floating_point else type.dtype.np.kind
    for leaf in _leaves(content):
        is_bool = isinstance(leaf, bool)
        if (kind == "b") != is_bool or (kind == "f" and not isinstance(leaf, float)):
            want = {"b": "true/false", "i": "integers", "f": "floats with a '.'"}[kind]
            raise parser.error(keyword, f"elements of a {type} constant must be {want}, "
                                        f"found {str(leaf).lower() if is_bool else leaf!r}")
    try:
        array = np.array(content, dtype=type.dtype.np)
    except (ValueError, OverflowError) as err:
        raise parser.error(keyword, f"bad dense constant for {type}: {err}") from None
    if not isinstance(content, list):
        return np.full(type.shape, array, dtype=type.dtype.np)
    if array.shape != type.shape:
        raise parser.error(keyword, f"dense literal has shape {array.shape} but the type is {type}")
    if kind == "f" and not np.isfinite(array.astype(np.float64)).all():
        raise parser.error(keyword, f"a literal in this constant does not fit {type.dtype.mlir}")
    return array


def _leaves(content: Any):
    if isinstance(content, list):
        for item in content:
            yield from _leaves(item)
    else:
        yield content


def _checked_int64(parser: _Parser, token: Token, value: int) -> int:
    if not -2**63 <= value < 2**63:
        raise parser.error(token, f"integer {value} does not fit in i64")
    return value


def _float_from_bits(parser: _Parser, token: Token, bits: int) -> float:
    if not 0 <= bits < 2**64:
        raise parser.error(token, f"hex float {token.text} does not fit in 64 bits")
    return struct.unpack(">d", bits.to_bytes(8, "big"))[0]


def _block_name(label: str) -> str:
    """The region name printer.block_label wrote as `label` (`$XX` bytes decoded); a label
    written otherwise is the name as it stands."""
    if label == "$":
        return ""
    data, i = bytearray(), 0
    while i < len(label):
        pair = label[i + 1:i + 3]
        if label[i] == "$" and len(pair) == 2 and all(c in "0123456789ABCDEF" for c in pair):
            data.append(int(pair, 16))
            i += 3
        else:
            data += label[i].encode()
            i += 1
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return label


def _describe(token: Token) -> str:
    return "end of input" if token.kind == "eof" else repr(token.text)
