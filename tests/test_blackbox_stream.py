"""Black-box: the event stream of ``sessionhook run`` (``GET /v1/events/stream``) against
the stand-in API, beside a webhook consumer.

Every message carries the same webhook-id, type and bytes as the webhook; a consumer killed
mid-stream resumes with Last-Event-ID and misses nothing, repeats nothing; the token guards
the stream and not the health routes; ``sessionhook events --follow --url`` tails it and
stops cleanly on Ctrl-C. The resume test runs on a SQLite file and on a PostgreSQL database
(``store_backend``). Nothing is imported from ``sessionhook``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.delivery_checks import settled_hits
from tests.support.loopback import free_port
from tests.support.processes import interrupt
from tests.support.relay_process import (
    SESSIONHOOK,
    URL_ENV,
    Endpoint,
    Harness,
    Relay,
    readyz,
    wait_ready,
    wait_until,
)
from tests.support.world import World, bash

pytestmark = pytest.mark.process


TOKEN = "bb-" + "k" * 40


@dataclass
class Message:
    id: str
    event: str
    data: bytes


def sse(lines: Iterator[str]) -> Iterator[Message]:
    """SSE messages as the HTML standard parses them (comments skipped)."""
    fields: dict[str, list[str]] = {}
    for line in lines:
        if line == "":
            if "data" in fields:
                yield Message(
                    fields["id"][-1], fields["event"][-1], "\n".join(fields["data"]).encode()
                )
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields.setdefault(name, []).append(value.removeprefix(" "))


class Reader:
    """Reads a stream in a thread until told to stop (or killed mid-stream)."""

    def __init__(self, url: str, headers: dict[str, str], stop_after: int | None = None):
        self.messages: list[Message] = []
        self.status: int | None = None
        self.error: Exception | None = None
        self._stop_after = stop_after
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url, headers), daemon=True)
        self._thread.start()

    def _run(self, url: str, headers: dict[str, str]) -> None:
        timeout = httpx.Timeout(10.0, read=60.0)
        try:
            with httpx.stream("GET", url, headers=headers, timeout=timeout) as answer:
                self.status = answer.status_code
                for message in sse(answer.iter_lines()):
                    self.messages.append(message)
                    if self._closed.is_set() or len(self.messages) == self._stop_after:
                        return  # leaves the connection: the consumer dies here
        except Exception as exc:  # the relay killed at teardown: the reader just ends
            self.error = exc

    @property
    def ended(self) -> bool:
        """Whether the response ended (or failed: see :attr:`error`)."""
        return not self._thread.is_alive()

    def close(self) -> None:
        """Stop reading at the next message; a reader waiting on an idle stream is left to
        end with the relay (a daemon thread)."""
        self._closed.set()
        self._thread.join(timeout=1)


def _opened(relay: Relay) -> int:
    """The streams ``relay`` opened so far (its ``stream.opened`` log lines)."""
    return sum(e.get("event") == "stream.opened" for e in relay.log_events())


def _relay(
    harness: Harness,
    standin: object,
    endpoints: list[Endpoint],
    database: str | None = None,
    label: str = "relay",
) -> tuple[Relay, str]:
    """A relay with the stream on; its store is a SQLite file, or the PostgreSQL
    ``database`` (named through ``url_env``, as tests/test_blackbox_postgres.py does)."""
    port = free_port()
    env = {"SESSIONHOOK_WEB_TOKEN": TOKEN, **({URL_ENV: database} if database else {})}
    relay = harness.relay(
        standin,  # type: ignore[arg-type]
        label,
        env=env,
        endpoints=endpoints,
        listen=f"127.0.0.1:{port}",
        store_url_env=URL_ENV if database is not None else None,
        more={"server": ['token_env = "SESSIONHOOK_WEB_TOKEN"']},
    )
    return relay, f"http://127.0.0.1:{port}"


def _ready(base: str) -> bool:
    """Whether the relay at ``base`` answers ``/readyz`` with 200 (not listening: no)."""
    try:
        return readyz(int(base.rsplit(":", 1)[1]))[0] == 200
    except OSError:
        return False


def _database(store_backend: str, request: pytest.FixtureRequest) -> str | None:
    """``None`` (a SQLite file) or a fresh PostgreSQL database's URL."""
    if store_backend == "sqlite":
        return None
    return str(request.getfixturevalue("pg_url"))


