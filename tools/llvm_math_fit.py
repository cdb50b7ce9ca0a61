"""Offline generator of the polynomial tables in `llvm/math/coeffs.py` (not imported at run time).

Each table is a weighted minimax fit found by the Remez exchange algorithm, computed in
x87 extended precision (numpy.longdouble, 64-bit significand), so the fitted
polynomials are exact to about 2**-62 before their coefficients are rounded to the target
format. Reference functions come from the long-double libm behind numpy (expl, logl,
sinl, atanl, ...) and, for erf/erfc, from series and continued fractions evaluated here.

Run `python tools/llvm_math_fit.py > tracecomp/lower/llvm/math/coeffs.py`
to regenerate; it prints each fit's error bound (before and after rounding) to stderr.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

LD = np.longdouble
PI = LD("3.14159265358979323846264338327950288")


def _solve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Gaussian elimination with partial pivoting in long double (numpy.linalg is double only)."""
    a, b = a.copy(), b.copy()
    n = len(b)
    for i in range(n):
        p = i + int(np.argmax(np.abs(a[i:, i])))
        a[[i, p]], b[[i, p]] = a[[p, i]], b[[p, i]]
        f = a[i + 1:, i] / a[i, i]
        a[i + 1:] -= f[:, None] * a[i]
        b[i + 1:] -= f * b[i]
    x = np.zeros(n, dtype=LD)
    for i in reversed(range(n)):
        x[i] = (b[i] - a[i, i + 1:] @ x[i + 1:]) / a[i, i]
    return x


@dataclass(frozen=True)
class Fit:
    """Approximate g(t) on [lo, hi] by sum(c_i * t**powers[i]), minimizing max |w(t) (g - p)|."""
    name: str
    g: Callable[[np.ndarray], np.ndarray]
    w: Callable[[np.ndarray], np.ndarray]
    lo: float
    hi: float
    powers: tuple[int, ...]


def _extrema(t: np.ndarray, err: np.ndarray, n: int) -> np.ndarray:
    """Indices of n alternating-sign local extrema of err with the largest magnitudes."""
    sign = np.sign(err)
    idx, start = [], 0
    for i in range(1, len(t) + 1):
        if i == len(t) or sign[i] != sign[start]:
            idx.append(start + int(np.argmax(np.abs(err[start:i]))))
            start = i
    while len(idx) > n:
        # drop the smallest extremum; its two neighbours then share a sign: keep the larger
        j = min(range(len(idx)), key=lambda i: abs(err[idx[i]]))
        idx.pop(j)
        if 0 < j < len(idx):
            idx.pop(j if abs(err[idx[j]]) < abs(err[idx[j - 1]]) else j - 1)
    return np.array(idx)


def remez(fit: Fit, fixed: tuple = (), iters: int = 30, grid: int = 20000) -> tuple[np.ndarray, float]:
    """Coefficients (long double) and the max weighted error of the fit, the first ones `fixed`."""
    nf = len(fixed)
    powers = fit.powers[nf:]
    n = len(powers)
    lo, hi = LD(fit.lo), LD(fit.hi)
    k = np.arange(n + 1, dtype=LD)
    ref = (lo + hi) / 2 - (hi - lo) / 2 * np.cos(PI * k / n)
    u = np.linspace(0, 1, grid, dtype=LD)
    tg = lo + (hi - lo) * (1 - np.cos(PI * u)) / 2
    gfix = lambda t: fit.g(t) - sum(LD(c) * t ** p for c, p in zip(fixed, fit.powers))
    gg, wg = gfix(tg), fit.w(tg)
    best = None
    for _ in range(iters):
        a = np.stack([ref ** p for p in powers] + [(-1.0) ** k / fit.w(ref)], axis=1).astype(LD)
        sol = _solve(a, gfix(ref).astype(LD))
        c = sol[:n]
        err = wg * (gg - sum(ci * tg ** p for ci, p in zip(c, powers)))
        emax = float(np.max(np.abs(err)))
        if best is None or emax < best[1]:
            best = (c, emax)
        ix = _extrema(tg, err, n + 1)
        if len(ix) < n + 1:
            break
        ref = tg[ix]
    return best


