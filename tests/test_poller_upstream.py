"""The poller against a hostile upstream (emulator + a tampering transport, fake clock):
foreign and duplicate names, future createTimes, one activity too large, runaway pages."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from email.utils import formatdate
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from sessionhook.api import RetryPolicy
from sessionhook.api.client import SessionsClient
from sessionhook.api.errors import PageLimitError
from sessionhook.api.models import Activity, Session, parse_timestamp
from sessionhook.relay.domain import events
from sessionhook.relay.polling import name_problem
from sessionhook.relay.store import Ingest
from tests.support.poller_harness import PollerHarness, finish

pytestmark = [pytest.mark.app, pytest.mark.anyio]

Page = dict[str, Any]


class Tamper(httpx.AsyncBaseTransport):
    """Rewrites the JSON of activity list answers with ``edit(path, page) -> page``;
    ``headers`` are added to every answer."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner
        self.edit: Callable[[str, Page], Page] | None = None
        self.headers: Callable[[], dict[str, str]] | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        body = await response.aread()
        headers = dict(response.headers)
        headers.pop("content-length", None)
        if self.headers is not None:
            headers.update(self.headers())
        if (
            self.edit is not None
            and request.url.path.endswith("/activities")
            and response.status_code == 200
        ):
            body = json.dumps(self.edit(request.url.path, json.loads(body))).encode()
        return httpx.Response(response.status_code, content=body, headers=headers)

    def add_items(self, session: str, items: list[Page], *, first: bool = False) -> None:
        """Every activity page of ``session`` also lists ``items`` (after its own, or
        ``first``)."""

        def edit(path: str, page: Page) -> Page:
            if session not in path:
                return page
            own = page.get("activities", [])
            return {**page, "activities": [*items, *own] if first else [*own, *items]}

        self.edit = edit

    def change_item(self, name: str, **fields: Any) -> None:
        """The activity ``name`` is listed with ``fields`` changed."""

        def edit(path: str, page: Page) -> Page:
            for activity in page.get("activities", []):
                if activity["name"] == name:
                    activity.update(fields)
            return page

        self.edit = edit


def refused(h: PollerHarness) -> dict[str, str]:
    return {r.name: r.reason for r in h.store.store.refusals.refused_activities()}


def metric(h: PollerHarness, name: str, **labels: str) -> float:
    value = h.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_name_problem() -> None:
    assert name_problem("sessions/1/activities/a", "sessions/1") is None
    assert name_problem("sessions/2/activities/a", "sessions/1") == "foreign_name"
    assert name_problem("sessions/11/activities/a", "sessions/1") == "foreign_name"
    for bad in ("", "garbage", "sessions/1/activities/", " sessions/1/activities/a", "a/b/c/d"):
        assert name_problem(bad, "sessions/1") == "not_a_name", bad


async def test_foreign_and_nameless_activities_are_refused_and_the_page_goes_on(
    tmp_path: Path,
) -> None:
    async with PollerHarness(tmp_path, wrap=Tamper) as h:
        tamper = h.transport(Tamper)
        session = await h.api.create_session("Mixed page")
        other = await h.api.create_session("The other one")
        strangers = [
            {"name": f"{other.name}/activities/{'f' * 32}", "createTime": "2025-06-15T00:00:00Z"},
            {"name": "garbage", "createTime": "2025-06-15T00:00:00Z"},
        ]
        tamper.add_items(session.name, strangers)
        with capture_logs() as logs:
            await finish(h, session.name, other.name)
        assert h.archived(session.name) == await h.upstream_activities(session.name)
        assert h.archived(other.name) == await h.upstream_activities(other.name)
        assert refused(h) == {strangers[0]["name"]: "foreign_name", "garbage": "not_a_name"}
        warned = [
            e for e in logs if e["event"] == "poll.activity_refused" and e["log_level"] == "warning"
        ]
        # A warning the first time; met again at later polls, only a debug line.
        assert sorted((e["name"], e["reason"], e["session"]) for e in warned) == [
            ("garbage", "not_a_name", session.name),
            (strangers[0]["name"], "foreign_name", session.name),
        ]
        name = "sessionhook_activities_refused_total"
        assert metric(h, name, reason="foreign_name") == 1
        assert metric(h, name, reason="not_a_name") == 1
        summary = h.store.store.operator.status_summary(h.clock())
        assert summary.refused.total == 2


