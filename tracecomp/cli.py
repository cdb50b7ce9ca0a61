"""The `tracecomp` command line: wires the library's pieces together, holds no logic.

Errors a user can make (bad MODULE:FUNCTION, input spec, stage, format) end in one line
`tracecomp: error: ...` on stderr and exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import math
import os
import re
import sys
import time

STAGES = ("graph", "backward", "optimized", "loops", "llvm", "asm", "ptx")
GRAPH_STAGES = ("graph", "backward", "optimized")
FORMATS = ("text", "dot", "svg", "png")
DTYPES = {"f32": "float32", "f64": "float64", "i32": "int32", "i64": "int64", "bool": "bool",
          "float32": "float32", "float64": "float64", "int32": "int32", "int64": "int64"}
SUFFIX = {"graph": "txt", "backward": "txt", "optimized": "txt", "loops": "mlir", "llvm": "ll",
          "asm": "s", "ptx": "ptx"}


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


def _add_function_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("function", metavar="MODULE:FUNCTION",
                   help="the function to trace: a dotted module (importable from the current "
                        "folder) or a .py file, a colon, and the function's name")
    p.add_argument("--input", action="append", default=[], metavar="SPEC",
                   help='one per positional argument, in order: dtype[shape], e.g. "f32[256,784]", '
                        '"i64[4]", "f32[]" (dtypes f32 f64 i32 i64 bool). Floats are filled with '
                        "random normals, integers and bools with zeros")
    p.add_argument("--grad", metavar="ARGNUMS",
                   help="trace tc.value_and_grad(FUNCTION, argnums=...) instead, e.g. --grad 0,1")
    p.add_argument("--dynamic", action="append", default=[], metavar="ARG:AXIS:NAME",
                   help="make a dim a size known at run time, e.g. x:0:batch (ARG: a parameter "
                        "name or position; repeat for more dims): exported libraries take it as "
                        "an argument, dumps show the code that does")


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
    ops.add_argument("--markdown", action="store_true",
                     help="a Markdown table, one row per op: how to call it, PyTorch's name, its kind")

    dump = sub.add_parser("dump", help="print or write one stage (or all) of the compiler for a function")
    _add_function_args(dump)
    dump.add_argument("--stage", default="optimized", metavar="STAGE",
                      help=f"one of {', '.join(STAGES)}, all (default: optimized). 'all' writes every "
                           "stage into the folder -o (default ./tracecomp_dump) and prints a time per stage")
    dump.add_argument("--arch", default="sm_80", metavar="SM",
                      help="CUDA architecture of the ptx stage (default sm_80; also sm_86, sm_89, sm_90, ...)")
    dump.add_argument("--format", default="text", metavar="FORMAT",
                      help="text (every stage), dot, svg or png (graph stages; svg and png need "
                           "Graphviz's dot)")
    dump.add_argument("-o", "--output", metavar="PATH", help="write here instead of printing")
    dump.add_argument("--torch", action="store_true",
                      help="FUNCTION is a PyTorch model (an nn.Module, an nn.Module class taking no "
                           "arguments, or a function of torch tensors): dump the graphs that "
                           "torch.compile(backend='tracecomp') imports from it (tracecomp.torch.lower)")
    dump.add_argument("--graph", default="forward", metavar="GRAPH",
                      help="with --torch: forward (default) or backward, the graph AOTAutograd gives "
                           "for the gradients of the parameters and of the --grad inputs; --stage all "
                           "writes both, each into a folder of its own")

    export = sub.add_parser("export", help="compile a function into a shared library and C header")
    _add_function_args(export)
    export.add_argument("-o", "--output", required=True, metavar="LIB.so",
                        help="the library to write (an existing directory: lib<FUNCTION>.so inside "
                             "it); the header goes next to it with the .h suffix")
    export.add_argument("--name", help="the C entry point's name (default: from the file name)")

    info = sub.add_parser("info", help="the host CPU, its caches and what tracecomp chose for it")
    info.add_argument("--json", action="store_true", help="print it as JSON")

    from tracecomp.demo import mlp as demo, cnn as demo_cnn, gpt as demo_gpt
    demo_parser = sub.add_parser("demo", help="train an MLP on 8x8 handwritten digits with a compiled "
                                              "train step; print timings, write pictures "
                                              "(demo cnn, demo gpt: the other demos)")
    demo.add_arguments(demo_parser)
    # An optional model name: `tracecomp demo` alone stays the MLP demo with its options.
    models = demo_parser.add_subparsers(dest="demo_model", metavar="MODEL")
    demo_cnn.add_arguments(models.add_parser(
        "cnn", help="a small CNN (tc.nn) on the 8x8 digits, trained with one compiled step (AdamW)"))
    demo_gpt.add_arguments(models.add_parser(
        "gpt", help="a character-level GPT (tc.nn Transformer layers) trained on Hamlet for a minute"))
    return parser


def _list_ops(pattern: str, markdown: bool = False) -> int:
    from tracecomp.ops.table import default_table
    ops = [op for op in default_table().values() if pattern in op.full_name]
    print(ops_markdown(ops) if markdown else "\n".join(f"{op.schema}    [{op.kind}]" for op in ops))
    return 0


def ops_markdown(ops) -> str:
    """One row per op name (its overloads together): the calls tracecomp offers, the PyTorch
    function it follows, and how it is implemented (a formula, a composite or a kernel kind)."""
    rows: dict[str, list] = {}
    for op in ops:
        rows.setdefault(op.name, []).append(op)
    lines = ["| tracecomp | PyTorch | implemented as |", "|---|---|---|"]
    for name, group in rows.items():
        calls = []
        for op in group:
            # an op with regions is reached through tracecomp/control's function of its name
            calls += [f"tc.{name}"] * ("function" in op.variants or bool(op.regions))
            calls += [f"x.{name}()"] * ("method" in op.variants)
            calls += [f"`{_OPERATOR_TEXT.get(d, d)}`" for d in op.operators + op.reflected]
            calls += [f"x.{p}" for p in op.properties]
        calls = list(dict.fromkeys(c if c.startswith("`") else f"`{c}`" for c in calls))
        torch = next((op.torch for op in group if op.torch), "")
        if not torch:
            torch = f"torch.{name}" if any("function" in op.variants or op.regions for op in group) else \
                f"Tensor.{group[0].properties[0] if group[0].properties else name}"
        elif torch != "-":
            torch = f"torch.{torch}"
        kinds = sorted({op.kind for op in group})
        lines.append(f"| {', '.join(calls) or '(internal)'} | {'`' + torch + '`' if torch != '-' else 'none'} | "
                     f"{', '.join(kinds)} |")
    return "\n".join(lines)


_OPERATOR_TEXT = {"__add__": "x + y", "__radd__": "2 + x", "__sub__": "x - y", "__rsub__": "2 - x",
                  "__mul__": "x * y", "__rmul__": "2 * x", "__truediv__": "x / y", "__rtruediv__": "2 / x",
                  "__pow__": "x ** y", "__rpow__": "2 ** x", "__matmul__": "x @ y", "__rmatmul__": "a @ x",
                  "__neg__": "-x", "__abs__": "abs(x)", "__eq__": "x == y", "__ne__": "x != y",
                  "__lt__": "x < y", "__le__": "x <= y", "__gt__": "x > y", "__ge__": "x >= y",
                  "__and__": "x & y", "__rand__": "1 & x", "__or__": "x | y", "__ror__": "1 | x",
                  "__xor__": "x ^ y", "__rxor__": "1 ^ x", "__invert__": "~x", "__mod__": "x % y",
                  "__rmod__": "2 % x", "__floordiv__": "x // y", "__rfloordiv__": "2 // x"}


def load_function(spec: str):
    module_name, sep, fn_name = spec.rpartition(":")
    if not sep or not module_name or not fn_name:
        raise CliError(f"expected MODULE:FUNCTION, got {spec!r}")
    try:
        if module_name.endswith(".py") or os.path.sep in module_name:
            if not os.path.isfile(module_name):      # (importing a FIFO would block)
                what = "not a regular file" if os.path.exists(module_name) else "no such file"
                raise CliError(f"{what}: {module_name}")
            mod_spec = importlib.util.spec_from_file_location(
                os.path.splitext(os.path.basename(module_name))[0], module_name)
            module = importlib.util.module_from_spec(mod_spec)
            mod_spec.loader.exec_module(module)
        else:
            if "" not in sys.path and os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except CliError:
        raise
    except ModuleNotFoundError as e:
        raise CliError(f"cannot import module {module_name!r}: {e}") from None
    except Exception as e:
        raise CliError(f"importing {module_name!r} failed: {type(e).__name__}: {e}") from None
    fn = getattr(module, fn_name, None)
    if fn is None:
        raise CliError(f"module {module_name!r} has no attribute {fn_name!r}")
    if not callable(fn):
        raise CliError(f"{module_name}:{fn_name} is not callable")
    return fn


# The CLI fills each --input with random data: a shape beyond this is a typo, not a plan.
MAX_INPUT_ELEMENTS = 1 << 28


def parse_input(spec: str, rng):
    import numpy as np
    import tracecomp as tc
    m = re.fullmatch(r"\s*([a-z0-9]+)\s*\[\s*([0-9,\s]*)\]\s*", spec)
    if not m or m.group(1) not in DTYPES:
        raise CliError(f"bad input spec {spec!r}: expected dtype[shape] such as \"f32[4,8]\" or "
                       f"\"i64[]\" (dtypes: f32, f64, i32, i64, bool)")
    dims = [d.strip() for d in m.group(2).split(",")] if m.group(2).strip() else []
    if any(not d.isdigit() for d in dims):
        raise CliError(f"bad input spec {spec!r}: dims must be non-negative integers")
    shape, dtype = tuple(int(d) for d in dims), np.dtype(DTYPES[m.group(1)])
    if math.prod(shape) > MAX_INPUT_ELEMENTS:
        raise CliError(f"bad input spec {spec!r}: {math.prod(shape)} elements exceed the CLI's "
                       f"limit of {MAX_INPUT_ELEMENTS} for a random example input")
    # A zero-size input may have any other dims, but its strides (the product of the dims
    # after each, in bytes) must still be 64-bit numbers, for NumPy and for compiled code.
    if math.prod(d for d in shape if d) * dtype.itemsize >= 1 << 63:
        raise CliError(f"bad input spec {spec!r}: its dims {list(shape)} would give a tensor whose "
                       "byte strides do not fit in 64 bits, even with no elements")
    try:
        if dtype.kind == "f":
            return tc.tensor(rng.standard_normal(shape).astype(dtype))
        return tc.tensor(np.zeros(shape, dtype))
    except (ValueError, MemoryError) as e:      # NumPy's own limits, whatever remains of them
        raise CliError(f"bad input spec {spec!r}: NumPy cannot make an array of this shape ({e})") from None


def _prepare_inputs(args) -> list:
    import numpy as np
    rng = np.random.default_rng(0)
    return [parse_input(s, rng) for s in args.input]


def _argnums(spec: str, count: int) -> tuple[int, ...]:
    """--grad's argument numbers, checked against the `count` inputs."""
    try:
        argnums = tuple(int(a) for a in spec.split(","))
    except ValueError:
        raise CliError(f"--grad takes comma-separated argument numbers, got {spec!r}") from None
    if any(a < 0 or a >= count for a in argnums):
        raise CliError(f"--grad {spec}: the function gets {count} inputs")
    return argnums


