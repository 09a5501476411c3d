"""The sender (post_event) and the dispatcher loop, against MockTransport/ASGI consumers."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from pydantic import SecretStr
from standardwebhooks import Webhook
from structlog.testing import capture_logs

from sessionhook import __version__
from sessionhook.api.models import Activity, Session
from sessionhook.relay.config import Config, DeliveryConfig, EndpointConfig
from sessionhook.relay.delivery.dispatcher import DeliverySettings, Dispatcher
from sessionhook.relay.delivery.post import post_event
from sessionhook.relay.delivery.render_process import RenderProcess
from sessionhook.relay.domain.lifecycle import lifecycle_events
from sessionhook.relay.domain.retry import AttemptResult
from sessionhook.relay.domain.rows import DeliveryRow
from sessionhook.relay.domain.signing import generate_secret
from sessionhook.relay.store import (
    AsyncStore,
    EndpointQueries,
    Ingest,
    OperatorQueries,
    Outbox,
    Round,
)
from sessionhook.relay.telemetry.logs import LineBudget
from tests.support import virtual_time
from tests.support.dispatch_rig import PER_SESSION, SECRET, SESSIONS, dispatch_config, seed_sessions
from tests.support.receiver import Arrival, Receiver

pytestmark = pytest.mark.app

OLD_SECRET = generate_secret()
BODY = json.dumps({"type": "activity.plan_generated", "timestamp": "t", "data": {}}).encode()


def _capture(
    responses: list[httpx.Response] | None = None,
) -> tuple[list[httpx.Request], httpx.MockTransport]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return responses.pop(0) if responses else httpx.Response(204)

    return seen, httpx.MockTransport(handler)


async def _post(
    transport: httpx.AsyncBaseTransport,
    *,
    secrets: list[str] | None = None,
    limit: float = 5.0,
    body_limit: int = 64,
    now: Callable[[], float] = time.time,
) -> AttemptResult:
    async with httpx.AsyncClient(transport=transport) as http:
        return await post_event(
            http,
            url="https://hooks.example.com/in",
            secrets=secrets or [SECRET],
            event_id="evt_0123",
            body=BODY,
            timeout=limit,
            body_limit=body_limit,
            now=now,
        )


# --------------------------------------------------------------------------- post_event


@pytest.mark.anyio
async def test_post_event_signs_as_the_reference_implementation_verifies() -> None:
    seen, transport = _capture()
    result = await _post(transport)
    assert result.status_code == 204 and result.error is None
    request = seen[0]
    assert request.method == "POST"
    assert request.content == BODY
    headers = dict(request.headers)
    assert headers["webhook-id"] == "evt_0123"
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"] == f"sessionhook/{__version__}"
    assert Webhook(SECRET).verify(request.content, headers)["type"] == "activity.plan_generated"


@pytest.mark.anyio
async def test_post_event_signs_with_every_secret_during_rotation() -> None:
    seen, transport = _capture()
    await _post(transport, secrets=[SECRET, OLD_SECRET])
    headers = dict(seen[0].headers)
    assert len(headers["webhook-signature"].split()) == 2
    for secret in (SECRET, OLD_SECRET):
        Webhook(secret).verify(seen[0].content, headers)


@pytest.mark.anyio
async def test_timestamp_is_fresh_per_attempt() -> None:
    seen, transport = _capture()
    clock = iter([1_700_000_000.0, 1_700_003_600.0])
    await _post(transport, now=lambda: next(clock))
    await _post(transport, now=lambda: next(clock))
    stamps = [r.headers["webhook-timestamp"] for r in seen]
    assert stamps == ["1700000000", "1700003600"]
    assert seen[0].headers["webhook-id"] == seen[1].headers["webhook-id"]


@pytest.mark.anyio
async def test_delivery_timeout_applies_whatever_the_client_default() -> None:
    # httpx clients default to 5 s; an attempt must get delivery.timeout, longer or shorter.
    seen, transport = _capture()
    await _post(transport, limit=27.0)
    assert seen[0].extensions["timeout"] == {
        "connect": 27.0,
        "read": 27.0,
        "write": 27.0,
        "pool": 27.0,
    }


@pytest.mark.anyio
async def test_redirect_is_a_failure_and_not_followed() -> None:
    seen, transport = _capture(
        [httpx.Response(307, headers={"location": "https://elsewhere.example.com/"})]
    )
    result = await _post(transport)
    assert result.status_code == 307
    assert len(seen) == 1  # nothing went to the Location


@pytest.mark.anyio
async def test_answer_body_is_capped_and_retry_after_read() -> None:
    _, transport = _capture(
        [httpx.Response(503, headers={"retry-after": "42"}, content=b"x" * 10_000)]
    )
    result = await _post(transport, body_limit=100)
    assert result.status_code == 503
    assert result.retry_after == 42.0
    assert result.response_body == "x" * 100


@pytest.mark.anyio
async def test_connection_failure_is_a_result_not_an_exception() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    result = await _post(httpx.MockTransport(refuse))
    assert result.status_code is None
    assert "ConnectError" in (result.error or "")


class _Dripping(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        for _ in range(100):
            await anyio.sleep(0.05)
            yield b"."


@pytest.mark.anyio
async def test_whole_exchange_is_bounded_by_the_timeout() -> None:
    # Each chunk comes well within any per-read timeout; only the total bound stops it.
    async def drip(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_Dripping())

    with anyio.fail_after(3):
        result = await _post(httpx.MockTransport(drip), limit=0.3)
    assert result.status_code is None
    assert "timeout" in (result.error or "")


# --------------------------------------------------------------------------- the dispatcher
#
# A real store seeded with events (tests/support/dispatch_rig.py), a Receiver
# (tests/support/receiver.py) behind an ASGI transport.


class Rig:
    """Store + receiver + dispatcher for one test."""

    def __init__(self, tmp_path: Path, receiver: Receiver, config: Config) -> None:
        self.tmp_path = tmp_path
        self.receiver = receiver
        self.config = config

    async def __aenter__(self) -> Rig:
        self.store = await AsyncStore.open(self.tmp_path / "relay.db")
        await self.store.run(EndpointQueries.sync_endpoints, self.config.endpoints)
        self.expected = await seed_sessions(self.store)
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(self.receiver.app))
        self.dispatcher = Dispatcher(
            self.store, self.http, DeliverySettings.from_config(self.config)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()
        await self.store.close()

    @property
    def all_ids(self) -> set[str]:
        return {i for ids in self.expected.values() for i in ids}

    def rows(self) -> list[DeliveryRow]:
        return self.store.store.operator.list_deliveries(limit=10_000)

    async def run_until(self, done: Callable[[], bool], *, within: float = 20.0) -> None:
        """Run the dispatcher loop until ``done()`` holds (checked on each arrival)."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.dispatcher.run)
            await self.receiver.wait_for(lambda _: done(), within=within)
            tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_each_session_in_order_sessions_in_parallel(tmp_path: Path) -> None:
    receiver = Receiver(SECRET, delay=0.05)
    async with Rig(tmp_path, receiver, dispatch_config()) as rig:
        with anyio.fail_after(20):
            await rig.dispatcher.run_until_idle()
        assert receiver.rejected == []
        by_session = {s: [a.event_id for a in arr] for s, arr in receiver.by_session().items()}
        assert by_session == rig.expected
        assert receiver.max_in_flight > 1  # sessions did not wait on each other
        assert receiver.max_in_flight_per_session == 1  # ...but each session's events did
        assert {r.status for r in rig.rows()} == {"delivered"}


