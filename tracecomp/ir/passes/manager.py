"""PassManager: run a plain list of named passes, optionally verifying and recording each.

A pass is any `Graph -> Graph` function.  With `verify_each`, the input and every pass's
result are verified, so a broken graph is reported right after the pass that broke it
(the error names the pass).  With `record`, the printed graph before the first pass
("input") and after each pass is kept in `texts` (pass name -> text), for the CLI to show;
with `print_to`, it is also written to that stream as it is produced.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, TextIO

from ...core.errors import IRError
from ..graph import Graph
from ..printer import print_graph
from ..verifier import verify

Pass = Callable[[Graph], Graph]


@dataclass
class PassManager:
    passes: list[tuple[str, Pass]]
    verify_each: bool = False
    record: bool = False
    print_to: TextIO | None = None
    texts: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [name for name, _ in self.passes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"PassManager: pass names must be unique, repeated: {', '.join(duplicates)}")

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.passes]

    def run(self, graph: Graph) -> Graph:
        """Apply the passes in order; `texts` then holds this run's recorded graphs."""
        self.texts = {}
        self._after("input", graph)
        for name, fn in self.passes:
            graph = fn(graph)
            self._after(name, graph)
        return graph

    def _after(self, name: str, graph: Graph) -> None:
        if self.verify_each:
            try:
                verify(graph)
            except IRError as e:
                stage = "the input graph" if name == "input" else f"the graph after pass '{name}'"
                raise IRError(f"{stage} does not verify:\n{e}") from e
        if self.record or self.print_to is not None:
            text = print_graph(graph)
            if self.record:
                self.texts[name] = text
            if self.print_to is not None:
                print(f"// ----- {name}\n{text}", file=self.print_to)
