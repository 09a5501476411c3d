"""The overview's chart: deliveries and failures per minute, drawn server-side as inline SVG.

Pure: :func:`minute_chart` turns per-minute counts into bars and labels (numbers only); the
template draws them as ``<rect>`` elements with presentation attributes (no inline style,
so the console's Content-Security-Policy needs no ``'unsafe-inline'``). No chart library,
nothing loaded from another host.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from ...store.console_queries import MinuteCounts

#: Size of the drawing area in SVG units, whatever the span (labels keep one size).
HEIGHT: Final = 100.0
WIDTH: Final = 1440.0


@dataclass(frozen=True, slots=True)
class Bar:
    """One minute: a green bar of ``ok`` on top of a red one of ``failed`` (SVG units)."""

    x: float
    width: float
    ok_y: float
    ok_height: float
    failed_y: float
    failed_height: float
    title: str


@dataclass(frozen=True, slots=True)
class Tick:
    """An x-axis label at minute ``x``."""

    x: float
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    """What the template needs to draw the chart."""

    width: float
    height: float
    bars: tuple[Bar, ...]
    ticks: tuple[Tick, ...]
    peak: int
    delivered: int
    failed: int


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M")


def minute_chart(
    counts: Iterable[MinuteCounts], *, start: int, minutes: int, tick_every: int = 180
) -> Chart:
    """Bars for ``minutes`` minutes from ``start`` (Unix seconds, a whole minute), scaled so
    the busiest minute fills the height; a tick label every ``tick_every`` minutes (UTC)."""
    unit = WIDTH / minutes
    rows = [c for c in counts if 0 <= c.minute < minutes]
    peak = max((c.ok + c.failed for c in rows), default=0)
    scale = HEIGHT / peak if peak else 0.0
    bars = []
    for c in rows:
        failed_h = c.failed * scale
        ok_h = c.ok * scale
        when = _clock(start + 60 * c.minute)
        bars.append(
            Bar(
                x=c.minute * unit,
                width=unit * 0.8 if unit >= 4 else unit,  # a gap between wide bars
                failed_y=HEIGHT - failed_h,
                failed_height=failed_h,
                ok_y=HEIGHT - failed_h - ok_h,
                ok_height=ok_h,
                title=f"{when} UTC: {c.ok} delivered, {c.failed} failed",
            )
        )
    # Ticks on whole multiples of tick_every minutes (UTC), like a clock face.
    first = (-(start // 60)) % tick_every
    ticks = tuple(
        Tick(x=m * unit, label=_clock(start + 60 * m)) for m in range(first, minutes, tick_every)
    )
    return Chart(
        width=WIDTH,
        height=HEIGHT,
        bars=tuple(bars),
        ticks=ticks,
        peak=peak,
        delivered=sum(c.ok for c in rows),
        failed=sum(c.failed for c in rows),
    )
