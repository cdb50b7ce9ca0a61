"""Tokenizer for the IR text: MLIR generic-op syntax, as ir/printer.py writes it.

Tokens carry their kind, text, decoded value and offset; errors are IRErrors located by
line and column with the offending source line and a caret.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from ..core.errors import IRError

_PUNCT = ("->", "(", ")", "{", "}", "[", "]", "<", ">", ",", ":", "=", "-", "#")
_ID_CHARS = "_$."
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t"}
# Token classes are ASCII only: str.isdigit/isalpha also accept '²' or 'é', which would
# start a rule whose ASCII-only body then consumes nothing (an endless loop) or int() rejects.
_DIGITS = frozenset("0123456789")


def _is_digit(char: str) -> bool:
    return char in _DIGITS


def _is_id_start(char: str) -> bool:
    return char.isascii() and (char.isalpha() or char == "_")


def located_error(filename: str, lines: list[str], line: int, col: int, message: str) -> IRError:
    source = lines[line - 1] if 0 < line <= len(lines) else ""
    err = IRError(f"{filename}: line {line}, column {col}: {message}\n"
                  f"  {source}\n  {' ' * (col - 1)}^")
    err.line, err.col = line, col
    return err


@dataclass(frozen=True)
class Token:
    kind: str     # punct, id, value (%x), symbol (@x), block (^x), int, float, string, type, eof
    text: str     # as written, for messages
    value: Any    # decoded: name, number, string contents, or tensor<...> body
    line: int
    col: int


class Lexer:
    """Splits the text into tokens; `tensor<...>` is one token because `4x8xf32` is."""

    def __init__(self, text: str, filename: str, lines: list[str]):
        self.text, self.filename, self.lines, self.pos = text, filename, lines, 0
        self.line_starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]

    def where(self, pos: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.line_starts, pos)
        return line, pos - self.line_starts[line - 1] + 1

    def error(self, pos: int, message: str) -> IRError:
        return located_error(self.filename, self.lines, *self.where(pos), message)

    def tokenize(self) -> list[Token]:
        tokens = []
        while not tokens or tokens[-1].kind != "eof":
            self.skip_blanks()
            tokens.append(self.next_token())
        return tokens

    def skip_blanks(self) -> None:
        text = self.text
        while self.pos < len(text):
            if text[self.pos].isspace():
                self.pos += 1
            elif text.startswith("//", self.pos):
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end
            else:
                return

    def token(self, kind: str, start: int, value: Any = None) -> Token:
        text = self.text[start:self.pos]
        return Token(kind, text, text if value is None else value, *self.where(start))

    def next_token(self) -> Token:
        start, text = self.pos, self.text
        if start >= len(text):
            return self.token("eof", start, "")
        char = text[start]
        if char == '"':
            return self.token("string", start, self.string_body())
        if char in "%@^":
            return self.sigil_name(char)
        if _is_digit(char):
            return self.number()
        if _is_id_start(char):
            return self.identifier()
        for punct in _PUNCT:
            if text.startswith(punct, start):
                self.pos += len(punct)
                return self.token("punct", start)
        raise self.error(start, f"unexpected character {char!r}")

    def take_while(self, accept) -> str:
        start = self.pos
        while self.pos < len(self.text) and accept(self.text[self.pos]):
            self.pos += 1
        return self.text[start:self.pos]

    def string_body(self) -> str:
        start, out = self.pos, bytearray()
        self.pos += 1
        while self.pos < len(self.text) and self.text[self.pos] not in '"\n':
            if self.text[self.pos] == "\\":
                out += self.escape()
            else:
                out += self.text[self.pos].encode("utf-8")
                self.pos += 1
        if self.pos >= len(self.text) or self.text[self.pos] != '"':
            raise self.error(start, "unterminated string (expected '\"' before end of line)")
        self.pos += 1
        try:
            return out.decode("utf-8")
        except UnicodeDecodeError:
            raise self.error(start, "string escapes do not form valid UTF-8") from None

    def escape(self) -> bytes:
        pair = self.text[self.pos + 1:self.pos + 3]
        if pair[:1] in _SIMPLE_ESCAPES:
            self.pos += 2
            return _SIMPLE_ESCAPES[pair[:1]].encode()
        if len(pair) == 2 and all(c in "0123456789abcdefABCDEF" for c in pair):
            self.pos += 3
            return bytes([int(pair, 16)])
        raise self.error(self.pos, f"expected an escape (\\\", \\\\, \\n, \\t or two hex digits) "
                                   f"after '\\', found {pair[:1]!r}")

    def sigil_name(self, sigil: str) -> Token:
        start = self.pos
        self.pos += 1
        kind = {"%": "value", "@": "symbol", "^": "block"}[sigil]
        if sigil == "@" and self.text.startswith('"', self.pos):
            return self.token(kind, start, self.string_body())
        name = self.take_while(lambda c: c.isascii() and (c.isalnum() or c in _ID_CHARS + "-"))
        if not name:
            raise self.error(start, f"expected a {kind} name after '{sigil}'")
        return self.token(kind, start, name)

    def number(self) -> Token:
        start = self.pos
        if self.text.startswith(("0x", "0X"), start):
            self.pos += 2
            digits = self.take_while(lambda c: c in "0123456789abcdefABCDEF")
            if not digits:
                raise self.error(start, "expected hex digits after '0x'")
            return self.token("int", start, int(digits, 16))
        self.take_while(_is_digit)
        if not self.text.startswith(".", self.pos):
            return self.token("int", start, int(self.text[start:self.pos]))
        self.pos += 1
        self.take_while(_is_digit)
        if self.text[self.pos:self.pos + 1] in ("e", "E"):
            self.pos += 1
            if self.text[self.pos:self.pos + 1] in ("+", "-"):
                self.pos += 1
            if not self.take_while(_is_digit):
                raise self.error(self.pos, "expected exponent digits in float literal")
        return self.token("float", start, float(self.text[start:self.pos]))

    def identifier(self) -> Token:
        start = self.pos
        name = self.take_while(lambda c: c.isascii() and (c.isalnum() or c in _ID_CHARS))
        if name != "tensor" or not self.text.startswith("<", self.pos):
            return self.token("id", start)
        end = self.text.find(">", self.pos)
        newline = self.text.find("\n", self.pos)
        if end < 0 or 0 <= newline < end:
            raise self.error(start, "unterminated tensor type (expected '>')")
        body = self.text[self.pos + 1:end]
        self.pos = end + 1
        return self.token("type", start, body)
