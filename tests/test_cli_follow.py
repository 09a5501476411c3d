"""``sessionhook events --follow``: tails the store, or a daemon's event stream (reconnecting
with Last-Event-ID), with the filters of ``events``; Ctrl-C ends it cleanly. On both store
engines (``backend``: ``--db FILE`` on SQLite, ``--config`` with ``[store] url`` on
PostgreSQL)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO

import anyio
import anyio.abc
import httpx
import pytest

from sessionhook.cli.ops_events import follow_stream
from sessionhook.cli.sse import (
    MAX_NAME_BYTES,
    SkippedEvent,
    SseParser,
    StreamEvent,
    parse_sse,
)
from sessionhook.relay.ops import EventFilter
from sessionhook.relay.store import AsyncStore
from sessionhook.relay.web import Bell, create_app
from sessionhook.relay.web import server as health
from tests.support.backends import Backend
from tests.support.loopback import free_port
from tests.support.pg import Cluster
from tests.support.processes import interrupt
from tests.support.relay_process import run_cli
from tests.support.web_relay import TOKEN, WebRelay, web_context

pytestmark = pytest.mark.process

SESSIONHOOK = Path(sys.executable).parent / "sessionhook"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}


def events(*args: str) -> subprocess.Popen[bytes]:
    """``sessionhook events ARGS`` (a follower), its output in pipes."""
    return subprocess.Popen(
        [str(SESSIONHOOK), "events", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
    )


def store_args(backend: Backend, tmp_path: Path) -> list[str]:
    """The CLI options naming ``backend``'s store: ``--db FILE`` for SQLite, a config whose
    ``[store] url`` names the database for PostgreSQL."""
    if isinstance(backend.target, Path):
        return ["--db", str(backend.target)]
    config = tmp_path / "store.toml"
    config.write_text(f"[store]\nurl = {json.dumps(backend.target)}\n")
    return ["--config", str(config)]


class Lines:
    """A subprocess's output lines, read by a thread (a blocked read never hangs a test)."""

    def __init__(self, out: IO[bytes]) -> None:
        self._queue: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(out,), daemon=True).start()

    def _pump(self, out: IO[bytes]) -> None:
        try:
            for line in out:
                self._queue.put(line.decode().rstrip("\n"))
        except (ValueError, OSError):
            pass  # closed by the test: it has what it wanted

    def take(self, count: int, within: float = 20.0) -> list[str]:
        deadline = time.monotonic() + within
        lines: list[str] = []
        while len(lines) < count:
            try:
                lines.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"only {lines} within {within} s") from None
        return lines


def _counter(backend: Backend) -> WebRelay:
    """Creates the store; numbers the events :func:`_archive` adds to it."""
    counter = WebRelay(AsyncStore(backend.open()), "", Bell())
    anyio.run(counter.astore.close)
    return counter


def _archive(backend: Backend, counter: WebRelay, n: int, **kw: str) -> list[str]:
    """Archive ``n`` events in the store, as another process than the follower."""

    async def go() -> list[str]:
        counter.astore = AsyncStore(backend.open())
        try:
            return [row.id for row in await counter.archive(n, **kw)]  # type: ignore[arg-type]
        finally:
            await counter.astore.close()

    return anyio.run(go)


def test_follow_the_store_with_filters_then_ctrl_c(backend: Backend, tmp_path: Path) -> None:
    counter = _counter(backend)
    old = _archive(backend, counter, 2, kind="session.completed")
    with events(
        "--follow",
        *store_args(backend, tmp_path),
        "--format",
        "ndjson",
        "--type",
        "session.*",
        "--type",
        "*.plan_*",
        "--session",
        "sessions/1",
        "--last-event-id",
        old[-1],
    ) as proc:
        try:
            lines = Lines(proc.stdout)  # type: ignore[arg-type]
            wanted = _archive(backend, counter, 2, kind="session.completed")
            _archive(backend, counter, 1, kind="activity.progress_updated")
            _archive(backend, counter, 1, kind="session.failed", session="sessions/2")
            wanted += _archive(backend, counter, 1, kind="activity.plan_generated")
            got = [json.loads(line) for line in lines.take(3)]
            err = interrupt(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert [g["id"] for g in got] == wanted and not set(wanted) & set(old)
    assert [g["type"] for g in got] == ["session.completed"] * 2 + ["activity.plan_generated"]
    assert got[0]["body"]["data"]["i"] == 2
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_follow_resumes_after_an_id_and_refuses_an_unknown_one(
    backend: Backend, tmp_path: Path
) -> None:
    counter = _counter(backend)
    ids = _archive(backend, counter, 4)
    where = store_args(backend, tmp_path)
    with events("-f", *where, "--last-event-id", ids[1]) as proc:
        try:
            lines = Lines(proc.stdout).take(2)  # type: ignore[arg-type]
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=10)
    assert [line.split()[-1] for line in lines] == ids[2:]
    unknown = run_cli("events", "-f", *where, "--last-event-id", "evt_nope", env=_env(), timeout=30)
    assert unknown.returncode == 1
    assert unknown.stderr.startswith("error: unknown event id 'evt_nope'")
    usage = run_cli("events", "-f", *where, "--format", "json", env=_env(), timeout=30)
    assert usage.returncode == 2


