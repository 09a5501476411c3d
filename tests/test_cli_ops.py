"""The operator's commands, through click's CliRunner, against a store filled by a REAL run.

The module fixture serves the emulator and four webhook consumers (``tests/support/receiver.py``,
which checks every signature with the Standard Webhooks reference package) on loopback
sockets, creates sessions, lets the emulated agent finish them, and runs
``sessionhook run --config FILE --once`` in a subprocess, exactly as an operator would.
The consumers behave differently, so the store holds every kind of row:

* ``ci`` accepts everything (delivered);
* ``flaky`` refuses each event's first attempt with 503 and ``Retry-After: 3600`` (failed,
  a retry scheduled in an hour; the session's later events wait behind it: pending);
* ``broken`` answers 500 always; with ``retry_delays = [0]`` each delivery is dead after two
  attempts (dead letters);
* ``gone`` answers 410: the relay disables it and its deliveries stay pending.

Read commands run against the daemon's own store (found through ``--config``); write
commands against a copy (``--db``, or a config naming a copied database), so that the tests
stay independent of one another. The module runs twice: the daemon and the commands on a
SQLite file, then on a PostgreSQL database of the session's cluster (``tests/support/pg.py``; a
copy is ``CREATE DATABASE ... TEMPLATE`` of the run's database).
"""

from __future__ import annotations

import io
import json
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from click.testing import CliRunner, Result

from sessionhook.cli import cli, ops
from sessionhook.emulator.app import create_app as create_emulator
from sessionhook.relay import ops as operator
from sessionhook.relay.domain.signing import decode_secret, generate_secret
from sessionhook.relay.ops import PING_TYPE, ping_event
from sessionhook.relay.ops.wire import parse_moment
from sessionhook.relay.store import PostgresStore, Store, StoreCore
from sessionhook.relay.store.ops_queries import OperatorQueries
from sessionhook.relay.web import server as health
from tests.support.clock import Clock
from tests.support.pg import TEMPLATE, Cluster
from tests.support.receiver import Receiver
from tests.support.store_rows import Ep

pytestmark = pytest.mark.process

API_KEY = "sk-test-7c1f0a9e5d3b2a1f9e8d7c6b"
SECRETS = {name: generate_secret() for name in ("ci", "flaky", "broken", "gone")}
SOURCE = "sources/github/acme/api-server"


@dataclass
class Where:
    """A store the commands work on: a SQLite file (``--db``) or a PostgreSQL database
    (a config whose ``[store] url`` names it)."""

    db: Path
    url: str | None = None
    config: Path | None = None

    @property
    def args(self) -> list[str]:
        """The options naming this store on a command line."""
        if self.url is None:
            return ["--db", str(self.db)]
        assert self.config is not None
        return ["--config", str(self.config)]

    def reader(self) -> StoreCore:
        """The store opened read-only."""
        if self.url is None:
            return Store.open_readonly(self.db)
        return PostgresStore.open_readonly(self.url)

    def writer(self) -> StoreCore:
        if self.url is None:
            return Store.open(self.db)
        return PostgresStore.open(self.url)


@dataclass
class RelayRun:
    """What the real run left behind, and the consumers that are still listening."""

    config: Path
    store: Where
    receivers: dict[str, Receiver]
    urls: dict[str, str]
    logs: str
    #: The PostgreSQL database of the run (copies are made from it), else ``None``.
    database: str | None = None

    @property
    def db(self) -> Path:
        return self.store.db


def _serve(portal: BlockingPortal, app: Any, servers: list[Future[Any]]) -> str:
    """Serve ``app`` on a loopback port from the portal's event loop; its base URL."""
    future, (host, port) = portal.start_task(health.serve, "127.0.0.1:0", app)
    servers.append(future)
    return f"http://{host}:{port}"


def _create_sessions(base_url: str) -> list[str]:
    names = []
    with httpx.Client(base_url=base_url, headers={"x-vendor-api-key": API_KEY}) as http:
        for prompt in ("Fix the flaky login test", "Add a health check endpoint"):
            response = http.post(
                "/v1alpha/sessions",
                json={
                    "prompt": prompt,
                    "sourceContext": {
                        "source": SOURCE,
                        "hostRepoContext": {"startingBranch": "main"},
                    },
                    "automationMode": "AUTO_CREATE_PR",
                },
            )
            response.raise_for_status()
            names.append(response.json()["name"])
    return names


