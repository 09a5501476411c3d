"""The MCP server's watcher against a real store: a wait that opens between a session's
event and its row taking the event's phase (two replicas on a loaded PostgreSQL: the MCP
replicas' test once timed out on it) is answered once the row has it."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from sessionhook.api.models import Activity, Session
from sessionhook.relay.config import Config
from sessionhook.relay.domain.events import SESSION_ACTION_REQUIRED
from sessionhook.relay.domain.lifecycle import lifecycle_events
from sessionhook.relay.ops import session_views as views
from sessionhook.relay.store import AsyncStore, Ingest, OperatorQueries
from sessionhook.relay.telemetry.metrics import Metrics
from sessionhook.relay.web import WebAuth, WebContext
from sessionhook.relay.web.mcp.watch import Watcher

pytestmark = [pytest.mark.app, pytest.mark.anyio]

NAME = "sessions/77"


async def test_a_wait_opened_before_the_sessions_row_takes_its_phase_is_answered(
    tmp_path: Path,
) -> None:
    store = await AsyncStore.open(tmp_path / "relay.db")
    ctx = WebContext(config=Config, store=lambda: store, metrics=Metrics(), auth=WebAuth("t" * 40))
    read = anyio.Event()  # the watcher announced the session: it read the event

    async def announce(uri: str) -> None:
        if uri == f"sessionhook://sessions/{NAME.removeprefix('sessions/')}":
            read.set()

    watcher = Watcher(ctx, announce, max_waits=10)
    working = Session(name=NAME, state="IN_PROGRESS", title="Fix it")
    waiting = working.model_copy(update={"state": "AWAITING_PLAN_APPROVAL"})
    plan = Activity.model_validate(
        {
            "name": f"{NAME}/activities/" + "a" * 32,
            "createTime": "2025-05-01T11:00:00Z",
            "planGenerated": {"plan": {"id": "p1", "steps": [{"id": "s1", "title": "Do it"}]}},
        }
    )
    (event,) = lifecycle_events(waiting, plan, entered=True, now=0)
    types = frozenset({SESSION_ACTION_REQUIRED})
    try:
        await store.run(Ingest.upsert_session, working, baseline=False)
        async with anyio.create_task_group() as tg:
            tg.start_soon(watcher.run)
            await watcher.ready.wait()
            # The event is archived; the row still says IN_PROGRESS (another replica's
            # poll writes it a moment later).
            await store.run(Ingest.ingest_activities, NAME, [plan], [event], False)
            ctx.bell.ring()
            with anyio.fail_after(10):
                await read.wait()
            # The wait opens now, as the tool opens it: after the event, row not there yet.
            with watcher.waiter(NAME, types) as waiter:
                waiter.start(await store.run(OperatorQueries.last_event_seq))
                _item, now = await store.run(views.already, NAME, types)
                assert now is None
                await store.run(Ingest.upsert_session, waiting, baseline=False)
                ctx.bell.ring()
                with anyio.fail_after(10):
                    await waiter.done.wait()
                assert waiter.found is not None and waiter.found.type == SESSION_ACTION_REQUIRED
            tg.cancel_scope.cancel()
    finally:
        await store.close()
