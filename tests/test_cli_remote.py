"""The operator commands with ``--url``: the same output as on the store (``status``,
``deliveries``, ``attempts``, ``deliveries retry|recover``, ...), from a running relay's
``/v1/`` routes (the web app over a real store, on loopback), the token from
``$SESSIONHOOK_WEB_TOKEN``; every failure one line. The CLI runs as a subprocess, forked
from a warm interpreter (tests/support/forked_cli.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from click.testing import CliRunner

from sessionhook.cli import cli
from sessionhook.cli._output import Runtime
from sessionhook.relay.domain.api_models import ApiStatus
from sessionhook.relay.domain.retry import Dead, Delivered, Retry
from sessionhook.relay.domain.rows import (
    EndpointSummary,
    HistoryProgress,
    RefusedRow,
    RefusedSummary,
    ReplicaRow,
    StatusSummary,
    UpstreamSummary,
)
from sessionhook.relay.ops import Overview
from sessionhook.relay.ops.wire import status_answer
from sessionhook.relay.store import AsyncStore
from sessionhook.relay.web import create_app
from sessionhook.relay.web import server as health
from tests.support import forked_cli
from tests.support.backends import Backend, sqlite_only
from tests.support.loopback import free_port
from tests.support.requeue_rows import ACT0, failure, fill
from tests.support.store_rows import Ep, activity, ingest, ready
from tests.support.web_relay import TOKEN, web_context

pytestmark = [pytest.mark.process, pytest.mark.anyio]


async def sessionhook(
    *args: str, token: str | None = TOKEN, **more_env: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
    env.update(more_env)
    if token is not None:
        env["SESSIONHOOK_WEB_TOKEN"] = token
    return await anyio.to_thread.run_sync(lambda: forked_cli.run(*args, env=env))


@asynccontextmanager
async def served(backend: Backend) -> AsyncIterator[str]:
    """The relay's web app over ``backend``'s store on a loopback port: its URL."""
    listen = f"127.0.0.1:{free_port()}"
    astore = AsyncStore(backend.open())
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(health.serve, listen, create_app(web_context(astore, listen)))
            yield f"http://{listen}"
            tg.cancel_scope.cancel()
    finally:
        await astore.close()


def _stampless(text: str) -> str:
    """Output without its moments (``2026-11-26T20:27:33.506411Z``: when it is due now)."""
    return re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+Z", "STAMP", text)


def _timeless(text: str) -> str:
    """``status`` text without what moves between two runs: ages (``3s``, ``2m``), and the
    padding of the table's columns, whose width follows them (``9s`` then ``10s``)."""
    return re.sub(r" {2,}", "  ", re.sub(r"\b\d+(s|m|h \d+m|d \d+h)\b", "AGE", text))


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


@sqlite_only
async def test_token_file_reads_the_token_from_a_private_file_only(
    backend: Backend, tmp_path: Path
) -> None:
    """``--token-file``: the token read from a file (kept out of the process list), for
    every ``--url`` command; a file others can read, a missing one, or both ``--token``
    and ``--token-file`` are one line each, with the token never printed."""
    private, shared = tmp_path / "web.token", tmp_path / "shared.token"
    for path, mode in ((private, 0o600), (shared, 0o644)):
        path.write_text(TOKEN + "\n")
        path.chmod(mode)
    async with served(backend) as url:
        ok = await sessionhook("status", "--url", url, "--token-file", str(private), token=None)
        # A file beats the environment's token (a wrong one here).
        over_env = await sessionhook(
            "deliveries", "--url", url, "--token-file", str(private), token="not-the-token"
        )
        listed = await sessionhook(
            "events", "--url", url, "--token-file", str(private), "--format", "json", token=None
        )
        exposed = await sessionhook("status", "--url", url, "--token-file", str(shared), token=None)
        missing = await sessionhook(
            "status", "--url", url, "--token-file", str(tmp_path / "nope"), token=None
        )
        both = await sessionhook(
            "status", "--url", url, "--token", TOKEN, "--token-file", str(private), token=None
        )
        both_at_group = await sessionhook(
            "deliveries",
            "--url",
            url,
            "--token",
            TOKEN,
            "--token-file",
            str(private),
            "retry",
            "1",
            token=None,
        )
        forwarding = await sessionhook(
            "listen",
            "--url",
            url,
            "--forward-to",
            "ftp://x",
            "--token-file",
            str(shared),
            token=None,
        )
    assert ok.returncode == 0, ok.stderr
    assert over_env.returncode == 0, over_env.stderr
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
    for done in (exposed, missing, forwarding):
        assert done.returncode == 1, done.stderr
        [line] = done.stderr.splitlines()
        assert line.startswith("error: --token-file: "), line
        assert TOKEN not in done.stderr + done.stdout
    assert "other users" in exposed.stderr and "chmod 600" in exposed.stderr
    assert "cannot read" in missing.stderr
    for done in (both, both_at_group):
        assert done.returncode == 2 and "--token and --token-file" in done.stderr


