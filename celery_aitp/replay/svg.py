"""Small, dependency-free SVG line charts (for self-contained reports and the docs' images)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#7f7f7f")
FONT = 'font-family="system-ui, -apple-system, Segoe UI, sans-serif"'


@dataclass(frozen=True)
class Line:
    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    color: str
    dashed: bool = False


@dataclass(frozen=True)
class Axes:
    title: str
    x_label: str
    y_label: str
    x_log: bool = False
    x_range: tuple[float, float] | None = None
    y_range: tuple[float, float] | None = None
    legend_left: bool = False  # legend in the top-left corner instead of the top-right


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 5 x 10^k steps) covering [lo, hi]."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [round(first + k * step, 10) for k in range(int((hi - first) / step + 1e-9) + 1)]


def log_ticks(lo: float, hi: float) -> list[float]:
    return [10.0 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
            if lo <= 10.0 ** k <= hi]


def fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) < 0.01:
        return f"{value:.0e}".replace("e-0", "e-")
    return f"{value:g}"


def _bounds(lines: Sequence[Line], axes: Axes) -> tuple[float, float, float, float]:
    xs = [x for line in lines for x in line.xs if not axes.x_log or x > 0]
    ys = [y for line in lines for y in line.ys]
    x0, x1 = axes.x_range or ((min(xs), max(xs)) if xs else (0.0, 1.0))
    y0, y1 = axes.y_range or ((0.0, max(ys) * 1.05 if ys and max(ys) > 0 else 1.0))
    if x1 <= x0:
        x1 = x0 * 10 if axes.x_log else x0 + 1
    return x0, x1, y0, y1


def chart(lines: Sequence[Line], axes: Axes, width: int = 380, height: int = 240) -> str:
    """One chart as an ``<svg>`` element with axes, ticks, lines and a legend."""
    left, right, top, bottom = 52, 12, 26, 40
    pw, ph = width - left - right, height - top - bottom
    x0, x1, y0, y1 = _bounds(lines, axes)
    if axes.x_log:
        lx0, lx1 = math.log10(x0), math.log10(x1)

        def sx(x: float) -> float:
            return left + (math.log10(max(x, x0)) - lx0) / (lx1 - lx0) * pw
    else:
        def sx(x: float) -> float:
            return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (min(max(y, y0), y1) - y0) / (y1 - y0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" {FONT} font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="16" font-size="13" font-weight="600">{escape(axes.title)}</text>']
    for x in (log_ticks(x0, x1) if axes.x_log else nice_ticks(x0, x1)):
        px = sx(x)
        out.append(f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{top + ph}" '
                   'stroke="#e5e5e5"/>')
        out.append(f'<text x="{px:.1f}" y="{top + ph + 14}" text-anchor="middle" '
                   f'fill="#555">{fmt(x)}</text>')
    for y in nice_ticks(y0, y1, 4):
        py = sy(y)
        out.append(f'<line x1="{left}" y1="{py:.1f}" x2="{left + pw}" y2="{py:.1f}" '
                   'stroke="#e5e5e5"/>')
        out.append(f'<text x="{left - 5}" y="{py + 4:.1f}" text-anchor="end" '
                   f'fill="#555">{fmt(y)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" '
               'stroke="#999"/>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 6}" text-anchor="middle" '
               f'fill="#333">{escape(axes.x_label)}</text>')
    out.append(f'<text transform="translate(12,{top + ph / 2}) rotate(-90)" '
               f'text-anchor="middle" fill="#333">{escape(axes.y_label)}</text>')
    for line in lines:
        pairs = zip(line.xs, line.ys, strict=True)
        points = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pairs if not axes.x_log or x > 0)
        if points:
            dash = ' stroke-dasharray="5,3"' if line.dashed else ""
            out.append(f'<polyline points="{points}" fill="none" stroke="{line.color}" '
                       f'stroke-width="1.6"{dash}/>')
    lx = left + 8 if axes.legend_left else left + pw - 92
    for k, line in enumerate(lines):
        ly = top + 12 + 14 * k
        dash = ' stroke-dasharray="5,3"' if line.dashed else ""
        out.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 16}" y2="{ly - 4}" '
                   f'stroke="{line.color}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{lx + 20}" y="{ly}" fill="#333">{escape(line.label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def grid(charts: Sequence[str], columns: int, width: int = 380, height: int = 240) -> str:
    """Charts side by side in one ``<svg>`` (rows of ``columns``)."""
    rows = math.ceil(len(charts) / columns) if charts else 1
    total_w, total_h = width * min(columns, max(1, len(charts))), height * rows
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{total_h}" '
           f'viewBox="0 0 {total_w} {total_h}">']
    for k, svg in enumerate(charts):
        x, y = (k % columns) * width, (k // columns) * height
        out.append(f'<g transform="translate({x},{y})">{svg}</g>')
    out.append("</svg>")
    return "\n".join(out)
