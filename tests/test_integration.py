"""The relay end to end: emulator -> relay -> consumer, checked with the reference verifier.

In-process tests run the real daemon with the emulator and tests/support/receiver.py behind ASGI
transports. Subprocess tests run ``sessionhook run`` (and ``demo``) as a user would, over
loopback sockets, and kill it with SIGKILL, SIGTERM and SIGINT.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import httpx
import pytest
from starlette.applications import Starlette

from sessionhook.api.client import SessionsClient
from sessionhook.emulator.app import create_app
from sessionhook.relay.domain.signing import generate_secret
from sessionhook.relay.web.server import serve
from tests.support import forked_cli
from tests.support.daemon_setup import API_KEY, Setup, write_config
from tests.support.receiver import Receiver

pytestmark = pytest.mark.process

ALL_TYPES = {
    "activity.plan_generated",
    "activity.plan_approved",
    "activity.user_messaged",
    "activity.agent_messaged",
    "activity.progress_updated",
    "activity.session_completed",
    "activity.session_failed",
    # The emulator's "Session started" notice (no event member); it sends no unknown member,
    # so activity.unknown must not occur at all.
    "activity.session_started",
    "session.discovered",
    "session.state_changed",
    "session.pull_request_opened",
    "session.action_required",
    "session.completed",
    "session.failed",
}


def activity_event_id(name: str) -> str:
    """The documented id, computed here independently of the relay's code."""
    return "evt_" + hashlib.sha256(f"activity:{name}".encode()).hexdigest()[:32]


async def upstream_activities(api: SessionsClient) -> dict[str, list[str]]:
    """Every activity name upstream, per session, in upstream order."""
    out: dict[str, list[str]] = {}
    async for session in api.iter_sessions():
        out[session.name] = [a.name async for a in api.iter_activities(session.name)]
    return out


def activity_arrivals(receiver: Receiver) -> dict[str, list[str]]:
    """Activity names as first delivered, per session, in arrival order."""
    out: dict[str, list[str]] = {}
    for arrival in receiver.first_deliveries():
        activity = arrival.body["data"].get("activity")
        if activity is not None:
            out.setdefault(arrival.session, []).append(activity["name"])
    return out


def all_finished(receiver: Receiver, count: int) -> bool:
    finals = ("activity.session_completed", "activity.session_failed")
    return sum(a.type in finals for a in receiver.first_deliveries()) >= count


async def react(receiver: Receiver, api: SessionsClient, handled: set[str]) -> None:
    """Approve waiting plans and answer questions, as an integration would on webhooks:
    on ``session.action_required`` (also when the session already waited when the relay
    discovered it)."""
    for arrival in receiver.first_deliveries():
        if arrival.type != "session.action_required" or arrival.event_id in handled:
            continue
        handled.add(arrival.event_id)
        action = arrival.body["data"]["action"]
        if action == "approve_plan":
            await api.approve_plan(arrival.session)
        elif action == "answer":
            await api.send_message(arrival.session, "Raising an error is fine.")


# --------------------------------------------------------------------------- in process


