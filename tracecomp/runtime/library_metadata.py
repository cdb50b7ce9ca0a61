"""The metadata of a loaded library, read and checked as foreign input.

`read_metadata(library, name, path)` calls NAME_metadata() (elf_check has made sure it is
a function), decodes its JSON and checks every field tc.load and ExportedFunction use,
before any of them is used: a library from elsewhere, an older tracecomp, or a hand-made
one gets a BackendError naming the library and the field ("metadata['inputs'][1]['dtype']
must be one of ..., got 'object'"), never a raw KeyError or AttributeError later.

What is checked (format 1):
- `format` is 1; `target` has `cpu` and `features` strings;
- `inputs` and `outputs` are lists of {"dtype": a tracecomp dtype name, "shape": [...]},
  each dim an int >= 0 or a size expression ("batch", "784*batch", "batch + 1");
- every size name an expression uses is bound by an input dim that is that name alone,
  in an earlier input or dim (ExportedFunction binds sizes in that order), and so is
  every name in `sizes` (the sizes the entry point takes);
- `output_structure`, when present, is a structure with one leaf per output;
- `computed_index_checks`, when present, lists objects with an int `code` (and then
  tc.load makes sure NAME_error_index is a function: a failed check calls it).
"""
from __future__ import annotations

import ctypes
import json

from ..core.errors import BackendError
from ..core.version import __version__


class _Bad(Exception):
    """A metadata field that is wrong: (where, what)."""


def read_metadata(library: ctypes.CDLL, name: str, path: str) -> dict:
    """NAME_metadata() of `library` (loaded from `path`), parsed and checked."""
    function = getattr(library, f"{name}_metadata")
    function.restype = ctypes.c_char_p
    function.argtypes = []
    raw = function()
    if raw is None:
        raise BackendError(f"tc.load: {path}: {name}_metadata() returned NULL, not the JSON text "
                           "tc.export writes")
    try:
        metadata = json.loads(raw.decode())
    except ValueError as e:           # UnicodeDecodeError is one too
        raise BackendError(f"tc.load: {path} has unreadable metadata: {e}") from None
    if isinstance(metadata, dict) and metadata.get("format") != 1:
        raise BackendError(f"tc.load: {path} has metadata format {metadata.get('format')!r}; "
                           f"tracecomp {__version__} reads format 1")
    try:
        check_metadata(metadata)
    except _Bad as e:
        where, what = e.args
        raise BackendError(f"tc.load: {path} has malformed metadata: {where} {what}; is it a "
                           "library written by tc.export?") from None
    return metadata


def check_metadata(metadata) -> None:
    """_Bad(where, what) at the first field that is wrong (module docstring)."""
    _expect(isinstance(metadata, dict), "metadata", "must be a JSON object", metadata)
    if metadata.get("format") != 1:
        raise _Bad("metadata['format']", f"is {metadata.get('format')!r}; tracecomp "
                                          f"{__version__} reads format 1")
    target = _field(metadata, "target", dict, "metadata")
    for key in ("cpu", "features"):
        _field(target, key, str, "metadata['target']")
    bound: set[str] = set()
    for group in ("inputs", "outputs"):
        for i, tensor in enumerate(_field(metadata, group, list, "metadata")):
            _check_tensor(tensor, f"metadata['{group}'][{i}]", bound, binds=group == "inputs")
    for i, size in enumerate(_optional_list(metadata, "sizes")):
        _expect(isinstance(size, str) and size in bound, f"metadata['sizes'][{i}]",
                "must name a size that an input's shape binds", size)
    if metadata.get("output_structure") is not None:
        _check_structure(metadata["output_structure"], len(metadata["outputs"]))
    for i, check in enumerate(_optional_list(metadata, "computed_index_checks")):
        _expect(isinstance(check, dict) and type(check.get("code")) is int,
                f"metadata['computed_index_checks'][{i}]", "must be an object with an int 'code'", check)


def _check_tensor(tensor, where: str, bound: set[str], binds: bool) -> None:
    from ..core.dtypes import DType
    _expect(isinstance(tensor, dict), where, "must be a JSON object", tensor)
    dtype = _field(tensor, "dtype", str, where)
    _expect(dtype in DType.__members__, f"{where}['dtype']",
            f"must be one of {', '.join(DType.__members__)}", dtype)
    for d, dim in enumerate(_field(tensor, "shape", list, where)):
        at = f"{where}['shape'][{d}]"
        if isinstance(dim, bool) or not isinstance(dim, (int, str)):
            raise _Bad(at, f"must be an int or a size expression, got {dim!r}")
        if isinstance(dim, int):
            _expect(dim >= 0, at, "must not be negative", dim)
        elif binds and dim.isidentifier() and dim not in bound:
            bound.add(dim)
        else:
            for factor in _factors(dim, at):
                _expect(factor.lstrip("-").isdigit() or factor in bound, at,
                        f"uses the size {factor!r}, which no earlier input dim binds", dim)


