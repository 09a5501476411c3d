"""``GET /v1/events/stream``: the archived events as Server-Sent Events, live, resumable.

One SSE message per event (``id`` = webhook-id, ``event`` = type, ``data`` = the body a
default webhook gets); filters ``type=GLOB`` (repeatable) and ``session=``; docs/stream.md
is the reference. Without a position the stream starts at the newest event;
``Last-Event-ID`` (or ``?last_event_id=``) resumes right after that event, and an unknown id
is a 400. New events arrive when the :class:`.bell.Bell` rings, and within
:data:`POLL_SECONDS` in any case; a comment every :data:`HEARTBEAT_SECONDS` keeps proxies
from closing an idle stream.

Bounded by bytes: at most :data:`BATCH` events and :data:`PAGE_BYTES` of bodies are read at a
time, written in pieces of at most :data:`WRITE_BYTES`, and a consumer that takes nothing for
:data:`SEND_TIMEOUT` seconds is dropped (``stream.stalled``). A server stop or a failed
store read ends the body properly; past ``server.max_streams`` the answer is a 503.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Final

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import Receive, Scope, Send

from ..domain.rows import EventRow
from ..ops import EventFilter, Follower, OperatorError, resume_position
from ..store import StoreError, store_failures
from ..telemetry.logs import get_logger
from .answers import api_route, error_response
from .auth import client_address
from .context import WebContext
from .listener import server_closing

#: Events read from the store per query, at most.
BATCH: Final = 100
#: Bytes of event bodies read from the store per query, at most (one event at least).
PAGE_BYTES: Final = 256 * 1024
#: Bytes handed to the transport per write, at most.
WRITE_BYTES: Final = 64 * 1024
#: The store is read at least this often (events archived by another process).
POLL_SECONDS: Final = 1.0
#: An idle stream gets a comment line this often.
HEARTBEAT_SECONDS: Final = 15.0
#: A write the consumer has not taken within this many seconds ends the stream.
SEND_TIMEOUT: Final = 30.0
#: The browser's EventSource waits this long before reconnecting (the ``retry:`` field).
RETRY_MS: Final = 2000
_MAX_GLOBS: Final = 32
_MAX_PARAM: Final = 512

_log = get_logger()


def message_pieces(row: EventRow) -> Iterator[bytes]:
    """One SSE message (``id``, ``event``, ``data`` lines) in pieces of at most
    :data:`WRITE_BYTES`, made as they are written: a big body is never copied whole."""
    head = f"id: {row.id}\nevent: {row.type}\ndata: ".encode()
    body = row.body
    if len(body) <= WRITE_BYTES:  # the usual event: one piece, if its lines allow
        message = b"".join((head, body.replace(b"\n", b"\ndata: "), b"\n\n"))
        if len(message) <= WRITE_BYTES:
            yield message
            return
    yield head
    for start in range(0, len(body), WRITE_BYTES):
        piece = body[start : start + WRITE_BYTES].replace(b"\n", b"\ndata: ")
        for at in range(0, len(piece), WRITE_BYTES):  # more than one: lines made it grow
            yield piece[at : at + WRITE_BYTES]
    yield b"\n\n"


class _BadRequest(Exception):
    pass


def _filter_of(request: Request) -> EventFilter:
    types = tuple(request.query_params.getlist("type"))
    session = request.query_params.get("session") or None
    if len(types) > _MAX_GLOBS:
        raise _BadRequest(f"at most {_MAX_GLOBS} type= filters")
    if any(not t or len(t) > _MAX_PARAM for t in types):
        raise _BadRequest(f"type: a filter must be 1 to {_MAX_PARAM} characters")
    if len(session or "") > _MAX_PARAM:
        raise _BadRequest(f"session: a filter must be 1 to {_MAX_PARAM} characters")
    return EventFilter(types, session)


def _resume_of(request: Request) -> str | None:
    """The event to resume after: ``Last-Event-ID`` (which wins) or ``?last_event_id=``."""
    for name, value in (
        ("Last-Event-ID", request.headers.get("last-event-id")),
        ("last_event_id", request.query_params.get("last_event_id")),
    ):
        if value:
            if len(value) > _MAX_PARAM:
                raise _BadRequest(f"{name} is longer than {_MAX_PARAM} characters")
            return value
    return None


def stream_routes(ctx: WebContext) -> Sequence[BaseRoute]:
    """The stream's route; the count of open streams lives in this closure."""
    open_streams = 0

    async def stream(request: Request) -> Response:
        nonlocal open_streams
        server = ctx.config().server
        limit = server.max_streams if server is not None else 1
        try:
            wanted = _filter_of(request)
            resume = _resume_of(request)
        except _BadRequest as exc:
            return error_response(400, str(exc))
        astore = ctx.store()
        if astore is None:
            return error_response(503, "the store is not open yet", {"retry-after": "2"})
        try:
            start = await astore.run(resume_position, resume)
        except OperatorError as exc:
            return error_response(400, str(exc))
        except StoreError as exc:
            return error_response(503, f"store: {exc}", {"retry-after": "5"})
        if open_streams >= limit:
            _log.warning("stream.refused", client=client_address(request.scope), open=open_streams)
            return error_response(
                503, f"too many event streams (server.max_streams = {limit})", {"retry-after": "5"}
            )
        open_streams += 1
        ctx.metrics.event_streams.set(open_streams)
        return _EventStream(ctx, wanted, start, release)

    def release() -> None:
        nonlocal open_streams
        open_streams -= 1
        ctx.metrics.event_streams.set(open_streams)

    return [api_route("streamEvents", stream)]


