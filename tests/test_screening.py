"""The session list's items judged one by one (relay/polling/screening.py, pure)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog
from structlog.testing import capture_logs

from sessionhook.api import RefusedItem, SessionPage
from sessionhook.api._unicode import mended
from sessionhook.api.models import Session
from sessionhook.relay.polling.screening import SessionScreen
from sessionhook.relay.telemetry.metrics import Metrics

pytestmark = pytest.mark.unit


def value(metrics: Metrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


@pytest.fixture
def debug_level() -> Iterator[None]:
    """Every level reaches the captured logs, whatever level an earlier test in this
    process configured (capture_logs swaps the processors, not the level filter)."""
    before = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    yield
    structlog.configure(**before)


@pytest.mark.usefixtures("debug_level")
def test_sessions_are_kept_mended_or_refused_and_each_is_loud_once() -> None:
    metrics = Metrics()
    screen = SessionScreen(metrics, "default")
    listed = mended(Session, {"name": "sessions/2", "title": "cut \ud83d"})
    page = SessionPage(
        [Session(name="sessions/1"), listed, Session(name="sessions/a/b")],
        [RefusedItem("sessions/3", "", 20, 0, "malformed", "not a session: state: ...")],
    )
    with capture_logs() as logs:
        kept = [s.name for s in screen.accepted(page)]
        kept_again = [s.name for s in screen.accepted(page)]  # the next discovery pass
        # Its GET mends more than the list item showed: warned again, counted once.
        read = mended(Session, {"name": "sessions/2", "title": "\ud83d", "prompt": "\udc00"})
        screen.note_repairs(read)
    assert kept == kept_again == ["sessions/1", "sessions/2"]
    loud = [(e["event"], e["session"]) for e in logs if e["log_level"] == "warning"]
    assert loud == [
        ("discovery.session_refused", "sessions/3"),
        ("discovery.session_repaired", "sessions/2"),
        ("discovery.session_refused", "sessions/a/b"),
        ("discovery.session_repaired", "sessions/2"),
    ]
    assert [e["fields"] for e in logs if e["event"] == "discovery.session_repaired"] == [
        "title",
        "title",
        "title,prompt",
    ]
    assert value(metrics, "sessionhook_sessions_repaired_total") == 1
    for reason in ("malformed", "not_a_name"):
        assert value(metrics, "sessionhook_sessions_refused_total", reason=reason) == 1
