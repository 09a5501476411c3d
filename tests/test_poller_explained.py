"""A lifecycle event (``session.failed``, ``completed``, ``action_required``) carries the
activity behind it, also when the service shows the state before that activity: the poller
waits for it (within ``lifecycle_wait``), and only then tells the state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.poller_harness import PollerHarness, Rewrite, settled

pytestmark = [pytest.mark.app, pytest.mark.anyio]

#: (prompt, plan approval required, state, hidden member, lifecycle event, what it carries)
CASES = [
    ("[fail] Fix the build", False, "FAILED", "sessionFailed", "session.failed", "reason"),
    ("[ask] Tidy the config", False, "AWAITING_USER_FEEDBACK", "agentMessaged", "answer", ""),
    ("Add a health check", True, "AWAITING_PLAN_APPROVAL", "planGenerated", "approve_plan", ""),
]

ACTIVITY_TYPES = {
    "sessionFailed": "activity.session_failed",
    "agentMessaged": "activity.agent_messaged",
    "planGenerated": "activity.plan_generated",
}


class StateBeforeActivity(Rewrite):
    """While ``hiding``, activity pages leave out the activities of member ``hidden``: the
    session's state (its GET) shows before the activity behind it. Records the states the
    GETs answered."""

    def __init__(self, hidden: str) -> None:
        super().__init__()
        self.hidden = hidden
        self.hiding = True
        self.states: list[str] = []

    def edit(self, request: httpx.Request, body: dict[str, Any]) -> bool:
        if not request.url.path.endswith("/activities"):
            if "state" in body and "sessions" not in body:
                self.states.append(str(body["state"]))
            return False
        listed = body.get("activities", [])
        kept = [a for a in listed if not (self.hiding and self.hidden in a)]
        if len(kept) == len(listed):
            return False
        self.edited += [a["name"] for a in listed if a not in kept]
        body["activities"] = kept
        return True


async def _until_read_in(h: PollerHarness, rewrite: StateBeforeActivity, state: str) -> None:
    """Rounds until a GET of the relay answered ``state`` while its activity was hidden."""
    for _ in range(30):
        await h.round()
        if state in rewrite.states:
            assert rewrite.edited, "the activity was never hidden from a walk"
            return
    raise AssertionError(f"the relay never read the session in {state}")


def _lifecycle(h: PollerHarness, name: str) -> list[dict[str, Any]]:
    return [
        e.payload()
        for e in h.store.store.operator.iter_events(session=name)
        if e.type in ("session.failed", "session.completed", "session.action_required")
    ]


@pytest.mark.parametrize(("prompt", "approval", "state", "member", "kind", "field"), CASES)
async def test_a_state_shown_before_its_activity_waits_for_it(
    tmp_path: Path, prompt: str, approval: bool, state: str, member: str, kind: str, field: str
) -> None:
    rewrite = StateBeforeActivity(member)
    async with rewrite.harness(tmp_path) as h:
        session = await h.api.create_session(prompt, require_plan_approval=approval or None)
        await _until_read_in(h, rewrite, state)
        # Read in its new state, the activity behind it not walked yet: nothing told yet.
        assert _lifecycle(h, session.name) == []
        await h.round()  # still hidden: the poller looks again, and still waits
        assert _lifecycle(h, session.name) == []
        rewrite.hiding = False  # the activity is committed, within lifecycle_wait
        for _ in range(3):
            await h.round()
        upstream = [
            a async for a in h.api.iter_activities(session.name) if a.event_member == member
        ]
        assert len(upstream) == 1
        explaining = upstream[0]
        told = _lifecycle(h, session.name)
        assert len(told) == 1, told
        data = told[0]["data"]
        assert data["activity_name"] == explaining.name
        if field == "reason":
            assert explaining.session_failed is not None
            assert data["reason"] == explaining.session_failed.reason != ""
        elif kind == "answer":
            assert explaining.agent_messaged is not None
            assert data["question"] == explaining.agent_messaged.agent_message != ""
        else:
            assert explaining.plan_generated is not None
            assert data["plan"]["id"] == explaining.plan_generated.plan.id
        # In order: the activity, the state it brought, then what it asks or ends.
        types = [e.type for e in h.store.store.operator.iter_events(session=session.name)]
        lifecycle_type = "session.failed" if field == "reason" else "session.action_required"
        activity_type = types.index(ACTIVITY_TYPES[member])
        changed = len(types) - 1 - types[::-1].index("session.state_changed")
        assert activity_type < changed < types.index(lifecycle_type)


async def test_an_activity_that_never_comes_delays_the_event_a_bounded_time(
    tmp_path: Path,
) -> None:
    rewrite = StateBeforeActivity("sessionFailed")
    async with rewrite.harness(tmp_path) as h:
        session = await h.api.create_session("[fail] Fix the build")
        await _until_read_in(h, rewrite, "FAILED")
        reads = h.count("get_session")
        for _ in range(8):  # past lifecycle_wait (5 s; one round is one second)
            await h.round()
        # Told without it once the wait is over, and once only (keyed by the state).
        told = _lifecycle(h, session.name)
        assert len(told) == 1
        assert told[0]["data"]["activity_name"] is None and told[0]["data"]["reason"] == ""
        types = [e.type for e in h.store.store.operator.iter_events(session=session.name)]
        assert types.count("session.state_changed") >= 1
        # The wait read the session a few times (0.5 s, doubling), not once per round.
        assert h.count("get_session") - reads <= 4


async def test_a_session_first_seen_finished_without_its_activity_is_told_at_once(
    tmp_path: Path,
) -> None:
    # A finished session from a server that never recorded the completion (most sessions
    # of a first start's history are old): nothing to wait for, and none of the wait's
    # reads, which would multiply what the history walk costs.
    rewrite = StateBeforeActivity("sessionCompleted")
    async with rewrite.harness(tmp_path) as h:
        name = await settled(h, "Add a health check")
        await h.poller.discover()
        await h.poller.poll_due()
        assert rewrite.edited  # the walk did not show the completion
        told = _lifecycle(h, name)
        assert len(told) == 1 and told[0]["data"]["activity_name"] is None
        assert h.count("get_session") == 1  # discovery's read only
        assert h.count("list_activities") == 1