class _EventStream(Response):
    """The streaming answer; see the module docstring."""

    def __init__(
        self, ctx: WebContext, wanted: EventFilter, start: int, release: Callable[[], None]
    ) -> None:
        super().__init__(
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )
        # No Content-Length: the body never ends (chunked).
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self._ctx = ctx
        self._wanted = wanted
        self._cursor = start
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = client_address(scope)
        _log.info(
            "stream.opened",
            client=client,
            types=list(self._wanted.types) or None,
            session=self._wanted.session,
            after=self._cursor,
        )
        self._sent = 0
        self._started = False
        # End the body properly (the last chunk) when the store fails or the server stops:
        # the consumer sees the stream end and reconnects with Last-Event-ID (nothing is
        # lost), rather than a broken response.
        ending = False
        closing = server_closing(scope)
        try:
            async with anyio.create_task_group() as tg:

                async def watch_disconnect() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()

                async def watch_closing() -> None:
                    nonlocal ending
                    await closing.wait()
                    ending = True
                    tg.cancel_scope.cancel()

                tg.start_soon(watch_disconnect)
                tg.start_soon(watch_closing)
                try:
                    await self._pump(send)
                except TimeoutError:
                    _log.warning("stream.stalled", client=client, after=self._cursor)
                except store_failures() as exc:
                    _log.warning("stream.failed", client=client, error=str(exc))
                    ending = True
                finally:
                    tg.cancel_scope.cancel()
            if ending and self._started:
                # A consumer that takes nothing more is cut by the server when it stops
                # (its listener), or by this bound otherwise.
                with anyio.move_on_after(SEND_TIMEOUT), contextlib.suppress(OSError):
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self._release()
            _log.info("stream.closed", client=client, sent=self._sent, last_seq=self._cursor)

    async def _send(self, send: Send, chunk: bytes) -> None:
        with anyio.fail_after(SEND_TIMEOUT):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def _write(self, send: Send, events: Sequence[EventRow]) -> None:
        """``events`` in writes of at most :data:`WRITE_BYTES` (small ones together)."""
        pending: list[bytes] = []
        size = 0
        for row in events:
            for piece in message_pieces(row):
                if pending and size + len(piece) > WRITE_BYTES:
                    await self._send(send, b"".join(pending))
                    pending, size = [], 0
                pending.append(piece)
                size += len(piece)
        if pending:
            await self._send(send, b"".join(pending))

    async def _pump(self, send: Send) -> None:
        with anyio.fail_after(SEND_TIMEOUT):
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        self._started = True
        await self._send(send, f"retry: {RETRY_MS}\n: connected\n\n".encode())
        idle_since = anyio.current_time()
        ctx = self._ctx
        follower = Follower(self._cursor, self._wanted)
        while True:
            # Taken before reading: a ring during the read is not missed.
            rang = ctx.bell.current()
            astore = ctx.store()
            if astore is not None:
                page = await astore.run(follower.read, limit=BATCH, max_bytes=PAGE_BYTES)
                if page.events:
                    # The socket's flow control holds the next read back.
                    await self._write(send, page.events)
                    self._sent += len(page.events)
                    idle_since = anyio.current_time()
                self._cursor = page.cursor
                if page.more:
                    continue  # more behind: read on before waiting
            if anyio.current_time() - idle_since >= HEARTBEAT_SECONDS:
                await self._send(send, b": keep-alive\n\n")
                idle_since = anyio.current_time()
            with anyio.move_on_after(POLL_SECONDS):
                await rang.wait()
