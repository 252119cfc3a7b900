"""Line charts as inline SVG, drawn on the server: no script and no charting library in the browser.

:func:`line_chart` turns series of ``(x, y)`` points into one ``<svg>``: axes
with ticks and labels, one ``<polyline class="series ...">`` per series, and
horizontal reference lines (``<line class="rule ...">``, e.g. a memory budget).
Colours and line styles come from the dashboard's stylesheet, by class; the
chart uses no ``style`` attributes (the Content-Security-Policy forbids them).
Every piece of text is escaped, so a device's own strings cannot inject markup.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from html import escape
from typing import Callable, Sequence

from markupsafe import Markup

WIDTH, HEIGHT = 640, 240
LEFT, RIGHT, TOP, BOTTOM = 72, 16, 34, 36
MAX_DOTS = 60  # series with more points are drawn as a bare line
TITLE_CHAR, LEGEND_CHAR, LEGEND_ROW = 8, 7, 16  # pixels per character of the title and of the legend; a row


@dataclass(frozen=True)
class Series:
    """A named line: ``points`` are ``(x, y)``, ``x`` in Unix seconds; ``css`` picks its colour (``s1``..``s4``)."""

    name: str
    points: Sequence[tuple[float, float]]
    css: str = "s1"


@dataclass(frozen=True)
class Rule:
    """A horizontal reference line at ``y`` (a budget, a limit)."""

    name: str
    y: float
    css: str = "budget"


def line_chart(title: str, series: Sequence[Series], *, rules: Sequence[Rule] = (),
               y_format: Callable[[float], str] = lambda v: f"{v:g}", chart_id: str = "") -> Markup:
    """The chart as SVG markup; a chart with no points says so instead of drawing empty axes."""
    points = [p for s in series for p in s.points]
    parts = [_open(title, chart_id), f'<text class="chart-title" x="{LEFT}" y="18">{escape(title)}</text>']
    if not points:
        parts.append(f'<text class="empty" x="{WIDTH / 2:g}" y="{HEIGHT / 2:g}">no data yet</text></svg>')
        return Markup("".join(parts))
    x_lo, x_hi = _span([x for x, _ in points])
    y_lo, y_hi = _span([y for _, y in points] + [r.y for r in rules], from_zero=True)
    if not (math.isfinite(x_hi - x_lo) and math.isfinite(y_hi - y_lo)):  # stored before values were held to a
        parts.append(f'<text class="empty" x="{WIDTH / 2:g}" y="{HEIGHT / 2:g}">values out of range</text></svg>')
        return Markup("".join(parts))  # device's range: nothing a chart can draw
    y_ticks = nice_ticks(y_lo, y_hi) or [y_lo]
    y_lo, y_hi = min(y_lo, y_ticks[0]), max(y_hi, y_ticks[-1])
    legend, legend_rows = _legend(series, rules, title)
    scale = _Scale(x_lo, x_hi, y_lo, y_hi, TOP + LEGEND_ROW * (legend_rows - 1))
    parts += _axes(scale, y_ticks, y_format)
    parts += [_rule(scale, rule, y_format) for rule in rules]
    for s in series:
        parts += _series(scale, s)
    parts.append(legend)
    parts.append("</svg>")
    return Markup("".join(parts))


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering ``lo..hi``: steps of 1, 2 or 5 times a power of ten."""
    raw = (hi - lo) / max(count - 1, 1)
    if not (math.isfinite(raw) and raw > 0 and raw > abs(lo) * 1e-12):  # no span a float can step through
        return [t for t in (lo, hi) if math.isfinite(t)][:1 if lo == hi else 2]
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.floor(lo / step) * step
    ticks = [first]
    while ticks[-1] < hi - step * 1e-9 and len(ticks) <= 4 * count:
        ticks.append(ticks[-1] + step)
    return [round(t, 12) for t in ticks]


@dataclass(frozen=True)
class _Scale:
    x_lo: float
    x_hi: float
    y_lo: float
    y_hi: float
    top: float  # the plot's top edge: lower when the legend takes rows under the title

    def x(self, value: float) -> float:
        return LEFT + (value - self.x_lo) / (self.x_hi - self.x_lo) * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        return HEIGHT - BOTTOM - (value - self.y_lo) / (self.y_hi - self.y_lo) * (HEIGHT - self.top - BOTTOM)


