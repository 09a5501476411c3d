"""Black-box tests of ``sessionhook run``: the real command in a subprocess, against an
independent stand-in of the Sessions API (``tests/standin.py``) and a verifying webhook
consumer (``tests/blackbox_consumer.py``), everything on 127.0.0.1.

Only the command's public contract is used: the config file, signals, exit statuses, the
upstream requests it makes and the webhooks it sends (checked with the Standard Webhooks
reference package). Nothing is imported from ``sessionhook``. The relay's stdout/stderr go
to files that are printed when a test fails.

Every wait polls a condition under a deadline; nothing asserts after a fixed sleep.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .blackbox_consumer import Consumer, Hit, new_secret
from .standin import RequestRecord, StandIn, parse_time

pytestmark = pytest.mark.integration

SESSIONHOOK = Path(sys.executable).parent / "sessionhook"

#: Event member -> webhook event type (docs/events.md, event types).
MEMBER_TYPES = {
    "planGenerated": "activity.plan_generated",
    "planApproved": "activity.plan_approved",
    "userMessaged": "activity.user_messaged",
    "agentMessaged": "activity.agent_messaged",
    "progressUpdated": "activity.progress_updated",
    "sessionCompleted": "activity.session_completed",
    "sessionFailed": "activity.session_failed",
}
SESSION_TYPES = {"session.discovered", "session.state_changed", "session.pull_request_opened"}


def expected_type(activity: dict[str, Any]) -> str:
    for member, event_type in MEMBER_TYPES.items():
        if member in activity:
            return event_type
    memberless = not any(isinstance(value, dict) for value in activity.values())
    if memberless and activity.get("originator") == "system":
        return "activity.session_started"  # the service's "Session started" notice
    return "activity.unknown"


def documented_id(kind: str, *parts: str) -> str:
    """The event id the design contract documents: evt_ + sha256("kind:part...")[:32]."""
    return "evt_" + hashlib.sha256(":".join((kind, *parts)).encode()).hexdigest()[:32]


def wait_until(
    predicate: Callable[[], bool],
    timeout: float,
    what: str,
    diagnose: Callable[[], str] | None = None,
) -> float:
    """Poll ``predicate`` until it holds; return the seconds it took, or fail at the deadline."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            detail = f"\n{diagnose()}" if diagnose is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{detail}")
        time.sleep(0.05)
    return time.monotonic() - started


# --------------------------------------------------------------------------- the relay


@dataclass
class Endpoint:
    name: str
    url: str
    secret: str
    events: tuple[str, ...] = ("*",)
    #: More TOML lines of this [[endpoints]] table (format, filter, rate_limit...).
    extra: tuple[str, ...] = ()


def relay_config(
    *,
    standin: StandIn,
    store: Path,
    endpoints: Iterable[Endpoint],
    rpm: int = 6000,
    active: float = 0.3,
    idle: float = 0.5,
    discovery: float = 0.3,
    backfill: bool = False,
    retry_delays: Iterable[float] = (0.2, 0.5, 1.0),
    timeout: float = 5.0,
    concurrency: int = 16,
    listen: str | None = None,
    render_timeout: float | None = None,
) -> str:
    def s(value: str) -> str:
        return json.dumps(value)  # a TOML basic string for plain ASCII text

    lines = [
        "[api]",
        f"base_url = {s(standin.base_url)}",
        'api_key_env = "SESSIONHOOK_API_KEY"',
        f"requests_per_minute = {rpm}",
        "[store]",
        f"path = {s(str(store))}",
        "[poll]",
        f"active_interval = {active}",
        f"idle_interval = {idle}",
        f"discovery_interval = {discovery}",
        f"backfill = {str(backfill).lower()}",
        "[delivery]",
        f"retry_delays = [{', '.join(str(float(d)) for d in retry_delays)}]",
        f"timeout = {timeout}",
        "allow_private_networks = true",
        f"concurrency = {concurrency}",
        *([f"render_timeout = {render_timeout}"] if render_timeout is not None else []),
        "[log]",
        'level = "info"',
        'format = "json"',
    ]
    for e in endpoints:
        events = ", ".join(s(g) for g in e.events)
        lines += [
            "[[endpoints]]",
            f"name = {s(e.name)}",
            f"url = {s(e.url)}",
            f"secret = {s(e.secret)}",
            f"events = [{events}]",
            *e.extra,
        ]
    if listen is not None:
        lines += ["[server]", f"listen = {s(listen)}"]
    return "\n".join(lines) + "\n"


class Relay:
    """One ``sessionhook run`` subprocess with its output in files."""

    def __init__(self, workdir: Path, label: str, config: str, api_key: str) -> None:
        self.label = label
        self.config_path = workdir / f"{label}.toml"
        self.config_path.write_text(config)
        self.stdout_path = workdir / f"{label}.stdout"
        self.stderr_path = workdir / f"{label}.stderr"
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SESSIONHOOK_", "NOTIFY_SOCKET", "WATCHDOG_", "STATE_DIRECTORY"))
        }
        self.env["SESSIONHOOK_API_KEY"] = api_key
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        #: Run in the child before the command (e.g. lower its open-files limit).
        self.preexec: Callable[[], None] | None = None

    def start(self, *args: str) -> Relay:
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [str(SESSIONHOOK), "run", "--config", str(self.config_path), *args],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.config_path.parent,
                preexec_fn=self.preexec,
            )
        return self

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.label}: still running {timeout:g} s later\n{self.diagnostics()}"
            ) from None
        return self.returncode

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout: float = 12.0) -> tuple[int, float]:
        """SIGTERM; returns (exit status, seconds it took to exit)."""
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.wait(timeout)
        return code, time.monotonic() - started

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.returncode = self.proc.wait(timeout=10)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def log_events(self) -> list[dict[str, Any]]:
        events = []
        for line in self.stderr.splitlines():
            try:
                parsed = json.loads(line)
            except ValueError:
                continue
            if isinstance(parsed, dict):
                events.append(parsed)
        return events

    def diagnostics(self, tail: int = 80) -> str:
        err = self.stderr.splitlines()[-tail:]
        out = self.stdout.splitlines()[-tail:]
        return (
            f"--- {self.label} (exit {self.returncode}) stderr, last {len(err)} lines:\n"
            + "\n".join(err)
            + f"\n--- {self.label} stdout:\n"
            + "\n".join(out)
        )


@dataclass
class Harness:
    """Servers and relay processes of one test; everything is stopped at teardown."""

    tmp: Path
    relays: list[Relay] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)

    def standin(self, **knobs: Any) -> StandIn:
        standin = StandIn(**knobs).start()
        self.closers.append(standin.stop)
        return standin

    def consumer(self) -> Consumer:
        consumer = Consumer().__enter__()
        self.closers.append(lambda: consumer.__exit__(None, None, None))
        return consumer

    def relay(
        self, standin: StandIn, label: str, *args: str, api_key: str | None = None, **config: Any
    ) -> Relay:
        config.setdefault("store", self.tmp / "relay.db")
        key = standin.api_key if api_key is None else api_key
        relay = Relay(self.tmp, label, relay_config(standin=standin, **config), key)
        self.relays.append(relay)
        return relay.start(*args)

    def diagnostics(self) -> str:
        return "\n".join(r.diagnostics() for r in self.relays)

    def close(self) -> None:
        for relay in self.relays:
            relay.kill()
        # The servers shut down in parallel (each takes a moment).
        stoppers = [threading.Thread(target=close) for close in self.closers]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join(timeout=15)
        # Shown by pytest only when the test failed.
        print(self.diagnostics())


