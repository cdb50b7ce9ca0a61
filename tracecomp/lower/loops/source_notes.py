"""Source notes: which of the user's lines each kernel computes, as comments in every dump.

`source_notes(program)` turns Program.kernel_ops into one line per source location and
kernel, `mlp.py:18: tc.matmul tc.add tc.relu` (ops without a location are listed under
`<unknown>`).  LLVM has no comment API in llvmlite and its printer drops comments anyway,
so the notes are inserted into the printed text: `annotate(text, notes, comment)` puts
them, as comment lines, right before the first line that declares each kernel's symbol
(`define ... @name(` in LLVM IR, `.globl name` or `name:` in assembly, `func.func @name(`
in the loop IR's MLIR).  Text that declares no kernel is returned unchanged.
"""
from __future__ import annotations

import re

from ...ir import Op


def op_notes(ops: list[Op]) -> list[str]:
    """`file:line: tc.a tc.b` per source location, in order of first appearance."""
    by_loc: dict[str, list[str]] = {}
    for op in ops:
        names = by_loc.setdefault(str(op.loc) if op.loc is not None else "<unknown>", [])
        if op.name not in names:
            names.append(op.name)
    return [f"{where}: {' '.join(names)}" for where, names in by_loc.items()]


def source_notes(program) -> dict[str, list[str]]:
    """Kernel name -> its note lines (see op_notes)."""
    return {name: op_notes(ops) for name, ops in program.kernel_ops.items()}


_DECLARES = re.compile(r"^\s*(?:define\b.*@|func\.func @|\.globl\s+)?([\w.$]+)(?:\(|:|\s*$)")


def annotate(text: str, notes: dict[str, list[str]], comment: str) -> str:
    """`text` with each kernel's notes as `comment`-prefixed lines before its declaration."""
    if not notes:
        return text
    # any symbol, then a lookup: an alternation of every kernel's name made each line cost
    # as many tries as there are kernels (quadratic: 70 s for an unrolled loop's 6,000)
    lines, done = [], set()
    for line in text.splitlines(keepends=True):
        m = _DECLARES.match(line)
        if m and m.group(1) in notes and m.group(1) not in done:
            done.add(m.group(1))
            indent = line[:len(line) - len(line.lstrip())]
            lines += [f"{indent}{comment} {note}\n" for note in notes[m.group(1)]]
        lines.append(line)
    return "".join(lines)
