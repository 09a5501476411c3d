"""The web console in a real browser: headless Chromium (Selenium) against a real
``sessionhook run`` fed by the emulator, with a consumer (``beta``) that fails on request.

One daemon per store engine and one browser for the module (starting Chromium costs about
a second); each wait is bounded. The tests act as a person would: open the pages, click,
fill forms, read what the page says. See tests/support/console_harness.py for the stack.

On a PostgreSQL store (``[store]`` names a fresh database of the session's cluster) a
focused subset runs too, to keep CI short: sign in, the overview (endpoint health,
upstream, the chart's per-minute counts), a session's timeline, a failed attempt replayed
until the new attempt shows delivered, and events appearing live (the sessions list and a
running session's timeline). The other pages read through the same queries, which
tests/test_console.py runs on both engines in process; they are marked :data:`sqlite_only`.
The tests run in the order they are written, first all on SQLite, then the subset on
PostgreSQL (the replay and the live events change what later tests see).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.support.browser import (
    assert_not_executed,
    css,
    flash,
    navigate,
    one,
    sign_in,
    signed_in,
    until,
)
from tests.support.console_harness import HOSTILE, TOKEN, Stack, chromium
from tests.support.pg import TEMPLATE, Cluster

pytestmark = pytest.mark.process


@contextmanager
def opened_stack(directory: Path, database: str | None = None) -> Iterator[Stack]:
    """The module's stack (on SQLite, or the PostgreSQL ``database``): a session with a
    hostile title whose deliveries reached alpha and died at beta, and a calm one."""
    with Stack(directory, database=database) as st:
        st.consumers["beta"].fail()
        st.hostile = st.session(f"Please fix {HOSTILE}", title=f"Hostile {HOSTILE}")
        st.calm = st.session("Add a changelog entry", title="Changelog entry")
        # Wait until the hostile session's events reached alpha and died at beta.
        st.wait_for(
            lambda: (
                "dead" in st.get("/console/deliveries?endpoint=beta&status=dead").text
                and "delivered" in st.get("/console/deliveries?endpoint=alpha").text
            ),
            within=60,
            what="deliveries to alpha and dead letters at beta",
        )
        yield st


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The module's stack on the engine of ``request.param``; on PostgreSQL, with its daemon
    on a database of its own."""
    if request.param == "sqlite":
        with opened_stack(tmp_path_factory.mktemp("console")) as st:
            yield st
        return
    pg_cluster: Cluster = request.getfixturevalue("pg_cluster")
    name = pg_cluster.create_database(TEMPLATE)
    try:
        with opened_stack(tmp_path_factory.mktemp("console-pg"), pg_cluster.url(name)) as st:
            assert st.get("/readyz").json()["store"]["backend"] == "postgresql"
            yield st
    finally:
        pg_cluster.drop_database(name)


#: A test of the walk that runs on SQLite only (see the module docstring).
sqlite_only = pytest.mark.parametrize("stack", ["sqlite"], indirect=True)


@pytest.fixture(scope="module")
def chrome() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.fixture
def browser(stack: Stack, chrome: Any) -> Any:
    """The module's browser, signed in to the console."""
    return signed_in(chrome, stack.base, TOKEN)


def test_sign_in_with_the_token(stack: Stack, chrome: Any) -> None:
    chrome.delete_all_cookies()
    chrome.get(f"{stack.base}/console/deliveries")
    until(lambda: "/login" in chrome.current_url, "the login page")
    sign_in(chrome, "not-the-token")
    assert "Wrong token" in one(chrome, ".error").text
    sign_in(chrome, TOKEN)
    until(lambda: chrome.current_url.endswith("/console/deliveries"), "the page asked for")
    assert one(chrome, "h1").text == "Deliveries"
    # Signing out (a POST with the CSRF token) ends the session.
    chrome.execute_script(
        "var f = document.createElement('form'); f.method = 'post'; f.action = '/logout';"
        "var i = document.createElement('input'); i.type = 'hidden'; i.name = 'csrf_token';"
        "i.value = document.querySelector('meta[name=csrf-token]').content;"
        "f.appendChild(i); document.body.appendChild(f); f.submit();"
    )
    until(lambda: "/login" in chrome.current_url, "the login page after signing out")
    chrome.get(f"{stack.base}/console")
    assert "/login" in chrome.current_url