@pytest.mark.anyio
async def test_failed_attempts_are_retried_until_delivered(tmp_path: Path) -> None:
    receiver = Receiver(SECRET, fail_first=2)
    async with Rig(tmp_path, receiver, dispatch_config(delays=(0.05, 0.05, 0.05))) as rig:
        await rig.run_until(lambda: receiver.delivered_ids() == rig.all_ids)
        rows = rig.rows()
        assert {r.status for r in rows} == {"delivered"}
        attempts = rig.store.store.operator.list_attempts(rows[0].id)
        assert [a.status_code for a in attempts] == [503, 503, 200]
        # Order held through the retries: no event overtook an earlier one of its session.
        by_session = {s: [a.event_id for a in arr] for s, arr in receiver.by_session().items()}
        assert by_session == rig.expected


@pytest.mark.anyio
async def test_retry_after_is_honoured(tmp_path: Path) -> None:
    receiver = Receiver(SECRET, fail_first=1, fail_status=429, retry_after="1")
    async with Rig(tmp_path, receiver, dispatch_config(delays=(0.01,))) as rig:
        first = next(iter(rig.expected.values()))[0]
        await rig.run_until(lambda: first in receiver.delivered_ids())
        tries = [a.arrived_at for a in receiver.arrivals if a.event_id == first]
        assert len(tries) == 2
        assert tries[1] - tries[0] >= 0.9