def test_follow_the_store_waits_out_a_database_restart(
    pg_cluster: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """PostgreSQL restarts under ``events --follow``: a note on stderr, no traceback, and
    the events archived once it is back are printed after the others, none missed."""
    backend = Backend("postgresql", pg_url)
    counter = _counter(backend)
    first = _archive(backend, counter, 1)
    where = store_args(backend, tmp_path)
    with events("-f", *where, "--format", "ndjson", "--last-event-id", *first) as proc:
        try:
            out = Lines(proc.stdout)  # type: ignore[arg-type]
            err = Lines(proc.stderr)  # type: ignore[arg-type]
            wanted = _archive(backend, counter, 2)
            got = [json.loads(line)["id"] for line in out.take(2)]
            pg_cluster.stop()
            try:
                note = err.take(1, within=30)[0]
            finally:
                pg_cluster.start()
            wanted += _archive(backend, counter, 2)
            got += [json.loads(line)["id"] for line in out.take(2, within=60)]
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    assert got == wanted
    assert note.startswith("note: ") and "reading again in" in note and "Traceback" not in note


@pytest.mark.anyio
async def test_parse_sse_joins_data_lines_and_skips_comments() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for part in (
            b'retry: 2000\n: hi\n\nid: e1\nevent: a.b\ndata: {"x":\n',
            b"data: 1}\n",
            b"\r\nid: e2\r\nevent: c\r\ndata: 2\r\n\r\n",
        ):
            yield part

    got = [e async for e in parse_sse(chunks())]
    assert [(e.id, e.type, e.body) for e in got] == [("e1", "a.b", b'{"x":\n1}'), ("e2", "c", b"2")]


def _chunks(data: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def _message(event_id: str, body: bytes, *, id_last: bool = False) -> bytes:
    lines = [b"data: " + line for line in body.split(b"\n")]
    head, tail = [f"id: {event_id}".encode(), b"event: t.x"], []
    if id_last:
        head, tail = [b"event: t.x"], [f"id: {event_id}".encode()]
    return b"\n".join([*head, *lines, *tail]) + b"\n\n"


LIMIT = 1 << 20


@pytest.mark.parametrize(
    "big",
    [
        pytest.param(b"x" * (3 * LIMIT), id="one line"),
        pytest.param(b"\n".join([b"y" * 1000] * 3000), id="many lines"),
        pytest.param(b"z" * (LIMIT + 1), id="one byte over"),
    ],
)
@pytest.mark.parametrize("id_last", [False, True])
@pytest.mark.parametrize("chunk", [997, 65536])
def test_a_message_over_the_bound_is_skipped_and_never_held(
    big: bytes, id_last: bool, chunk: int
) -> None:
    """Between two events, a message larger than the parser's bound: the two events come
    out whole, the big one as skipped (its id too when it comes after the data), and the
    parser never holds more than the bound plus one chunk."""
    stream = _message("e1", b'{"n":1}') + _message("big", big, id_last=id_last)
    stream += b": keep-alive\n\n" + _message("e3", b'{"n":3}\n{"more":true}')
    parser = SseParser(LIMIT)
    got: list[StreamEvent | SkippedEvent] = []
    held = 0
    for piece in _chunks(stream, chunk):
        got += parser.feed(piece)
        held = max(held, parser.buffered)
    assert held <= parser.most + chunk and parser.most < 2 * LIMIT
    assert got == [
        StreamEvent("e1", "t.x", b'{"n":1}'),
        SkippedEvent("big", "t.x"),
        StreamEvent("e3", "t.x", b'{"n":3}\n{"more":true}'),
    ]


def test_the_parser_takes_a_stream_byte_by_byte() -> None:
    stream = _message("e1", b"a\nb") + _message("big", b"c" * 100) + _message("e3", b"d")
    parser = SseParser(64)
    got: list[StreamEvent | SkippedEvent] = []
    for byte in _chunks(stream, 1):
        got += parser.feed(byte)
        assert parser.buffered <= parser.most + 1
    assert got == [
        StreamEvent("e1", "t.x", b"a\nb"),
        SkippedEvent("big", "t.x"),
        StreamEvent("e3", "t.x", b"d"),
    ]


def test_a_message_at_the_bound_is_kept_and_long_names_are_not() -> None:
    body = b"\n".join([b"a" * 1000] * 10)
    parser = SseParser(len(body))
    assert parser.feed(_message("e1", body)) == [StreamEvent("e1", "t.x", body)]
    parser = SseParser(len(body) - 1)
    assert parser.feed(_message("e1", body)) == [SkippedEvent("e1", "t.x")]
    long_id = "i" * (MAX_NAME_BYTES + 1)
    assert SseParser().feed(_message(long_id, b"{}")) == [SkippedEvent("", "t.x")]
    # Bad UTF-8 in an id is read as U+FFFD, as the standard says, never an exception.
    assert SseParser().feed(b"id: \xff\ndata: {}\n\n") == [StreamEvent("\ufffd", "message", b"{}")]


def test_follow_with_a_url_that_is_not_http_is_a_usage_error() -> None:
    """``events --follow --url`` takes an http(s) URL, as every other --url: another scheme
    is one line and exit status 2, not a stream reconnecting for ever."""
    args = ["events", "--follow", "--url", "ftp://127.0.0.1:1", "--token", "t"]
    done = run_cli(*args, env=_env(), timeout=120)
    assert done.returncode == 2
    assert "--url must be an http:// or https:// URL" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'"text"', b"[" * 100_000])
