"""A consumer's Retry-After is capped by delivery.max_retry_after, and the rows queued behind
a parked delivery say what they wait on (``waiting_on``), instead of looking due."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from sessionhook.api.models import Activity, ProgressUpdated, Session
from sessionhook.relay.config import Config, DeliveryConfig, EndpointConfig
from sessionhook.relay.delivery.dispatcher import DeliverySettings, Dispatcher
from sessionhook.relay.domain.events import activity_event
from sessionhook.relay.domain.retry import (
    MAX_RETRY_AFTER,
    AttemptResult,
    Delivered,
    Outcome,
    Retry,
    decide,
)
from sessionhook.relay.domain.signing import generate_secret
from sessionhook.relay.store import AsyncStore, EndpointQueries, Ingest, Outbox
from tests.support.dispatch_rig import seed_session

pytestmark = pytest.mark.app

NOW = 1_700_000_000.0
DELAYS = (5.0, 300.0)


class Fixed:
    def uniform(self, a: float, b: float, /) -> float:
        return 1.0


def test_default_cap_is_one_hour() -> None:
    assert MAX_RETRY_AFTER == 3600.0
    assert DeliveryConfig().max_retry_after == 3600.0
    decision = decide(1, Outcome(503, retry_after=999_999), DELAYS, NOW, Fixed())
    assert decision == Retry(NOW + 3600.0)


def test_cap_is_a_parameter() -> None:
    big = Outcome(429, retry_after=999_999)
    assert decide(1, big, DELAYS, NOW, Fixed(), max_retry_after=600) == Retry(NOW + 600)
    # Within the cap, Retry-After is honoured as it is.
    small = Outcome(429, retry_after=120)
    assert decide(1, small, DELAYS, NOW, Fixed(), max_retry_after=600) == Retry(NOW + 120)
    # 0: Retry-After never extends the schedule.
    assert decide(1, big, DELAYS, NOW, Fixed(), max_retry_after=0) == Retry(NOW + 5)
    # The cap bounds Retry-After only; a longer scheduled delay still applies.
    assert decide(2, big, DELAYS, NOW, Fixed(), max_retry_after=60) == Retry(NOW + 300)


def test_settings_carry_the_cap() -> None:
    config = Config(delivery=DeliveryConfig(max_retry_after=90))
    assert DeliverySettings.from_config(config).max_retry_after == 90


@pytest.mark.anyio
async def test_dispatcher_caps_retry_after_and_rows_behind_wait_on_it(tmp_path: Path) -> None:
    secret = generate_secret()
    endpoint = EndpointConfig(name="rx", url="http://rx.test/hook", secret=SecretStr(secret))
    config = Config(
        delivery=DeliveryConfig(
            retry_delays=(1.0,), max_retry_after=600, allow_private_networks=True
        ),
        endpoints=(endpoint,),
    )
    answered: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        answered.append(request.headers["webhook-id"])
        return httpx.Response(503, headers={"retry-after": "999999"})

    async def allow(url: str, *, allow_private: bool) -> str | None:
        return None

    store = await AsyncStore.open(tmp_path / "relay.db")
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    try:
        await store.run(EndpointQueries.sync_endpoints, config.endpoints)
        session = Session(name="sessions/42", state="IN_PROGRESS", title="t")
        ids = await seed_session(store, session, 3)
        dispatcher = Dispatcher(store, http, DeliverySettings.from_config(config), guard=allow)
        before = time.time()
        await dispatcher.run_until_idle()
        after = time.time()
        assert answered == [ids[0]]  # only the head of the session was tried
        rows = sorted(store.store.operator.list_deliveries(), key=lambda r: r.id)
        head, *behind = rows
        assert head.status == "failed" and head.attempts == 1
        assert head.next_attempt_at is not None
        assert before + 600 <= head.next_attempt_at <= after + 600
        assert head.waiting_on is None
        assert [(r.attempts, r.waiting_on) for r in behind] == [(0, head.id), (0, head.id)]
    finally:
        await http.aclose()
        await store.close()


@pytest.mark.anyio
async def test_waiting_on_is_per_endpoint_and_session(tmp_path: Path) -> None:
    """Only an open row of the same endpoint and session blocks; final rows never do."""
    secret = SecretStr(generate_secret())
    endpoints = (
        EndpointConfig(name="a", url="http://a.test/", secret=secret),
        EndpointConfig(name="b", url="http://b.test/", secret=secret),
    )
    store = await AsyncStore.open(tmp_path / "relay.db")
    try:
        await store.run(EndpointQueries.sync_endpoints, endpoints)
        for sid in ("sessions/1", "sessions/2"):
            session = Session(name=sid, state="IN_PROGRESS")
            await store.run(Ingest.upsert_session, session, baseline=False)
            activities = [
                Activity(
                    name=f"{sid}/activities/{j:032x}",
                    create_time=f"2025-05-01T10:00:{j:02d}.000000Z",
                    progress_updated=ProgressUpdated(title="x"),
                )
                for j in range(2)
            ]
            built = [activity_event(session, a, max_media_bytes=10) for a in activities]
            await store.run(Ingest.ingest_activities, sid, activities, built, True)
        rows = store.store.operator.list_deliveries(limit=100)
        by_key: dict[tuple[str, str], list[int]] = {}
        for row in sorted(rows, key=lambda r: r.id):
            by_key.setdefault((row.endpoint, row.session_name), []).append(row.id)
        assert len(by_key) == 4
        waiting = {row.id: row.waiting_on for row in rows}
        for first, second in by_key.values():
            assert waiting[first] is None
            assert waiting[second] == first
        # Deliver one head: the row behind it is free (a delivered row never blocks).
        head, second = by_key[("a", "sessions/1")]
        ok = AttemptResult(200, None, 1.0, "", None, time.time())
        await store.run(Outbox.record_attempt, head, ok, Delivered())
        again = {r.id: r.waiting_on for r in store.store.operator.list_deliveries(limit=100)}
        assert again[second] is None
        assert again[head] is None
    finally:
        await store.close()
