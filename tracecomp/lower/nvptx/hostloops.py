"""Loops the host runs around launches: a loop over products whose trip count is known
only at run time.

A Matmul is a launch of its own, so a Loop holding one (the fused attention's loops over
batch items and tiles) runs on the host.  With a static trip count launch.unrolled repeats
its body with the loop var a constant; with a run-time one (a dynamic sequence's tile
count, a causal nest's `min(qb + 1, blocks)`) the body is planned once as a `HostLoop`: its
launches take the loop var as one more int64 parameter after the sizes, and carry the
loops around them (`Launch.loops`, outermost first).  The launches stay one flat list in
program order; `in_order` rebuilds the nesting from it (consecutive launches of one loop
form its body) and yields each launch with the loop vars' values of each iteration.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from .grid import size_text, size_value


@dataclass(eq=False)          # (identity: two unrolled copies of a loop are two loops)
class HostLoop:
    var: str
    extent: object            # a size expression of the size parameters and outer loop vars
    body: list                # its statements, unrolled (launch.unrolled)

    def trips(self, env: dict[str, int]) -> int:
        value = size_value(self.extent, env)
        if value is None:
            raise KeyError(f"host loop {self.var}: trip count {size_text(self.extent)} reads an unknown name")
        return max(value, 0)


def in_order(calls: list, env: dict, loops_of: Callable = lambda c: c.loops, depth: int = 0) -> Iterator[tuple]:
    """(call, env with the loop vars bound) for every launch run, in order: `calls` in program
    order, `loops_of(call)` the host loops around each (outermost first)."""
    i = 0
    while i < len(calls):
        loops = loops_of(calls[i])
        if len(loops) <= depth:
            yield calls[i], env
            i += 1
            continue
        loop, j = loops[depth], i + 1
        while j < len(calls) and len(loops_of(calls[j])) > depth and loops_of(calls[j])[depth] is loop:
            j += 1
        for v in range(loop.trips(env)):
            yield from in_order(calls[i:j], {**env, loop.var: v}, loops_of, depth + 1)
        i = j


def loops_json(loops: list[HostLoop], numbering: dict) -> list[dict]:
    """A launch's host loops for the exported JSON: each with a number that is the same for
    every launch of that loop, its var and trip count (text over sizes and outer vars)."""
    return [{"loop": numbering.setdefault(id(h), len(numbering)), "var": h.var, "trips": size_text(h.extent)}
            for h in loops]