@pytest.fixture
def harness(tmp_path: Path) -> Iterable[Harness]:
    h = Harness(tmp_path)
    try:
        yield h
    finally:
        h.close()


def wait_ready(standin: StandIn, relay: Relay, timeout: float = 20.0) -> None:
    """Until the relay completed a discovery pass (a second successful one was answered)."""

    def ready() -> bool:
        if not relay.alive():
            raise AssertionError(f"the relay exited early\n{relay.diagnostics()}")
        answered = [r for r in standin.requests("list_sessions") if r.status == 200]
        return len(answered) >= 2

    wait_until(ready, timeout, "the relay's first discovery pass", relay.diagnostics)


# --------------------------------------------------------------------------- scripts


Step = tuple[str, Any, dict[str, Any]]


def bash(command: str, output: str) -> dict[str, Any]:
    return {"bashOutput": {"command": command, "output": output}}  # exitCode 0: omitted


def change_set(message: str | None = None) -> dict[str, Any]:
    patch: dict[str, Any] = {"baseCommitId": "9f2c1e0d4b3a"}
    if message is not None:
        patch["unidiffPatch"] = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
        patch["suggestedCommitMessage"] = message
    return {"changeSet": {"source": "sources/github/acme/api", "gitPatch": patch}}


def script(kind: str) -> list[Step]:
    """A plausible life of a session: activities (member, kwargs) and state moves."""
    start: list[Step] = [
        ("state", "PLANNING", {}),
        ("activity", None, {"description": "Session started"}),
        ("activity", "planGenerated", {}),
    ]
    if kind == "resumed":  # COMPLETED is not final: a user message resumes the session
        return [
            *script("pr"),
            ("activity", "userMessaged", {}),
            ("state", "IN_PROGRESS", {}),
            ("activity", "agentMessaged", {}),
            ("activity", "sessionCompleted", {}),
            ("state", "COMPLETED", {}),
        ]
    if kind == "pr":
        return [
            *start,
            ("activity", "planApproved", {}),
            ("state", "IN_PROGRESS", {}),
            ("activity", "progressUpdated", {"artifacts": [bash("pytest -q", "3 passed")]}),
            ("activity", "progressUpdated", {"artifacts": [change_set()]}),
            ("activity", "agentMessaged", {}),
            ("activity", "sessionCompleted", {"artifacts": [change_set("Fix the login test")]}),
            ("pr", "https://github.example.test/acme/api/pull/7", {}),
            ("state", "COMPLETED", {}),
        ]
    if kind == "feedback":
        return [
            *start,
            ("state", "AWAITING_PLAN_APPROVAL", {}),
            ("activity", "planApproved", {}),
            ("state", "IN_PROGRESS", {}),
            ("activity", "agentMessaged", {}),
            ("state", "AWAITING_USER_FEEDBACK", {}),
            ("activity", "userMessaged", {}),
            ("state", "IN_PROGRESS", {}),
            ("activity", "toolCallCompleted", {"payload": {"tool": "grep", "ok": True}}),
            ("activity", "progressUpdated", {}),
            ("activity", "sessionCompleted", {}),
            ("state", "COMPLETED", {}),
        ]
    if kind == "fail":
        return [
            *start,
            ("activity", "planApproved", {}),
            ("state", "IN_PROGRESS", {}),
            ("activity", "progressUpdated", {"artifacts": [bash("make", "error 2")]}),
            ("activity", "sessionFailed", {}),
            ("state", "FAILED", {}),
        ]
    if kind == "short":
        return [
            ("state", "IN_PROGRESS", {}),
            ("activity", None, {"description": "Session started"}),
            ("activity", "planGenerated", {}),
            ("activity", "progressUpdated", {}),
            ("activity", "sessionCompleted", {}),
            ("state", "COMPLETED", {}),
        ]
    raise ValueError(kind)


@dataclass
class World:
    """What the test made happen upstream (the truth the deliveries are checked against)."""

    standin: StandIn
    states: dict[str, list[str]] = field(default_factory=dict)  # state history per session
    prs: dict[str, list[str]] = field(default_factory=dict)
    pending: dict[str, list[Step]] = field(default_factory=dict)

    def add(self, kind: str, **kwargs: Any) -> str:
        name = self.standin.add_session(f"{kind} task", **kwargs)
        self.states[name] = [self.standin.session(name)["state"]]
        self.prs[name] = []
        self.pending[name] = script(kind)
        return name

    def step(self, name: str) -> bool:
        """Do the next step of a session's script; False when it had none left."""
        if not self.pending[name]:
            return False
        what, arg, kwargs = self.pending[name].pop(0)
        if what == "state":
            self.standin.set_state(name, arg)
            self.states[name].append(arg)
        elif what == "pr":
            self.standin.add_pull_request(name, arg)
            self.prs[name].append(arg)
        else:
            self.standin.append_activity(name, arg, **kwargs)
        return True

    def play(
        self, rounds: int | None = None, pause: float = 0.0, only: Iterable[str] | None = None
    ) -> None:
        """Round-robin over the sessions (or ``only`` these), one step each per round."""
        names = list(self.pending if only is None else only)
        done = 0
        while rounds is None or done < rounds:
            progressed = [self.step(name) for name in names]
            if not any(progressed):
                return
            done += 1
            if pause:
                time.sleep(pause)

    def activity_names(self) -> set[str]:
        return set(self.standin.all_activities())

    def order(self) -> dict[str, list[str]]:
        return {name: [a["name"] for a in self.standin.activities(name)] for name in self.states}


# --------------------------------------------------------------------------- checks


def missing_activities(consumer: Consumer, endpoint: str, world: World) -> set[str]:
    return world.activity_names() - consumer.delivered_activity_names(endpoint)


def wait_all_delivered(
    consumer: Consumer, endpoints: Iterable[str], world: World, harness: Harness, timeout: float
) -> float:
    names = list(endpoints)

    def done() -> bool:
        return all(not missing_activities(consumer, e, world) for e in names)

    def diagnose() -> str:
        lines = [f"{e}: {len(missing_activities(consumer, e, world))} missing" for e in names]
        lines.append(f"stand-in requests: {dict(world.standin.counts())}")
        lines.append(f"stand-in statuses: {dict(world.standin.statuses())}")
        return "\n".join(lines) + "\n" + harness.diagnostics()

    return wait_until(done, timeout, "every activity to be delivered", diagnose)


