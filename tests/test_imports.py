"""The layout's import rules, read from the source with ast (imports inside functions
count): no import cycle inside lower/ or gpu/, runtime/ never imports gpu/ (gpu/ builds on
runtime/'s JIT and target), lower/ imports neither, and no module imports another's
underscore names.  Failures name both files."""
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


def test_no_import_cycle_in_lower_or_gpu():
    for prefix in ("tracecomp.lower.", "tracecomp.gpu."):
        cycles = cycles_within(prefix)
        assert not cycles, "import cycles: " + "; ".join(files(c) for c in cycles)


def test_earlier_stages_do_not_import_later_ones():
    rules = [("tracecomp.runtime.", ("tracecomp.gpu.",)),
             ("tracecomp.lower.", ("tracecomp.runtime.", "tracecomp.gpu.", "tracecomp.trace"))]
    bad = [(a, b) for prefix, later in rules for a in MODULES if a.startswith(prefix)
           for b in GRAPH[a] if b.startswith(later)]
    assert not bad, "\n".join(f"{files([a])} imports {files([b])}" for a, b in bad)


def test_no_module_imports_another_modules_private_names():
    bad = [(name, module, imported) for name in MODULES for module, imported in imports(name)
           if imported and imported.startswith("_") and not imported.startswith("__") and module != name]
    assert not bad, "\n".join(f"{files([a])} imports {n} from {files([b])}" for a, b, n in bad)


def test_the_walk_sees_imports_inside_functions(tmp_path):
    assert "tracecomp.lower.llvm.math.functions" in GRAPH["tracecomp.lower.llvm.scalar"]   # a lazy import