async def test_status_url_of_a_relay_out_of_reach_is_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = await sessionhook("status", "--url", url)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"error: {url}/v1/status: ConnectError")
    assert len(done.stderr.splitlines()) == 1


def test_the_json_of_status_reads_back_into_the_same_overview() -> None:
    """Every part of ``status``, the rare ones too (a last error, refused activities,
    replicas), survives ``status_answer`` -> JSON -> ``ApiStatus``; fields a newer relay
    adds are ignored."""
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
    answer = status_answer(overview, now)
    data = json.loads(answer.model_dump_json())
    data["endpoints"][0]["added_later"] = "by a newer relay"
    read = ApiStatus.model_validate_json(json.dumps(data))
    assert read == answer and read.model_dump_json() == answer.model_dump_json()
    assert (read.now, read.replicas[0].leases, read.refused.latest) == (
        now,
        ["poller"],
        answer.refused.latest,
    )


def _seed(backend: Backend) -> None:
    """Two endpoints, two sessions of three activities: of ci-bot, s0's first delivery
    dead, its second failed (a retry later), s1's first delivered."""
    store = backend.open()
    try:
        store.endpoints.sync_endpoints([Ep("ci-bot"), Ep("chat", events=("activity.*",))])
        fill(store, 2, 3)
        rows = sorted(
            store.operator.list_deliveries(endpoint="ci-bot", limit=100), key=lambda d: d.id
        )
        s0 = [d for d in rows if d.session_name == "sessions/s0"]
        s1 = [d for d in rows if d.session_name == "sessions/s1"]
        store.outbox.record_attempt(s0[0].id, failure(ACT0), Dead())
        store.outbox.record_attempt(s0[1].id, failure(ACT0 + 1, None), Retry(time.time() + 600))
        store.outbox.record_attempt(s1[0].id, failure(ACT0 + 2, 200), Delivered())
    finally:
        store.close()


def _twin(backend: Backend, request: pytest.FixtureRequest) -> Backend:
    """A second SQLite store seeded as ``backend`` (both seeded here)."""
    twin = backend.another(request)
    for b in (backend, twin):
        b.target.parent.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
        _seed(b)
    return twin


def _first(backend: Backend, status: str) -> tuple[int, str]:
    """The id and event id of the oldest ci-bot delivery of ``status``."""
    store = backend.open_readonly()
    try:
        rows = store.operator.list_deliveries(endpoint="ci-bot", status=status, limit=100)
    finally:
        store.close()
    row = min(rows, key=lambda d: d.id)
    return row.id, row.event_id