@pytest.mark.anyio
async def test_gone_disables_the_endpoint_and_keeps_the_deliveries(tmp_path: Path) -> None:
    receiver = Receiver(SECRET, status=410)
    async with Rig(tmp_path, receiver, dispatch_config()) as rig:
        with capture_logs() as logs:
            await rig.dispatcher.run_until_idle()
        tried = len(receiver.arrivals)
        assert 1 <= tried <= SESSIONS  # only what was already in flight when it said 410
        (state,) = await rig.store.run(EndpointQueries.endpoint_states)
        assert not state.enabled and state.disabled_reason == "410 Gone"
        assert await rig.store.run(Outbox.pending_count) == SESSIONS * PER_SESSION  # kept for later
        assert any(e["event"] == "endpoint.disabled" for e in logs)
        assert await rig.dispatcher.run_until_idle() == 0
        assert len(receiver.arrivals) == tried


@pytest.mark.anyio
async def test_redirect_is_a_failure_and_is_not_followed(tmp_path: Path) -> None:
    receiver = Receiver(SECRET, status=307)
    async with Rig(tmp_path, receiver, dispatch_config(delays=(60.0,))) as rig:
        assert await rig.dispatcher.run_until_idle() == SESSIONS
        assert receiver.followed_redirects == 0
        heads = [r for r in rig.rows() if r.attempts]
        assert {(r.status, r.last_status_code) for r in heads} == {("failed", 307)}


@pytest.mark.anyio
async def test_dead_letter_after_the_last_delay(tmp_path: Path) -> None:
    receiver = Receiver(SECRET, status=500)
    async with Rig(tmp_path, receiver, dispatch_config(delays=(0.01, 0.01))) as rig:
        with capture_logs() as logs:
            await rig.run_until(lambda: all(r.status == "dead" for r in rig.rows()), within=30)
        assert {r.attempts for r in rig.rows()} == {3}  # two delays: three attempts
        dead = [e for e in logs if e["event"] == "delivery.dead"]
        assert len(dead) == SESSIONS * PER_SESSION
        assert {"endpoint", "event_id", "status", "attempt"} <= dead[0].keys()


@pytest.mark.anyio
@pytest.mark.parametrize("allow", [False, True])
async def test_private_endpoint_is_refused_unless_allowed(tmp_path: Path, allow: bool) -> None:
    seen, transport = _capture()
    # Such a config is refused at load time; the dispatcher refuses it on its own too
    # (defence in depth, without asking DNS).
    config = dispatch_config(url="http://127.0.0.1:9/hook", allow_private=True, delays=(60.0,))
    settings = dataclasses.replace(
        DeliverySettings.from_config(config), allow_private_networks=allow
    )
    store = await AsyncStore.open(tmp_path / "relay.db")
    await store.run(EndpointQueries.sync_endpoints, config.endpoints)
    await seed_sessions(store, sessions=1)
    async with httpx.AsyncClient(transport=transport) as http:
        dispatcher = Dispatcher(store, http, settings)
        attempts = await dispatcher.run_until_idle()
    rows = store.store.operator.list_deliveries()
    await store.close()
    if allow:
        assert attempts == PER_SESSION
        assert [str(r.url) for r in seen] == ["http://127.0.0.1:9/hook"] * PER_SESSION
    else:
        assert attempts == 1
        assert seen == []  # nothing left the process
        (row,) = [r for r in rows if r.attempts]
        assert row.status == "failed" and "loopback" in (row.last_error or "")


@pytest.mark.anyio
async def test_endpoint_failing_longer_than_disable_after_is_disabled(tmp_path: Path) -> None:
    receiver = Receiver(SECRET, status=503)
    config = dispatch_config(delays=(0.05,) * 20, disable_after=0.3)
    async with Rig(tmp_path, receiver, config) as rig:

        def disabled() -> bool:
            return not rig.store.store.endpoints.endpoint_states()[0].enabled

        with capture_logs() as logs:
            await rig.run_until(disabled)
        (state,) = await rig.store.run(EndpointQueries.endpoint_states)
        assert state.disabled_reason is not None and "failing" in state.disabled_reason
        assert any(e["event"] == "endpoint.disabled" and "failing" in e["reason"] for e in logs)


@pytest.mark.anyio
async def test_drain_lets_deliveries_in_flight_finish(tmp_path: Path) -> None:
    receiver = Receiver(SECRET, delay=0.5)
    async with Rig(tmp_path, receiver, dispatch_config()) as rig:
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.dispatcher.run)
            await receiver.wait_for(lambda r: r.in_flight > 0, within=10)
            with anyio.fail_after(5):
                await rig.dispatcher.drain()
        delivered = [r for r in rig.rows() if r.status == "delivered"]
        assert len(delivered) == len(receiver.arrivals) >= 1
        assert len(delivered) < SESSIONS * PER_SESSION  # nothing new started after drain