def test_overview_shows_endpoint_health_upstream_and_the_chart(stack: Stack, browser: Any) -> None:
    browser.get(f"{stack.base}/console")
    rows = {r.get_attribute("data-endpoint"): r for r in css(browser, "#endpoints tbody tr")}
    assert set(rows) == {"alpha", "beta"}
    assert "enabled" in rows["alpha"].find_element("css selector", ".state").text
    beta = rows["beta"].text
    assert "HTTP 500" in beta  # the last error
    assert "dead" in beta
    upstream = one(browser, "#upstream").text
    assert "Last good poll" in upstream and "never" not in upstream.split("Requests")[0]
    assert "Budget used" in upstream
    # Bars in both charts: 2xx (alpha) and failures (beta).
    assert css(browser, "#chart-day rect.ok") and css(browser, "#chart-day rect.failed")
    assert css(browser, "#chart-hour rect.ok") and css(browser, "#chart-hour rect.failed")
    assert "failed attempts" in one(browser, "figcaption").text


@sqlite_only
def test_sessions_are_listed_filterable_and_hostile_titles_are_text(
    stack: Stack, browser: Any
) -> None:
    browser.get(f"{stack.base}/console/sessions")
    names = [r.get_attribute("data-session") for r in css(browser, "#sessions tbody tr")]
    assert stack.hostile in names and stack.calm in names
    assert f"Hostile {HOSTILE}" in browser.find_element("id", "sessions").text
    assert_not_executed(browser)
    search = one(browser, "#session-filters input[name=q]")
    search.send_keys("changelog")
    navigate(browser, one(browser, "#session-filters button"))
    until(lambda: "q=changelog" in browser.current_url, "the filtered list")
    names = [r.get_attribute("data-session") for r in css(browser, "#sessions tbody tr")]
    assert names == [stack.calm]


def test_timeline_shows_events_with_deliveries_per_endpoint(stack: Stack, browser: Any) -> None:
    browser.get(f"{stack.base}/console/sessions")
    link = one(browser, f"#sessions tr[data-session='{stack.hostile}'] a.session-link")
    navigate(browser, link)
    until(lambda: "/console/timeline" in browser.current_url, "the timeline")
    assert one(browser, "#session-name").text == stack.hostile
    assert f"Hostile {HOSTILE}" in one(browser, "h1").text
    # Drawn by the server (an event appended live while the session runs has no payload).
    events = css(browser, "li.event:not(.new)")
    assert len(events) >= 3
    first = events[0]
    assert first.find_element("css selector", ".etype").text == "session.discovered"
    endpoints = {
        r.get_attribute("data-endpoint")
        for r in first.find_elements("css selector", "tr[data-endpoint]")
    }
    assert endpoints == {"alpha", "beta"}
    # The payload (the prompt is in it) is shown as text when opened.
    payloads = [e.find_element("css selector", "details.body") for e in events]
    for details in payloads[:4]:
        details.find_element("css selector", "summary").click()
    assert any("window.__pwned" in d.text for d in payloads[:4])
    assert_not_executed(browser)


def test_failed_attempt_detail_then_replay_and_see_the_new_attempt(
    stack: Stack, browser: Any
) -> None:
    timeline = f"{stack.base}/console/timeline?session={quote(stack.hostile, safe='')}"

    def failed_attempt() -> Any:
        # The page shows the attempts made when it was loaded: the stack waited for a dead
        # letter at beta, perhaps the other session's, so load it until this one has one.
        browser.get(timeline)
        return (css(browser, "tr[data-endpoint=beta] a.attempt.failed") or [None])[0]

    failed = until(failed_attempt, "a failed attempt at beta on the timeline", within=60)
    navigate(browser, failed)
    until(lambda: "/console/attempts/" in browser.current_url, "the attempt page")
    detail = one(browser, "#attempt").text
    assert "500" in detail
    # The consumer's hostile answer is shown verbatim, as text.
    assert one(browser, "#response-body").text == f"upstream broke: {HOSTILE}"
    assert_not_executed(browser)
    event_id = one(browser, "#delivery .mono").text
    before = stack.consumers["beta"].seen.count(event_id)
    stack.consumers["beta"].recover()
    navigate(browser, one(browser, "form[action='/console/actions/replay'] button"))
    assert "queued 1 delivery" in flash(browser)
    # The replay is a new delivery of the same event; open it and wait for its attempt.
    replay = until(
        lambda: next((li for li in css(browser, "#others li") if "(replay)" in li.text), None),
        "the replay among the event's deliveries",
    )
    assert "beta" in replay.text
    replay_url = replay.find_element("css selector", "a").get_attribute("href")

    def delivered() -> bool:
        browser.get(replay_url)
        return "delivered" in one(browser, "#delivery").text

    until(delivered, "the replayed delivery to be delivered")
    rows = css(browser, "#attempts tbody tr")
    assert len(rows) == 1 and "200" in rows[0].text
    # Same webhook-id as the first time.
    assert stack.consumers["beta"].seen.count(event_id) == before + 1
    stack.consumers["beta"].fail()