@sqlite_only
async def test_deliveries_and_attempts_url_print_what_they_print_on_the_store(
    backend: Backend,
) -> None:
    _seed(backend)
    dead, event = _first(backend, "dead")
    db = ["--db", str(backend.target)]
    commands = [
        ["deliveries"],
        ["deliveries", "--endpoint", "ci-bot"],
        ["deliveries", "--status", "dead"],
        ["deliveries", "--session", "sessions/s1", "--limit", "2"],
        ["deliveries", "--status", "delivered", "--endpoint", "chat"],  # none match
        ["attempts", str(dead)],
        ["attempts", f"#{dead}"],
        ["attempts", event],
    ]
    failing = [
        ["deliveries", "--endpoint", "nope"],  # exit 2, as a typo locally
        ["attempts", "999999"],
        ["attempts", "evt_nope"],
    ]
    async with served(backend) as url:
        pairs = []
        for args in [*commands, *[[*c, "--json"] for c in commands], *failing]:
            local = await sessionhook(*args, *db)
            remote = await sessionhook(*args, "--url", url)
            pairs.append((args, local, remote))
    for args, local, remote in pairs[: 2 * len(commands)]:
        assert local.returncode == remote.returncode == 0, (args, local.stderr, remote.stderr)
        assert local.stdout.strip(), args
        assert _timeless(remote.stdout) == _timeless(local.stdout), args
    shown = {tuple(a): local.stdout for a, local, _ in pairs}
    assert "dead" in shown[("deliveries", "--status", "dead")]
    assert shown[("deliveries", "--status", "delivered", "--endpoint", "chat")].startswith(
        "no deliveries match"
    )
    assert "response:     down" in shown[("attempts", str(dead))]
    assert len(json.loads(shown[("deliveries", "--json")])) == 12
    for args, local, remote in pairs[2 * len(commands) :]:
        assert local.returncode == remote.returncode != 0, (args, local.stderr, remote.stderr)
        assert len(remote.stderr.splitlines()) == 1, (args, remote.stderr)
        # The relay's message is the store's (the local hint after " — " aside).
        assert local.stderr.split(" — ")[0].strip() in remote.stderr, (args, remote.stderr)
    assert pairs[-3][2].returncode == 2


@sqlite_only
async def test_retry_and_recover_url_do_and_print_what_they_do_on_the_store(
    backend: Backend, request: pytest.FixtureRequest
) -> None:
    """The same commands on two stores seeded alike: one through --db, one through the
    relay; the same lines, and the relay's store changed as the local one."""
    twin = _twin(backend, request)
    dead, _ = _first(backend, "dead")
    failed, _ = _first(backend, "failed")
    assert (dead, failed) == (_first(twin, "dead")[0], _first(twin, "failed")[0])
    delivered, _ = _first(backend, "delivered")
    steps = [
        ["deliveries", "retry", str(dead)],
        ["deliveries", "retry", str(dead), "--json"],  # pending now: nothing to do
        ["deliveries", "recover", "--endpoint", "ci-bot", "--since", "3650d"],
        ["deliveries", "recover", "--endpoint", "ci-bot", "--since", "3650d", "--json"],
    ]
    failing = [
        ["deliveries", "retry", str(delivered)],  # 409 over the API, exit 1
        ["deliveries", "retry", "999999"],
        ["deliveries", "recover", "--endpoint", "nope", "--since", "1h"],  # exit 2
    ]
    async with served(twin) as url:
        pairs = []
        for args in [*steps, *failing]:
            local = await sessionhook(*args, "--db", str(backend.target))
            remote = await sessionhook(*args, "--url", url)
            pairs.append((args, local, remote))
        after_local = await sessionhook("deliveries", "--db", str(backend.target))
        after_remote = await sessionhook("deliveries", "--url", url)
    for args, local, remote in pairs[: len(steps)]:
        assert local.returncode == remote.returncode == 0, (args, local.stderr, remote.stderr)
        assert _stampless(remote.stdout) == _stampless(local.stdout), args
        assert remote.stdout.strip(), args
    assert f"{dead}" in pairs[0][1].stdout
    assert pairs[2][2].stdout.startswith("recovered 1 "), pairs[2][2].stdout  # the failed one
    assert json.loads(pairs[3][2].stdout)["recovered"] == 0  # nothing failed any more
    for args, local, remote in pairs[len(steps) :]:
        assert local.returncode == remote.returncode != 0, (args, local.stderr, remote.stderr)
        assert len(remote.stderr.splitlines()) == 1, (args, remote.stderr)
        assert local.stderr.split(" — ")[0].strip() in remote.stderr, (args, remote.stderr)
    assert pairs[-1][2].returncode == 2
    assert _timeless(after_remote.stdout) == _timeless(after_local.stdout)
    assert "dead" not in after_remote.stdout.split("LAST ERROR")[1].split()


