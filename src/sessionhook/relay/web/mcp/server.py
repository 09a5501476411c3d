"""``/mcp``: the MCP server on ``[server] listen`` (Streamable HTTP), built on the official
SDK's low-level :class:`mcp.server.Server` and its session manager, which serve both
protocol revisions in use: 2026-07-28 (stateless requests, ``server/discover``,
``subscriptions/listen``) and 2025-11-25 (``initialize``, sessions, ``resources/subscribe``).

:class:`McpServer` holds the SDK's server, the tools (:mod:`.tools`), the resources
(``sessionhook://sessions/{id}``, ``sessionhook://sessions/waiting``) and the
:class:`~.watch.Watcher` that wakes waits and announces changed resources: to
``subscriptions/listen`` streams through the SDK's subscription bus, to 2025-11-25
sessions that subscribed on their standalone stream. :meth:`McpServer.running` runs the
session manager and the watcher for as long as the listener serves. It is built by
:class:`.service.McpService` when the listener starts: the SDK (and what it loads) is
imported then, not with the web layer.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.session import ServerSession
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError
from starlette.types import Receive, Scope, Send

from sessionhook import __version__

from ...domain.agent_text import PROVENANCE
from ...domain.api_models import ApiModel
from ...ops import OperatorError
from ...ops import session_views as views
from ...telemetry.logs import get_logger
from ..auth import client_address
from ..context import WebContext
from .tools import DESCRIPTIONS, ToolProblem, Tools, ToolSpec, tool_specs
from .watch import SESSION_URI, WAITING_URI, Watcher

_log = get_logger()

#: Seconds a notification to one 2025-11-25 session may take before it is given up.
NOTIFY_TIMEOUT: Final = 1.0
#: Seconds a 2025-11-25 session lives with no request in flight (the SDK then ends it, and
#: its subscriptions are forgotten here).
SESSION_IDLE: Final = 30 * 60.0
_JSON: Final = "application/json"
_SESSION_HEADER: Final = b"mcp-session-id"
INSTRUCTIONS: Final = (
    "sessionhook relays coding-agent sessions: list and read them, wait until one needs "
    "you (no polling: the relay pushes), approve a plan, answer the agent. " + PROVENANCE
)


@dataclass(eq=False)
class _Subscriber:
    """A 2025-11-25 MCP session's subscriptions, and the session to notify."""

    session: ServerSession
    uris: set[str] = field(default_factory=set)


def _tool(spec: ToolSpec) -> types.Tool:
    return types.Tool(
        name=spec.name,
        description=DESCRIPTIONS[spec.name],
        input_schema=spec.args.model_json_schema(),
        output_schema=spec.answer.model_json_schema(),
        annotations=types.ToolAnnotations(
            read_only_hint=not spec.acts,
            destructive_hint=spec.destructive if spec.acts else None,
            idempotent_hint=not spec.acts,
            open_world_hint=spec.acts,
        ),
    )