def _write_config(
    directory: Path, emulator_url: str, urls: dict[str, str], database: str | None = None
) -> Path:
    (directory / "api_key").write_text(API_KEY + "\n")
    (directory / "api_key").chmod(0o600)  # a secret file others can read is refused
    endpoints = "".join(
        textwrap.dedent(
            f"""
            [[endpoints]]
            name = "{name}"
            url = "{url}/hook"
            secret = "{SECRETS[name]}"
            """
        )
        for name, url in urls.items()
    )
    config = directory / "config.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            [api]
            base_url = "{emulator_url}"
            api_key_file = "api_key"

            [store]
            STORE

            [poll]
            backfill = true

            [delivery]
            retry_delays = [0]
            timeout = 10
            allow_private_networks = true

            [log]
            level = "debug"
            format = "json"
            """
        )
        + endpoints
    )
    # The run's store: the SQLite file beside the config, or the PostgreSQL database.
    store = 'path = "relay.db"' if database is None else f"url = {json.dumps(database)}"
    config.write_text(config.read_text().replace("STORE", store, 1))
    return config


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def run(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[RelayRun]:
    """The real run, on a SQLite file, then (a second module pass) on a PostgreSQL
    database of the session's cluster."""
    directory = tmp_path_factory.mktemp("relay")
    where = Where(directory / "relay.db")
    cluster: Cluster | None = None
    if request.param == "postgresql":
        cluster = request.getfixturevalue("pg_cluster")
        name = cluster.create_database(TEMPLATE)
        where = Where(Path("relay.db"), cluster.url(name), directory / "config.toml")
    # Upstream times two hours ago, so that "--since 3h" covers them and "--since 1h" not.
    clock = Clock(time.time() - 2 * 3600)
    servers: list[Future[Any]] = []
    with start_blocking_portal(backend="asyncio") as portal:
        emulator = create_emulator(api_keys=[API_KEY], step_delay=1.0, seed=7, clock=clock)
        emulator_url = _serve(portal, emulator, servers)

        def receivers() -> dict[str, Receiver]:  # anyio primitives need the portal's loop
            return {
                "ci": Receiver(SECRETS["ci"]),
                "flaky": Receiver(
                    SECRETS["flaky"], fail_first=1, fail_status=503, retry_after="3600"
                ),
                "broken": Receiver(SECRETS["broken"], status=500),
                "gone": Receiver(SECRETS["gone"], status=410),
            }

        consumers = portal.call(receivers)
        urls = {name: _serve(portal, r.app, servers) for name, r in consumers.items()}
        _create_sessions(emulator_url)
        clock.now += 600  # every scripted step of both sessions is now in the past
        config = _write_config(directory, emulator_url, urls, where.url)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
        command = [sys.executable, "-m", "sessionhook.cli", "run", "--config", str(config)]
        done = subprocess.run(
            [*command, "--once"],
            capture_output=True,
            text=True,
            timeout=90,
            env=env,
            check=False,
        )
        logs = done.stderr
        assert done.returncode == 0, done.stderr[-3000:]
        # One --once pass leaves nothing due: deliveries freed by attempts that settle
        # while the pass looks for work go out in the same pass (flaky's retry is an hour
        # away, so it does not count).
        with where.reader() as store:
            due = store.outbox.next_due_at()
        assert due is None or due > time.time() + 60, logs[-3000:]
        try:
            yield RelayRun(
                config=config,
                store=where,
                receivers=consumers,
                urls=urls,
                logs=logs,
                database=None if where.url is None else where.url.rsplit("/", 1)[1],
            )
        finally:
            for server in servers:
                server.cancel()
            if cluster is not None and where.url is not None:
                cluster.drop_database(where.url.rsplit("/", 1)[1])


@pytest.fixture
def db_copy(run: RelayRun, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Where]:
    """A private copy of the run's store for commands that write."""
    if run.database is None:
        target = tmp_path / "copy.db"
        with sqlite3.connect(run.db) as source, sqlite3.connect(target) as dest:
            source.backup(dest)
        yield Where(target)
        return
    cluster: Cluster = request.getfixturevalue("pg_cluster")
    name = cluster.create_database(run.database)  # a copy of the run's database
    config = tmp_path / "copy.toml"
    config.write_text(f"[store]\nurl = {json.dumps(cluster.url(name))}\n")
    yield Where(Path("copy.db"), cluster.url(name), config)
    cluster.drop_database(name)


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def ok(*args: str) -> str:
    result = invoke(*args)
    assert result.exit_code == 0, (result.output, result.stderr)
    return result.stdout


def failed(*args: str, code: int = 1) -> str:
    """Run a command that must fail: one line on stderr, never a traceback."""
    result = invoke(*args)
    assert result.exit_code == code, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, result.output
    return lines[-1]


# --------------------------------------------------------------------------- the run itself


def test_the_run_reached_every_kind_of_consumer(run: RelayRun) -> None:
    with run.store.reader() as store:
        assert store.outbox.pending_count("ci") == 0
        assert store.operator.list_deliveries("broken", "pending") == []
    r = run.receivers
    assert r["ci"].delivered and not r["ci"].rejected
    assert {a.answered for a in r["flaky"].arrivals} == {503}
    assert {a.answered for a in r["broken"].arrivals} == {500}
    assert {a.answered for a in r["gone"].arrivals} == {410}


