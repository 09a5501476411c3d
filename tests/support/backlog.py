"""A backlog of deliveries for outbox, replica and benchmark tests: :func:`fill` queues every
event of ``sessions`` x ``per_session`` activities (one a second from 10:00 on 2025-03-01)
for the store's endpoints; :func:`ok` is a delivered attempt's result."""

from __future__ import annotations

from sessionhook.api.models import Activity, Session
from sessionhook.relay.domain.retry import AttemptResult
from sessionhook.relay.store import Store
from tests.support import store_rows
from tests.support.clock import T0


def session(n: int, prompt: str = "Fix the flaky test") -> Session:
    """Session ``n`` of :mod:`store_rows`, with a prompt."""
    return store_rows.session(n, prompt=prompt)


def activity(n: int, i: int, text: str | None = None) -> Activity:
    """Activity ``i`` of session ``n``: a progress update at 10:00 plus ``i`` seconds."""
    return Activity.model_validate(
        {
            "name": f"sessions/{n}/activities/{i:032x}",
            "id": f"{i:032x}",
            "originator": "agent",
            "createTime": f"2025-03-01T10:{i // 60 % 60:02d}:{i % 60:02d}.000000Z",
            "progressUpdated": {"title": text if text is not None else f"step {i}"},
        }
    )


def fill(store: Store, sessions: int, per_session: int, *, deliver: bool = True) -> None:
    """Archive the backlog (queued for every endpoint when ``deliver``)."""
    for n in range(sessions):
        s = session(n)
        store.ingest.upsert_session(s, baseline=False)
        acts = [activity(n, i) for i in range(per_session)]
        store.ingest.ingest_activities(s.name, acts, store_rows.built(s, acts), deliver)


def ok(at: float = T0) -> AttemptResult:
    """A 204 after 2 ms, at ``at``."""
    return AttemptResult(204, None, 2.0, "", None, at)