@pytest.mark.anyio
async def test_wake_starts_new_deliveries_without_waiting_for_the_timer(
    tmp_path: Path,
) -> None:
    receiver = Receiver(SECRET)
    config = dispatch_config()
    store = await AsyncStore.open(tmp_path / "relay.db")
    await store.run(EndpointQueries.sync_endpoints, config.endpoints)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(receiver.app)) as http:
        dispatcher = Dispatcher(store, http, DeliverySettings.from_config(config), max_wait=60.0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.run)
            await anyio.sleep(0.2)  # let it fall asleep on its 60 s timer
            await seed_sessions(store, sessions=1)
            dispatcher.wake()
            await receiver.wait_for(lambda r: len(r.delivered_ids()) == PER_SESSION, within=5)
            tg.cancel_scope.cancel()
    await store.close()


# --------------------------------------------------------------------------- issue 11


async def _one_delivery(tmp_path: Path, endpoint: EndpointConfig) -> tuple[AsyncStore, Config]:
    config = Config(
        delivery=DeliveryConfig(retry_delays=(0.0, 0.0), timeout=5.0, allow_private_networks=True),
        endpoints=(endpoint,),
    )
    store = await AsyncStore.open(tmp_path / "relay.db")
    await store.run(EndpointQueries.sync_endpoints, config.endpoints)
    await seed_sessions(store, sessions=1)
    return store, config


