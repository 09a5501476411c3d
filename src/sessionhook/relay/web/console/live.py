"""The console's live feed: ``GET /console/live`` (Server-Sent Events).

Each message is ``id: <seq>``, ``event: event`` and a small JSON ``data`` (no body). The
stream starts after ``?after=SEQ`` or the ``Last-Event-ID`` of a reconnect, so nothing is
missed or repeated; ``?session=NAME`` keeps one session. It wakes on the daemon's bell and
reads the store at least every ``live_interval`` seconds, 100 events at most a read; it
ends after ``live_duration`` seconds or when the server stops, and past
``live_max_streams`` the answer is a 503.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Final

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ...store import ConsoleQueries, OperatorQueries, store_failures
from ...telemetry.logs import get_logger
from ..headers import SECURITY_HEADERS
from ..listener import server_closing
from .common import ConsoleDeps
from .text import BadNumber, query_text, url_int

_HEARTBEAT: Final = 15.0
_log = get_logger()


def _start(request: Request) -> int | None:
    """Where the feed starts; :class:`BadNumber` for a position no store holds."""
    for name, raw in (
        ("Last-Event-ID", request.headers.get("last-event-id")),
        ("after", request.query_params.get("after")),
    ):
        position = url_int(raw, name)
        if position is not None:
            return position
    return None


async def _first(*events: anyio.Event) -> None:
    """Wait until one of ``events`` is set."""
    async with anyio.create_task_group() as tg:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.start_soon(wait, event)


def live_route(deps: ConsoleDeps) -> Route:
    """The ``/console/live`` route (see the module docstring)."""
    open_streams = 0

    async def live(request: Request) -> Response:
        nonlocal open_streams
        store = deps.store()
        if store is None or open_streams >= deps.live_max_streams:
            return Response(
                "retry: 5000\n\n",
                status_code=503,
                media_type="text/event-stream",
                headers=SECURITY_HEADERS,
            )
        session = query_text(request.query_params.get("session")) or None
        try:
            start = _start(request)
        except BadNumber as exc:
            return Response(str(exc), status_code=400, headers=SECURITY_HEADERS)
        after: int = start if start is not None else await store.run(OperatorQueries.last_event_seq)

        closing = server_closing(request.scope)

        async def stream() -> AsyncIterator[str]:
            nonlocal open_streams, after
            open_streams += 1
            try:
                yield "retry: 2000\n\n"
                clock = anyio.current_time
                deadline = clock() + deps.live_duration
                quiet_since = clock()
                while clock() < deadline and not closing.is_set():
                    rung = deps.bell.current()  # taken before reading: no ring is missed
                    current = deps.store()
                    if current is None:
                        return
                    try:
                        rows = await current.run(
                            ConsoleQueries.console_events_after, after, session=session, limit=100
                        )
                    except store_failures() as exc:
                        _log.warning("console.live_read_failed", error=str(exc))
                        return
                    for row in rows:
                        data = {
                            "seq": row.seq,
                            "id": row.id,
                            "session": row.session_name,
                            "type": row.type,
                            "occurred_at": row.occurred_at,
                            # A new row of the session list is filled in with these.
                            "title": row.title,
                            "state": row.state,
                            "source": row.source,
                            "account": row.account,
                        }
                        yield f"id: {row.seq}\nevent: event\ndata: {json.dumps(data)}\n\n"
                        after = row.seq
                    if rows:
                        quiet_since = clock()
                    elif clock() - quiet_since >= _HEARTBEAT:
                        quiet_since = clock()
                        yield ": keep-alive\n\n"
                    if len(rows) < 100:
                        # Woken by the daemon's bell on ingest, else after the interval
                        # (other writers, e.g. replicas on a shared database), and at once
                        # when the server stops.
                        with anyio.move_on_after(deps.live_interval):
                            await _first(rung, closing)
            finally:
                open_streams -= 1

        headers = {**SECURITY_HEADERS, "X-Accel-Buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    return Route("/console/live", live, methods=["GET"])
