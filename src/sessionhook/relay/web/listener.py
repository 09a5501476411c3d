"""Bounds of the daemon's listener (``[server] listen``): how many sockets, how long to ask.

Every socket is a descriptor from the limit the process shares with its deliveries, polls
and store, so the listener keeps its own share (docs/security.md has the table):

* at most ``max_connections`` at once: :class:`ConnectionGuard`'s accept loop stops calling
  ``accept()`` at the cap (the rest wait in the kernel's listen queue);
* a complete request within ``request_timeout`` of opening or of the previous answer, else
  closed (``request_timeout``); a close the peer never lets finish becomes an abort
  (``stuck_close``);
* about :data:`WRITE_BUFFER_BYTES` held for a slow reader (the transport's high-water mark).

**A stop** (:func:`serve_socket` cancelled) closes the listening socket and sets the event
:func:`server_closing` finds in each request's scope, on which long answers end their body;
after :data:`CLOSING_GRACE` seconds the connections whose peer took nothing are aborted and
uvicorn closes the rest. The HTTP parsing is uvicorn's h11 protocol, subclassed (a private
class: pyproject.toml pins the uvicorn versions tested).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import resource
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import anyio
import anyio.abc
import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..config import DEFAULT_TRUSTED_PROXIES, ServerConfig
from ..telemetry.logs import get_logger
from ..telemetry.metrics import Metrics

#: A listener's log lines of one kind come at most this often (with a count).
LOG_EVERY: Final = 60.0
#: An answer's bytes a connection's transport holds before the app's next write waits
#: (uvicorn's flow control: its ``send`` waits while the transport is over this mark).
WRITE_BUFFER_BYTES: Final = 64 * 1024
#: Seconds a stop waits for answers in flight to end before it aborts the connections
#: whose peer does not take what was written.
CLOSING_GRACE: Final = 1.0
#: The key of a request's ``scope["state"]`` that holds the server's closing signal.
_CLOSING: Final = "sessionhook.server_closing"
#: Seconds before accept() is tried again after it failed for lack of resources.
ACCEPT_RETRY: Final = 1.0
# accept() failing for one connection only (the peer gave up while it was queued).
_PEER_GONE: Final = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.ECONNRESET})
# The client's side of h11's state machine while its request is still incomplete.
_ASKING: Final = (h11.IDLE, h11.SEND_BODY)

_log = get_logger()


def server_closing(scope: Mapping[str, Any]) -> anyio.Event:
    """The signal set when the server serving ``scope`` begins to stop (a long answer ends
    its body on it); an event nobody sets for an app called otherwise."""
    closing = (scope.get("state") or {}).get(_CLOSING)
    return closing if isinstance(closing, anyio.Event) else anyio.Event()


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """``server.max_connections`` and ``server.request_timeout`` (seconds)."""

    max_connections: int
    request_timeout: float

    @classmethod
    def of(cls, server: ServerConfig | None = None) -> ConnectionLimits:
        """The limits ``server`` sets (``None``: the defaults of ``[server]``)."""
        server = server if server is not None else ServerConfig()
        return cls(server.max_connections, server.request_timeout)


def raise_files_limit() -> int:
    """Lift the soft open-files limit (``RLIMIT_NOFILE``) to the hard one; the soft limit
    in force afterwards. A refusal (a seccomp filter, say) leaves the limit as it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError) as exc:
            _log.warning("relay.files_limit_kept", soft=soft, hard=hard, error=str(exc))
            return soft
        return hard
    return soft


def check_files_limit(max_connections: int, files_limit: int) -> str | None:
    """Why ``max_connections`` does not fit the open-files limit, or ``None``: the
    listener may use at most half of it, the rest is for deliveries, polls and the store."""
    if files_limit == resource.RLIM_INFINITY or max_connections <= files_limit // 2:
        return None
    return (
        f"config error: server.max_connections: {max_connections} is more than half the "
        f"open-files limit of this process ({files_limit}): lower it, or raise the limit "
        "(LimitNOFILE= in the systemd unit, ulimit -n)"
    )