def _prepare(args):
    import tracecomp as tc
    fn = load_function(args.function)
    inputs = _prepare_inputs(args)
    try:
        inspect.signature(fn).bind(*inputs)
    except TypeError as e:
        raise CliError(f"{args.function} cannot take {len(inputs)} inputs (--input): {e}") from None
    except ValueError:
        pass                       # no signature (a builtin): let tracing tell
    if args.grad is not None:
        argnums = _argnums(args.grad, len(inputs))
        fn = tc.value_and_grad(fn, argnums=argnums if len(argnums) > 1 else argnums[0])
    return fn, inputs


def _render(lowered, stage: str, fmt: str, arch: str = "sm_80") -> bytes:
    if stage == "ptx":      # with the launches and ptxas -v figures as a comment header
        from tracecomp.lower.nvptx.program import compile_program
        from tracecomp.runtime.cuda.report import annotated_ptx
        return annotated_ptx(compile_program(lowered.program, arch)).encode()
    if fmt == "text":
        return lowered.as_text(stage).encode()
    from tracecomp.demo import pictures
    dot = pictures.stage_dot(lowered, stage)
    if fmt == "dot":
        return dot.encode()
    if not pictures.have_graphviz():
        raise CliError(f"--format {fmt} needs Graphviz's 'dot' ({pictures.INSTALL_GRAPHVIZ}); "
                       "--format dot works without it")
    return pictures.render(dot, fmt)


