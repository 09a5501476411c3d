"""Unit tests of the upstream budget (ratelimit) and the poller, on fake clocks."""

from __future__ import annotations

import contextlib
import json
import math
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from sessionhook.api import RetryPolicy
from sessionhook.api.client import SessionsClient
from sessionhook.api.errors import ApiError
from sessionhook.api.models import parse_timestamp
from sessionhook.emulator.app import create_app
from sessionhook.relay.polling import ACTIVE_STATES, Poller, PollSettings, backoff_delay
from sessionhook.relay.polling.budget import LimitedTransport, RateLimiter, endpoint_label
from sessionhook.relay.store import AsyncStore, EndpointQueries, Ingest, Outbox
from tests.support.clock import Clock
from tests.support.poller_harness import PollerHarness, finish

pytestmark = [pytest.mark.app, pytest.mark.anyio]


def store_calls(h: PollerHarness, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the store methods the poller calls from now on, in order."""
    made: list[str] = []
    real = h.store.run

    async def spy(fn: Any, *args: Any, **kwargs: Any) -> Any:
        made.append(getattr(fn, "__name__", ""))
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(h.store, "run", spy)
    return made


# --------------------------------------------------------------------------- rate limiter


def test_bucket_allows_burst_then_spaces_requests() -> None:
    limiter = RateLimiter(60, burst=3)
    assert [limiter.reserve(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    wait = limiter.reserve(0.0)
    assert wait == pytest.approx(1.0)  # 60/min refills one token a second
    assert limiter.reserve(0.5) == pytest.approx(0.5)
    assert limiter.reserve(1.0) == 0.0


def test_window_never_exceeds_requests_per_minute() -> None:
    # A large burst would let the bucket alone overshoot; the sliding window forbids it.
    limiter = RateLimiter(10, burst=10)
    now = 0.0
    grants: list[float] = []
    while now < 600.0:
        wait = limiter.reserve(now)
        if wait == 0.0:
            grants.append(now)
        else:
            now += wait
    for start in grants:
        in_window = [g for g in grants if start <= g < start + 60.0]
        assert len(in_window) <= 10
    # ...and the budget is used, not wasted: about 10 a minute over ten minutes.
    assert len(grants) >= 95


def test_refused_reservation_takes_nothing() -> None:
    limiter = RateLimiter(60, burst=1)
    assert limiter.reserve(0.0) == 0.0
    for _ in range(5):
        assert limiter.reserve(0.0) > 0.0
    assert limiter.reserve(1.0) == 0.0


def test_invalid_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="requests_per_minute"):
        RateLimiter(0)


async def test_acquire_sleeps_on_the_injected_clock() -> None:
    clock = Clock(1000.0)
    limiter = RateLimiter(120, burst=2, clock=clock, sleep=clock.sleep)
    for _ in range(6):
        await limiter.acquire()
    # two at once, then one every half second
    assert clock.now - 1000.0 == pytest.approx(2.0)
    assert all(s == pytest.approx(0.5) for s in clock.slept)


@pytest.mark.parametrize(
    ("method", "path", "label"),
    [
        ("GET", "/v1alpha/sessions", "list_sessions"),
        ("POST", "/v1alpha/sessions", "create_session"),
        ("GET", "/v1alpha/sessions/123", "get_session"),
        ("DELETE", "/v1alpha/sessions/123", "delete_session"),
        ("GET", "/v1alpha/sessions/123/activities", "list_activities"),
        ("GET", "/v1alpha/sessions/123/activities/abc", "get_activity"),
        ("POST", "/v1alpha/sessions/123:sendMessage", "send_message"),
        ("POST", "/v1alpha/sessions/123:approvePlan", "approve_plan"),
        ("GET", "/v1alpha/sources", "list_sources"),
        ("GET", "/v1alpha/sources/github/acme/api", "get_source"),
        ("GET", "/healthz", "other"),
    ],
)
def test_endpoint_labels(method: str, path: str, label: str) -> None:
    assert endpoint_label(method, path) == label


async def test_limited_transport_takes_a_grant_and_records_each_request() -> None:
    clock = Clock(1000.0)
    limiter = RateLimiter(60, burst=1, clock=clock, sleep=clock.sleep)
    recorded: list[tuple[str, int | None]] = []

    async def record(label: str, status: int | None) -> None:
        recorded.append((label, status))

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/boom"):
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(429 if "activities" in request.url.path else 200, json={})

    transport = LimitedTransport(httpx.MockTransport(handler), limiter, record=record)
    async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as http:
        await http.get("/v1alpha/sessions")
        await http.get("/v1alpha/sessions/1/activities")
        with pytest.raises(httpx.ConnectError):
            await http.get("/v1alpha/sessions/1/boom")
    assert recorded == [
        ("list_sessions", 200),
        ("list_activities", 429),
        ("other", None),
    ]
    assert clock.now - 1000.0 == pytest.approx(2.0)  # three requests at one a second


# --------------------------------------------------------------------------- the poller
#
# The poller runs against the emulator through an ASGI transport, with one fake clock
# driving both the emulator's agent and the poller's schedule, and a real store.


def test_backoff_is_exponential_capped_and_honours_retry_after() -> None:
    rng = random.Random(1)
    delays = [backoff_delay(n, None, base=1.0, cap=30.0, rng=rng) for n in range(1, 9)]
    for n, delay in enumerate(delays, start=1):
        assert 0.8 * min(30.0, 2.0 ** (n - 1)) <= delay <= 1.2 * min(30.0, 2.0 ** (n - 1))
    assert backoff_delay(1, 120.0, base=1.0, cap=30.0, rng=rng) == 120.0
    assert backoff_delay(5, 0.5, base=1.0, cap=30.0, rng=rng) >= 0.8 * 16


async def test_the_dispatcher_is_woken_only_when_deliveries_were_queued(
    tmp_path: Path,
) -> None:
    """Events no endpoint takes are archived without waking the dispatcher (its round
    would find nothing new); once an endpoint takes them, every ingest that queued
    deliveries wakes it."""
    async with PollerHarness(tmp_path) as h:
        await h.store.run(EndpointQueries.set_endpoint_enabled, "ep", False)
        first = await h.api.create_session("Fix the flaky test")
        await finish(h, first.name)
        assert len(h.archived(first.name)) > 3
        assert await h.store.run(Outbox.pending_count) == 0
        assert h.enqueued == 0
        await h.store.run(EndpointQueries.set_endpoint_enabled, "ep", True)
        second = await h.api.create_session("Add a health check")
        await finish(h, second.name)
        assert await h.store.run(Outbox.pending_count) > 0
        assert h.enqueued > 0


@pytest.mark.parametrize("exclusive", [True, False])
async def test_store_calls_a_new_session_costs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exclusive: bool
) -> None:
    """A new session is archived and announced in one store call (one hand-off to the
    store's thread on the path that paces a backfill). A replica alone on its store claims
    no polls (the claims would be no-ops); one that shares it claims and releases each."""
    async with PollerHarness(tmp_path) as h:
        h.store.store.leases.register_replica(
            "r1", host="h", pid=1, now=h.clock(), lease=30.0, exclusive=exclusive
        )
        made = store_calls(h, monkeypatch)
        session = await h.api.create_session("Fix the flaky test")
        await finish(h, session.name)
        assert made.count("archive_discovered") == 1
        assert "set_session_account" not in made  # the default account is not written
        # A poll's end (the session read again, the next poll scheduled) is one call too.
        assert made.count("finish_poll") >= 1
        assert "upsert_session" not in made and "schedule_poll" not in made
        claims, releases = made.count("claim_session_poll"), made.count("release_session_poll")
        if exclusive:
            assert claims == releases == 0
        else:
            assert claims == releases > 0
        types = [e.type for e in h.store.store.operator.iter_events(session=session.name)]
        assert types.count("session.discovered") == 1
        assert types[0] == "session.discovered"


async def test_new_sessions_are_announced_and_every_activity_archived_once(
    tmp_path: Path,
) -> None:
    async with PollerHarness(tmp_path) as h:
        sources = (await h.api.list_sources()).sources
        first = await h.api.create_session(
            "Add a health check", source=sources[0].name, automation_mode="AUTO_CREATE_PR"
        )
        second = await h.api.create_session("Fix the flaky test")
        await finish(h, first.name, second.name)
        events = list(h.store.store.operator.iter_events())
        types = [e.type for e in events]
        assert types.count("session.discovered") == 2
        assert "session.pull_request_opened" in types
        assert "session.state_changed" in types
        ids = [e.id for e in events]
        assert len(ids) == len(set(ids))
        for name in (first.name, second.name):
            assert sorted(h.archived(name)) == sorted(await h.upstream_activities(name))
        # Everything was enqueued for the endpoint, exactly once per event.
        assert await h.store.run(Outbox.pending_count) == len(events)
        assert h.enqueued > 0


@pytest.mark.parametrize("mode", ["exclusive", "inclusive", "ignore"])
async def test_each_activity_archived_once_whatever_the_create_time_filter(
    tmp_path: Path, mode: str
) -> None:
    async with PollerHarness(tmp_path, create_time_filter=mode, page_size=2) as h:
        session = await h.api.create_session("[ask] Stream the export")
        for _ in range(8):
            await h.round()
        await h.api.send_message(session.name, "Raising is fine")
        await finish(h, session.name)
        upstream = await h.upstream_activities(session.name)
        archived = h.archived(session.name)
        assert sorted(archived) == sorted(upstream)
        assert len(archived) == len(set(archived))
        # Per session, events were appended in upstream order (oldest first).
        assert archived == upstream


async def test_without_backfill_only_what_happens_after_the_first_start_is_delivered(
    tmp_path: Path,
) -> None:
    async with PollerHarness(tmp_path, backfill=False) as h:
        old = await h.api.create_session("Existing work")
        h.clock.now += 3.5  # started, planned and approved before the relay ever ran
        await h.poller.discover()
        epoch = h.clock.now
        await finish(h, old.name)
        events = list(h.store.store.operator.iter_events(session=old.name))
        sent = {
            r.event_id for r in h.store.store.operator.list_deliveries(session=old.name, limit=1000)
        }
        assert {e.id for e in events if e.occurred_ts >= epoch} == sent
        assert sent and len(sent) < len(events)  # history archived, not sent
        assert "session.discovered" not in {e.type for e in events if e.id in sent}
        new = await h.api.create_session("New work after the first start")
        await finish(h, new.name)
        new_events = {e.id for e in h.store.store.operator.iter_events(session=new.name)}
        sent = {
            r.event_id for r in h.store.store.operator.list_deliveries(session=new.name, limit=1000)
        }
        assert sent == new_events


def _in_time_order(h: PollerHarness, name: str) -> list[str]:
    """The types of ``name``'s events in archive order, checking that their times never
    go back (what `events --follow` prints, in that order)."""
    rows = list(h.store.store.operator.iter_events(session=name))
    times = [row.occurred_ts for row in rows]
    assert times == sorted(times), [(r.type, r.occurred_at) for r in rows]
    return [row.type for row in rows]


async def test_a_session_s_events_are_archived_in_the_order_of_their_times(
    tmp_path: Path,
) -> None:
    """session.discovered first, at the session's createTime, then its activities, for a
    session found when it is over (its updateTime then is later than its activities: the
    event took it, and `events --follow` printed it first with a later time) and for one
    of the history walk (announced after its activities)."""
    async with PollerHarness(tmp_path, backfill=False) as h:
        history = await h.api.create_session("Done before the relay's first start")
        h.clock.now += 30  # over before the first discovery: history
        report = await h.poller.run_once()  # the first discovery, then the history walk
        assert not report.failed, report
        types = _in_time_order(h, history.name)
        assert types[:2] == ["session.discovered", "activity.session_started"], types
        late = await h.api.create_session("Found when it is over")
        h.clock.now += 30
        await finish(h, late.name)
        types = _in_time_order(h, late.name)
        assert types[:2] == ["session.discovered", "activity.session_started"], types
        (discovered,) = h.store.store.operator.iter_events(
            session=late.name, type_glob="session.discovered"
        )
        assert discovered.occurred_at == (await h.api.get_session(late.name)).create_time


async def test_sessions_created_while_discovery_fails_are_not_history(tmp_path: Path) -> None:
    async with PollerHarness(tmp_path, wrap=Faults, backfill=False) as h:
        faults = h.transport(Faults)
        faults.fail(lambda r: r.url.path.endswith("/sessions"), _error(500), times=1)
        with pytest.raises(ApiError):
            await h.poller.discover()  # the first start: nothing exists yet, and it fails
        session = await h.api.create_session("Created during the outage")
        await finish(h, session.name)
        events = {e.id for e in h.store.store.operator.iter_events(session=session.name)}
        sent = {r.event_id for r in h.store.store.operator.list_deliveries(limit=1000)}
        assert events and sent == events


async def test_unchanged_idle_session_costs_no_activity_request(tmp_path: Path) -> None:
    async with PollerHarness(tmp_path) as h:
        session = await h.api.create_session("Finish and rest")
        await finish(h, session.name)
        await h.round(10)  # one more poll may follow the last change
        before = h.count("list_activities")
        for _ in range(10):
            await h.round(10)
        assert h.count("list_activities") == before
        assert h.count("get_session") == 0 or h.count("list_sessions") >= 10
        # A message moves updateTime (and the state): the session is polled again at once.
        await h.api.send_message(session.name, "One more thing")
        outcomes = await h.round(0.1)
        assert outcomes == {session.name: "ok"}
        assert h.count("list_activities") == before + 1


async def test_a_session_archived_by_a_run_that_died_before_announcing_it_is_announced(
    tmp_path: Path,
) -> None:
    async with PollerHarness(tmp_path) as h:
        session = await h.api.create_session("Task")
        await h.store.run(Ingest.upsert_session, session, baseline=False)  # then killed
        await h.poller.discover()
        types = [e.type for e in h.store.store.operator.iter_events(session=session.name)]
        assert types == ["session.discovered"]
        assert h.enqueued >= 1  # delivered: the session is not from before the first start
        assert session.name in h.poller.state.tracked


async def test_a_restart_follows_the_archive_with_one_string_per_session_and_no_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a restart, the sessions of the archive are followed without an index of it
    in memory (one lookup per page of the list, none once all are tracked), and each one's
    strings are shared: its name is its key, its state one string for all, the listed
    ``updateTime`` the polled one; a later pass leaves them as they were."""
    async with PollerHarness(tmp_path, page_size=2) as h:
        names = [(await h.api.create_session(f"Task {i}")).name for i in range(5)]
        await finish(h, *names)
        await h.round(10)
        restarted = Poller(h.client, h.store, h.poller.settings, clock=h.clock, monotonic=h.clock)
        made = store_calls(h, monkeypatch)
        gets = h.count("get_session")
        await restarted.discover()
        assert made.count("archived_among") == 3  # 5 sessions, 2 a page
        # Each page's sessions are followed at that one lookup: no store call a session.
        assert not {"get_session", "ingest_session_events"} & set(made), made
        assert h.count("get_session") == gets  # known: nothing read again
        tracked = restarted.state.tracked
        assert sorted(tracked) == sorted(names)
        held = {key: (t.name, t.state, t.listed_update_time) for key, t in tracked.items()}
        for key, t in tracked.items():
            assert t.name is key
            assert t.listed_update_time is t.polled_update_time is not None
        assert len({id(t.state) for t in tracked.values()}) == 1  # all COMPLETED
        made.clear()
        await restarted.discover()
        assert "archived_among" not in made
        assert all(
            (t.name, t.state, t.listed_update_time) == held[key]
            and t.name is held[key][0]
            and t.listed_update_time is held[key][2]
            for key, t in tracked.items()
        )


@pytest.mark.parametrize("whole", [False, True], ids=["items-repeated", "page-repeated"])
async def test_repeated_pages_archive_nothing_twice(tmp_path: Path, whole: bool) -> None:
    async with PollerHarness(tmp_path, wrap=partial(RepeatPages, whole=whole), page_size=2) as h:
        wrappers = h.transport(RepeatPages)
        session = await h.api.create_session("Paged work")
        h.clock.now += 8  # several pages wait at the first poll
        await finish(h, session.name)
        assert wrappers.repeated, "the wrapper never repeated a page"
        archived = h.archived(session.name)
        assert archived == await h.upstream_activities(session.name)


async def test_ingested_metric_counts_each_new_event_by_its_type(tmp_path: Path) -> None:
    # Repeated items make pages that are partly archived already: only the new events of
    # such a page may be counted, each under its own type.
    async with PollerHarness(tmp_path, wrap=partial(RepeatPages, whole=False), page_size=2) as h:
        session = await h.api.create_session("Paged work")
        h.clock.now += 8
        await finish(h, session.name)
        archived = Counter(e.type for e in h.store.store.operator.iter_events())
        counted = {
            sample.labels["type"]: sample.value
            for family in text_string_to_metric_families(h.metrics.render().decode())
            if family.name == "sessionhook_events_ingested"
            for sample in family.samples
            if sample.name.endswith("_total")
        }
        assert counted == {t: float(n) for t, n in archived.items()}
        assert "activity.progress_updated" in counted


class LateActivity(httpx.AsyncBaseTransport):
    """Hides one activity from activity lists until released: a server that commits an
    activity late, with a createTime already well behind the newest ones."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner
        self.hidden: str | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        if self.hidden is None or not request.url.path.endswith("/activities"):
            return response
        page = json.loads(await response.aread())
        kept = [a for a in page.get("activities", []) if a["name"] != self.hidden]
        return httpx.Response(response.status_code, json={**page, "activities": kept})


async def test_an_activity_committed_late_is_archived_when_the_session_settles(
    tmp_path: Path,
) -> None:
    async with PollerHarness(tmp_path, wrap=LateActivity) as h:
        late = h.transport(LateActivity)
        session = await h.api.create_session("Late commit")
        h.clock.now += 1.5
        hidden = (await h.upstream_activities(session.name))[-1]
        late.hidden = hidden
        for _ in range(3):  # the cursor moves past the hidden activity's createTime + overlap
            await h.round()
        row = await h.store.run(Ingest.get_session, session.name)
        assert row is not None and row.activity_cursor
        hidden_at = (await h.api.get_activity(hidden)).create_time
        assert parse_timestamp(row.activity_cursor) - parse_timestamp(hidden_at) > timedelta(
            seconds=1
        )
        assert (await h.api.get_session(session.name)).state in ACTIVE_STATES
        assert hidden not in h.archived(session.name)
        late.hidden = None  # committed now, while the session works, behind the cursor
        await finish(h, session.name)
        assert hidden in h.archived(session.name)


class RepeatPages(httpx.AsyncBaseTransport):
    """Server glitches on the activity list, once per page token.

    ``whole=False``: the page also carries the previous page's items (a shifting list).
    ``whole=True``: the previous page is answered again, token and all (a replay, which the
    client reports as a pagination loop; the poller must back off and recover).
    """

    def __init__(self, inner: httpx.AsyncBaseTransport, *, whole: bool) -> None:
        self._inner = inner
        self._whole = whole
        self._previous: dict[str, dict[str, Any]] = {}
        self.repeated: set[str] = set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        if not request.url.path.endswith("/activities") or response.status_code != 200:
            return response
        page = json.loads(await response.aread())
        token = request.url.params.get("pageToken")
        previous = self._previous.get(request.url.path)
        self._previous[request.url.path] = page
        if token and token not in self.repeated and previous is not None:
            self.repeated.add(token)
            if self._whole:
                return httpx.Response(200, json=previous)
            page = {**page, "activities": previous["activities"] + page["activities"]}
        return httpx.Response(200, json=page)


class Faults(httpx.AsyncBaseTransport):
    """Answers chosen requests with a canned error before passing the rest through."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner
        self.rules: list[tuple[Callable[[httpx.Request], bool], httpx.Response, int]] = []
        self.hits: list[str] = []

    def fail(
        self, match: Callable[[httpx.Request], bool], response: httpx.Response, times: int
    ) -> None:
        self.rules.append((match, response, times))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        for i, (match, response, times) in enumerate(self.rules):
            if times > 0 and match(request):
                self.rules[i] = (match, response, times - 1)
                self.hits.append(request.url.path)
                return httpx.Response(
                    response.status_code, content=response.content, headers=response.headers
                )
        return await self._inner.handle_async_request(request)


def _error(status: int, **headers: str) -> httpx.Response:
    body = {"error": {"code": status, "message": "injected", "status": "INJECTED"}}
    return httpx.Response(status, json=body, headers=headers)


async def test_upstream_429_backs_off_one_session_and_the_others_go_on(tmp_path: Path) -> None:
    async with PollerHarness(tmp_path, wrap=Faults) as h:
        faults = h.transport(Faults)
        slow = await h.api.create_session("Throttled one")
        fast = await h.api.create_session("Free one")
        slow_id = slow.name.removeprefix("sessions/")
        faults.fail(
            lambda r: r.url.path.endswith(f"{slow_id}/activities"),
            _error(429, **{"retry-after": "7"}),
            times=1,
        )
        outcomes = await h.round(2)
        assert outcomes[slow.name] == "retry" and outcomes[fast.name] == "ok"
        # Not before Retry-After, although the other session is polled meanwhile.
        for _ in range(5):
            outcomes = await h.round(1)
            assert slow.name not in outcomes
        outcomes = await h.round(2.5)
        assert outcomes.get(slow.name) == "ok"
        await finish(h, slow.name, fast.name)
        assert h.archived(slow.name) == await h.upstream_activities(slow.name)


async def test_server_errors_mid_walk_lose_nothing(tmp_path: Path) -> None:
    async with PollerHarness(tmp_path, wrap=Faults, page_size=2) as h:
        faults = h.transport(Faults)
        session = await h.api.create_session("Bumpy road")
        h.clock.now += 6  # several activities wait, over several pages
        # Every second page request fails once with a 500, then discovery once too.
        faults.fail(lambda r: "pageToken" in str(r.url), _error(500), times=3)
        faults.fail(lambda r: r.url.path.endswith("/sessions"), _error(503), times=1)
        for _ in range(3):
            h.clock.now += 40
            with contextlib.suppress(ApiError):
                await h.poller.discover()
            await h.poller.poll_due()
        await finish(h, session.name)
        assert len(faults.hits) == 4
        archived = h.archived(session.name)
        assert archived == await h.upstream_activities(session.name)


async def test_a_404_is_transient_for_a_young_session_and_final_later(tmp_path: Path) -> None:
    async with PollerHarness(tmp_path, wrap=Faults) as h:
        faults = h.transport(Faults)
        session = await h.api.create_session("Vanishing")
        sid = session.name.removeprefix("sessions/")
        # Right after creation the service may not find the session it lists.
        faults.fail(lambda r: r.url.path.endswith(sid), _error(404), times=1)
        faults.fail(lambda r: r.url.path.endswith(f"{sid}/activities"), _error(404), times=1)
        with capture_logs() as logs:
            await h.poller.discover()  # GET 404: announced at the next pass, whole
            assert await h.poller.poll_due() == {}
            h.clock.now += 2  # past its backoff
            await h.poller.discover()
            assert await h.poller.poll_due() == {session.name: "retry"}
            h.clock.now += 1.5  # past the backoff, still working (IN_PROGRESS)
            assert await h.poller.poll_due() == {session.name: "ok"}
            discovered = list(h.store.store.operator.iter_events(type_glob="session.discovered"))
            assert discovered[0].payload()["data"]["session"]["url"]  # not the list item
            # Deleted later: the 404 is final, the session is dropped with a log line.
            await h.api.delete_session(session.name)
            h.clock.now += 27  # 30 s after it was first seen
            assert await h.poller.poll_due() == {session.name: "gone"}
            for _ in range(3):
                assert await h.round(5) == {}
        assert [e["session"] for e in logs if e["event"] == "poll.session_gone"] == [session.name]


async def test_a_failing_get_of_one_new_session_holds_up_neither_the_pass_nor_the_others(
    tmp_path: Path,
) -> None:
    async with PollerHarness(tmp_path, wrap=Faults) as h:
        faults = h.transport(Faults)
        unlucky = await h.api.create_session("Unlucky")
        lucky = await h.api.create_session("Lucky")
        uid = unlucky.name.removeprefix("sessions/")
        faults.fail(lambda r: r.url.path.endswith(uid), _error(500), times=2)
        await h.poller.discover()  # no exception: the pass itself succeeded
        assert await h.poller.poll_due() == {lucky.name: "ok"}
        h.clock.now += 0.1
        await h.poller.discover()  # within its (short) backoff: not asked again yet
        assert len(faults.hits) == 1
        h.clock.now += 1
        await h.poller.discover()  # asked again: fails again, backs off further
        assert len(faults.hits) == 2
        h.clock.now += 3
        await h.poller.discover()
        assert unlucky.name in await h.poller.poll_due()
        announced = {
            e.session_name
            for e in h.store.store.operator.iter_events(type_glob="session.discovered")
        }
        assert announced == {lucky.name, unlucky.name}


async def test_malformed_answer_is_logged_and_retried(tmp_path: Path) -> None:
    async with PollerHarness(tmp_path, wrap=Faults) as h:
        faults = h.transport(Faults)
        session = await h.api.create_session("Garbled")
        faults.fail(
            lambda r: r.url.path.endswith("/activities"),
            httpx.Response(200, content=b"<html>proxy error</html>"),
            times=1,
        )
        with capture_logs() as logs:
            assert (await h.round(3))[session.name] == "retry"
        failure = next(e for e in logs if e["event"] == "poll.failed")
        assert failure["reason"] == "malformed response"
        assert "proxy error" in failure["body"]
        await finish(h, session.name)
        assert h.archived(session.name) == await h.upstream_activities(session.name)


async def test_time_filter_refused_falls_back_to_walking_everything(tmp_path: Path) -> None:
    async with PollerHarness(tmp_path, wrap=Faults) as h:
        faults = h.transport(Faults)
        session = await h.api.create_session("Old server")
        faults.fail(lambda r: "createTime" in str(r.url), _error(400), times=1000)
        await finish(h, session.name)
        assert h.archived(session.name) == await h.upstream_activities(session.name)


async def test_rejected_key_is_logged_loudly_and_retried_slowly(tmp_path: Path) -> None:
    async with PollerHarness(tmp_path, api_key="wrong") as h:
        with capture_logs() as logs, anyio.move_on_after(0.5):
            await h.poller.run()
        assert h.count("list_sessions") == 1  # no hammering: the next try is a minute away
        loud = [e for e in logs if e["event"] == "upstream.unauthenticated"]
        assert loud and loud[0]["log_level"] == "error"
        assert "API key rejected" in loud[0]["message"]
        assert loud[0]["retry_in"] >= 60
        assert h.poller.first_pass_done.is_set()  # readiness does not wait forever
        report = await h.poller.run_once(max_attempts=1)
        assert report.unauthenticated is not None


class EqualTimes:
    """A fake API: three activities with one createTime, pages of one, and a filter that
    is strictly exclusive; the second page fails the first time."""

    TIME = "2025-05-01T10:00:00.000000Z"

    def __init__(self) -> None:
        self.failed = False
        self.names = [f"sessions/1/activities/{c * 32}" for c in "abc"]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/sessions"):
            item = {"name": "sessions/1", "state": "IN_PROGRESS", "updateTime": self.TIME}
            return httpx.Response(200, json={"sessions": [item]})
        if path.endswith("/sessions/1"):
            return httpx.Response(200, json={"name": "sessions/1", "state": "IN_PROGRESS"})
        since = request.url.params.get("createTime")
        rows = [
            {"name": n, "createTime": self.TIME, "progressUpdated": {"title": n[-1]}}
            for n in self.names
            if since is None or since < self.TIME
        ]
        start = int(request.url.params.get("pageToken") or 0)
        if start == 1 and not self.failed:
            self.failed = True
            return _error(500)
        page: dict[str, Any] = {"activities": rows[start : start + 1]}
        if start + 1 < len(rows):
            page["nextPageToken"] = str(start + 1)
        return httpx.Response(200, json=page)


async def test_cursor_overlap_keeps_equal_timestamps_after_a_failed_page(
    tmp_path: Path,
) -> None:
    fake = EqualTimes()
    clock = Clock(1_750_000_000.0)
    async with (
        httpx.AsyncClient(transport=httpx.MockTransport(fake)) as http,
    ):
        client = SessionsClient(
            http, base_url="http://fake.test", api_key="k", retry=RetryPolicy(max_attempts=1)
        )
        store = await AsyncStore.open(tmp_path / "db", clock=clock)
        poller = Poller(
            client,
            store,
            PollSettings(backfill=True, page_size=1),
            clock=clock,
            monotonic=clock,
            rng=random.Random(0),
        )
        await poller.discover()
        assert await poller.poll_due() == {"sessions/1": "retry"}
        clock.now += 60
        assert await poller.poll_due() == {"sessions/1": "ok"}
        archived = [e.activity_name for e in store.store.operator.iter_events() if e.activity_name]
        await store.close()
    assert archived == fake.names


async def test_scheduler_shares_the_budget_fairly_between_sessions(tmp_path: Path) -> None:
    # Real time: six working sessions always overdue, a budget of 20 requests a second.
    # Most-overdue-first means round robin: no session starves.
    emulator = create_app(api_keys=("k",), step_delay=30.0, seed=3)
    polls: dict[str, int] = {}

    async def record(label: str, status: int | None) -> None:
        polls[label] = polls.get(label, 0) + 1

    per_session: dict[str, int] = {}
    enough = anyio.Event()
    counting = False  # from the end of the first discovery pass on

    class Count(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if counting and request.url.path.endswith("/activities"):
                name = request.url.path.split("/")[-2]
                per_session[name] = per_session.get(name, 0) + 1
                if sum(per_session.values()) >= 36:
                    enough.set()
            return await inner.handle_async_request(request)

    inner = httpx.ASGITransport(emulator)
    limited = LimitedTransport(Count(), RateLimiter(1200, burst=1), record=record)
    async with httpx.AsyncClient(transport=limited) as http:
        client = SessionsClient(
            http, base_url="http://emu.test", api_key="k", retry=RetryPolicy(max_attempts=1)
        )
        for i in range(6):
            await client.create_session(f"Task {i}")
        store = await AsyncStore.open(tmp_path / "db")
        poller = Poller(
            client,
            store,
            PollSettings(active_interval=0.01, discovery_interval=60.0, concurrency=2),
        )
        with anyio.move_on_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(poller.run)
                await poller.first_pass_done.wait()
                counting = True
                await enough.wait()
                tg.cancel_scope.cancel()
        await store.close()
    assert len(per_session) == 6
    assert max(per_session.values()) - min(per_session.values()) <= 2, per_session


class Meanwhile(httpx.AsyncBaseTransport):
    """Answers a session's first activity request with a 429 after running ``action``
    (which sees the request in flight), and passes everything else through."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner
        self.target = ""
        self.action: Callable[[], Awaitable[None]] | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.target and request.url.path.endswith(f"{self.target}/activities"):
            self.target = ""
            if self.action is not None:
                await self.action()
            return _error(429, **{"retry-after": "5"})
        return await self._inner.handle_async_request(request)


async def test_backoff_wins_over_a_change_seen_while_the_poll_ran(tmp_path: Path) -> None:
    async with PollerHarness(tmp_path, wrap=Meanwhile) as h:
        wrappers = h.transport(Meanwhile)
        session = await h.api.create_session("Changes while throttled")
        await h.round(3.5)  # working: polled every active_interval

        async def change_and_discover() -> None:
            await h.api.send_message(session.name, "Also this")  # updateTime moves
            await h.poller.discover()  # ...and discovery sees it while the poll runs

        wrappers.target = session.name.removeprefix("sessions/")
        wrappers.action = change_and_discover
        h.clock.now += 1.5  # the next poll is due
        assert await h.poller.poll_due() == {session.name: "retry"}
        assert h.poller.due(h.clock.now + 3.9) == []  # Retry-After: 5 holds
        assert h.poller.due(h.clock.now + 6.1) == [session.name]


class _Walked(dict[str, Any]):
    """The tracked sessions, counting the walks over all of them."""

    walks = 0

    def values(self) -> Any:
        self.walks += 1
        return super().values()

    def items(self) -> Any:
        self.walks += 1
        return super().items()

    def __iter__(self) -> Any:
        self.walks += 1
        return super().__iter__()


async def test_which_sessions_are_due_is_found_without_walking_every_tracked_one(
    tmp_path: Path,
) -> None:
    """100,000 sessions tracked, nearly all idle: a round of the scheduler (every second
    at least) looks at the sessions given a due time, not at each one tracked."""
    async with PollerHarness(tmp_path) as h:
        names = [(await h.api.create_session(f"Task {i}")).name for i in range(3)]
        await finish(h, *names)
        assert h.poller.due(math.inf) == []  # finished: idle, nothing due
        walked = _Walked(h.poller.state.tracked)
        h.poller.state.tracked = walked

        def due(at: float) -> list[str]:
            walks = walked.walks
            names = h.poller.due(at)
            assert walked.walks == walks  # found without a walk over every session
            return names

        await h.api.send_message(names[1], "One more thing")  # updateTime moves
        await h.poller.discover()
        assert due(math.inf) == [names[1]]
        gone = walked.pop(names[1])  # a session no longer tracked is never due
        assert due(math.inf) == []
        walked[names[1]] = gone
        h.poller.scheduler.schedule(gone, h.clock.now)
        assert due(h.clock.now) == [names[1]]
        assert await h.poller.poll_due() == {names[1]: "ok"}
