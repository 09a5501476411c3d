"""The overview's chart: deliveries and failures over time, drawn server-side as inline SVG.

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

#: Size of the drawing area in SVG units, whatever the span (labels keep one size). The
#: chart is drawn about as wide as the page, so a unit is about a pixel on a wide screen.
HEIGHT: Final = 100.0
WIDTH: Final = 1440.0
#: The narrowest bar slot (SVG units): minutes are summed into buckets at least this wide.
MIN_SLOT: Final = 5.0
#: Bucket sizes in minutes (each divides an hour and a day).
BUCKETS: Final = (1, 2, 3, 5, 10, 15, 30, 60)


@dataclass(frozen=True, slots=True)
class Bar:
    """One bucket of minutes: a green bar of ``ok`` on a red one of ``failed`` (SVG units)."""

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
    #: Minutes summed into one bar (``peak`` is per bucket).
    bucket: int = 1


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M")


def bucket_minutes(minutes: int, min_slot: float = MIN_SLOT) -> int:
    """The fewest minutes a bar must sum for its slot to be ``min_slot`` units wide."""
    unit = WIDTH / minutes
    return next((b for b in BUCKETS if b * unit >= min_slot), BUCKETS[-1])


def minute_chart(
    counts: Iterable[MinuteCounts], *, start: int, minutes: int, tick_every: int = 180
) -> Chart:
    """Bars for ``minutes`` minutes from ``start`` (Unix seconds, a whole minute), a bar per
    bucket of :func:`bucket_minutes` minutes, scaled so the busiest bucket fills the
    height; a tick label every ``tick_every`` minutes (UTC)."""
    unit = WIDTH / minutes
    bucket = bucket_minutes(minutes)
    # Buckets start at the window's start (not on the clock's marks): none is cut, every
    # bar has the full width.
    sums: dict[int, list[int]] = {}
    for c in counts:
        if 0 <= c.minute < minutes:
            pair = sums.setdefault(c.minute // bucket, [0, 0])
            pair[0] += c.ok
            pair[1] += c.failed
    peak = max((ok + failed for ok, failed in sums.values()), default=0)
    scale = HEIGHT / peak if peak else 0.0
    bars = []
    for index, (ok, failed) in sorted(sums.items()):
        first = index * bucket
        last = min(minutes, first + bucket)
        slot = (last - first) * unit
        failed_h = failed * scale
        ok_h = ok * scale
        span = _clock(start + 60 * first)
        if last - first > 1:
            span += f"-{_clock(start + 60 * last)}"
        bars.append(
            Bar(
                x=first * unit,
                width=slot * 0.8 if slot >= 4 else slot,  # a gap between wide bars
                failed_y=HEIGHT - failed_h,
                failed_height=failed_h,
                ok_y=HEIGHT - failed_h - ok_h,
                ok_height=ok_h,
                title=f"{span} UTC: {ok} delivered, {failed} failed",
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
        delivered=sum(ok for ok, _ in sums.values()),
        failed=sum(failed for _, failed in sums.values()),
        bucket=bucket,
    )
