"""``sessionhook status --url``: the same report as ``status`` on the store, from a running
relay's ``GET /v1/status`` (the web app over a real store, on loopback), the token from
``$SESSIONHOOK_WEB_TOKEN``; every failure one line. The CLI runs as a subprocess."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest

from sessionhook.relay.ops import Overview
from sessionhook.relay.ops.wire import overview_from_json, status_json
from sessionhook.relay.store import (
    AsyncStore,
    EndpointSummary,
    HistoryProgress,
    RefusedRow,
    RefusedSummary,
    ReplicaRow,
    StatusSummary,
    UpstreamSummary,
)
from sessionhook.relay.web import create_app
from sessionhook.relay.web import server as health
from tests.support.backends import Backend, sqlite_only
from tests.support.loopback import free_port
from tests.support.store_rows import Ep, activity, ingest, ready
from tests.support.web_relay import TOKEN, web_context

pytestmark = pytest.mark.anyio

SESSIONHOOK = Path(sys.executable).parent / "sessionhook"


async def sessionhook(*args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
    if token is not None:
        env["SESSIONHOOK_WEB_TOKEN"] = token
    done = await anyio.run_process(
        [str(SESSIONHOOK), *args], env=env, check=False, stdin=subprocess.DEVNULL
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def _timeless(text: str) -> str:
    """``status`` text without what moves between two runs: ages (``3s``, ``2m``)."""
    return re.sub(r"\b\d+(s|m|h \d+m|d \d+h)\b", "AGE", text)


@sqlite_only
async def test_status_url_prints_what_status_prints_on_the_store(backend: Backend) -> None:
    seeded = backend.open()
    try:
        [first, second] = ready(seeded, Ep("ci"), Ep("chat", events=("session.*",)), sessions=2)
        ingest(seeded, first, [activity(1, i) for i in range(3)])
        ingest(seeded, second, [activity(2, 7)])
        seeded.economy.mark_poll(True, time.time() - 30)
        seeded.economy.mark_poll(False, time.time() - 5)
    finally:
        seeded.close()
    assert isinstance(backend.target, Path)
    listen = f"127.0.0.1:{free_port()}"
    astore = AsyncStore(backend.open())
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(health.serve, listen, create_app(web_context(astore, listen)))
            url = f"http://{listen}"
            local = await sessionhook("status", "--db", str(backend.target))
            remote = await sessionhook("status", "--url", url)
            remote_json = await sessionhook("status", "--url", url, "--json")
            async with httpx.AsyncClient() as http:
                answer = await http.get(
                    f"{url}/v1/status", headers={"authorization": f"Bearer {TOKEN}"}
                )
            wrong = await sessionhook("status", "--url", url, token="not-the-token")
            none = await sessionhook("status", "--url", url, token=None)
            both = await sessionhook("status", "--url", url, "--db", str(backend.target))
            tg.cancel_scope.cancel()
    finally:
        await astore.close()
    assert local.returncode == remote.returncode == 0, (local.stderr, remote.stderr)
    assert re.search(r"^ci +enabled +4 ", local.stdout, re.M), local.stdout
    assert "2 sessions, 4 activities, 4 events" in local.stdout, local.stdout
    assert _timeless(remote.stdout) == _timeless(local.stdout)
    printed, answered = json.loads(remote_json.stdout), answer.json()
    for data in (printed, answered):  # what moves between the two calls
        del data["now"]
        for endpoint in data["endpoints"]:
            del endpoint["oldest_pending_age"]
    assert printed == answered and printed["sessions"] == 2
    # Failures: one line each, no traceback.
    assert wrong.returncode == 1
    assert wrong.stderr.startswith(f"error: {url}/v1/status: 401 ")
    assert "$SESSIONHOOK_WEB_TOKEN" in wrong.stderr and len(wrong.stderr.splitlines()) == 1
    assert none.returncode == 1 and none.stderr.startswith("error: --url needs the relay's token")
    assert both.returncode == 2 and "--config and --db read a store" in both.stderr


async def test_status_url_of_a_relay_out_of_reach_is_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = await sessionhook("status", "--url", url)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"error: {url}/v1/status: ConnectError")
    assert len(done.stderr.splitlines()) == 1


def test_the_json_of_status_reads_back_into_the_same_overview() -> None:
    """Every part of ``status``, the rare ones too (a last error, refused activities,
    replicas), survives ``status_json`` -> JSON -> ``overview_from_json``; fields a newer
    relay adds are ignored."""
    now = 1_764_150_000.25
    endpoint = EndpointSummary(
        "ci",
        "https://x",
        True,
        False,
        "410 Gone",
        3,
        61.5,
        1,
        2,
        3,
        4,
        "HTTP 500",
        now - 9,
        now - 99,
        now - 999,
    )
    upstream = UpstreamSummary(now - 1, now - 2, 120, 3, 4, 1, 1)
    latest = RefusedRow(
        "sessions/1",
        "sessions/1/activities/a",
        "2026-11-26T10:00:00Z",
        "too_large",
        "1 MB",
        1_000_000,
        now - 50,
        now - 40,
        2,
    )
    refused = RefusedSummary(2, {"too_large": 2}, 1, latest)
    summary = StatusSummary(now, (endpoint,), upstream, 5, 6, 7, True, refused)
    replica = ReplicaRow("3f2a", "db1", 812, now - 100, now - 2, 15.0, None, 4, 1, ("poller",))
    overview = Overview(summary, HistoryProgress(10, 4, 0.5), {"default": 5}, (replica,))
    data = json.loads(json.dumps(status_json(overview, now)))
    data["endpoints"][0]["added_later"] = "by a newer relay"
    assert overview_from_json(data) == overview
