"""Line charts as self-contained SVG text (no plotting library): the demo's loss curve.

`line_chart_svg(series, ...)` draws each `Series` as a polyline over shared axes with
"nice" tick values (1, 2 or 5 times a power of ten), a legend and a title.  The output is
plain SVG 1.1 that browsers and `xmllint` accept; all text is XML-escaped.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 50       # margins around the plot area


@dataclass(frozen=True)
class Series:
    label: str
    xs: list[float]
    ys: list[float]
    color: str = "#1f77b4"
    width: float = 1.5
    opacity: float = 1.0


def nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """About `count` round values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"nice_ticks: the range must be finite, got [{lo}, {hi}]")
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count - 1, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = [first]
    while ticks[-1] < hi - 1e-9 * step:
        ticks.append(round(first + len(ticks) * step, 12))
    return ticks


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.0e}"


def line_chart_svg(series: list[Series], title: str = "", xlabel: str = "", ylabel: str = "") -> str:
    points = [(x, y) for s in series for x, y in zip(s.xs, s.ys) if math.isfinite(y)]
    if not points:
        raise ValueError("line_chart_svg: no finite points to draw")
    xt = nice_ticks(min(p[0] for p in points), max(p[0] for p in points))
    yt = nice_ticks(min(0.0, min(p[1] for p in points)), max(p[1] for p in points))
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return TOP + ph - (y - y0) / (y1 - y0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>']
    for x in xt:
        out.append(f'<line x1="{sx(x):.1f}" y1="{TOP}" x2="{sx(x):.1f}" y2="{TOP + ph}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{sx(x):.1f}" y="{TOP + ph + 18}" text-anchor="middle">{_fmt(x)}</text>')
    for y in yt:
        out.append(f'<line x1="{LEFT}" y1="{sy(y):.1f}" x2="{LEFT + pw}" y2="{sy(y):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{LEFT - 8}" y="{sy(y) + 4:.1f}" text-anchor="end">{_fmt(y)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{HEIGHT - 10}" text-anchor="middle">{escape(xlabel)}</text>')
    out.append(f'<text x="18" y="{TOP + ph / 2}" text-anchor="middle" '
               f'transform="rotate(-90 18 {TOP + ph / 2})">{escape(ylabel)}</text>')
    for i, s in enumerate(series):
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in zip(s.xs, s.ys) if math.isfinite(y))
        out.append(f'<polyline fill="none" stroke="{s.color}" stroke-width="{s.width}" '
                   f'stroke-opacity="{s.opacity}" points="{coords}"/>')
        ly = TOP + 16 + 18 * i
        out.append(f'<line x1="{LEFT + pw - 170}" y1="{ly - 4}" x2="{LEFT + pw - 145}" y2="{ly - 4}" '
                   f'stroke="{s.color}" stroke-width="{max(s.width, 2)}"/>')
        out.append(f'<text x="{LEFT + pw - 138}" y="{ly}">{escape(s.label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_svg(folder: str, name: str, svg: str) -> str:
    """Write a picture the demos make into their output folder; its path."""
    import os
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(svg)
    return path
