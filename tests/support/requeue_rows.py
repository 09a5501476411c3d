"""Rows for the retry/recover and management API tests: sessions with events
and their deliveries, failed attempts (the store's own ingest and outbox write them)."""

from __future__ import annotations

from sessionhook.api.models import Activity, Session
from sessionhook.relay.domain import events
from sessionhook.relay.domain.retry import AttemptResult
from sessionhook.relay.store import StoreCore
from tests.support.store_rows import Ep

__all__ = ["ACT0", "Ep", "failure", "fill", "session"]

#: 2025-03-01T10:00:00Z: the upstream time of each session's first activity (activity i
#: happened i seconds later).
ACT0 = 1_740_823_200.0


def session(n: int, state: str = "IN_PROGRESS") -> Session:
    """``sessions/s<n>``."""
    return Session.model_validate(
        {
            "name": f"sessions/s{n}",
            "id": f"s{n}",
            "title": f"Session {n}",
            "state": state,
            "createTime": "2025-03-01T10:00:00Z",
            "updateTime": "2025-03-01T10:00:00Z",
        }
    )


def fill(store: StoreCore, sessions: int, per_session: int, *, discovered: bool = False) -> None:
    """``sessions`` sessions of ``per_session`` activities each (and a ``session.discovered``
    first with ``discovered``), archived and queued for every subscribed endpoint."""
    for n in range(sessions):
        s = session(n)
        store.ingest.upsert_session(s, baseline=False)
        if discovered:
            store.ingest.ingest_session_events(s.name, [events.session_discovered(s)], True)
        acts = [
            Activity.model_validate(
                {
                    "name": f"{s.name}/activities/{i:032x}",
                    "id": f"{i:032x}",
                    "originator": "agent",
                    "createTime": f"2025-03-01T10:00:{i:02d}.000000Z",
                    "progressUpdated": {"title": f"step {i}"},
                }
            )
            for i in range(per_session)
        ]
        evs = [events.activity_event(s, a, max_media_bytes=1000) for a in acts]
        store.ingest.ingest_activities(s.name, acts, evs, True)


def failure(at: float, status: int | None = 500) -> AttemptResult:
    """A failed attempt started at ``at``: ``status`` (``None``: no answer)."""
    error = "connection refused" if status is None else None
    return AttemptResult(status, error, 1.0, "down", None, at)
