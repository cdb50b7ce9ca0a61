"""Rewrite README.md's table of operators from ops.yaml (`tracecomp ops --markdown`).

Run after adding or changing an op: `python tools/readme_ops_table.py`.
tests/test_cli.py fails while the README's copy differs from the generated table.
"""
from __future__ import annotations

import re
from pathlib import Path

from tracecomp.cli import ops_markdown
from tracecomp.ops.table import default_table

START = "<!-- ops table: tracecomp ops --markdown -->\n"
END = "\n<!-- end of the ops table -->"


def main() -> None:
    readme = Path(__file__).resolve().parent.parent / "README.md"
    text = readme.read_text()
    table = ops_markdown(list(default_table().values()))
    start, end = text.index(START) + len(START), text.index(END)
    text = text[:start] + table + text[end:]
    rows = table.count("\n") - 1
    text = re.sub(r"<summary>The table \(\d+ ops\)</summary>", f"<summary>The table ({rows} ops)</summary>", text)
    readme.write_text(text)
    print(f"README.md: {rows} ops")


if __name__ == "__main__":
    main()
