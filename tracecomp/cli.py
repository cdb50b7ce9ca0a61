"""The `tracecomp` command line: wires the library's pieces together, holds no logic."""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    import tracecomp
    parser = argparse.ArgumentParser(
        prog="tracecomp",
        description="tracecomp: a tracing compiler for array programs. "
                    "Trace a Python function on tensors, inspect and compile it.")
    parser.add_argument("--version", action="version", version=f"tracecomp {tracecomp.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    ops = sub.add_parser("ops", help="list the operators of ops.yaml with their schemas")
    ops.add_argument("pattern", nargs="?", default="", help="only ops whose name contains this")
    return parser


def _list_ops(pattern: str) -> int:
    from tracecomp.ops.table import default_table
    for op in default_table().values():
        if pattern in op.full_name:
            print(f"{op.schema}    [{op.kind}]")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "ops":
        return _list_ops(args.pattern)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