@sqlite_only
def test_deliveries_filtered_by_endpoint_status_and_time(stack: Stack, browser: Any) -> None:
    from selenium.webdriver.support.ui import Select

    browser.get(f"{stack.base}/console/deliveries")
    Select(one(browser, "#delivery-filters select[name=endpoint]")).select_by_visible_text("beta")
    Select(one(browser, "#delivery-filters select[name=status]")).select_by_visible_text("dead")
    one(browser, "#delivery-filters input[name=since]").send_keys("1h")
    navigate(browser, one(browser, "#delivery-filters button"))
    until(lambda: "status=dead" in browser.current_url, "the filtered deliveries")
    rows = css(browser, "#deliveries tbody tr[data-delivery]")
    assert rows
    for row in rows:
        cells = row.find_elements("css selector", "td")
        assert cells[2].text == "beta" and cells[5].text == "dead"
    navigate(browser, rows[0].find_element("css selector", "a"))
    until(lambda: "/console/deliveries/" in browser.current_url, "a delivery's page")
    assert "dead" in one(browser, "#delivery").text
    assert len(css(browser, "#attempts tbody tr[data-attempt]")) == 3  # the retry schedule
    # A filter that matches nothing says so.
    browser.get(f"{stack.base}/console/deliveries?endpoint=alpha&status=dead")
    assert "No deliveries match" in one(browser, "#deliveries").text


@sqlite_only
def test_replay_a_time_range_to_an_endpoint(stack: Stack, browser: Any) -> None:
    from selenium.webdriver.support.ui import Select

    browser.get(f"{stack.base}/console")
    form = one(browser, "#replay-range")
    Select(form.find_element("css selector", "select[name=endpoint]")).select_by_visible_text(
        "alpha"
    )
    form.find_element("css selector", "input[name=since]").send_keys("1h")
    seen = len(stack.consumers["alpha"].seen)
    navigate(browser, form.find_element("css selector", "button"))
    message = flash(browser)
    assert message.startswith("queued ") and "of the events of that time range to alpha" in message
    queued = int(message.split()[1])
    assert queued > 0
    until(
        lambda: len(stack.consumers["alpha"].seen) >= seen + queued,
        "the replayed range to reach alpha",
    )


@sqlite_only
def test_disable_and_enable_an_endpoint(stack: Stack, browser: Any) -> None:
    browser.get(f"{stack.base}/console")
    row = one(browser, "tr[data-endpoint=beta]")
    row.find_element("css selector", "input.reason").send_keys("consumer migrating <b>now</b>")
    navigate(browser, row.find_element("css selector", "button.disable"))
    assert flash(browser) == "endpoint beta disabled: consumer migrating <b>now</b>"
    state = one(browser, "tr[data-endpoint=beta] .state").text
    assert "disabled" in state and "consumer migrating <b>now</b>" in state
    assert stack.get("/console").text.count("consumer migrating &lt;b&gt;now&lt;/b&gt;") == 1
    navigate(browser, one(browser, "tr[data-endpoint=beta] button.enable"))
    assert "endpoint beta enabled" in flash(browser)
    assert "enabled" in one(browser, "tr[data-endpoint=beta] .state").text


@sqlite_only
def test_send_a_test_event_and_see_the_answer(stack: Stack, browser: Any) -> None:
    browser.get(f"{stack.base}/console")
    seen = len(stack.consumers["alpha"].seen)
    navigate(browser, one(browser, "tr[data-endpoint=alpha] button.test"))
    assert flash(browser).startswith("test event to alpha: HTTP 200 in ")
    assert len(stack.consumers["alpha"].seen) == seen + 1
    navigate(browser, one(browser, "tr[data-endpoint=beta] button.test"))
    message = flash(browser)
    assert message == "test event to beta failed: HTTP 500"
    assert "error" in one(browser, "#flash").get_attribute("class")