@pytest.mark.anyio
async def test_every_event_type_signed_complete_and_in_order(tmp_path: Path) -> None:
    setup = Setup(tmp_path, poll={"backfill": True})
    daemon = setup.daemon()
    handled: set[str] = set()
    async with setup.api_http() as http, anyio.create_task_group() as tg:
        api = setup.api(http)
        source = (await api.list_sources()).sources[0].name
        await api.create_session("Open a PR", source=source, automation_mode="AUTO_CREATE_PR")
        await api.create_session("Needs approval", require_plan_approval=True)
        await api.create_session("[ask] Asks a question")
        await api.create_session("[fail] Breaks")
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        with anyio.fail_after(60):
            while not all_finished(setup.receiver, 4):
                await react(setup.receiver, api, handled)
                await setup.receiver.next_arrival(within=0.5)
        upstream = await upstream_activities(api)
        # Session events (the pull request opened) follow their activities: on a loaded
        # machine they may still be in flight when the last activity arrived.
        await setup.receiver.wait_for(
            lambda r: (
                activity_arrivals(r) == upstream
                and {a.type for a in r.first_deliveries()} >= ALL_TYPES
            ),
            within=30,
        )
        # Session events come after a session's activities (pull request, state, then the
        # lifecycle event, in that order per session): wait for the last ones.
        ends = ("session.completed", "session.failed")
        await setup.receiver.wait_for(
            lambda r: sum(a.type in ends for a in r.first_deliveries()) >= 4, within=30
        )
        daemon.stop()
    receiver = setup.receiver
    # Lifecycle: each session ends once; the approval and the question each waited once.
    firsts = receiver.first_deliveries()
    assert sorted(a.type for a in firsts if a.type in ends) == [
        "session.completed",
        "session.completed",
        "session.completed",
        "session.failed",
    ]
    actions = [a.body["data"]["action"] for a in firsts if a.type == "session.action_required"]
    assert sorted(actions) == ["answer", "approve_plan"]
    assert receiver.rejected == []  # every signature verified by the reference package
    arrivals = receiver.first_deliveries()
    assert {a.type for a in arrivals} == ALL_TYPES
    for arrival in arrivals:
        assert set(arrival.body) == {"type", "timestamp", "data"}
        assert arrival.headers["content-type"] == "application/json"
        assert arrival.headers["user-agent"].startswith("sessionhook/")
        activity = arrival.body["data"].get("activity")
        if activity is not None:
            assert arrival.event_id == activity_event_id(activity["name"])
            assert arrival.body["timestamp"] == activity["createTime"]
        if arrival.type == "session.state_changed":
            assert (
                arrival.body["data"]["previous_state"] != arrival.body["data"]["session"]["state"]
            )
    # Each activity exactly once (the receiver accepted each id once), in upstream order.
    assert activity_arrivals(receiver) == upstream
    assert len({a.event_id for a in receiver.delivered}) == len(receiver.delivered)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["exclusive", "inclusive", "ignore"])
async def test_each_activity_delivered_once_whatever_the_server_does_with_create_time(
    tmp_path: Path, mode: str
) -> None:
    setup = Setup(tmp_path, poll={"backfill": True})
    setup.emulator = create_app(
        api_keys=(API_KEY,), step_delay=0.05, seed=5, create_time_filter=mode
    )
    daemon = setup.daemon()
    async with setup.api_http() as http, anyio.create_task_group() as tg:
        api = setup.api(http)
        for i in range(3):
            await api.create_session(f"Task {i}")
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await setup.receiver.wait_for(lambda r: all_finished(r, 3), within=60)
        upstream = await upstream_activities(api)
        await setup.receiver.wait_for(lambda r: activity_arrivals(r) == upstream, within=30)
        daemon.stop()
    # Delivered once each: no event id was accepted twice.
    ids = [a.event_id for a in setup.receiver.delivered]
    assert len(ids) == len(set(ids))


@pytest.mark.anyio
async def test_upstream_faults_and_a_refusing_consumer_lose_nothing(tmp_path: Path) -> None:
    setup = Setup(tmp_path, poll={"backfill": True})
    setup.emulator = create_app(
        api_keys=(API_KEY,), step_delay=0.05, seed=9, fault_rate_limit=0.15, fault_error=0.15
    )
    setup.receiver.fail_first = 1  # every event's first attempt is refused
    daemon = setup.daemon()
    # The test's own calls go to the emulator's world directly: the faults are for the relay.
    world = setup.emulator.state.world
    account = world.accounts[0]
    for i in range(4):
        world.create_session(account, prompt=f"Task {i}")

    def upstream() -> dict[str, list[str]]:
        sessions = world.list_sessions(account, after=None, limit=100).items
        return {
            s.name: [
                a.name for a in world.list_activities(account, s.id, after=None, limit=1000).items
            ]
            for s in sessions
        }

    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await setup.receiver.wait_for(lambda r: all_finished(r, 4), within=90)
        await setup.receiver.wait_for(lambda r: activity_arrivals(r) == upstream(), within=60)
        # Session events follow their session's activities (and wait for a GET that the
        # faults may fail): every session's final lifecycle event must be delivered too, and
        # every event refused once must have been delivered since.
        lifecycle = ("session.completed", "session.failed")
        await setup.receiver.wait_for(
            lambda r: (
                sum(a.type in lifecycle for a in r.first_deliveries()) >= 4
                and {a.event_id for a in r.arrivals} <= r.delivered_ids()
            ),
            within=60,
        )
        # It met 429s and 500s upstream and went on (a daemon that died would raise out
        # of the task group). The faults are random: a short run may need a few more polls.
        await setup.receiver.wait_for(
            lambda _: _met_429_and_500(daemon.metrics.render().decode()), within=60
        )
        daemon.stop()
    receiver = setup.receiver
    assert receiver.rejected == []
    first_attempts = [a for a in receiver.arrivals if a.attempt == 1]
    assert first_attempts and all(a.answered == 503 for a in first_attempts)
    assert receiver.delivered_ids() == {a.event_id for a in first_attempts}


