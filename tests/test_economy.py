"""Unit tests of the upstream economy: the updateTime learning, the history walk's store
verbs, and the request budget's window kept in the store across restarts."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from sessionhook.api.models import Session
from sessionhook.relay.domain import events
from sessionhook.relay.domain.contract import openapi_document
from sessionhook.relay.domain.render import thin_payload
from sessionhook.relay.polling.budget import RateLimiter
from sessionhook.relay.polling.learning import LEARN_AFTER, UpdateTimeLearning, judge
from tests.support.backends import Backend
from tests.support.clock import T0, Clock

pytestmark = pytest.mark.app


def listed(n: int, created: str, state: str = "COMPLETED") -> Session:
    raw: dict[str, Any] = {
        "name": f"sessions/{n}",
        "id": str(n),
        "title": f"Old {n}",
        "state": state,
        "createTime": created,
        "updateTime": created,
    }
    return Session.model_validate(raw)


# --------------------------------------------------------------------------- learning


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def test_judge_needs_the_listed_update_time_to_move_past_the_activity() -> None:
    activity = at("2026-01-01T10:00:05Z")
    # Moved since the previous poll and covers the activity: the server moves it.
    assert judge("2026-01-01T10:00:05Z", activity, "2026-01-01T10:00:00Z") is True
    assert judge("2026-01-01T10:00:09Z", activity, "2026-01-01T10:00:00Z") is True
    # Not moved at all, or moved (a state change) but to before the activity: it does not.
    assert judge("2026-01-01T10:00:00Z", activity, "2026-01-01T10:00:00Z") is False
    assert judge("2026-01-01T10:00:03Z", activity, "2026-01-01T10:00:00Z") is False
    # Unreadable: no evidence either way.
    assert judge("yesterday", activity, None) is None


def test_verdict_moves_after_a_streak_and_still_after_one_miss() -> None:
    learning = UpdateTimeLearning(mode="auto")
    assert not learning.list_driven  # timer until learned
    for _ in range(LEARN_AFTER - 1):
        assert learning.observe(True) is False
    assert not learning.list_driven
    assert learning.observe(True) is True
    assert learning.verdict == "moves" and learning.list_driven
    # One miss: a server that stops moving updateTime goes back to the timer at once.
    assert learning.observe(False) is True
    assert learning.verdict == "still" and not learning.list_driven
    # And it needs a whole new streak to come back.
    for _ in range(LEARN_AFTER - 1):
        learning.observe(True)
    assert not learning.list_driven
    learning.observe(True)
    assert learning.list_driven


def test_forced_modes_ignore_the_verdict() -> None:
    forced_list = UpdateTimeLearning(mode="list", verdict="still")
    forced_timer = UpdateTimeLearning(mode="timer", verdict="moves")
    assert forced_list.list_driven and not forced_timer.list_driven


# --------------------------------------------------------------------------- history


def test_history_is_recorded_once_walked_newest_first_and_survives_reopening(
    backend: Backend,
) -> None:
    clock = Clock()
    with backend.open(clock=clock) as store:
        page = [listed(n, f"2026-01-0{n}T00:00:00Z") for n in (1, 3, 2)]
        assert store.economy.record_history(page) == 3
        assert store.economy.record_history(page[:1]) == 0  # known names are left alone
        assert [k.name for k in store.economy.history_pending()] == [
            "sessions/3",
            "sessions/2",
            "sessions/1",
        ]
        row = store.ingest.get_session("sessions/3")
        assert row is not None and row.baseline and row.polled_update_time is not None
        clock.now += 10
        store.economy.finish_history("sessions/3", clock.now)
    with backend.open(clock=clock) as store:  # a restart (or kill -9: it was committed)
        pending = store.economy.history_pending()
        assert [k.name for k in pending] == ["sessions/2", "sessions/1"]
        assert pending[0].state == "COMPLETED" and pending[0].polled_update_time is not None
        # what a page's lookup finds: archived, the history walk's pending left out
        names = ["sessions/3", "sessions/2", "sessions/9"]
        found = store.economy.archived_among(names, account="default")
        assert set(found) == {"sessions/3"}
        assert (found["sessions/3"].state, found["sessions/3"].baseline) == ("COMPLETED", True)
        assert not found["sessions/3"].announced  # its session.discovered is not archived
        assert store.economy.archived_among(names, account="other") == {}
        assert store.economy.archived_among([], account="default") == {}
        three = store.ingest.get_session("sessions/3")
        assert three is not None
        discovered = events.session_discovered(three.to_session())
        store.ingest.ingest_session_events("sessions/3", [discovered], False)
        assert store.economy.archived_among(names, account="default")["sessions/3"].announced
        progress = store.economy.history_progress(clock.now + 1)
        assert (progress.total, progress.done, progress.remaining) == (3, 1, 2)
        assert progress.rate > 0 and progress.eta_seconds is not None


def test_history_progress_of_a_store_without_history(backend: Backend) -> None:
    with backend.open() as store:
        progress = store.economy.history_progress(T0)
        assert (progress.total, progress.done, progress.eta_seconds) == (0, 0, 0.0)


# --------------------------------------------------------------------------- budget


def test_budget_window_in_the_store_outlives_the_process(backend: Backend) -> None:
    with backend.open() as store:
        for i in range(4):
            assert store.economy.take_budget("default", T0 + i, limit=5) == (1, 0.0)
        # A lease of several: only what the window has left.
        assert store.economy.take_budget("default", T0 + 5, limit=5, count=3) == (1, 0.0)
        granted, wait = store.economy.take_budget("default", T0 + 10, limit=5)
        assert granted == 0 and wait == pytest.approx(50.0)  # T0's grant leaves at T0 + 60
    with backend.open() as store:  # restarted within the minute: still no grant
        granted, wait = store.economy.take_budget("default", T0 + 20, limit=5, count=5)
        assert granted == 0 and wait == pytest.approx(40.0)
        assert store.economy.take_budget("other", T0 + 20, limit=5, count=2) == (2, 0.0)  # separate
        assert store.economy.take_budget("default", T0 + 60.5, limit=5) == (1, 0.0)


@pytest.mark.anyio
async def test_limiter_asks_the_shared_window_and_waits_for_it(backend: Backend) -> None:
    clock = Clock(0.0)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds

    with backend.open() as store:
        # Another process (before a restart) took the whole minute's budget just now.
        for i in range(3):
            assert store.economy.take_budget("default", T0 + i * 0.1, limit=3) == (1, 0.0)

        async def shared() -> float:
            return store.economy.take_budget("default", T0 + clock.now, limit=3)[1]

        limiter = RateLimiter(3, burst=3, clock=clock, sleep=sleep, shared_window=shared)
        await limiter.acquire()
    # A fresh in-process limiter alone would have granted at once; the stored window made
    # it wait until the first of the earlier grants left the minute.
    assert sum(slept) == pytest.approx(60.0, abs=0.01)


# --------------------------------------------------------------------------- contract


def test_every_event_model_documents_the_account() -> None:
    schemas = openapi_document()["components"]["schemas"]
    data_models = [name for name in schemas if name.endswith("Data")]
    assert "ActivityData" in data_models and "ThinData" in data_models
    for name in data_models:
        assert "account" in schemas[name]["properties"], name


def test_thin_payload_keeps_the_account() -> None:
    payload = {
        "type": "activity.progress_updated",
        "timestamp": "2026-01-01T00:00:00Z",
        "data": {"session": {"name": "sessions/1"}, "activity": {"name": "a"}, "account": "b"},
    }
    assert thin_payload(payload)["data"]["account"] == "b"
