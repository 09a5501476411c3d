"""One sample event of every type the relay emits (pure): for checking templates at start-up,
for the OpenAPI document's examples, and for ``sessionhook`` users writing a template."""

from __future__ import annotations

from sessionhook.api.models import Activity, Session

from . import events, lifecycle
from .action_links import ActionLinks

_SESSION = {
    "name": "sessions/14550388554331055113",
    "id": "14550388554331055113",
    "title": "Fix the flaky login test",
    "prompt": "Fix the flaky login test",
    "state": "IN_PROGRESS",
    "url": "https://agent.example.com/session/14550388554331055113",
    "createTime": "2026-01-05T09:00:00.000001Z",
    "updateTime": "2026-01-05T09:30:00.000001Z",
    "sourceContext": {"source": "sources/github/acme/api"},
}
_PATCH = (
    "diff --git a/login.py b/login.py\n--- a/login.py\n+++ b/login.py\n"
    "@@ -1,2 +1,2 @@\n-retries = 0\n+retries = 3\n ok = True\n"
)
_PR = {"url": "https://github.com/acme/api/pull/7", "title": "Fix the flaky login test"}
_ACTIVITIES: dict[str, dict[str, object]] = {
    "planGenerated": {
        "planGenerated": {
            "plan": {
                "id": "5d1c9e0b7a2f4c3e8d6b1a0f9e8d7c6b",
                "steps": [
                    {"id": "a1", "title": "Reproduce the failure"},
                    {"id": "a2", "index": 1, "title": "Add retries", "description": "In login.py"},
                ],
            }
        }
    },
    "planApproved": {"planApproved": {"planId": "5d1c9e0b7a2f4c3e8d6b1a0f9e8d7c6b"}},
    "userMessaged": {"userMessaged": {"userMessage": "Keep empty values allowed."}},
    "agentMessaged": {"agentMessaged": {"agentMessage": "Should empty values still be accepted?"}},
    "progressUpdated": {
        "progressUpdated": {"title": "Ran the tests"},
        "artifacts": [{"bashOutput": {"command": "pytest -q", "output": "3 passed"}}],
    },
    "sessionCompleted": {
        "sessionCompleted": {},
        "artifacts": [
            {
                "changeSet": {
                    "source": "sources/github/acme/api",
                    "gitPatch": {
                        "baseCommitId": "9f2c1e0d4b3a",
                        "unidiffPatch": _PATCH,
                        "suggestedCommitMessage": "Fix the flaky login test",
                    },
                }
            }
        ],
    },
    "sessionFailed": {"sessionFailed": {"reason": "The test suite kept failing."}},
    # No member: the service's "Session started" notice (activity.session_started).
    "": {"description": "Session started"},
    # A member this version does not know (activity.unknown).
    "reviewRequested": {"reviewRequested": {"reviewer": "octocat"}},
}


#: The sample action_required events carry links as with ``[actions]`` enabled (signed with a
#: key that signs nothing else).
_LINKS = ActionLinks("https://relay.example.com", 86400.0, b"sample key: signs no real link")
_ORIGINATORS = {"userMessaged": "user", "planApproved": "user", "": "system"}


def _session(state: str, **extra: object) -> Session:
    return Session.model_validate({**_SESSION, "state": state, **extra})


def _activity(member: str, number: int) -> Activity:
    hex_id = f"{number:032x}"
    return Activity.model_validate(
        {
            "name": f"{_SESSION['name']}/activities/{hex_id}",
            "id": hex_id,
            "originator": _ORIGINATORS.get(member, "agent"),
            "createTime": f"2026-01-05T09:{10 + number:02d}:00.000001Z",
            **_ACTIVITIES[member],
        }
    )


def sample_events() -> list[events.Event]:
    """One event of each type in :data:`events.EVENT_TYPES` (both ``action_required``
    kinds), with plausible upstream data; deterministic."""
    session = _session("IN_PROGRESS")
    found = [
        events.session_discovered(_session("QUEUED"), now=0),
        events.session_state_changed(session, "PLANNING", now=0),
    ]
    done = _session(
        "COMPLETED",
        outputs=[
            {"pullRequest": _PR},
            {"changeSet": _ACTIVITIES["sessionCompleted"]["artifacts"][0]["changeSet"]},  # type: ignore[index]
        ],
    )
    found.append(events.pull_request_opened(done, done.pull_requests[0], now=0))
    for number, member in enumerate(_ACTIVITIES):
        found.append(
            events.activity_event(session, _activity(member, number), max_media_bytes=1024, now=0)
        )
    for state, member, number, target in (
        ("AWAITING_PLAN_APPROVAL", "planGenerated", 0, _session("AWAITING_PLAN_APPROVAL")),
        ("AWAITING_USER_FEEDBACK", "agentMessaged", 3, _session("AWAITING_USER_FEEDBACK")),
        ("COMPLETED", "sessionCompleted", 5, done),
        ("FAILED", "sessionFailed", 6, _session("FAILED")),
    ):
        assert target.state == state
        found += lifecycle.lifecycle_events(
            target, _activity(member, number), entered=True, now=0, links=_LINKS
        )
    return found