class _Throttled:
    """One log event at most once per :data:`LOG_EVERY` seconds, with the count since."""

    def __init__(self, event: str, level: str = "warning") -> None:
        self._event = event
        self._level = level
        self._last: float | None = None
        self._count = 0

    def __call__(self, count: int = 1, **fields: Any) -> None:
        self._count += count
        now = time.monotonic()
        if self._last is not None and now - self._last < LOG_EVERY:
            return
        getattr(_log, self._level)(self._event, count=self._count, **fields)
        self._last, self._count = now, 0


class ConnectionGuard:
    """The open connections of one listener and their bounds: run :meth:`accept` and
    :meth:`sweep` as tasks; :meth:`protocol` builds each connection's protocol."""

    def __init__(self, limits: ConnectionLimits, metrics: Metrics | None = None) -> None:
        self.limits = limits
        self.open: set[_Connection] = set()
        self._metrics = metrics
        self._room = anyio.Event()
        self._full = _Throttled("web.connections_full")
        self._closed = _Throttled("web.connections_closed")
        self._accept_failed = _Throttled("web.accept_failed", "error")

    def protocol(self, server: uvicorn.Server) -> Callable[[], asyncio.Protocol]:
        """The protocol factory of ``server``'s connections."""

        def create() -> asyncio.Protocol:
            return _Connection(
                self,
                config=server.config,
                server_state=server.server_state,
                app_state=server.lifespan.state,
            )

        return create

    async def accept(self, sock: socket.socket, factory: Callable[[], asyncio.Protocol]) -> None:
        """Accept connections on ``sock`` while fewer than ``max_connections`` are open."""
        loop = asyncio.get_running_loop()
        while True:
            if len(self.open) >= self.limits.max_connections:
                self._full(max_connections=self.limits.max_connections)
                self._room = anyio.Event()
                await self._room.wait()
                continue
            try:
                conn, _peer = await loop.sock_accept(sock)
            except OSError as exc:
                if exc.errno in _PEER_GONE:
                    continue
                self._accept_failed(error=str(exc), retry_in=ACCEPT_RETRY)
                await anyio.sleep(ACCEPT_RETRY)
                continue
            try:
                await loop.connect_accepted_socket(factory, conn)
            except OSError:
                conn.close()

    async def sweep(self) -> None:
        """Close the connections past their deadline, a few times per ``request_timeout``."""
        timeout = self.limits.request_timeout
        while True:
            await anyio.sleep(min(1.0, timeout / 4))
            now = time.monotonic()
            closed: dict[str, int] = {}
            for conn in list(self.open):
                reason = conn.close_if_overdue(now, timeout)
                if reason is not None:
                    closed[reason] = closed.get(reason, 0) + 1
            for reason, count in closed.items():
                if self._metrics is not None:
                    self._metrics.web_connections_closed.labels(reason=reason).inc(count)
                self._closed(count, reason=reason, request_timeout=timeout)

    async def end_answers(self, grace: float) -> None:
        """Wait up to ``grace`` seconds while an answer is in flight or unsent bytes wait
        for their peer; then abort the connections whose peer has not taken them."""
        with anyio.move_on_after(grace):
            # Polled: a transport's buffer drains out of the protocol's sight.
            while any(conn.busy() for conn in self.open):  # noqa: ASYNC110
                await anyio.sleep(0.02)
        for conn in list(self.open):
            if conn.transport.get_write_buffer_size():
                conn.transport.abort()

    def abort_all(self) -> None:
        """Drop every connection still open (the server has stopped)."""
        for conn in list(self.open):
            conn.transport.abort()

    def opened(self, conn: _Connection) -> None:
        """A connection was accepted (its protocol's ``connection_made``)."""
        self.open.add(conn)
        self._count()

    def closed(self, conn: _Connection) -> None:
        """A connection's socket is closed: its slot is free again."""
        self.open.discard(conn)
        self._count()
        self._room.set()

    def _count(self) -> None:
        if self._metrics is not None:
            self._metrics.web_connections.set(len(self.open))


