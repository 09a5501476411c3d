"""What the console's browser tests do with the page, as a person would: wait for an
element (every wait bounded), click and wait for the next page, read the flash message,
sign in with the token, and check that hostile markup stayed text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.support.console_harness import Stack

__all__ = [
    "WAIT",
    "assert_not_executed",
    "css",
    "flash",
    "navigate",
    "one",
    "sign_in",
    "signed_in",
    "until",
]

WAIT = 20.0  # seconds: the longest any single expectation may take


def until(check: Callable[[], Any], what: str, within: float = WAIT) -> Any:
    """``check()`` once it is truthy, waiting at most ``within`` seconds."""
    return Stack.wait_for(check, within=within, what=what)


def css(browser: Any, selector: str) -> list[Any]:
    """The elements ``selector`` matches now."""
    return list(browser.find_elements("css selector", selector))


def one(browser: Any, selector: str) -> Any:
    """The first element ``selector`` matches, once there is one."""
    return until(lambda: (css(browser, selector) or [None])[0], f"an element {selector!r}")


def navigate(browser: Any, element: Any) -> None:
    """Click ``element`` and wait until the next page has loaded (a form submitted, a link
    followed): what is read next is the new page, never the old one."""
    from selenium.common.exceptions import WebDriverException

    browser.execute_script("window.__old_page = true")
    element.click()

    def arrived() -> bool:
        try:
            return bool(
                browser.execute_script(
                    "return window.__old_page !== true && document.readyState === 'complete'"
                )
            )
        except WebDriverException:  # asked while the browser was between the two pages
            return False

    until(arrived, "the next page")


def flash(browser: Any) -> str:
    """The flash message the last action left."""
    return str(one(browser, "#flash").text)


def assert_not_executed(browser: Any) -> None:
    """The hostile markup stayed text: its script did not run, its image is not an element."""
    assert browser.execute_script("return window.__pwned === undefined") is True
    assert css(browser, "#pwned") == []


def sign_in(browser: Any, token: str) -> None:
    """Fill the login form with ``token`` and send it."""
    field = one(browser, "input[name=token]")
    field.clear()
    field.send_keys(token)
    navigate(browser, one(browser, "form button[type=submit]"))


def signed_in(browser: Any, base: str, token: str, page: str = "/console") -> Any:
    """``browser`` on ``page`` of the console at ``base``, signed in with ``token`` first
    when the console asks for it."""
    browser.get(f"{base}{page}")
    if "/login" in browser.current_url:
        sign_in(browser, token)
        until(lambda: browser.current_url.endswith(page), f"{page} after signing in")
    return browser
