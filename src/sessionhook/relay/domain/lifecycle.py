"""Events people act on, derived from a session's state and its archived activities (pure):
``session.action_required`` (a plan to approve, a question to answer), ``session.completed``
and ``session.failed``, so that a consumer need not decode ``state_changed`` snapshots.

Each belongs to the activity that opened the wait or ended the run, so its id is stable per
wait and per completion (``evt_`` + ``sha256(type:name:activity)``); a state shown before
its activity is waited for a bounded time, then keyed by ``"state:" + updateTime``.
:func:`awaited_member` names the activity to look up for a state, :func:`explains` whether
the one found is behind the state just entered, :func:`lifecycle_events` builds the events.
The bodies and ids: docs/domain.md and docs/events.md.
"""

from __future__ import annotations

import re
from typing import Any

from sessionhook.api.models import Activity, ChangeSet, Session, parse_timestamp

from .action_links import ActionLinks
from .actions import ActionKind
from .events import (
    SESSION_ACTION_REQUIRED,
    SESSION_COMPLETED,
    SESSION_FAILED,
    Event,
    event_id,
    make_event,
    session_summary,
    webhook_timestamp,
)

ACTION_APPROVE_PLAN = "approve_plan"
ACTION_ANSWER = "answer"

#: State -> (event type, the activity member that opened the wait or ended the run).
_STATES: dict[str, tuple[str, str]] = {
    "AWAITING_PLAN_APPROVAL": (SESSION_ACTION_REQUIRED, "planGenerated"),
    "AWAITING_USER_FEEDBACK": (SESSION_ACTION_REQUIRED, "agentMessaged"),
    "COMPLETED": (SESSION_COMPLETED, "sessionCompleted"),
    "FAILED": (SESSION_FAILED, "sessionFailed"),
}

_DIFF_GIT = re.compile(r"^diff --git a/(.+?) b/(.+)$")
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def awaited_member(state: str) -> str | None:
    """The activity member behind ``state``'s event (``planGenerated`` for a plan waiting
    for approval...), or ``None`` when the state gives no lifecycle event."""
    entry = _STATES.get(state)
    return entry[1] if entry else None


def explains(activity: Activity | None, since: str | None) -> bool:
    """Whether ``activity``, the newest archived :func:`awaited_member` of the state a session
    just entered, is the one behind that state: there is one, and (when ``since`` is given,
    the ``updateTime`` of the copy last seen in another state) it is not older than that
    copy. An older one belongs to an earlier wait or run (a resumed session that completes
    again); the one behind this state is not archived yet. An unreadable time counts as
    explaining (waiting for a time that cannot be compared would only delay the event)."""
    if activity is None:
        return False
    if since is None:
        return True
    try:
        return parse_timestamp(activity.create_time) >= parse_timestamp(since)
    except ValueError:
        return True


def lifecycle_events(
    session: Session,
    activity: Activity | None,
    *,
    entered: bool,
    seen_until: str = "",
    now: float | None = None,
    account: str = "default",
    links: ActionLinks | None = None,
) -> list[Event]:
    """The lifecycle event of ``session``'s current state, if it has one.

    ``activity`` is the newest archived activity of :func:`awaited_member` (``None`` when
    there is none); ``entered`` says whether the session entered its state since the relay
    last saw it (a state change, or its first poll); ``seen_until`` is the ``updateTime`` of
    the copy the relay saw before this one. An event is emitted when the session entered
    its state (keyed by the activity, else by ``updateTime``), or when the activity is newer
    than ``seen_until`` (a new wait or completion between two polls, with no state change
    to see). An activity archived late, older than the state the relay already announced,
    gives nothing new: its wait was announced when the state was seen. Calling this again
    for the same wait gives the same event id, or nothing.

    With ``links``, a ``session.action_required`` event carries ``data.links`` for
    ``account``'s session, valid ``links.ttl`` seconds from ``now`` (required then). The
    event is archived once: a later derivation with other links is dropped by its id.
    """
    entry = _STATES.get(session.state)
    if entry is None:
        return []
    etype, member = entry
    if activity is not None and activity.event_member != member:
        raise ValueError(f"expected a {member} activity, got {activity.event_member}")
    if not entered and (activity is None or not _newer(activity.create_time, seen_until)):
        return []
    key = activity.name if activity is not None else f"state:{session.update_time}"
    # Always RFC 3339, whatever upstream sent (events.webhook_timestamp).
    occurred_at = webhook_timestamp(
        (activity.create_time if activity is not None else "") or session.update_time, now
    )
    data: dict[str, Any] = {
        "session": session_summary(session),
        "activity_name": activity.name if activity is not None else None,
    }
    if etype == SESSION_ACTION_REQUIRED:
        data.update(_action(session, activity))
        if links is not None:
            if now is None:
                raise ValueError("signed links need the time they are made")
            kind: ActionKind = "approve_plan" if data["action"] == ACTION_APPROVE_PLAN else "reply"
            wait = activity.name if activity is not None else ""
            data["links"] = links.links(account, session.name, wait, kind, now)
    elif etype == SESSION_COMPLETED:
        data["outputs"] = _outputs(session, activity)
    else:
        failed = activity.session_failed if activity is not None else None
        data["reason"] = failed.reason if failed is not None else ""
    eid = event_id(etype, session.name, key)
    return [make_event(eid, etype, session.name, None, occurred_at, data)]


