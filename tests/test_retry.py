"""Retry decisions: status classes, schedule, jitter, Retry-After, dead letters, disabling."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionhook.relay.domain.retry import (
    MAX_RETRY_AFTER,
    AttemptResult,
    Dead,
    Delivered,
    DisableEndpoint,
    Outcome,
    Retry,
    decide,
    should_disable,
)

pytestmark = pytest.mark.unit

DELAYS = (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0)
NOW = 1_700_000_000.0


class Fixed:
    """A jitter source that always returns the same point of the interval."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def uniform(self, a: float, b: float, /) -> float:
        assert (a, b) == (0.8, 1.2)
        return self.factor


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_2xx_is_delivered(status: int) -> None:
    assert decide(1, Outcome(status), DELAYS, NOW) == Delivered()
    # Even on the very last allowed attempt.
    assert decide(len(DELAYS) + 1, Outcome(status), DELAYS, NOW) == Delivered()


def test_410_disables_the_endpoint_whatever_the_attempt() -> None:
    assert decide(1, Outcome(410), DELAYS, NOW) == DisableEndpoint("410 Gone")
    assert decide(99, Outcome(410), DELAYS, NOW) == DisableEndpoint("410 Gone")


@pytest.mark.parametrize("status", [301, 302, 307, 400, 401, 403, 404, 413, 429, 500, 502, 504])
def test_other_statuses_retry_on_schedule(status: int) -> None:
    decision = decide(1, Outcome(status), DELAYS, NOW, Fixed(1.0))
    assert decision == Retry(at=NOW + 5.0)


def test_no_response_retries() -> None:
    outcome = Outcome(None, error="timeout after 15 s")
    assert decide(3, outcome, DELAYS, NOW, Fixed(1.0)) == Retry(at=NOW + 1800.0)


def test_schedule_uses_the_delay_of_the_attempt_number() -> None:
    got = [decide(n, Outcome(503), DELAYS, NOW, Fixed(1.0)) for n in range(1, len(DELAYS) + 1)]
    assert got == [Retry(at=NOW + d) for d in DELAYS]


def test_past_the_last_delay_is_dead() -> None:
    assert isinstance(decide(len(DELAYS) + 1, Outcome(500), DELAYS, NOW), Dead)
    assert isinstance(decide(1, Outcome(None, "refused"), (), NOW), Dead)


def test_jitter_extremes() -> None:
    assert decide(2, Outcome(500), DELAYS, NOW, Fixed(0.8)) == Retry(at=NOW + 240.0)
    assert decide(2, Outcome(500), DELAYS, NOW, Fixed(1.2)) == Retry(at=NOW + 360.0)


def test_retry_after_wins_when_larger() -> None:
    assert decide(1, Outcome(429, retry_after=120), DELAYS, NOW, Fixed(1.0)) == Retry(NOW + 120)
    # Smaller than the schedule: the schedule wins.
    assert decide(2, Outcome(503, retry_after=10), DELAYS, NOW, Fixed(1.0)) == Retry(NOW + 300)
    # Absurd values are capped.
    big = Outcome(429, retry_after=10 * MAX_RETRY_AFTER)
    assert decide(1, big, DELAYS, NOW, Fixed(1.0)) == Retry(NOW + MAX_RETRY_AFTER)
    # Retry-After does not extend the schedule past its end.
    assert isinstance(decide(8, Outcome(429, retry_after=60), DELAYS, NOW), Dead)


def test_attempt_result_is_accepted_directly() -> None:
    result = AttemptResult(
        status_code=503,
        error=None,
        duration_ms=12.0,
        response_body="busy",
        retry_after=900.0,
        started_at=NOW,
    )
    assert not result.ok
    assert Outcome.of(result) == Outcome(503, None, 900.0)
    assert decide(1, result, DELAYS, NOW, Fixed(1.0)) == Retry(NOW + 900.0)
    ok = AttemptResult(204, None, 3.0, "", None, NOW)
    assert ok.ok
    assert decide(1, ok, DELAYS, NOW) == Delivered()


def test_attempt_numbers_start_at_one() -> None:
    with pytest.raises(ValueError):
        decide(0, Outcome(500), DELAYS, NOW)


def test_default_rng_stays_within_bounds() -> None:
    decision = decide(1, Outcome(500), DELAYS, NOW)
    assert isinstance(decision, Retry)
    assert NOW + 4.0 <= decision.at <= NOW + 6.0


@given(
    delays=st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=12),
    seed=st.integers(min_value=0, max_value=2**32),
    status=st.one_of(
        st.none(), st.integers(min_value=300, max_value=599).filter(lambda s: s != 410)
    ),
)
def test_property_delay_within_jitter_bounds(
    delays: list[float], seed: int, status: int | None
) -> None:
    rng = random.Random(seed)
    for attempt, base in enumerate(delays, start=1):
        decision = decide(attempt, Outcome(status, "x"), delays, NOW, rng)
        assert isinstance(decision, Retry)
        assert NOW + base * 0.8 - 1e-6 <= decision.at <= NOW + base * 1.2 + 1e-6
    assert isinstance(decide(len(delays) + 1, Outcome(status, "x"), delays, NOW, rng), Dead)


@given(
    delays=st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=12).map(sorted),
    factor=st.floats(min_value=0.8, max_value=1.2),
    retry_after=st.one_of(st.none(), st.floats(min_value=0, max_value=1e7)),
)
def test_property_schedule_is_monotone(
    delays: list[float], factor: float, retry_after: float | None
) -> None:
    # With a non-decreasing schedule and the same jitter draw, a later attempt never
    # retries sooner than an earlier one, and Retry-After is a floor, never shortened.
    outcome = Outcome(503, retry_after=retry_after)
    times = []
    for attempt in range(1, len(delays) + 1):
        decision = decide(attempt, outcome, delays, NOW, Fixed(factor))
        assert isinstance(decision, Retry)
        if retry_after is not None:
            assert decision.at >= NOW + min(retry_after, MAX_RETRY_AFTER)
        times.append(decision.at)
    assert times == sorted(times)


def test_bases_of_the_default_schedule_never_shrink() -> None:
    assert list(DELAYS) == sorted(DELAYS)


def test_should_disable() -> None:
    five_days = 5 * 86400.0
    assert not should_disable(None, NOW, five_days)
    assert not should_disable(NOW - five_days + 1, NOW, five_days)
    assert should_disable(NOW - five_days, NOW, five_days)
    assert should_disable(NOW - 10 * five_days, NOW, five_days)
