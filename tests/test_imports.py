"""The layout's import rules, read from the source with ast (imports inside functions count).

The folders of tracecomp/ are the pipeline's stages (ORDER): a module imports its own folder
and the folders before it, never a later one; the package root (`import tracecomp`) is later
than every folder but Dask's, the demos' and the CLI's.  No import cycle inside a folder, and
no module imports another's underscore names.  Failures name both files; each exception is
listed with its reason."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tracecomp"


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = modules()


def imports(name: str) -> list[tuple[str, str | None]]:
    """(imported module, imported name or None) for every import statement in `name`."""
    path = MODULES[name]
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here[:len(here) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((sub, None) if sub in MODULES else (base, a.name))
    return [(m, n) for m, n in found if m in MODULES]


GRAPH = {name: {m for m, _ in imports(name)} for name in MODULES}


def cycles_within(prefix: str) -> list[list[str]]:
    """Strongly connected components (of more than one module) among modules under `prefix`."""
    nodes = [m for m in MODULES if m.startswith(prefix)]
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if not w.startswith(prefix):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))
    for v in nodes:
        if v not in index:
            visit(v)
    return found


def files(names) -> str:
    return ", ".join(str(MODULES[n].relative_to(PACKAGE.parent)) for n in names)


# The stages, in import order: the package's folders, then its top-level files (the root),
# then the package's own users (Dask, the demos) and the CLI above them all.
ORDER = ["core", "ops", "ir", "tensors", "dispatch", "autograd", "library", "lower", "runtime",
         "transforms", "control", "aot", "nn", "optim", "utils", "torch", "<root>", "dask", "demo", "cli"]


ROOT_FILES = {"tracecomp", "tracecomp.bindings", "tracecomp.linalg"}   # the public names and their wiring


def stage(name: str) -> str:
    return "<root>" if name in ROOT_FILES else name.split(".")[1]


def upward_imports() -> set[tuple[str, str]]:
    return {(a, b) for a in MODULES for b in GRAPH[a] if ORDER.index(stage(b)) > ORDER.index(stage(a))}


def test_every_module_lies_in_a_stage_folder_or_is_one_of_the_few_top_level_files():
    loose = sorted(files([n]) for n in MODULES if stage(n) not in ORDER)
    assert not loose, f"modules outside the stage folders: {loose}"


def test_folders_import_only_the_folders_before_them():
    found = sorted(upward_imports())
    assert not found, "imports up the tree:\n" + "\n".join(f"{files([a])} imports {files([b])}" for a, b in found)


def test_only_the_packages_users_import_the_package_root():
    users = [a for a in MODULES if "tracecomp" in GRAPH[a] and a != "tracecomp"
             and stage(a) not in ("dask", "demo", "cli")]
    assert not users, f"import the op namespace (dispatch/api.py) instead of the package root: {files(users)}"


# Cycles inside one folder that a comment in the code explains: frozenset of modules -> why.
CYCLES: dict[frozenset, str] = {
    frozenset(["tracecomp.ops.elementwise", "tracecomp.ops.table"]):
        "the table checks its formulas' names against elementwise's builtins, which are derived from the table",
    frozenset(["tracecomp.ir.graph", "tracecomp.ir.printer"]):
        "str(graph) is the printer's text, and the printer reads graphs",
    frozenset(["tracecomp.autograd.backward", "tracecomp.autograd.derivatives", "tracecomp.autograd.formulas",
               "tracecomp.autograd.functional", "tracecomp.autograd.helpers", "tracecomp.autograd.kernels",
               "tracecomp.autograd.node"]):
        "a node applies its formulas with the engine (node -> backward), and attention's formulas are the "
        "VJP/JVP of its math, taken with the engine's own transforms (helpers -> functional)",
}


def test_no_import_cycle_inside_a_folder():
    found = {frozenset(c) for folder in ORDER for c in cycles_within(f"tracecomp.{folder}.")}
    root = {frozenset(c) for c in cycles_within("tracecomp") if all(stage(m) == "<root>" for m in c)}
    new = sorted(sorted(c) for c in (found | root) - CYCLES.keys())
    assert not new, "import cycles: " + "; ".join(files(c) for c in new)
    assert not (CYCLES.keys() - found - root), "cycles cut already: remove them from CYCLES"


def test_the_stage_order_fails_on_an_import_up_the_tree(monkeypatch):
    monkeypatch.setitem(GRAPH, "tracecomp.core.errors", GRAPH["tracecomp.core.errors"] | {"tracecomp.ir.graph"})
    assert ("tracecomp.core.errors", "tracecomp.ir.graph") in upward_imports()


def test_no_module_imports_another_modules_private_names():
    bad = [(name, module, imported) for name in MODULES for module, imported in imports(name)
           if imported and imported.startswith("_") and not imported.startswith("__") and module != name]
    assert not bad, "\n".join(f"{files([a])} imports {n} from {files([b])}" for a, b, n in bad)


def test_the_walk_sees_imports_inside_functions(tmp_path):
    assert "tracecomp.lower.llvm.math.functions" in GRAPH["tracecomp.lower.llvm.scalar"]   # a lazy import
