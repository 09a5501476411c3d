"""``/mcp`` in the app: :class:`McpService`, the route and what runs beside it.

The route is behind :class:`~..auth.AuthMiddleware` like every API route (no token: a 401
in the API's error shape before the MCP SDK sees anything). The SDK is heavy to import
(seconds on a busy machine, and it loads ``cryptography``), so the server itself
(:class:`.server.McpServer`) is imported and built when the listener starts serving
(:meth:`McpService.running`, one of ``app.state.services``), off the event loop, never
when the web layer is imported or the app built; until then ``/mcp`` answers 503.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Final

import anyio
import anyio.to_thread
from starlette.routing import BaseRoute, Route
from starlette.types import Message, Receive, Scope, Send

from ..answers import error_response
from ..auth import read_body, replay_body
from ..context import WebContext
from ..listener import server_closing

if TYPE_CHECKING:
    from .server import McpServer

#: The path of the MCP endpoint.
MCP_PATH: Final = "/mcp"
_SERVER_MODULE: Final = "sessionhook.relay.web.mcp.server"
#: The largest request body ``/mcp`` reads (a JSON-RPC message: a tool call with a prompt);
#: a larger one is a 413 before the SDK sees it.
MAX_BODY_BYTES: Final = 1024 * 1024
#: Seconds the open waits and streams have to end when the listener stops (within its own
#: grace, listener.CLOSING_GRACE).
CLOSE_GRACE: Final = 0.5


class McpService:
    """The ``/mcp`` route (an ASGI app: every method) and its server while serving."""

    def __init__(self, ctx: WebContext) -> None:
        self._ctx = ctx
        #: The server while the listener serves (``None`` before and after).
        self.server: McpServer | None = None

    def routes(self) -> list[BaseRoute]:
        """The ``/mcp`` route."""
        # An object, not a function: Starlette routes a function to GET and HEAD only.
        return [Route(MCP_PATH, endpoint=self)]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Import and build the server, and run it until the block ends."""
        module = await anyio.to_thread.run_sync(importlib.import_module, _SERVER_MODULE)
        server: McpServer = module.McpServer(self._ctx)
        async with server.running():
            self.server = server
            try:
                yield
            finally:
                self.server = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = self.server
        if server is None:
            answer = error_response(503, "the MCP server is starting", {"retry-after": "5"})
            await answer(scope, receive, send)
            return
        if scope["method"] == "POST":
            body = await read_body(receive, MAX_BODY_BYTES)
            if body is None:
                too_large = error_response(413, f"the body is larger than {MAX_BODY_BYTES} bytes")
                await too_large(scope, receive, send)
                return
            receive = replay_body(body, receive)
        answer_state = _Answer(send)
        async with anyio.create_task_group() as tg:

            async def end_when_closing() -> None:
                # The listener stops: waits answer so and listen streams end, then what is
                # still open is ended here, within the listener's grace (never a request
                # uvicorn must cancel, with a traceback).
                await server_closing(scope).wait()
                server.close()
                await anyio.sleep(CLOSE_GRACE)
                tg.cancel_scope.cancel()

            tg.start_soon(end_when_closing)
            await server.serve(scope, receive, answer_state.send)
            tg.cancel_scope.cancel()
        await answer_state.finish(scope, receive)


class _Answer:
    """Follows what an answer sent, to end it properly when the server stops mid-way."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.ended = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.ended = True
        await self._send(message)

    async def finish(self, scope: Scope, receive: Receive) -> None:
        """End an answer that was cut: its last chunk, or a 503 when none was started."""
        if self.ended:
            return
        with anyio.move_on_after(CLOSE_GRACE), contextlib.suppress(OSError):
            if self.started:
                await self._send({"type": "http.response.body", "body": b"", "more_body": False})
            else:
                stopping = error_response(503, "the relay is stopping", {"retry-after": "5"})
                await stopping(scope, receive, self._send)
