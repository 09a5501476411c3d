"""The event stream (``GET /v1/events/stream``) measured over a real loopback socket.

The daemon's web app is served by uvicorn in this process, on a store in a temporary
directory; events are archived straight into the store (as the poller does, ringing the
bell unless ``--no-bell``). Measured, each repetition:

* **catch-up**: ``--backlog`` events already archived, a consumer resumes with the
  Last-Event-ID of the first one: events per second until it has them all;
* **live latency**: one event archived every 50 ms, ``--samples`` times, while a consumer
  follows: the time from the ingest's commit to the consumer's parse of the message
  (median and p95), with the bell and, for comparison, with the store poll alone;
* **stalled memory** (``--stalled N``): ``--big`` activities with a 100 KB command output
  each are archived as the poller archives them (the activity's raw JSON, its event), by
  another process; then a fresh process (the server, as a daemon after a restart) opens
  the store and N streams resume from the first event and never read (receive buffers of
  4 KiB): the growth of that process's resident memory, its peak over ``--stalled-seconds``.
  The archive is written elsewhere because what the ingest leaves in a process's memory
  (freed or cached) would serve the streams' reads and hide their cost.

    .venv/bin/python bench/stream.py [--backlog 20000] [--samples 40] [--repeat 3]
    .venv/bin/python bench/stream.py --stalled 1 --stalled 4 --repeat 3
"""

from __future__ import annotations

import argparse
import secrets
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx

from sessionhook.api.models import Activity, Session
from sessionhook.relay.config import Config
from sessionhook.relay.domain.events import activity_events, make_event
from sessionhook.relay.store import AsyncStore, Ingest, Store
from sessionhook.relay.telemetry import logs as relay_logging
from sessionhook.relay.telemetry.metrics import Metrics
from sessionhook.relay.web import Bell, WebAuth, WebContext, create_app
from sessionhook.relay.web import server as health

TOKEN = "bench-token-" + "b" * 32
SESSION = "sessions/1"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Archive:
    def __init__(self, astore: AsyncStore, bell: Bell | None) -> None:
        self.astore, self.bell, self.count = astore, bell, 0
        raw = {
            "name": SESSION,
            "id": "1",
            "title": "t",
            "state": "IN_PROGRESS",
            "createTime": "2026-11-23T10:00:00Z",
            "updateTime": "2026-11-23T10:00:00Z",
        }
        astore.store.ingest.upsert_session(Session.model_validate(raw), baseline=False)

    async def add(self, n: int, text_bytes: int = 0) -> None:
        events = []
        for i in range(self.count, self.count + n):
            # About the size of a progress update, or text_bytes of incompressible text.
            text = secrets.token_hex(text_bytes // 2) if text_bytes else "x" * 600
            data = {"i": i, "text": text}
            events.append(
                make_event(
                    f"evt_{i:08d}",
                    "activity.progress_updated",
                    SESSION,
                    None,
                    "2026-11-23T10:00:00Z",
                    data,
                )
            )
        self.count += n
        await self.astore.run(Ingest.ingest_session_events, SESSION, events, False)
        if self.bell is not None:
            self.bell.ring()


async def _messages(response: httpx.Response):  # type: ignore[no-untyped-def]
    async for line in response.aiter_lines():
        if line.startswith("id: "):
            yield line[4:]


async def one_run(directory: Path, backlog: int, samples: int, bell_on: bool) -> dict[str, float]:
    listen = f"127.0.0.1:{_port()}"
    config = Config.model_validate({"server": {"listen": listen, "token_env": "T"}})
    astore = AsyncStore(Store.open(directory / f"bench-{bell_on}-{time.monotonic_ns()}.db"))
    bell = Bell()
    ctx = WebContext(
        config=lambda: config,
        store=lambda: astore,
        metrics=Metrics(),
        auth=WebAuth(TOKEN),
        bell=bell,
    )
    archive = Archive(astore, bell if bell_on else None)
    result: dict[str, float] = {}
    auth = {"authorization": f"Bearer {TOKEN}"}
    timeout = httpx.Timeout(30.0)
    async with anyio.create_task_group() as tg, httpx.AsyncClient(timeout=timeout) as http:
        host, port = await tg.start(health.serve, listen, create_app(ctx))
        url = f"http://{host}:{port}/v1/events/stream"
        if bell_on:
            for _ in range(backlog // 1000):
                await archive.add(1000)
            started = time.perf_counter()
            got = 0
            headers = {**auth, "last-event-id": "evt_00000000"}
            async with http.stream("GET", url, headers=headers) as response:
                async for _ in _messages(response):
                    got += 1
                    if got == archive.count - 1:
                        break
            result["catchup_events_per_s"] = got / (time.perf_counter() - started)
        latencies: list[float] = []
        async with http.stream("GET", url, headers=auth) as response:
            ids = _messages(response)
            for _ in range(samples):
                await anyio.sleep(0.05)
                await archive.add(1)
                committed = time.perf_counter()
                await anext(ids)
                latencies.append(time.perf_counter() - committed)
        latencies.sort()
        result["live_median_ms"] = statistics.median(latencies) * 1000
        result["live_p95_ms"] = latencies[int(0.95 * (len(latencies) - 1))] * 1000
        tg.cancel_scope.cancel()
    await astore.close()
    return result


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def build_archive(path: Path, big: int) -> str:
    """``big`` activities of 100 KB (a command's output, random) archived in ``path`` with
    their events, as the poller archives them; the first event's id."""
    store = Store.open(path)
    session = Session.model_validate(
        {
            "name": SESSION,
            "id": "1",
            "title": "big outputs",
            "state": "IN_PROGRESS",
            "createTime": "2026-11-23T10:00:00Z",
            "updateTime": "2026-11-23T10:00:00Z",
        }
    )
    store.ingest.upsert_session(session, baseline=False)
    for start in range(0, big, 10):
        activities = [
            Activity.model_validate(
                {
                    "name": f"{SESSION}/activities/{i:032x}",
                    "id": f"{i:032x}",
                    "originator": "agent",
                    "createTime": f"2026-11-23T10:{i // 60 % 60:02d}:{i % 60:02d}.000000Z",
                    "progressUpdated": {"title": f"step {i}"},
                    "artifacts": [
                        {
                            "bashOutput": {
                                "command": "cat big.log",
                                "output": f"{i:06d}" + secrets.token_hex(50_000),
                            }
                        }
                    ],
                }
            )
            for i in range(start, min(big, start + 10))
        ]
        events = activity_events(session, activities, max_media_bytes=1000)
        store.ingest.ingest_activities(SESSION, activities, events, False)
    first = store.operator.events_after(0, limit=1)[0].id
    store.close()
    return first


def _stalled_stream(host: str, port: int, last_event_id: str) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, port))
    sock.sendall(
        f"GET /v1/events/stream HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}"
        f"\r\nLast-Event-ID: {last_event_id}\r\n\r\n".encode()
    )
    return sock