def wait_settled(consumer: Consumer, endpoint: str, world: World, harness: Harness) -> None:
    """Until the final state and every pull request of every session were announced and
    every event id the endpoint has seen was eventually acknowledged (nothing left in a
    retry). A session discovered only after its script ended announces its pull request
    after all its activities: that is the last thing to wait for."""

    def settled() -> bool:
        hits = consumer.hits(endpoint)
        announced: dict[str, str] = {}
        prs: set[tuple[str, str]] = set()
        for h in hits:
            if h.ok and h.type in ("session.discovered", "session.state_changed"):
                assert h.session is not None and h.body is not None
                announced[h.session] = h.body["data"]["session"]["state"]
            if h.ok and h.type == "session.pull_request_opened" and h.body is not None:
                prs.add((str(h.session), h.body["data"]["pull_request"]["url"]))
        final = all(announced.get(name) == history[-1] for name, history in world.states.items())
        opened = {(name, url) for name, urls in world.prs.items() for url in urls} <= prs
        acked = {h.webhook_id for h in hits} == {h.webhook_id for h in hits if h.ok}
        # An event the relay queued but has not tried yet (a lifecycle event that follows
        # the final state, say) is invisible to the consumer: ask the relay's outbox too.
        return final and opened and acked and outbox_empty(harness.relays[-1], endpoint)

    wait_until(settled, 20, f"{endpoint} to settle", harness.diagnostics)


def run_status(relay: Relay) -> subprocess.CompletedProcess[str]:
    """``sessionhook status --json`` on ``relay``'s config (the operator's view, read while
    the daemon runs)."""
    return subprocess.run(
        [str(SESSIONHOOK), "status", "--json", "--config", str(relay.config_path)],
        capture_output=True,
        text=True,
        timeout=30,
        env=relay.env,
        check=False,
    )


def outbox_empty(relay: Relay, endpoint: str) -> bool:
    """Whether ``sessionhook status --json`` shows nothing waiting for ``endpoint`` (the
    operator's view of the outbox, read while the daemon runs)."""
    run = run_status(relay)
    if run.returncode != 0:
        return False
    waiting = {e["name"]: e["pending"] for e in json.loads(run.stdout)["endpoints"]}
    return waiting.get(endpoint) == 0


def assert_all_verified(hits: list[Hit]) -> None:
    assert hits, "the consumer received nothing"
    bad = [(h.endpoint, h.webhook_id, h.error) for h in hits if not h.verified]
    assert not bad, f"requests failing Standard Webhooks verification: {bad[:5]}"
    for h in hits:
        assert h.headers.get("content-type", "").startswith("application/json"), h.headers
        assert h.headers.get("user-agent", "").startswith("sessionhook/"), h.headers
        assert h.webhook_id.startswith("evt_"), h.webhook_id
        assert h.webhook_timestamp.isdigit(), h.webhook_timestamp
        assert h.body is not None and set(h.body) >= {"type", "timestamp", "data"}, h.raw[:200]


def assert_stable_ids(hits: list[Hit], activities: dict[str, dict[str, Any]]) -> dict[str, str]:
    """One webhook-id per activity (the documented derivation), one activity per id,
    and identical bytes on every attempt of one id. Returns activity name -> id."""
    ids: dict[str, set[str]] = defaultdict(set)
    bodies: dict[str, set[bytes]] = defaultdict(set)
    owner: dict[str, set[str]] = defaultdict(set)
    for h in hits:
        bodies[h.webhook_id].add(h.raw)
        name = h.activity_name
        if name is not None:
            ids[name].add(h.webhook_id)
            owner[h.webhook_id].add(name)
    for name, seen in ids.items():
        assert name in activities, f"an event for an activity that does not exist: {name}"
        assert seen == {documented_id("activity", name)}, (name, seen)
    for webhook_id, names in owner.items():
        assert len(names) == 1, f"{webhook_id} carried several activities: {names}"
    for webhook_id, variants in bodies.items():
        assert len(variants) == 1, f"{webhook_id} was sent with {len(variants)} different bodies"
    return {name: next(iter(seen)) for name, seen in ids.items()}


def assert_activity_bodies(hits: list[Hit], standin: StandIn) -> None:
    """Type, timestamp, the upstream activity whole, and the session summary."""
    activities = standin.all_activities()
    for h in hits:
        name = h.activity_name
        if name is None:
            continue
        upstream = activities[name]
        assert h.type == expected_type(upstream), (h.type, upstream)
        assert h.body is not None
        assert h.body["timestamp"] == upstream["createTime"]
        assert h.activity == upstream, f"the activity is not forwarded whole: {h.activity}"
        session_name = name.rsplit("/activities/", 1)[0]
        truth = standin.session(session_name)
        summary = h.body["data"]["session"]
        assert summary["name"] == session_name
        assert summary["id"] == truth["id"]
        assert summary["title"] == truth["title"]
        assert summary["url"] == truth["url"]
        assert summary["source"] == truth.get("sourceContext", {}).get("source", "")
        assert "state" in summary


def assert_summaries_complete(hits: list[Hit], standin: StandIn) -> None:
    """Every event's data.session carries the session's url and source."""
    wrong = []
    for h in hits:
        assert h.session is not None and h.body is not None
        truth = standin.session(h.session)
        summary = h.body["data"]["session"]
        expected = (truth["url"], truth.get("sourceContext", {}).get("source", ""))
        if (summary.get("url"), summary.get("source")) != expected:
            wrong.append((h.type, summary.get("url"), summary.get("source")))
    assert not wrong, f"{len(wrong)} of {len(hits)} events lack url/source: {wrong[:4]}"


def assert_session_order(hits: list[Hit], order: dict[str, list[str]]) -> None:
    """Per session (hits of one endpoint): no activity event is sent before the previous
    activity of the session (in upstream list order) has been acknowledged with a 2xx."""
    position = {name: (s, i) for s, names in order.items() for i, name in enumerate(names)}
    first_ack: dict[str, int] = {}
    for h in hits:
        if h.ok and h.activity_name is not None:
            first_ack[h.activity_name] = min(
                first_ack.get(h.activity_name, h.answered_seq), h.answered_seq
            )
    for h in hits:
        if h.activity_name is None:
            continue
        session, index = position[h.activity_name]
        if index == 0:
            continue
        previous = order[session][index - 1]
        acked = first_ack.get(previous)
        assert acked is not None and acked < h.seq, (
            f"{h.endpoint}: {h.activity_name} (#{index} of {session}) was sent before "
            f"{previous} had been delivered"
        )


