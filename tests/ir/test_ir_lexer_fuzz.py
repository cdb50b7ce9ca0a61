"""Hostile text for the IR lexer/parser: only IRError (with line and column) or success."""
import subprocess
import sys

from hypothesis import given, settings, strategies as st

from tracecomp.core.errors import IRError
from tracecomp.ir.parser import parse_graph


def test_non_ascii_letter_is_an_error_not_a_hang():
    # Used to loop forever growing memory: the lexer emitted an empty token without advancing.
    code = ("from tracecomp.ir.parser import parse_graph\n"
            "from tracecomp.core.errors import IRError\n"
            "for t in ['é', 'x²', '1²', '%a = é']:\n"
            "    try: parse_graph(t)\n"
            "    except IRError as e: assert e.line >= 1 and e.col >= 1\n"
            "    else: raise SystemExit('no error for ' + repr(t))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


def _parse_or_located_error(text: str) -> None:
    try:
        parse_graph(text)
    except IRError as err:
        assert err.line >= 1 and err.col >= 1


@settings(max_examples=200, deadline=2000)
@given(st.text(max_size=40))
def test_arbitrary_unicode_text(text):
    _parse_or_located_error(text)


def _const(value: str, type: str) -> str:
    return ('func.func @f() -> ' + type + ' {\n  %0 = "tc.constant"() {value = dense<' + value
            + '> : ' + type + '} : () -> ' + type + '\n  "func.return"(%0) : (' + type
            + ') -> ()\n}\n')


def _located(text: str) -> IRError:
    try:
        parse_graph(text)
    except IRError as err:
        assert err.line >= 1 and err.col >= 1
        return err
    raise AssertionError("no IRError")


def test_deep_nesting_is_an_error_not_recursion():
    err = _located(_const("[" * 5000 + "1" + "]" * 5000, "tensor<1xf32>"))
    assert "MAX_NESTING" in str(err)


def test_huge_constant_is_refused_before_allocation():
    err = _located(_const("0", "tensor<65536x65536x4xf32>"))
    assert "MAX_CONSTANT_ELEMENTS" in str(err)


def test_superscript_digit_in_shape():
    _located("func.func @f(%a: tensor<2²xf32>) {}")


def test_oversized_dimension():
    big = "tensor<99999999999999999999x0xf32>"
    err = _located(_const("", big))
    assert "overflow int64" in str(err)


def _real_dump() -> str:
    import numpy as np
    import tracecomp as tc
    x = np.ones((4, 3), np.float32)
    return tc.trace(lambda a: (a * 2 + 1).tanh().sum(dim=1)).lower(x).as_text("graph")


_DUMP = _real_dump()


@settings(max_examples=200, deadline=2000)
@given(st.lists(st.tuples(st.integers(0, len(_DUMP)), st.integers(0, 3), st.text(max_size=3)),
                max_size=4))
def test_random_edits_of_a_real_dump(edits):
    text = _DUMP
    for pos, cut, insert in edits:
        pos = min(pos, len(text))
        text = text[:pos] + insert + text[pos + cut:]
    _parse_or_located_error(text)
