"""The console's issue-22 views in a real browser (headless Chromium through Selenium):

* the deliveries page at 1280 px with a 300-character error stays readable (a screenshot is
  saved as a test artifact, and the page is measured: ids and headers on one line, the
  table within the window, the error folded with its whole text a click away); this one
  serves the console in process over a store filled here, so the rows are exact;
* approving a plan and answering the agent from a session's timeline, against the real
  ``sessionhook run`` and the emulator: the session moves on, a refusal shows the service's
  message;
* a session row added live is filled in; the search box finds a session's deliveries.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from anyio.from_thread import start_blocking_portal

from sessionhook.relay.domain.retry import AttemptResult, Dead, Retry
from sessionhook.relay.store import AsyncStore
from sessionhook.relay.web.server import serve
from tests.support.backends import Backend
from tests.support.browser import css, flash, navigate, one, signed_in, until
from tests.support.clock import T0, Clock
from tests.support.console_app import TOKEN as APP_TOKEN
from tests.support.console_app import app_for
from tests.support.console_harness import TOKEN, Stack, chromium
from tests.support.store_rows import Ep, activity, ingest, session

pytestmark = pytest.mark.process

#: Where the screenshot goes (``TEST_ARTIFACTS`` overrides; ``build/`` is not committed).
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS", Path(__file__).parent.parent / "build"))
#: A consumer's error as long as they come: words, then a token with no space to break at.
LONG_ERROR = (
    "TLS handshake with hooks.example-consumer.internal failed: certificate verify failed: "
    "unable to get local issuer certificate; the chain sent was "
    + "MIIFazCCA1OgAwIBAgIRAIIQz7DSQONZRGPgu2OCiwAwDQYJKoZIhvcNAQELBQAw"
    * 4
)[:300]


@pytest.fixture(scope="module")
def chrome() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


# --------------------------------------------------------------------------- 1280 px


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, int]]]:
    """The console in process on 127.0.0.1 over a SQLite store with a dead delivery whose
    error is 300 characters, and deliveries waiting behind an open one."""
    path = tmp_path_factory.mktemp("console-1280") / "relay.db"
    with Backend("sqlite", path).open(clock=Clock(T0 + 600)) as store:
        store.endpoints.sync_endpoints([Ep("alpha"), Ep("customer-billing-webhooks")])
        s = session(123456789012345678, title="A session with a long name")
        store.ingest.upsert_session(s, baseline=False)
        ingest(store, s, [activity(123456789012345678, i) for i in range(1, 4)])
        rows = sorted(store.operator.list_deliveries(limit=10), key=lambda d: d.id)
        failing = rows[0]
        store.outbox.record_attempt(
            failing.id, AttemptResult(None, LONG_ERROR, 30.0, "", None, T0 + 5), Dead("gave up")
        )
        open_head = rows[1]
        store.outbox.record_attempt(
            open_head.id, AttemptResult(500, None, 9.0, "no", None, T0 + 6), Retry(T0 + 900)
        )
        app = app_for(AsyncStore(store))
        with start_blocking_portal() as portal:
            server, (_, port) = portal.start_task(serve, "127.0.0.1:0", app)
            try:
                yield f"http://127.0.0.1:{port}", {"failing": failing.id, "head": open_head.id}
            finally:
                server.cancel()


def measure(browser: Any) -> dict[str, Any]:
    """What a person sees of the deliveries table, in CSS pixels."""
    result: dict[str, Any] = browser.execute_script(
        """
        function lines(el) {  // rendered lines of text in el
          var style = getComputedStyle(el);
          var line = parseFloat(style.lineHeight) || parseFloat(style.fontSize) * 1.45;
          var range = document.createRange();
          range.selectNodeContents(el);
          return Math.round(range.getBoundingClientRect().height / line);
        }
        var table = document.getElementById("deliveries");
        return {
          viewport: document.documentElement.clientWidth,
          scrollWidth: document.documentElement.scrollWidth,
          tableRight: table.getBoundingClientRect().right,
          headerLines: Array.from(table.querySelectorAll("th")).filter(function (th) {
            return th.textContent.trim(); }).map(lines),
          idLines: Array.from(table.querySelectorAll("td.id")).map(lines),
          statusBadgeLines: Array.from(table.querySelectorAll("td.status .badge")).map(lines),
          typeLines: Array.from(table.querySelectorAll("td.type a")).map(lines),
          buttonLines: Array.from(table.querySelectorAll("td.actions button")).map(lines),
        };
        """
    )
    return result


def test_deliveries_at_1280_px_with_a_300_character_error_stay_readable(
    served: tuple[str, dict[str, int]], chrome: Any
) -> None:
    base, ids = served
    chrome.set_window_size(1280, 1400)
    signed_in(chrome, base, APP_TOKEN, "/console/deliveries")
    row = one(chrome, f"tr[data-delivery='{ids['failing']}']")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "console-deliveries-1280.png"
    assert chrome.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    seen = measure(chrome)
    assert 1200 <= seen["viewport"] <= 1280, seen
    assert seen["scrollWidth"] <= seen["viewport"], seen  # no sideways scrolling
    assert seen["tableRight"] <= seen["viewport"], seen
    assert seen["headerLines"] and set(seen["headerLines"]) == {1}, seen
    assert seen["idLines"] and set(seen["idLines"]) == {1}, seen
    assert set(seen["statusBadgeLines"]) == {1}, seen
    assert set(seen["typeLines"]) == {1} and set(seen["buttonLines"]) == {1}, seen
    # The error is folded to one line; its whole text is a click away (no script needed).
    folded = row.find_element("css selector", "td.answer details")
    summary = folded.find_element("css selector", "summary")
    assert summary.text.startswith("TLS handshake") and summary.text.endswith("…")
    whole = folded.find_element("css selector", ".full")
    assert not whole.is_displayed()
    summary.click()
    until(whole.is_displayed, "the whole error")
    assert whole.text == LONG_ERROR
    opened = measure(chrome)
    assert opened["scrollWidth"] <= opened["viewport"] and set(opened["idLines"]) == {1}
    chrome.save_screenshot(str(ARTIFACTS / "console-deliveries-1280-open.png"))
    # A row behind the open head says what it waits on, and links to it.
    waiting = [w.text for w in css(chrome, "#deliveries .waiting")]
    assert f"waiting on #{ids['head']}" in waiting
    # The overview's tables (endpoints with their forms, replicas) fit the same width.
    chrome.get(f"{base}/console")
    one(chrome, "#replicas")
    width = chrome.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert width[0] <= width[1], width


# --------------------------------------------------------------------------- the real daemon


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(tmp_path_factory.mktemp("console-act")) as st:
        yield st


@pytest.fixture
def browser(stack: Stack, chrome: Any) -> Any:
    """The module's browser, signed in to the daemon's console."""
    chrome.set_window_size(1400, 1000)
    return signed_in(chrome, stack.base, TOKEN)


def timeline_of(stack: Stack, name: str) -> str:
    return f"{stack.base}/console/timeline?session={quote(name, safe='')}"


def test_approve_a_plan_from_the_timeline_and_the_session_moves_on(
    stack: Stack, browser: Any
) -> None:
    name = stack.session("Rename the config keys", title="Waits for approval", approval=True)
    page = timeline_of(stack, name)
    until(
        lambda: 'id="approve-form"' in stack.get(page.removeprefix(stack.base)).text,
        "the session to wait for approval in the archive",
    )
    browser.get(page)
    navigate(browser, one(browser, "#approve-form button"))
    assert flash(browser) == f"{name}: plan approved"
    assert "ok" in one(browser, "#flash").get_attribute("class")
    until(
        lambda: "activity.plan_approved" in stack.get(page.removeprefix(stack.base)).text,
        "the approval to come back as an event",
    )
    # Approving again: the service's refusal, in one line.
    browser.get(page)
    browser.execute_script(
        "var f = document.createElement('form'); f.method = 'post';"
        "f.action = '/console/actions/session';"
        "[['csrf_token', document.querySelector('meta[name=csrf-token]').content],"
        " ['session', arguments[0]], ['action', 'approve_plan'],"
        " ['back', location.pathname + location.search]].forEach(function (p) {"
        "  var i = document.createElement('input'); i.type = 'hidden';"
        "  i.name = p[0]; i.value = p[1]; f.appendChild(i); });"
        "document.body.appendChild(f); window.__old_page = true; f.submit();",
        name,
    )
    until(lambda: css(browser, "#flash.error"), "the refusal")
    message = flash(browser)
    assert message.startswith(f"could not approve the plan of {name} (HTTP 400): ")
    assert "is awaiting approval" in message and "\n" not in message


def test_answer_the_agent_from_the_timeline(stack: Stack, browser: Any) -> None:
    name = stack.session("Tidy the logs [ask]", title="Has a question")
    page = timeline_of(stack, name)
    until(
        lambda: 'id="reply-form"' in stack.get(page.removeprefix(stack.base)).text,
        "the agent's question in the archive",
        within=60,
    )
    browser.get(page)
    assert css(browser, "#approve-form") == []
    assert one(browser, "#question").text.strip()  # the agent's question, above the box
    one(browser, "#reply-form textarea").send_keys("Keep the <b>JSON</b> format")
    navigate(browser, one(browser, "#reply-form button"))
    assert flash(browser) == f"{name}: message sent"
    until(
        lambda: "activity.user_messaged" in stack.get(page.removeprefix(stack.base)).text,
        "the answer to come back as an event",
    )
    record = stack.world.get_session(stack.world.accounts[0], name.removeprefix("sessions/"))
    assert "AWAITING_USER_FEEDBACK" not in str(record.state)


def test_a_session_row_added_live_is_filled_in(stack: Stack, browser: Any) -> None:
    browser.get(f"{stack.base}/console/sessions")
    until(lambda: one(browser, "#live-state").text == "live", "the live feed to connect")
    name = stack.session("Write the release notes", title="Release notes, live")
    row = one(browser, f"#sessions tr[data-session='{name}']")
    cells = row.find_elements("css selector", "td")
    until(lambda: cells[0].find_element("css selector", "a").text, "the row's title")
    assert cells[0].find_element("css selector", "a").text == "Release notes, live"
    assert name in cells[0].text
    assert cells[1].text.strip() not in ("", "?")  # the state
    assert cells[3].text == "default"  # the account


def test_search_the_deliveries_by_session(stack: Stack, browser: Any) -> None:
    name = stack.session("Count the files", title="Searched for")
    until(
        lambda: "data-delivery=" in stack.get(f"/console/deliveries?q={quote(name)}").text,
        "the session's deliveries",
    )
    browser.get(f"{stack.base}/console/deliveries")
    box = one(browser, "#delivery-filters input[name=q]")
    box.send_keys(name.removeprefix("sessions/"))
    navigate(browser, one(browser, "#delivery-filters button[type=submit]"))
    rows = css(browser, "#deliveries tbody tr[data-delivery]")
    assert rows and all(name in r.text for r in rows)
    assert name in one(browser, "#search-note").text
