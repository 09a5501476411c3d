"""The listener's bounds over real loopback sockets (:mod:`sessionhook.relay.web.listener`):
a request that never completes is closed however it drips, a long answer is not cut,
connections beyond the cap wait in the listen queue, a close that a non-reading peer
blocks becomes an abort, and the open-files limit is raised and checked."""

from __future__ import annotations

import contextlib
import logging
import resource
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from sessionhook.relay.telemetry.metrics import Metrics
from sessionhook.relay.web import listener
from sessionhook.relay.web import server as health
from sessionhook.relay.web.listener import ConnectionLimits

pytestmark = [pytest.mark.app, pytest.mark.anyio]

BIG = 16 * 1024 * 1024


async def _slow(request: Request) -> Response:
    async def body() -> AsyncIterator[bytes]:
        for i in range(6):
            yield f"part {i}\n".encode()
            await anyio.sleep(0.25)

    return StreamingResponse(body(), media_type="text/plain")


async def _big(request: Request) -> Response:
    return Response(b"b" * BIG, media_type="application/octet-stream")


async def _ok(request: Request) -> Response:
    return Response("ok")


#: When ``/endless?name=NAME`` last wrote (a stream stops writing once its transport is
#: full: its consumer reads nothing).
WROTE: dict[str, float] = {}


async def _endless(request: Request) -> Response:
    """A stream that ends its body when the server stops, as the event streams do."""
    closing = listener.server_closing(request.scope)
    name = request.query_params.get("name", "")

    async def body() -> AsyncIterator[bytes]:
        while not closing.is_set():
            WROTE[name] = time.monotonic()
            yield b"x" * 65536
            if not name:  # a named one writes as fast as it is let
                with anyio.move_on_after(0.05):
                    await closing.wait()

    return StreamingResponse(body(), media_type="text/plain")


APP = Starlette(
    routes=[
        Route("/ok", _ok, methods=["GET", "POST"]),
        Route("/slow", _slow),
        Route("/big", _big),
        Route("/endless", _endless),
    ]
)


@asynccontextmanager
async def serving(limits: ConnectionLimits, metrics: Metrics) -> AsyncIterator[int]:
    async with anyio.create_task_group() as tg:
        _host, port = await tg.start(
            lambda task_status: health.serve(
                "127.0.0.1:0", APP, limits=limits, metrics=metrics, task_status=task_status
            )
        )
        yield port
        tg.cancel_scope.cancel()


