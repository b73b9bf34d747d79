"""The overview's charts laid out as numbers: where each bar, line, tick and label goes in an SVG.

Pure arithmetic, no I/O and no markup: the template draws what :func:`stacked_bars`
and :func:`line_chart` return, and the tests check the layout without a browser.
The x axis is one slot per minute of the window, the last closed minute at the
right; a minute without a sample is left empty (no bar; a line breaks there)
rather than drawn as zero, which it may not have been.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Optional, Sequence

#: The SVG's own units; it is scaled to the page's width.
WIDTH = 400
HEIGHT = 170
#: Room for the y labels at the left, the x labels below.
LEFT, RIGHT, TOP, BOTTOM = 36, 18, 10, 22
#: Most y ticks above zero; most x labels.
Y_TICKS = 4
X_LABELS = 7
#: Minutes between two x labels: the first of these that leaves at most X_LABELS labels.
LABEL_STEPS_MINUTES = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440)


@dataclass(frozen=True)
class Series:
    """One named row of values, one per minute of the window (None: not sampled)."""

    name: str
    css_class: str
    values: Sequence[Optional[float]]


@dataclass(frozen=True)
class Tick:
    """A gridline at ``position`` (x or y in SVG units) and its label."""

    position: float
    label: str


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    css_class: str
    title: str


@dataclass(frozen=True)
class Line:
    """A polyline of one series; ``points`` is the SVG attribute, one run of sampled minutes."""

    css_class: str
    points: str


@dataclass(frozen=True)
class Chart:
    """Everything the template draws for one chart.

    Attributes:
        title, description: The accessible name and summary (``<title>``, ``<desc>``).
        width, height: The viewBox.
        left, top, right, bottom: The plot area's edges.
        y_ticks, x_ticks: Gridlines with their labels.
        bars, lines: The marks.
        legend: (name, css class) of each series, in drawing order.
        empty: No minute of the window was sampled.
    """

    title: str
    description: str
    width: int
    height: int
    left: float
    top: float
    right: float
    bottom: float
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    bars: list[Bar]
    lines: list[Line]
    legend: list[tuple[str, str]]
    empty: bool


def nice_step(maximum: float, ticks: int = Y_TICKS) -> float:
    """The gridline step: 1, 2 or 5 times a power of ten, such that ``ticks`` steps reach ``maximum``."""
    if maximum <= 0:
        return 1.0
    raw = maximum / ticks
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if factor * power >= raw:
            return float(factor * power)
    return float(10 * power)  # unreachable: 10 * power >= raw always


def _number(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def _y_axis(maximum: float, top: float, bottom: float, whole: bool) -> tuple[float, list[Tick]]:
    """The axis' top value (a whole number of steps at or above ``maximum``) and its ticks, zero included."""
    step = max(1.0, nice_step(maximum)) if whole else nice_step(maximum)
    steps = max(1, math.ceil(maximum / step - 1e-9))
    ceiling = step * steps
    return ceiling, [Tick(bottom - (bottom - top) * n / steps, _number(step * n)) for n in range(steps + 1)]


def minutes_of(last: datetime, count: int) -> list[datetime]:
    """The ``count`` minutes ending with ``last``, oldest first."""
    return [last - timedelta(minutes=back) for back in range(count - 1, -1, -1)]


def _x_ticks(minutes: Sequence[datetime], slot: float, left: float) -> list[Tick]:
    step = next((s for s in LABEL_STEPS_MINUTES if len(minutes) / s <= X_LABELS), LABEL_STEPS_MINUTES[-1])
    ticks = []
    for index, minute in enumerate(minutes):
        utc = minute.astimezone(timezone.utc)
        if (utc.hour * 60 + utc.minute) % step == 0:
            ticks.append(Tick(left + slot * (index + 0.5), utc.strftime("%H:%M")))
    return ticks


def _frame(title: str, description: str, minutes: Sequence[datetime], maximum: float,
           legend: list[tuple[str, str]], empty: bool, whole: bool) -> tuple[Chart, float]:
    left, top, right, bottom = LEFT, TOP, WIDTH - RIGHT, HEIGHT - BOTTOM
    slot = (right - left) / max(1, len(minutes))
    ceiling, y_ticks = _y_axis(maximum, top, bottom, whole)
    chart = Chart(title=title, description=description, width=WIDTH, height=HEIGHT, left=left, top=top,
                  right=right, bottom=bottom, y_ticks=y_ticks, x_ticks=_x_ticks(minutes, slot, left),
                  bars=[], lines=[], legend=legend, empty=empty)
    return chart, ceiling


def stacked_bars(title: str, minutes: Sequence[datetime], series: Sequence[Series], *, unit: str) -> Chart:
    """One bar per sampled minute, the series stacked bottom up in the order given.

    Args:
        minutes: The window's minutes, oldest first; each series has a value per minute.
        unit: What a value counts, for the titles ("attempts").
    """
    totals = [sum(s.values[i] or 0 for s in series) for i in range(len(minutes))]
    sampled = [any(s.values[i] is not None for s in series) for i in range(len(minutes))]
    described = ", ".join(f"{sum(v or 0 for v in s.values):g} {s.name}" for s in series)
    chart, ceiling = _frame(title, f"Per minute over the last {len(minutes)} minutes: {described} {unit}.",
                            minutes, max(totals, default=0), [(s.name, s.css_class) for s in series],
                            not any(sampled), whole=True)
    slot = (chart.right - chart.left) / max(1, len(minutes))
    scale = (chart.bottom - chart.top) / ceiling
    for index, minute in enumerate(minutes):
        if not sampled[index]:
            continue
        base = chart.bottom
        label = minute.astimezone(timezone.utc).strftime("%H:%M UTC")
        parts = ", ".join(f"{s.values[index] or 0:g} {s.name}" for s in series)
        for s in series:
            value = s.values[index] or 0
            if value <= 0:
                continue
            height = value * scale
            chart.bars.append(Bar(x=round(chart.left + slot * index + slot * 0.1, 2), y=round(base - height, 2),
                                  width=round(slot * 0.8, 2), height=round(height, 2), css_class=s.css_class,
                                  title=f"{label}: {parts}"))
            base -= height
    return chart


def line_chart(title: str, minutes: Sequence[datetime], series: Sequence[Series], *, unit: str,
               whole: bool = False) -> Chart:
    """One line per series through the sampled minutes, broken where a minute was not sampled.

    ``whole``: the values are counts, so the y axis steps by whole numbers.
    """
    values = [v for s in series for v in s.values if v is not None]
    latest = ", ".join(
        f"{s.name} {next((v for v in reversed(s.values) if v is not None), 0):g} {unit}" for s in series)
    chart, ceiling = _frame(title, f"Over the last {len(minutes)} minutes; latest: {latest}.", minutes,
                            max(values, default=0), [(s.name, s.css_class) for s in series], not values, whole)
    slot = (chart.right - chart.left) / max(1, len(minutes))
    scale = (chart.bottom - chart.top) / ceiling
    for s in series:
        run: list[str] = []
        for index, value in enumerate(list(s.values) + [None]):
            if value is None:
                if run:
                    # A lone sample is drawn as a dot: a polyline of one point shows nothing.
                    points = run if len(run) > 1 else run * 2
                    chart.lines.append(Line(s.css_class, " ".join(points)))
                run = []
                continue
            x = chart.left + slot * (index + 0.5)
            run.append(f"{x:.2f},{chart.bottom - value * scale:.2f}")
    return chart
