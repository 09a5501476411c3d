"""The per-attempt delivery metrics, counted cheaply and exposed at scrape time.

``sessionhook_deliveries_total`` and ``sessionhook_delivery_attempt_duration_seconds`` are
updated thousands of times a second on the event loop; prometheus_client's ``inc`` +
``observe`` cost about 8 % of the loop's busy time per delivery (``bench/dispatcher_cpu.py``).
:class:`DeliveryStats` keeps plain numbers and, when collected, yields exactly the samples
those two families would show. Updated from the event loop only; a scrape from another
thread reads numbers that are each whole.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterable, Sequence
from typing import Final

import prometheus_client.metrics
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class _Histogram:
    """One endpoint's duration histogram: per-bucket (not cumulative) counts, the sum."""

    __slots__ = ("buckets", "created", "sum")

    def __init__(self, size: int) -> None:
        self.buckets = [0] * size
        self.sum = 0.0
        self.created = time.time()


class DeliveryStats(Collector):
    """``{prefix}deliveries_total`` and ``{prefix}delivery_attempt_duration_seconds``
    (``bounds``: the finite bucket bounds, ascending) as prometheus_client would expose them."""

    def __init__(
        self,
        namespace: str,
        bounds: Sequence[float],
        *,
        counter_help: str,
        histogram_help: str,
    ) -> None:
        self._counter_name: Final = f"{namespace}_deliveries"
        self._histogram_name: Final = f"{namespace}_delivery_attempt_duration_seconds"
        self._counter_help = counter_help
        self._histogram_help = histogram_help
        self._bounds: Final = tuple(float(b) for b in bounds)
        self._le: Final[tuple[str, ...]] = tuple(
            floatToGoString(b)  # type: ignore[no-untyped-call]
            for b in (*self._bounds, math.inf)
        )
        #: (endpoint, outcome) -> [count, created]
        self._counts: dict[tuple[str, str], list[float]] = {}
        self._histograms: dict[str, _Histogram] = {}

    def attempted(self, endpoint: str, outcome: str, duration_seconds: float) -> None:
        """Count one attempt of ``endpoint`` with ``outcome`` and observe its duration."""
        counted = self._counts.get((endpoint, outcome))
        if counted is None:
            counted = self._counts[(endpoint, outcome)] = [0, time.time()]
        counted[0] += 1
        histogram = self._histograms.get(endpoint)
        if histogram is None:
            histogram = self._histograms[endpoint] = _Histogram(len(self._le))
        value = max(0.0, duration_seconds)
        # The first bucket whose bound is >= the value (prometheus: value <= le).
        histogram.buckets[bisect.bisect_left(self._bounds, value)] += 1
        histogram.sum += value

    def describe(self) -> Iterable[Metric]:
        """The two families, without samples (the registry checks their names)."""
        return [
            Metric(self._counter_name, self._counter_help, "counter"),
            Metric(self._histogram_name, self._histogram_help, "histogram"),
        ]

    def collect(self) -> Iterable[Metric]:
        """The two families as prometheus_client's Counter and Histogram would show them."""
        created = getattr(prometheus_client.metrics, "_use_created", True)
        counter = Metric(self._counter_name, self._counter_help, "counter")
        total, created_name = f"{self._counter_name}_total", f"{self._counter_name}_created"
        for (endpoint, outcome), (count, since) in list(self._counts.items()):
            labels = {"endpoint": endpoint, "outcome": outcome}
            counter.add_sample(total, labels, float(count))
            if created:
                counter.add_sample(created_name, dict(labels), since)
        histogram = Metric(self._histogram_name, self._histogram_help, "histogram")
        name = self._histogram_name
        for endpoint, h in list(self._histograms.items()):
            acc = 0.0
            for le, count in zip(self._le, list(h.buckets), strict=True):
                acc += count
                histogram.add_sample(f"{name}_bucket", {"endpoint": endpoint, "le": le}, acc)
            histogram.add_sample(f"{name}_count", {"endpoint": endpoint}, acc)
            histogram.add_sample(f"{name}_sum", {"endpoint": endpoint}, h.sum)
            if created:
                histogram.add_sample(f"{name}_created", {"endpoint": endpoint}, h.created)
        return [counter, histogram]
