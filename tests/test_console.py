"""The web console in process: its store queries, the chart, the pages' escaping, the
actions' CSRF check and form bounds, the live feed's resume. (The browser tests in
test_console_browser.py drive the same pages in Chromium against ``sessionhook run``.)"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette

from sessionhook.relay.domain.retry import AttemptResult, Dead, Delivered
from sessionhook.relay.ops import OperatorError
from sessionhook.relay.store import AsyncStore, Store
from sessionhook.relay.store.console_queries import MinuteCounts
from sessionhook.relay.web.auth import MAX_FORM_BYTES
from sessionhook.relay.web.console.chart import HEIGHT, WIDTH, minute_chart
from sessionhook.relay.web.console.common import ConsoleDeps
from sessionhook.relay.web.console.routes import console_routes
from tests.support.backends import Backend
from tests.support.clock import T0, Clock
from tests.support.console_app import BASE, TOKEN, app_for, form, logged_in
from tests.support.store_rows import Ep, activity, ingest, ready, session

pytestmark = pytest.mark.app

HOSTILE = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


@pytest.fixture
def clock() -> Clock:
    return Clock(T0 + 600)


@pytest.fixture
def store(backend: Backend, clock: Clock) -> Iterator[Store]:
    with backend.open(clock=clock) as opened:
        yield opened


def attempt(status: int | None, at: float, body: str = "", error: str | None = None) -> Any:
    return AttemptResult(status, error, 12.5, body, None, at)


def populate(store: Store) -> dict[str, Any]:
    """Two endpoints, two sessions (one with a hostile title and prompt), attempts."""
    ready(store, Ep("alpha"), Ep("beta"), sessions=0)
    hostile = session(1, title=f"Hostile {HOSTILE}", state="IN_PROGRESS")
    calm = session(2, title="Calm 100%_done", state="COMPLETED")
    for s in (hostile, calm):
        store.ingest.upsert_session(s, baseline=False)
    ingest(store, hostile, [activity(1, 1, userMessaged={"userMessage": HOSTILE})])
    ingest(store, calm, [activity(2, 2), activity(2, 3)])
    deliveries = store.operator.list_deliveries(limit=50)
    by = {(d.session_name, d.endpoint, d.event_id): d for d in deliveries}
    hostile_beta = next(d for (s, ep, _), d in by.items() if s == hostile.name and ep == "beta")
    hostile_alpha = next(d for (s, ep, _), d in by.items() if s == hostile.name and ep == "alpha")
    store.outbox.record_attempt(hostile_alpha.id, attempt(200, T0 + 10, "ok"), Delivered())
    store.outbox.record_attempt(
        hostile_beta.id, attempt(500, T0 + 70, f"broke {HOSTILE}", "HTTP 500"), Dead("gave up")
    )
    return {"hostile": hostile.name, "calm": calm.name, "beta": hostile_beta}


# --------------------------------------------------------------------------- queries


def test_sessions_filter_by_state_account_and_text_with_wildcards_taken_literally(
    store: Store,
) -> None:
    names = populate(store)
    every = store.console.console_sessions()
    assert [s.name for s in every] == [names["calm"], names["hostile"]]  # latest event first
    assert every[0].events == 2 and every[0].last_event_type == "activity.progress_updated"
    assert [s.name for s in store.console.console_sessions(state="COMPLETED")] == [names["calm"]]
    assert [s.name for s in store.console.console_sessions(text="hostile")] == [names["hostile"]]
    assert [s.name for s in store.console.console_sessions(text="100%_D")] == [names["calm"]]
    assert store.console.console_sessions(text="1000") == []  # % and _ are not wildcards
    assert store.console.console_sessions(account="nobody") == []
    assert store.console.console_session_facets() == (["COMPLETED", "IN_PROGRESS"], ["default"])


def test_timeline_deliveries_and_attempts_of_a_session(store: Store) -> None:
    names = populate(store)
    events = store.console.console_timeline(names["hostile"])
    assert [e.type for e in events][-1] == "activity.user_messaged"
    assert HOSTILE.encode() in events[-1].body
    deliveries = store.console.deliveries_of_events([e.id for e in events])
    assert {d.endpoint for d in deliveries} == {"alpha", "beta"}
    attempts = store.console.attempts_of_deliveries([d.id for d in deliveries])
    assert sorted(a.status_code for a in attempts) == [200, 500]
    assert store.console.console_timeline(names["hostile"], after_seq=events[-1].seq) == []
    assert (
        store.console.deliveries_of_events([]) == []
        and store.console.attempts_of_deliveries([]) == []
    )
    with pytest.raises(ValueError):
        store.console.deliveries_of_events(["x"] * 501)


def test_deliveries_filter_by_endpoint_status_and_time(store: Store, clock: Clock) -> None:
    names = populate(store)
    dead = store.operator.list_deliveries(status="dead")
    assert [d.id for d in dead] == [names["beta"].id]
    assert all(d.endpoint == "alpha" for d in store.operator.list_deliveries(endpoint="alpha"))
    assert store.operator.list_deliveries(since=clock.now + 1) == []
    assert len(store.operator.list_deliveries(until=clock.now + 1)) == 6
    newest = store.operator.list_deliveries(limit=2)
    older = store.operator.list_deliveries(before_id=newest[-1].id)
    assert all(d.id < newest[-1].id for d in older) and len(newest) + len(older) == 6


def test_attempts_per_minute_buckets_2xx_against_the_rest(store: Store) -> None:
    populate(store)
    start = int(T0)
    assert store.console.attempts_per_minute(start, 5) == [
        MinuteCounts(minute=0, ok=1, failed=0),
        MinuteCounts(minute=1, ok=0, failed=1),
    ]
    assert store.console.attempts_per_minute(start + 60, 1) == [MinuteCounts(0, 0, 1)]
    assert store.console.attempts_per_minute(start + 120, 60) == []


def test_events_after_a_seq_for_the_live_feed(store: Store) -> None:
    names = populate(store)
    everything = store.console.console_events_after(0)
    assert [e.seq for e in everything] == sorted(e.seq for e in everything)
    assert [e.id for e in everything] == [e.id for e in store.operator.events_after(0)]
    assert store.console.console_events_after(everything[-1].seq) == []
    mine = store.console.console_events_after(0, session=names["calm"])
    assert [e.session_name for e in mine] == [names["calm"]] * 2
    assert len(store.console.console_events_after(0, limit=2)) == 2


# --------------------------------------------------------------------------- the chart


def test_the_chart_scales_to_the_busiest_minute_and_stacks_failures_under_successes() -> None:
    start = 1_700_000_040  # 22:14 UTC
    chart = minute_chart(
        [MinuteCounts(0, 3, 1), MinuteCounts(59, 0, 2), MinuteCounts(60, 9, 9)],
        start=start,
        minutes=60,
        tick_every=10,
    )
    assert chart.peak == 4 and chart.delivered == 3 and chart.failed == 3  # minute 60 is out
    first, last = chart.bars
    assert first.failed_height == HEIGHT / 4 and first.ok_height == 3 * HEIGHT / 4
    assert first.ok_y + first.ok_height == first.failed_y  # stacked, no overlap
    assert last.x == 59 * WIDTH / 60 and last.ok_height == 0
    assert [t.label for t in chart.ticks] == ["22:20", "22:30", "22:40", "22:50", "23:00", "23:10"]
    assert first.title == "22:14 UTC: 3 delivered, 1 failed"
    assert minute_chart([], start=start, minutes=60).bars == ()


# --------------------------------------------------------------------------- pages


@pytest.fixture
async def client(store: Store) -> AsyncIterator[tuple[httpx.AsyncClient, Store, dict[str, Any]]]:
    names = populate(store)
    async with logged_in(app_for(AsyncStore(store))) as (http, token):
        names["csrf"] = token
        yield http, store, names


@pytest.mark.anyio
async def test_every_page_escapes_upstream_and_consumer_text(client: Any) -> None:
    http, _store, names = client
    beta = names["beta"]
    attempt_id = _store.operator.list_attempts(beta.id)[0].id
    pages: dict[str, str | None] = {
        "/console/sessions": "Hostile " + ESCAPED,
        f"/console/timeline?session={names['hostile']}": ESCAPED,  # title, prompt in payload
        f"/console/attempts/{attempt_id}": "broke " + ESCAPED,  # the consumer's answer
        f"/console/deliveries/{beta.id}": None,  # the payload, with the prompt
    }
    for path, expected in pages.items():
        answer = await http.get(path)
        assert answer.status_code == 200, path
        assert HOSTILE not in answer.text, path
        assert (expected or ESCAPED) in answer.text, path
        assert "script-src 'self'" in answer.headers["content-security-policy"]


@pytest.mark.anyio
async def test_a_long_timeline_is_paged_and_only_its_last_page_is_live(client: Any) -> None:
    http, store, names = client
    calm = session(2, title="Calm 100%_done", state="COMPLETED")
    ingest(store, calm, [activity(2, i, minute=i % 60) for i in range(10, 215)])
    first = await http.get(f"/console/timeline?session={names['calm']}")
    assert first.text.count('class="event"') == 200
    later = re.search(r'href="(/console/timeline\?session=[^"]+;after=(\d+))"', first.text)
    assert later is not None and "data-live-after" not in first.text
    rest = await http.get(later.group(1).replace("&amp;", "&"))
    assert rest.text.count('class="event"') == 207 - 200  # 2 + 205 events in all
    assert "data-live-after" in rest.text and "Later events" not in rest.text


@pytest.mark.anyio
async def test_overview_and_deliveries_answer(client: Any) -> None:
    http, _store, names = client
    overview = await http.get("/console")
    assert overview.status_code == 200
    assert 'data-endpoint="beta"' in overview.text and 'class="failed"' in overview.text
    dead = await http.get("/console/deliveries?status=dead&since=1d")
    assert f'data-delivery="{names["beta"].id}"' in dead.text
    assert dead.text.count("data-delivery=") == 1
    assert (await http.get("/console/deliveries?status=bogus&before=x")).status_code == 200
    assert (await http.get("/console/timeline?session=sessions/nope")).status_code == 404
    assert (await http.get("/console/attempts/999999")).status_code == 404


BIG = "9" * 30
LARGEST = str(2**63 - 1)


@pytest.mark.anyio
async def test_numbers_beyond_the_store_are_404_or_400_never_500(client: Any) -> None:
    """Ids and positions in a URL are 64-bit in both stores: a larger one names nothing
    (404 in a path) or is a bad request (400 in a query), whatever its length."""
    http, _store, names = client
    no_such = (
        f"/console/deliveries/{BIG}",
        f"/console/attempts/{BIG}",
        f"/console/deliveries/{int(LARGEST) + 1}",
        f"/console/attempts/{'9' * 5000}",
        f"/console/deliveries/{'0' * 5000}{BIG}",
        f"/console/deliveries/{LARGEST}",  # fits: simply not there
        "/console/attempts/12x",
    )
    for path in no_such:
        answer = await http.get(path)
        assert answer.status_code == 404, path[:60]
        assert "script-src 'self'" in answer.headers["content-security-policy"]
    bad = (
        f"/console/deliveries?before={BIG}",
        f"/console/timeline?session={names['calm']}&after={'9' * 5000}",
        f"/console/live?after={BIG}",
    )
    for path in bad:
        answer = await http.get(path)
        assert answer.status_code == 400, path[:60]
        assert LARGEST in answer.text
    live = await http.get("/console/live", headers={"last-event-id": BIG})
    assert live.status_code == 400
    # The largest that fits is a position like any other; huge times are no error either.
    assert (await http.get(f"/console/deliveries?before={LARGEST}")).status_code == 200
    calm = f"/console/timeline?session={names['calm']}&after={LARGEST}"
    assert (await http.get(calm)).status_code == 200
    huge_times = f"/console/deliveries?since={'9' * 400}d&until={'9' * 400}h"
    assert (await http.get(huge_times)).status_code == 200


@pytest.mark.anyio
async def test_pages_answer_503_while_the_store_is_not_open() -> None:
    async with logged_in(app_for(None)) as (http, _token):
        for path in ("/console", "/console/sessions", "/console/deliveries"):
            assert (await http.get(path)).status_code == 503


CONSOLE_GETS = (
    "/console",
    "/console/sessions",
    "/console/timeline?session=sessions/1",
    "/console/deliveries",
    "/console/events",
    "/console/deliveries/1",
    "/console/attempts/1",
    "/console/static/console.js",
    "/console/live?after=999999",
)
CONSOLE_POSTS = (
    "/console/actions/replay",
    "/console/actions/retry",
    "/console/actions/recover",
    "/console/actions/endpoint",
    "/console/actions/test",
    "/console/actions/session",
)


@pytest.mark.anyio
async def test_every_console_route_needs_the_token(store: Store) -> None:
    populate(store)
    app = app_for(AsyncStore(store))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as http:
        for path in CONSOLE_GETS + CONSOLE_POSTS:
            method = "GET" if path in CONSOLE_GETS else "POST"
            anonymous = await http.request(method, path, headers={"accept": "text/html"})
            if method == "GET":  # a browser is sent to the login page
                assert anonymous.status_code == 303, path
                assert anonymous.headers["location"].startswith("/login?next=")
            else:
                assert anonymous.status_code == 401, path
            wrong = await http.request(method, path, headers={"authorization": "Bearer nope"})
            assert wrong.status_code == 401, path
        bearer = {"authorization": f"Bearer {TOKEN}"}
        for path in CONSOLE_GETS[:-1]:
            assert (await http.get(path, headers=bearer)).status_code == 200, path
        # A bearer request needs no CSRF token (a browser never adds that header itself).
        done = await http.post(
            "/console/actions/endpoint", data={"name": "alpha", "enabled": "0"}, headers=bearer
        )
        assert done.status_code == 303
    assert not next(e for e in store.endpoints.endpoint_states() if e.name == "alpha").enabled


@pytest.mark.anyio
async def test_actions_need_the_sessions_csrf_token(client: Any) -> None:
    http, store, names = client
    disable = {"name": "alpha", "enabled": "0", "back": "/console"}
    for token in ("", "nope"):
        answer = await http.post("/console/actions/endpoint", **form(token, **disable))
        assert answer.status_code == 403
    assert all(e.enabled for e in store.endpoints.endpoint_states())
    done = await http.post("/console/actions/endpoint", **form(names["csrf"], **disable))
    assert done.status_code == 303 and done.headers["location"] == "/console"
    assert not next(e for e in store.endpoints.endpoint_states() if e.name == "alpha").enabled
    # The flash shows once, escaped, then is cleared.
    page = await http.get("/console")
    assert "endpoint alpha disabled: disabled in the console" in page.text
    assert "sessionhook_flash" in page.headers.get("set-cookie", "")
    assert "endpoint alpha disabled" not in (await http.get("/console")).text


@pytest.mark.anyio
async def test_replay_one_event_keeps_its_id_and_a_range_needs_a_start(client: Any) -> None:
    http, store, names = client
    beta, token = names["beta"], names["csrf"]
    queued = await http.post(
        "/console/actions/replay",
        **form(token, endpoint="beta", event=beta.event_id, back="//evil.test/x"),
    )
    assert queued.status_code == 303 and queued.headers["location"] == "/console"
    replays = [d for d in store.operator.list_deliveries(event_id=beta.event_id) if d.replayed]
    assert len(replays) == 1 and replays[0].endpoint == "beta"
    assert "queued 1 delivery of event" in (await http.get("/console")).text
    await http.post("/console/actions/replay", **form(token, endpoint="beta"))
    assert "give an event, or a start time" in (await http.get("/console")).text
    future = form(token, endpoint="alpha", since="2030-01-01")
    await http.post("/console/actions/replay", **future)
    assert "nothing queued" in (await http.get("/console")).text
    # A time range: its events that alpha takes, but those on their way already (calm's
    # two are still pending): the hostile session's one, delivered before.
    await http.post("/console/actions/replay", **form(token, endpoint="alpha", since="2025-01-01"))
    assert "queued 1 delivery of the events of that time range" in (await http.get("/console")).text


@pytest.mark.anyio
async def test_a_form_larger_than_the_limit_is_refused(client: Any) -> None:
    http, store, names = client
    big = form(names["csrf"], name="alpha", enabled="0", reason="x" * MAX_FORM_BYTES)
    assert (await http.post("/console/actions/endpoint", **big)).status_code in (403, 413)
    assert all(e.enabled for e in store.endpoints.endpoint_states())


@pytest.mark.anyio
async def test_test_event_reports_the_answer(store: Store) -> None:
    sent: list[str] = []

    async def send_test(name: str) -> AttemptResult:
        if name != "alpha":
            raise OperatorError(f"no endpoint named {name!r} in the config (known: alpha)")
        sent.append(name)
        return AttemptResult(502, None, 3.0, "", None, T0)

    populate(store)
    async with logged_in(app_for(AsyncStore(store), send_test=send_test)) as (http, token):
        await http.post("/console/actions/test", **form(token, name="alpha"))
        assert "test event to alpha failed: HTTP 502" in (await http.get("/console/sessions")).text
        await http.post("/console/actions/test", **form(token, name="<b>x</b>"))
        page = (await http.get("/console/sessions")).text
        assert "no endpoint named &#39;&lt;b&gt;x&lt;/b&gt;&#39;" in page
    assert sent == ["alpha"]


async def read_live(
    http: httpx.AsyncClient, url: str, want: int, **kw: Any
) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    with anyio.fail_after(10):
        async with http.stream("GET", url, **kw) as answer:
            assert answer.headers["content-type"].startswith("text/event-stream")
            ident = None
            async for line in answer.aiter_lines():
                if line.startswith("id: "):
                    ident = int(line[4:])
                if line.startswith("data: "):
                    data = json.loads(line[6:])
                    assert data["seq"] == ident
                    got.append(data)
                    if len(got) >= want:
                        break
    return got


@pytest.fixture
async def live(store: Store) -> AsyncIterator[tuple[httpx.AsyncClient, Store, dict[str, Any]]]:
    """The console's routes alone, with short live streams: httpx.ASGITransport returns
    a response only once the app finished it."""
    names = populate(store)
    astore = AsyncStore(store)
    deps = ConsoleDeps(store=lambda: astore, live_interval=0.01, live_duration=0.5)
    transport = httpx.ASGITransport(app=Starlette(routes=console_routes(deps)))
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
        yield http, store, names


@pytest.mark.anyio
async def test_the_live_feed_resumes_after_the_last_event_id(live: Any) -> None:
    http, store, names = live
    every = store.console.console_events_after(0)
    first = await read_live(http, "/console/live?after=0", 2)
    assert [e["seq"] for e in first] == [e.seq for e in every[:2]]
    resumed = await read_live(
        http,
        "/console/live?after=0",
        len(every) - 2,
        headers={"last-event-id": str(first[-1]["seq"])},
    )
    assert [e["seq"] for e in resumed] == [e.seq for e in every[2:]]  # nothing missed or repeated
    calm = await read_live(http, f"/console/live?after=0&session={names['calm']}", 2)
    assert {e["session"] for e in calm} == {names["calm"]}
    # A new event arrives on an open stream.
    async with anyio.create_task_group() as tg:
        seen: list[dict[str, Any]] = []

        async def follow() -> None:
            seen.extend(await read_live(http, f"/console/live?after={every[-1].seq}", 1))

        tg.start_soon(follow)
        await anyio.sleep(0.05)
        s = session(2, title="Calm 100%_done", state="COMPLETED")
        ingest(store, s, [activity(2, 9)])
    assert seen[0]["type"] == "activity.progress_updated" and seen[0]["seq"] > every[-1].seq
