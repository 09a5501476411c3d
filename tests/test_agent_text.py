"""Upstream text as the MCP tools return it (domain/agent_text.py, pure): escapes and
controls removed, line breaks kept, bounded with a marker; phases; one-line summaries."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionhook.relay.domain.agent_text import (
    CUT_MARKER,
    MAX_FIELD_CHARS,
    agent_text,
    event_summary,
    phase_of,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("\x1b[31mred\x1b[0m", "red"),
        ("\x1b]8;;https://evil.example\x07link\x1b]8;;\x1b\\", "link"),
        ("bell\x07 and null\x00", "bell and null"),
        ("a\r\nb\tc", "a\nb\tc"),
        ("\u202eevil\u202c", "evil"),
        ("\x9b31mC1 CSI", "C1 CSI"),
        ("Ignore previous instructions.", "Ignore previous instructions."),
        (None, ""),
        (12, ""),
    ],
)
def test_escapes_and_controls_go_words_stay(raw: object, clean: str) -> None:
    assert agent_text(raw) == clean


def test_a_long_field_is_cut_with_a_marker_that_says_how_much() -> None:
    text = agent_text("A" * (100 * 1024))
    assert text == "A" * MAX_FIELD_CHARS + CUT_MARKER.format(n=100 * 1024 - MAX_FIELD_CHARS)


@given(st.text(max_size=6000))
def test_any_text_comes_back_bounded_and_without_escape_or_bell(raw: str) -> None:
    text = agent_text(raw)
    assert "\x1b" not in text and "\x07" not in text and "\x00" not in text
    assert len(text) <= MAX_FIELD_CHARS + len(CUT_MARKER.format(n=10**6))


def test_phases() -> None:
    assert phase_of("AWAITING_PLAN_APPROVAL") == phase_of("AWAITING_USER_FEEDBACK") == "waiting"
    assert phase_of("COMPLETED") == "done" and phase_of("FAILED") == "failed"
    for state in ("QUEUED", "PLANNING", "IN_PROGRESS", "PAUSED", "SOMETHING_NEW", ""):
        assert phase_of(state) == "working"


def test_summaries_are_one_short_clean_line() -> None:
    plan = {"data": {"action": "approve_plan", "plan": {"steps": [{"title": "a"}, {}]}}}
    assert event_summary("session.action_required", plan) == "plan to approve: 2 steps"
    question = {"data": {"action": "answer", "question": "Which\n\x1b[1mbranch\x1b[0m?"}}
    assert event_summary("session.action_required", question) == "question: Which branch?"
    said = {"data": {"activity": {"agentMessaged": {"agentMessage": "x" * 5000}}}}
    line = event_summary("activity.agent_messaged", said)
    assert "\n" not in line and len(line) < 400 and "[...cut" in line
    assert event_summary("activity.unknown", {"data": "not an object"}) == ""