def test_the_stream_carries_the_webhooks_ids_and_bytes_and_resumes(
    harness: Harness, store_backend: str, request: pytest.FixtureRequest
) -> None:
    standin = harness.standin()
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("alpha")
    database = _database(store_backend, request)
    relay, base = _relay(harness, standin, [Endpoint("alpha", url, secret)], database)
    wait_ready(standin, relay)
    stream = f"{base}/v1/events/stream"
    auth = {"authorization": f"Bearer {TOKEN}"}

    # Access: the health routes are open, the stream is not.
    assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
    assert httpx.get(f"{base}/metrics", timeout=10).status_code == 200
    assert httpx.get(stream, timeout=10).status_code == 401
    wrong = httpx.get(stream, headers={"authorization": "Bearer " + "x" * 43}, timeout=10)
    assert wrong.status_code == 401
    wait_until(
        lambda: any(e.get("event") == "web.auth_failed" for e in relay.log_events()),
        10,
        "the web.auth_failed log line",
    )
    assert TOKEN not in relay.stderr and "x" * 43 not in relay.stderr
    metrics = httpx.get(f"{base}/metrics", timeout=10).text
    assert 'sessionhook_web_auth_failures_total{via="bearer"} 1.0' in metrics

    # One consumer follows everything; another is killed after 5 messages.
    whole = Reader(stream, auth)
    killed = Reader(stream, auth, stop_after=5)
    wait_until(lambda: whole.status == 200 and killed.status == 200, 10, "both streams")
    metrics = httpx.get(f"{base}/metrics", timeout=10).text
    assert "sessionhook_event_streams 2.0" in metrics
    world = World(standin)
    world.add("pr")
    world.add("fail")
    world.play(pause=0.1)
    hits = settled_hits(consumer, "alpha", world, harness)
    wait_until(lambda: {m.id for m in whole.messages} >= set(hits), 20, "every event on the stream")
    wait_until(lambda: len(killed.messages) == 5, 10, "the first five on the killed stream")
    killed.close()

    # Same id, type and bytes as the webhook, each event once.
    ids = [m.id for m in whole.messages]
    assert len(ids) == len(set(ids)) and set(ids) == set(hits)
    for m in whole.messages:
        assert m.data == hits[m.id].raw and m.event == hits[m.id].type

    # The killed consumer comes back with the last id it saw: the rest, exactly.
    resumed = Reader(
        stream, {**auth, "last-event-id": killed.messages[-1].id}, stop_after=len(ids) - 5
    )
    wait_until(lambda: len(resumed.messages) == len(ids) - 5, 20, "the resumed stream")
    resumed.close()
    whole.close()
    assert [m.id for m in killed.messages + resumed.messages] == ids

    unknown = httpx.get(stream, headers={**auth, "last-event-id": "evt_unknown"}, timeout=10)
    assert unknown.status_code == 400


def test_events_follow_url_tails_the_stream_and_stops_on_ctrl_c(harness: Harness) -> None:
    standin = harness.standin()
    relay, base = _relay(harness, standin, [])
    wait_ready(standin, relay)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
    env["SESSIONHOOK_WEB_TOKEN"] = TOKEN
    out = harness.tmp / "follow.out"
    with (
        out.open("wb") as sink,
        subprocess.Popen(
            [
                str(SESSIONHOOK),
                "events",
                "--follow",
                "--url",
                base,
                "--format",
                "ndjson",
                "--type",
                "session.*",
            ],
            stdout=sink,
            stderr=subprocess.PIPE,
            env=env,
        ) as follower,
    ):
        try:
            # Connected once the relay logs the stream.
            wait_until(
                lambda: any(e.get("event") == "stream.opened" for e in relay.log_events()),
                20,
                "the follower's stream",
            )
            world = World(standin)
            name = world.add("short")
            world.play(pause=0.1)

            def lines() -> list[dict[str, object]]:
                return [json.loads(x) for x in out.read_text().splitlines() if x.strip()]

            wait_until(
                lambda: any(
                    r["type"] == "session.state_changed" and r["session"] == name for r in lines()
                ),
                30,
                "the session's events in the follower's output",
            )
            err = interrupt(follower)
        finally:
            if follower.poll() is None:
                follower.kill()
    assert "Traceback" not in err
    got = lines()
    assert got and all(str(r["type"]).startswith("session.") for r in got)
    assert len({r["id"] for r in got}) == len(got)