@pytest.mark.anyio
async def test_a_retry_sends_the_bytes_of_the_first_attempt_whatever_the_config_says(
    tmp_path: Path,
) -> None:
    first_template = '{"v": 1, "t": {{ type | tojson }}}'
    endpoint = EndpointConfig(
        name="rx", url="http://rx.test/hook", secret=SecretStr(SECRET), template=first_template
    )
    store, config = await _one_delivery(tmp_path, endpoint)
    sent: list[tuple[bytes, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append((request.content, request.headers["content-type"]))
        Webhook(SECRET).verify(request.content, dict(request.headers))  # still signed
        return httpx.Response(503 if len(sent) == 1 else 200)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        dispatcher = Dispatcher(store, http, DeliverySettings.from_config(config))
        (due,) = (await store.run(Outbox.due_deliveries, time.time(), 1))[:1]
        await dispatcher.attempt(due)
        # A reload changes the template between the attempts.
        changed = endpoint.model_copy(update={"template": '{"v": 2}'})
        dispatcher.update(
            DeliverySettings.from_config(config.model_copy(update={"endpoints": (changed,)}))
        )
        (retry,) = [
            d for d in await store.run(Outbox.due_deliveries, time.time() + 1, 10) if d.id == due.id
        ]
        await dispatcher.attempt(retry)
    await store.close()
    assert len(sent) == 2 and sent[0] == sent[1]
    assert json.loads(sent[0][0]) == {"v": 1, "t": "activity.progress_updated"}


@pytest.mark.anyio
async def test_a_reload_changes_the_shape_of_the_next_first_attempt(tmp_path: Path) -> None:
    """Each endpoint's shape is built once per config: a reload's new template applies to
    the next delivery's first attempt (and the old one until then)."""
    endpoint = EndpointConfig(name="rx", url="http://rx.test/hook", secret=SecretStr(SECRET))
    store, config = await _one_delivery(tmp_path, endpoint)
    sent: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.content)
        return httpx.Response(200)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        dispatcher = Dispatcher(store, http, DeliverySettings.from_config(config))
        (first,) = await store.run(Outbox.due_deliveries, time.time(), 1)
        await dispatcher.attempt(first)
        (second,) = await store.run(Outbox.due_deliveries, time.time(), 1)
        await dispatcher.attempt(second)  # the same config: still the stored body
        changed = endpoint.model_copy(update={"template": '{"v": 2}'})
        dispatcher.update(
            DeliverySettings.from_config(config.model_copy(update={"endpoints": (changed,)}))
        )
        (third,) = await store.run(Outbox.due_deliveries, time.time(), 1)
        await dispatcher.attempt(third)
    await store.close()
    assert json.loads(sent[0])["type"] == json.loads(sent[1])["type"] == "activity.progress_updated"
    assert json.loads(sent[2]) == {"v": 2}


@pytest.mark.anyio
@pytest.mark.parametrize("public_url", [None, "https://relay.example.com"])
async def test_the_relays_public_url_turns_a_waits_action_links_into_buttons(
    tmp_path: Path, public_url: str | None
) -> None:
    """The dispatcher hands ``public_url`` (``[actions]``) to the chat formats: with it, a
    wait's action links become buttons; without it, the message has none."""
    endpoint = EndpointConfig(
        name="rx", url="http://rx.test/hook", secret=SecretStr(SECRET), format="slack"
    )
    store, config = await _one_delivery(tmp_path, endpoint)
    session = Session(name="sessions/77", state="AWAITING_PLAN_APPROVAL", title="Fix it")
    plan = Activity.model_validate(
        {
            "name": "sessions/77/activities/" + "a" * 32,
            "createTime": "2025-05-01T11:00:00Z",
            "planGenerated": {"plan": {"id": "p1", "steps": [{"id": "s1", "title": "Do it"}]}},
        }
    )
    (wait,) = lifecycle_events(session, plan, entered=True, now=0)
    payload = json.loads(wait.body)
    links = {
        "approve": "https://relay.example.com/actions/TOKEN",
        "open": "https://relay.example.com/o",
    }
    payload["data"]["links"] = links
    wait = dataclasses.replace(wait, body=json.dumps(payload).encode())
    await store.run(Ingest.upsert_session, session, baseline=False)
    await store.run(Ingest.ingest_activities, session.name, [plan], [wait], True)
    sent: dict[str, bytes] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        sent[request.headers["webhook-id"]] = request.content
        return httpx.Response(200)

    settings = dataclasses.replace(DeliverySettings.from_config(config), public_url=public_url)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        dispatcher = Dispatcher(store, http, settings)
        for delivery in await store.run(Outbox.due_deliveries, time.time(), 100):
            await dispatcher.attempt(delivery)
    await store.close()
    blocks = json.loads(sent[wait.id])["blocks"]
    buttons = [e["url"] for b in blocks if b["type"] == "actions" for e in b["elements"]]
    assert buttons == ([] if public_url is None else list(links.values()))


@pytest.mark.anyio
async def test_a_template_failing_at_run_time_is_a_failed_attempt_not_a_crash(
    tmp_path: Path,
) -> None:
    # Passes the start-up check (samples have steps), fails on an event without a plan.
    template = '{"n": {{ 1 // (data.plan.steps | length) }}}'
    plain = EndpointConfig(name="rx", url="http://rx.test/hook", secret=SecretStr(SECRET))
    # model_copy does not validate: the start-up check would (rightly) refuse this one.
    endpoint = plain.model_copy(update={"template": template})
    store, config = await _one_delivery(tmp_path, plain)
    settings = DeliverySettings.from_config(config)
    settings = dataclasses.replace(settings, endpoints={"rx": endpoint})
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        dispatcher = Dispatcher(store, http, settings)
        (due,) = (await store.run(Outbox.due_deliveries, time.time(), 1))[:1]
        with capture_logs() as logs:
            decision = await dispatcher.attempt(due)
    (row,) = [r for r in await store.run(OperatorQueries.list_deliveries) if r.id == due.id]
    await store.close()
    assert calls == []  # nothing sent
    assert type(decision).__name__ == "Retry"
    assert row.last_error is not None and row.last_error.startswith("render failed")
    assert any(e["event"] == "delivery.failed" for e in logs)


@pytest.mark.anyio
async def test_a_render_over_its_time_budget_fails_that_attempt_only(tmp_path: Path) -> None:
    """Issue 20: the daemon's renderer stops a template at ``delivery.render_timeout``; that
    attempt fails like any template error (retried on the schedule), nothing is sent for
    it, and the same event still goes to the other endpoint."""
    # Fine on the start-up samples; seconds of counting words on these sessions (titles
    # "S0"...), making nothing: only the time budget stops it.
    slow = (
        '{% if session.title.startswith("S") %}{% set long = session.title * 400000 %}'
        "{% for i in range(1000) %}{{ long | wordcount }}{% endfor %}{% endif %}"
        '{"t": {{ type | tojson }}}'
    )
    endpoints = (
        EndpointConfig(
            name="tpl", url="http://rx.test/tpl", secret=SecretStr(SECRET), template=slow
        ),
        EndpointConfig(name="std", url="http://rx.test/std", secret=SecretStr(SECRET)),
    )
    config = Config(
        delivery=DeliveryConfig(
            retry_delays=(0.0,), timeout=5.0, allow_private_networks=True, render_timeout=1.0
        ),
        endpoints=endpoints,
    )
    store = await AsyncStore.open(tmp_path / "relay.db")
    await store.run(EndpointQueries.sync_endpoints, config.endpoints)
    await seed_sessions(store, sessions=1)
    seen, transport = _capture()
    renderer = RenderProcess()
    try:
        async with httpx.AsyncClient(transport=transport) as http:
            dispatcher = Dispatcher(
                store, http, DeliverySettings.from_config(config), renderer=renderer
            )
            due = await store.run(Outbox.due_deliveries, time.time(), 10)
            firsts = {d.endpoint: d for d in due}
            with capture_logs() as logs:
                failed = await dispatcher.attempt(firsts["tpl"])
                delivered = await dispatcher.attempt(firsts["std"])
    finally:
        await renderer.aclose()
    rows = {r.id: r for r in await store.run(OperatorQueries.list_deliveries)}
    await store.close()
    assert type(failed).__name__ == "Retry" and type(delivered).__name__ == "Delivered"
    assert rows[firsts["tpl"].id].last_error == (
        "render failed: template over its time budget of 1 s"
    )
    assert [str(r.url) for r in seen] == ["http://rx.test/std"]
    assert any(e["event"] == "delivery.failed" and e["endpoint"] == "tpl" for e in logs)


@pytest.mark.anyio
async def test_attempts_run_on_reused_worker_tasks(tmp_path: Path) -> None:
    """Not one task per delivery: many more deliveries than slots, and never more attempt
    tasks than slots (concurrency 3)."""
    receiver = Receiver(SECRET, delay=0.01)
    async with Rig(tmp_path, receiver, dispatch_config(concurrency=3)) as rig:
        dispatcher = rig.dispatcher
        tasks: set[int] = set()
        deliver_one = dispatcher._deliver_one

        async def spy(delivery: Any, endpoint: EndpointConfig) -> None:
            tasks.add(id(asyncio.current_task()))
            await deliver_one(delivery, endpoint)

        dispatcher._deliver_one = spy  # type: ignore[method-assign]
        with anyio.fail_after(20):
            await dispatcher.run_until_idle()
        assert receiver.delivered_ids() == rig.all_ids
        assert len(rig.all_ids) > 3 * len(tasks)
        assert 1 < len(tasks) <= 3


@pytest.mark.anyio
async def test_handed_over_but_cancelled_before_sending_is_released(tmp_path: Path) -> None:
    """Deliveries handed to the attempt workers, cancelled before a worker took them:
    released (the next round hands them out again), nothing sent."""
    receiver = Receiver(SECRET)
    async with Rig(tmp_path, receiver, dispatch_config()) as rig:
        dispatcher = rig.dispatcher
        due = await rig.store.run(Outbox.due_deliveries, time.time(), 3)
        assert len(due) == 3
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg, dispatcher._workers(tg) as start:
                for delivery in due:  # what _round does for each delivery it starts
                    dispatcher._in_flight.add(delivery.key)
                    dispatcher._per_endpoint["rx"] = dispatcher._per_endpoint.get("rx", 0) + 1
                    start(delivery, dispatcher.settings.endpoints["rx"])
                scope.cancel()  # before any worker ran
        assert dispatcher.in_flight == 0
        assert "rx" not in dispatcher._per_endpoint  # none in flight
        assert receiver.arrivals == []
        with anyio.fail_after(20):
            await dispatcher.run_until_idle()
        assert receiver.delivered_ids() == rig.all_ids


@pytest.mark.anyio
async def test_handed_to_an_idle_worker_then_cancelled_is_released(tmp_path: Path) -> None:
    """A worker that finished a delivery waits for the next; one handed to it just before a
    cancel is either sent (anyio lets a task whose wait is over resume) or released: never
    left counted in flight without a result, and delivered later."""
    receiver = Receiver(SECRET)
    async with Rig(tmp_path, receiver, dispatch_config()) as rig:
        dispatcher = rig.dispatcher
        first, *rest = await rig.store.run(Outbox.due_deliveries, time.time(), 3)
        endpoint = dispatcher.settings.endpoints["rx"]

        def hand(start: Any, delivery: Any) -> None:  # what _round does for each one
            dispatcher._in_flight.add(delivery.key)
            dispatcher._per_endpoint["rx"] = dispatcher._per_endpoint.get("rx", 0) + 1
            start(delivery, endpoint)

        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg, dispatcher._workers(tg) as start:
                dispatcher._wake = anyio.Event()  # set when an attempt ends
                hand(start, first)
                with anyio.fail_after(20):
                    await dispatcher._wake.wait()  # sent; the worker is idle now
                assert len(dispatcher._finished) == 1
                hand(start, rest[0])
                scope.cancel()  # before the idle worker resumed
        # In flight now: only what finished and waits for its commit.
        assert dispatcher.in_flight == len(dispatcher._finished) >= 1
        assert dispatcher._per_endpoint.get("rx", 0) == len(dispatcher._finished)
        with anyio.fail_after(20):
            await dispatcher.run_until_idle()
        assert receiver.delivered_ids() == rig.all_ids


@pytest.mark.anyio
async def test_a_new_logging_configuration_reaches_the_next_batch(tmp_path: Path) -> None:
    """The dispatcher keeps its bound logger between batches (binding per batch cost ~4 us of
    the event loop); a new structlog configuration (a reload's log level, a test capturing
    logs) still reaches the very next batch."""
    import io

    from sessionhook.relay.telemetry import logs as relay_logging

    endpoint = EndpointConfig(name="rx", url="http://rx.test/hook", secret=SecretStr(SECRET))
    store, config = await _one_delivery(tmp_path, endpoint)
    quiet, loud = io.StringIO(), io.StringIO()
    try:
        async with httpx.AsyncClient(
            transport=httpx.MockTransport(lambda _: httpx.Response(200))
        ) as http:
            dispatcher = Dispatcher(store, http, DeliverySettings.from_config(config))
            relay_logging.configure("warning", "json", stream=quiet)
            (first,) = await store.run(Outbox.due_deliveries, time.time(), 1)
            await dispatcher.attempt(first)
            relay_logging.configure("info", "json", stream=loud)  # a reload
            (second,) = await store.run(Outbox.due_deliveries, time.time(), 1)
            await dispatcher.attempt(second)
            with capture_logs() as logs:
                (third,) = await store.run(Outbox.due_deliveries, time.time(), 1)
                await dispatcher.attempt(third)
    finally:
        relay_logging.reset()
        await store.close()
    assert quiet.getvalue() == ""  # a success is an info line
    lines = [json.loads(line) for line in loud.getvalue().splitlines()]
    assert [(x["event"], x["event_id"]) for x in lines] == [("delivery.succeeded", second.event_id)]
    assert [(x["event"], x["event_id"]) for x in logs] == [("delivery.succeeded", third.event_id)]


@pytest.mark.anyio
async def test_many_endpoints_with_nothing_queued_and_one_it_does_not_know(
    tmp_path: Path,
) -> None:
    """300 endpoints with nothing for them beside ``rx``, and ``ghost``, active in the store
    but not in this dispatcher's settings (another replica's, not loaded here): everything
    reaches rx, and ghost's deliveries are never handed out (its cap is none), so never
    claimed away from a replica that knows it."""
    receiver = Receiver(SECRET)
    config = dispatch_config()
    quiet = [
        config.endpoints[0].model_copy(
            update={"name": f"idle{n:03d}", "events": ("session.failed",)}
        )
        for n in range(300)
    ]
    ghost = config.endpoints[0].model_copy(update={"name": "ghost"})
    settings = DeliverySettings.from_config(
        config.model_copy(update={"endpoints": (*config.endpoints, *quiet)})
    )
    async with Rig(tmp_path, receiver, config) as rig:
        await rig.store.run(EndpointQueries.sync_endpoints, (*config.endpoints, *quiet, ghost))
        assert await rig.store.run(OperatorQueries.replay, "ghost", since=0) > 0
        dispatcher = Dispatcher(rig.store, rig.http, settings)
        outbox = rig.store.store.outbox
        real, handed = outbox.dispatch_round, set()

        def dispatch_round(round_: Round) -> Any:
            result = real(round_)
            handed.update(d.endpoint for d in result[1])
            return result

        outbox.dispatch_round = dispatch_round  # type: ignore[method-assign]
        with anyio.fail_after(30):
            await dispatcher.run_until_idle()
        ghost_rows = [r for r in rig.rows() if r.endpoint == "ghost"]
    assert receiver.delivered_ids() == rig.all_ids
    assert handed == {"rx"}
    assert ghost_rows and all(r.attempts == 0 and r.status == "pending" for r in ghost_rows)


# --------------------------------------------------------------------------- rate_limit


@pytest.mark.parametrize("loop", ["run", "run_until_idle"])
def test_rate_limit_sends_n_per_second_in_order_on_a_fake_clock(tmp_path: Path, loop: str) -> None:
    """``rate_limit = 2``: 20 deliveries through the real dispatcher and store, on a fake
    clock (tests/support/virtual_time.py: time passes only while the loop would sleep). The first
    goes at once, each next one 1/2 s after the previous one (the dispatcher wakes when the
    slot frees, not at its 1 s backstop), in the outbox's order; ``--once``
    (run_until_idle) waits for the slots too instead of leaving the rest behind."""
    rate, count = 2.0, 20
    config = dispatch_config()
    limited = config.endpoints[0].model_copy(update={"rate_limit": rate})
    config = config.model_copy(update={"endpoints": (limited,)})
    store_calls = [0]  # calls under way in the store's thread: the fake clock waits for them

    async def main(clock: virtual_time.VirtualTimeLoop) -> tuple[list[Arrival], list[str]]:
        store = await AsyncStore.open(tmp_path / "relay.db", clock=clock.wall)
        run = store.run

        async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
            store_calls[0] += 1
            try:
                return await run(fn, *args, **kwargs)
            finally:
                store_calls[0] -= 1

        store.run = counted  # type: ignore[method-assign]
        await store.run(EndpointQueries.sync_endpoints, config.endpoints)
        expected = await seed_sessions(store)  # SESSIONS x PER_SESSION = 20, oldest first
        receiver = Receiver(SECRET, clock=clock.wall)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(receiver.app)) as http:
            dispatcher = Dispatcher(
                store, http, DeliverySettings.from_config(config), clock=clock.wall
            )
            with anyio.fail_after(120):  # fake seconds: main's backstop took 19
                if loop == "run":
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(dispatcher.run)
                        await receiver.wait_for(lambda r: len(r.arrivals) >= count, within=100)
                        tg.cancel_scope.cancel()
                else:
                    await dispatcher.run_until_idle()
        await store.close()
        return receiver.arrivals, [i for ids in expected.values() for i in ids]

    arrivals, order = virtual_time.run(main, busy=lambda: store_calls[0] > 0)
    assert count == SESSIONS * PER_SESSION
    assert [a.event_id for a in arrivals] == order  # each once, in the outbox's order
    gaps = [round(b.arrived_at - a.arrived_at, 3) for a, b in itertools.pairwise(arrivals)]
    assert gaps == [1 / rate] * (count - 1), gaps