def _met_429_and_500(metrics: str) -> bool:
    return 'status="429"' in metrics and 'status="500"' in metrics


@pytest.mark.anyio
async def test_dozens_of_sessions_are_delivered_concurrently_and_in_order(
    tmp_path: Path,
) -> None:
    setup = Setup(
        tmp_path,
        api={"requests_per_minute": 6000},
        poll={"backfill": True},
        delivery={"concurrency": 16},
    )
    setup.receiver.delay = 0.2  # a slow consumer
    daemon = setup.daemon()
    sessions = 30
    async with setup.api_http() as http, anyio.create_task_group() as tg:
        api = setup.api(http)
        for i in range(sessions):
            await api.create_session(f"Parallel task {i}")
        tg.start_soon(lambda: daemon.run(handle_signals=False))
        await setup.receiver.wait_for(lambda r: all_finished(r, sessions), within=110)
        upstream = await upstream_activities(api)
        await setup.receiver.wait_for(lambda r: activity_arrivals(r) == upstream, within=60)
        daemon.stop()
    receiver = setup.receiver
    assert receiver.max_in_flight > 4  # sessions did not wait on each other
    assert receiver.max_in_flight_per_session == 1  # one session's events never overlap
    assert activity_arrivals(receiver) == upstream  # per-session order


# --------------------------------------------------------------------------- over sockets


@asynccontextmanager
async def loopback(
    app: Starlette, receiver_app: Starlette
) -> AsyncIterator[tuple[str, str, anyio.abc.TaskGroup]]:
    """Serve the emulator and a consumer on 127.0.0.1; yield their URLs."""
    async with anyio.create_task_group() as tg:
        _, emu_port = await tg.start(serve, "127.0.0.1:0", app)
        _, rx_port = await tg.start(serve, "127.0.0.1:0", receiver_app)
        yield f"http://127.0.0.1:{emu_port}", f"http://127.0.0.1:{rx_port}/hook", tg
        tg.cancel_scope.cancel()


@asynccontextmanager
async def served(
    tmp_path: Path, receiver: Receiver, step_delay: float, seed: int | None = None, **config: Any
) -> AsyncIterator[tuple[str, Path]]:
    """The emulator (``step_delay``, ``seed``) and ``receiver`` on loopback, and a relay's
    config for them in ``tmp_path`` (more of it: ``config``): (the emulator's URL, the
    config)."""
    app = create_app(api_keys=(API_KEY,), step_delay=step_delay, seed=seed)
    async with loopback(app, receiver.app) as (base_url, hook_url, _):
        yield base_url, _config_for(tmp_path, base_url, hook_url, receiver.secret, **config)


class AwaitableRelay:
    """``sessionhook run --config ...`` as a subprocess; stderr goes to a file. Unlike the
    black-box ``Relay`` (tests/support/relay_process.py) it is waited on without blocking:
    the emulator it polls is served by this test's own event loop."""

    def __init__(self, config: Path, log: Path, *extra: str) -> None:
        self._args = [
            sys.executable,
            "-m",
            "sessionhook.cli",
            "run",
            "--config",
            str(config),
            *extra,
        ]
        self._log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> AwaitableRelay:
        with self._log.open("ab") as err:
            self.process = subprocess.Popen(
                self._args, stdout=subprocess.DEVNULL, stderr=err, env=_env()
            )
        return self

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    async def wait(self, within: float) -> int:
        assert self.process is not None
        process = self.process
        return await anyio.to_thread.run_sync(lambda: process.wait(timeout=within))

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    env.pop("WATCHDOG_USEC", None)
    return env


def _config_for(tmp_path: Path, base_url: str, hook_url: str, secret: str, **kw: Any) -> Path:
    kw.setdefault("log", {"level": "info", "format": "json"})
    kw.setdefault("poll", {"active_interval": 0.1, "discovery_interval": 0.3, "backfill": True})
    return write_config(tmp_path, base_url=base_url, hook_url=hook_url, secret=secret, **kw)


