"""Small rows for store tests: an endpoint (:class:`Ep`), sessions and activities as the
API client parses them, their events built and ingested, a store made ready for
deliveries (:func:`ready`). One activity a minute from 10:00 on 2025-03-01 (``minute``
picks another)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sessionhook.api.models import Activity, Session
from sessionhook.relay.domain import events
from sessionhook.relay.domain.events import Event
from sessionhook.relay.store import Store


@dataclass(frozen=True)
class Ep:
    """The smallest thing ``sync_endpoints`` accepts."""

    name: str
    url: str = "https://hooks.example.com/x"
    events: tuple[str, ...] = ("*",)
    enabled: bool = True


def session(n: int, **fields: Any) -> Session:
    raw: dict[str, Any] = {
        "name": f"sessions/{n}",
        "id": str(n),
        "title": f"Session {n}",
        "state": "IN_PROGRESS",
        "url": f"https://agent.example.com/s/{n}",
        "createTime": "2025-03-01T10:00:00Z",
        "updateTime": "2025-03-01T10:00:00Z",
        "sourceContext": {"source": "sources/github/acme/widgets"},
        **fields,
    }
    return Session.model_validate(raw)


def activity(n: int, i: int, minute: int | None = None, **member: Any) -> Activity:
    create = f"2025-03-01T10:{(i if minute is None else minute):02d}:00.000000Z"
    return Activity.model_validate(
        {
            "name": f"sessions/{n}/activities/{i:032x}",
            "id": f"{i:032x}",
            "originator": "agent",
            "createTime": create,
            **(member or {"progressUpdated": {"title": f"step {i}"}}),
        }
    )


def built(s: Session, acts: list[Activity]) -> list[Event]:
    return [events.activity_event(s, a, max_media_bytes=1000) for a in acts]


def ingest(store: Store, s: Session, acts: list[Activity], deliver: bool = True) -> int:
    return store.ingest.ingest_activities(s.name, acts, built(s, acts), deliver).activities


def ready(store: Store, *endpoints: Ep, sessions: int = 1) -> list[Session]:
    store.endpoints.sync_endpoints(list(endpoints) or [Ep("a")])
    made = [session(n) for n in range(1, sessions + 1)]
    for s in made:
        store.ingest.upsert_session(s, baseline=False)
    return made
