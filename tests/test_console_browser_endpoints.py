"""An endpoint's life in the console, in a real browser (headless Chromium through
Selenium), the console served in process over a SQLite store: created from the form, its
secret seen once, edited, disabled, deleted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sessionhook.relay.store import AsyncStore, Store
from tests.support.backends import Backend
from tests.support.browser import css, flash, navigate, one, signed_in
from tests.support.clock import T0, Clock
from tests.support.console_app import TOKEN, app_for, serving
from tests.support.console_harness import chromium

pytestmark = pytest.mark.process


@pytest.fixture
def chrome() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[tuple[str, Store]]:
    with (
        Backend("sqlite", tmp_path / "relay.db").open(clock=Clock(T0 + 600)) as store,
        serving(app_for(AsyncStore(store))) as base,
    ):
        yield base, store


def fill(browser: Any, selector: str, text: str) -> None:
    field = one(browser, selector)
    field.clear()
    field.send_keys(text)


def test_an_endpoint_created_edited_disabled_and_deleted_from_the_console(
    relay: tuple[str, Store], chrome: Any
) -> None:
    base, store = relay
    signed_in(chrome, base, TOKEN, "/console")
    navigate(chrome, one(chrome, "#new-endpoint"))
    fill(chrome, "input[name=name]", "ci-bot")
    fill(chrome, "input[name=url]", "https://hooks.example.com/ci")
    fill(chrome, "input[name=events]", "session.action_required")
    fill(chrome, "textarea[name=description]", "the CI's <b>bot</b>")
    navigate(chrome, one(chrome, "#endpoint-form button.save"))

    # The secret, once: on the POST's own answer.
    secret = one(chrome, "#secret").text
    stored = store.endpoints.stored_endpoint("ci-bot")
    assert stored is not None and secret == stored.secret and secret.startswith("whsec_")
    navigate(chrome, one(chrome, "main a[href='/console']"))
    assert secret not in chrome.page_source
    row = one(chrome, "tr[data-endpoint='ci-bot']")
    assert "https://hooks.example.com/ci" in row.text

    # Edit: the form shows the definition (never the secret); the change is saved.
    navigate(chrome, row.find_element("css selector", "a.edit"))
    assert secret not in chrome.page_source
    assert one(chrome, "textarea[name=description]").get_property("value") == "the CI's <b>bot</b>"
    fill(chrome, "input[name=url]", "https://hooks.example.com/v2")
    navigate(chrome, one(chrome, "#endpoint-form button.save"))
    assert flash(chrome) == "endpoint ci-bot saved"
    edited = store.endpoints.stored_endpoint("ci-bot")
    assert edited is not None and edited.spec["url"] == "https://hooks.example.com/v2"
    assert edited.secret == secret

    # Disable it from the overview, with a reason.
    navigate(chrome, one(chrome, "header a[href='/console']"))
    fill(chrome, "tr[data-endpoint='ci-bot'] input[name=reason]", "consumer moving")
    navigate(chrome, one(chrome, "tr[data-endpoint='ci-bot'] button.disable"))
    assert flash(chrome) == "endpoint ci-bot disabled: consumer moving"
    (state,) = [e for e in store.endpoints.endpoint_states() if e.name == "ci-bot"]
    assert not state.enabled and state.disabled_reason == "consumer moving"

    # Delete it: its name typed again.
    navigate(chrome, one(chrome, "tr[data-endpoint='ci-bot'] a.edit"))
    fill(chrome, "#delete-form input[name=confirm]", "ci-bot")
    navigate(chrome, one(chrome, "#delete-form button.delete"))
    assert flash(chrome) == "endpoint ci-bot deleted; 0 open deliveries closed"
    assert store.endpoints.stored_endpoint("ci-bot") is None
    assert css(chrome, "tr[data-endpoint='ci-bot'] a.edit") == []