def _value(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(f"sessionhook_{name}", labels)
    return 0.0 if value is None else value


async def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` (EOF or reset) within ``within`` seconds."""
    with anyio.move_on_after(within):
        while True:
            try:
                if sock.recv(65536) == b"":
                    return True
            except BlockingIOError:
                await anyio.sleep(0.05)
            except ConnectionResetError:
                return True
    return False


async def _until(predicate: Callable[[], bool], within: float) -> None:
    for _ in range(int(within / 0.05)):
        if predicate():
            return
        await anyio.sleep(0.05)
    raise AssertionError(f"not so within {within} s")


@contextlib.contextmanager
def raw_connection(port: int, rcvbuf: int | None = None) -> Iterator[socket.socket]:
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()


async def test_a_request_dripped_slowly_is_closed_after_the_request_timeout() -> None:
    metrics = Metrics()
    async with serving(ConnectionLimits(8, 0.5), metrics) as port:
        with raw_connection(port) as sock:
            sock.send(b"GET /ok HTTP/1.1\r\nHost: x\r\n")
            closed = False
            # A header line every 0.2 s, for at most 6 s: each one is data, none completes.
            for i in range(30):
                try:
                    sock.send(f"X-Drip-{i}: y\r\n".encode())
                except OSError:
                    closed = True
                    break
                if await _closed_by_server(sock, 0.2):
                    closed = True
                    break
            assert closed, "a request that never completes held its connection"
        assert _value(metrics, "web_connections_closed_total", reason="request_timeout") == 1


async def test_keep_alive_waits_again_and_a_long_answer_is_not_cut() -> None:
    metrics = Metrics()
    async with serving(ConnectionLimits(8, 0.5), metrics) as port:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            # The answer takes 1.5 s, three times the request timeout: it arrives whole.
            slow = await client.get("/slow", timeout=20)
            assert slow.text == "".join(f"part {i}\n" for i in range(6))
            # The same connection is used again within the timeout...
            assert (await client.post("/ok", content=b"x" * 1000)).text == "ok"
        with raw_connection(port) as sock:
            sock.send(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
            # ... but one that stays silent after its answer is closed.
            assert await _closed_by_server(sock, 10)
    assert _value(metrics, "web_connections_closed_total", reason="request_timeout") >= 1


async def test_connections_beyond_the_cap_wait_in_the_listen_queue() -> None:
    metrics = Metrics()
    cap = 8
    async with serving(ConnectionLimits(cap, 0.5), metrics) as port:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(3 * cap)]
        try:
            seen: list[float] = []

            async def watch() -> None:
                while True:
                    seen.append(_value(metrics, "web_connections"))
                    await anyio.sleep(0.05)

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                # Queued behind the idle ones: answered once they were closed, a cap at a time.
                async with httpx.AsyncClient(timeout=30) as client:
                    answer = await client.get(f"http://127.0.0.1:{port}/ok")
                tg.cancel_scope.cancel()
            assert answer.text == "ok"
            assert max(seen) == cap, "the cap was never reached or was exceeded"
            closed = _value(metrics, "web_connections_closed_total", reason="request_timeout")
            assert closed >= 2 * cap
        finally:
            for sock in idle:
                sock.close()


async def test_a_close_blocked_by_a_peer_that_reads_nothing_becomes_an_abort() -> None:
    metrics = Metrics()
    async with serving(ConnectionLimits(8, 1.0), metrics) as port:
        with raw_connection(port, rcvbuf=4096) as sock:
            sock.send(b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            await _until(
                lambda: _value(metrics, "web_connections_closed_total", reason="stuck_close") == 1,
                20,
            )
            # Its descriptor is free again (the abort completes on the next loop turn).
            await _until(lambda: _value(metrics, "web_connections") == 0, 5)


async def test_a_stop_ends_streams_properly_and_cuts_a_peer_that_reads_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The server stops while two streams are open: the one whose consumer reads gets its
    last chunk (a proper end); the one whose consumer reads nothing cannot, and is cut
    instead of waiting for uvicorn to cancel it. Nothing is cancelled, nothing logged as
    an error."""
    metrics = Metrics()
    caplog.set_level(logging.INFO, logger="uvicorn")
    stopped = anyio.Event()
    async with httpx.AsyncClient(timeout=30) as http, anyio.create_task_group() as outer:
        server = anyio.CancelScope()

        async def run(*, task_status: anyio.abc.TaskStatus[int]) -> None:
            with server:
                async with serving(ConnectionLimits(8, 5.0), metrics) as port:
                    task_status.started(port)
                    await anyio.sleep_forever()
            stopped.set()

        port = await outer.start(run)
        with raw_connection(port, rcvbuf=4096) as stalled:
            stalled.send(b"GET /endless?name=stalled HTTP/1.1\r\nHost: x\r\n\r\n")
            async with http.stream("GET", f"http://127.0.0.1:{port}/endless") as answer:
                chunks = answer.aiter_bytes()
                await anext(chunks)  # streaming
                # Stalled: nothing written for a while (the other writes every 50 ms).
                await _until(lambda: time.monotonic() - WROTE.get("stalled", 1e18) > 1, 30)
                server.cancel()
                async for _ in chunks:  # to its end: a cut would raise here
                    pass
            with anyio.fail_after(20):
                await stopped.wait()  # read nothing of the stalled one before
            assert await _closed_by_server(stalled, 10)
    uvicorn_said = [r.getMessage() for r in caplog.records if r.name.startswith("uvicorn")]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], uvicorn_said
    assert _value(metrics, "web_connections") == 0


def test_the_soft_files_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(soft, 256)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered - 1, hard))
    try:
        assert listener.raise_files_limit() == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_max_connections_may_use_half_the_files_limit() -> None:
    assert listener.check_files_limit(512, 1024) is None
    problem = listener.check_files_limit(513, 1024)
    assert problem is not None and problem.startswith("config error: server.max_connections:")
    assert "\n" not in problem


async def test_the_uvicorn_internals_the_listener_relies_on_are_there() -> None:
    """The listener subclasses uvicorn's private ``H11Protocol`` and drives ``uvicorn.Server``
    by its internals, within the uvicorn versions pyproject.toml allows: each part it relies
    on, so that an upgrade that moves one fails here, by name, rather than as a hang (run
    in a loop: the protocol takes the running one)."""
    import inspect

    import h11
    import uvicorn
    from uvicorn.protocols.http import h11_impl

    def methods(obj: object, *names: str) -> bool:
        return all(callable(getattr(obj, name, None)) for name in names)

    config = uvicorn.Config(_ok, lifespan="off", log_config=None, ws="none")
    config.load()
    server = uvicorn.Server(config)
    protocol = h11_impl.H11Protocol(config=config, server_state=server.server_state, app_state={})
    cycle_sets = h11_impl.RequestResponseCycle.__init__.__code__.co_names
    parts = {
        "H11Protocol.conn, an h11.Connection": isinstance(protocol.conn, h11.Connection),
        "H11Protocol.cycle, .transport": protocol.cycle is None and protocol.transport is None,
        "H11Protocol.connection_made, connection_lost, data_received, on_response_complete": (
            methods(
                protocol,
                "connection_made",
                "connection_lost",
                "data_received",
                "on_response_complete",
            )
        ),
        "RequestResponseCycle.response_complete": "response_complete" in cycle_sets,
        "Server.startup(sockets=), shutdown(sockets=)": all(
            "sockets" in inspect.signature(getattr(server, name)).parameters
            for name in ("startup", "shutdown")
        ),
        "Server.main_loop, capture_signals": methods(server, "main_loop", "capture_signals"),
        "Server.started, .should_exit": server.started is False and server.should_exit is False,
        "Config.lifespan_class(config).state, a dict": isinstance(
            config.lifespan_class(config).state, dict
        ),
    }
    assert [name for name, there in parts.items() if not there] == []


def test_uvicorn_is_held_to_the_versions_tested() -> None:
    """pyproject.toml bounds uvicorn on both sides (the subclass above relies on its
    internals), and the uvicorn these tests run on is within the bounds."""
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    from packaging.requirements import Requirement

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    (uvicorn,) = (
        req
        for req in map(Requirement, pyproject["project"]["dependencies"])
        if req.name == "uvicorn"
    )
    assert {spec.operator for spec in uvicorn.specifier} == {">=", "<"}, uvicorn
    assert uvicorn.specifier.contains(version("uvicorn")), uvicorn