def _newer(time: str, than: str) -> bool:
    """Whether upstream time ``time`` is after ``than`` (unreadable or missing: yes, as a
    repeat costs nothing: event ids deduplicate)."""
    try:
        return parse_timestamp(time) > parse_timestamp(than)
    except ValueError:
        return True


def _action(session: Session, activity: Activity | None) -> dict[str, Any]:
    base = f"/v1alpha/{session.name}"
    if session.state == "AWAITING_PLAN_APPROVAL":
        generated = activity.plan_generated if activity is not None else None
        plan: dict[str, Any] | None = None
        if generated is not None:
            plan = {
                "id": generated.plan.id,
                "steps": [
                    {
                        "id": step.id,
                        "index": step.index,
                        "title": step.title,
                        "description": step.description,
                    }
                    for step in generated.plan.steps
                ],
            }
        return {
            "action": ACTION_APPROVE_PLAN,
            "plan": plan,
            "call": {"method": "POST", "path": base + ":approvePlan", "body": {}},
        }
    messaged = activity.agent_messaged if activity is not None else None
    return {
        "action": ACTION_ANSWER,
        "question": messaged.agent_message if messaged is not None else "",
        "call": {
            "method": "POST",
            "path": base + ":sendMessage",
            "body": {"prompt": "<your answer>"},
        },
    }


def _outputs(session: Session, activity: Activity | None) -> dict[str, Any]:
    pull_requests = [{"url": pr.url, "title": pr.title} for pr in session.pull_requests]
    change: ChangeSet | None = None
    for output in session.outputs:
        if output.change_set is not None:
            change = output.change_set  # the last one is the final change set
    if change is None and activity is not None:
        for artifact in activity.artifacts:
            if artifact.change_set is not None:
                change = artifact.change_set
    return {
        "pull_requests": pull_requests,
        "change_set": change_set_summary(change) if change is not None else None,
    }


def change_set_summary(change: ChangeSet) -> dict[str, Any]:
    """Files touched and lines added/removed of a change set's unified diff.

    ``{"source", "base_commit_id", "suggested_commit_message", "files": [{"path", "added",
    "removed"}], "files_changed", "lines_added", "lines_removed"}``; a change set without a
    patch (only a base commit) has no files.
    """
    patch = change.git_patch
    files = diff_stats(patch.unidiff_patch if patch is not None else "")
    return {
        "source": change.source,
        "base_commit_id": patch.base_commit_id if patch is not None else "",
        "suggested_commit_message": patch.suggested_commit_message if patch is not None else "",
        "files": files,
        "files_changed": len(files),
        "lines_added": sum(f["added"] for f in files),
        "lines_removed": sum(f["removed"] for f in files),
    }


def diff_stats(text: str) -> list[dict[str, Any]]:
    """``[{"path", "added", "removed"}]`` per file of a unified diff (``git diff`` or plain).

    Hunk lengths from the ``@@`` headers decide what is content, so a removed line that
    starts with ``-- `` is not taken for a file header.
    """
    files: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    old_left = new_left = 0
    for line in text.splitlines():
        in_hunk = old_left > 0 or new_left > 0
        if current is not None and in_hunk and not line.startswith("diff --git "):
            if line.startswith("+"):
                current["added"] += 1
                new_left -= 1
            elif line.startswith("-"):
                current["removed"] += 1
                old_left -= 1
            elif not line.startswith("\\"):  # "\ No newline at end of file"
                old_left -= 1
                new_left -= 1
            continue
        hunk = _HUNK.match(line)
        if hunk is not None and current is not None:
            old_left = int(hunk.group(1)) if hunk.group(1) is not None else 1
            new_left = int(hunk.group(2)) if hunk.group(2) is not None else 1
            current["hunks"] = True
        elif line.startswith("diff --git "):
            header = _DIFF_GIT.match(line)
            current = {"path": header.group(2) if header else "", "added": 0, "removed": 0}
            files.append(current)
        elif line.startswith("--- "):
            if current is None or current.get("hunks") or current.get("old_seen"):
                current = {"path": "", "added": 0, "removed": 0}
                files.append(current)
            current["old_seen"] = True
            source = line[4:].split("\t")[0].strip()
            if not current["path"] and source != "/dev/null":
                current["path"] = source.removeprefix("a/")
        elif line.startswith("+++ ") and current is not None:
            target = line[4:].split("\t")[0].strip()
            if target != "/dev/null":
                current["path"] = target.removeprefix("b/")
    return [{"path": f["path"], "added": f["added"], "removed": f["removed"]} for f in files]
