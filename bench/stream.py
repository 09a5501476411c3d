"""The event stream (``GET /v1/events/stream``) measured over a real loopback socket.

The daemon's web app is served by uvicorn in this process, on a store in a temporary
directory; events are archived straight into the store (as the poller does, ringing the
bell unless ``--no-bell``). Measured, each repetition:

* **catch-up**: ``--backlog`` events already archived, a consumer resumes with the
  Last-Event-ID of the first one: events per second until it has them all;
* **live latency**: one event archived every 50 ms, ``--samples`` times, while a consumer
  follows: the time from the ingest's commit to the consumer's parse of the message
  (median and p95), with the bell and, for comparison, with the store poll alone.

    .venv/bin/python bench/stream.py [--backlog 20000] [--samples 40] [--repeat 3]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import time
from pathlib import Path

import anyio
import httpx

from sessionhook.api.models import Session
from sessionhook.relay import health
from sessionhook.relay import logging as relay_logging
from sessionhook.relay.config import Config
from sessionhook.relay.events import make_event
from sessionhook.relay.metrics import Metrics
from sessionhook.relay.store import AsyncStore, Store
from sessionhook.relay.web import Bell, WebAuth, WebContext, create_app

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
        astore.store.upsert_session(Session.model_validate(raw), baseline=False)

    async def add(self, n: int) -> None:
        events = []
        for i in range(self.count, self.count + n):
            data = {"i": i, "text": "x" * 600}  # about the size of a progress update
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
        await self.astore.call(self.astore.store.ingest_session_events, SESSION, events, False)
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
        host, port = await tg.start(
            health.serve, listen, create_app(ctx, readiness=lambda: (True, []))
        )
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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    relay_logging.configure("warning", "console")
    with tempfile.TemporaryDirectory() as tmp:
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