def fit_rounded(fit: Fit, np_t) -> tuple[list[float], float, float]:
    """Round coefficients one at a time, refitting the rest after each (keeps the minimax error)."""
    c, e0 = remez(fit)
    plain = [float(np_t(x)) for x in c]
    fixed: list[float] = []
    while len(fixed) < len(fit.powers):
        c, _ = remez(fit, tuple(fixed))
        fixed.append(float(np_t(c[0])))
    e_plain, e_fixed = max_error(fit, plain), max_error(fit, fixed)
    return (plain, e0, e_plain) if e_plain <= e_fixed else (fixed, e0, e_fixed)


def max_error(fit: Fit, coeffs, grid: int = 100000) -> float:
    t = np.linspace(fit.lo, fit.hi, grid, dtype=LD)
    p = sum(LD(float(c)) * t ** q for c, q in zip(coeffs, fit.powers))
    return float(np.max(np.abs(fit.w(t) * (fit.g(t) - p))))


# ----------------------------------------------------------------- reference functions
def erf_ld(x: np.ndarray) -> np.ndarray:
    """erf in long double: exp(-x^2) * sum 2^n x^(2n+1) / (1*3*...*(2n+1)); no cancellation."""
    x = np.asarray(x, dtype=LD)
    term, total = x.copy(), x.copy()
    for n in range(1, 400):
        term = term * 2 * x * x / (2 * n + 1)
        total += term
    return 2 / np.sqrt(PI) * np.exp(-x * x) * total


def erfcx_ld(x: np.ndarray) -> np.ndarray:
    """exp(x^2) erfc(x) for x >= 1 by the continued fraction 1/(x+ (1/2)/(x+ 1/(x+ ...)))."""
    x = np.asarray(x, dtype=LD)
    k = np.zeros_like(x)
    for n in range(1000, 0, -1):
        k = (LD(n) / 2) / (x + k)
    return 1 / (np.sqrt(PI) * (x + k))


def _series(t: np.ndarray, coef: Callable[[int], LD], terms: int = 60) -> np.ndarray:
    """sum coef(n) t^n: the fitted functions as power series, free of cancellation."""
    t = np.asarray(t, dtype=LD)
    out = np.zeros_like(t)
    for n in reversed(range(terms)):
        out = out * t + coef(n)
    return out


def _fact(n: int) -> LD:
    return LD(math.factorial(n))