async def test_items_that_are_no_activity_are_refused_and_the_page_goes_on(
    tmp_path: Path,
) -> None:
    async with PollerHarness(tmp_path, wrap=Tamper) as h:
        tamper = h.transport(Tamper)
        session = await h.api.create_session("Broken items")
        broken = [
            {"createTime": "2025-06-15T00:00:00Z", "agentMessaged": {}},  # no name
            {"name": 42},  # not a string
        ]
        tamper.add_items(session.name, broken, first=True)
        await finish(h, session.name)
        assert h.archived(session.name) == await h.upstream_activities(session.name)
        rows = h.store.store.refusals.refused_activities()
        assert [(r.name, r.reason) for r in rows] == [("", "malformed")]  # nameless: one row
        assert rows[0].count >= 2
        assert "not an activity" in rows[0].detail
        assert metric(h, "sessionhook_activities_refused_total", reason="malformed") == 1


async def test_text_that_is_not_unicode_is_refused_and_the_daemon_goes_on(
    tmp_path: Path,
) -> None:
    """A lone surrogate escape ("\\ud800") parses as JSON but is no text: nothing can
    archive, log or send it. Its activity is refused as malformed (its name kept only if
    it is text), the others of the page are archived: never an exception out of the
    poller."""
    async with PollerHarness(tmp_path, wrap=Tamper) as h:
        tamper = h.transport(Tamper)
        session = await h.api.create_session("Surrogates")
        bad = [
            {
                "name": f"{session.name}/activities/{'d' * 32}",
                "createTime": "2025-06-15T00:00:00Z",
                "agentMessaged": {"agentMessage": "half an emoji \ud83d"},
            },
            {"name": f"{session.name}/activities/\udc00", "createTime": "2025-06-15T00:00:00Z"},
        ]
        tamper.add_items(session.name, bad)
        await finish(h, session.name)
        assert h.archived(session.name) == await h.upstream_activities(session.name)
        rows = {r.name: r for r in h.store.store.refusals.refused_activities()}
        assert set(rows) == {bad[0]["name"], ""}
        assert all(r.reason == "malformed" and "not Unicode" in r.detail for r in rows.values())


async def test_a_name_archived_under_another_session_is_refused_as_duplicate(
    tmp_path: Path,
) -> None:
    async with PollerHarness(tmp_path, wrap=Tamper) as h:
        decoy = await h.api.create_session("Decoy")
        await finish(h, decoy.name)
        session = await h.api.create_session("Victim")
        h.clock.now += 3
        victim = await h.upstream_activities(session.name)
        # An archive written by a version that accepted foreign names: the victim's first
        # activity sits under the decoy already.
        stolen = Activity(name=victim[0], create_time="2025-06-15T00:00:00Z")
        await h.store.run(Ingest.ingest_activities, decoy.name, [stolen], [], False)
        for _ in range(30):
            await h.round()
        upstream = await h.upstream_activities(session.name)
        assert sorted(h.archived(session.name)) == sorted(upstream[1:])
        assert refused(h) == {victim[0]: "duplicate_name"}
        assert metric(h, "sessionhook_activities_refused_total", reason="duplicate_name") == 1


async def test_a_createtime_in_the_future_does_not_carry_the_cursor_past_what_comes(
    tmp_path: Path,
) -> None:
    async with PollerHarness(tmp_path, wrap=Tamper) as h:
        tamper = h.transport(Tamper)
        session = await h.api.create_session("Time traveller")
        await h.round(2)
        first = (await h.upstream_activities(session.name))[0]
        tamper.change_item(first, createTime="9999-12-31T23:59:59.999999Z")
        # The service's clock, one second resolution, as HTTP dates are.
        tamper.headers = lambda: {"date": formatdate(h.clock(), usegmt=True)}
        await h.round(1)
        assert first in h.archived(session.name)  # archived and delivered, not dropped
        await finish(h, session.name)
        assert sorted(h.archived(session.name)) == sorted(await h.upstream_activities(session.name))
        row = h.store.store.ingest.get_session(session.name)
        assert row is not None and row.activity_cursor is not None
        assert parse_timestamp(row.activity_cursor).year < 9999
        assert parse_timestamp(row.activity_cursor).timestamp() <= h.clock() + 1.0


