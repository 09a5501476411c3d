"""The archive as the MCP tools show it (runs in the store's thread): sessions by phase,
one session with what it waits for and its last events, and the events a wait answers.

Every upstream text in these answers goes through :func:`~..domain.agent_text.agent_text`
(cleaned, bounded); the shapes are the management API's models
(:mod:`..domain.api_models`: ``ApiSessionItem``, ``ApiSessionView``...).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from ..domain.agent_text import PHASE_STATES, Phase, agent_text, event_summary, phase_of
from ..domain.api_models import (
    ApiEventLine,
    ApiSessionItem,
    ApiSessionList,
    ApiSessionView,
    ApiWait,
)
from ..domain.events import (
    EVENT_TYPES,
    SESSION_ACTION_REQUIRED,
    SESSION_COMPLETED,
    SESSION_FAILED,
)
from ..domain.rows import EventRow, SessionRow
from ..store import StoreCore
from .errors import OperatorError

#: Events shown with one session.
LAST_EVENTS: Final = 20
#: The most sessions one list shows.
MAX_LIST: Final = 200
#: ``until``'s short names (``wait_for_session``) and the event type each stands for.
UNTIL_NAMES: Final[dict[str, str]] = {
    "action_required": SESSION_ACTION_REQUIRED,
    "completed": SESSION_COMPLETED,
    "failed": SESSION_FAILED,
}
#: The event that says a session already is in a phase (a wait answers it at once).
_PHASE_EVENTS: Final[dict[str, str]] = {
    "waiting": SESSION_ACTION_REQUIRED,
    "done": SESSION_COMPLETED,
    "failed": SESSION_FAILED,
}


def until_types(until: Iterable[str]) -> frozenset[str]:
    """The event types ``until`` names (short names or event types); a
    :class:`OperatorError` naming the first that is neither."""
    types: set[str] = set()
    for name in until:
        if name in UNTIL_NAMES:
            types.add(UNTIL_NAMES[name])
        elif name in EVENT_TYPES:
            types.add(name)
        else:
            shown = agent_text(name, 60)
            raise OperatorError(
                f"until: {shown!r} is neither one of {', '.join(UNTIL_NAMES)} nor an event type"
            )
    return frozenset(types)


def wait_of(store: StoreCore, row: SessionRow) -> ApiWait | None:
    """What the archived session ``row`` waits for (``None``: nothing, or its activity is
    not archived yet)."""
    if row.state == "AWAITING_PLAN_APPROVAL":
        activity = store.ingest.latest_activity(row.name, "planGenerated")
        if activity is None or activity.plan_generated is None:
            return None
        steps = activity.plan_generated.plan.steps[:100]
        return ApiWait(
            kind="plan_approval",
            activity=activity.name,
            plan_steps=[agent_text(step.title or step.description) for step in steps],
            question=None,
        )
    if row.state == "AWAITING_USER_FEEDBACK":
        activity = store.ingest.latest_activity(row.name, "agentMessaged")
        if activity is None or activity.agent_messaged is None:
            return None
        return ApiWait(
            kind="question",
            activity=activity.name,
            plan_steps=None,
            question=agent_text(activity.agent_messaged.agent_message),
        )
    return None


def session_item(store: StoreCore, row: SessionRow) -> ApiSessionItem:
    """The session ``row`` as the tools show it."""
    return ApiSessionItem(
        session=row.name,
        id=row.id,
        title=agent_text(row.title),
        state=agent_text(row.state, 64),
        phase=phase_of(row.state),
        url=agent_text(row.url, 2000),
        updated=agent_text(row.update_time, 64),
        waiting_for=wait_of(store, row),
    )


def list_phase(store: StoreCore, phase: Phase | None, limit: int) -> ApiSessionList:
    """Sessions of ``phase`` (``None``: all), the latest update first, ``limit`` at most."""
    limit = max(1, min(limit, MAX_LIST))
    if phase is None:
        rows = store.operator.recent_sessions(limit)
    elif phase == "working":
        others = [state for states in PHASE_STATES.values() for state in states]
        rows = store.operator.recent_sessions(limit, other_than=others)
    else:
        rows = store.operator.recent_sessions(limit, states=PHASE_STATES[phase])
    return ApiSessionList(sessions=[session_item(store, row) for row in rows])


def waiting_names(store: StoreCore) -> frozenset[str]:
    """The names of the sessions waiting for the user (the ``waiting`` resource's set)."""
    rows = store.operator.recent_sessions(MAX_LIST, states=PHASE_STATES["waiting"])
    return frozenset(row.name for row in rows)


def event_line(row: EventRow) -> ApiEventLine:
    """An archived event in one line."""
    return ApiEventLine(
        id=row.id,
        type=row.type,
        time=agent_text(row.occurred_at, 64),
        summary=event_summary(row.type, row.payload()),
    )


def _pull_request(row: SessionRow) -> str | None:
    for output in row.to_session().outputs:
        if output.pull_request is not None and output.pull_request.url:
            return agent_text(output.pull_request.url, 2000)
    return None


def session_view(store: StoreCore, name: str) -> ApiSessionView:
    """The session ``name``, its pull request and its last :data:`LAST_EVENTS` events; an
    :class:`OperatorError` when it is not archived."""
    row = store.operator.get_session(name)
    if row is None:
        raise OperatorError(f"no session {name} in the archive")
    events = store.operator.last_events(name, LAST_EVENTS)
    return ApiSessionView(
        session=session_item(store, row),
        pull_request_url=_pull_request(row),
        events=[event_line(e) for e in events],
    )


def already(
    store: StoreCore, name: str, types: frozenset[str]
) -> tuple[ApiSessionItem, ApiEventLine | None]:
    """The session ``name`` now, and the event of the phase it is in when that event is one
    of ``types`` (what a wait answers at once); an :class:`OperatorError` when the session
    is not archived."""
    row = store.operator.get_session(name)
    if row is None:
        raise OperatorError(f"no session {name} in the archive")
    item = session_item(store, row)
    found = _phase_event(store, item, types)
    return item, event_line(found) if found is not None else None


def phase_event(store: StoreCore, name: str, types: frozenset[str]) -> EventRow | None:
    """The event of the phase session ``name`` is in now when it is one of ``types``
    (``None`` too when the session is not archived): a wait opened before the session's
    row took its new state learns it from here."""
    row = store.operator.get_session(name)
    return None if row is None else _phase_event(store, session_item(store, row), types)


def _phase_event(store: StoreCore, item: ApiSessionItem, types: frozenset[str]) -> EventRow | None:
    wanted = _PHASE_EVENTS.get(item.phase)
    if wanted is None or wanted not in types:
        return None
    found = store.operator.last_events(item.session, 1, types=[wanted])
    return found[-1] if found else None


def answer_of(store: StoreCore, event: EventRow) -> tuple[ApiSessionItem | None, ApiEventLine]:
    """A wait's answer: the session now and the event that ended the wait."""
    row = store.operator.get_session(event.session_name)
    return (None if row is None else session_item(store, row)), event_line(event)


def matching(events: Sequence[EventRow], name: str, types: frozenset[str]) -> EventRow | None:
    """The first of ``events`` about session ``name`` whose type is one of ``types`` (pure)."""
    return next((e for e in events if e.session_name == name and e.type in types), None)
