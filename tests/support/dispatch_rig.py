"""A store seeded for dispatcher tests: :func:`seed_sessions` archives sessions of
:data:`PER_SESSION` activity events each, queued for delivery; :func:`dispatch_config`
is a config with one endpoint ``rx`` signed with :data:`SECRET`."""

from __future__ import annotations

from pydantic import SecretStr

from sessionhook.api.models import Activity, ProgressUpdated, Session
from sessionhook.relay.config import Config, DeliveryConfig, EndpointConfig
from sessionhook.relay.domain.events import activity_event
from sessionhook.relay.domain.signing import generate_secret
from sessionhook.relay.store import AsyncStore, Ingest

SECRET = generate_secret()
#: How many sessions :func:`seed_sessions` makes by default, and activities in each.
SESSIONS = 4
PER_SESSION = 5


def dispatch_config(
    *,
    delays: tuple[float, ...] = (0.05, 0.05),
    url: str = "http://rx.test/hook",
    allow_private: bool = True,
    disable_after: float = 5 * 86400.0,
    concurrency: int = 8,
) -> Config:
    """A config with one endpoint ``rx`` at ``url`` signed with :data:`SECRET`."""
    endpoint = EndpointConfig(
        name="rx", url=url, secret=SecretStr(SECRET), disable_after=disable_after
    )
    delivery = DeliveryConfig(
        retry_delays=delays,
        timeout=5.0,
        allow_private_networks=allow_private,
        concurrency=concurrency,
    )
    return Config(delivery=delivery, endpoints=(endpoint,))


async def seed_session(store: AsyncStore, session: Session, count: int) -> list[str]:
    """``count`` progress updates of ``session`` (one a second from 10:00 on 2025-05-01)
    archived and queued for delivery; their event ids in order."""
    await store.run(Ingest.upsert_session, session, baseline=False)
    activities = [
        Activity(
            name=f"{session.name}/activities/{j:032x}",
            create_time=f"2025-05-01T10:00:{j:02d}.000000Z",
            progress_updated=ProgressUpdated(title=f"step {j}"),
        )
        for j in range(count)
    ]
    built = [activity_event(session, a, max_media_bytes=1000) for a in activities]
    await store.run(Ingest.ingest_activities, session.name, activities, built, True)
    return [e.id for e in built]


async def seed_sessions(store: AsyncStore, sessions: int = SESSIONS) -> dict[str, list[str]]:
    """Sessions with PER_SESSION activity events each, enqueued; returns ids in order."""
    expected: dict[str, list[str]] = {}
    for i in range(sessions):
        session = Session(name=f"sessions/{1000 + i}", state="IN_PROGRESS", title=f"S{i}")
        expected[session.name] = await seed_session(store, session, PER_SESSION)
    return expected