def _failure(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


class McpServer:
    """The MCP server of one app, built when the listener starts (see the module
    docstring)."""

    def __init__(self, ctx: WebContext) -> None:
        config = ctx.config().mcp
        self._ctx = ctx
        self._specs = {spec.name: spec for spec in tool_specs(config.allow_actions)}
        self._bus = InMemorySubscriptionBus()
        self._listen = ListenHandler(self._bus, max_subscriptions=config.max_waits)
        self.watcher = Watcher(ctx, self._announce, max_waits=config.max_waits)
        self._tools = Tools(ctx, self.watcher)
        self._subscribers: dict[str, _Subscriber] = {}
        #: Per 2025-11-25 session: its requests in flight, and when the last one ended.
        self._in_flight: Counter[str] = Counter()
        self._last_seen: dict[str, float] = {}
        self.server: Server[Any] = Server(
            "sessionhook",
            version=__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_templates,
            on_read_resource=self._read_resource,
            on_subscribe_resource=self._subscribe,
            on_unsubscribe_resource=self._unsubscribe,
            on_subscriptions_listen=self._listen,
        )
        self.manager = StreamableHTTPSessionManager(
            app=self.server, max_sessions=config.max_sessions, session_idle_timeout=SESSION_IDLE
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Serve: the SDK's session manager and the watcher, until the block ends."""
        async with self.manager.run(), anyio.create_task_group() as tg:
            tg.start_soon(self.watcher.run)
            tg.start_soon(self._pruning)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one request to ``/mcp`` (an ASGI app)."""
        session = next(
            (v.decode("latin-1") for k, v in scope.get("headers", ()) if k == _SESSION_HEADER), None
        )
        if session is None:
            await self.manager.handle_request(scope, receive, send)
            return
        self._in_flight[session] += 1
        try:
            await self.manager.handle_request(scope, receive, send)
        finally:
            self._in_flight[session] -= 1
            if self._in_flight[session] <= 0:
                del self._in_flight[session]
                self._last_seen[session] = anyio.current_time()
        if scope.get("method") == "DELETE":  # the client ended its session
            self._forget(session)

    def close(self) -> None:
        """The server stops: open waits answer so, listen streams end properly."""
        self.watcher.close()
        self._listen.close()

    async def _pruning(self) -> None:
        # Read at each turn: tests shorten it.
        while True:
            await anyio.sleep(min(60.0, SESSION_IDLE))
            self._prune()

    def _prune(self) -> None:
        """Forget the subscriptions of sessions the SDK ended for idleness (no request in
        flight for :data:`SESSION_IDLE`: a client gone without its ``DELETE``)."""
        now = anyio.current_time()
        for key, seen in list(self._last_seen.items()):
            if now - seen > SESSION_IDLE and key not in self._in_flight:
                del self._last_seen[key]
                self._forget(key)

    # ------------------------------------------------------------------ tools

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[_tool(spec) for spec in self._specs.values()])

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        spec = self._specs.get(params.name)
        if spec is None:
            shown = json.dumps(params.name[:100])
            return _failure(f"no tool {shown} here (tools: {', '.join(self._specs)})")
        client = ""
        request = ctx.request
        scope = getattr(request, "scope", None)
        if isinstance(scope, dict):
            client = client_address(scope)
        try:
            answer, text = await self._tools.call(spec, dict(params.arguments or {}), client)
        except ToolProblem as exc:
            return _failure(str(exc))
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)],
            structured_content=answer.model_dump(mode="json"),
        )

    # ------------------------------------------------------------------ resources

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    name="waiting",
                    uri=WAITING_URI,
                    description="The sessions waiting for the user (list_sessions "
                    "state=waiting). " + PROVENANCE,
                    mime_type=_JSON,
                )
            ]
        )

    async def _list_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    name="session",
                    uri_template=SESSION_URI + "{id}",
                    description="One session (get_session). " + PROVENANCE,
                    mime_type=_JSON,
                )
            ]
        )

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        astore = self._ctx.store()
        if astore is None:
            raise MCPError(types.INTERNAL_ERROR, "the relay is starting: try again in a moment")
        data: ApiModel
        if uri == WAITING_URI:
            data = await astore.run(views.list_phase, "waiting", views.MAX_LIST)
        else:
            name = _session_of(uri)
            try:
                data = await astore.run(views.session_view, name)
            except OperatorError as exc:
                raise MCPError(types.INVALID_PARAMS, str(exc)) from None
        return types.ReadResourceResult(
            contents=[
                types.TextResourceContents(uri=uri, mime_type=_JSON, text=data.model_dump_json())
            ]
        )

    # ------------------------------------------------------------------ subscriptions

    async def _subscribe(
        self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        uri = str(params.uri)
        if uri != WAITING_URI:
            _session_of(uri)
        key = _session_key(ctx)
        self._prune()
        subscriber = self._subscribers.get(key)
        if subscriber is None or uri not in subscriber.uris:
            if not self.watcher.room():
                raise MCPError(types.INTERNAL_ERROR, "too many subscriptions open")
            if subscriber is None:
                subscriber = self._subscribers[key] = _Subscriber(ctx.session)
            subscriber.uris.add(uri)
            self.watcher.subscribed(1)
        subscriber.session = ctx.session
        return types.EmptyResult()

    async def _unsubscribe(
        self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        subscriber = self._subscribers.get(_session_key(ctx))
        if subscriber is not None and str(params.uri) in subscriber.uris:
            subscriber.uris.discard(str(params.uri))
            self.watcher.subscribed(-1)
        return types.EmptyResult()

    def _forget(self, key: str) -> None:
        subscriber = self._subscribers.pop(key, None)
        if subscriber is not None:
            self.watcher.subscribed(-len(subscriber.uris))

    async def _announce(self, uri: str) -> None:
        """Tell every subscriber of ``uri`` that it changed: the ``subscriptions/listen``
        streams (the bus) and the 2025-11-25 sessions (their standalone stream)."""
        await self._bus.publish(ResourceUpdated(uri=uri))
        self._prune()
        for subscriber in list(self._subscribers.values()):
            if uri in subscriber.uris:
                with anyio.move_on_after(NOTIFY_TIMEOUT):
                    await subscriber.session.send_resource_updated(uri)


def _session_of(uri: str) -> str:
    """``sessions/ID`` of a session resource URI; an :class:`MCPError` for another URI."""
    rest = uri.removeprefix(SESSION_URI)
    if rest == uri or not rest or "/" in rest or len(rest) > 200:
        raise MCPError(types.INVALID_PARAMS, f"no such resource: {uri[:200]!r}")
    return "sessions/" + rest


def _session_key(ctx: ServerRequestContext[Any]) -> str:
    """The MCP session a 2025-11-25 request belongs to (its ``Mcp-Session-Id``)."""
    headers = getattr(ctx.request, "headers", None)
    key = headers.get("mcp-session-id") if headers is not None else None
    if not key:
        raise MCPError(types.INVALID_REQUEST, "resources/subscribe needs an MCP session")
    return str(key)
