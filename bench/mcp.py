"""The MCP server (``/mcp``) measured with the official ``mcp`` client over a real loopback
socket.

* **wait latency**: the daemon's web app served in this process on a store in a temporary
  directory; a ``wait_for_session`` call is open (2026-07-28), then one event is archived
  straight into the store (as the poller does, ringing the bell): the time from the
  ingest's commit to the client holding the answer, ``--samples`` times (p50, p99);
* **notification latency**: the same with a ``subscriptions/listen`` stream on the
  session's resource: commit to the client's ``notifications/resources/updated``;
* **upstream while waiting**: the real daemon (the emulator upstream, each request counted;
  a poller that, once the session waits, asks nothing for an hour) with ``--waits``
  concurrent waits open for ``--hold`` seconds: the requests it sent upstream meanwhile.

    .venv/bin/python bench/mcp.py [--samples 100] [--waits 50] [--hold 5] [--repeat 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is named like the SDK's package: the repository, not bench/, comes first on the
# path (the tests' support is imported from it too).
sys.path[0] = str(Path(__file__).resolve().parent.parent)

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import anyio  # noqa: E402
import httpx2  # noqa: E402
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from tests.support.loopback import free_port  # noqa: E402
from tests.support.mcp_relay import QUIET, mcp_client, mcp_relay  # noqa: E402

from sessionhook.api.models import Session  # noqa: E402
from sessionhook.relay.config import Config  # noqa: E402
from sessionhook.relay.domain.events import make_event  # noqa: E402
from sessionhook.relay.store import AsyncStore, Ingest, Store  # noqa: E402
from sessionhook.relay.telemetry import logs as relay_logging  # noqa: E402
from sessionhook.relay.telemetry.metrics import Metrics  # noqa: E402
from sessionhook.relay.web import Bell, WebAuth, WebContext, create_app  # noqa: E402
from sessionhook.relay.web import server as health  # noqa: E402
from sessionhook.relay.web.mcp import McpService, session_uri  # noqa: E402

TOKEN = "bench-token-" + "b" * 32
SESSION = "sessions/1"


def _quantiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[round(0.99 * (len(ordered) - 1))]


async def latencies(directory: Path, samples: int) -> dict[str, float]:
    """Commit-to-answer of a wait and commit-to-notification of a subscription (ms)."""
    listen = f"127.0.0.1:{free_port()}"
    config = Config.model_validate({"server": {"listen": listen, "token_env": "T"}})
    astore = AsyncStore(Store.open(directory / f"bench-{time.monotonic_ns()}.db"))
    astore.store.ingest.upsert_session(
        Session.model_validate(
            {
                "name": SESSION,
                "id": "1",
                "title": "bench",
                "state": "IN_PROGRESS",
                "createTime": "2026-11-23T10:00:00Z",
                "updateTime": "2026-11-23T10:00:00Z",
            }
        ),
        baseline=False,
    )
    bell = Bell()
    ctx = WebContext(
        config=lambda: config,
        store=lambda: astore,
        metrics=Metrics(),
        auth=WebAuth(TOKEN),
        bell=bell,
    )
    app = create_app(ctx)
    service = next(s.__self__ for s in app.state.services if isinstance(s.__self__, McpService))
    count = 0

    async def archive() -> float:
        nonlocal count
        count += 1
        event = make_event(
            f"evt_{count:08d}",
            "activity.progress_updated",
            SESSION,
            None,
            "2026-11-23T10:00:00Z",
            {"i": count},
        )
        await astore.run(Ingest.ingest_session_events, SESSION, [event], False)
        committed = time.perf_counter()
        bell.ring()
        return committed

    waits: list[float] = []
    notes: list[float] = []
    async with anyio.create_task_group() as tg:
        await tg.start(health.serve, listen, app)
        async with httpx2.AsyncClient(
            headers={"authorization": f"Bearer {TOKEN}"}, timeout=httpx2.Timeout(30)
        ) as http:
            transport = streamable_http_client(f"http://{listen}/mcp", http_client=http)
            async with Client(transport, mode="2026-07-28", cache=None) as client:
                arguments = {
                    "session": SESSION,
                    "until": ["activity.progress_updated"],
                    "timeout_s": 30,
                }

                async def wait(answered: list[float], done: anyio.Event) -> None:
                    await client.call_tool("wait_for_session", arguments)
                    answered.append(time.perf_counter())
                    done.set()

                for _ in range(samples):
                    done = anyio.Event()
                    answered: list[float] = []
                    tg.start_soon(wait, answered, done)
                    # Open once the watcher holds it (no event to wait on for that).
                    while service.server is None or service.server.watcher.open_waits < 1:  # noqa: ASYNC110
                        await anyio.sleep(0.001)
                    await anyio.sleep(0.01)  # the wait's own start read done
                    committed = await archive()
                    await done.wait()
                    waits.append(answered[0] - committed)
                uri = session_uri(SESSION)
                async with client.listen(resource_subscriptions=[uri]) as sub:
                    for _ in range(samples):
                        await anyio.sleep(0.02)
                        committed = await archive()
                        await sub.__anext__()
                        notes.append(time.perf_counter() - committed)
        tg.cancel_scope.cancel()
    await astore.close()
    wait50, wait99 = _quantiles(waits)
    note50, note99 = _quantiles(notes)
    return {
        "wait_p50_ms": wait50 * 1000,
        "wait_p99_ms": wait99 * 1000,
        "notify_p50_ms": note50 * 1000,
        "notify_p99_ms": note99 * 1000,
    }


async def upstream_while_waiting(directory: Path, waits: int, hold: float) -> dict[str, float]:
    """Upstream requests the real daemon sent while ``waits`` waits were open ``hold`` s."""
    async with mcp_relay(directory, poll=QUIET) as relay, mcp_client(relay.listen) as client:
        created = await client.call_tool(
            "create_session", {"prompt": "bench", "require_plan_approval": True}
        )
        assert created.structured_content is not None, created.content
        name = created.structured_content["session"]["session"]
        await client.call_tool(
            "wait_for_session", {"session": name, "until": ["action_required"], "timeout_s": 30}
        )
        settle = {"session": name, "until": ["completed"], "timeout_s": 1}
        await client.call_tool("wait_for_session", settle)  # the poller's last reads done
        before = relay.upstream.requests
        arguments: dict[str, Any] = {"session": name, "until": ["completed"], "timeout_s": hold}
        async with anyio.create_task_group() as tg:
            for _ in range(waits):
                tg.start_soon(client.call_tool, "wait_for_session", arguments)
        return {"upstream_requests": float(relay.upstream.requests - before)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--waits", type=int, default=50)
    parser.add_argument("--hold", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    relay_logging.configure("warning", "console")
    runs: list[dict[str, float]] = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            run = anyio.run(latencies, Path(tmp), args.samples)
            (Path(tmp) / "daemon").mkdir()
            run.update(
                anyio.run(upstream_while_waiting, Path(tmp) / "daemon", args.waits, args.hold)
            )
        print("  ".join(f"{k}={v:.1f}" for k, v in run.items()), flush=True)
        runs.append(run)
    print("median of runs:")
    for key in runs[0]:
        print(f"  {key}: {statistics.median(r[key] for r in runs):.1f}")


if __name__ == "__main__":
    main()
