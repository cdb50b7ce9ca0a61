"""einsum: any subscripts, as diagonals, sums, permutes, reshapes and batched matmuls.

`parse` turns the equation and the operands' ranks into one subscript string per operand
and one for the output (an ellipsis becomes fresh upper-case letters, aligned from the
right as broadcasting aligns dims; without `->`, the output is the letters used once, in
alphabetical order, after the ellipsis's).  `contract` then works on tensors:
1. an operand that repeats a letter takes the diagonal (`ii->i`);
2. a letter that no other operand and not the output uses is summed away at once;
3. operands are contracted left to right: for operands with letters A and B, a letter of
   both that is still needed later (by the output or a later operand) is a batch dim,
   one that is not is summed by the product, and the rest are free on either side; each
   side is permuted to (batch, free, summed), reshaped to 3 dims and multiplied with the
   packed matmul kernel (batch dims broadcast, as matmul's do);
4. the result is permuted to the output's order (and summed over what is left).
Size-1 dims broadcast against the same letter's size in other operands, as in PyTorch.
"""
from __future__ import annotations

import math
import string

from ..core.errors import ShapeError
from ..dispatch import api as tc


def _letters_of(term: str, ndim: int, fresh: str, where: str) -> str:
    if term.count("...") > 1 or "." in term.replace("...", ""):
        raise ShapeError(f"einsum: {where} '{term}' has a malformed ellipsis")
    bad = [c for c in term.replace("...", "") if c not in string.ascii_letters]
    if bad:
        raise ShapeError(f"einsum: {where} '{term}' uses {bad[0]!r}; subscripts are letters a-z and A-Z")
    if "..." in term:
        named = len(term) - 3
        if ndim < named:
            raise ShapeError(f"einsum: {where} '{term}' names {named} dims, but the operand has {ndim}")
        return term.replace("...", fresh[len(fresh) - (ndim - named):] if ndim > named else "")
    if len(term) != ndim:
        raise ShapeError(f"einsum: {where} '{term}' has {len(term)} subscripts, but the operand has {ndim} dims")
    return term


def parse(equation: str, ndims: list[int]) -> tuple[list[str], str]:
    """One letter string per operand and one for the output (see the module docstring)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ndims):
        raise ShapeError(f"einsum: '{equation}' has {len(terms)} operand subscripts, but {len(ndims)} "
                         f"operands were given")
    used = set(eq) & set(string.ascii_letters)
    spare = [c for c in string.ascii_uppercase[::-1] + string.ascii_lowercase[::-1] if c not in used]
    width = max((n - (len(t) - 3) for t, n in zip(terms, ndims) if "..." in t), default=0)
    fresh = "".join(reversed(spare[:width]))         # the ellipsis's letters, in dim order
    inputs = [_letters_of(t, n, fresh, f"operand {i} subscripts") for i, (t, n) in enumerate(zip(terms, ndims))]
    if arrow:
        ndim = len(rhs.replace("...", "")) + (width if "..." in rhs else 0)
        output = _letters_of(rhs, ndim, fresh, "output subscripts")
        if len(set(output)) != len(output):
            raise ShapeError(f"einsum: output subscripts '{rhs}' repeat a letter")
        missing = [c for c in output if not any(c in s for s in inputs)]
        if missing:
            raise ShapeError(f"einsum: output subscript {missing[0]!r} appears in no operand")
    else:
        counts = {c: sum(s.count(c) for s in inputs) for c in set("".join(inputs))}
        output = fresh + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in fresh))
    return inputs, output


def _sizes(inputs: list[str], shapes: list[tuple]) -> dict[str, int]:
    """Each letter's size; size-1 dims broadcast."""
    sizes: dict[str, int] = {}
    for k, (s, shape) in enumerate(zip(inputs, shapes)):
        for c, n in zip(s, shape):
            old = sizes.get(c, 1)
            if n != 1 and old != 1 and n != old:
                raise ShapeError(f"einsum: subscript {c!r} has size {old} in one place and {n} in "
                                 f"operand {k} of shape {tuple(shape)}")
            sizes[c] = max(old, n) if c in sizes else n
    return sizes


