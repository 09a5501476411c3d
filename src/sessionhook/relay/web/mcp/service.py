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

import anyio.to_thread
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from ..answers import error_response
from ..context import WebContext

if TYPE_CHECKING:
    from .server import McpServer

#: The path of the MCP endpoint.
MCP_PATH: Final = "/mcp"
_SERVER_MODULE: Final = "sessionhook.relay.web.mcp.server"


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
        await server.serve(scope, receive, send)