def _lower(fn, inputs, spec: str, dynamic: dict | None = None):
    import tracecomp as tc
    from tracecomp.core.errors import TracecompError
    try:
        if dynamic:
            return tc.trace(fn).lower_dynamic(tuple(inputs), dynamic)
        return tc.trace(fn).lower(*inputs)
    except TracecompError:
        raise
    except Exception as e:
        raise CliError(f"tracing {spec} failed: {type(e).__name__}: {e}") from None


def _torch_graphs(args) -> dict:
    """--torch: {"forward": Lowered, "backward": Lowered} of the model, as imported."""
    if args.dynamic:
        raise CliError("--dynamic is for tracecomp functions; --torch imports the model at the --input shapes")
    from tracecomp.core.errors import TracecompError
    try:
        import torch
        import tracecomp.torch as tt
    except ImportError as e:
        raise CliError(f"--torch needs PyTorch (pip install torch): {e}") from None
    model = load_function(args.function)
    if isinstance(model, type) and issubclass(model, torch.nn.Module):
        model = model()
    inputs = [torch.from_numpy(x.numpy().copy()) for x in _prepare_inputs(args)]
    for i in _argnums(args.grad, len(inputs)) if args.grad is not None else ():
        if not inputs[i].is_floating_point():
            raise CliError(f"--grad {args.grad}: input {i} is not a float tensor")
        inputs[i].requires_grad_(True)
    try:
        graphs = tt.lower(model, *inputs).graphs
    except TracecompError:
        raise
    except Exception as e:
        raise CliError(f"importing {args.function} through torch.compile failed: {type(e).__name__}: "
                       f"{str(e).splitlines()[0] if str(e) else ''}") from None
    if args.stage != "all" and args.graph not in graphs:
        raise CliError(f"--graph {args.graph}: {args.function} has " + (
            "no backward graph (no parameter or --grad input needs gradients)" if args.graph == "backward"
            else f"graphs {', '.join(graphs)} only"))
    return graphs