def test_whole_run_logs_are_json_and_never_show_a_secret(run: RelayRun) -> None:
    lines = [json.loads(line) for line in run.logs.splitlines() if line.startswith("{")]
    ours = {line["event"] for line in lines if "logger" not in line}  # not stdlib records
    assert {"relay.once_done", "endpoint.disabled", "delivery.failed"} <= ours
    assert all(re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", event) for event in ours), ours
    for secret in (API_KEY, *SECRETS.values()):
        assert secret not in run.logs
    for value in SECRETS.values():
        assert value.removeprefix("whsec_") not in run.logs


# --------------------------------------------------------------------------- status


def test_status_table(run: RelayRun) -> None:
    out = ok("status", "--config", str(run.config))
    rows = {line.split()[0]: line for line in out.splitlines() if line}
    assert "enabled" in rows["ci"]
    assert "disabled: " in rows["gone"] and "410" in rows["gone"]
    assert "last poll" in out and "never" not in out.split("last poll")[1].splitlines()[0]
    assert "throttled (429)" in out


def test_status_shows_an_endpoint_s_error_until_a_success_follows(tmp_path: Path) -> None:
    """The table's LAST ERROR agrees with --json's failing_since: an error answered by a
    later success is history (the table kept showing it while the JSON said null)."""
    from sessionhook.relay.domain.retry import AttemptResult, Delivered, Retry
    from sessionhook.relay.store import AttemptRecord
    from tests.support.backlog import fill

    db = tmp_path / "relay.db"
    now = time.time()
    with Store.open(db) as store:
        store.endpoints.sync_endpoints([Ep("hook")])
        fill(store, 2, 1)
        first, second = store.outbox.due_deliveries(time.time() + 1, 10)
        refused = AttemptResult(None, "ClientConnectorError: refused", 2.0, "", None, now - 60)
        store.outbox.record_attempts([AttemptRecord(first.id, refused, Retry(at=now + 600))])

    def shown() -> tuple[str, Any]:
        row = next(line for line in ok("status", "--db", str(db)).splitlines() if "hook" in line)
        (endpoint,) = json.loads(ok("status", "--db", str(db), "--json"))["endpoints"]
        return row, endpoint

    row, endpoint = shown()
    assert "ClientConnectorError" in row and endpoint["failing_since"] is not None
    with Store.open(db) as store:
        answered = AttemptResult(204, None, 2.0, "", None, now - 30)
        store.outbox.record_attempts([AttemptRecord(second.id, answered, Delivered())])
    row, endpoint = shown()
    assert endpoint["failing_since"] is None and endpoint["last_error"]  # kept, as history
    assert "ClientConnectorError" not in row, row


def test_status_says_while_the_session_list_is_cut_at_max_pages(tmp_path: Path) -> None:
    """Sessions past ``poll.max_pages`` are not followed: a log line says so once, and
    ``status`` (table and JSON) while it lasts."""
    db = tmp_path / "relay.db"
    with Store.open(db) as store:
        store.economy.mark_poll(True, time.time(), 20_000)
    out = ok("status", "--db", str(db))
    assert "session list" in out
    assert "the newest 20000 sessions followed, older ones not (raise poll.max_pages)" in out
    assert json.loads(ok("status", "--db", str(db), "--json"))["upstream"]["list_cut"] == 20_000
    with Store.open(db) as store:
        store.economy.mark_poll(False, time.time())  # a failed pass changes nothing
    assert "session list" in ok("status", "--db", str(db))
    with Store.open(db) as store:
        store.economy.mark_poll(True, time.time())  # a pass that read the whole list
    assert "session list" not in ok("status", "--db", str(db))
    assert json.loads(ok("status", "--db", str(db), "--json"))["upstream"]["list_cut"] is None


def test_status_shows_each_accounts_last_good_poll(tmp_path: Path) -> None:
    """With several accounts, one whose passes fail stands out in ``status``."""
    db = tmp_path / "relay.db"
    now = time.time()
    with Store.open(db) as store:
        store.economy.mark_poll(True, now - 7200, account="team-a")
        store.economy.mark_poll(False, now - 1, account="team-a")
        store.economy.mark_poll(True, now - 120, 300, account="team-b")
    out = ok("status", "--db", str(db))
    rows = {line.split(":", 1)[0]: line for line in out.splitlines() if ":" in line}
    assert rows["last good poll (team-a)"].endswith("(2h 0m ago)")
    assert rows["last good poll (team-b)"].endswith("(2m ago)")
    assert "the newest 300 sessions followed" in rows["session list (team-b)"]
    assert "session list (team-a)" not in rows
    up = json.loads(ok("status", "--db", str(db), "--json"))["upstream"]
    assert [a["account"] for a in up["accounts"]] == ["team-a", "team-b"]
    assert up["last_ok_poll_at"] == up["accounts"][0]["last_ok_poll_at"]  # the oldest


def test_status_json_matches_the_store(run: RelayRun) -> None:
    data = json.loads(ok("status", "--config", str(run.config), "--json"))
    by_name = {ep["name"]: ep for ep in data["endpoints"]}
    with run.store.reader() as store:
        for name in SECRETS:
            assert by_name[name]["pending"] == store.outbox.pending_count(name)
    assert by_name["ci"]["pending"] == 0
    assert by_name["ci"]["delivered_last_hour"] == len(run.receivers["ci"].delivered_ids())
    assert by_name["broken"]["dead_last_hour"] > 0
    assert by_name["flaky"]["failed_last_hour"] > 0
    assert by_name["gone"]["enabled"] is False
    assert data["upstream"]["last_ok_poll_at"] is not None


#: What --json writes for a moment (issue 20: it wrote Unix seconds).
RFC3339_MICRO = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")


def _moments(data: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every (path, value) of a key that names a moment, nested anywhere in ``data``."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "now" or key.endswith(("_at", "_since")):
                yield f"{path}.{key}", value
            yield from _moments(value, f"{path}.{key}")
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _moments(value, f"{path}[{i}]")


def test_every_json_output_writes_moments_as_rfc3339(run: RelayRun) -> None:
    [dead] = json.loads(
        ok("deliveries", "--config", str(run.config), "--status", "dead", "--limit", "1", "--json")
    )
    outputs = {
        "status": ok("status", "--config", str(run.config), "--json"),
        "deliveries": ok("deliveries", "--config", str(run.config), "--json"),
        "attempts": ok("attempts", str(dead["id"]), "--config", str(run.config), "--json"),
        "attempts of an event": ok(
            "attempts", dead["event_id"], "--config", str(run.config), "--json"
        ),
        "endpoints": ok("endpoints", "list", "--config", str(run.config), "--json"),
        "events": ok("events", "--config", str(run.config), "--format", "json", "--limit", "3"),
    }
    for name, text in outputs.items():
        found = [(path, value) for path, value in _moments(json.loads(text)) if value is not None]
        assert found, name  # each output has moments to check
        for path, value in found:
            if path.endswith(".body") or ".body." in path:
                continue  # an event's body is the webhook's, its own format
            assert isinstance(value, str) and RFC3339_MICRO.fullmatch(value), (name, path, value)
    status = json.loads(outputs["status"])
    now = datetime.fromisoformat(status["now"])
    last_poll = datetime.fromisoformat(status["upstream"]["last_poll_at"])
    assert timedelta(0) <= now - last_poll < timedelta(minutes=10)
    row = json.loads(outputs["attempts"])
    assert row["delivery"]["created_at"] <= row["attempts"][0]["started_at"]


# --------------------------------------------------------------------------- deliveries, attempts


def test_deliveries_filters(run: RelayRun) -> None:
    out = ok("deliveries", "--config", str(run.config), "--endpoint", "broken", "--status", "dead")
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["ID", "ENDPOINT", "STATUS"]
    assert len(lines) > 1 and all(" broken " in line and " dead " in line for line in lines[1:])

    rows = json.loads(ok("deliveries", "--config", str(run.config), "--status", "failed", "--json"))
    assert rows and {r["endpoint"] for r in rows} == {"flaky"}
    assert all(r["last_status_code"] == 503 and r["next_attempt_at"] for r in rows)

    session = rows[0]["session_name"]
    of_session = json.loads(
        ok("deliveries", "--config", str(run.config), "--session", session, "--json")
    )
    assert of_session and {r["session_name"] for r in of_session} == {session}


def test_deliveries_rejects_an_unknown_status(run: RelayRun) -> None:
    result = invoke("deliveries", "--config", str(run.config), "--status", "lost")
    assert result.exit_code == 2
    assert "lost" in result.stderr


def test_attempts_show_codes_durations_and_bodies(run: RelayRun) -> None:
    [dead] = json.loads(
        ok("deliveries", "--config", str(run.config), "--status", "dead", "--limit", "1", "--json")
    )
    out = ok("attempts", str(dead["id"]), "--config", str(run.config))
    assert f"endpoint:  {dead['endpoint']}" in out or "endpoint:" in out
    assert out.count("status code:") == 2  # retry_delays = [0]: two attempts, then dead
    assert "500" in out and "response:" in out and " ms" in out

    data = json.loads(ok("attempts", str(dead["id"]), "--config", str(run.config), "--json"))
    assert data["delivery"]["status"] == "dead"
    assert [(a["attempt"], a["status_code"], a["response_body"]) for a in data["attempts"]] == [
        (1, 500, "no"),
        (2, 500, "no"),
    ]


def test_attempts_of_an_unknown_delivery(run: RelayRun) -> None:
    assert failed("attempts", "999999", "--config", str(run.config)).startswith(
        "error: no delivery 999999"
    )


def test_attempts_of_an_event_cover_all_its_deliveries(run: RelayRun) -> None:
    [dead] = json.loads(
        ok("deliveries", "--config", str(run.config), "--status", "dead", "--limit", "1", "--json")
    )
    event_id = dead["event_id"]
    every = json.loads(ok("deliveries", "--config", str(run.config), "--limit", "1000", "--json"))
    of_event = sorted(d["id"] for d in every if d["event_id"] == event_id)
    assert len(of_event) > 1  # delivered to several endpoints

    data = json.loads(ok("attempts", event_id, "--config", str(run.config), "--json"))
    assert data["event"] == event_id
    assert [b["delivery"]["id"] for b in data["deliveries"]] == of_event
    for block in data["deliveries"]:
        one = json.loads(
            ok("attempts", str(block["delivery"]["id"]), "--config", str(run.config), "--json")
        )
        assert block["attempts"] == one["attempts"]
    text = ok("attempts", event_id, "--config", str(run.config))
    assert text.count("delivery:") == len(of_event)
    assert text.count(event_id) == len(of_event)  # one "event:" line per delivery


def test_attempts_take_the_id_as_deliveries_shows_it(run: RelayRun) -> None:
    [dead] = json.loads(
        ok("deliveries", "--config", str(run.config), "--status", "dead", "--limit", "1", "--json")
    )
    plain = ok("attempts", str(dead["id"]), "--config", str(run.config))
    assert ok("attempts", f"#{dead['id']}", "--config", str(run.config)) == plain


def test_attempts_of_an_unknown_event(run: RelayRun) -> None:
    assert failed("attempts", "evt_nope", "--config", str(run.config)).startswith(
        "error: no delivery or event 'evt_nope'"
    )


def test_deliveries_behind_a_parked_one_show_what_they_wait_on(run: RelayRun) -> None:
    """flaky refused each first attempt with Retry-After: 3600: the rows of a session
    behind its failed head are not 'due now', they wait on the head."""
    rows = json.loads(
        ok("deliveries", "--config", str(run.config), "--endpoint", "flaky", "--json")
    )
    heads = {r["id"] for r in rows if r["status"] == "failed"}
    waiting = [r for r in rows if r["status"] == "pending"]
    assert heads and waiting
    for row in waiting:
        assert row["waiting_on"] in heads
        head = next(r for r in rows if r["id"] == row["waiting_on"])
        assert head["session_name"] == row["session_name"]
    table = ok("deliveries", "--config", str(run.config), "--endpoint", "flaky")
    for row in waiting:
        line = next(x for x in table.splitlines() if x.startswith(f"{row['id']} "))
        assert f"waiting on #{row['waiting_on']}" in line and "due now" not in line
    out = ok("attempts", str(waiting[0]["id"]), "--config", str(run.config))
    assert f"waiting on:  #{waiting[0]['waiting_on']}" in out


# --------------------------------------------------------------------------- replay


def test_replay_dead_letters_by_time(run: RelayRun, db_copy: Where) -> None:
    with db_copy.reader() as store:
        dead = store.operator.list_deliveries("broken", "dead", limit=10_000)
        archived = sum(1 for _ in store.operator.iter_events())
    assert dead
    out = ok("replay", *db_copy.args, "--endpoint", "broken", "--since", "3h")
    assert out.strip() == f"queued {archived} deliveries to broken"
    with db_copy.reader() as store:
        again = store.operator.list_deliveries("broken", "pending", limit=10_000)
    assert len(again) == archived and all(d.replayed for d in again)
    # the same webhook-id as the dead letters: consumers deduplicate on it
    assert {d.event_id for d in dead} <= {d.event_id for d in again}


def test_replay_by_event_id_and_type(run: RelayRun, db_copy: Where) -> None:
    with db_copy.reader() as store:
        dead = store.operator.list_deliveries("broken", "dead", limit=2)
    ids = [d.event_id for d in dead]
    args = ["replay", *db_copy.args, "--endpoint", "broken"]
    out = ok(*args, *[x for i in ids for x in ("--event", i)])
    assert out.strip() == f"queued {len(ids)} deliveries to broken"
    # already on its way: not queued twice
    again = ok(*args, "--event", ids[0]).strip()
    assert again.startswith("queued 0 deliveries to broken: the event selected is on its way")
    assert "deliveries recover --endpoint broken" in again  # says why, and what to do
    typed = ok(*args, "--since", "3h", "--type", "session.discovered")
    assert typed.strip() == "queued 2 deliveries to broken"  # two sessions


def test_replay_window_excludes_what_is_older(run: RelayRun, db_copy: Where) -> None:
    out = ok("replay", *db_copy.args, "--endpoint", "ci", "--since", "1h")
    assert out.strip() == "queued 0 deliveries to ci: no archived event in that range"
    out = ok("replay", *db_copy.args, "--endpoint", "ci", "--since", "3h", "--until", "3h")
    assert out.strip() == "queued 0 deliveries to ci: no archived event in that range"


def test_replay_to_a_disabled_endpoint_says_when_they_go_out(db_copy: Where) -> None:
    result = invoke("replay", *db_copy.args, "--endpoint", "gone", "--since", "1d")
    assert result.exit_code == 0
    assert "`sessionhook endpoints enable gone`" in result.stderr


def test_replay_usage_and_unknown_endpoint(db_copy: Where) -> None:
    base = ["replay", *db_copy.args, "--endpoint", "ci"]
    assert invoke(*base).exit_code == 2  # neither --since nor --event
    assert invoke(*base, "--since", "1h", "--event", "evt_x").exit_code == 2
    assert invoke(*base, "--since", "yesterday-ish").exit_code == 2
    line = failed("replay", *db_copy.args, "--endpoint", "nope", "--since", "1h", code=2)
    assert line.startswith("error: no endpoint named 'nope'") and "ci" in line
    assert failed(*base, "--event", "evt_missing") == "error: no archived event evt_missing"


def test_deliveries_retry_and_recover_reopen_the_same_rows(db_copy: Where) -> None:
    with db_copy.reader() as store:
        dead = store.operator.list_deliveries("broken", "dead", limit=10_000)
        waiting = store.operator.list_deliveries("flaky", "failed", limit=10)
        delivered = store.operator.list_deliveries("ci", "delivered", limit=1)
    assert dead and waiting and delivered
    first = min(dead, key=lambda d: d.id)
    out = ok("deliveries", "retry", str(first.id), *db_copy.args)
    assert out.strip() == f"delivery {first.id} ({first.event_id}) to broken: dead -> due now"
    shown = json.loads(ok("deliveries", "retry", f"#{waiting[0].id}", *db_copy.args, "--json"))
    assert shown["previous_status"] == "failed" and shown["delivery"]["status"] == "pending"
    assert shown["delivery"]["event_id"] == waiting[0].event_id
    out = ok("deliveries", "recover", *db_copy.args, "--endpoint", "broken", "--since", "3h")
    assert out.startswith(f"recovered {len(dead) - 1} deliveries of broken, due now")
    with db_copy.reader() as store:
        after = {d.id: d for d in store.operator.list_deliveries("broken", limit=10_000)}
    # The same rows (same event: same webhook-id), open again; nothing new was queued.
    assert all(after[d.id].status == "pending" and after[d.id].event_id == d.event_id for d in dead)
    assert not any(d.replayed for d in after.values())
    base = ["deliveries", "recover", *db_copy.args]
    again = json.loads(ok(*base, "--endpoint", "broken", "--since", "3h", "--json"))
    assert again["recovered"] == 0 and f"{len(dead)} are pending" in again["reason"]
    line = failed("deliveries", "retry", "999999", *db_copy.args)
    assert line == "error: no delivery 999999 — see `sessionhook deliveries`"
    line = failed("deliveries", "retry", str(delivered[0].id), *db_copy.args)
    assert line.startswith(f"error: delivery {delivered[0].id} was delivered already")
    assert invoke("deliveries", "retry", "abc", *db_copy.args).exit_code == 2
    assert invoke("deliveries", "retry", "9" * 40, *db_copy.args).exit_code == 2
    assert invoke(*base, "--endpoint", "broken", "--since", "yesterday-ish").exit_code == 2
    assert invoke(*base, "--endpoint", "broken").exit_code == 2  # --since is required
    line = failed(*base, "--endpoint", "nope", "--since", "1h", code=2)
    assert line.startswith("error: no endpoint named 'nope'")


def test_options_given_to_the_deliveries_group_reach_retry_and_recover(db_copy: Where) -> None:
    """``deliveries --db FILE retry ID``: the group's options are the subcommand's (they
    were dropped, and /etc/sessionhook/config.toml read instead); one the subcommand does
    not take is refused."""
    with db_copy.reader() as store:
        dead = sorted(store.operator.list_deliveries("broken", "dead", limit=10_000), key=id_of)
    assert len(dead) > 1
    out = ok("deliveries", *db_copy.args, "retry", str(dead[0].id))
    assert out.strip() == f"delivery {dead[0].id} ({dead[0].event_id}) to broken: dead -> due now"
    out = ok("deliveries", *db_copy.args, "--endpoint", "broken", "recover", "--since", "3h")
    assert out.startswith(f"recovered {len(dead) - 1} deliver")
    with db_copy.reader() as store:
        after = {d.id: d.status for d in store.operator.list_deliveries("broken", limit=10_000)}
    assert {after[d.id] for d in dead} == {"pending"}
    refused = invoke("deliveries", *db_copy.args, "--status", "dead", "retry", str(dead[0].id))
    assert refused.exit_code == 2 and "--status" in refused.stderr


def id_of(row: Any) -> int:
    return int(row.id)


def test_replay_in_chunks_reports_progress(db_copy: Where) -> None:
    progress: list[int] = []
    with db_copy.writer() as store:
        total = operator.replay(
            store, "broken", since=0.0, on_progress=progress.append, chunk=3
        ).queued
        archived = sum(1 for _ in store.operator.iter_events())
    assert total == archived == sum(progress)
    assert len(progress) == -(-archived // 3)  # one transaction per chunk of 3


def test_progress_counter_only_on_a_terminal() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Terminal(), io.StringIO()
    for stream in (tty, pipe):
        counter = ops.ProgressCounter("queued", stream)
        counter.add(1000)
        counter.add(500)
        counter.done()
    assert tty.getvalue() == "\rqueued: 1000\rqueued: 1500\n"
    assert pipe.getvalue() == ""


# --------------------------------------------------------------------------- endpoints


def test_endpoints_list(run: RelayRun) -> None:
    out = ok("endpoints", "list", "--config", str(run.config))
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(rows) == set(SECRETS)
    assert rows["gone"].split()[1] == "disabled" and "410" in rows["gone"]
    assert run.urls["ci"] in rows["ci"]
    data = json.loads(ok("endpoints", "list", "--config", str(run.config), "--json"))
    assert {e["name"]: e["enabled"] for e in data} == {
        "broken": True,
        "ci": True,
        "flaky": True,
        "gone": False,
    }


def test_enable_then_disable(db_copy: Where) -> None:
    with db_copy.reader() as store:
        waiting = store.outbox.pending_count("gone")
    assert waiting > 0
    out = ok("endpoints", "enable", "gone", *db_copy.args)
    assert out.strip() == f"endpoint gone enabled; {waiting} deliveries waiting"
    out = ok("endpoints", "disable", "ci", "--reason", "maintenance", *db_copy.args)
    assert out.strip() == "endpoint ci disabled: maintenance"
    with db_copy.reader() as store:
        states = {s.name: s for s in store.endpoints.endpoint_states()}
    assert states["gone"].enabled and states["gone"].disabled_reason is None
    assert not states["ci"].enabled and states["ci"].disabled_reason == "maintenance"


@pytest.mark.parametrize(
    "args",
    [
        ["deliveries", "--endpoint", "nope"],
        ["deliveries", "--endpoint", "nope", "--json"],
        ["replay", "--endpoint", "nope", "--since", "1h"],
        ["replay", "--endpoint", "nope", "--event", "evt_x"],
        ["endpoints", "enable", "nope"],
        ["endpoints", "disable", "nope"],
    ],
    ids=" ".join,
)
def test_an_unknown_endpoint_is_one_line_and_exit_2(db_copy: Where, args: list[str]) -> None:
    # `deliveries --endpoint nope` said "no deliveries match" and exited 0 (issue 20).
    line = failed(*args, *db_copy.args, code=2)
    assert line.startswith("error: no endpoint named 'nope' in the database (known: ")
    assert "ci" in line and "gone" in line


def test_endpoints_test_sends_a_signed_ping(run: RelayRun) -> None:
    ci = run.receivers["ci"]
    before = len(ci.arrivals)
    out = ok("endpoints", "test", "ci", "--config", str(run.config))
    assert "answer:" in out and "200" in out
    # verified by the reference Standard Webhooks implementation in the receiver
    ping = ci.arrivals[before]
    assert ping.type == PING_TYPE and ping.answered == 200
    assert f"webhook-id {ping.event_id}" in out
    assert not ci.rejected


def test_endpoints_test_shows_a_refusal(run: RelayRun) -> None:
    result = invoke("endpoints", "test", "flaky", "--config", str(run.config))
    assert result.exit_code == 1
    assert "503" in result.stdout
    assert result.stderr.strip() == "error: flaky did not accept the ping (503)"


def test_endpoints_test_applies_the_address_guard(run: RelayRun, tmp_path: Path) -> None:
    # The same config with private networks refused, as in production: a loopback endpoint
    # is a config error, for `endpoints test` as for the daemon, and nothing is sent.
    # (Names resolving to private addresses: tests/test_pinning.py.)
    text = run.config.read_text()
    text = text.replace("allow_private_networks = true", "allow_private_networks = false")
    text = text.replace('"relay.db"', f'"{run.db}"')
    text = text.replace('"api_key"', f'"{run.config.parent / "api_key"}"')
    strict = tmp_path / "strict.toml"
    strict.write_text(text)
    before = len(run.receivers["ci"].arrivals)
    line = failed("endpoints", "test", "ci", "--config", str(strict), code=2)
    assert line.startswith("config error: endpoints[0].url: 127.0.0.1 is a loopback address")
    assert line.endswith("refused while delivery.allow_private_networks = false")
    assert len(run.receivers["ci"].arrivals) == before


def test_endpoints_test_needs_no_api_key(run: RelayRun, tmp_path: Path) -> None:
    # The ping is signed with the endpoint's secret and never calls the Sessions API, so an
    # operator's shell without the API key (or its credential file) can still run it.
    text = run.config.read_text()
    text = text.replace('"relay.db"', f'"{run.db}"')
    text = text.replace('"api_key"', f'"{tmp_path / "no-such-api-key"}"')
    keyless = tmp_path / "keyless.toml"
    keyless.write_text(text)
    ci = run.receivers["ci"]
    before = len(ci.arrivals)
    out = ok("endpoints", "test", "ci", "--config", str(keyless))
    assert "200" in out
    assert ci.arrivals[before].type == PING_TYPE and not ci.rejected


def test_endpoints_test_reads_only_the_secret_it_signs_with(
    run: RelayRun, db_copy: Where, tmp_path: Path
) -> None:
    """Every other endpoint's secret unavailable (a variable not set, a file missing, a
    file others can read): a configured endpoint and one created at run time are pinged
    all the same; the one whose own secret is missing is the one line naming it."""
    ci = run.receivers["ci"]
    (tmp_path / "ci.secret").write_text(SECRETS["ci"] + "\n")
    (tmp_path / "ci.secret").chmod(0o600)
    (tmp_path / "exposed.secret").write_text(SECRETS["broken"] + "\n")
    (tmp_path / "exposed.secret").chmod(0o644)
    store = f"path = {json.dumps(str(db_copy.db))}"
    if db_copy.config is not None:  # PostgreSQL: the copy's [store] url
        store = db_copy.config.read_text().removeprefix("[store]\n")
    config = tmp_path / "others.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            [api]
            api_key_env = "UNSET_API_KEY"
            [store]
            {store}
            [delivery]
            allow_private_networks = true
            [server]
            token_env = "UNSET_WEB_TOKEN"
            [[endpoints]]
            name = "ci"
            url = "{run.urls["ci"]}/hook"
            secret_file = "ci.secret"
            [[endpoints]]
            name = "flaky"
            url = "{run.urls["flaky"]}/hook"
            secret_env = "UNSET_FLAKY_SECRET"
            [[endpoints]]
            name = "broken"
            url = "{run.urls["broken"]}/hook"
            secret_file = "exposed.secret"
            [[endpoints]]
            name = "gone"
            url = "{run.urls["gone"]}/hook"
            secret_file = "no-such.secret"
            """
        )
    )
    before = len(ci.arrivals)
    out = ok("endpoints", "test", "ci", "--config", str(config))
    assert "answer:    200" in out
    created = invoke(
        "endpoints",
        "create",
        "slack-bot",
        "--url",
        f"{run.urls['ci']}/hook",
        "--secret-env",
        "SLACK_BOT_SECRET",
        "--config",
        str(config),
        env={"SLACK_BOT_SECRET": SECRETS["ci"]},
    )
    assert created.exit_code == 0, created.output
    out = ok("endpoints", "test", "slack-bot", "--config", str(config))
    assert "answer:    200" in out
    pings = ci.arrivals[before:]
    assert [a.type for a in pings] == [PING_TYPE, PING_TYPE] and not ci.rejected
    line = failed("endpoints", "test", "flaky", "--config", str(config), code=2)
    assert line == (
        "config error: endpoints[1].secret_env: environment variable UNSET_FLAKY_SECRET is not set"
    )
    line = failed("endpoints", "test", "broken", "--config", str(config), code=2)
    assert line.startswith("config error: endpoints[2].secret_file: ") and "mode 644" in line


def test_endpoints_test_unknown_endpoint(run: RelayRun) -> None:
    line = failed("endpoints", "test", "nope", "--config", str(run.config), code=2)
    assert line.startswith("error: no endpoint named 'nope'")


# --------------------------------------------------------------------------- events


def test_events_table_and_filters(run: RelayRun) -> None:
    out = ok("events", "--config", str(run.config))
    lines = out.splitlines()
    assert lines[0].split() == ["SEQ", "OCCURRED", "TYPE", "SESSION", "EVENT", "ACTIVITY"]
    with run.store.reader() as store:
        everything = list(store.operator.iter_events())
    assert len(lines) == 1 + len(everything)

    discovered = ok("events", "--config", str(run.config), "--type", "session.*")
    types = {line.split()[2] for line in discovered.splitlines()[1:]}
    assert "session.discovered" in types and all(t.startswith("session.") for t in types)

    session = everything[0].session_name
    rows = json.loads(
        ok("events", "--config", str(run.config), "--session", session, "--format", "json")
    )
    assert rows and {r["session"] for r in rows} == {session}
    assert ok("events", "--config", str(run.config), "--since", "1h").strip() == "no events match"


def test_events_ndjson_is_the_delivered_bodies(run: RelayRun) -> None:
    out = ok("events", "--config", str(run.config), "--format", "ndjson")
    lines = [json.loads(line) for line in out.splitlines()]
    delivered = {
        a.event_id: a.body
        for a in run.receivers["ci"].first_deliveries()
        if a.type != PING_TYPE  # from the `endpoints test` test
    }
    assert delivered and {line["id"] for line in lines} == set(delivered)
    for line in lines:
        assert line["body"] == delivered[line["id"]]


def test_events_stream_lazily(run: RelayRun, monkeypatch: pytest.MonkeyPatch) -> None:
    pulled = 0
    original = OperatorQueries.iter_events

    def counting(self: OperatorQueries, *args: Any, **kwargs: Any) -> Iterator[Any]:
        nonlocal pulled
        for row in original(self, *args, **kwargs):
            pulled += 1
            yield row

    monkeypatch.setattr(OperatorQueries, "iter_events", counting)
    out = ok("events", "--config", str(run.config), "--format", "ndjson", "--limit", "3")
    assert len(out.splitlines()) == 3
    assert pulled <= 4  # the rest of the archive was never read


# --------------------------------------------------------------------------- errors


def test_missing_database_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.db"
    line = failed("status", "--db", str(missing))
    assert line.startswith(
        f"error: no database at {missing} — has `sessionhook run` started with this config?"
    )


def test_missing_or_bad_config_exits_2(tmp_path: Path) -> None:
    line = failed("status", "--config", str(tmp_path / "none.toml"), code=2)
    assert line.startswith("config error:") and "file not found" in line
    bad = tmp_path / "bad.toml"
    bad.write_text("[store]\npath = 'x.db'\nsurprise = 1\n")
    assert (
        failed("events", "--config", str(bad), code=2)
        == "config error: store.surprise: unknown key"
    )


def test_config_from_the_environment(run: RelayRun) -> None:
    result = invoke("endpoints", "list", env={ops.ENV_CONFIG: str(run.config)})
    assert result.exit_code == 0 and "ci" in result.stdout


def test_not_a_database(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_text("this is not sqlite")
    assert failed("events", "--db", str(junk)).startswith("error: ")


# --------------------------------------------------------------------------- secret, verify


def test_secret_generate() -> None:
    first, second = ok("secret", "generate").strip(), ok("secret", "generate").strip()
    assert first.startswith("whsec_") and first != second
    assert len(decode_secret(first)) == 32


def _captured(run: RelayRun, tmp_path: Path, as_json: bool = False) -> tuple[Path, Path]:
    """Headers and body of a request the ci consumer really received."""
    arrival = run.receivers["ci"].first_deliveries()[0]
    with run.store.reader() as store:
        event = store.operator.get_event(arrival.event_id)
    assert event is not None
    headers = tmp_path / ("headers.json" if as_json else "headers.txt")
    if as_json:
        headers.write_text(json.dumps(arrival.headers))
    else:
        lines = ["POST /hook HTTP/1.1", *(f"{k}: {v}" for k, v in arrival.headers.items())]
        headers.write_text("\n".join(lines) + "\n")
    body = tmp_path / "body.json"
    body.write_bytes(event.body)
    return headers, body


def test_verify_ok_and_tampered(run: RelayRun, tmp_path: Path) -> None:
    headers, body = _captured(run, tmp_path)
    common = ["verify", "--secret", SECRETS["ci"], "--headers", str(headers)]
    assert ok(*common, "--ignore-timestamp", str(body)).strip() == "signature ok"
    tampered = tmp_path / "tampered.json"
    tampered.write_bytes(body.read_bytes() + b"\n")
    line = failed(*common, "--ignore-timestamp", str(tampered))
    assert line.startswith("error: signature invalid: no matching signature")
    wrong = ["verify", "--secret", SECRETS["broken"], "--headers", str(headers)]
    assert failed(*wrong, "--ignore-timestamp", str(body)).startswith("error: signature invalid")


def test_verify_json_headers_and_stdin(run: RelayRun, tmp_path: Path) -> None:
    headers, body = _captured(run, tmp_path, as_json=True)
    result = CliRunner().invoke(
        cli,
        ["verify", "--headers", str(headers), "--ignore-timestamp", "-"],
        input=body.read_bytes(),
        env={"SESSIONHOOK_SECRET": SECRETS["ci"]},
    )
    assert result.exit_code == 0 and result.stdout.strip() == "signature ok"


def test_verify_stale_timestamp_hint(run: RelayRun, tmp_path: Path) -> None:
    headers, body = _captured(run, tmp_path)
    text = headers.read_text()
    sent = int(run.receivers["ci"].first_deliveries()[0].headers["webhook-timestamp"])
    # a capture from an hour before: the signature no longer matches either, but the
    # timestamp check comes first and says so
    headers.write_text(text.replace(str(sent), str(sent - 3600)))
    line = failed("verify", "--secret", SECRETS["ci"], "--headers", str(headers), str(body))
    assert line.startswith("error: signature invalid: timestamp too old")
    assert "--ignore-timestamp" in line


def test_verify_bad_inputs(tmp_path: Path) -> None:
    headers = tmp_path / "h.txt"
    headers.write_text("this line has no colon\n")
    body = tmp_path / "b"
    body.write_bytes(b"{}")
    line = failed("verify", "--secret", SECRETS["ci"], "--headers", str(headers), str(body), code=2)
    assert line.startswith("error: not a 'name: value' header line")
    headers.write_text("webhook-id: x\nwebhook-timestamp: 1\nwebhook-signature: v1,AAAA\n")
    line = failed(
        "verify",
        "--secret",
        "whsec_!!",
        "--headers",
        str(headers),
        "--ignore-timestamp",
        str(body),
        code=2,
    )
    assert line.startswith("error: bad secret")


# --------------------------------------------------------------------------- parsing (pure)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-22T12:00:00Z", 1795348800.0),
        ("2026-11-22T14:00:00+02:00", 1795348800.0),
        ("2026-11-22T12:00:00", 1795348800.0),  # no offset: UTC
        ("2026-11-22", 1795305600.0),
        ("now", 2_000_000_000.0),
        ("90s", 2_000_000_000.0 - 90),
        ("30m", 2_000_000_000.0 - 1800),
        ("2h", 2_000_000_000.0 - 7200),
        ("7d", 2_000_000_000.0 - 7 * 86400),
        ("1w", 2_000_000_000.0 - 7 * 86400),
        ("1.5h", 2_000_000_000.0 - 5400),
    ],
)
def test_parse_time(text: str, expected: float) -> None:
    assert parse_moment(text, 2_000_000_000.0) == expected


@pytest.mark.parametrize("text", ["", "yesterday", "2h ago", "-5m", "2026-13-01"])
def test_parse_time_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="neither RFC 3339"):
        parse_moment(text, 0.0)


def test_parse_headers() -> None:
    captured = "POST /hook HTTP/1.1\nWebhook-Id: evt_1\n\nwebhook-signature: v1,a v1,b\n"
    assert ops.parse_headers(captured) == {
        "webhook-id": "evt_1",
        "webhook-signature": "v1,a v1,b",
    }
    assert ops.parse_headers('{"Webhook-Timestamp": 17}') == {"webhook-timestamp": "17"}
    with pytest.raises(ValueError, match="object"):
        ops.parse_headers("[1, 2]")
    with pytest.raises(ValueError, match="not valid JSON"):
        ops.parse_headers("{nope")


def test_endpoints_test_shapes_the_ping_like_the_endpoints_deliveries(
    run: RelayRun, tmp_path: Path
) -> None:
    text = run.config.read_text()
    text = text.replace('"relay.db"', f'"{run.db}"')
    text = text.replace('"api_key"', f'"{run.config.parent / "api_key"}"')
    assert 'name = "ci"\n' in text
    text = text.replace('name = "ci"\n', 'name = "ci"\npayload = "thin"\n', 1)
    thin = tmp_path / "thin.toml"
    thin.write_text(text)
    ci = run.receivers["ci"]
    before = len(ci.arrivals)
    ok("endpoints", "test", "ci", "--config", str(thin))
    ping = ci.arrivals[before]
    assert ping.type == PING_TYPE and not ci.rejected
    # The thin payload keeps the type and the session summary, not the ping's message.
    assert "message" in json.loads(ping_event("ci", 0)[1])["data"]
    assert "message" not in ping.body["data"] and "session" in ping.body["data"]