def fits_for(fmt: str) -> list[tuple[Fit, str]]:
    """The fits, their degrees chosen per format to reach about 2**-28 (f32) / 2**-58 (f64)."""
    f32 = fmt == "f32"
    one = lambda t: np.ones_like(t)
    ln2 = np.log(LD(2))
    deg = (lambda a, b: a if f32 else b)
    rexp = float(ln2 / 2 * LD(1.0005))
    zlog = float(((np.sqrt(LD(2)) - 1) / (np.sqrt(LD(2)) + 1)) ** 2 * LD(1.001))
    z4 = float((PI / 4 * LD(1.002)) ** 2)
    zt = float((np.sqrt(LD(2)) - 1) ** 2 * LD(1.001))
    sin_r = lambda z: _series(z, lambda n: (-1) ** n / _fact(2 * n + 1))        # sin(r)/r
    atan_r = lambda z: _series(z, lambda n: LD((-1) ** n) / (2 * n + 1), 90)    # atan(u)/u
    c0 = 2 / np.sqrt(PI)
    return [
        # exp: e^r = 1 + r + r^2 Q(r), |r| <= ln2/2; relative error.
        (Fit("exp", lambda r: _series(r, lambda n: 1 / _fact(n + 2)), lambda r: r * r / np.exp(r),
             -rexp, rexp, tuple(range(deg(5, 11)))), "Q"),
        # exp2: 2^r = 1 + r Q(r), |r| <= 1/2.
        (Fit("exp2", lambda r: _series(r, lambda n: ln2 ** (n + 1) / _fact(n + 1)),
             lambda r: np.abs(r) / np.exp2(r), -0.5005, 0.5005, tuple(range(deg(6, 12)))), "Q"),
        # expm1: e^r - 1 = r + r^2/2 + r^3 Q(r); relative to expm1(r) ~ r.
        (Fit("expm1", lambda r: _series(r, lambda n: 1 / _fact(n + 3)),
             lambda r: r * r / _series(r, lambda n: 1 / _fact(n + 1)), -rexp, rexp, tuple(range(deg(5, 10)))), "Q"),
        # log: log(1+f) = f - f^2/2 + s (f^2/2 + z P(z)), s = f/(2+f), z = s^2: 2 atanh(s) = 2s + s z P(z).
        (Fit("log", lambda z: _series(z, lambda n: LD(2) / (2 * n + 3)), lambda z: z, zlog * 1e-4, zlog,
             tuple(range(deg(3, 7)))), "P"),
        # pow's log(m) = 2s + 2s^3/3 + s^5 L(s^2), the first two terms in double-double.
        (Fit("log_pow", lambda z: _series(z, lambda n: LD(2) / (2 * n + 5)), one, 0.0, zlog,
             tuple(range(deg(3, 8)))), "L"),
        # sin(r) = r + r^3 S(r^2), cos(r) = 1 - r^2/2 + r^4 C(r^2), |r| <= pi/4.
        (Fit("sin", lambda z: _series(z, lambda n: (-1) ** (n + 1) / _fact(2 * n + 3)), lambda z: z / sin_r(z),
             z4 * 1e-4, z4, tuple(range(deg(4, 6)))), "S"),
        (Fit("cos", lambda z: _series(z, lambda n: (-1) ** n / _fact(2 * n + 4)), lambda z: z * z / np.cos(np.sqrt(z)),
             z4 * 1e-4, z4, tuple(range(deg(3, 6)))), "C"),
        # atan(u) = u + u^3 A(u^2), |u| <= tan(pi/8).
        (Fit("atan", lambda z: _series(z, lambda n: LD((-1) ** (n + 1)) / (2 * n + 3), 90), lambda z: z / atan_r(z),
             zt * 1e-4, zt, tuple(range(deg(6, 12)))), "A"),
        # erf(x) = x + x P(x^2) on |x| <= 1; relative to erf(x).
        (Fit("erf_small", lambda z: c0 * _series(z, lambda n: LD((-1) ** n) / (_fact(n) * (2 * n + 1))) - 1,
             lambda z: 1 / (c0 * _series(z, lambda n: LD((-1) ** n) / (_fact(n) * (2 * n + 1)))), 0.0, 1.0,
             tuple(range(deg(8, 14)))), "P"),
    ]


ERF_PIECES = {"f32": [(1.0, 2.0), (2.0, 3.92)], "f64": [(1.0, 1.75), (1.75, 2.75), (2.75, 4.0), (4.0, 5.95)]}


def erf_large_fits(fmt: str) -> list[tuple[Fit, str]]:
    """erfc(x) e^{x^2} on [1, xmax] in pieces, each a polynomial in (x - mid); past xmax
    (erfc < 2^-(p+2)) erf rounds to 1."""
    pieces = ERF_PIECES[fmt]
    out = []
    for i, (a, b) in enumerate(pieces):
        mid = (a + b) / 2
        out.append((Fit(f"erfc{i}", lambda t, mid=mid: erfcx_ld(t + LD(mid)),
                        lambda t, mid=mid: 1 / erfcx_ld(t + LD(mid)), a - mid, b - mid,
                        tuple(range(10 if fmt == "f32" else 17))), f"{a!r}, {b!r}"))
    return out


def main() -> None:
    print('"""Polynomial coefficients for llvm/math (generated by tools/llvm_math_fit.py; do not edit).')
    print()
    print("Each entry: name -> (coefficients lowest power first, bound on the weighted fit error")
    print('after rounding the coefficients). See tools/llvm_math_fit.py for the forms being fitted."""')
    print()
    for fmt, np_t in (("f32", np.float32), ("f64", np.float64)):
        print(f"{fmt.upper()} = {{")
        for fit, note in fits_for(fmt) + erf_large_fits(fmt):
            rc, e, er = fit_rounded(fit, np_t)
            print(f"{fmt} {fit.name}: remez {e:.3g} (2^{np.log2(e):.1f}) rounded {er:.3g} (2^{np.log2(er):.1f})",
                  file=sys.stderr)
            if fit.name.startswith("erfc"):   # note: the piece's interval (a, b) in x
                print(f"    {fit.name!r}: ({rc!r}, {er:.3g}, {note}),")
            else:
                print(f"    {fit.name!r}: ({rc!r}, {er:.3g}),  # {note}")
        print("}")
        print()


if __name__ == "__main__":
    main()