async def test_every_url_command_is_one_line_when_the_relay_is_out_of_reach() -> None:
    """Also ``endpoints create --relay-url`` (below): never a traceback."""
    url = f"http://127.0.0.1:{free_port()}"
    for args in (
        ["deliveries"],
        ["attempts", "1"],
        ["deliveries", "retry", "1"],
        ["deliveries", "recover", "--endpoint", "ci-bot", "--since", "1h"],
        ["events"],
        ["replay", "--endpoint", "ci-bot", "--event", "evt_1"],
        ["endpoints", "list"],
        ["endpoints", "enable", "ci-bot"],
        ["endpoints", "disable", "ci-bot"],
        ["endpoints", "test", "ci-bot"],
        ["endpoints", "delete", "ci-bot"],
        ["endpoints", "rotate-secret", "ci-bot"],
    ):
        done = await sessionhook(*args, "--url", url)
        assert done.returncode == 1, (args, done.stderr)
        assert done.stderr.startswith(f"error: {url}/v1/") and "ConnectError" in done.stderr
        assert len(done.stderr.splitlines()) == 1, (args, done.stderr)
        wrong = await sessionhook(*args, "--url", url, token=None)
        assert wrong.stderr.startswith("error: --url needs the relay's token"), args
    create = ["endpoints", "create", "x", "--url", "https://hooks.example.com/x"]
    done = await sessionhook(*create, "--relay-url", url)
    assert done.returncode == 1 and done.stderr.startswith(f"error: {url}/v1/endpoints: ")
    assert len(done.stderr.splitlines()) == 1, done.stderr


@sqlite_only
async def test_endpoints_url_list_disable_enable_as_on_the_store(
    backend: Backend, request: pytest.FixtureRequest
) -> None:
    twin = _twin(backend, request)
    steps = [
        ["endpoints", "list"],
        ["endpoints", "list", "--json"],
        ["endpoints", "disable", "ci-bot", "--reason", "fixing its URL"],
        ["endpoints", "list"],
        ["endpoints", "enable", "ci-bot"],
        ["endpoints", "list", "--json"],
    ]
    failing = [
        ["endpoints", "enable", "nope"],  # exit 2, a typo
        ["endpoints", "disable", "nope"],
    ]
    async with served(twin) as url:
        pairs = []
        for args in [*steps, *failing]:
            local = await sessionhook(*args, "--db", str(backend.target))
            remote = await sessionhook(*args, "--url", url)
            pairs.append((args, local, remote))
        untested = await sessionhook("endpoints", "test", "ci-bot", "--url", url)
    for args, local, remote in pairs[: len(steps)]:
        assert local.returncode == remote.returncode == 0, (args, local.stderr, remote.stderr)
        # Two stores seeded alike: only their moments differ (created_at).
        assert _stampless(_timeless(remote.stdout)) == _stampless(_timeless(local.stdout)), args
        assert remote.stdout.strip(), args
    assert re.search(r"^ci-bot +disabled .*fixing its URL", pairs[3][2].stdout, re.M)
    assert pairs[4][2].stdout.startswith("endpoint ci-bot enabled; ")
    assert {e["name"] for e in json.loads(pairs[5][2].stdout)} == {"chat", "ci-bot"}
    for args, local, remote in pairs[len(steps) :]:
        assert local.returncode == remote.returncode == 2, (args, local.stderr, remote.stderr)
        assert len(remote.stderr.splitlines()) == 1, (args, remote.stderr)
        assert remote.stderr.strip() == local.stderr.strip().split(" — ")[0], args
    # This relay has no sender of test events: its 503, one line.
    assert untested.returncode == 1 and len(untested.stderr.splitlines()) == 1
    assert untested.stderr.startswith(f"error: {url}/v1/endpoints/ci-bot:test: 503 ")


