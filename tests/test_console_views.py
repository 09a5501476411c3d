"""What the console's pages say, in process on both store backends: the last answer said
once, the last error with its time and gone after a newer success, "failing since" kept
across a re-enable, "waiting on #N", search and filters (hostile query strings harmless),
the timeline in time order, the chart's bars, the replicas panel, and the approve/answer
forms with their action (``ctx.act`` stood in for; the real daemon and emulator drive it in
test_console_browser_act.py)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from sessionhook.relay.domain.actions import ActionKind, ActOutcome
from sessionhook.relay.domain.lifecycle import lifecycle_events
from sessionhook.relay.domain.retry import AttemptResult, Dead, Delivered, Retry
from sessionhook.relay.store import AsyncStore, Store
from sessionhook.relay.store.console_queries import MinuteCounts
from sessionhook.relay.web.console.chart import HEIGHT, minute_chart
from tests.support.backends import Backend
from tests.support.clock import T0, Clock
from tests.support.console_app import app_for, form, logged_in
from tests.support.store_rows import Ep, activity, ingest, ready, session

pytestmark = pytest.mark.app

ESCAPED = "&lt;script&gt;"


@pytest.fixture
def clock() -> Clock:
    return Clock(T0 + 600)


@pytest.fixture
def store(backend: Backend, clock: Clock) -> Iterator[Store]:
    with backend.open(clock=clock) as opened:
        yield opened


def attempt(status: int | None, at: float, error: str | None = None) -> AttemptResult:
    return AttemptResult(status, error, 12.5, "", None, at)


def deliveries(store: Store, endpoint: str, session_name: str) -> list[Any]:
    rows = store.operator.list_deliveries(endpoint=endpoint, session=session_name, limit=50)
    return sorted(rows, key=lambda d: d.id)


def one_attempt(store: Store, result: AttemptResult, decision: Any) -> Any:
    """Endpoint beta, one event, its delivery tried once with ``result``: the delivery."""
    (s,) = ready(store, Ep("beta"))
    ingest(store, s, [activity(1, 1)])
    (d,) = deliveries(store, "beta", s.name)
    store.outbox.record_attempt(d.id, result, decision)
    return d


@pytest.fixture
async def http(store: Store) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    async with logged_in(app_for(AsyncStore(store))) as signed_in:
        yield signed_in


def cell(page: str, row_attr: str, css_class: str) -> str:
    """The text of the first ``<td class="css_class ...">`` in the row ``row_attr``."""
    row = re.search(rf"<tr {row_attr}>(.*?)</tr>", page, re.S)
    assert row is not None, row_attr
    found = re.search(rf'<td class="{css_class}[^"]*">(.*?)</td>', row.group(1), re.S)
    assert found is not None, css_class
    return found.group(1)


# --------------------------------------------------------------------------- answers, errors


def test_the_last_answer_names_the_status_once() -> None:
    from sessionhook.relay.web.console.text import answer

    def d(code: int | None, error: str | None) -> Any:
        # A stand-in with the two fields answer() reads.
        return type("D", (), {"last_status_code": code, "last_error": error})()

    assert answer(d(500, "HTTP 500")) == "HTTP 500"
    assert answer(d(502, "upstream broke")) == "HTTP 502: upstream broke"
    assert answer(d(None, "connection refused")) == "connection refused"
    assert answer(d(None, None)) == ""


@pytest.mark.anyio
async def test_deliveries_page_says_http_500_once(store: Store, http: Any) -> None:
    client, _ = http
    d = one_attempt(store, attempt(500, T0 + 10), Dead("gave up"))
    page = (await client.get("/console/deliveries")).text
    assert "HTTP 500 HTTP 500" not in page
    assert cell(page, f'data-delivery="{d.id}"', "answer").strip() == "HTTP 500"


@pytest.mark.anyio
async def test_last_error_shows_its_time_and_none_after_a_newer_success(
    store: Store, http: Any
) -> None:
    client, _ = http
    (s,) = ready(store, Ep("beta"))
    ingest(store, s, [activity(1, 1), activity(1, 2)])
    first = deliveries(store, "beta", s.name)[0]
    store.outbox.record_attempt(first.id, attempt(None, T0, "DNS: no such host"), Retry(T0 + 5))
    page = (await client.get("/console")).text
    shown = cell(page, 'data-endpoint="beta"', "small last-error")
    assert "DNS: no such host" in shown
    assert "9m ago" in shown and "2023-11-14 22:13:20Z" in shown  # T0 + 12.5 ms, now T0 + 600
    store.outbox.record_attempt(first.id, attempt(200, T0 + 60), Delivered())
    page = (await client.get("/console")).text
    assert "DNS: no such host" not in page
    assert cell(page, 'data-endpoint="beta"', "small last-error") == "-"
    assert "8m ago" in cell(page, 'data-endpoint="beta"', "last-success")  # 599.9 - 60 s


def test_failing_since_is_kept_when_the_endpoint_is_enabled_again(store: Store) -> None:
    (s,) = ready(store, Ep("beta"))
    ingest(store, s, [activity(1, 1), activity(1, 2)])
    first, second = deliveries(store, "beta", s.name)

    def failing_since() -> float | None:
        (ep,) = store.operator.status_summary(T0 + 600).endpoints
        return ep.failing_since

    store.outbox.record_attempt(first.id, attempt(503, T0 + 10), Retry(T0 + 20))
    assert failing_since() == T0 + 10
    store.endpoints.set_endpoint_enabled("beta", False, "broken")
    store.endpoints.set_endpoint_enabled("beta", True)  # restarts the disabling clock only
    assert failing_since() == T0 + 10
    store.outbox.record_attempt(first.id, attempt(503, T0 + 200), Retry(T0 + 300))
    assert failing_since() == T0 + 10
    # A success ends the run; the next failure starts a new one.
    store.outbox.record_attempt(first.id, attempt(200, T0 + 300), Delivered())
    assert failing_since() is None
    store.outbox.record_attempt(second.id, attempt(503, T0 + 400), Retry(T0 + 500))
    assert failing_since() == T0 + 400


@pytest.mark.anyio
async def test_pending_rows_say_what_they_wait_on(store: Store, http: Any) -> None:
    client, _ = http
    (s,) = ready(store, Ep("beta"))
    ingest(store, s, [activity(1, 1), activity(1, 2), activity(1, 3)])
    head, *behind = deliveries(store, "beta", s.name)
    page = (await client.get("/console/deliveries")).text
    for d in behind:
        status = cell(page, f'data-delivery="{d.id}"', "status")
        assert f'waiting on <a href="/console/deliveries/{head.id}">#{head.id}</a>' in status
    assert "waiting on" not in cell(page, f'data-delivery="{head.id}"', "status")
    timeline = (await client.get(f"/console/timeline?session={s.name}")).text
    assert timeline.count(f'waiting on <a href="/console/deliveries/{head.id}">') == 2


# --------------------------------------------------------------------------- search, filters


def two_sessions(store: Store) -> tuple[Any, Any]:
    ready(store, Ep("alpha"), Ep("beta"), sessions=0)
    one, two = session(1, title="One"), session(2, title="Two")
    for s in (one, two):
        store.ingest.upsert_session(s, baseline=False)
    ingest(store, one, [activity(1, 1), activity(1, 2, userMessaged={"userMessage": "hi"})])
    ingest(store, two, [activity(2, 3)])
    return one, two


@pytest.mark.anyio
async def test_search_by_webhook_id_event_id_and_session_and_filter_by_type_and_status(
    store: Store, http: Any
) -> None:
    client, _ = http
    one, two = two_sessions(store)
    target = deliveries(store, "beta", one.name)[-1]
    rows = re.compile(r'data-delivery="(\d+)"')
    by_event = (await client.get(f"/console/deliveries?q={target.event_id}")).text
    assert {int(i) for i in rows.findall(by_event)} == {
        d.id for d in store.operator.list_deliveries(event_id=target.event_id)
    }
    assert len(rows.findall(by_event)) == 2  # alpha and beta: one webhook-id
    for name in (two.name, two.name.removeprefix("sessions/")):
        found = (await client.get("/console/deliveries", params={"q": name})).text
        assert len(rows.findall(found)) == 2 and one.name not in found.split("<table")[1]
    typed = await client.get("/console/deliveries?type=activity.user_messaged&endpoint=beta")
    assert [int(i) for i in rows.findall(typed.text)] == [target.id]
    store.outbox.record_attempt(target.id, attempt(500, T0 + 1), Dead("gave up"))
    dead = (await client.get("/console/deliveries?status=dead")).text
    assert [int(i) for i in rows.findall(dead)] == [target.id]
    nothing = (await client.get("/console/deliveries?q=evt_nope")).text
    assert rows.findall(nothing) == [] and "No event and no session is named" in nothing
    # The events list: the same search, type and status filters.
    events = re.compile(r'<tr data-event-id="([^"]+)"')
    listed = (await client.get(f"/console/events?q={one.name}")).text
    assert len(events.findall(listed)) == 2  # its two activities
    assert events.findall(
        (await client.get("/console/events?type=activity.user_messaged")).text
    ) == [target.event_id]
    assert events.findall((await client.get("/console/events?status=dead")).text) == [
        target.event_id
    ]
    assert events.findall((await client.get(f"/console/events?q={target.event_id}")).text) == [
        target.event_id
    ]


HOSTILE_QUERIES = (
    '"><script>alert(1)</script>',
    "x" * 10_000,
    "sessions/1\x00' OR 1=1 --",
    "\x00",
    "%' OR '1'='1",
)


@pytest.mark.anyio
async def test_a_hostile_query_string_is_harmless(store: Store, http: Any) -> None:
    client, _ = http
    two_sessions(store)
    for text in HOSTILE_QUERIES:
        for path in ("/console/deliveries", "/console/events", "/console/sessions"):
            for name in ("q", "type", "status", "endpoint", "since", "state", "account"):
                page = await client.get(path, params={name: text})
                assert page.status_code == 200, (path, name, text[:20])
                assert "<script>alert(1)" not in page.text
        timeline = await client.get("/console/timeline", params={"session": text})
        assert timeline.status_code == 404
    shown = (await client.get("/console/deliveries", params={"q": HOSTILE_QUERIES[0]})).text
    assert f'value="&#34;&gt;{ESCAPED}' in shown  # escaped in the search box
    from sessionhook.relay.web.console.text import query_text

    assert query_text("a\x00b\x7f\n c" + "z" * 500) == "ab c" + "z" * 196


# --------------------------------------------------------------------------- timeline


def test_the_timeline_is_in_time_order_and_pages_in_it(store: Store) -> None:
    (s,) = ready(store, Ep("a"))
    # Archived late: minute 5 after minute 40 (a backfill, a late page).
    ingest(store, s, [activity(1, 1, minute=40)])
    ingest(store, s, [activity(1, 2, minute=5), activity(1, 3, minute=20)])
    events = store.console.console_timeline(s.name)
    assert [e.occurred_ts for e in events] == sorted(e.occurred_ts for e in events)
    assert [e.activity_name for e in events if e.activity_name][:3] == [
        f"{s.name}/activities/{i:032x}" for i in (2, 3, 1)
    ]
    first = store.console.console_timeline(s.name, limit=2)
    rest = store.console.console_timeline(s.name, after_seq=first[-1].seq)
    assert [e.id for e in first + rest] == [e.id for e in events]


# --------------------------------------------------------------------------- chart, replicas


def test_a_busy_minute_of_the_day_is_a_bar_a_few_units_wide() -> None:
    start = 1_700_000_040
    chart = minute_chart([MinuteCounts(700, 100, 50)], start=start, minutes=24 * 60)
    (bar,) = chart.bars
    assert chart.bucket == 5 and chart.peak == 150
    assert bar.width >= 4  # units of a 1440-wide drawing: about 4 px on a wide screen
    assert bar.x == 700 * 1.0 and bar.ok_height + bar.failed_height == pytest.approx(HEIGHT)
    assert bar.title.endswith("UTC: 100 delivered, 50 failed") and "-" in bar.title
    # Minutes in one bucket add up; an hour keeps one-minute bars.
    summed = minute_chart(
        [MinuteCounts(700, 1, 0), MinuteCounts(704, 2, 1)], start=start, minutes=1440
    )
    assert len(summed.bars) == 1 and summed.peak == 4 and summed.delivered == 3
    assert minute_chart([MinuteCounts(3, 1, 0)], start=start, minutes=60).bucket == 1


@pytest.mark.anyio
async def test_the_overview_draws_the_day_in_5_minute_bars(store: Store, http: Any) -> None:
    client, _ = http
    one_attempt(store, attempt(200, T0 + 300), Delivered())
    page = (await client.get("/console")).text
    day = page.split('id="chart-day"')[1].split("</svg>")[0]
    widths = [float(w) for w in re.findall(r'<rect [^>]*width="([\d.]+)"', day)]
    assert widths and min(widths) >= 4.0
    assert "peak 1 per 5 minutes" in day


@pytest.mark.anyio
async def test_the_overview_says_while_the_session_list_is_cut(store: Store, http: Any) -> None:
    client, _ = http
    assert "Session list" not in (await client.get("/console")).text
    store.economy.mark_poll(True, T0, 20_000)
    page = (await client.get("/console")).text
    assert "the newest 20000 sessions followed, older ones not" in page


@pytest.mark.anyio
async def test_the_overview_shows_each_accounts_last_good_poll(store: Store, http: Any) -> None:
    client, _ = http
    store.economy.mark_poll(True, T0 - 7200, account="team-a")
    store.economy.mark_poll(False, T0 - 1, account="team-b")
    page = (await client.get("/console")).text
    assert "Last good poll (team-a)" in page
    team_b = page.split("Last good poll (team-b)</dt>")[1].split("</dd>")[0]
    assert 'class="bad"' in team_b and "never" in team_b


@pytest.mark.anyio
async def test_the_overview_lists_the_replicas_and_what_they_hold(store: Store, http: Any) -> None:
    client, _ = http
    ready(store, Ep("a"))
    leases = store.leases
    leases.register_replica("replica-one", host="node-a", pid=4242, now=T0 + 590, lease=30)
    assert leases.acquire_lease("retention", T0 + 590)
    page = (await client.get("/console")).text
    row = cell(page, 'data-replica="replica-one"', "health")
    assert "alive" in row
    assert "node-a · 4242" in page and "retention" in page
    # Silent once its heartbeat is older than its lease.
    leases.heartbeat_replica(T0 + 100)  # now is T0 + 600, the lease 30 s
    assert "silent" in cell(
        (await client.get("/console")).text, 'data-replica="replica-one"', "health"
    )


# --------------------------------------------------------------------------- approve, answer


def waiting_session(store: Store, state: str) -> str:
    ready(store, Ep("a"), sessions=0)
    s = session(7, title="Needs you", state=state)
    store.ingest.upsert_session(s, baseline=False)
    store.ingest.ingest_activities(s.name, [], lifecycle_events(s, None, entered=True), True)
    return s.name


class FakeAct:
    """Records each call; answers ``outcome``."""

    def __init__(self, outcome: ActOutcome) -> None:
        self.outcome = outcome
        self.calls: list[tuple[str, ActionKind, str | None]] = []

    async def __call__(self, session: str, kind: ActionKind, text: str | None) -> ActOutcome:
        self.calls.append((session, kind, text))
        return self.outcome


@pytest.mark.anyio
async def test_approve_and_answer_forms_call_act_and_show_the_outcome(store: Store) -> None:
    name = waiting_session(store, "AWAITING_PLAN_APPROVAL")
    act = FakeAct(ActOutcome(True, 200, "plan approved"))
    page = f"/console/timeline?session={name}"
    async with logged_in(app_for(AsyncStore(store), act=act)) as (client, token):
        shown = (await client.get(page)).text
        assert 'id="approve-form"' in shown and 'id="reply-form"' in shown
        assert 'name="action" value="approve_plan"' in shown
        # Without the CSRF token: refused, nothing sent upstream.
        refused = await client.post(
            "/console/actions/session",
            data={"session": name, "action": "approve_plan", "back": page},
        )
        assert refused.status_code == 403 and act.calls == []
        done = await client.post(
            "/console/actions/session",
            **form(token, session=name, action="approve_plan", back=page),
        )
        assert done.status_code == 303 and done.headers["location"] == page
        assert act.calls == [(name, "approve_plan", None)]
        assert f"{name}: plan approved" in (await client.get(page)).text
        # The upstream's one-line refusal, escaped.
        act.outcome = ActOutcome(False, 400, "<b>plan</b> is not awaiting approval")
        await client.post(
            "/console/actions/session", **form(token, session=name, action="approve_plan")
        )
        flash = (await client.get("/console")).text
        assert f"could not approve the plan of {name} (HTTP 400): &lt;b&gt;plan" in flash
        # An answer needs text; with it, the text goes as it was written.
        await client.post("/console/actions/session", **form(token, session=name, action="reply"))
        assert "write something to send" in (await client.get("/console")).text
        act.outcome = ActOutcome(True, 200, "message sent")
        await client.post(
            "/console/actions/session",
            **form(token, session=name, action="reply", text="Use <tabs> please"),
        )
        assert act.calls[-1] == (name, "reply", "Use <tabs> please")
        await client.post("/console/actions/session", **form(token, session=name, action="delete"))
        assert len(act.calls) == 3


@pytest.mark.anyio
async def test_the_forms_follow_the_state_and_say_when_acting_is_unavailable(
    store: Store,
) -> None:
    name = waiting_session(store, "AWAITING_USER_FEEDBACK")
    page = f"/console/timeline?session={name}"
    async with logged_in(app_for(AsyncStore(store), act=FakeAct(ActOutcome(True, 200, "")))) as (
        client,
        _,
    ):
        shown = (await client.get(page)).text
        assert 'id="reply-form"' in shown and 'id="approve-form"' not in shown
    async with logged_in(app_for(AsyncStore(store))) as (client, token):
        assert "Acting on sessions is not available here" in (await client.get(page)).text
        await client.post(
            "/console/actions/session", **form(token, session=name, action="reply", text="x")
        )
        assert "not available here" in (await client.get("/console")).text
    store.ingest.upsert_session(session(7, state="IN_PROGRESS"), baseline=False)
    async with logged_in(app_for(AsyncStore(store), act=FakeAct(ActOutcome(True, 200, "")))) as (
        client,
        _,
    ):
        assert 'id="act"' not in (await client.get(page)).text
