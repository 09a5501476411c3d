"""One sample event of every type the relay emits (pure): for checking templates at start-up,
for the OpenAPI document's examples, for ``sessionhook`` users writing a template, and for
``sessionhook trigger`` (:func:`triggered`: a sample marked ``data.sample``, its action links
signed for :data:`~.action_links.SAMPLE_ACCOUNT`, which no upstream call ever follows)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from sessionhook.api.models import Activity, PullRequest, Session

from . import events, lifecycle
from .action_links import SAMPLE_ACCOUNT, ActionLinks

#: What the sample of each type shows (``sessionhook trigger --list``).
SAMPLE_LINES: Final[dict[str, str]] = {
    events.SESSION_DISCOVERED: "a new session, QUEUED, on a repository",
    events.SESSION_STATE_CHANGED: "the session moved from PLANNING to IN_PROGRESS",
    events.SESSION_PULL_REQUEST_OPENED: "the agent opened a pull request",
    events.SESSION_ARCHIVED: "the session was archived (out of the service's default list)",
    events.SESSION_UNARCHIVED: "the session was unarchived",
    events.SESSION_ACTION_REQUIRED: "a plan of two steps waits for approval (links with [actions])",
    events.SESSION_COMPLETED: "the session completed: a pull request and a change set",
    events.SESSION_FAILED: "the session failed, with the reason",
    "activity.plan_generated": "the agent's plan, two steps",
    "activity.plan_approved": "the plan was approved",
    "activity.user_messaged": "a message from the user",
    "activity.agent_messaged": "the agent asks a question",
    "activity.progress_updated": "progress: a command and its output",
    "activity.session_completed": "the agent's completion, with its change set",
    "activity.session_failed": "the agent's failure, with the reason",
    events.ACTIVITY_SESSION_STARTED: "the service's notice that the session started",
    events.ACTIVITY_UNKNOWN: "an activity of a kind this version does not know",
}

#: The sample session's title.
SAMPLE_TITLE: Final = "Fix the flaky login test"
_SESSION = {
    "name": "sessions/14550388554331055113",
    "id": "14550388554331055113",
    "title": SAMPLE_TITLE,
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


def _sessions(real: Session | None) -> dict[str, Session]:
    """The sample session in each state it is shown in: the sample's own fields, or, for a
    real ``session``, its fields (its name, title, source, outputs...) under each state."""
    base: dict[str, object] = dict(_SESSION) if real is None else real.to_wire()
    outputs = base.get("outputs") or [
        {"pullRequest": _PR},
        {"changeSet": _ACTIVITIES["sessionCompleted"]["artifacts"][0]["changeSet"]},  # type: ignore[index]
    ]
    states = ("QUEUED", "IN_PROGRESS", "AWAITING_PLAN_APPROVAL", "AWAITING_USER_FEEDBACK")
    found = {state: Session.model_validate({**base, "state": state}) for state in states}
    found["FAILED"] = Session.model_validate({**base, "state": "FAILED"})
    found["COMPLETED"] = Session.model_validate({**base, "state": "COMPLETED", "outputs": outputs})
    return found


def _activity(session: str, member: str, number: int) -> Activity:
    hex_id = f"{number:032x}"
    return Activity.model_validate(
        {
            "name": f"{session}/activities/{hex_id}",
            "id": hex_id,
            "originator": _ORIGINATORS.get(member, "agent"),
            "createTime": f"2026-01-05T09:{10 + number:02d}:00.000001Z",
            **_ACTIVITIES[member],
        }
    )


def sample_activity(member: str) -> Activity:
    """The sample activity of the event member ``member`` (``planGenerated``...)."""
    return _activity(str(_SESSION["name"]), member, list(_ACTIVITIES).index(member))


def sample_events(
    *,
    links: ActionLinks = _LINKS,
    account: str = "default",
    session: Session | None = None,
    activities: Mapping[str, Activity] | None = None,
    now: float = 0,
) -> list[events.Event]:
    """One event of each type in :data:`events.EVENT_TYPES` (both ``action_required``
    kinds), with plausible upstream data; deterministic.

    ``session`` and ``activities`` (by event member) put real data in place of the
    sample's; ``links`` and ``account`` sign the action links (by default with a key that
    signs nothing else); ``now`` starts their time to live."""
    states = _sessions(session)
    name = states["QUEUED"].name
    real = activities or {}

    def activity(member: str, number: int) -> Activity:
        return real.get(member) or _activity(name, member, number)

    working = states["IN_PROGRESS"]
    found = [
        events.session_discovered(states["QUEUED"], now=now),
        events.session_state_changed(working, "PLANNING", now=now),
    ]
    done = states["COMPLETED"]
    pull_request = (done.pull_requests or [PullRequest.model_validate(_PR)])[0]
    found.append(events.pull_request_opened(done, pull_request, now=now))
    archived = done.model_copy(update={"archived": True})
    found.append(events.archived_changed(archived, now=now))
    found.append(events.archived_changed(done.model_copy(update={"archived": False}), now=now))
    for number, member in enumerate(_ACTIVITIES):
        found.append(
            events.activity_event(working, activity(member, number), max_media_bytes=1024, now=now)
        )
    for state, member, number in (
        ("AWAITING_PLAN_APPROVAL", "planGenerated", 0),
        ("AWAITING_USER_FEEDBACK", "agentMessaged", 3),
        ("COMPLETED", "sessionCompleted", 5),
        ("FAILED", "sessionFailed", 6),
    ):
        found += lifecycle.lifecycle_events(
            states[state],
            activity(member, number),
            entered=True,
            now=now,
            account=account,
            links=links,
        )
    return found


def triggered(
    event_type: str,
    *,
    links: ActionLinks | None,
    session: Session | None = None,
    activities: Mapping[str, Activity] | None = None,
    now: float,
) -> events.Event:
    """The sample of ``event_type`` that ``sessionhook trigger`` sends: its body marked
    ``data.sample: true``; with ``links`` (``[actions]`` on), working action links of
    :data:`SAMPLE_ACCOUNT`, whose pages say it is a sample and never act upstream. A
    ``session`` (and its archived ``activities``) puts a real session's data in it.
    :class:`KeyError` for a type the relay does not emit."""
    if event_type not in SAMPLE_LINES:
        raise KeyError(event_type)
    made = sample_events(
        links=links or _LINKS,
        account=SAMPLE_ACCOUNT,
        session=session,
        activities=activities,
        now=now,
    )
    event = next(e for e in made if e.type == event_type)
    payload = event.payload()
    if links is None:
        payload["data"].pop("links", None)
    payload["data"]["sample"] = True
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    return events.Event(
        id=event.id,
        type=event.type,
        session_name=event.session_name,
        activity_name=event.activity_name,
        occurred_at=event.occurred_at,
        occurred_ts=event.occurred_ts,
        body=body,
    )