def assert_session_events(
    consumer: Consumer, endpoint: str, world: World, *, state_changes: bool = True
) -> None:
    """session.discovered once per session; state changes chained up to the final state;
    each pull request announced."""
    by_session: dict[str, list[Hit]] = defaultdict(list)
    seen: set[str] = set()
    for h in consumer.delivered(endpoint):
        if h.webhook_id in seen:
            continue  # a re-delivery (at least once)
        seen.add(h.webhook_id)
        if h.type in SESSION_TYPES:
            assert h.session is not None and h.body is not None
            parse_time(h.body["timestamp"])  # an RFC 3339 upstream time
            by_session[h.session].append(h)
    for name, history in world.states.items():
        hits = by_session[name]
        discovered = [h for h in hits if h.type == "session.discovered"]
        assert discovered, f"{endpoint}: no session.discovered for {name}"
        assert {h.webhook_id for h in discovered} == {documented_id("session.discovered", name)}
        assert discovered[0].body is not None
        assert discovered[0].body["data"]["session"]["url"] == world.standin.session(name)["url"]
        if state_changes:
            changes = [h for h in hits if h.type == "session.state_changed"]
            current = discovered[0].body["data"]["session"]["state"]
            seen_states = [current]
            for h in changes:
                assert h.body is not None
                data = h.body["data"]
                assert data["previous_state"] == current, (name, data["previous_state"], current)
                current = data["session"]["state"]
                assert current != data["previous_state"]
                seen_states.append(current)
            assert current == history[-1], f"{name}: last announced {current}, is {history[-1]}"
            assert is_subsequence(seen_states, history), (seen_states, history)
        opened = {
            h.body["data"]["pull_request"]["url"]
            for h in hits
            if h.type == "session.pull_request_opened" and h.body is not None
        }
        assert opened == set(world.prs[name]), (name, opened, world.prs[name])


def is_subsequence(items: list[str], sequence: list[str]) -> bool:
    it = iter(sequence)
    return all(any(x == y for y in it) for x in items)


def assert_clean_exit(relay: Relay, within: float = 12.0) -> None:
    code, took = relay.terminate(timeout=within)
    assert code == 0, f"exit status {code} after SIGTERM\n{relay.diagnostics()}"
    assert took <= within
    assert "Traceback" not in relay.stderr, relay.diagnostics()


# --------------------------------------------------------------------------- scenarios


def test_clean_run_delivers_every_activity_signed_in_order(harness: Harness) -> None:
    """a. Several sessions, full streams appended while the relay runs, two endpoints.
    As the field notes say the service does, a session answers 404 for its first second:
    every event must still carry the session's url and source."""
    standin = harness.standin(not_found_for=1.0)
    consumer = harness.consumer()
    url_a, secret_a = consumer.add_endpoint("alpha")
    url_b, secret_b = consumer.add_endpoint("beta")
    endpoints = [
        Endpoint("alpha", url_a, secret_a),
        # Two secrets (a rotation): each signs; the consumer knows only the second.
        Endpoint("beta", url_b, f"{new_secret()} {secret_b}", ("activity.*",)),
    ]
    relay = harness.relay(standin, "relay", endpoints=endpoints)
    wait_ready(standin, relay)

    world = World(standin)
    world.add("pr")
    world.add("feedback")
    world.add("fail", source=None)  # a repoless session
    world.add("resumed")
    world.play(pause=0.12)
    wait_all_delivered(consumer, ["alpha", "beta"], world, harness, timeout=30)
    wait_settled(consumer, "alpha", world, harness)
    assert_clean_exit(relay)

    hits = consumer.hits()
    assert_all_verified(hits)
    activities = standin.all_activities()
    ids = assert_stable_ids(hits, activities)
    assert len(set(ids.values())) == len(activities)
    assert_activity_bodies(hits, standin)
    for endpoint in ("alpha", "beta"):
        mine = consumer.hits(endpoint)
        assert_session_order(mine, world.order())
        # A clean run: every event exactly once, each answered 200 at the first attempt.
        per_id = defaultdict(int)
        for h in mine:
            per_id[h.webhook_id] += 1
        duplicated = {i: n for i, n in per_id.items() if n > 1}
        assert not duplicated, f"{endpoint}: sent more than once in a clean run: {duplicated}"
    assert {h.type for h in consumer.hits("beta")} <= set(MEMBER_TYPES.values()) | {
        "activity.session_started",
        "activity.unknown",
    }, "beta subscribes to activity.* only"
    # Every session's first activity is the notice; the feedback script's future member is
    # the only unknown one.
    assert {"activity.session_started", "activity.unknown"} <= {h.type for h in hits}
    assert_session_events(consumer, "alpha", world)
    assert consumer.max_in_flight_per_session <= 1
    assert not consumer.strays
    assert all(len(h.headers["webhook-signature"].split()) == 2 for h in consumer.hits("beta"))
    assert all(len(h.headers["webhook-signature"].split()) == 1 for h in consumer.hits("alpha"))
    assert any(r.status == 404 for r in standin.requests("get_session")), "no 404 was served"
    assert_summaries_complete(hits, standin)


def test_upstream_faults_and_refused_first_attempts_lose_nothing(harness: Harness) -> None:
    """b. ~15 % upstream faults: 429 (Retry-After: 1), 500 and HTML garbage; the consumer
    refuses every first attempt."""
    standin = harness.standin(max_page_size=4)
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("flaky", refuse_first=True)
    relay = harness.relay(
        standin, "relay", endpoints=[Endpoint("flaky", url, secret)], retry_delays=(0.2, 0.5, 1)
    )
    wait_ready(standin, relay)
    world = World(standin)
    for kind in ("pr", "feedback", "fail", "short"):
        world.add(kind)
    # The faults start once the sessions are known (discovering new sessions under faults
    # has a test of its own), and last through their whole lives.
    wait_until(
        lambda: {h.session for h in consumer.delivered("flaky")} >= set(world.states),
        15,
        "the sessions to be discovered",
        harness.diagnostics,
    )
    standin.set_faults(
        rate_429=0.07,
        rate_500=0.06,
        rate_garbage=0.02,
        seed=7,
        max_consecutive=2,
        forced=("429", "500", "garbage"),  # each kind met at least once, whatever the timing
    )
    world.play(pause=0.1)
    wait_all_delivered(consumer, ["flaky"], world, harness, timeout=45)
    wait_settled(consumer, "flaky", world, harness)
    assert relay.alive(), relay.diagnostics()
    assert_clean_exit(relay)
    assert_session_events(consumer, "flaky", world)

    hits = consumer.hits("flaky")
    assert_all_verified(hits)
    assert_stable_ids(hits, standin.all_activities())
    assert_session_order(hits, world.order())
    # Every event was refused once, then retried with the same id (and the same bytes,
    # checked above) until a 2xx.
    by_id: dict[str, list[Hit]] = defaultdict(list)
    for h in hits:
        by_id[h.webhook_id].append(h)
    for webhook_id, attempts in by_id.items():
        assert attempts[0].status == 503 and attempts[0].attempt == 1, webhook_id
        assert any(a.ok for a in attempts), f"{webhook_id} was never delivered"
        assert [a.attempt for a in attempts] == list(range(1, len(attempts) + 1))
        stamps = [int(a.webhook_timestamp) for a in attempts]
        assert stamps == sorted(stamps), "webhook-timestamp must be fresh per attempt"
    # The faults really happened.
    assert {r.status for r in standin.requests() if r.fault} == {200, 429, 500}  # 200: garbage


