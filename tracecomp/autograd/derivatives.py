"""Load derivatives.yaml (PyTorch's format, seed 001) and check it against ops.yaml.

An entry names an op by its full schema and gives, per differentiable input, a backward
formula over `grad`/`grads[i]`/`grad_<output>`, the op's arguments, `result`/`resultN`/
the named outputs and `grad_input_mask`; several inputs may share one formula returning a
tuple (`self, other: f(grad, grad_input_mask)`).  `result:` is the forward-mode formula
over `<arg>_p` / `<arg>_t` (or `auto_linear` / `auto_element_wise`).  Every differentiable
tensor input of every non-composite op must be covered: a formula, `non_differentiable`,
or `not_implemented("...")`.  Errors name derivatives.yaml, the line, the entry and the input.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import TableError
from ..ops import formula
from ..ops.table import OpDef, default_table, read_entries, table_path
from ..dispatch import api as tc

RESERVED = {"name", "non_differentiable", "output_differentiability", "result", "dispatch"}
AUTO_FORWARD = ("auto_linear", "auto_element_wise")
_NOT_IMPLEMENTED = re.compile(r'^not_implemented\("([^"]*)"\)$')


@dataclass(frozen=True)
class GradFormula:
    inputs: tuple[str, ...]            # `self, other:` -> ("self", "other")
    expr: formula.Expr | None          # None for not_implemented
    not_implemented: str | None = None
    text: str = ""


@dataclass(frozen=True)
class Derivative:
    op: OpDef
    node_name: str                      # "AddBackward0", the eager grad_fn's class name
    file: str
    line: int
    formulas: tuple[GradFormula, ...]
    non_differentiable: tuple[str, ...] = ()
    output_differentiability: tuple[bool, ...] | None = None
    forward: formula.Expr | str | None = None     # an Expr, "auto_linear", "auto_element_wise"

    def formula_for(self, name: str) -> GradFormula | None:
        for f in self.formulas:
            if name in f.inputs:
                return f
        return None

    def differentiable_outputs(self) -> list[bool]:
        n = len(self.op.schema.returns)
        if self.output_differentiability is not None:
            return list(self.output_differentiability)
        if self.op.schema.returns[0].type.is_list:
            return [True]
        return [True] + [False] * (n - 1) if not self._uses_grads() else [True] * n

    def _uses_grads(self) -> bool:
        names = set()
        for f in self.formulas:
            if f.expr is not None:
                names |= formula.free_names(f.expr)
        outputs = {r.name for r in self.op.schema.returns if r.name}
        return "grads" in names or any(f"grad_{o}" in names for o in outputs)


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def _output_names(op: OpDef) -> set[str]:
    n = len(op.schema.returns)
    names = {"result", "grad", "grads", "grads_defined", "grad_input_mask"} | {f"result{i}" for i in range(n)}
    for r in op.schema.returns:
        if r.name:
            names |= {r.name, f"grad_{r.name}"}
    return names


def _check_names(expr, allowed: set[str], functions: set[str], err, where: str) -> None:
    for name in formula.free_names(expr):
        if name.endswith("()"):
            if name[:-2] not in functions:
                err(f"{where} calls unknown function '{name[:-2]}'")
        elif name not in allowed and name not in ("True", "False", "None"):
            err(f"{where} uses unknown name '{name}' (known: {', '.join(sorted(allowed))})")


def _parse_formula(text: str, err, where: str):
    try:
        return formula.parse_expr(text, where)
    except TableError as e:
        err(f"{where}: {str(e).split(': ', 1)[-1]}")


def _build(entry: dict, ops: dict[str, OpDef], by_schema: dict[str, OpDef], functions: set[str],
           counters: dict[str, int], file: str) -> Derivative:
    line = entry.pop("__line__")
    label = str(entry.get("name", "?"))

    def err(msg: str):
        raise TableError(msg, file, line, label)

    op = by_schema.get(label)
    if op is None:
        base = label.split("(")[0]
        hint = f" (ops.yaml has '{ops[base].schema}')" if base in ops else ""
        err(f"names no op of ops.yaml with exactly this schema{hint}")
    arg_names = [a.name for a in op.schema.arguments]
    tensors = {a.name for a in op.schema.arguments if a.type.is_tensor}
    allowed = set(arg_names) | _output_names(op)
    formulas, covered = [], set()
    for key, text in entry.items():
        if key in RESERVED:
            continue
        inputs = tuple(k.strip() for k in str(key).split(","))
        for name in inputs:
            if name not in tensors:
                err(f"'{name}' is not a Tensor argument of {op.full_name} (tensors: {', '.join(sorted(tensors))})")
            if name in covered:
                err(f"input '{name}' has two formulas")
            covered.add(name)
        text = str(text).strip()
        m = _NOT_IMPLEMENTED.match(text)
        if m:
            formulas.append(GradFormula(inputs, None, m.group(1), text))
            continue
        expr = _parse_formula(text, err, f"formula for '{key}'")
        _check_names(expr, allowed, functions, err, f"formula for '{key}'")
        formulas.append(GradFormula(inputs, expr, None, text))
    non_diff = tuple(entry.get("non_differentiable", ()) or ())
    for name in non_diff:
        if name not in tensors:
            err(f"non_differentiable names '{name}', which is not a Tensor argument")
    missing = tensors - covered - set(non_diff)
    if missing:
        err(f"input(s) {', '.join(sorted(missing))} have no formula; give one, mark them "
            "non_differentiable, or write not_implemented(\"reason\")")
    out_diff = entry.get("output_differentiability")
    if out_diff is not None and len(out_diff) != len(op.schema.returns):
        err(f"output_differentiability has {len(out_diff)} entries for {len(op.schema.returns)} outputs")
    forward = entry.get("result")
    if forward is not None and str(forward).strip() not in AUTO_FORWARD:
        fwd_names = {f"{a}_p" for a in arg_names} | {f"{a}_t" for a in tensors} | set(arg_names) | \
            (_output_names(op) - {"grad", "grads", "grads_defined", "grad_input_mask"})
        forward = _parse_formula(str(forward), err, "forward formula 'result'")
        _check_names(forward, fwd_names, functions, err, "forward formula 'result'")
    elif forward is not None:
        forward = str(forward).strip()
    index = counters.get(op.name, 0)
    counters[op.name] = index + 1
    return Derivative(op, f"{_camel(op.name)}Backward{index}", file, line, tuple(formulas), non_diff,
                      tuple(bool(x) for x in out_diff) if out_diff is not None else None, forward)


def load_derivatives(path: str | Path, ops: dict[str, OpDef], functions: set[str]) -> dict[str, Derivative]:
    """Parse derivatives.yaml into {op full name: Derivative}; check coverage of `ops`."""
    path = Path(path)
    entries = read_entries(path)
    by_schema = {str(op.schema): op for op in ops.values()}
    out: dict[str, Derivative] = {}
    counters: dict[str, int] = {}
    for entry in entries:
        if not isinstance(entry, dict) or "name" not in entry:
            raise TableError(f"entry without 'name': {entry!r}", path.name)
        d = _build(entry, ops, by_schema, functions, counters, path.name)
        if d.op.full_name in out:
            raise TableError(f"'{d.op.full_name}' has two entries (first at line "
                             f"{out[d.op.full_name].line})", path.name, d.line, str(d.op.schema))
        out[d.op.full_name] = d
    return out


def uncovered_ops(ops: dict[str, OpDef], derivatives: dict[str, Derivative]) -> list[str]:
    """Non-composite ops with a Tensor input but no entry (composites decompose instead; ops
    with regions are differentiated by rules over their regions, control/autodiff.py)."""
    return [name for name, op in ops.items()
            if op.kind not in ("composite", "region") and op.schema.tensor_arguments and name not in derivatives]


@functools.cache
def default_derivatives() -> dict[str, Derivative]:
    from . import helpers
    functions = set(helpers.HELPERS) | {n for n in dir(tc) if callable(getattr(tc, n))}
    ops = default_table()
    return load_derivatives(table_path("derivatives.yaml"), ops, functions)