async def stalled_run(db: Path, first: str, streams: int, seconds: float) -> float:
    """MiB this process grew by while ``streams`` streams read nothing (peak), on the
    archive ``db`` that another process wrote."""
    listen = f"127.0.0.1:{_port()}"
    config = Config.model_validate({"server": {"listen": listen, "token_env": "T"}})
    astore = AsyncStore(Store.open(db))
    ctx = WebContext(
        config=lambda: config, store=lambda: astore, metrics=Metrics(), auth=WebAuth(TOKEN)
    )
    async with anyio.create_task_group() as tg:
        host, port = await tg.start(health.serve, listen, create_app(ctx))
        before = _rss()
        socks = [_stalled_stream(host, port, first) for _ in range(streams)]
        peak = before
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await anyio.sleep(0.05)
            peak = max(peak, _rss())
        for sock in socks:
            sock.close()
        tg.cancel_scope.cancel()
    await astore.close()
    return (peak - before) / 2**20


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stalled", type=int, action="append", default=[])
    parser.add_argument("--big", type=int, default=300)
    parser.add_argument("--stalled-seconds", type=float, default=5.0)
    parser.add_argument("--stalled-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--first", help=argparse.SUPPRESS)
    args = parser.parse_args()
    relay_logging.configure("warning", "console")
    if args.stalled_child:
        grown = await stalled_run(args.db, args.first, args.stalled_child, args.stalled_seconds)
        print(grown)
        return
    with tempfile.TemporaryDirectory() as tmp:
        if args.stalled:
            db = Path(tmp) / "archive.db"
            first = build_archive(db, args.big)
            # Each measure in a fresh process: memory freed by one run would serve the next.
            grown: dict[int, list[float]] = {n: [] for n in args.stalled}
            for _rep in range(args.repeat):
                for n in args.stalled:
                    child = [sys.executable, __file__, "--stalled-child", str(n), "--db", str(db)]
                    child += ["--first", first, "--stalled-seconds", str(args.stalled_seconds)]
                    done = await anyio.run_process(child)
                    grown[n].append(float(done.stdout.split()[-1]))
            for n, values in grown.items():
                runs = ", ".join(f"{v:.0f}" for v in values)
                print(
                    f"{n} stalled stream(s) over {args.big} events of 100 KB: "
                    f"+{statistics.median(values):.0f} MiB (median; runs: {runs})",
                    flush=True,
                )
            return
        for rep in range(args.repeat):
            with_bell = await one_run(Path(tmp), args.backlog, args.samples, True)
            poll_only = await one_run(Path(tmp), args.backlog, args.samples, False)
            print(
                f"rep {rep + 1}: catch-up {with_bell['catchup_events_per_s']:.0f} events/s; "
                f"live with the bell: median {with_bell['live_median_ms']:.1f} ms, "
                f"p95 {with_bell['live_p95_ms']:.1f} ms; store poll only: median "
                f"{poll_only['live_median_ms']:.0f} ms, p95 {poll_only['live_p95_ms']:.0f} ms",
                flush=True,
            )


if __name__ == "__main__":
    anyio.run(main)