#: What a clean stop never logs: uvicorn's words for a request it had to cancel, and a
#: request's exception.
UNCLEAN = ("Exception in ASGI application", "CancelledError", "Traceback", "graceful shutdown")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_ends_open_streams_properly_and_listen_reconnects(
    harness: Harness, signum: signal.Signals
) -> None:
    """Ctrl-C (or SIGTERM) while streams are open: the event stream, the console's live
    feed and ``listen --forward-to``. The daemon ends each response properly (the last
    chunk: its consumer sees the end, not a broken connection) and exits 0 with no error
    line; the listener says the stream ended, reconnects to the restarted daemon and stops
    cleanly on its own Ctrl-C."""
    standin = harness.standin()
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("local")
    relay, base = _relay(harness, standin, [])
    wait_ready(standin, relay)
    auth = {"authorization": f"Bearer {TOKEN}"}
    stream = Reader(f"{base}/v1/events/stream", auth)
    live = Reader(f"{base}/console/live", auth)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
    env["SESSIONHOOK_WEB_TOKEN"] = TOKEN
    err_path = harness.tmp / "listen.err"
    args = ["listen", "--url", base, "--forward-to", url, "--secret", secret]
    with (
        err_path.open("wb") as err,
        subprocess.Popen(
            [str(SESSIONHOOK), *args], stdout=subprocess.DEVNULL, stderr=err, env=env
        ) as listener,
    ):
        try:
            wait_until(
                lambda: stream.status == 200 and live.status == 200 and _opened(relay) == 2,
                20,
                "the two event streams and the live feed",
            )
            assert relay.proc is not None
            relay.proc.send_signal(signum)
            assert relay.wait(30) == 0
            wait_until(lambda: stream.ended and live.ended, 10, "the readers to end")
            wait_until(
                lambda: "the stream ended; reconnecting" in err_path.read_text(),
                10,
                "the listener to see the end",
            )
            said = relay.stderr
            assert not [line for line in said.splitlines() if any(u in line for u in UNCLEAN)]
            assert not [e for e in relay.log_events() if e.get("level") in ("error", "critical")]
            assert stream.error is None and live.error is None  # a proper end, not a cut

            # The daemon is back: the listener reconnects by itself and stops on Ctrl-C.
            relay.start()
            wait_ready(standin, relay)
            wait_until(lambda: _opened(relay) == 1, 30, "the listener to reconnect")
            listener.send_signal(signal.SIGINT)
            assert listener.wait(timeout=20) == 130
        finally:
            if listener.poll() is None:
                listener.kill()
    assert "Traceback" not in err_path.read_text()


def _ingested(base: str) -> float:
    """Events this relay archived itself (``sessionhook_events_ingested_total``)."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sessionhook_events_ingested_total{")
    )


def test_two_replicas_stream_the_same_events_and_a_consumer_resumes_on_the_other(
    harness: Harness, pg_url: str
) -> None:
    """Two relays on one PostgreSQL store; one of them polls upstream and archives (the
    poller's lease). Each replica's stream carries every event, in the same order with the
    same ids and bytes, whichever replica archived it; a consumer killed on one replica
    reconnects to the other with its Last-Event-ID and gets the rest, exactly."""
    standin = harness.standin()
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("alpha")
    endpoint = Endpoint("alpha", url, secret)
    replicas = [_relay(harness, standin, [endpoint], pg_url, f"replica-{n}") for n in range(2)]
    # wait_ready counts the stand-in's list answers, and only the lease holder lists: each
    # replica's own /readyz says when its listener serves.
    for relay, base in replicas:
        wait_ready(standin, relay)
        wait_until(lambda base=base: _ready(base), 20, f"{base}/readyz to answer 200")
    auth = {"authorization": f"Bearer {TOKEN}"}
    streams = [f"{base}/v1/events/stream" for _, base in replicas]
    whole = [Reader(stream, auth) for stream in streams]
    killed = Reader(streams[0], auth, stop_after=5)
    wait_until(lambda: all(r.status == 200 for r in [*whole, killed]), 10, "the streams to open")
    world = World(standin)
    world.add("pr")
    world.add("fail")
    world.play(pause=0.1)
    hits = settled_hits(consumer, "alpha", world, harness)
    for reader in whole:
        wait_until(
            lambda r=reader: {m.id for m in r.messages} >= set(hits),
            20,
            "every event on both replicas' streams",
        )
    wait_until(lambda: len(killed.messages) == 5, 10, "the first five on the killed stream")
    killed.close()

    # One replica archived everything; the other's stream read it from the shared store.
    archived = sorted(_ingested(base) for _, base in replicas)
    assert archived[0] == 0 and archived[1] >= len(hits), archived
    ids = [m.id for m in whole[0].messages]
    assert len(ids) == len(set(ids)) and set(ids) == set(hits)
    assert [m.id for m in whole[1].messages] == ids  # the same order on both
    for reader in whole:
        for m in reader.messages:
            assert m.data == hits[m.id].raw and m.event == hits[m.id].type

    # Killed on the first replica, it resumes on the second.
    rest = len(ids) - 5
    resumed = Reader(streams[1], {**auth, "last-event-id": killed.messages[-1].id}, rest)
    wait_until(lambda: len(resumed.messages) == rest, 20, "the stream resumed on the other")
    resumed.close()
    for reader in whole:
        reader.close()
    assert [m.id for m in killed.messages + resumed.messages] == ids

    # A console login on one replica holds on the other (the cookie's key comes from the
    # shared token): behind a load balancer the operator stays signed in.
    with httpx.Client(base_url=replicas[0][1], timeout=10) as browser:
        assert browser.post("/login", data={"token": TOKEN}).status_code == 303
        cookies = dict(browser.cookies)
    page = httpx.get(f"{replicas[1][1]}/console/sessions", cookies=cookies, timeout=10)
    assert page.status_code == 200
    assert {h.session for h in hits.values() if h.session} <= set(
        re.findall(r'data-session="([^"]+)"', page.text)
    )


#: Big events in the backlog of the memory test, and their size (bytes of upstream text).
BIG_EVENTS = 250
BIG_EVENT_BYTES = 100_000
#: What one stream resumed from the start of that backlog and never read may add to the
#: daemon's resident memory (its share of the store's caches included), and what three
#: more may add to that.
FIRST_STALLED_BOUND = 5 * 1024 * 1024
MORE_STALLED = 3
MORE_STALLED_BOUND = MORE_STALLED * 1024 * 1024
#: Seconds over which the peak is taken (the streams stall within the first).
PEAK_WINDOW = 5.0


def _rss(pid: int) -> int:
    """Resident memory of process ``pid`` in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def _peak_rss(pid: int, seconds: float) -> int:
    """The highest resident memory of ``pid`` sampled over ``seconds``."""
    peak = _rss(pid)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.05)
        peak = max(peak, _rss(pid))
    return peak


