"""Delivery latency and upstream economy of the relay, measured end to end on loopback.

Runs the emulator (uvicorn, in this process), a verifying consumer (tests/support/receiver.py,
checked with the Standard Webhooks reference package) and ``sessionhook run`` as a separate
process, exactly as a user would. Sessions are created at a steady pace over the first half
of the run; the emulated agent emits one activity per ``--step-delay``.

Measured:

* **delivery latency** of each activity: the consumer's arrival time minus the activity's
  ``createTime`` (both the local clock: the emulator runs here). Median and p90.
* **upstream requests per delivered activity**: every request the relay sent to the
  emulator (counted at the emulator; the bench's own calls are excluded) divided by the
  distinct activities delivered.

    .venv/bin/python bench/latency.py [--sessions 6] [--duration 40] [--active-interval 0.3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from sessionhook.api.client import AUTO_CREATE_PR, SessionsClient
from sessionhook.api.models import parse_timestamp
from sessionhook.emulator.app import create_app
from sessionhook.relay.domain.signing import generate_secret
from sessionhook.relay.telemetry import logs as relay_logging
from sessionhook.relay.web.server import serve

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the consumer of the tests, tests/support/receiver.py
from tests.support.receiver import Receiver  # noqa: E402

API_KEY = "bench-key"
#: Header marking the bench's own calls, which are not the relay's cost.
BENCH_HEADER = "x-bench"


class CountingApp:
    """ASGI middleware counting the relay's requests to the emulator by path kind."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        self.counts: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if BENCH_HEADER.encode() not in headers:
                path: str = scope["path"]
                kind = (
                    "activities"
                    if path.endswith("/activities")
                    else ("list_sessions" if path.endswith("/sessions") else "get_session")
                )
                self.counts[kind] += 1
        await self._app(scope, receive, send)


def _config(tmp: Path, base_url: str, hook_url: str, secret: str, args: argparse.Namespace) -> Path:
    key = tmp / "api_key"
    key.write_text(API_KEY)
    key.chmod(0o600)  # a secret file others can read is refused
    path = tmp / "config.toml"
    path.write_text(
        "\n".join(
            [
                "[api]",
                f'base_url = "{base_url}"',
                f'api_key_file = "{key}"',
                f"requests_per_minute = {args.rpm}",
                "[store]",
                f'path = "{tmp / "bench.db"}"',
                "[poll]",
                f"active_interval = {args.active_interval}",
                f"idle_interval = {args.idle_interval}",
                f"discovery_interval = {args.discovery_interval}",
                "backfill = true",
                "[delivery]",
                "allow_private_networks = true",
                "[[endpoints]]",
                'name = "bench"',
                f'url = "{hook_url}"',
                f'secret = "{secret}"',
                "[log]",
                'level = "warning"',
                'format = "json"',
                "",
            ]
        )
    )
    return path


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run one measurement; return the figures."""
    secret = generate_secret()
    receiver = Receiver(secret)
    emulator = CountingApp(create_app(api_keys=(API_KEY,), step_delay=args.step_delay, seed=1))
    with tempfile.TemporaryDirectory(prefix="sessionhook-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        async with anyio.create_task_group() as tg:
            _, emu_port = await tg.start(serve, "127.0.0.1:0", emulator)
            _, rx_port = await tg.start(serve, "127.0.0.1:0", receiver.app)
            base_url = f"http://127.0.0.1:{emu_port}"
            config = _config(tmp, base_url, f"http://127.0.0.1:{rx_port}/hook", secret, args)
            log = (tmp / "relay.log").open("wb")
            relay = await anyio.open_process(
                [sys.executable, "-m", "sessionhook.cli", "run", "--config", str(config)],
                stdout=subprocess.DEVNULL,
                stderr=log,
                env={k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"},
            )
            started = time.monotonic()
            try:
                async with httpx.AsyncClient(headers={BENCH_HEADER: "1"}) as http:
                    api = SessionsClient(http, base_url=base_url, api_key=API_KEY)
                    source = (await api.list_sources()).sources[0].name
                    pace = args.duration / 2 / max(1, args.sessions)
                    for i in range(args.sessions):
                        await api.create_session(
                            f"Bench task {i}",
                            source=source,
                            automation_mode=AUTO_CREATE_PR if i % 2 else None,
                        )
                        await anyio.sleep(pace)
                    # Until every activity upstream was delivered, or the time is up.
                    with anyio.move_on_after(
                        max(0.0, args.duration - (time.monotonic() - started))
                    ):
                        while True:
                            states = {s.state async for s in api.iter_sessions()}
                            done = states <= {"COMPLETED", "FAILED"}
                            if done and await _upstream_names(api) <= _delivered_names(receiver):
                                break
                            await anyio.sleep(1.0)
                    upstream = await _upstream_names(api)
            finally:
                relay.send_signal(signal.SIGTERM)
                with anyio.fail_after(20):
                    code = await relay.wait()
                log.close()
                tg.cancel_scope.cancel()
        elapsed = time.monotonic() - started
    latencies = []
    for arrival in receiver.first_deliveries():
        activity = arrival.body["data"].get("activity")
        if activity is not None:
            created = parse_timestamp(activity["createTime"]).timestamp()
            latencies.append(arrival.arrived_at - created)
    requests = sum(emulator.counts.values())
    return {
        "sessions": args.sessions,
        "active_interval": args.active_interval,
        "step_delay": args.step_delay,
        "seconds": round(elapsed, 1),
        "activities_delivered": len(latencies),
        "activities_upstream": len(upstream),
        "latency_p50_s": round(statistics.median(latencies), 3) if latencies else None,
        "latency_p90_s": round(_percentile(latencies, 0.9), 3) if latencies else None,
        "latency_max_s": round(max(latencies), 3) if latencies else None,
        "upstream_requests": requests,
        "upstream_by_kind": dict(emulator.counts),
        "requests_per_activity": round(requests / len(latencies), 2) if latencies else None,
        "bad_signatures": len(receiver.rejected),
        "relay_exit_status": code,
    }


async def _upstream_names(api: SessionsClient) -> set[str]:
    names: set[str] = set()
    async for session in api.iter_sessions():
        names |= {a.name async for a in api.iter_activities(session.name)}
    return names


def _delivered_names(receiver: Receiver) -> set[str]:
    return {
        a.body["data"]["activity"]["name"]
        for a in receiver.first_deliveries()
        if "activity" in a.body["data"]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--duration", type=float, default=40.0, help="upper bound, seconds")
    parser.add_argument("--active-interval", type=float, default=0.3)
    parser.add_argument("--idle-interval", type=float, default=5.0)
    parser.add_argument("--discovery-interval", type=float, default=2.0)
    parser.add_argument("--step-delay", type=float, default=0.5)
    parser.add_argument("--rpm", type=int, default=6000, help="api.requests_per_minute")
    args = parser.parse_args()
    relay_logging.configure("warning", "console")  # stdout is for the figures
    result = anyio.run(bench, args, backend="asyncio")
    print(json.dumps(result, indent=2))
    print(
        f"p50 delivery latency {result['latency_p50_s']} s (p90 {result['latency_p90_s']} s) "
        f"at active_interval = {args.active_interval}; "
        f"{result['requests_per_activity']} upstream requests per delivered activity "
        f"({result['upstream_requests']} requests, {result['activities_delivered']} activities)"
    )


if __name__ == "__main__":
    main()