def test_kill_9_and_rebuilt_database_lose_nothing_and_keep_ids(harness: Harness) -> None:
    """c. SIGKILL half-way, more activities, restart on the same store (killed twice more
    along the way); then a brand-new database with backfill = true gives the same ids."""
    standin = harness.standin()
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main", delay=0.05)
    store = harness.tmp / "store" / "relay.db"
    config: dict[str, Any] = {"endpoints": [Endpoint("main", url, secret)], "store": store}
    first = harness.relay(standin, "first", **config)
    wait_ready(standin, first)

    world = World(standin)
    sessions = [world.add("pr"), world.add("feedback"), world.add("fail")]
    world.play(rounds=6, pause=0.05)
    wait_until(
        lambda: len(consumer.delivered_activity_names("main")) >= 5,
        20,
        "some events to flow",
        harness.diagnostics,
    )
    first.kill()  # SIGKILL, whatever it was doing
    assert first.proc is not None and first.proc.returncode == -signal.SIGKILL
    before_kill = len(consumer.hits("main"))

    world.play(pause=0.02)  # the rest of the scripts while no relay runs...
    late = world.add("short")  # ...and a session it never saw
    world.play()
    # Twice more: restart on the same store, let it make some progress, kill -9 again.
    for n in range(2):
        count = len(consumer.hits("main"))
        again = harness.relay(standin, f"again-{n}", **config)
        wait_until(
            lambda count=count: (
                len(consumer.hits("main")) > count
                or not missing_activities(consumer, "main", world)
            ),
            20,
            f"progress after restart {n}",
            harness.diagnostics,
        )
        again.kill()
    second = harness.relay(standin, "second", **config)
    wait_all_delivered(consumer, ["main"], world, harness, timeout=40)
    wait_settled(consumer, "main", world, harness)
    assert_clean_exit(second)
    assert_session_events(consumer, "main", world)

    hits = consumer.hits("main")
    assert len(hits) > before_kill
    assert_all_verified(hits)
    ids = assert_stable_ids(hits, standin.all_activities())
    assert set(ids) == world.activity_names()
    assert_session_order(hits, world.order())
    discovered = {h.session: h.webhook_id for h in hits if h.type == "session.discovered"}
    assert set(discovered) == {*sessions, late}

    # A rebuilt database (deleted, backfill = true) against the same upstream.
    for path in store.parent.iterdir():
        path.unlink()
    url2, secret2 = consumer.add_endpoint("rebuilt")
    third = harness.relay(
        standin,
        "third",
        endpoints=[Endpoint("rebuilt", url2, secret2)],
        store=store,
        backfill=True,
    )
    wait_all_delivered(consumer, ["rebuilt"], world, harness, timeout=30)
    wait_until(
        lambda: (
            {h.session for h in consumer.delivered("rebuilt") if h.type == "session.discovered"}
            >= set(discovered)
        ),
        15,
        "session.discovered of every session after the rebuild",
        harness.diagnostics,
    )
    assert_clean_exit(third)
    rebuilt = consumer.hits("rebuilt")
    assert_all_verified(rebuilt)
    rebuilt_ids = assert_stable_ids(rebuilt, standin.all_activities())
    assert rebuilt_ids == ids, "the same activities must keep their webhook-ids"
    assert {
        h.session: h.webhook_id for h in rebuilt if h.type == "session.discovered"
    } == discovered
    assert_session_order(rebuilt, world.order())


def test_thirty_sessions_with_a_slow_consumer_are_delivered_concurrently(
    harness: Harness,
) -> None:
    """d. 30 sessions at once, 150 ms per request: all delivered, sessions in parallel,
    each session in order."""
    standin = harness.standin(max_page_size=10)
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("slow", delay=0.15)
    relay = harness.relay(
        standin,
        "relay",
        endpoints=[Endpoint("slow", url, secret)],
        rpm=30000,
        active=0.5,
        discovery=0.5,
        idle=1.0,
    )
    wait_ready(standin, relay)

    world = World(standin)
    for _ in range(30):
        world.add("short")
    world.play()
    wait_all_delivered(consumer, ["slow"], world, harness, timeout=60)
    wait_settled(consumer, "slow", world, harness)
    assert_clean_exit(relay)
    assert_session_events(consumer, "slow", world)

    hits = consumer.hits("slow")
    assert_all_verified(hits)
    assert_stable_ids(hits, standin.all_activities())
    assert_session_order(hits, world.order())
    assert consumer.max_in_flight_per_session == 1, "two requests of one session at once"
    assert consumer.max_in_flight >= 2, "sessions were delivered one at a time"
    # Sessions do not wait on each other: far quicker than one request after the other.
    serial = sum(h.answered - h.arrived for h in hits)
    elapsed = max(h.answered for h in hits) - min(h.arrived for h in hits)
    assert elapsed < serial / 2, f"took {elapsed:.1f} s; serially it is {serial:.1f} s"


def test_a_long_burst_in_one_session_is_delivered_whole_and_in_order(harness: Harness) -> None:
    """250 activities appear at once in one session (several full pages of 100)."""
    standin = harness.standin(max_page_size=100)
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main")
    relay = harness.relay(standin, "relay", endpoints=[Endpoint("main", url, secret)])
    wait_ready(standin, relay)
    world = World(standin)
    session = world.add("short")
    world.step(session)  # IN_PROGRESS
    for i in range(250):
        standin.append_activity(session, "progressUpdated", description=f"step {i}")
    world.play()
    wait_all_delivered(consumer, ["main"], world, harness, timeout=40)
    wait_settled(consumer, "main", world, harness)
    assert_clean_exit(relay)
    hits = consumer.hits("main")
    assert_all_verified(hits)
    assert_stable_ids(hits, standin.all_activities())
    assert_session_order(hits, world.order())
    delivered = [h.activity_name for h in hits if h.activity_name is not None]
    assert delivered == world.order()[session], "not exactly once each, in order"