def _span(values: list[float], from_zero: bool = False) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if from_zero and lo >= 0:
        lo = 0.0
    if hi - lo <= abs(hi) * 1e-9 or hi == lo:  # one value: give it room
        pad = abs(hi) * 0.1 or 1.0
        lo, hi = (lo if from_zero and lo == 0 else lo - pad), hi + pad
    return lo, hi


def _open(title: str, chart_id: str) -> str:
    ident = f' id="{escape(chart_id)}"' if chart_id else ""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart"{ident} viewBox="0 0 {WIDTH} {HEIGHT}" '
            f'role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>')


def _axes(scale: _Scale, y_ticks: list[float], y_format: Callable[[float], str]) -> list[str]:
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    out = [f'<line class="axis" x1="{LEFT}" y1="{scale.top}" x2="{LEFT}" y2="{bottom}"/>',
           f'<line class="axis" x1="{LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}"/>']
    for tick in y_ticks:
        y = scale.y(tick)
        out.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}"/>')
        out.append(f'<text class="tick y-tick" x="{LEFT - 6}" y="{y + 4:.1f}">{escape(y_format(tick))}</text>')
    x_format = _clock_format(scale.x_hi - scale.x_lo)
    for k in range(5):
        value = scale.x_lo + k * (scale.x_hi - scale.x_lo) / 4
        edge = " last" if k == 4 else ""  # anchored at its end, so it stays inside the chart
        out.append(f'<text class="tick x-tick{edge}" x="{scale.x(value):.1f}" y="{bottom + 18}">'
                   f'{escape(time.strftime(x_format, time.localtime(value)))}</text>')
    return out


def _clock_format(span_seconds: float) -> str:
    if span_seconds < 3600:
        return "%H:%M:%S"
    return "%H:%M" if span_seconds < 86400 else "%d %b %H:%M"


def _rule(scale: _Scale, rule: Rule, y_format: Callable[[float], str]) -> str:
    y = scale.y(rule.y)
    label = f"{rule.name} {y_format(rule.y)}"
    return (f'<line class="rule {escape(rule.css)}" data-rule="{escape(rule.name)}" x1="{LEFT}" y1="{y:.1f}" '
            f'x2="{WIDTH - RIGHT}" y2="{y:.1f}"/>'
            f'<text class="rule-label {escape(rule.css)}" x="{WIDTH - RIGHT - 4}" y="{y - 4:.1f}">'
            f'{escape(label)}</text>')


def _series(scale: _Scale, series: Series) -> list[str]:
    if not series.points:
        return []
    coordinates = " ".join(f"{scale.x(x):.1f},{scale.y(y):.1f}" for x, y in sorted(series.points))
    css = escape(series.css)
    out = [f'<polyline class="series {css}" data-series="{escape(series.name)}" points="{coordinates}"/>']
    if len(series.points) <= MAX_DOTS:
        out += [f'<circle class="dot {css}" cx="{scale.x(x):.1f}" cy="{scale.y(y):.1f}" r="2.5"/>'
                for x, y in series.points]
    return out


def _legend(series: Sequence[Series], rules: Sequence[Rule], title: str) -> tuple[str, int]:
    """The legend, right-aligned beside the title, in as many rows as it needs to stay clear of it; and how
    many rows that is."""
    items = [(s.name, f"series {s.css}") for s in series] + [(r.name, f"rule {r.css}") for r in rules]
    title_end = LEFT + TITLE_CHAR * len(title) + 16
    out, x, row = ['<g class="legend">'], WIDTH - RIGHT, 0
    for name, css in reversed(items):
        width = LEGEND_CHAR * len(name) + 26
        if x - width < (title_end if row == 0 else LEFT) and x < WIDTH - RIGHT:
            x, row = WIDTH - RIGHT, row + 1
        x -= width
        y = 18 + LEGEND_ROW * row
        out.append(f'<line class="{escape(css)}" x1="{x}" y1="{y - 4}" x2="{x + 16}" y2="{y - 4}"/>'
                   f'<text class="legend-label" x="{x + 20}" y="{y}">{escape(name)}</text>')
    out.append("</g>")
    return "".join(out), row + 1
