"""What tracecomp compiled and what PyTorch ran: per graph (`GraphReport`, which the backend
fills in) and per run of a model (`Explanation`, which explain.py returns)."""
from __future__ import annotations

import collections
import operator
from dataclasses import dataclass, field

import torch
import torch.fx

from .partition import QUIET, op_name, user_line


@dataclass
class GraphReport:
    """One graph the backend received: `kind` is "forward", "backward" or "inference";
    `compiled` counts the ATen ops tracecomp compiled, `fallback` the ones PyTorch ran,
    each with the reason and the user's lines it comes from."""
    name: str
    kind: str
    compiled: collections.Counter = field(default_factory=collections.Counter)
    fallback: collections.Counter = field(default_factory=collections.Counter)
    reasons: dict = field(default_factory=dict)           # op -> reason (the first seen)
    lines: dict = field(default_factory=dict)             # op -> user lines
    partitions: int = 1

    @classmethod
    def of(cls, gm: torch.fx.GraphModule, refused: dict, name: str, kind: str) -> "GraphReport":
        report = cls(name, kind)
        for node in gm.graph.nodes:
            if node.op != "call_function" or node.target is operator.getitem:
                continue
            op = op_name(node)
            why = refused.get(node)
            if why is None:
                report.compiled[op] += 1
            elif why not in QUIET:
                report.fallback[op] += 1
                report.reasons.setdefault(op, why)
                line = user_line(node)
                if line and line not in report.lines.setdefault(op, []):
                    report.lines[op].append(line)
        return report


@dataclass
class Explanation:
    """The graphs of one run of a model through the backend (forward, and backward where
    the outputs need gradients) and the ops each compiled or left to PyTorch."""
    graphs: list

    @property
    def compiled_ops(self) -> collections.Counter:
        return sum((g.compiled for g in self.graphs), collections.Counter())

    @property
    def fallback_ops(self) -> collections.Counter:
        return sum((g.fallback for g in self.graphs), collections.Counter())

    def reason(self, op: str) -> str | None:
        return next((g.reasons[op] for g in self.graphs if op in g.reasons), None)

    def __str__(self) -> str:
        out = [f"{len(self.graphs)} graph(s): " + ", ".join(
            f"{g.name} ({sum(g.compiled.values())} ops compiled, {sum(g.fallback.values())} in PyTorch)"
            for g in self.graphs)]
        compiled, fallback = self.compiled_ops, self.fallback_ops
        out.append(f"compiled by tracecomp: {sum(compiled.values())} ops, {len(compiled)} distinct")
        out += [f"  {n:4d}  {op}" for op, n in sorted(compiled.items())]
        out.append(f"run by PyTorch (fallback): {sum(fallback.values())} ops, {len(fallback)} distinct")
        for op, n in sorted(fallback.items()):
            out.append(f"  {n:4d}  {op}: {self.reason(op)}")
            for g in self.graphs:
                out += [f"          from {line}" for line in g.lines.get(op, [])]
        return "\n".join(out)