@pytest.mark.parametrize("mode", ["exclusive", "inclusive", "ignore", "reject"])
def test_each_activity_archived_once_whatever_the_create_time_filter_does(
    harness: Harness, mode: str
) -> None:
    """e. createTime read as exclusive / inclusive / ignored (or refused with a 400);
    ties on page boundaries."""
    standin = harness.standin(create_time_mode=mode, max_page_size=2)
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main")
    store = harness.tmp / "relay.db"
    relay = harness.relay(
        standin, "relay", endpoints=[Endpoint("main", url, secret)], store=store, active=0.2
    )
    wait_ready(standin, relay)

    world = World(standin)
    sessions = [world.add("short"), world.add("short")]
    for s in sessions:
        standin.set_state(s, "IN_PROGRESS")
    for burst in range(4):
        for s in sessions:
            tie = standin.append_activity(s, "progressUpdated")["createTime"]
            for _ in range(2):  # the same createTime, to the microsecond
                standin.append_activity(s, "progressUpdated", create_time=tie)
        # Let a poll happen between bursts so the cursor is used.
        target = standin.counts()["list_activities"] + 2 * len(sessions)
        wait_until(
            lambda target=target: standin.counts()["list_activities"] >= target,
            10,
            f"polls after burst {burst}",
            harness.diagnostics,
        )
    world.play()
    wait_all_delivered(consumer, ["main"], world, harness, timeout=30)
    assert_clean_exit(relay)

    hits = consumer.hits("main")
    assert_all_verified(hits)
    activities = standin.all_activities()
    ids = assert_stable_ids(hits, activities)
    activity_hits = [h for h in hits if h.activity_name is not None]
    assert len(activity_hits) == len(activities) == len(ids), (
        f"{len(activity_hits)} activity deliveries for {len(activities)} activities"
    )
    assert all(h.ok for h in activity_hits)
    assert_session_order(hits, world.order())
    # The server did hand out activities more than once (dedupe was exercised)...
    assert standin.items_served > len(activities)
    # ...and the archive holds each once (the store's documented `activities` table).
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
        archived = db.execute("SELECT name FROM activities").fetchall()
    assert sorted(name for (name,) in archived) == sorted(activities)


def test_requests_per_minute_is_never_exceeded(harness: Harness) -> None:
    """f. A budget of 120/min against far more demand: never more than the budget plus a
    small burst over any window."""
    rpm = 120
    standin = harness.standin(max_page_size=2)
    world = World(standin)
    for _ in range(8):
        name = world.add("short")
        standin.set_state(name, "IN_PROGRESS")
        standin.append_activity(name, None)
    relay = harness.relay(
        standin, "relay", endpoints=[], rpm=rpm, active=0.1, discovery=0.1, idle=0.2, backfill=True
    )
    observe = 4.0
    wait_until(lambda: bool(standin.requests()), 20, "the first request", harness.diagnostics)
    t0 = standin.requests()[0].at
    wait_until(
        lambda: time.monotonic() - t0 >= observe and bool(relay.alive()),
        observe + 5,
        "the observation window",
        harness.diagnostics,
    )
    assert_clean_exit(relay)

    times = [r.at for r in standin.requests() if r.at <= t0 + observe]
    rate = rpm / 60.0
    burst = rpm / 10 + 1  # "a small burst": a tenth of the budget
    assert len(times) >= 0.5 * rate * observe, f"only {len(times)} requests: no demand?"
    worst = max(
        (j - i + 1) - rate * (times[j] - times[i])
        for i in range(len(times))
        for j in range(i, len(times))
    )
    assert worst <= burst, (
        f"{len(times)} requests in {observe:g} s with a budget of {rpm}/min; "
        f"a window exceeded the prorated budget by {worst:.1f} requests"
    )