def test_a_message_whose_body_is_no_json_object_reads_as_its_type(body: bytes) -> None:
    """What ``events --follow --url`` and ``listen --forward-to`` print of a stream message
    that is not a JSON object (a hostile or broken relay): its type, never an exception."""
    assert StreamEvent("e1", "t.x", body).payload() == {"type": "t.x"}
    assert StreamEvent("e2", "t.x", b'{"n": 1}').payload() == {"n": 1}


@pytest.mark.anyio
async def test_follow_stream_reconnects_with_last_event_id(backend: Backend) -> None:
    """The daemon restarts under the follower: it reconnects and resumes, nothing missed
    or repeated."""
    listen = f"127.0.0.1:{free_port()}"
    astore = AsyncStore(backend.open())
    ctx = web_context(astore, listen)
    relay = WebRelay(astore, f"http://{listen}", ctx.bell)
    first = await relay.archive(1)
    expected: list[str] = []
    got: list[str] = []
    try:
        async with anyio.create_task_group() as outer, httpx.AsyncClient() as http:
            server = anyio.CancelScope()

            async def serve(
                scope: anyio.CancelScope, *, task_status: anyio.abc.TaskStatus[object]
            ) -> None:
                with scope:
                    app = create_app(ctx)
                    await health.serve(listen, app, task_status=task_status)

            await outer.start(serve, server)
            stream = follow_stream(http, relay.url, TOKEN, EventFilter(), first[0].id)
            expected += [r.id for r in await relay.archive(3)]
            with anyio.fail_after(30):
                for _ in range(2):
                    got.append((await anext(stream)).id)
                server.cancel()  # the daemon stops; events keep being archived
                await anyio.sleep(0.5)
                expected += [r.id for r in await relay.archive(2)]
                server = anyio.CancelScope()
                await outer.start(serve, server)
                expected += [r.id for r in await relay.archive(2)]
                while len(got) < len(expected):
                    got.append((await anext(stream)).id)
            await stream.aclose()
            outer.cancel_scope.cancel()
    finally:
        await astore.close()
    assert got == expected