def _dump(args) -> int:
    if args.stage not in STAGES + ("all",):
        raise CliError(f"unknown stage {args.stage!r}; available: {', '.join(STAGES)}, all")
    if args.format not in FORMATS:
        raise CliError(f"unknown format {args.format!r}; available: {', '.join(FORMATS)}")
    if args.format != "text" and args.stage not in GRAPH_STAGES + ("all",):
        raise CliError(f"--format {args.format} draws graph stages ({', '.join(GRAPH_STAGES)}); "
                       f"stage {args.stage} is text only")
    if args.graph not in ("forward", "backward"):
        raise CliError(f"unknown graph {args.graph!r}; available: forward, backward (with --torch)")
    if args.graph != "forward" and not args.torch:
        raise CliError("--graph picks a graph of a PyTorch model (--torch); for a tracecomp "
                       "function, --grad and --stage backward show its backward")
    t0 = time.perf_counter()
    if args.torch:
        graphs = _torch_graphs(args)
    else:
        fn, inputs = _prepare(args)
        graphs = {"": _lower(fn, inputs, args.function, _dynamic_spec(args.dynamic))}
    trace_time = time.perf_counter() - t0
    if args.stage != "all":
        lowered = graphs[args.graph if args.torch else ""]
        data = _render(lowered, args.stage, args.format, args.arch)
        if args.output:
            with open(args.output, "wb") as f:
                f.write(data)
        elif args.format == "png":
            raise CliError("--format png writes binary data: give a file with -o")
        else:
            sys.stdout.write(data.decode() if data.endswith(b"\n") else data.decode() + "\n")
        return 0
    for name, lowered in graphs.items():
        if name:
            print(f"{name} graph:")
        _dump_all(lowered, os.path.join(args.output or "tracecomp_dump", name), args, trace_time)
    return 0