@pytest.mark.anyio
async def test_successes_beyond_the_line_budget_are_counted_in_one_summary(
    tmp_path: Path,
) -> None:
    """A burst of successes (a backlog) writes at most the budget's delivery.succeeded lines
    a second; the others are counted, per endpoint, in a delivery.succeeded_summary line
    (here the second never ends: the summary comes when the loop does). Nothing is lost:
    listed + counted = delivered. Failures are always listed."""
    receiver = Receiver(SECRET, fail_first=1)
    async with Rig(tmp_path, receiver, dispatch_config(delays=(0.0, 0.0))) as rig:
        dispatcher = rig.dispatcher
        dispatcher._reports._success_lines = LineBudget(5, clock=lambda: 0.0)
        with capture_logs() as logs, anyio.fail_after(20):
            await dispatcher.run_until_idle()
        assert receiver.delivered_ids() == rig.all_ids
    listed = [e for e in logs if e["event"] == "delivery.succeeded"]
    summaries = [e for e in logs if e["event"] == "delivery.succeeded_summary"]
    failed = [e for e in logs if e["event"] == "delivery.failed"]
    assert len(listed) == 5
    assert [(s["endpoint"], s["count"]) for s in summaries] == [("rx", len(rig.all_ids) - 5)]
    assert len(failed) == len(rig.all_ids)  # the first attempt of each: every one listed