def test_new_events_appear_live_without_reload(stack: Stack, browser: Any) -> None:
    browser.get(f"{stack.base}/console/sessions")
    until(lambda: one(browser, "#live-state").text == "live", "the live feed to connect")
    marker = browser.execute_script("window.__same_page = 1; return 1")
    name = stack.session("Write the release notes", title="Release notes")
    until(
        lambda: any(
            name in li.text and "session.discovered" in li.text
            for li in css(browser, "#live-events li")
        ),
        "the new session's first event in the live list",
    )
    row = one(browser, f"#sessions tr[data-session='{name}']")
    assert row.get_attribute("class") == "fresh"
    # No reload happened: the page's own state is still there.
    assert browser.execute_script("return window.__same_page") == marker
    # The timeline of a session still running gains its events as they come: this one
    # waits for its plan's approval until the page is open.
    live = stack.session("Rename the config keys", title="Renames", approval=True)
    timeline = f"/console/timeline?session={quote(live, safe='')}"
    until(
        lambda: "activity.plan_generated" in stack.get(timeline).text,
        "the session to wait for approval",
    )
    browser.get(f"{stack.base}{timeline}")
    until(lambda: one(browser, "#live-state").text == "live", "the timeline's live feed")
    shown = [e.find_element("css selector", ".etype").text for e in css(browser, "li.event")]
    assert "activity.plan_approved" not in shown
    stack.approve(live)
    until(
        lambda: any("activity.plan_approved" in e.text for e in css(browser, "li.event.new")),
        "the approval appended live to the timeline",
    )
    assert len(css(browser, "li.event")) > len(shown)


@sqlite_only
def test_actions_refuse_a_post_without_the_csrf_token(stack: Stack, browser: Any) -> None:
    cookies = {c["name"]: c["value"] for c in browser.get_cookies()}
    for token in ("", "forged"):
        answer = httpx.post(
            f"{stack.base}/console/actions/endpoint",
            data={"name": "alpha", "enabled": "0", "csrf_token": token},
            cookies=cookies,
            timeout=10,
        )
        assert answer.status_code == 403
    page = stack.get("/console").text
    row = page.split('data-endpoint="alpha"')[1].split("</tr>")[0]
    assert "disabled" not in row


@sqlite_only
def test_pages_carry_a_strict_content_security_policy(stack: Stack) -> None:
    for path in ("/console", "/console/sessions", "/console/deliveries"):
        headers = stack.get(path).headers
        policy = headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy
        assert "default-src 'none'" in policy
        assert headers["x-content-type-options"] == "nosniff"


@sqlite_only
def test_no_asset_comes_from_another_host(stack: Stack, browser: Any) -> None:
    browser.get(f"{stack.base}/console")
    sources = browser.execute_script(
        "return performance.getEntriesByType('resource').map(function (e) { return e.name; })"
    )
    assert sources, "the page loads its stylesheet and script"
    assert all(s.startswith(stack.base) for s in sources)


def test_retry_now_and_recover_send_dead_deliveries_again(stack: Stack, browser: Any) -> None:
    browser.get(f"{stack.base}/console/deliveries?endpoint=beta&status=dead")
    row = one(browser, "#deliveries tbody tr[data-delivery]")
    delivery_id = row.get_attribute("data-delivery")
    event_id = stack.get(f"/console/deliveries/{delivery_id}").text.split('class="mono">')[1]
    event_id = event_id.split("<")[0]
    before = stack.consumers["beta"].seen.count(event_id)
    stack.consumers["beta"].recover()
    try:
        navigate(browser, row.find_element("css selector", "button.retry"))
        assert flash(browser) == f"delivery {delivery_id} ({event_id}) to beta: dead -> due now"

        def delivered() -> bool:
            browser.get(f"{stack.base}/console/deliveries/{delivery_id}")
            return "delivered" in one(browser, "#delivery").text

        until(delivered, "the retried delivery to be delivered")  # the same row
        assert stack.consumers["beta"].seen.count(event_id) == before + 1  # same webhook-id
        assert "Retry now" not in one(browser, "main").text
        # Recover: every other dead delivery of beta, from the overview's form.
        browser.get(f"{stack.base}/console")
        form = one(browser, "tr[data-endpoint=beta] form.recover")
        since = form.find_element("css selector", "input[name=since]")
        since.clear()
        since.send_keys("1d")
        navigate(browser, form.find_element("css selector", "button.recover"))
        message = flash(browser)
        assert message.startswith("recovered ") and " deliveries of beta, due now" in message
        assert int(message.split()[1]) > 0
        until(
            lambda: (
                "No deliveries match"
                in stack.get("/console/deliveries?endpoint=beta&status=dead").text
            ),
            "beta's dead deliveries to be sent",
        )
    finally:
        stack.consumers["beta"].fail()