def _dump_all(lowered, folder: str, args, trace_time: float) -> None:
    """Every stage of `lowered` into `folder`, with the time each took (and times.json)."""
    os.makedirs(folder, exist_ok=True)
    print(f"{'trace+optimize':>16}  {trace_time * 1e3:9.1f} ms")
    times = {"trace+optimize": trace_time}
    for stage in STAGES:
        t0 = time.perf_counter()
        text = _render(lowered, stage, "text", args.arch).decode()
        elapsed = time.perf_counter() - t0
        path = os.path.join(folder, f"{stage}.{SUFFIX[stage]}")
        with open(path, "w") as f:
            f.write(text)
        extra = ""
        if stage in GRAPH_STAGES and args.format != "text":
            picture = _render(lowered, stage, args.format)
            with open(os.path.join(folder, f"{stage}.{args.format}"), "wb") as f:
                f.write(picture)
            extra = f" (+ {stage}.{args.format})"
        print(f"{stage:>16}  {elapsed * 1e3:9.1f} ms  {path}{extra}")
        times[stage] = elapsed
    from .core.timings import summary
    compile_times = lowered.timings      # the pipeline's own stages (tracecomp/core/timings.py)
    print("compile time per stage: " + summary(compile_times))
    with open(os.path.join(folder, "times.json"), "w") as f:
        json.dump({"seconds": times, "compile_seconds": compile_times, "function": args.function,
                   "inputs": args.input, "grad": args.grad}, f, indent=2)


def _dynamic_spec(items: list[str]) -> dict | None:
    """["x:0:batch", "y:0:batch"] -> {"x": {0: "batch"}, "y": {0: "batch"}}."""
    spec: dict = {}
    for item in items:
        parts = item.split(":")
        if len(parts) != 3 or not re.fullmatch(r"-?\d+", parts[1]):
            raise CliError(f"--dynamic {item!r}: expected ARG:AXIS:NAME, e.g. x:0:batch")
        arg = int(parts[0]) if parts[0].isdigit() else parts[0]
        spec.setdefault(arg, {})[int(parts[1])] = parts[2]
    return spec or None


def export_paths(output: str, function: str) -> str:
    """The library's path for `-o`: one rule for the .so and its .h (same stem, beside it).

    An existing directory gets `lib<function>.so` (and `.h`) inside it; anything else is the
    library's own path.
    """
    if os.path.isdir(output):
        return os.path.join(output, f"lib{function}.so")
    return output


def _export(args) -> int:
    import tracecomp as tc
    fn, inputs = _prepare(args)
    t0 = time.perf_counter()
    output = export_paths(args.output, args.name or args.function.rpartition(":")[2])
    md = tc.export(fn, inputs, output, name=args.name, dynamic=_dynamic_spec(args.dynamic))
    header = os.path.splitext(output)[0] + ".h"
    print(f"wrote {output}, {header} and {output}.sha256 (entry point {md['name']}, "
          f"{time.perf_counter() - t0:.2f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    from tracecomp.core.errors import TracecompError
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "ops":
            return _list_ops(args.pattern, args.markdown)
        if args.command == "dump":
            return _dump(args)
        if args.command == "export":
            return _export(args)
        if args.command == "info":
            from tracecomp.runtime import host
            details = host.describe()
            print(json.dumps(details, indent=2) if args.json else host.report(details))
            return 0
        if args.command == "demo":
            from tracecomp.demo import mlp as demo, cnn as demo_cnn, gpt as demo_gpt
            chosen = {None: demo, "cnn": demo_cnn, "gpt": demo_gpt}[args.demo_model]
            return chosen.main(args)
    except (CliError, TracecompError) as e:
        lines = str(e).split("\n")
        where = [ln.strip() for ln in lines[1:] if ln.strip().startswith("at ")]
        msg = " ".join(lines[0].split()) + (f" ({where[0]})" if where else "")
        print(f"tracecomp: error: {msg}", file=sys.stderr)
        return 2
    except (OSError, MemoryError) as e:
        print(f"tracecomp: error: {e or 'out of memory'}", file=sys.stderr)
        return 2
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