def _stalled_stream(base: str, last_event_id: str) -> socket.socket:
    """A stream asked for and then never read (its receive buffer kept small)."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(
        (
            "GET /v1/events/stream HTTP/1.1\r\n"
            f"Host: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Last-Event-ID: {last_event_id}\r\n\r\n"
        ).encode()
    )
    return sock


def test_streams_resumed_from_the_start_of_a_backlog_and_never_read_cost_little(
    harness: Harness,
) -> None:
    """A backlog of big events, archived by one daemon; another starts on that store (as
    after a restart: nothing of the backlog in its memory, an upstream with nothing to
    poll) and streams resume from the start of it and read nothing. The daemon reads,
    formats and writes ahead only a bounded number of bytes per stream."""
    busy = harness.standin()
    archiver, archiver_base = _relay(harness, busy, [], label="archiver")
    wait_ready(busy, archiver)
    session = busy.add_session("big outputs")
    for i in range(BIG_EVENTS):
        output = f"{i:06d}" + secrets.token_hex(BIG_EVENT_BYTES // 2)
        busy.append_activity(session, artifacts=[bash("cat big.log", output)])

    def archived() -> float:
        text = httpx.get(f"{archiver_base}/metrics", timeout=10).text
        wanted = 'sessionhook_events_ingested_total{type="activity.progress_updated"} '
        return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(wanted))

    wait_until(lambda: archived() >= BIG_EVENTS, 120, "the backlog archived")
    assert archiver.terminate()[0] == 0
    listed = archiver.command("events", "--format", "ndjson", "--limit", "1")
    first = json.loads(listed.stdout)["id"]

    quiet = harness.standin()
    relay, base = _relay(harness, quiet, [], label="relay")
    wait_ready(quiet, relay)
    assert relay.proc is not None
    pid = relay.proc.pid
    # The stream's route once, reading nothing (no position: only what comes next).
    warm = Reader(f"{base}/v1/events/stream", {"authorization": f"Bearer {TOKEN}"})
    wait_until(lambda: warm.status == 200 and _opened(relay) == 1, 10, "the first stream")
    warm.close()
    before = _rss(pid)

    stalled = [_stalled_stream(base, first)]
    try:
        wait_until(lambda: _opened(relay) == 2, 10, "the stalled stream to open")
        first_grown = _peak_rss(pid, PEAK_WINDOW) - before
        stalled += [_stalled_stream(base, first) for _ in range(MORE_STALLED)]
        wait_until(lambda: _opened(relay) == 2 + MORE_STALLED, 10, "the others to open")
        more_grown = _peak_rss(pid, PEAK_WINDOW) - before - first_grown
    finally:
        for sock in stalled:
            sock.close()
    mib = 2**20
    assert first_grown <= FIRST_STALLED_BOUND, f"one stalled stream: +{first_grown / mib:.1f} MiB"
    assert more_grown <= MORE_STALLED_BOUND, (
        f"{MORE_STALLED} more stalled streams: +{more_grown / mib:.1f} MiB"
    )
    assert relay.alive(), relay.diagnostics()