async def test_one_activity_too_large_is_refused_by_name_and_the_walk_goes_on(
    tmp_path: Path,
) -> None:
    h = PollerHarness(tmp_path, wrap=Tamper, page_size=4)
    tamper = h.transport(Tamper)
    limit = 64 * 1024
    h.client = SessionsClient(
        h._http,  # the harness's counted transport
        base_url="http://emu.test",
        api_key="k",
        retry=RetryPolicy(max_attempts=1),
        max_response_bytes=limit,
    )
    async with h:
        session = await h.api.create_session("Screenshot heavy")
        h.clock.now += 6
        upstream = await h.upstream_activities(session.name)
        huge = upstream[2]
        tamper.change_item(
            huge, artifacts=[{"media": {"mimeType": "image/png", "data": "A" * 3 * limit}}]
        )
        with capture_logs() as logs:
            for _ in range(30):
                await h.round()
        assert (await h.api.get_session(session.name)).state == "COMPLETED"
        archived = h.archived(session.name)
        assert huge not in archived
        assert sorted(archived) == sorted(
            n for n in await h.upstream_activities(session.name) if n != huge
        )
        assert refused(h) == {huge: "too_large"}
        row = h.store.store.refusals.refused_activities()[0]
        assert row.size is not None and row.size > 3 * limit
        assert row.create_time  # the scan found its createTime
        first = [e for e in logs if e["event"] == "poll.activity_refused"]
        assert first[0]["reason"] == "too_large" and first[0]["log_level"] == "warning"
        assert metric(h, "sessionhook_activities_refused_total", reason="too_large") == 1


async def test_runaway_pagination_backs_the_session_off_with_growing_delays(
    tmp_path: Path,
) -> None:
    async with PollerHarness(tmp_path, wrap=Tamper, max_pages=3) as h:
        tamper = h.transport(Tamper)
        session = await h.api.create_session("Endless")
        healthy = await h.api.create_session("Healthy")
        counter = iter(range(10**6))

        def edit(path: str, page: Page) -> Page:
            if session.name in path:
                return {**page, "nextPageToken": f"fresh-{next(counter)}"}
            return page

        class StripToken(httpx.AsyncBaseTransport):
            """The emulator would refuse our invented tokens: drop them on the way in."""

            def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
                self._inner = inner

            async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                token = request.url.params.get("pageToken", "")
                if token.startswith("fresh-"):
                    request.url = request.url.copy_remove_param("pageToken")
                return await self._inner.handle_async_request(request)

        tamper._inner = StripToken(tamper._inner)
        tamper.edit = edit
        tracked_delays: list[float] = []
        with capture_logs() as logs:
            for _ in range(6):
                outcomes = await h.round(40)
                tracked = h.poller.state.tracked[session.name]
                if outcomes.get(session.name) == "retry":
                    tracked_delays.append(tracked.backoff_until - h.clock())
        assert len(tracked_delays) >= 3
        assert tracked_delays[1] > tracked_delays[0] * 1.3  # growing
        # The same page under a fresh token: a loop at its second page, long before
        # max_pages (3 here) would stop it.
        failures = [e for e in logs if e["event"] == "poll.failed" and e.get("kind") == "page_loop"]
        assert failures and all(e["session"] == session.name for e in failures)
        assert all("page 2 brought nothing new" in e["error"] for e in failures)
        assert (
            metric(h, "sessionhook_upstream_failures_total", loop="session", kind="page_loop") >= 3
        )
        # The other session is polled all along, and what the runaway one listed is archived.
        assert h.archived(healthy.name)
        assert h.archived(session.name)