def contract(equation: str, operands: list):
    inputs, output = parse(equation, [t.ndim for t in operands])
    if len({t.dtype for t in operands}) == 1 and operands[0].dtype.is_half and _sums_alone(inputs, output):
        # such a sum runs in float32 and rounds once with the products' float32 sums (a half
        # sum fed to the product missed the gradient by 2.7e-2 on OpInfo's bf16 '...ik,...j->ij')
        return contract(equation, [t.to(tc.float32) for t in operands]).to(operands[0].dtype)
    sizes = _sizes(inputs, [tuple(t.shape) for t in operands])
    terms = []
    for x, s in zip(operands, inputs):
        while len(set(s)) < len(s):                  # a repeated letter: its diagonal
            c = next(c for c in s if s.count(c) > 1)
            i, j = s.index(c), s.index(c, s.index(c) + 1)
            x = tc.diagonal(x, 0, i, j)
            s = s[:i] + s[i + 1:j] + s[j + 1:] + c
        terms.append((x, s))

    def needed(skip: set[int]) -> set[str]:
        return set(output).union(*(set(s) for k, (_, s) in enumerate(terms) if k not in skip))

    for k, (x, s) in enumerate(terms):               # letters only this operand has: sum them now
        keep = needed({k})
        lone = [i for i, c in enumerate(s) if c not in keep]
        if lone:
            terms[k] = (x.sum(lone), "".join(c for c in s if c in keep))
    x, s = terms[0]
    for k in range(1, len(terms)):
        y, t = terms[k]
        later = set(output).union(*(set(u) for _, u in terms[k + 1:]))
        x, s = _pair(x, s, y, t, later, sizes)
    extra = [i for i, c in enumerate(s) if c not in output]
    if extra:
        x, s = x.sum(extra), "".join(c for c in s if c in output)
    x = x.permute([s.index(c) for c in output]) if s != output else x
    return x.expand([sizes[c] for c in output]) if list(x.shape) != [sizes[c] for c in output] else x


def _sums_alone(inputs: list[str], output: str) -> bool:
    """Whether a letter of one operand only, and not of the output, is summed outside a product."""
    return any(c not in output and sum(c in t for t in inputs) == 1 for s in inputs for c in s)


def _pair(x, s: str, y, t: str, later: set, sizes: dict):
    """Contract two operands; letters in `later` stay."""
    batch = [c for c in s if c in t and c in later]
    summed = [c for c in s if c in t and c not in later]
    free_x = [c for c in s if c not in t]
    free_y = [c for c in t if c not in s]

    def arrange(z, letters: str, order: list[str], shape: list[int]):
        z = z.permute([letters.index(c) for c in order])
        return z.reshape(shape)
    x, y = _broadcast_summed(x, s, y, t, summed, sizes)
    nb = [max(x.shape[s.index(c)], y.shape[t.index(c)]) for c in batch]
    dx, dy = [x.shape[s.index(c)] for c in free_x], [y.shape[t.index(c)] for c in free_y]
    m = math.prod(sizes[c] for c in summed)
    a = arrange(x, s, batch + free_x + summed, [x.shape[s.index(c)] for c in batch] + [math.prod(dx), m])
    b = arrange(y, t, batch + summed + free_y, [y.shape[t.index(c)] for c in batch] + [m, math.prod(dy)])
    return (a @ b).reshape(nb + dx + dy), "".join(batch + free_x + free_y)


def _broadcast_summed(x, s: str, y, t: str, summed: list[str], sizes: dict):
    """A summed letter of size 1 on one side only: expand it (the product sums over it)."""
    def full(z, letters):
        shape = [sizes[c] if c in summed else n for c, n in zip(letters, z.shape)]
        return z.expand(shape) if shape != list(z.shape) else z
    return full(x, s), full(y, t)


def tensordot(a, b, dims_a, dims_b):
    """a's dims_a against b's dims_b, as the einsum that says so (a size-1 dim against a
    longer one is summed out of the other side first, as in PyTorch)."""
    if len(dims_a) != len(dims_b):
        raise ShapeError(f"tensordot: dims_self {tuple(dims_a)} and dims_other {tuple(dims_b)} must have "
                         f"the same length")
    da = [_axis(d, a.shape, "dims_self") for d in dims_a]
    db = [_axis(d, b.shape, "dims_other") for d in dims_b]
    if len(set(da)) < len(da) or len(set(db)) < len(db):
        raise ShapeError(f"tensordot: dims_self {tuple(dims_a)} or dims_other {tuple(dims_b)} repeat a dim")
    for i, j in zip(da, db):
        if a.shape[i] != b.shape[j] and 1 not in (a.shape[i], b.shape[j]):
            raise ShapeError(f"tensordot: dim {i} of self {a.shape} and dim {j} of other {b.shape} differ in size")
    letters = iter(string.ascii_letters)
    sa = [next(letters) for _ in range(a.ndim)]
    sb = [sa[da[db.index(j)]] if j in db else next(letters) for j in range(b.ndim)]
    out = [c for d, c in enumerate(sa) if d not in da] + [c for j, c in enumerate(sb) if j not in db]
    return contract(f"{''.join(sa)},{''.join(sb)}->{''.join(out)}", [a, b])


def _axis(d: int, shape: tuple, what: str) -> int:
    if not -len(shape) <= d < max(len(shape), 1):
        raise ShapeError(f"tensordot: {what} names dim {d}, out of range for shape {tuple(shape)}")
    return d % max(len(shape), 1)
