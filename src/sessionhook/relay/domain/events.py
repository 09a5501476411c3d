"""Activities and session changes become normalized webhook events (pure, no I/O).

An :class:`Event` is built once, at ingest, with its body already serialized: the store keeps
those bytes and every attempt sends exactly them, so a signature or a consumer's
deduplication never sees two spellings of one event. Ids derive from upstream identity only
(:func:`event_id`: the same ``webhook-id`` across retries, restarts and a rebuilt database);
``timestamp`` is the upstream time, always RFC 3339 (:func:`webhook_timestamp`). The ids and
bodies in full: docs/domain.md, "Event ids and bodies".
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Any

from sessionhook.api.models import (
    Activity,
    PullRequest,
    Session,
    format_timestamp,
    parse_timestamp,
)

SESSION_DISCOVERED = "session.discovered"
SESSION_STATE_CHANGED = "session.state_changed"
SESSION_PULL_REQUEST_OPENED = "session.pull_request_opened"
#: The session's ``archived`` flag changed (beyond the interface spec: the real service's).
SESSION_ARCHIVED = "session.archived"
SESSION_UNARCHIVED = "session.unarchived"
#: Derived from the session's state and its archived activities (``lifecycle.py``).
SESSION_ACTION_REQUIRED = "session.action_required"
SESSION_COMPLETED = "session.completed"
SESSION_FAILED = "session.failed"

#: Event type of each known activity member (wire name -> type).
ACTIVITY_EVENT_TYPES: dict[str, str] = {
    "planGenerated": "activity.plan_generated",
    "planApproved": "activity.plan_approved",
    "userMessaged": "activity.user_messaged",
    "agentMessaged": "activity.agent_messaged",
    "progressUpdated": "activity.progress_updated",
    "sessionCompleted": "activity.session_completed",
    "sessionFailed": "activity.session_failed",
}
#: Type of the service's "Session started" notice: a ``system`` activity with no event
#: member (the first activity of every session; its ``description`` says what happened).
ACTIVITY_SESSION_STARTED = "activity.session_started"
#: Type of an activity whose member this version does not know (the API is alpha and
#: grows), or of one with no member that is not the system's notice.
ACTIVITY_UNKNOWN = "activity.unknown"

#: Every event type the relay emits (what ``events = [...]`` globs are matched against).
EVENT_TYPES: tuple[str, ...] = (
    SESSION_DISCOVERED,
    SESSION_STATE_CHANGED,
    SESSION_PULL_REQUEST_OPENED,
    SESSION_ARCHIVED,
    SESSION_UNARCHIVED,
    SESSION_ACTION_REQUIRED,
    SESSION_COMPLETED,
    SESSION_FAILED,
    *ACTIVITY_EVENT_TYPES.values(),
    ACTIVITY_SESSION_STARTED,
    ACTIVITY_UNKNOWN,
)


@dataclass(frozen=True, slots=True)
class Event:
    """One webhook event, ready to store and send.

    ``occurred_at`` is the upstream RFC 3339 time the body carries as ``timestamp``;
    ``occurred_ts`` is the same instant in Unix seconds (for range queries and replay).
    ``body`` is the exact payload every attempt sends.
    """

    id: str
    type: str
    session_name: str
    activity_name: str | None
    occurred_at: str
    occurred_ts: float
    body: bytes

    def payload(self) -> dict[str, Any]:
        """The body parsed back into a dict (for tests and tools)."""
        result: dict[str, Any] = json.loads(self.body)
        return result


# RFC 3339 section 5.6 ``date-time`` (``T``/``t``, fraction, ``Z`` or a numeric offset).
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})$")


def webhook_timestamp(upstream: str, now: float | None = None) -> str:
    """An RFC 3339 ``timestamp`` for a webhook body from an upstream time (pure).

    ``upstream`` is kept byte for byte when it is RFC 3339 and a real instant; one that
    parses but is spelled otherwise is rewritten (UTC, microseconds, ``Z``); anything else
    (empty, ``"garbage"``, month 13) gives ``now`` (Unix seconds; the clock when ``None``).
    """
    return _webhook_time(upstream, now)[0]


def _webhook_time(upstream: str, now: float | None) -> tuple[str, float]:
    """:func:`webhook_timestamp` and the same instant in Unix seconds, from ONE parse."""
    text = upstream.strip()
    if text:
        try:
            instant = parse_timestamp(text)
        except ValueError:
            pass
        else:
            if _RFC3339.match(upstream):
                return upstream, instant.timestamp()
            text = format_timestamp(instant)
            return text, _to_unix(text)
    text = _now_text(now)
    return text, _to_unix(text)


def event_id(kind: str, *parts: str) -> str:
    """``evt_`` + the first 32 hex digits of ``sha256(":".join((kind, *parts)))``."""
    digest = hashlib.sha256(":".join((kind, *parts)).encode("utf-8")).hexdigest()
    return "evt_" + digest[:32]


def matches(globs: Iterable[str], event_type: str) -> bool:
    """Whether any of the ``fnmatch`` globs matches the event type (case-sensitive)."""
    return any(fnmatchcase(event_type, glob) for glob in globs)


def payload_matches(conditions: Mapping[str, Sequence[str]], payload: object) -> bool:
    """Whether ``payload`` meets every condition: ``{dotted path: [globs]}``.

    A path walks dict keys (``data.session.source``) and list indexes (``data.plan.steps.0``);
    a list met with a key fans out to its items. The value found must match one of its
    path's ``fnmatch`` globs (case-sensitive): strings as they are, numbers as JSON,
    ``true``/``false``/``null``; a missing path, an object or a list with no matching item
    never matches. No conditions: always true.
    """
    for path, globs in conditions.items():
        found = _values_at(payload, path.split("."))
        if not any(fnmatchcase(text, glob) for text in found for glob in globs):
            return False
    return True


def _values_at(node: object, keys: list[str]) -> Iterable[str]:
    if not keys:
        if isinstance(node, list):
            for item in node:
                yield from _values_at(item, [])
        elif isinstance(node, str):
            yield node
        elif node is None or isinstance(node, bool | int | float):
            yield json.dumps(node)
        return
    key, rest = keys[0], keys[1:]
    if isinstance(node, dict):
        if key in node:
            yield from _values_at(node[key], rest)
    elif isinstance(node, list):
        if key.isdigit():
            if int(key) < len(node):
                yield from _values_at(node[int(key)], rest)
        else:
            for item in node:
                yield from _values_at(item, keys)


def activity_event_type(activity: Activity) -> str:
    """``activity.<member in snake_case>``; ``activity.session_started`` for a ``system``
    activity with no member at all (neither known nor unknown); else ``activity.unknown``."""
    member = activity.event_member
    if member:
        return ACTIVITY_EVENT_TYPES.get(member, ACTIVITY_UNKNOWN)
    if activity.originator == "system" and not activity.unknown_members:
        return ACTIVITY_SESSION_STARTED
    return ACTIVITY_UNKNOWN


def session_summary(session: Session) -> dict[str, Any]:
    """The ``data.session`` object: identity, state and links of the session.

    Always has ``name, id, title, state, url, source, createTime, updateTime`` (``source`` is
    ``sourceContext.source``, empty for a repoless session); ``prompt`` and ``outputs`` are
    added when the session carries them (a change set output without its diff text).
    """
    summary: dict[str, Any] = {
        "name": session.name,
        "id": session.session_id,
        "title": session.title,
        "state": session.state,
        "url": session.url,
        "source": session.source_context.source if session.source_context else "",
        "createTime": session.create_time,
        "updateTime": session.update_time,
    }
    if session.prompt:
        summary["prompt"] = session.prompt
    if session.outputs:
        summary["outputs"] = [_slim_output(output.to_wire()) for output in session.outputs]
    return summary


def _slim_output(wire: dict[str, Any]) -> dict[str, Any]:
    """An output for ``data.session.outputs``: a change set loses its ``unidiffPatch`` (the
    whole diff would ride on every event of a completed session); ``unidiffPatchBytes``
    says how long it was. ``session.completed`` sums it up, ``activity.session_completed``
    carries it whole."""
    patch = (wire.get("changeSet") or {}).get("gitPatch")
    if isinstance(patch, dict) and "unidiffPatch" in patch:
        text = str(patch.pop("unidiffPatch"))
        patch["unidiffPatchBytes"] = len(text.encode("utf-8"))
    return wire


def activity_event(
    session: Session, activity: Activity, *, max_media_bytes: int, now: float | None = None
) -> Event:
    """The event of one activity: ``data.activity`` is the upstream activity whole.

    Media artifacts whose base64 ``data`` is longer than ``max_media_bytes`` are trimmed in
    the event (``data: ""``, ``trimmed: true``, ``originalSize``: length of the base64 text);
    the archive keeps the activity untouched. ``now`` (Unix seconds) stands in for a missing
    or unreadable ``createTime`` in ``timestamp`` (see :func:`webhook_timestamp`).
    """
    (event,), _raws = archived_page(session, [activity], max_media_bytes=max_media_bytes, now=now)
    return event


def archived_page(
    session: Session,
    activities: Iterable[Activity],
    *,
    max_media_bytes: int,
    now: float | None = None,
    account: str | None = None,
) -> tuple[list[Event], list[bytes]]:
    """The events of a page of activities (:func:`activity_event` of each, with ``data.account``
    when ``account`` is given, as :func:`with_account` adds it) and the raw JSON
    of each activity as the archive keeps it (``activity_raw``: compact, UTF-8 text as it
    is, the keys :meth:`~sessionhook.api.models.WireModel.to_wire` gives), in page order.

    The bytes are exactly those of :func:`make_event` (``json.dumps`` of the whole body),
    but each body is joined from serialized parts: the session summary, the same in every
    event of the page, is serialized once, and ``data.activity`` IS the raw JSON (same
    serializer) unless media had to be trimmed, so each activity is dumped once for both.
    """
    session_json = _dumps(session_summary(session))
    tail = "}}" if account is None else f',"account":{_dumps(account)}}}}}'
    built: list[Event] = []
    raws: list[bytes] = []
    for activity in activities:
        wire = activity.to_wire()
        raw = _dumps(wire)
        shown = _dumps(wire) if _trim_media(wire, max_media_bytes) else raw
        occurred_at, occurred_ts = _webhook_time(activity.create_time, now)
        etype = activity_event_type(activity)
        body = (
            f'{{"type":{_dumps(etype)},"timestamp":{_dumps(occurred_at)},'
            f'"data":{{"session":{session_json},"activity":{shown}{tail}'
        )
        built.append(
            Event(
                id=event_id("activity", activity.name),
                type=etype,
                session_name=session.name,
                activity_name=activity.name,
                occurred_at=occurred_at,
                occurred_ts=occurred_ts,
                body=body.encode("utf-8"),
            )
        )
        raws.append(raw.encode("utf-8"))
    return built, raws


def with_account(event: Event, account: str) -> Event:
    """``event`` with ``data.account`` (which account's session it is about) added as the
    last key of ``data``: the bytes ``json.dumps`` gives for the body with it added, made
    without parsing the body back (it is :func:`make_event`'s, ``data`` last)."""
    body = event.body
    if not body.endswith(b"}}") or body.endswith(b"{}}"):
        payload = json.loads(body)  # not make_event's shape: the slow, general way
        if not isinstance(payload.get("data"), dict):
            return event
        payload["data"]["account"] = account
        return replace(event, body=_dumps(payload).encode("utf-8"))
    extra = f',"account":{_dumps(account)}}}}}'.encode()
    return replace(event, body=body[:-2] + extra)


#: ``json.dumps(value, separators=(",", ":"), ensure_ascii=False)`` without building an
#: encoder per call (a short string: 0.2 us instead of 2.5 us; three per activity event).
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _dumps(value: object) -> str:
    """JSON as every event body is written: compact, UTF-8 text kept as it is."""
    return _ENCODE(value)


def session_discovered(session: Session, *, now: float | None = None) -> Event:
    """``session.discovered``: the relay saw the session for the first time. Its time is
    the session's ``createTime`` (else its ``updateTime``): it comes before the session's
    activities in the archive, and its time is not later than theirs. Its id is
    :func:`discovered_id`."""
    return _session_event(SESSION_DISCOVERED, session, (), now, at=session.create_time)


def discovered_id(session_name: str) -> str:
    """The id of the session's ``session.discovered`` (one per session)."""
    return event_id(SESSION_DISCOVERED, session_name)


def archived_changed(session: Session, *, now: float | None = None) -> Event:
    """``session.archived`` (or ``session.unarchived``): the session's ``archived`` flag is
    now what ``session`` says, unlike the copy the relay saw before."""
    kind = SESSION_ARCHIVED if session.archived else SESSION_UNARCHIVED
    return make_event(
        event_id(kind, session.name, session.update_time),
        kind,
        session.name,
        None,
        webhook_timestamp(session.update_time, now),
        {"session": session_summary(session)},
    )


def session_state_changed(
    session: Session, previous_state: str, *, now: float | None = None
) -> Event:
    """``session.state_changed`` from ``previous_state`` to ``session.state``."""
    ids = (session.update_time, session.state)
    return _session_event(SESSION_STATE_CHANGED, session, ids, now, previous_state=previous_state)


def pull_request_opened(session: Session, pr: PullRequest, *, now: float | None = None) -> Event:
    """``session.pull_request_opened``: a pull request appeared in the session's outputs."""
    return _session_event(
        SESSION_PULL_REQUEST_OPENED, session, (pr.url,), now, pull_request=pr.to_wire()
    )


def _session_event(
    kind: str,
    session: Session,
    ids: tuple[str, ...],
    now: float | None,
    *,
    at: str | None = None,
    **data: Any,
) -> Event:
    """A session event: its id from ``kind``, the session's name and ``ids``; its time
    ``at`` if given, else the session's ``updateTime``; ``data`` after ``data.session``."""
    return make_event(
        event_id(kind, session.name, *ids),
        kind,
        session.name,
        None,
        webhook_timestamp(at or session.update_time, now),
        {"session": session_summary(session), **data},
    )


def make_event(
    eid: str,
    etype: str,
    session_name: str,
    activity_name: str | None,
    occurred_at: str,
    data: dict[str, Any],
) -> Event:
    """An :class:`Event` whose body is ``{"type", "timestamp", "data"}``, serialized once."""
    body = _dumps({"type": etype, "timestamp": occurred_at, "data": data}).encode("utf-8")
    return Event(
        id=eid,
        type=etype,
        session_name=session_name,
        activity_name=activity_name,
        occurred_at=occurred_at,
        occurred_ts=_to_unix(occurred_at),
        body=body,
    )


def _now_text(now: float | None) -> str:
    return format_timestamp(datetime.fromtimestamp(time.time() if now is None else now, UTC))


def _to_unix(text: str) -> float:
    try:
        return parse_timestamp(text).timestamp()
    except ValueError:
        # An unparsable upstream time still yields an event; it sorts at the epoch.
        return 0.0


def _trim_media(wire: dict[str, Any], limit: int) -> bool:
    """Trim, in place, the media of ``wire`` whose base64 is longer than ``limit``;
    whether any was (``wire`` is a fresh ``to_wire()``: the Activity stays intact)."""
    trimmed = False
    for artifact in wire.get("artifacts") or ():
        media = artifact.get("media") if isinstance(artifact, dict) else None
        if not isinstance(media, dict):
            continue
        size = len(str(media.get("data", "")).encode("utf-8"))
        if size > limit:
            media["data"] = ""
            media["trimmed"] = True
            media["originalSize"] = size
            trimmed = True
    return trimmed