def size_terms(text: str):
    """(sign, product) pairs of a sum written as symbolic.Dim prints it (here, beside the
    checks that read it first; the loader evaluates sizes with it).  A floor division's own
    sum, `floor((h + 1)/2)`, stays one factor."""
    out = []
    for part in _top_level(text.replace(" - ", " + -"), " + "):
        part = part.strip()
        out.append((-1, part[1:]) if part.startswith("-") else (1, part))
    return out


def term_factors(term: str) -> list[str]:
    return [f.strip() for f in _top_level(term, "*")]


def floor_parts(factor: str):
    """(the dividend's text, the divisor) of a factor `floor(x/k)` or `floor((x + y)/k)`; None
    for another factor."""
    if not (factor.startswith("floor(") and factor.endswith(")")) or "/" not in factor:
        return None
    inner, _, divisor = factor[len("floor("):-1].rpartition("/")
    if inner.startswith("(") and inner.endswith(")"):
        inner = inner[1:-1]
    return (inner, int(divisor)) if divisor.isdigit() and int(divisor) > 0 else None


def _top_level(text: str, separator: str) -> list[str]:
    """`text` split at each `separator` outside parentheses."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            start = i = i + len(separator)
            continue
        i += 1
    return parts + [text[start:]]


def _factors(expression: str, where: str) -> list[str]:
    """The sizes and numbers a size expression multiplies, as loader.evaluate_dim reads it
    (inside floor divisions too)."""
    out = []
    for _, term in size_terms(expression):
        for f in term_factors(term):
            floor = floor_parts(f)
            out += _factors(floor[0], where) if floor is not None else [f]
    _expect(all(out), where, "is not a size expression", expression)
    return out


def _check_structure(js, leaves: int) -> None:
    count = _leaves(js, "metadata['output_structure']", 0)
    _expect(count == leaves, "metadata['output_structure']",
            f"has {count} tensor leaves for {leaves} outputs", js)


MAX_DEPTH = 100


def _leaves(js, where: str, depth: int) -> int:
    """The tensor leaves of a structure as pytree.structure_to_json writes it: "*",
    {"tuple": [...]}, {"list": [...]}, {"dict": [[str, ...], ...]}, {"static": value}."""
    if js == "*":
        return 1
    _expect(isinstance(js, dict) and len(js) == 1, where,
            "must be \"*\" or an object with one key (tuple, list, dict or static)", js)
    _expect(depth < MAX_DEPTH, where, f"nests deeper than {MAX_DEPTH}", "...")
    (kind, body), = js.items()
    if kind == "static":
        _expect(body is None or isinstance(body, (bool, int, float, str)), f"{where}['static']",
                "must be null, a bool, a number or a string", body)
        return 0
    _expect(kind in ("tuple", "list", "dict"), where, "must be tuple, list, dict or static", kind)
    _expect(isinstance(body, list), f"{where}['{kind}']", "must be a JSON array", body)
    if kind != "dict":
        return sum(_leaves(v, f"{where}['{kind}'][{i}]", depth + 1) for i, v in enumerate(body))
    count = 0
    for i, pair in enumerate(body):
        _expect(isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str),
                f"{where}['dict'][{i}]", "must be a [string key, structure] pair", pair)
        count += _leaves(pair[1], f"{where}['dict'][{i}][1]", depth + 1)
    return count


def _field(obj: dict, key: str, kind: type, where: str):
    if key not in obj:
        raise _Bad(where, f"has no '{key}'")
    _expect(isinstance(obj[key], kind), f"{where}['{key}']", f"must be a JSON {_JSON[kind]}", obj[key])
    return obj[key]


def _optional_list(obj: dict, key: str) -> list:
    return _field(obj, key, list, "metadata") if key in obj else []


_JSON = {dict: "object", list: "array", str: "string"}


def _expect(ok: bool, where: str, what: str, got) -> None:
    if not ok:
        raise _Bad(where, f"{what}, got {got!r:.200}")