@pytest.mark.parametrize(
    ("fragment", "key"),
    [
        ('[poll]\nactive_interval = "fast"\n', "poll.active_interval"),
        ('[api]\nbase_url = "http://127.0.0.1:9"\nbogus = 1\n', "api.bogus"),
        (
            '[[endpoints]]\nname = "x"\nurl = "ftp://example.test/hook"\n'
            'secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"\n',
            "endpoints[0].url",
        ),
        # The console shows payloads: no opt-out of its token on a reachable address.
        ('[server]\nlisten = "0.0.0.0:0"\nallow_unauthenticated = true\n', "server"),
        ('[server]\ntoken_env = "SESSIONHOOK_WEB_TOKEN_UNSET"\n', "server.token_env"),
        ('[server]\ntoken_file = "/nonexistent/web-token"\n', "server.token_file"),
    ],
)
def test_bad_config_exits_2_with_one_line_naming_the_key(
    tmp_path: Path, fragment: str, key: str
) -> None:
    """g. A bad configuration: exit 2, one line on stderr naming the key, nothing else."""
    config = tmp_path / "bad.toml"
    config.write_text(fragment)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
    env["SESSIONHOOK_API_KEY"] = "some-key"
    done = subprocess.run(
        [str(SESSIONHOOK), "run", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=30,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert len(lines) == 1, done.stderr
    assert key in lines[0], lines[0]
    assert not (tmp_path / "sessionhook.db").exists(), "a bad config must not create a store"


def test_missing_api_key_variable_is_a_config_error(tmp_path: Path) -> None:
    """g. The variable named by api.api_key_env unset: exit 2, one line naming the key."""
    config = tmp_path / "cfg.toml"
    config.write_text('[api]\napi_key_env = "SESSIONHOOK_TEST_UNSET_KEY"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
    done = subprocess.run(
        [str(SESSIONHOOK), "run", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=30,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert len(lines) == 1 and "api.api_key_env" in lines[0], done.stderr


def test_wrong_api_key(harness: Harness) -> None:
    """g. A rejected key: ``--once`` fails with one clear line (exit 1, as the command
    documents); the daemon keeps running, says so in its log, and stops cleanly."""
    standin = harness.standin()
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main")
    wrong = "a-different-key-than-the-stand-in-has"
    once = harness.relay(
        standin, "once", "--once", api_key=wrong, endpoints=[Endpoint("main", url, secret)]
    )
    code = once.wait(timeout=30)
    last = once.stderr.strip().splitlines()[-1]
    assert code == 1, once.diagnostics()
    assert "API key" in last and last.startswith("error:"), last
    assert "Traceback" not in once.stderr
    assert standin.statuses()[401] >= 1

    daemon = harness.relay(
        standin,
        "daemon",
        api_key=wrong,
        endpoints=[Endpoint("main", url, secret)],
        store=harness.tmp / "d.db",
    )
    wait_until(
        lambda: any(
            e.get("level") == "error" and "API key" in json.dumps(e) for e in daemon.log_events()
        ),
        20,
        "an error log line about the API key",
        harness.diagnostics,
    )
    assert daemon.alive(), daemon.diagnostics()
    assert_clean_exit(daemon)
    assert not consumer.hits()


def test_consumer_answers_410_3xx_and_retry_after(harness: Harness) -> None:
    """410 disables the endpoint at once; 3xx is a failure and never followed; a 429's
    Retry-After beats a shorter retry delay; a timeout is retried; an endpoint's events
    filter holds; a healthy endpoint gets everything meanwhile."""
    standin = harness.standin()
    consumer = harness.consumer()
    endpoints = []
    for name, behaviour, events in [
        ("healthy", {}, ("*",)),
        ("gone", {"status": 410}, ("*",)),
        ("moved", {"status": 302}, ("*",)),
        (
            "throttled",
            {"refuse_first": True, "refuse_status": 429, "refuse_retry_after": "1"},
            ("session.discovered",),
        ),
        ("sluggish", {"first_delay": 3.0}, ("session.discovered",)),
    ]:
        url, secret = consumer.add_endpoint(name, **behaviour)
        endpoints.append(Endpoint(name, url, secret, events))
    relay = harness.relay(
        standin, "relay", endpoints=endpoints, retry_delays=(0.2, 0.3, 0.4), timeout=1.0
    )
    wait_ready(standin, relay)

    world = World(standin)
    session = world.add("fail")
    world.play(pause=0.05)
    wait_all_delivered(consumer, ["healthy"], world, harness, timeout=20)
    wait_until(
        lambda: any(h.ok for h in consumer.hits("throttled")),
        20,
        "the throttled endpoint's retry",
        harness.diagnostics,
    )
    wait_until(
        lambda: len(consumer.hits("moved")) >= 2, 20, "a retry after a 302", harness.diagnostics
    )
    wait_until(
        lambda: len(consumer.hits("sluggish")) >= 2,
        20,
        "a retry after a timeout",
        harness.diagnostics,
    )
    assert_clean_exit(relay)

    assert_all_verified(consumer.hits())
    gone = consumer.hits("gone")
    assert len(gone) == 1, f"410 must disable the endpoint at once; it got {len(gone)} requests"
    moved = consumer.hits("moved")
    assert all(h.status == 302 for h in moved)
    assert moved[1].webhook_id == moved[0].webhook_id, "a failed event is retried first"
    assert not consumer.followed, "a redirect was followed"
    throttled = consumer.hits("throttled")
    assert {h.type for h in throttled} == {"session.discovered"}, "events filter ignored"
    assert [h.attempt for h in throttled] == [1, 2] and throttled[0].session == session
    gap = throttled[1].arrived - throttled[0].answered
    assert gap >= 0.95, f"retried {gap:.2f} s after a 429 with Retry-After: 1"
    sluggish = sorted(consumer.hits("sluggish"), key=lambda h: h.arrived)
    assert sluggish[0].webhook_id == sluggish[1].webhook_id
    assert sluggish[0].attempt == 1 and sluggish[1].attempt == 2
    # The second attempt came after the 1 s timeout, before the first would have answered.
    assert 0.9 <= sluggish[1].arrived - sluggish[0].arrived < 3.0


def test_sigint_finishes_the_delivery_in_flight_and_starts_no_other(harness: Harness) -> None:
    """SIGINT while a consumer takes 5.5 s to answer (longer than an HTTP client's usual
    5 s default, within delivery.timeout = 10 and the 10 s drain): the relay waits for that
    answer (and records it: a restart does not send it again), starts nothing new, exits 0."""
    standin = harness.standin()
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main", delay=5.5)
    config: dict[str, Any] = {
        "endpoints": [Endpoint("main", url, secret)],
        "store": harness.tmp / "relay.db",
        "timeout": 10.0,
    }
    first = harness.relay(standin, "first", **config)
    wait_ready(standin, first)
    world = World(standin)
    world.add("short")
    world.play()
    wait_until(lambda: consumer.in_flight >= 1, 20, "a delivery in flight", harness.diagnostics)
    assert first.proc is not None
    signalled = time.monotonic()
    first.proc.send_signal(signal.SIGINT)
    code = first.wait(timeout=12)
    exited = time.monotonic()
    assert code == 0, first.diagnostics()
    assert "Traceback" not in first.stderr
    finished = consumer.hits("main")
    assert finished, "the delivery in flight was dropped"
    assert all(h.ok for h in finished)
    assert max(h.answered for h in finished) <= exited, "exited before the answer came"
    assert all(h.arrived < signalled for h in finished), "a delivery started after SIGINT"
    done_before = {h.webhook_id for h in finished}

    consumer.behave("main", delay=0.0)
    second = harness.relay(standin, "second", **config)
    wait_all_delivered(consumer, ["main"], world, harness, timeout=20)
    wait_settled(consumer, "main", world, harness)
    assert_clean_exit(second)
    again = [h.webhook_id for h in consumer.hits("main")[len(finished) :]]
    assert not done_before & set(again), "a delivery finished during the drain was sent again"
    assert_session_order(consumer.hits("main"), world.order())


def test_once_honours_backfill_and_trims_large_media(harness: Harness) -> None:
    """``--once``: one pass, exit 0. backfill = false: the history before the first start is
    archived, not delivered; what came after is. backfill = true on a new store: all of it,
    with a media artifact above delivery.max_media_bytes trimmed (and marked)."""
    standin = harness.standin(max_page_size=5)
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main")
    world = World(standin)
    old = [world.add("pr"), world.add("feedback")]
    world.play()
    big = base64.b64encode(bytes(range(256)) * 1200).decode()  # 409,600 base64 characters
    screenshot = {"media": {"mimeType": "image/png", "data": big}}
    media = standin.append_activity(old[0], "progressUpdated", artifacts=[screenshot])
    store = harness.tmp / "once.db"
    main = [Endpoint("main", url, secret)]

    first = harness.relay(standin, "once-1", "--once", endpoints=main, store=store)
    assert first.wait(timeout=30) == 0, first.diagnostics()
    assert not consumer.hits(), "backfill = false delivered history from before the first start"

    newer = standin.append_activity(old[1], "userMessaged")
    newcomer = world.add("short")
    world.play()
    second = harness.relay(standin, "once-2", "--once", endpoints=main, store=store)
    assert second.wait(timeout=30) == 0, second.diagnostics()
    expected = {newer["name"], *(a["name"] for a in standin.activities(newcomer))}
    assert consumer.delivered_activity_names("main") == expected
    assert {h.session for h in consumer.hits("main") if h.type == "session.discovered"} == {
        newcomer
    }

    url2, secret2 = consumer.add_endpoint("full")
    third = harness.relay(
        standin,
        "once-3",
        "--once",
        endpoints=[Endpoint("full", url2, secret2)],
        store=harness.tmp / "backfill.db",
        backfill=True,
    )
    assert third.wait(timeout=30) == 0, third.diagnostics()
    assert consumer.delivered_activity_names("full") == world.activity_names()
    for relay in (first, second, third):
        assert "Traceback" not in relay.stderr, relay.diagnostics()
    hits = consumer.hits()
    assert_all_verified(hits)
    for endpoint in ("main", "full"):
        assert_stable_ids(consumer.hits(endpoint), standin.all_activities())
    [trimmed] = [h for h in consumer.hits("full") if h.activity_name == media["name"]]
    assert trimmed.activity is not None
    forwarded = trimmed.activity["artifacts"][0]["media"]
    assert forwarded == {
        "mimeType": "image/png",
        "data": "",
        "trimmed": True,
        "originalSize": len(big),
    }
    rest = {k: v for k, v in trimmed.activity.items() if k != "artifacts"}
    assert rest == {k: v for k, v in media.items() if k != "artifacts"}
    others = [h for h in hits if h.activity_name not in (None, media["name"])]
    assert_activity_bodies(others, standin)


def test_one_broken_session_backs_off_without_holding_up_the_others(harness: Harness) -> None:
    """One session's activity list answers 500 for a while: the others are delivered
    meanwhile, the broken one is retried with a backoff, and nothing of it is skipped."""
    standin = harness.standin()
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main")
    relay = harness.relay(standin, "relay", endpoints=[Endpoint("main", url, secret)])
    wait_ready(standin, relay)
    world = World(standin)
    healthy = [world.add("short"), world.add("pr")]
    broken = world.add("fail")
    standin.set_broken(broken)
    for _ in range(4):  # PLANNING and three activities, all at once: afterwards the
        world.step(broken)  # session stays unchanged while it is broken
    world.play(pause=0.05, only=healthy)  # the healthy sessions' lives
    path = f"/v1alpha/{broken}/activities"

    def failures() -> list[float]:
        return [r.at for r in standin.requests("list_activities") if r.path == path]

    wanted = {a["name"] for s in healthy for a in standin.activities(s)}
    wait_until(
        lambda: wanted <= consumer.delivered_activity_names("main") and len(failures()) >= 2,
        30,
        "the healthy sessions delivered while one is broken",
        harness.diagnostics,
    )
    assert relay.alive(), relay.diagnostics()
    assert not consumer.delivered_activity_names("main") & {
        a["name"] for a in standin.activities(broken)
    }
    seen = failures()
    standin.set_broken(broken, False)
    world.play()  # the rest of the broken session's life
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    # Polled every 0.3 s when healthy; after a failure it waits longer (backoff).
    assert min(gaps) >= 0.6, f"retried a failing session after {min(gaps):.2f} s"
    wait_all_delivered(consumer, ["main"], world, harness, timeout=40)
    wait_settled(consumer, "main", world, harness)
    assert_clean_exit(relay)
    assert_session_order(consumer.hits("main"), world.order())
    assert_session_events(consumer, "main", world)


def test_slow_upstream_sessions_do_not_hold_up_the_others(harness: Harness) -> None:
    """Five sessions whose upstream answers take 4 s each: a healthy session's new activity
    is still delivered promptly (sessions do not wait on each other)."""
    standin = harness.standin()
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main")
    relay = harness.relay(standin, "relay", endpoints=[Endpoint("main", url, secret)])
    wait_ready(standin, relay)
    world = World(standin)
    slow = [world.add("short") for _ in range(5)]
    for name in slow:
        world.step(name)  # IN_PROGRESS: polled every active_interval
    wait_until(
        lambda: {h.session for h in consumer.delivered("main")} >= set(slow),
        15,
        "the sessions to be discovered",
        harness.diagnostics,
    )
    for name in slow:
        standin.set_latency(name, 4.0)
    # Until the slow sessions occupy the relay: several of their requests are in progress.
    wait_until(lambda: standin.in_flight() >= 4, 10, "slow polls in flight", harness.diagnostics)
    healthy = world.add("short")
    world.step(healthy)
    activity = standin.append_activity(healthy, "planGenerated")
    took = wait_until(
        lambda: activity["name"] in consumer.delivered_activity_names("main"),
        10,
        "the healthy session's activity",
        harness.diagnostics,
    )
    for name in slow:
        standin.set_latency(name, 0.0)
    assert took < 2.0, f"a healthy session waited {took:.1f} s behind slow ones"
    assert_clean_exit(relay)


def test_sessions_created_while_the_first_discovery_fails_are_delivered(
    harness: Harness,
) -> None:
    """backfill = false skips what existed *before the first start*; a session created
    after the start, while the upstream still failed the first discovery, is not history."""
    standin = harness.standin()
    standin.set_faults(labels={"list_sessions"}, forced=("500",))
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main")
    relay = harness.relay(standin, "relay", endpoints=[Endpoint("main", url, secret)])
    wait_until(
        lambda: any(r.status == 500 for r in standin.requests("list_sessions")),
        20,
        "the first discovery to fail",
        harness.diagnostics,
    )
    world = World(standin)
    world.add("short")
    world.add("fail")
    world.play()
    wait_until(
        lambda: any(r.status == 200 for r in standin.requests("list_sessions")),
        20,
        "a discovery to succeed",
        harness.diagnostics,
    )
    wait_all_delivered(consumer, ["main"], world, harness, timeout=10)
    assert_clean_exit(relay)


def test_upstream_retry_after_holds_while_the_session_keeps_changing(harness: Harness) -> None:
    """A session's activity list answers 429 with Retry-After: 2 while its state keeps
    moving (which discovery notices): it is not asked again before 2 s."""
    standin = harness.standin()
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main")
    relay = harness.relay(standin, "relay", endpoints=[Endpoint("main", url, secret)])
    wait_ready(standin, relay)
    world = World(standin)
    name = world.add("short")
    world.step(name)  # IN_PROGRESS: polled every active_interval
    path = f"/v1alpha/{name}/activities"
    wait_until(
        lambda: any(r.path == path for r in standin.requests("list_activities")),
        15,
        "a first poll of the session",
        harness.diagnostics,
    )
    standin.set_latency(name, 0.5)  # each poll takes a while: discovery runs meanwhile
    standin.set_broken(name, status=429, retry_after="2")
    for i in range(16):  # the agent keeps moving the session, for about 2.4 s
        standin.set_state(name, ("PAUSED", "IN_PROGRESS")[i % 2])
        time.sleep(0.15)
    standin.set_broken(name, False)
    standin.set_latency(name, 0.0)
    assert relay.alive(), relay.diagnostics()

    def polls() -> list[RequestRecord]:
        return [r for r in standin.requests("list_activities") if r.path == path]

    last_429 = max(r.answered for r in polls() if r.status == 429)
    wait_until(
        lambda: any(r.at > last_429 for r in polls()),
        10,
        "a poll after the last 429",
        harness.diagnostics,
    )
    log = polls()
    throttled = [r for r in log if r.status == 429]
    early = [
        round(later[0].at - r.answered, 2)
        for r in throttled
        if (later := [x for x in log if x.at > r.answered])
    ]
    assert early and min(early) >= 1.9, f"asked again after a Retry-After: 2 within {early} s"
    assert_clean_exit(relay)


def test_new_sessions_are_discovered_promptly_despite_failing_gets(harness: Harness) -> None:
    """12 new sessions, a third of the GETs of a session failing (500): all are announced
    within a few seconds (without faults it takes well under one)."""
    standin = harness.standin(max_page_size=100)
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main")
    relay = harness.relay(
        standin, "relay", endpoints=[Endpoint("main", url, secret, ("session.discovered",))]
    )
    wait_ready(standin, relay)
    # Per path and request number, so the same GETs fail whatever the timing.
    standin.set_faults(rate_500=0.35, seed=3, labels={"get_session"})
    names = {standin.add_session(f"task {i}") for i in range(12)}
    wait_until(
        lambda: {h.session for h in consumer.delivered("main")} >= names,
        5,
        "every new session to be announced",
        lambda: f"announced: {len({h.session for h in consumer.delivered('main')})} of 12",
    )
    failed = sum(1 for r in standin.requests("get_session") if r.fault)
    assert failed >= 2, "too few GETs failed for the test to mean anything"
    assert_clean_exit(relay)