@sqlite_only
async def test_endpoints_url_create_update_rotate_delete_as_on_the_store(
    backend: Backend, request: pytest.FixtureRequest
) -> None:
    """``create`` and ``update`` take ``--relay-url`` (their ``--url`` is the endpoint's)."""
    twin = _twin(backend, request)
    chosen, rotated = "whsec_" + "A" * 43 + "=", "whsec_" + "B" * 43 + "="
    steps = [
        (["create", "mine", "--url", "https://hooks.example.com/mine", "--secret-env", "S1"]),
        (["update", "mine", "--event", "session.*", "--description", "CI", "--json"]),
        (["update", "mine", "--unset", "events"]),
        (["rotate-secret", "mine", "--overlap", "2h", "--secret-env", "S2"]),
        (["list"]),
        (["delete", "mine", "--json"]),
        (["create", "mine", "--url", "https://hooks.example.com/mine", "--secret-env", "S1"]),
        (["delete", "mine"]),
    ]
    failing = [
        ["update", "ci-bot", "--url", "https://hooks.example.com/y"],  # not created here
        ["delete", "nope"],
        ["create", "meta", "--url", "http://169.254.169.254/latest"],  # refused address
    ]
    env = {"S1": chosen, "S2": rotated}
    async with served(twin) as url:
        pairs = []
        for args in [*steps, *failing]:
            flag = "--relay-url" if args[0] in ("create", "update") else "--url"
            local = await sessionhook("endpoints", *args, "--db", str(backend.target), **env)
            remote = await sessionhook("endpoints", *args, flag, url, **env)
            pairs.append((args, local, remote))
    for args, local, remote in pairs[: len(steps)]:
        assert local.returncode == remote.returncode == 0, (args, local.stderr, remote.stderr)
        assert _stampless(_timeless(remote.stdout)) == _stampless(_timeless(local.stdout)), args
        assert remote.stdout.strip(), args
    assert pairs[0][2].stdout == f"endpoint mine created\nsecret (shown once, keep it): {chosen}\n"
    assert json.loads(pairs[1][2].stdout)["description"] == "CI"
    assert rotated in pairs[3][2].stdout
    assert re.search(r"^mine +enabled ", pairs[4][2].stdout, re.M)
    assert json.loads(pairs[5][2].stdout) == {
        "name": "mine",
        "deleted": True,
        "deliveries_closed": 0,
    }
    for args, local, remote in pairs[len(steps) :]:
        assert local.returncode == remote.returncode != 0, (args, local.stderr, remote.stderr)
        assert len(remote.stderr.splitlines()) == 1, (args, remote.stderr)
        assert local.stderr.split(" — ")[0].strip() in remote.stderr, (args, remote.stderr)


@sqlite_only
async def test_events_and_replay_url_as_on_the_store(
    backend: Backend, request: pytest.FixtureRequest
) -> None:
    twin = _twin(backend, request)
    _, first = _first(backend, "dead")
    _, second = _first(backend, "delivered")
    reads = [
        ["events"],
        ["events", "--type", "activity.*"],
        ["events", "--type", "session.*", "--type", "activity.*", "--limit", "4"],
        ["events", "--session", "sessions/s1", "--format", "json"],
        ["events", "--limit", "3", "--format", "ndjson"],
        ["events", "--type", "session.*"],  # none
    ]
    writes = [
        ["replay", "--endpoint", "ci-bot", "--event", first, "--event", second],
        ["endpoints", "disable", "chat"],
        ["replay", "--endpoint", "chat", "--event", first],
    ]
    failing = [
        ["replay", "--endpoint", "nope", "--event", first],  # exit 2
        ["replay", "--endpoint", "ci-bot", "--event", "evt_nope"],
    ]
    async with served(twin) as url:
        pairs = []
        for args in [*reads, *writes, *failing]:
            local = await sessionhook(*args, "--db", str(backend.target))
            remote = await sessionhook(*args, "--url", url)
            pairs.append((args, local, remote))
        refused = [
            await sessionhook(*args, "--url", url)
            for args in (
                ["events", "--since", "1h"],
                ["replay", "--endpoint", "ci-bot", "--since", "1h"],
                ["replay", "--endpoint", "ci-bot", "--event", first, "--session", "sessions/s0"],
            )
        ]
    ok = len(reads) + len(writes)
    for args, local, remote in pairs[:ok]:
        assert local.returncode == remote.returncode == 0, (args, local.stderr, remote.stderr)
        assert _stampless(remote.stdout) == _stampless(local.stdout), args
        assert remote.stderr == local.stderr, args
        assert remote.stdout.strip(), args
    assert len(json.loads(pairs[3][2].stdout)) == 3
    assert pairs[5][2].stdout.startswith("no events match")
    assert pairs[len(reads)][2].stdout.startswith("queued 2 deliveries to ci-bot")
    assert "is disabled" in pairs[ok - 1][2].stderr
    for args, local, remote in pairs[ok:]:
        assert local.returncode == remote.returncode != 0, (args, local.stderr, remote.stderr)
        assert len(remote.stderr.splitlines()) == 1, (args, remote.stderr)
        assert local.stderr.split(" — ")[0].strip() in remote.stderr, (args, remote.stderr)
    assert pairs[ok][2].returncode == 2
    for done, option in zip(refused, ("--since", "--since", "--session"), strict=True):
        assert done.returncode == 2 and f"{option} is not available with --url" in done.stderr