@pytest.mark.anyio
async def test_kill_9_mid_flow_then_restart_loses_nothing_and_keeps_ids(tmp_path: Path) -> None:
    receiver = Receiver(generate_secret())
    async with served(tmp_path, receiver, 0.25, seed=21) as (base_url, config):
        relay = AwaitableRelay(config, tmp_path / "relay.log")
        async with httpx.AsyncClient() as http:
            api = SessionsClient(http, base_url=base_url, api_key=API_KEY)
            for i in range(4):
                await api.create_session(f"Crash test {i}")
            try:
                relay.start()
                await receiver.wait_for(lambda r: len(r.delivered_ids()) >= 12, within=60)
                assert not all_finished(receiver, 4), "too late: everything was already done"
                relay.signal(signal.SIGKILL)
                assert await relay.wait(10) == -signal.SIGKILL
                before = {a.event_id for a in receiver.delivered}
                await api.create_session("Created while the relay was down")
                relay.start()
                await receiver.wait_for(lambda r: all_finished(r, 5), within=90)
                upstream = await upstream_activities(api)
                await receiver.wait_for(lambda r: activity_arrivals(r) == upstream, within=60)
                relay.signal(signal.SIGTERM)
                assert await relay.wait(15) == 0
            finally:
                relay.kill()
    # Every activity arrived at least once, under its documented, stable id.
    delivered = receiver.delivered_ids()
    for names in upstream.values():
        for name in names:
            assert activity_event_id(name) in delivered
    assert before <= delivered
    assert receiver.rejected == []


@pytest.mark.anyio
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_stop_signal_drains_in_flight_and_exits_zero(tmp_path: Path, signum: int) -> None:
    receiver = Receiver(generate_secret(), delay=2.0)
    async with served(tmp_path, receiver, 0.05, seed=4) as (base_url, config):
        relay = AwaitableRelay(config, tmp_path / "relay.log")
        async with httpx.AsyncClient() as http:
            await SessionsClient(http, base_url=base_url, api_key=API_KEY).create_session("Go")
        try:
            relay.start()
            await receiver.wait_for(lambda r: r.in_flight > 0, within=60)
            in_flight = receiver.received_ids()
            started = time.monotonic()
            relay.signal(signum)
            assert await relay.wait(15) == 0
            took = time.monotonic() - started
        finally:
            relay.kill()
    assert took < 12
    log = (tmp_path / "relay.log").read_text()
    assert "relay.stopped" in log
    assert "Traceback" not in log
    # The attempt that was in flight when the signal came was answered, not cut.
    assert in_flight <= {a.event_id for a in receiver.arrivals}