class EndlessEmptyList(httpx.AsyncBaseTransport):
    """The session list (not the archived one) answers an empty page under a fresh token,
    forever; every other request goes to ``inner``."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner
        self.on = False
        self.pages = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        listing = request.url.path.endswith("/sessions") and "filter" not in request.url.params
        if not (self.on and listing):
            return await self._inner.handle_async_request(request)
        self.pages += 1
        return httpx.Response(200, json={"sessions": [], "nextPageToken": f"t{self.pages}"})


async def test_an_account_past_max_pages_is_followed_to_the_bound_and_warned_once(
    tmp_path: Path,
) -> None:
    """Five sessions, pages of two, at most two pages: the pass follows the newest four
    (the list is newest first) and succeeds; one line says what is cut and what to raise."""
    async with PollerHarness(tmp_path, page_size=2, max_pages=2) as h:
        made = [await h.api.create_session(f"Task {i}") for i in range(5)]
        with capture_logs() as logs:
            for _ in range(3):
                await h.round()
        assert set(h.poller.state.tracked) == {s.name for s in made[1:]}
        assert not [e for e in logs if e["event"] == "discovery.failed"], logs
        cut = [e for e in logs if e["event"] == "discovery.list_cut"]
        assert len(cut) == 1, cut  # once while it lasts, not once a pass
        assert cut[0]["log_level"] == "warning"
        assert (cut[0]["list"], cut[0]["pages"], cut[0]["sessions"]) == ("sessions", 2, 4)
        assert "raise poll.max_pages" in cut[0]["message"]
        assert h.poller.state.last_success is not None
        assert h.store.store.operator.status_summary(h.clock()).upstream.list_cut == 4
        h.poller.settings = replace(h.poller.settings, max_pages=10)  # a reload raised it
        await h.round()
        assert h.store.store.operator.status_summary(h.clock()).upstream.list_cut is None


async def test_a_session_list_of_empty_pages_past_max_pages_still_fails_the_pass(
    tmp_path: Path,
) -> None:
    """Fewer sessions than pages at the bound: pagination without end, not a large account."""
    async with PollerHarness(tmp_path, wrap=EndlessEmptyList, max_pages=3) as h:
        endless = h.transport(EndlessEmptyList)
        await h.api.create_session("Task")
        await h.round()
        endless.on = True
        with pytest.raises(PageLimitError), capture_logs() as logs:
            await h.round()
        assert endless.pages == 3
        assert not [e for e in logs if e["event"] == "discovery.list_cut"]


def test_webhook_timestamp_is_always_rfc3339() -> None:
    assert events.webhook_timestamp("2026-01-02T03:04:05.123456Z") == "2026-01-02T03:04:05.123456Z"
    assert events.webhook_timestamp("2026-01-02T03:04:05+02:00") == "2026-01-02T03:04:05+02:00"
    assert events.webhook_timestamp("2026-01-02 03:04:05") == "2026-01-02T03:04:05.000000Z"
    for junk in ("garbage", "", "2026-13-01T00:00:00Z", "0001-01-01T00:00:00+01:00"):
        assert events.webhook_timestamp(junk, now=0.0) == "1970-01-01T00:00:00.000000Z", junk


def test_an_activity_with_a_garbage_time_keeps_it_raw_and_gets_an_rfc3339_timestamp() -> None:
    session = Session(name="sessions/1")
    activity = Activity.model_validate(
        {"name": "sessions/1/activities/a", "createTime": "garbage", "agentMessaged": {}}
    )
    event = events.activity_event(session, activity, max_media_bytes=100, now=1_750_000_000.0)
    body = event.payload()
    assert body["timestamp"] == "2025-06-15T15:06:40.000000Z"
    assert body["data"]["activity"]["createTime"] == "garbage"
    assert event.occurred_ts == 1_750_000_000.0


def test_lifecycle_events_carry_an_rfc3339_timestamp_too() -> None:
    from sessionhook.relay.domain.lifecycle import lifecycle_events

    session = Session(name="sessions/1", state="COMPLETED", update_time="garbage")
    done = Activity.model_validate(
        {"name": "sessions/1/activities/a", "createTime": "garbage", "sessionCompleted": {}}
    )
    (event,) = lifecycle_events(session, done, entered=True, now=1_750_000_000.0)
    assert event.payload()["timestamp"] == "2025-06-15T15:06:40.000000Z"