#: Answers of a relay that is not one (or a broken one): 200 with a body that is not JSON,
#: not an object, an empty object, or every field a command reads of another type.
HOSTILE = (
    b"<html>surprise</html>",
    b"[1, 2]",
    b"{}",
    json.dumps(
        {
            key: {"id": "x"}
            for key in (
                "now",
                "deliveries",
                "delivery",
                "attempts",
                "events",
                "event",
                "endpoints",
                "pending",
                "secret",
                "queued",
                "message",
                "url",
                "status_code",
                "deliveries_closed",
            )
        }
    ).encode(),
)

#: Every command that reads a relay's answers (``create`` and ``update`` take --relay-url).
URL_COMMANDS = (
    ["status"],
    ["status", "--json"],
    ["deliveries"],
    ["deliveries", "--json"],
    ["attempts", "1"],
    ["attempts", "evt_1", "--json"],
    ["deliveries", "retry", "1"],
    ["deliveries", "recover", "--endpoint", "ci-bot", "--since", "1h"],
    ["events"],
    ["events", "--format", "ndjson"],
    ["replay", "--endpoint", "ci-bot", "--event", "evt_1"],
    ["endpoints", "list"],
    ["endpoints", "enable", "ci-bot"],
    ["endpoints", "disable", "ci-bot"],
    ["endpoints", "test", "ci-bot"],
    ["endpoints", "delete", "ci-bot"],
    ["endpoints", "rotate-secret", "ci-bot"],
    ["endpoints", "create", "x", "--url", "https://hooks.example.com/x", "--relay-url"],
    ["endpoints", "update", "x", "--event", "session.*", "--relay-url"],
)


def test_an_answer_of_another_shape_is_one_line_for_every_url_command() -> None:
    """A relay answering 200 with what no model reads: one line naming the URL, exit 1,
    no traceback, nothing printed as if it were an answer."""
    relay = "http://relay.test"
    for body in HOSTILE:

        def answer(request: httpx.Request, body: bytes = body) -> httpx.Response:
            return httpx.Response(200, content=body, headers={"content-type": "application/json"})

        runtime = Runtime(transport=httpx.MockTransport(answer))
        for command in URL_COMMANDS:
            args = [*command, relay] if command[-1] == "--relay-url" else [*command, "--url", relay]
            result = CliRunner().invoke(
                cli, args, obj=runtime, env={"SESSIONHOOK_WEB_TOKEN": TOKEN}
            )
            shown = (command, body[:20], result.output)
            assert result.exit_code == 1 and not isinstance(result.exception, Exception), shown
            assert result.stdout == "", shown
            lines = result.stderr.splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"error: {relay}/v1/"), shown
            assert "not JSON" in lines[0] or "unknown shape" in lines[0], shown