def _cli(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return forked_cli.run(*args, env=_env(), cwd=cwd, timeout=timeout)


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (lambda text: text.replace("[poll]\n", "[poll]\nsurprise = 1\n"), "poll.surprise"),
        (lambda text: text.replace('url = "http://127.0.0.1:9/hook"', 'url = "ftp://x"'), "url"),
        (lambda text: text.replace("api_key_file", 'api_key_env = "NOPE_NOT_SET"\n#'), "api"),
    ],
    ids=["unknown-key", "bad-url", "missing-api-key"],
)
def test_bad_config_prints_one_line_and_exits_2(
    tmp_path: Path, mutate: Callable[[str], str], key: str
) -> None:
    config = write_config(
        tmp_path,
        base_url="http://127.0.0.1:9",
        hook_url="http://127.0.0.1:9/hook",
        secret=generate_secret(),
    )
    config.write_text(mutate(config.read_text()))
    result = _cli("run", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("config error: ") and key in lines[0]


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    result = _cli("run", "--config", str(tmp_path / "nope.toml"), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "file not found" in result.stderr


def test_unusable_store_is_one_line_and_exit_1(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    config = write_config(
        tmp_path,
        base_url="http://127.0.0.1:9",
        secret=generate_secret(),
        store={"path": str(blocker / "relay.db")},
    )
    result = _cli("run", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: cannot open the store")


@pytest.mark.anyio
async def test_once_polls_delivers_and_exits(tmp_path: Path) -> None:
    receiver = Receiver(generate_secret())
    async with served(tmp_path, receiver, 0.02, seed=8) as (base_url, config):
        async with httpx.AsyncClient() as http:
            api = SessionsClient(http, base_url=base_url, api_key=API_KEY)
            await api.create_session("Quick")
            await anyio.sleep(1.0)  # let the emulated agent finish (20 ms a step)
            upstream = await upstream_activities(api)
        relay = AwaitableRelay(config, tmp_path / "relay.log", "--once").start()
        try:
            assert await relay.wait(60) == 0
        finally:
            relay.kill()
    assert activity_arrivals(receiver) == upstream
    assert {a.type for a in receiver.first_deliveries()} >= {"session.discovered"}


@pytest.mark.anyio
async def test_once_with_a_rejected_key_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    receiver = Receiver(generate_secret())
    async with served(tmp_path, receiver, 0.02, api_key="wrong-key") as (_, config):
        result = await anyio.to_thread.run_sync(
            lambda: _cli("run", "--config", str(config), "--once", cwd=tmp_path)
        )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the Sessions API rejected the API key")
    assert "Traceback" not in result.stderr


def test_demo_prints_verified_events_and_stops_cleanly(tmp_path: Path) -> None:
    command = ["demo", "--duration", "12", "--step-delay", "0.2", "--seed", "1"]
    with (tmp_path / "out").open("w+") as stdout, (tmp_path / "err").open("w+") as stderr:
        demo = subprocess.Popen(
            [sys.executable, "-m", "sessionhook.cli", *command],
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
            env=_env(),
        )
        try:
            # While it runs: its secrets are files of mode 0600 (the console's token among
            # them, which opens the console it names), none on its command line.
            deadline = time.monotonic() + 60
            while not (
                found := re.search(
                    r"console on (http://\S+)/console, its token in (\S+)\n",
                    (tmp_path / "out").read_text(),
                )
            ):
                assert demo.poll() is None, (tmp_path / "err").read_text()
                assert time.monotonic() < deadline, (tmp_path / "out").read_text()
                time.sleep(0.05)
            console, token_file = found.group(1), Path(found.group(2))
            secrets = [token_file, token_file.with_name("endpoint.secret")]
            secrets.append(token_file.with_name("api_key"))
            assert all(f.stat().st_mode & 0o777 == 0o600 for f in secrets)
            cmdline = Path(f"/proc/{demo.pid}/cmdline").read_text()
            assert not any(f.read_text().strip() in cmdline for f in secrets)
            token = token_file.read_text().strip()
            assert httpx.get(console + "/console").status_code == 401
            bearer = {"Authorization": f"Bearer {token}"}
            assert httpx.get(console + "/console", headers=bearer).status_code == 200
            assert demo.wait(timeout=90) == 0, (tmp_path / "err").read_text()
        finally:
            if demo.poll() is None:
                demo.kill()
                demo.wait(timeout=10)
        out = (tmp_path / "out").read_text()
    assert not token_file.parent.exists()  # the demo's directory goes with it
    for kind in (
        "session.discovered",
        "activity.plan_generated",
        "session.pull_request_opened",
        "activity.agent_messaged",
        "activity.session_completed",
    ):
        assert kind in out, out
    assert "approved the plan" in out and "answered the question" in out
    # ... by following the signed links of the events, as a person would (GET, then POST).
    assert "opened the approve link and approved the plan" in out, out
    assert "opened the reply link and answered the question" in out, out
    # Each link printed whole (a person opens it): the event's, and the chat button's.
    link = r"http://127\.0\.0\.1:\d+/actions/[\w-]+\.[\w-]+"
    assert re.search(rf"approve the plan \(\d steps\): {link} signature ok", out), out
    assert re.search(rf"answer: .* {link} signature ok", out), out
    assert re.search(rf"\[Approve plan\] <{link}>\n", out), out
    assert "session.action_required" in out and "session.completed" in out
    # The Slack-formatted endpoint's messages, printed readably; then the demo says its
    # sessions are done and stops by itself (12 s of --duration is a ceiling, not the end).
    assert "slack message  Plan waiting for your approval" in out, out
    assert "slack message  The agent has a question" in out, out
    assert "all 3 demo sessions are done (3 completed)" in out, out
    assert "signature ok" in out
    assert out.strip().splitlines()[-1].endswith("0 failed signature checks")
