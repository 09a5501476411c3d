"""``sessionhook listen --url RELAY --forward-to URL``: a relay's event stream (the web app
over a real store, on loopback) feeds a real ``sessionhook listen`` subprocess, which POSTs
each event to a local consumer that verifies it with the ``standardwebhooks`` reference
package and the secret the listener printed. The stream is cut mid-way (a proxy drops the
connection): every event arrives exactly once, in order. The retries of a consumer that is
down or failing are tested in process with the waits recorded."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest
from anyio.abc import SocketAttribute, SocketStream
from standardwebhooks import Webhook, WebhookVerificationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sessionhook.cli.listen_forward import RETRY_DELAYS, Forwarder
from sessionhook.cli.sse import MAX_MESSAGE_BYTES, StreamEvent
from sessionhook.relay.domain import signing
from sessionhook.relay.store import AsyncStore
from sessionhook.relay.web import create_app, listener
from sessionhook.relay.web import server as health
from tests.support import forked_cli
from tests.support.backends import Backend, sqlite_only
from tests.support.daemon_setup import Setup
from tests.support.loopback import free_port
from tests.support.spellings import loopback_spellings
from tests.support.web_relay import TOKEN, WebRelay, web_context

pytestmark = [pytest.mark.process, pytest.mark.anyio]

SESSIONHOOK = Path(sys.executable).parent / "sessionhook"


class Consumer:
    """A local webhook consumer: verifies each request with the reference package (with
    ``secret``, once known), keeps the accepted ones in order, and answers 503 to the first
    ``fail_first[id]`` attempts of an event."""

    def __init__(self) -> None:
        self.secret: str | None = None
        self.accepted: list[tuple[str, bytes]] = []
        self.refused = 0
        self.attempts: Counter[str] = Counter()
        self.fail_first: dict[str, int] = {}
        self.script: list[int] = []  # answers to give, in turn (in-process tests)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        body = await request.body()
        event_id = request.headers.get("webhook-id", "")
        self.attempts[event_id] += 1
        status = 204
        try:
            assert self.secret is not None, "a request before the secret was printed"
            Webhook(self.secret).verify(body, dict(request.headers))
        except (AssertionError, WebhookVerificationError):
            self.refused += 1
            status = 401
        else:
            if self.script:
                status = self.script.pop(0)
            elif self.attempts[event_id] <= self.fail_first.get(event_id, 0):
                status = 503
            if 200 <= status < 300:
                self.accepted.append((event_id, body))
        await Response(status_code=status)(scope, receive, send)


class CutProxy:
    """A TCP proxy in front of the relay whose :meth:`cut` drops every open connection."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.open: set[SocketStream] = set()

    async def serve(self, *, task_status: anyio.abc.TaskStatus[int]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        async with listener:
            task_status.started(listener.extra(SocketAttribute.local_port))
            await listener.serve(self._handle)

    async def _handle(self, client: SocketStream) -> None:
        async with client, await anyio.connect_tcp("127.0.0.1", self.target) as upstream:
            self.open |= {client, upstream}
            async with anyio.create_task_group() as tg:
                for src, dst in ((client, upstream), (upstream, client)):
                    tg.start_soon(self._pump, src, dst, tg.cancel_scope)
            self.open -= {client, upstream}

    @staticmethod
    async def _pump(src: SocketStream, dst: SocketStream, scope: anyio.CancelScope) -> None:
        try:
            async for chunk in src:
                await dst.send(chunk)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        scope.cancel()

    async def cut(self) -> None:
        for stream in list(self.open):
            await stream.aclose()


class Listening:
    """A ``listen`` forked from the warm interpreter (tests/support/forked_cli.py), as the
    tests use a process: ``pid``, ``returncode``, ``send_signal``, ``kill``, ``wait``."""

    def __init__(self, forked: forked_cli.Forked) -> None:
        self.forked = forked
        self.pid = forked.pid

    @property
    def returncode(self) -> int | None:
        return self.forked.poll()

    def send_signal(self, sig: int) -> None:
        self.forked.send_signal(sig)

    def kill(self) -> None:
        self.forked.kill()

    async def wait(self) -> int:
        while (code := self.forked.poll()) is None:  # noqa: ASYNC110 (another process)
            await anyio.sleep(0.02)
        return code


class Lines:
    """The lines a process writes to a file, read by a task of the test's loop until the
    process has ended and the file is read to its end."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.taken = 0
        self.ended = anyio.Event()

    async def follow(self, path: Path, proc: Listening) -> None:
        rest = b""
        with path.open("rb") as file:
            while True:
                over = proc.returncode is not None
                chunk = file.read()
                *lines, rest = (rest + chunk).split(b"\n")
                self.seen.extend(line.decode() for line in lines)
                if over and not chunk:
                    break
                if not chunk:
                    await anyio.sleep(0.02)
        if rest:
            self.seen.append(rest.decode())
        self.ended.set()

    async def take(self, count: int, within: float = 30) -> list[str]:
        """The next ``count`` lines."""
        await until(lambda: len(self.seen) >= self.taken + count, f"{count} lines", within)
        self.taken += count
        return self.seen[self.taken - count : self.taken]


async def start_listen(
    tg: anyio.abc.TaskGroup, args: list[str], env: dict[str, str]
) -> tuple[Listening, Lines, Lines]:
    """``sessionhook listen ARGS`` with the relay's token, its stdout and stderr read into
    :class:`Lines` by ``tg``."""
    # A state file of its own, out of the home folder, unless the test names one.
    folder = Path(tempfile.mkdtemp(prefix="listen-state-"))
    out_file, err_file = folder / "stdout", folder / "stderr"
    out_file.touch()
    err_file.touch()
    forked = forked_cli.spawn(
        "listen",
        *args,
        env={"XDG_STATE_HOME": str(folder), **env, "SESSIONHOOK_WEB_TOKEN": TOKEN},
        cwd=folder,
        stdout=out_file,
        stderr=err_file,
    )
    proc = Listening(forked)
    out, err = Lines(), Lines()
    tg.start_soon(out.follow, out_file, proc)
    tg.start_soon(err.follow, err_file, proc)
    return proc, out, err


async def until(condition: Callable[[], bool], what: str, within: float = 30) -> None:
    """Poll ``condition`` (state another task or process changes) for at most ``within`` s."""
    with anyio.fail_after(within):
        while not condition():  # noqa: ASYNC110 (no event to wait on in a subprocess's output)
            await anyio.sleep(0.05)


@sqlite_only
async def test_forward_reaches_a_verifying_consumer_once_each_in_order_across_a_cut(
    backend: Backend,
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    astore = AsyncStore(backend.open())
    ctx = web_context(astore, listen)
    relay = WebRelay(astore, f"http://{listen}", ctx.bell)
    consumer = Consumer()
    [start] = await relay.archive(1, kind="session.discovered")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
    try:
        async with anyio.create_task_group() as tg:
            _, relay_port = await tg.start(health.serve, listen, create_app(ctx))
            proxy = CutProxy(relay_port)
            proxy_port = await tg.start(proxy.serve)
            _, consumer_port = await tg.start(health.serve, "127.0.0.1:0", consumer)
            args = ["--url", f"http://127.0.0.1:{proxy_port}", "--last-event-id", start.id]
            target = f"http://127.0.0.1:{consumer_port}/webhooks"
            args += ["--forward-to", target, "--events", "session.*, activity.plan_*", "--json"]
            proc, out, err = await start_listen(tg, args, env)
            try:
                banner = await err.take(2)
                found = re.search(r"signing with (whsec_\S+) ", banner[1])
                assert found is not None, banner
                consumer.secret = found.group(1)
                signing.decode_secret(consumer.secret)
                # Before the cut: two lifecycle events (the second refused twice with 503,
                # then accepted), one the filter leaves out, one plan event.
                wanted = await relay.archive(2, kind="session.completed")
                consumer.fail_first[wanted[1].id] = 2
                await relay.archive(1, kind="activity.progress_updated")
                wanted += await relay.archive(1, kind="activity.plan_generated")
                await until(lambda: len(consumer.accepted) == 3, "3 events before the cut")
                # The cut: right after new events are archived, while they may be on the way.
                wanted += await relay.archive(3, kind="session.failed")
                await proxy.cut()
                wanted += await relay.archive(2, kind="session.state_changed")
                await until(lambda: len(consumer.accepted) == len(wanted), "all events")
                lines = await out.take(len(wanted))
                await anyio.sleep(1)  # anything forwarded twice would come now
                proc.send_signal(signal.SIGINT)
                with anyio.fail_after(20):
                    status = await proc.wait()
                    await err.ended.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    with anyio.move_on_after(10):
                        await proc.wait()
            tg.cancel_scope.cancel()
    finally:
        await astore.close()
    # Each event exactly once, in order, with the relay's body and id, signatures valid.
    assert [event_id for event_id, _ in consumer.accepted] == [row.id for row in wanted]
    assert [body for _, body in consumer.accepted] == [row.body for row in wanted]
    assert consumer.refused == 0
    assert consumer.attempts[wanted[1].id] == 3
    assert sum(consumer.attempts.values()) == len(wanted) + 2
    # What the listener printed: one JSON line per event with the consumer's answer.
    records = [json.loads(line) for line in lines]
    assert [r["id"] for r in records] == [row.id for row in wanted]
    assert all(r["answer"]["status"] == 204 and r["answer"]["delivered"] for r in records)
    assert records[1]["answer"]["attempts"] == 3 and records[0]["answer"]["attempts"] == 1
    assert records[0]["body"] == json.loads(wanted[0].body)
    notes = "\n".join(err.seen)
    assert f"note: {wanted[1].id}: answered 503; trying again in 1 s (attempt 2 of 4)" in notes
    assert "reconnecting in" in notes  # the cut was seen and resumed from
    assert status == 130
    said = [line for line in err.seen if line]  # click ends a ^C with an empty line
    assert said[-1] == f"stopped; to resume: --last-event-id {wanted[-1].id}"
    assert "Traceback" not in notes


#: The oversized message of the stand-in stream.
HUGE = 40 * 1024 * 1024


def _sse(event_id: str, body: bytes) -> bytes:
    return f"id: {event_id}\nevent: session.completed\ndata: ".encode() + body + b"\n\n"


class StandInStream:
    """A relay's event stream as the test scripts it: an event, then (once :attr:`go` is
    set) a message of :data:`HUGE` bytes made as it is sent, then another event; then it
    stays open until the server stops."""

    def __init__(self) -> None:
        self.go = anyio.Event()
        self.requests = 0
        self.bodies = [b'{"type":"session.completed","n":1}', b'{"type":"session.completed","n":3}']

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.requests += 1
        closing = listener.server_closing(scope)
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def write(chunk: bytes) -> None:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

        if self.requests == 1:
            await write(b"retry: 2000\n\n" + _sse("evt_1", self.bodies[0]))
            await self.go.wait()
            await write(b'id: evt_huge\nevent: session.completed\ndata: {"pad":"')
            for _ in range(HUGE // 65536):
                await write(b"x" * 65536)
            await write(b'"}\n\n' + _sse("evt_3", self.bodies[1]))
        await closing.wait()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _hwm(pid: int) -> int:
    """The peak resident memory of process ``pid`` so far (bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


async def test_a_message_over_the_bound_is_skipped_by_id_and_the_next_one_forwarded() -> None:
    """Between two events the stream sends a message of 40 MiB: the listener forwards the
    first and the third, says in one line that it skipped the big one (by its id), keeps
    its connection, and its memory grows by about the bound it reads a message up to,
    not by the message."""
    stream = StandInStream()
    consumer = Consumer()
    consumer.secret = signing.generate_secret()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
    async with anyio.create_task_group() as tg:
        _, stream_port = await tg.start(health.serve, "127.0.0.1:0", stream)
        _, consumer_port = await tg.start(health.serve, "127.0.0.1:0", consumer)
        args = ["--url", f"http://127.0.0.1:{stream_port}", "--secret", consumer.secret]
        args += ["--forward-to", f"http://127.0.0.1:{consumer_port}/hook"]
        proc, out, err = await start_listen(tg, args, env)
        try:
            await until(lambda: len(consumer.accepted) == 1, "the first event")
            before = _hwm(proc.pid)
            stream.go.set()
            await until(
                lambda: len(consumer.accepted) == 2 or proc.returncode is not None,
                "the third event",
                within=60,
            )
            assert proc.returncode is None, err.seen  # still listening
            # Its line comes once the POST has ended and the event counts as taken: a Ctrl-C
            # before that resumes from evt_huge, as it should, naming it a second time.
            await until(lambda: len(out.seen) == 2, "the third event's line")
            grown = _hwm(proc.pid) - before
            proc.send_signal(signal.SIGINT)
            with anyio.fail_after(20):
                assert await proc.wait() == 130
                await err.ended.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
        tg.cancel_scope.cancel()
    assert [event_id for event_id, _ in consumer.accepted] == ["evt_1", "evt_3"]
    assert [body for _, body in consumer.accepted] == stream.bodies
    skipped = [line for line in err.seen if "evt_huge" in line]
    assert len(skipped) == 1 and skipped[0].startswith("skipped evt_huge"), err.seen
    assert stream.requests == 1  # no reconnection: the stream went on
    assert grown < MAX_MESSAGE_BYTES + 16 * 1024 * 1024, f"+{grown / 2**20:.0f} MiB"
    assert "Traceback" not in "\n".join(err.seen)


# --------------------------------------------------------------------------- retries


def _event(n: int) -> StreamEvent:
    body = {"type": "session.completed", "timestamp": "2026-11-26T10:00:00Z", "data": {"n": n}}
    return StreamEvent(f"evt_{n}", "session.completed", json.dumps(body).encode())


async def _forwarding(consumer: Consumer | None, events: list[StreamEvent]) -> dict[str, Any]:
    """Forward ``events`` to ``consumer`` (None: a port where nothing listens); the
    outcomes, the notes and the waits."""
    secret = signing.generate_secret()
    waits: list[float] = []
    notes: list[str] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    async with anyio.create_task_group() as tg, httpx.AsyncClient(timeout=5) as http:
        if consumer is None:
            url = f"http://127.0.0.1:{free_port()}/hook"
        else:
            consumer.secret = secret
            _, port = await tg.start(health.serve, "127.0.0.1:0", consumer)
            url = f"http://127.0.0.1:{port}/hook"
        forwarder = Forwarder(http, url, [secret], note=notes.append, sleep=sleep)
        outcomes = [await forwarder.forward(event) for event in events]
        tg.cancel_scope.cancel()
    return {"outcomes": outcomes, "notes": notes, "waits": waits}


async def test_a_failing_consumer_is_tried_four_times_then_reported_and_passed() -> None:
    consumer = Consumer()
    consumer.script = [503, 502, 500, 503, 204]
    done = await _forwarding(consumer, [_event(1), _event(2)])
    first, second = done["outcomes"]
    assert (first.delivered, first.attempts, first.status) == (False, 4, 503)
    assert first.note() == "-> not delivered after 4 attempts: answered 503"
    assert second.delivered and second.attempts == 1 and second.note().startswith("-> 204 in ")
    assert done["waits"] == list(RETRY_DELAYS)
    assert done["notes"][0] == "note: evt_1: answered 503; trying again in 1 s (attempt 2 of 4)"
    assert [event_id for event_id, _ in consumer.accepted] == ["evt_2"]
    assert consumer.attempts == {"evt_1": 4, "evt_2": 1} and consumer.refused == 0


async def test_a_consumer_that_recovers_gets_the_event_and_4xx_is_not_retried() -> None:
    consumer = Consumer()
    consumer.script = [500, 429, 204, 410, 302]
    done = await _forwarding(consumer, [_event(1), _event(2), _event(3)])
    recovered, gone, moved = done["outcomes"]
    assert recovered.delivered and recovered.attempts == 3
    assert gone.note() == "-> not delivered: answered 410 (not retried)"
    assert moved.note() == "-> not delivered: answered 302 (not retried)"
    assert done["waits"] == [1.0, 2.0]


async def test_a_consumer_that_is_down_is_reported_after_four_attempts() -> None:
    done = await _forwarding(None, [_event(1)])
    [outcome] = done["outcomes"]
    assert not outcome.delivered and outcome.status is None and outcome.attempts == 4
    assert outcome.problem is not None and outcome.problem.startswith("ConnectError")
    assert len(done["notes"]) == 3 and done["waits"] == list(RETRY_DELAYS)


def test_forward_mode_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return forked_cli.run("listen", *args, env=env, timeout=60, cwd=tmp_path)

    no_token = run("--url", "http://127.0.0.1:9", "--forward-to", "http://127.0.0.1:9/h")
    assert no_token.returncode == 1
    assert no_token.stderr.startswith("error: --url needs the relay's token")
    alone = run("--url", "http://127.0.0.1:9")
    assert alone.returncode == 2 and "--url and --forward-to go together" in alone.stderr
    port = run("--url", "http://x", "--forward-to", "http://y", "--port", "1", "--token", "t")
    assert port.returncode == 2 and "--port is for receiving" in port.stderr
    scheme = run("--url", "ftp://x", "--forward-to", "http://y", "--token", "t")
    assert scheme.returncode == 2 and "--url must be an http:// or https:// URL" in scheme.stderr


def test_forward_banner_hides_passwords_and_ctrl_c_while_the_relay_is_away(
    tmp_path: Path,
) -> None:
    """A relay out of reach: the listener says so and keeps trying; its banner shows no
    URL password, and the secret given to sign with; Ctrl-C ends it with 130 and no
    traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
    relay = f"http://ops:hunter2@127.0.0.1:{free_port()}"
    secret = signing.generate_secret()
    args = ["--url", relay, "--forward-to", "http://u:pw@127.0.0.1:9/h", "--secret", secret]
    with subprocess.Popen(
        [str(SESSIONHOOK), "listen", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**env, "SESSIONHOOK_WEB_TOKEN": TOKEN, "XDG_STATE_HOME": str(tmp_path)},
    ) as proc:
        try:
            assert proc.stderr is not None
            said = [proc.stderr.readline().decode() for _ in range(4)]
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=20) == 130
            said.append(proc.stderr.read().decode())
        finally:
            if proc.poll() is None:
                proc.kill()
    text = "".join(said)
    assert "hunter2" not in text and ":pw@" not in text and "[redacted]@127.0.0.1" in text
    assert "ConnectError" in said[3] and "reconnecting in" in said[3]
    assert said[1].startswith(f"signing with {secret} ")  # the one given, not a new one
    assert said[2].startswith(f"state in {tmp_path}/sessionhook/listen/")
    assert "Traceback" not in text


async def test_forward_from_the_real_daemon_carries_its_webhooks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real daemon (emulator upstream, its own webhook consumer) with its listener on
    loopback; ``listen --forward-to`` on its stream: the local consumer gets every event of
    a session once, in order, each with the id and the exact body of the relay's own
    webhook."""
    monkeypatch.setenv("LISTEN_TEST_TOKEN", TOKEN)
    listen = f"127.0.0.1:{free_port()}"
    setup = Setup(tmp_path, server={"listen": listen, "token_env": "LISTEN_TEST_TOKEN"})
    daemon = setup.daemon()
    consumer = Consumer()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
    async with setup.api_http() as http, anyio.create_task_group() as tg:
        client = setup.api(http)
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await daemon.ready.wait()
        _, consumer_port = await tg.start(health.serve, "127.0.0.1:0", consumer)
        # A first session's events: the listener starts after the last delivered one.
        first = await client.create_session("Before the listener")
        await setup.receiver.wait_for(
            lambda r: any(a.session == first.name for a in r.first_deliveries()), within=30
        )
        before = [a.event_id for a in setup.receiver.first_deliveries()]
        args = ["--url", f"http://{listen}", "--last-event-id", before[-1]]
        args += ["--forward-to", f"http://127.0.0.1:{consumer_port}/hook"]
        proc, _, err = await start_listen(tg, args, env)
        try:
            banner = await err.take(2)
            found = re.search(r"signing with (whsec_\S+) ", banner[1])
            assert found is not None, banner
            consumer.secret = found.group(1)
            second = await client.create_session("While it listens")

            def of_second() -> list[str]:
                arrivals = setup.receiver.first_deliveries()
                return [a.event_id for a in arrivals if a.session == second.name]

            # The lifecycle event is the session's last (after its activity and its state
            # change): once it arrived, no event of the session is still on its way.
            await setup.receiver.wait_for(
                lambda r: any(
                    a.session == second.name and a.type == "session.completed"
                    for a in r.first_deliveries()
                ),
                within=60,
            )
            wanted = of_second()
            await until(
                lambda: set(wanted) <= {event_id for event_id, _ in consumer.accepted},
                "the session forwarded",
            )
            proc.send_signal(signal.SIGINT)
            with anyio.fail_after(20):
                assert await proc.wait() == 130
        finally:
            if proc.returncode is None:
                proc.kill()
        daemon.stop()
        tg.cancel_scope.cancel()
    webhooks = {a.event_id: a.body for a in setup.receiver.first_deliveries()}
    forwarded = [(event_id, json.loads(body)) for event_id, body in consumer.accepted]
    ids = [event_id for event_id, _ in forwarded]
    assert len(ids) == len(set(ids)) and not set(ids) & set(before)  # once, none of before
    assert [i for i, body in forwarded if body["data"]["session"]["name"] == second.name] == wanted
    assert all(body == webhooks[i] for i, body in forwarded if i in webhooks)
    assert len(wanted) >= 3 and consumer.refused == 0


# --------------------------------------------------------------------------- the consumer's URL


class OneEventStream:
    """A relay's event stream that sends each connection one event, then stays open until
    the server stops."""

    body = b'{"type":"session.completed","n":1}'

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        closing = listener.server_closing(scope)
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        chunk = b"retry: 2000\n\n" + _sse("evt_1", self.body)
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await closing.wait()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class QueryConsumer(Consumer):
    """A :class:`Consumer` that also keeps each accepted request's query string."""

    def __init__(self) -> None:
        super().__init__()
        self.queries: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        accepted = len(self.accepted)
        await super().__call__(scope, receive, send)
        if len(self.accepted) > accepted:
            self.queries.append(scope["query_string"].decode())


async def test_forward_to_a_loopback_spelled_otherwise_reaches_the_same_consumer() -> None:
    """``--forward-to`` is read as a delivery's URL is (``destination()``): a loopback
    address in fullwidth digits, with ideographic full stops or with a trailing dot reaches
    the consumer the plain URL reaches, each event delivered on the first attempt."""
    stream = OneEventStream()
    consumer = QueryConsumer()
    consumer.secret = signing.generate_secret()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
    async with anyio.create_task_group() as tg:
        _, stream_port = await tg.start(health.serve, "127.0.0.1:0", stream)
        _, port = await tg.start(health.serve, "127.0.0.1:0", consumer)
        spelled = loopback_spellings(port)[:2]  # fullwidth digits; U+3002 full stops
        spelled.append(f"http://127.0.0.1.:{port}/hook")
        targets = [f"http://127.0.0.1:{port}/hook", *spelled]
        procs: list[tuple[Listening, Lines, Lines]] = []
        try:
            for n, target in enumerate(targets):
                args = ["--url", f"http://127.0.0.1:{stream_port}", "--secret", consumer.secret]
                args += ["--forward-to", f"{target}?via={n}"]
                procs.append(await start_listen(tg, args, env))
            # Each listener prints its event's line once its POST (and any retry) ended.
            await until(
                lambda: (
                    all(out.seen for _, out, _ in procs)
                    or any(proc.returncode is not None for proc, _, _ in procs)
                ),
                "every listener's line",
                within=60,
            )
            lines = [line for _, out, _ in procs for line in out.seen]
            for proc, _, _ in procs:
                if proc.returncode is None:
                    proc.send_signal(signal.SIGINT)
            with anyio.fail_after(20):
                codes = [await proc.wait() for proc, _, _ in procs]
        finally:
            for proc, _, _ in procs:
                if proc.returncode is None:
                    proc.kill()
        tg.cancel_scope.cancel()
    said = "\n".join(line for _, _, err in procs for line in err.seen)
    assert sorted(consumer.queries) == [f"via={n}" for n in range(len(targets))], said
    assert consumer.attempts == {"evt_1": len(targets)} and consumer.refused == 0
    assert all(body == stream.body for _, body in consumer.accepted)
    assert len(lines) == len(targets) and all(" -> 204 in " in line for line in lines), lines
    assert codes == [130] * len(targets)
    assert "Traceback" not in said


def test_forward_to_a_url_not_http_or_without_a_plain_host_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    """A ``--forward-to`` URL that is not http(s), or whose host is no plain name or
    address once normalized, is refused at start: exit 2, one line naming it and why,
    nothing forwarded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
    relay = f"http://127.0.0.1:{free_port()}"
    refused = {
        "ftp://127.0.0.1/hook": "not an http(s) URL",
        "http://a b/hook": "the URL holds a space or a control character",
        "http://u:hunter2@exa%00mple/hook": "is no host name or IP address",
        "http://1.2.3.4.5/hook": "ends like an IPv4 address but is none",
    }
    for url, reason in refused.items():
        args = ["--url", relay, "--forward-to", url, "--token", "t"]
        done = forked_cli.run("listen", *args, env=env, timeout=60, cwd=tmp_path)
        lines = done.stderr.splitlines()
        assert done.returncode == 2, (url, done.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: --forward-to "), done.stderr
        assert f"{url.replace('u:hunter2@', '[redacted]@')}: refused: " in lines[0], lines[0]
        assert reason in lines[0], lines[0]
        assert done.stdout == "" and "hunter2" not in done.stderr


@sqlite_only
async def test_a_restart_resumes_after_the_last_acknowledged_event_with_the_same_secret(
    backend: Backend, tmp_path: Path
) -> None:
    """Stopped while 10 events are archived, started again: those 10 arrive once, in order,
    signed with the secret of the first run (the state file under $XDG_STATE_HOME);
    ``--new-secret`` then signs with another, kept in the file."""
    listen = f"127.0.0.1:{free_port()}"
    astore = AsyncStore(backend.open())
    ctx = web_context(astore, listen)
    relay = WebRelay(astore, f"http://{listen}", ctx.bell)
    consumer = Consumer()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
    env["XDG_STATE_HOME"] = str(tmp_path)

    async def run_listener(
        tg: anyio.abc.TaskGroup, args: list[str], until_done: Callable[[], bool], lines: int
    ) -> list[str]:
        proc, out, err = await start_listen(tg, args, env)
        try:
            banner = await err.take(3)
            found = re.search(r"signing with (whsec_\S+) ", banner[1])
            assert found is not None, banner
            if consumer.secret is None:
                consumer.secret = found.group(1)
            assert found.group(1) == consumer.secret, "the secret changed across a restart"
            await until(until_done, "the events of this run")
            await out.take(lines)  # each printed once its answer is in the state file
            proc.send_signal(signal.SIGINT)
            with anyio.fail_after(20):
                assert await proc.wait() == 130
                await err.ended.wait()
        finally:
            if proc.returncode is None:
                proc.kill()
                with anyio.move_on_after(10):
                    await proc.wait()
        return banner

    try:
        async with anyio.create_task_group() as tg:
            _, relay_port = await tg.start(health.serve, listen, create_app(ctx))
            _, consumer_port = await tg.start(health.serve, "127.0.0.1:0", consumer)
            target = f"http://127.0.0.1:{consumer_port}/webhooks"
            args = ["--url", f"http://127.0.0.1:{relay_port}", "--forward-to", target]
            [start] = await relay.archive(1, kind="session.discovered")
            # The first run starts after a known event (from now on would race the archive).
            proc, out, err = await start_listen(tg, [*args, "--last-event-id", start.id], env)
            try:
                banner = await err.take(3)
                found = re.search(r"signing with (whsec_\S+) ", banner[1])
                assert found is not None, banner
                consumer.secret = found.group(1)
                assert banner[2].startswith(f"state in {tmp_path}/sessionhook/listen/")
                first = await relay.archive(2, kind="session.completed")
                await until(lambda: len(consumer.accepted) == 2, "2 events of the first run")
                await out.take(2)  # each printed once its answer is in the state file
                proc.send_signal(signal.SIGINT)
                with anyio.fail_after(20):
                    assert await proc.wait() == 130
            finally:
                if proc.returncode is None:
                    proc.kill()
                    with anyio.move_on_after(10):
                        await proc.wait()
            (state_file,) = (tmp_path / "sessionhook" / "listen").iterdir()
            assert state_file.stat().st_mode & 0o777 == 0o600
            # While it is stopped: ten events.
            missed = await relay.archive(10, kind="session.failed")
            banner = await run_listener(tg, args, lambda: len(consumer.accepted) == 12, 10)
            assert banner[2].endswith(f": resuming after {first[-1].id}")
            await anyio.sleep(0.5)  # anything forwarded twice would come now
            # --new-secret: another secret, kept in the state file.
            kept = json.loads(state_file.read_text())
            assert kept["secret"] == consumer.secret and kept["last_event_id"] == missed[-1].id
            proc, _out, err = await start_listen(tg, [*args, "--new-secret"], env)
            try:
                banner = await err.take(3)
                assert consumer.secret not in banner[1]
                await until(
                    lambda: json.loads(state_file.read_text())["secret"] != consumer.secret,
                    "the new secret kept",
                )
                proc.send_signal(signal.SIGINT)
                with anyio.fail_after(20):
                    await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    with anyio.move_on_after(10):
                        await proc.wait()
            tg.cancel_scope.cancel()
    finally:
        await astore.close()
    assert [event_id for event_id, _ in consumer.accepted] == [r.id for r in [*first, *missed]]
    assert consumer.refused == 0
    assert sum(consumer.attempts.values()) == 12