@pytest.mark.anyio
async def test_a_rendered_body_waits_out_a_full_store_then_goes(tmp_path: Path) -> None:
    """A template's bytes are saved before the first POST. A store that cannot take them
    (a full disk; an unreachable database) is waited out by that attempt: the daemon goes
    on, nothing new is started meanwhile, and the delivery goes once there is room."""
    endpoint = EndpointConfig(
        name="rx",
        url="http://rx.test/hook",
        secret=SecretStr(SECRET),
        template='{"pad": {{ data.activity | tojson }}, "more": "' + "x" * 100_000 + '"}',
    )
    store, config = await _one_delivery(tmp_path, endpoint)
    full = anyio.Event()

    class Observer:
        """Hears the door's news (the daemon logs them)."""

        def store_unwritable(self, error: Exception, *, first: bool, retry_in: float) -> None:
            full.set()

        def store_writable_again(self, *, after: float) -> None:
            pass

    store.observer = Observer()
    store._retry_base = 0.02  # a test's patience
    pages = await store.run(lambda s: s.db.conn.execute("PRAGMA page_count").fetchone()[0])
    await store.run(lambda s: s.db.conn.execute(f"PRAGMA max_page_count = {pages}"))
    sent: list[bytes] = []
    arrived = anyio.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.content)
        arrived.set()
        return httpx.Response(200)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        dispatcher = Dispatcher(store, http, DeliverySettings.from_config(config))
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.run)
            with anyio.fail_after(20):  # guards against a hang, not measures
                await full.wait()
            assert sent == [] and store.unwritable is not None
            await store.run(lambda s: s.db.conn.execute("PRAGMA max_page_count = 1000000"))
            with anyio.fail_after(20):
                await arrived.wait()
            tg.cancel_scope.cancel()
    await store.close()
    assert json.loads(sent[0])["more"].startswith("xxx")
