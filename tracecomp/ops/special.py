"""Special functions, written once over a backend's scalar primitives `P` (NumPy ufuncs
eagerly, loop-IR builders when compiling), so the eager, CPU and PTX results come from one
algorithm.  Table formulas call them by the names in SPECIAL.  Each works in float64 (a
float32 argument is widened first; the result is rounded back by the op's dtype rule).

- log_gamma: Lanczos's approximation (g = 7, nine coefficients, as tabulated by Godfrey)
  for x >= 1/2, and the reflection log|Gamma(x)| = log(pi / |sin(pi x)|) - log|Gamma(1 - x)|
  below, with sin(pi x) reduced exactly to sin(pi r), r = x - round(x);
- polygamma_series: psi^(n) by the recurrence to x + 10, then the asymptotic (Bernoulli)
  series there; reflection below 1/2 through the n-th derivative of pi cot(pi x), whose
  polynomial in cot is built by differentiating (Q_{k+1} = -Q_k'(c) (1 + c^2));
- erf_complement: 1 - erf(x) below 3 (relative error under 1e-11 there), and Laplace's
  continued fraction exp(-x^2) / (sqrt(pi) (x + 1/2 / (x + 1 / (x + 3/2 / ...)))) above;
- erf_inverse: Winitzki's closed form (relative error about 2e-3) refined by two Halley
  steps on erf(y) = |x| (cubic convergence: 1e-16 after two), or on erfc(y) = 1 - |x|
  above 1/2, where erf's absolute rounding would swamp the tiny slope.
"""
from __future__ import annotations

import math
from typing import Any

_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
            -176.61502916214059, 12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6,
            1.5056327351493116e-7)
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
_SHIFT = 10                                  # the asymptotic series starts at x + _SHIFT
_BERNOULLI = (1 / 6, -1 / 30, 1 / 42, -1 / 30, 5 / 66, -691 / 2730, 7 / 6, -3617 / 510)   # B2, B4, ...
_CF_TERMS = 25                               # 4e-15 relative from x = 3 up
_ERF_SWITCH = 3.0


def _reduced(P, x):
    """r = x - round(x) in [-1/2, 1/2]: sin(pi x) = +-sin(pi r), cot(pi x) = cot(pi r)."""
    return x - P["round"](x)


def log_gamma(P, x):
    x = P["float64"](x)
    reflect = x < 0.5
    z = P["where"](reflect, 1.0 - x, x) - 1.0
    series = _LANCZOS[0]
    for i, c in enumerate(_LANCZOS[1:], 1):
        series = series + c / (z + i)
    t = z + 7.5
    positive = _HALF_LOG_2PI + (z + 0.5) * P["log"](t) - t + P["log"](series)
    reflected = P["log"](math.pi / P["abs"](P["sin"](math.pi * _reduced(P, x)))) - positive
    out = P["where"](reflect, reflected, positive)
    return P["where"](P["abs"](x) == math.inf, math.inf, out)


def _polygamma_at_least_half(P, n: int, y):
    """psi^(n)(y) for y >= 1/2: shifted up by _SHIFT, then the asymptotic series."""
    sign = -1.0 if n % 2 == 0 else 1.0       # (-1)^(n+1)
    fact = math.factorial(n)
    shifted = 0.0
    for k in range(_SHIFT):
        shifted = shifted + 1.0 / (y + k) ** (n + 1)
    w = y + _SHIFT
    inv = 1.0 / w
    if n == 0:
        tail = P["log"](w) - 0.5 * inv
        for j, b in enumerate(_BERNOULLI, 1):
            tail = tail - b / (2 * j) * inv ** (2 * j)
    else:
        tail = math.factorial(n - 1) * inv ** n + fact / 2 * inv ** (n + 1)
        for j, b in enumerate(_BERNOULLI, 1):
            tail = tail + b * math.factorial(2 * j + n - 1) / math.factorial(2 * j) * inv ** (2 * j + n)
        tail = sign * tail
    return tail + sign * fact * shifted


def _cot_derivative(n: int) -> list[float]:
    """Coefficients (by power of c) of Q_n with d^n/dx^n cot(pi x) = pi^n Q_n(cot(pi x))."""
    q = [0.0, 1.0]
    for _ in range(n):
        dq = [k * q[k] for k in range(1, len(q))]              # Q'
        nxt = [0.0] * (len(dq) + 2)
        for k, a in enumerate(dq):                              # -Q' (1 + c^2)
            nxt[k] -= a
            nxt[k + 2] -= a
        q = nxt
    return q


def polygamma_series(P, n: int, x):
    """psi^(n)(x) = d^(n+1)/dx^(n+1) log Gamma(x); n = 0 is digamma."""
    x = P["float64"](x)
    reflect = x < 0.5
    value = _polygamma_at_least_half(P, n, P["where"](reflect, 1.0 - x, x))
    r = _reduced(P, x)
    c = P["cos"](math.pi * r) / P["sin"](math.pi * r)
    poly = 0.0
    for a in reversed(_cot_derivative(n)):
        poly = poly * c + a
    reflected = (-1.0) ** n * value - math.pi ** (n + 1) * poly
    out = P["where"](reflect, reflected, value)
    pole = (x <= 0) & (x == P["floor"](x))
    if n == 0:     # as PyTorch: -inf at +0, +inf at -0, NaN at the negative integers and -inf
        out = P["where"](pole, P["where"](x == 0, -1.0 / x, math.nan), out)
        return P["where"](x == -math.inf, math.nan, out)
    return P["where"](pole, (-1.0) ** (n + 1) * math.inf, out)


def erf_complement(P, x):
    x = P["float64"](x)
    big = P["maximum"](x, _ERF_SWITCH)
    f = big
    for k in range(_CF_TERMS, 0, -1):
        f = big + (k / 2) / f
    tail = P["exp"](-big * big) / (math.sqrt(math.pi) * f)
    return P["where"](x < _ERF_SWITCH, 1.0 - P["erf"](x), tail)


def erf_inverse(P, x):
    """On |x|; above 1/2 the residual is taken as (1 - |x|) - erfc(y), exact in its first
    term, so the answer stays accurate as |x| approaches 1."""
    x = P["float64"](x)
    a = 0.147
    ax = P["where"](P["abs"](x) < 1, P["abs"](x), 0.0)
    ln = P["log"](1.0 - ax * ax)
    first = 2 / (math.pi * a) + ln / 2
    y = P["sqrt"](P["sqrt"](first * first - ln / a) - first)
    near_one = ax > 0.5
    for _ in range(2):
        f = P["where"](near_one, (1.0 - ax) - erf_complement(P, y), P["erf"](y) - ax)
        slope = 2 / math.sqrt(math.pi) * P["exp"](-y * y)
        y = y - f / (slope + y * f)
    edge = P["where"](x == 1, math.inf, P["where"](x == -1, -math.inf, math.nan))
    return P["where"](P["abs"](x) < 1, P["sign"](x) * y, edge)


SPECIAL: dict[str, Any] = {"log_gamma": log_gamma, "polygamma_series": polygamma_series,
                           "erf_complement": erf_complement, "erf_inverse": erf_inverse}