class _Connection(H11Protocol):
    """uvicorn's h11 protocol with a deadline for the request, which the guard enforces."""

    def __init__(self, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._guard = guard
        #: By when a complete request must have arrived (``None``: one is being answered).
        self.deadline: float | None = None
        self._closing_since: float | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
        self.deadline = time.monotonic() + self._guard.limits.request_timeout
        self._guard.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            super().connection_lost(exc)
        finally:
            self._guard.closed(self)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track()

    def _track(self) -> None:
        # The deadline starts when the connection begins to wait for a request (never
        # again per chunk: a slow drip must not push it back) and ends once it is whole.
        if self.conn.their_state in _ASKING:
            if self.deadline is None:
                self.deadline = time.monotonic() + self._guard.limits.request_timeout
        else:
            self.deadline = None

    def busy(self) -> bool:
        """Whether an answer is in flight, or written but not yet taken by the peer."""
        answering = self.cycle is not None and not self.cycle.response_complete
        return answering or bool(self.transport.get_write_buffer_size())

    def close_if_overdue(self, now: float, timeout: float) -> str | None:
        """Close (or abort) the connection when it is past its deadline; the reason."""
        transport = self.transport
        if transport.is_closing():
            if self._closing_since is None:
                self._closing_since = now
            elif now - self._closing_since >= timeout:
                transport.abort()
                return "stuck_close"
            return None
        if self.deadline is None or now < self.deadline:
            return None
        if transport.get_write_buffer_size():
            transport.abort()  # a close would wait for a peer that does not read
        else:
            transport.close()
        return "request_timeout"


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The daemon owns SIGTERM/SIGINT/SIGHUP through anyio; uvicorn must not steal them.
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # No loop.create_server(): its accept() has no bound. The guard's accept loop
        # hands each connection over instead.
        self.servers = []
        self.started = True


async def serve_socket(
    sock: socket.socket,
    app: Any,
    *,
    limits: ConnectionLimits,
    metrics: Metrics | None = None,
    graceful_shutdown: int = 2,
    trusted_proxies: Sequence[str] = DEFAULT_TRUSTED_PROXIES,
    task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on the listening ``sock`` within ``limits`` until cancelled
    (``task_status.started`` gets the bound host and port), then stop as the module says.
    uvicorn speaks no WebSocket here (an upgrade would leave the guard's sight).
    ``X-Forwarded-For`` and ``-Proto`` count only from ``trusted_proxies``.
    """
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,
        access_log=False,
        server_header=False,
        ws="none",
        timeout_graceful_shutdown=graceful_shutdown,
        proxy_headers=bool(trusted_proxies),
        forwarded_allow_ips=list(trusted_proxies) or None,
    )
    config.load()
    server = _Server(config)
    server.lifespan = config.lifespan_class(config)
    closing = anyio.Event()
    # Copied into every request's scope["state"] by uvicorn (see server_closing).
    server.lifespan.state[_CLOSING] = closing
    guard = ConnectionGuard(limits, metrics)
    try:
        async with anyio.create_task_group() as tg:
            await server.startup(sockets=[sock])
            tg.start_soon(guard.accept, sock, guard.protocol(server))
            tg.start_soon(guard.sweep)
            host, port = sock.getsockname()[:2]
            task_status.started((host, port))
            await server.main_loop()
            tg.cancel_scope.cancel()
    finally:
        server.should_exit = True
        with anyio.CancelScope(shield=True):
            sock.close()  # no one new: a consumer that reconnects now is refused
            if server.started:
                closing.set()
                await guard.end_answers(CLOSING_GRACE)
                await server.shutdown(sockets=[sock])
                guard.abort_all()
