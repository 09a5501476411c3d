"""The pages behind signed action links in a real browser: headless Chromium (Selenium)
against a real ``sessionhook run`` with ``[actions]`` on, fed by the emulator. A person who
never signed in to the console opens the link of a ``session.action_required`` event,
reads the plan or the question, confirms or types an answer, and sees the result; upstream
text and the typed answer never become markup. See tests/support/console_harness.py for the stack.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.console_harness import HOSTILE, Stack, chromium

pytestmark = pytest.mark.process

WAIT = 20.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(tmp_path_factory.mktemp("actions"), actions=True) as st:
        yield st


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


def until(check: Callable[[], Any], what: str, within: float = WAIT) -> Any:
    return Stack.wait_for(check, within=within, what=what)


def links_of(stack: Stack, session: str) -> dict[str, str]:
    """The links of the session's ``session.action_required``, once it arrived."""

    def found() -> dict[str, str] | None:
        for raw in list(stack.consumers["alpha"].bodies):
            body = json.loads(raw)
            data = body.get("data") or {}
            mine = data.get("session", {}).get("name") == session
            if body.get("type") == "session.action_required" and mine:
                return dict(data["links"])
        return None

    links: dict[str, str] = until(found, f"the action_required event of {session}", within=60)
    return links


def text_of(browser: Any, selector: str) -> str:
    return str(until(lambda: browser.find_elements("css selector", selector), selector)[0].text)


def submit(browser: Any) -> None:
    browser.execute_script("window.__old_page = true")
    browser.find_element("css selector", "form button[type=submit]").click()
    until(
        lambda: browser.execute_script(
            "return window.__old_page !== true && document.readyState === 'complete'"
        ),
        "the page after submitting",
    )


#: The page's card: the one element drawn with a shadow (the login stylesheet's card).
CARD = """
const cards = [...document.querySelectorAll('body *')]
  .filter(e => getComputedStyle(e).boxShadow !== 'none');
if (cards.length !== 1) return ['cards: ' + cards.length];
const card = cards[0].getBoundingClientRect();
const outside = [];
for (const selector of arguments[0]) {
  for (const e of document.querySelectorAll(selector)) {
    const r = e.getBoundingClientRect();
    if (r.left < card.left || r.right > card.right || r.top < card.top || r.bottom > card.bottom) {
      outside.push(selector);
    }
  }
}
return outside;
"""


def drawn_in_the_card(browser: Any, *selectors: str) -> None:
    """The page's heading, text and form are inside its card's box (they were drawn above
    and beside it: the card was the form alone)."""
    present = [s for s in selectors if browser.find_elements("css selector", s)]
    assert present == list(selectors), browser.page_source[:2000]
    assert browser.execute_script(CARD, list(selectors)) == []


def not_injected(browser: Any) -> None:
    assert browser.execute_script("return window.__pwned") is None
    assert browser.find_elements("css selector", "#pwned") == []


def test_a_plan_approved_from_its_page(stack: Stack, browser: Any) -> None:
    name = stack.session("Refactor the billing module", title=f"Billing {HOSTILE}", approval=True)
    links = links_of(stack, name)
    browser.delete_all_cookies()
    browser.get(links["approve"])
    assert text_of(browser, "h1") == "Approve the plan?"
    assert HOSTILE in browser.find_element("css selector", "main").text  # shown as text
    not_injected(browser)
    steps = browser.find_elements("css selector", "ol.steps li")
    assert steps, browser.page_source
    drawn_in_the_card(browser, "h1", "main > p", "ol.steps", "form", "form button")
    submit(browser)
    assert text_of(browser, "h1") == "Done"
    drawn_in_the_card(browser, "h1", "main > p")
    assert "Plan approved" in text_of(browser, "main")
    until(
        lambda: (
            stack.world.get_session(stack.world.accounts[0], name.split("/")[1]).state
            != "AWAITING_PLAN_APPROVAL"
        ),
        "the session to move on",
    )
    # Back on the link: it was used.
    browser.get(links["approve"])
    assert text_of(browser, "h1") == "Nothing was done"
    assert "used already" in text_of(browser, "main")


def test_a_question_answered_from_its_page(stack: Stack, browser: Any) -> None:
    name = stack.session("[ask] Stream the CSV export", title="CSV export")
    links = links_of(stack, name)
    browser.delete_all_cookies()
    browser.get(links["reply"])
    assert text_of(browser, "h1") == "The agent asks"
    assert text_of(browser, "blockquote.question")
    drawn_in_the_card(browser, "h1", "blockquote.question", "form", "textarea", "form button")
    answer = f"Keep it simple {HOSTILE} & done"
    browser.find_element("css selector", "textarea[name=text]").send_keys(answer)
    submit(browser)
    assert text_of(browser, "h1") == "Done"
    assert text_of(browser, "blockquote.reply") == answer
    not_injected(browser)
    account = stack.world.accounts[0]

    def told() -> bool:
        page = stack.world.list_activities(account, name.split("/")[1], after=None, limit=100)
        return any(
            a.user_messaged is not None and a.user_messaged.user_message == answer
            for a in page.items
        )

    until(told, "the answer to reach the agent")
