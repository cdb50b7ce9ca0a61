"""ops.yaml and the schema parser: round trip for every entry, located errors for bad tables."""
import textwrap

import pytest

from tracecomp.core.errors import SchemaError, TableError
from tracecomp.ops.schema import parse_schema
from tracecomp.ops.table import default_table, load_table

TABLE = default_table()


@pytest.mark.parametrize("name", list(TABLE))
def test_schema_prints_exactly_as_written(name):
    op = TABLE[name]
    assert str(op.schema) == op.source
    assert parse_schema(op.source) == op.schema


@pytest.mark.parametrize("text", [
    "add(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor",
    "max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)",
    "split.Tensor(Tensor(a -> *) self, int split_size, int dim=0) -> Tensor(a)[]",
    "add_.Tensor(Tensor(a!) self, Tensor other, *, Scalar alpha=1) -> Tensor(a!)",
    "sum(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor",
    "f(Tensor[] tensors, int[2] pads=[0, 1], float eps=1e-05, str mode=\"a\", Tensor? w=None) -> ()",
])
def test_schema_round_trip(text):
    assert str(parse_schema(text)) == text


@pytest.mark.parametrize("text, message", [
    ("add(Tensor self, Tensor other", "not of the form"),
    ("add(Tensr self) -> Tensor", "unknown type 'Tensr'"),
    ("add(Tensor self, Tensor self) -> Tensor", "declares argument 'self' twice"),
    ("add(Tensor self, *, *, Scalar a=1) -> Tensor", "two '*'"),
    ("add(Tensor  self) -> Tensor", "unknown type 'Tensor '"),
    ("add(Tensor self, int x=foo()) -> Tensor", "not a literal"),
])
def test_bad_schemas(text, message):
    with pytest.raises(SchemaError, match=message):
        parse_schema(text)


def _load(tmp_path, text):
    path = tmp_path / "ops.yaml"
    path.write_text(textwrap.dedent(text))
    return load_table(path)


@pytest.mark.parametrize("text, message", [
    ("""
     - func: neg(Tensor self) -> Tensor
       elementwise: -self
     - func: bad(Tensor self -> Tensor
       elementwise: self
     """, r"ops.yaml:4: in entry 'bad\(Tensor self -> Tensor': schema"),
    ("""
     - func: neg(Tensor self) -> Tensor
       elementwise: -self
       kind: reduction
     """, r"ops.yaml:2: .*exactly one of 'elementwise', 'composite' or 'kind'"),
    ("""
     - func: neg(Tensor self) -> Tensor
       elementwise: -selff
     """, r"ops.yaml:2: .*uses 'selff', which is not an argument"),
    ("""
     - func: neg(Tensor self) -> Tensor
       elementwise: frobnicate(self)
     """, r"ops.yaml:2: .*calls 'frobnicate', which is neither"),
    ("""
     - func: neg(Tensor self) -> Tensor
       elementwise: self +
     """, r"ops.yaml:2: .*not valid Python"),
    ("""
     - func: neg(Tensor self) -> Tensor
       elementwise: -self
     - func: neg(Tensor self) -> Tensor
       elementwise: -self
     """, r"ops.yaml:4: .*declared twice \(first at line 2\)"),
    ("""
     - func: neg(Tensor self) -> Tensor
       elementwise: -self
       colour: blue
     """, r"ops.yaml:2: .*unknown key\(s\) colour"),
    ("""
     - func: neg(Tensor self) -> Tensor
       variants: [function, lambda]
       elementwise: -self
     """, r"ops.yaml:2: .*'variants' has unknown value 'lambda'"),
    ("""
     - func: neg(Tensor x) -> Tensor
       variants: [method]
       elementwise: -x
     """, r"ops.yaml:2: .*needs an argument named 'self'"),
    ("""
     - func: neg(Tensor self) -> Tensor
       dtype: complex
       elementwise: -self
     """, r"ops.yaml:2: .*'dtype' must be one of"),
    ("""
     - func: f(Tensor self) -> Tensor
       composite: |
         for i in range(3):
           pass
     """, r"ops.yaml:2: .*not allowed in a formula"),
    ("- [unclosed", r"ops.yaml:1: not valid YAML"),
])
def test_bad_tables_name_file_line_and_entry(tmp_path, text, message):
    with pytest.raises(TableError, match=message):
        _load(tmp_path, text)


def test_every_op_has_semantics_and_a_known_kind():
    from tracecomp.ops.numpy_kernels import KERNELS
    from tracecomp.ops.rules import RULES
    for op in TABLE.values():
        if op.kind not in ("composite", "region"):     # a region op's types come from its regions
            assert op.kind in RULES, f"{op.full_name}: no shape rule for kind {op.kind}"
            assert op.kind in KERNELS, f"{op.full_name}: no NumPy kernel for kind {op.kind}"


def test_choices_are_checked(tmp_path):
    with pytest.raises(TableError, match=r"ops.yaml:2: .*'choices' names 'mode', which is not a str argument"):
        _load(tmp_path, """
        - func: neg(Tensor self) -> Tensor
          choices: {mode: [a, b]}
          elementwise: -self
        """)
    import tracecomp as tc
    with pytest.raises(tc.ArgumentError, match="'approximate' must be one of 'none', 'tanh', got 'bogus'"):
        tc.gelu(tc.ones(2), approximate="bogus")
