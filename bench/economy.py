"""Upstream economy of the relay: requests per activity, first start, idle cost.

Runs ``sessionhook run`` as a separate process, exactly as a user would, against the
independent stand-in of the Sessions API (``tests/support/standin.py``, in this process)
and a verifying consumer (``tests/support/receiver.py``). Every request the stand-in answers
is the relay's (the bench changes the stand-in's world through its Python API, not over HTTP).

Scenarios (``--scenario``, default ``all``), each run ``--runs`` times (medians printed):

* ``finishing``: sessions that finish, at the relay's default poll settings: 20 working
  sessions gain 126 activities over 30 s (``--duration``, from the relay's first list read
  on) and then finish: each a "Session
  started" activity, a plan, its approval, progress updates, in five of them a pull request,
  and a ``sessionCompleted``
  (two a ``sessionFailed``; ``--state-first 1``: one of them shows the state ``FAILED``
  0.3 s before its activity) with the state. Requests per delivered activity by kind, the
  p50/p90 delivery latency, activities lost, lifecycle events delivered and how many came
  without the activity that explains them, and events out of order at the consumer (per
  session: activities by ``createTime``, a pull request and the final activity before
  ``session.completed`` / ``session.failed``).
* ``arriving``: the same workload, but the relay starts on an empty account (the run begins
  2 s after its first list read) and each session is created during the run (at a random
  moment of its first half) just before its first activity, as a user's sessions come: the
  latency of each session's first activity (how soon a new session is live) besides the
  figures of ``finishing``.
* ``working``: 20 sessions working at once, one activity every ~1.3 s each (uniform
  1.0..1.6 s; one in ten an agent message, the rest progress updates) for ``--duration``
  s. **Upstream requests per delivered activity** and the p50/p90 delivery latency
  (consumer arrival minus the activity's ``createTime``).
* ``frozen``: the same against a server that never moves ``updateTime`` when a session gains
  an activity (``StandIn(moves_update_time=False)``): activities lost (must be 0) and the
  latency (bounded by the safety poll interval).
* ``first-start``: 10,000 finished sessions + 10 working ones, ``backfill = false``, budget
  ``--rpm``. From the relay's start the working sessions gain an activity every second and a
  brand-new session appears 2 s after the relay's first list request: seconds until each
  working session's first new activity is delivered, requests before the first delivery,
  the new session's latency.
* ``idle``: 10,000 finished sessions, archived (the relay runs until its first start's work
  is over: no activity request for 5 s and, where the relay walks history in the background,
  ``sessionhook status`` says it is done); then the CPU seconds of the relay process over
  ``--idle-window`` s against a bare loop (a separate process) that only reads the same list
  pages (the whole list every ``discovery_interval``, the first page every second between
  those); the requests during the window; and the requests the first start made per
  history session until then (the list's aside).

    .venv/bin/python bench/economy.py --scenario working --runs 3 --active-interval 0.3
    .venv/bin/python bench/economy.py --set poll.mode='"timer"' ...   # extra config keys
    .venv/bin/python bench/economy.py --scenario finishing --tree after=src \
        --tree before=/tmp/before/src      # two trees, interleaved in each run

``--set section.key=TOML`` adds a config value (repeatable), e.g. to pick ``poll.mode``.
``--active-interval``, ``--idle-interval`` and ``--discovery-interval`` are written only when
given (else the relay's defaults apply). ``--tree name=src`` runs the relay of that source
tree (its ``src`` first on ``PYTHONPATH``; repeatable: the trees take turns in each run,
medians per tree).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx

from sessionhook.relay.domain.signing import generate_secret
from sessionhook.relay.telemetry import logs as relay_logging
from sessionhook.relay.web.server import serve

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the stand-in and the consumer of the tests
from tests.support.receiver import Receiver  # noqa: E402
from tests.support.standin import StandIn, parse_time  # noqa: E402

API_KEY = "bench-economy-key-0123456789"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- helpers


def _config(
    tmp: Path,
    base_url: str,
    hook_url: str,
    secret: str,
    args: argparse.Namespace,
    *,
    backfill: bool,
) -> Path:
    """The relay's config file; ``--set`` values are added to their sections."""
    sections: dict[str, dict[str, str]] = {
        "api": {
            "base_url": json.dumps(base_url),
            "api_key_env": '"SESSIONHOOK_API_KEY"',
            "requests_per_minute": str(args.rpm),
        },
        "store": {"path": json.dumps(str(tmp / "bench.db"))},
        "poll": {
            key: str(value)
            for key, value in (
                ("active_interval", args.active_interval),
                ("idle_interval", args.idle_interval),
                ("discovery_interval", args.discovery_interval),
            )
            if value is not None  # else the relay's default
        }
        | {"backfill": str(backfill).lower()},
        "delivery": {"allow_private_networks": "true"},
        "log": {"level": '"info"' if args.keep_logs else '"warning"', "format": '"json"'},
    }
    for item in args.set:
        dotted, _, value = item.partition("=")
        section, _, key = dotted.partition(".")
        sections.setdefault(section, {})[key] = value
    lines: list[str] = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {v}" for k, v in values.items()]
    lines += [
        "[[endpoints]]",
        'name = "bench"',
        f"url = {json.dumps(hook_url)}",
        f"secret = {json.dumps(secret)}",
        "",
    ]
    path = tmp / "config.toml"
    path.write_text("\n".join(lines))
    return path


def _start_relay(config: Path, log: Path, tree: Path | None = None) -> subprocess.Popen[bytes]:
    """``sessionhook run`` on ``config``: of the source tree ``tree`` when given (its ``src``
    first on ``PYTHONPATH``), else of the installed package."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SESSIONHOOK_", "NOTIFY_"))}
    env["SESSIONHOOK_API_KEY"] = API_KEY
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    with log.open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "sessionhook.cli", "run", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=env,
        )


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _activity_arrivals(receiver: Receiver) -> dict[str, float]:
    """Activity name -> wall time of its first delivery."""
    found: dict[str, float] = {}
    for arrival in receiver.first_deliveries():
        activity = arrival.body["data"].get("activity")
        if activity is not None:
            found.setdefault(activity["name"], arrival.arrived_at)
    return found


class World:
    """The stand-in, the consumer and the relay of one run."""

    def __init__(
        self, args: argparse.Namespace, *, moves_update_time: bool = True, tree: Path | None = None
    ) -> None:
        self.args = args
        self.tree = tree  # the relay's source tree (None: the installed package)
        self.secret = generate_secret()
        self.receiver = Receiver(self.secret)
        self.standin = StandIn(
            api_key=API_KEY, max_page_size=100, moves_update_time=moves_update_time
        )
        self.created: dict[str, float] = {}  # activity name -> wall createTime
        self.names: dict[str, str] = {}  # arriving: the script's session -> its name

    def add_activity(self, session: str, member: str = "progressUpdated") -> None:
        activity = self.standin.append_activity(session, member)
        self.created[activity["name"]] = parse_time(activity["createTime"]).timestamp()

    def start_relay(self, config: Path, log: Path) -> subprocess.Popen[bytes]:
        return _start_relay(config, log, self.tree)

    def requests_between(self, start_mono: float, end_mono: float) -> Counter[str]:
        return Counter(r.label for r in self.standin.requests() if start_mono <= r.at < end_mono)

    async def settle(self, done: Callable[[], bool]) -> None:
        """Wait (``--settle`` s at most) until every activity and what ``done`` says
        arrived."""
        for _ in range(round(self.args.settle * 10)):  # stragglers, bounded
            if not set(self.created) - set(_activity_arrivals(self.receiver)) and done():
                return
            await self.receiver.next_arrival(within=0.1)

    def delivery_figures(self, started: float, stopped: float) -> dict[str, Any]:
        """Activities delivered and lost, their latency (arrival minus ``createTime``), the
        upstream requests between ``started`` and ``stopped`` (monotonic) per activity."""
        arrivals = _activity_arrivals(self.receiver)
        latencies = [arrivals[n] - self.created[n] for n in self.created if n in arrivals]
        counts = self.requests_between(started, stopped)
        requests = sum(counts.values())
        return {
            "activities_upstream": len(self.created),
            "activities_delivered": len(latencies),
            "lost": len(set(self.created) - set(arrivals)),
            "latency_p50_s": _round(statistics.median(latencies) if latencies else None),
            "latency_p90_s": _round(_percentile(latencies, 0.9)),
            "latency_p99_s": _round(_percentile(latencies, 0.99)),
            "latency_max_s": _round(max(latencies) if latencies else None),
            "upstream_requests": requests,
            "by_kind": counts,
            "requests_per_activity": _round(requests / len(latencies)) if latencies else None,
        }


# --------------------------------------------------------------------------- scenarios


async def _working(world: World, tmp: Path, hook_url: str) -> dict[str, Any]:
    args = world.args
    rng = random.Random(7)
    config = _config(tmp, world.standin.base_url, hook_url, world.secret, args, backfill=True)
    sessions = [
        world.standin.add_session(f"Working {i}", state="IN_PROGRESS") for i in range(args.sessions)
    ]
    relay = world.start_relay(config, tmp / "relay.log")
    started = time.monotonic()
    try:
        next_at = {name: started + rng.uniform(0.2, 1.3) for name in sessions}
        end = started + args.duration
        while time.monotonic() < end:
            now = time.monotonic()
            for name, at in next_at.items():
                if at <= now:
                    # Mostly progress updates; one in ten a message (which may come with a
                    # change of the session: the relay reads the session after it).
                    world.add_activity(
                        name, "agentMessaged" if rng.random() < 0.1 else "progressUpdated"
                    )
                    next_at[name] = at + rng.uniform(1.0, 1.6)
            await anyio.sleep(max(0.0, min(next_at.values()) - time.monotonic()))
        await world.settle(lambda: True)
        stopped = time.monotonic()
    finally:
        code = _stop(relay)
    return world.delivery_figures(started, stopped) | {"relay_exit_status": code}


#: Lifecycle events, and the activity member that explains each.
_FINAL = {"session.completed": "sessionCompleted", "session.failed": "sessionFailed"}


def _finishing_script(
    args: argparse.Namespace, sessions: list[str], *, arriving: bool = False
) -> list[tuple[float, str, str]]:
    """``(seconds after the start, session, step)`` of the finishing workload, in time order.

    ``args.activities`` spread over the sessions (the first ones take the remainder): each a
    "Session started" activity (``started``: no event member), a plan, its approval,
    progress updates and a final activity, at random moments over ``args.duration`` s.
    ``arriving``: each session starts at a random moment of the first half (else of the
    first 2 s), created there (``create``) just before its first activity.
    Steps: an activity member, ``pullRequest`` (a pull request in the
    outputs and a progress update telling it: five sessions), ``failFirst`` (the state
    ``FAILED`` shown before its ``sessionFailed`` activity, 0.3 s later: the first
    ``args.state_first`` of the two sessions that fail).
    """
    rng = random.Random(20)
    per, extra = divmod(args.activities, len(sessions))
    script: list[tuple[float, str, str]] = []
    for index, name in enumerate(sessions):
        count = per + (1 if index < extra else 0)
        if index < 2:  # two fail, the first --state-first of them showing the state first
            final = "failFirst" if index < args.state_first else "sessionFailed"
        else:
            final = "sessionCompleted"
        progress = ["progressUpdated"] * (count - 4)
        if 2 <= index < 7 and progress:
            progress[-1] = "pullRequest"
        steps = ["started", "planGenerated", "planApproved", *progress, final]
        start = rng.uniform(0.0, args.duration / 2 if arriving else 2.0)
        moments = sorted(rng.uniform(start, args.duration) for _ in steps)
        script += [(at, name, step) for at, step in zip(moments, steps, strict=True)]
        if arriving:
            script.append((start, name, "create"))
    script.sort(key=lambda item: item[0])
    return script


def _finishing_step(world: World, name: str, step: str, ended: dict[str, float]) -> None:
    """One step of :func:`_finishing_script` applied to the stand-in."""
    standin = world.standin
    if step == "create":
        world.names[name] = standin.add_session(name, state="IN_PROGRESS")
        return
    name = world.names.get(name, name)
    if step == "pullRequest":
        standin.add_pull_request(name, f"https://github.com/acme/api/pull/{len(ended) + 1}")
        world.add_activity(name)
    elif step in ("sessionCompleted", "sessionFailed"):
        world.add_activity(name, step)  # the activity, then the state
        standin.set_state(name, "COMPLETED" if step == "sessionCompleted" else "FAILED")
        ended[name] = time.time()
    elif step == "failFirst":
        standin.set_state(name, "FAILED")
    elif step == "started":
        activity = standin.append_activity(name, None, description="Session started")
        world.created[activity["name"]] = parse_time(activity["createTime"]).timestamp()
    elif step == "failLate":
        world.add_activity(name, "sessionFailed")
        ended[name] = time.time()
    else:
        world.add_activity(name, step)


def _out_of_order(world: World) -> int:
    """Sessions whose events reached the consumer out of order: activities not in
    ``createTime`` order, or a lifecycle event before the activity explaining it or before
    the session's pull request."""
    bad = 0
    for arrivals in world.receiver.by_session().values():
        times = [
            world.created[a.body["data"]["activity"]["name"]]
            for a in arrivals
            if a.body["data"].get("activity") is not None
            and a.body["data"]["activity"]["name"] in world.created
        ]
        types = [a.type for a in arrivals]
        ok = times == sorted(times)
        for final, member in _FINAL.items():
            if final in types:
                before = types[: types.index(final)]
                ok = ok and events_type(member) in before
                pr = "session.pull_request_opened"
                ok = ok and (pr not in types or types.index(pr) < types.index(final))
        bad += not ok
    return bad


def _first_activities(world: World) -> dict[str, Any]:
    """Arriving sessions: the latency of each one's first activity (how soon it is live)."""
    arrivals = _activity_arrivals(world.receiver)
    first: dict[str, str] = {}  # session -> its first activity
    for name, created in world.created.items():
        session = name.split("/activities/")[0]
        if session not in first or created < world.created[first[session]]:
            first[session] = name
    latencies = [arrivals[n] - world.created[n] for n in first.values() if n in arrivals]
    return {
        "first_activity_latency_p50_s": _round(statistics.median(latencies) if latencies else None),
        "first_activity_latency_max_s": _round(max(latencies) if latencies else None),
    }


async def _arriving(world: World, tmp: Path, hook_url: str) -> dict[str, Any]:
    return await _finishing(world, tmp, hook_url, arriving=True)


def events_type(member: str) -> str:
    """The activity event type of an activity member (``sessionCompleted`` ->
    ``activity.session_completed``)."""
    snake = "".join("_" + c.lower() if c.isupper() else c for c in member)
    return "activity." + snake


async def _finishing(
    world: World, tmp: Path, hook_url: str, *, arriving: bool = False
) -> dict[str, Any]:
    args = world.args
    config = _config(tmp, world.standin.base_url, hook_url, world.secret, args, backfill=True)
    if arriving:  # created by the script's "create" steps
        sessions = [f"Working {i}" for i in range(args.sessions)]
    else:
        sessions = [
            world.standin.add_session(f"Working {i}", state="IN_PROGRESS")
            for i in range(args.sessions)
        ]
    script = _finishing_script(args, sessions, arriving=arriving)
    ended: dict[str, float] = {}  # session -> wall time its final step was taken
    relay = world.start_relay(config, tmp / "relay.log")
    spawned = time.monotonic()  # the requests are counted from here
    # The workload begins once the relay runs (its first list read answered: the start of
    # the process is no latency of a running relay); an arriving one 2 s later (the relay
    # idles on its empty account first).
    for _ in range(600):
        listed = [r.at for r in world.standin.requests("list_sessions") if r.status == 200]
        if listed and time.monotonic() - min(listed) >= (2.0 if arriving else 0.0):
            break
        await anyio.sleep(0.05)
    started = time.monotonic()
    try:
        pending = list(script)
        while pending:
            at, name, step = pending.pop(0)
            await anyio.sleep(max(0.0, started + at - time.monotonic()))
            _finishing_step(world, name, step, ended)
            if step == "failFirst":  # its activity follows the state
                pending.append((at + 0.3, name, "failLate"))
                pending.sort(key=lambda item: item[0])

        def finals() -> dict[str, Any]:
            return {a.session: a for a in world.receiver.first_deliveries() if a.type in _FINAL}

        await world.settle(lambda: len(finals()) == len(sessions))
        stopped = time.monotonic()
    finally:
        code = _stop(relay)
    figures = world.delivery_figures(spawned, stopped)
    if arriving:
        figures |= _first_activities(world)
    final_arrivals = finals()
    final_latencies = [a.arrived_at - ended[s] for s, a in final_arrivals.items() if s in ended]
    counts = figures["by_kind"]
    delivered = figures["activities_delivered"]
    return figures | {
        "lifecycle_delivered": len(final_arrivals),
        "lifecycle_without_activity": sum(
            1 for a in final_arrivals.values() if not a.body["data"].get("activity_name")
        ),
        "lifecycle_latency_p50_s": _round(
            statistics.median(final_latencies) if final_latencies else None
        ),
        "out_of_order_sessions": _out_of_order(world),
        **{
            f"per_activity_{kind}": _round(counts[kind] / delivered) if delivered else None
            for kind in ("list_sessions", "get_session", "list_activities")
        },
        "relay_exit_status": code,
    }


async def _first_start(world: World, tmp: Path, hook_url: str) -> dict[str, Any]:
    args = world.args
    standin = world.standin
    standin.add_sessions(args.history)
    working = [standin.add_session(f"Working {i}", state="IN_PROGRESS") for i in range(10)]
    for name in working:
        standin.append_activity(name, "progressUpdated")  # history: not delivered
    config = _config(tmp, standin.base_url, hook_url, world.secret, args, backfill=False)
    relay = world.start_relay(config, tmp / "relay.log")
    started_mono, started_wall = time.monotonic(), time.time()
    newcomer: str | None = None
    newcomer_activity: str | None = None
    try:
        end = started_mono + args.first_start_timeout
        tick = started_mono + 1.0
        while time.monotonic() < end:
            await anyio.sleep(max(0.0, tick - time.monotonic()))
            tick += 1.0
            for name in working:
                world.add_activity(name)
            listed = [r.at for r in standin.requests("list_sessions") if r.status == 200]
            # 2 s after the relay's first list: after its first start is recorded (a
            # session created before that is history, rightly not delivered).
            if newcomer is None and listed and time.monotonic() - min(listed) >= 2.0:
                newcomer = standin.add_session(
                    "Created during the history walk", state="IN_PROGRESS"
                )
                activity = standin.append_activity(newcomer, "planGenerated")
                newcomer_activity = activity["name"]
                world.created[newcomer_activity] = parse_time(activity["createTime"]).timestamp()
            arrivals = _activity_arrivals(world.receiver)
            seen = {
                a.session
                for a in world.receiver.first_deliveries()
                if a.body["data"].get("activity")
            }
            if set(working) <= seen and newcomer_activity in arrivals:
                break
    finally:
        code = _stop(relay)
    first_per_session: dict[str, float] = {}
    for arrival in world.receiver.first_deliveries():
        if arrival.body["data"].get("activity") is not None:
            first_per_session.setdefault(arrival.session, arrival.arrived_at)
    delivered_working = [
        first_per_session[n] - started_wall for n in working if n in first_per_session
    ]
    first = min(first_per_session.values(), default=None)
    before_first: int | None = None
    if first is not None:
        cut = started_mono + (first - started_wall)
        before_first = sum(world.requests_between(started_mono, cut).values())
    arrivals = _activity_arrivals(world.receiver)
    newcomer_latency = None
    if newcomer_activity is not None and newcomer_activity in arrivals:
        newcomer_latency = arrivals[newcomer_activity] - world.created[newcomer_activity]
    return {
        "history_sessions": args.history,
        "working_delivered": len(delivered_working),
        "all_working_delivered_after_s": _round(max(delivered_working))
        if len(delivered_working) == len(working)
        else None,
        "first_delivery_after_s": _round(None if first is None else first - started_wall),
        "requests_before_first_delivery": before_first,
        "newcomer_latency_s": _round(newcomer_latency),
        "requests_total": sum(world.requests_between(started_mono, time.monotonic()).values()),
        "relay_exit_status": code,
    }


async def _idle(world: World, tmp: Path, hook_url: str) -> dict[str, Any]:
    args = world.args
    standin = world.standin
    standin.add_sessions(args.history)
    config = _config(tmp, standin.base_url, hook_url, world.secret, args, backfill=False)
    relay = world.start_relay(config, tmp / "relay.log")
    started = time.monotonic()
    try:
        # Settled: the history's work is over (no activity request for 5 s, and the status
        # shows no history walk under way).
        while True:
            await anyio.sleep(1.0)
            if relay.poll() is not None:
                raise RuntimeError(f"the relay exited: {(tmp / 'relay.log').read_text()[-2000:]}")
            recent = world.requests_between(time.monotonic() - 5.0, time.monotonic())
            if (
                time.monotonic() - started > 10
                and not recent["list_activities"]
                and not recent["get_session"]
                and _history_done(config)
            ):
                break
        settle_s = time.monotonic() - started
        walked = world.requests_between(started, time.monotonic())
        window = args.idle_window
        relay_cpu, relay_counts = _measure(relay.pid, world, window)
        bare = _start_bare_walk(standin.base_url, args.discovery_interval or 10.0, 1.0)
        try:
            await anyio.sleep(0.5)  # imports done
            bare_cpu, _ = _measure(bare.pid, world, window)
        finally:
            bare.terminate()
            bare.wait()
    finally:
        code = _stop(relay)
    return {
        "history_sessions": args.history,
        "settled_after_s": _round(settle_s),
        # The first start's work over the history: every request but the list's, per session.
        "history_requests": {k: v for k, v in walked.items() if k != "list_sessions"},
        "history_requests_per_session": _round(
            sum(v for k, v in walked.items() if k != "list_sessions") / max(1, args.history)
        ),
        "relay_cpu_s": _round(relay_cpu),
        "bare_walk_cpu_s": _round(bare_cpu),
        "cpu_ratio": _round(relay_cpu / bare_cpu) if bare_cpu else None,
        "relay_requests_in_window": dict(relay_counts),
        "activity_requests_in_window": relay_counts["list_activities"],
        "window_s": window,
        "relay_exit_status": code,
    }


def _start_bare_walk(base_url: str, interval: float, head: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, "--bare-walk", base_url, str(interval), str(head)],
        stdin=subprocess.DEVNULL,
    )


def _history_done(config: Path) -> bool:
    """Whether ``sessionhook status`` shows no history walk under way (older relays show
    none at all: then only the request quiet counts)."""
    out = subprocess.run(
        [sys.executable, "-m", "sessionhook.cli", "status", "--config", str(config), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        status = json.loads(out.stdout)
    except ValueError:
        return True
    walk = status.get("history_walk") if isinstance(status, dict) else None
    if not isinstance(walk, dict):
        return True
    return bool(walk.get("done", 0) >= walk.get("total", 0))


def _measure(pid: int, world: World, window: float) -> tuple[float, Counter[str]]:
    """CPU seconds of ``pid`` and the stand-in's requests over ``window`` seconds."""
    start_cpu, start_mono = _cpu_seconds(pid), time.monotonic()
    time.sleep(window)
    cpu = _cpu_seconds(pid) - start_cpu
    return cpu, world.requests_between(start_mono, time.monotonic())


def bare_walk(base_url: str, interval: float, head_interval: float) -> None:
    """The baseline: the list pages the relay reads, nothing else: every ``interval`` every
    page of the session list (the stand-in has no list of archived sessions apart: the relay
    stops asking for it), and between those passes the first page every ``head_interval``."""

    def walk(http: httpx.Client, pages: int | None = None) -> None:
        token = None
        while pages is None or pages > 0:
            params = {"pageSize": "100", **({"pageToken": token} if token else {})}
            body = http.get("/v1alpha/sessions", params=params).json()
            token = body.get("nextPageToken")
            pages = None if pages is None else pages - 1
            if not token:
                break

    with httpx.Client(base_url=base_url, headers={"x-vendor-api-key": API_KEY}) as http:
        next_pass = time.monotonic()
        while True:
            started = time.monotonic()
            if started >= next_pass:
                next_pass = started + interval
                walk(http)
            else:
                walk(http, pages=1)
            time.sleep(
                max(0.0, min(head_interval, next_pass - started) - (time.monotonic() - started))
            )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


SCENARIOS: dict[str, tuple[Callable[..., Any], bool]] = {
    "finishing": (_finishing, True),
    "arriving": (_arriving, True),
    "working": (_working, True),
    "frozen": (_working, False),
    "first-start": (_first_start, True),
    "idle": (_idle, True),
}


async def run_one(
    args: argparse.Namespace, scenario: str, tree: Path | None = None
) -> dict[str, Any]:
    """One run of one scenario, in a fresh temporary directory and a fresh stand-in, with
    the relay of ``tree`` (``None``: the installed package)."""
    func, moves = SCENARIOS[scenario]
    world = World(args, moves_update_time=moves, tree=tree)
    with tempfile.TemporaryDirectory(prefix="sessionhook-economy-") as tmp_dir:
        world.standin.start()
        try:
            async with anyio.create_task_group() as tg:
                _, rx_port = await tg.start(serve, "127.0.0.1:0", world.receiver.app)
                try:
                    result: dict[str, Any] = await func(
                        world, Path(tmp_dir), f"http://127.0.0.1:{rx_port}/hook"
                    )
                finally:
                    tg.cancel_scope.cancel()
                    if args.keep_logs is not None:  # the relay's log, for a look afterwards
                        log = Path(tmp_dir) / "relay.log"
                        if log.exists():
                            args.keep_logs.mkdir(parents=True, exist_ok=True)
                            target = args.keep_logs / f"{scenario}-{time.time():.0f}.log"
                            target.write_bytes(log.read_bytes())
        finally:
            world.standin.stop()
    result["bad_signatures"] = len(world.receiver.rejected)
    return result


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, first in runs[0].items():
        if isinstance(first, int | float) and not isinstance(first, bool):
            values = [r[key] for r in runs if isinstance(r.get(key), int | float)]
            out[key] = _round(statistics.median(values)) if values else None
        elif first is None:
            values = [r[key] for r in runs if isinstance(r.get(key), int | float)]
            out[key] = _round(statistics.median(values)) if len(values) == len(runs) else None
    return out


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--bare-walk":
        bare_walk(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=20, help="working sessions")
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=15.0, help="wait for stragglers")
    parser.add_argument("--history", type=int, default=10_000, help="finished sessions")
    parser.add_argument("--first-start-timeout", type=float, default=60.0)
    parser.add_argument("--idle-window", type=float, default=20.0)
    parser.add_argument("--activities", type=int, default=126, help="finishing: in all")
    parser.add_argument(
        "--state-first",
        type=int,
        default=0,
        choices=(0, 1, 2),
        help="finishing: failing sessions whose state shows before their sessionFailed",
    )
    parser.add_argument("--active-interval", type=float, help="poll.active_interval")
    parser.add_argument("--idle-interval", type=float, help="poll.idle_interval")
    parser.add_argument("--discovery-interval", type=float, help="poll.discovery_interval")
    parser.add_argument("--rpm", type=int, default=100_000, help="api.requests_per_minute")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=TOML")
    parser.add_argument("--keep-logs", type=Path, metavar="DIR", help="copy each relay log here")
    parser.add_argument(
        "--tree", action="append", default=[], metavar="NAME=SRC", help="a relay source tree"
    )
    args = parser.parse_args()
    relay_logging.configure("warning", "console")  # stdout is for the figures
    chosen = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    trees: list[tuple[str, Path | None]] = [
        (t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree
    ] or [("installed", None)]
    summary: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    for scenario in chosen:
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
        for _ in range(args.runs):  # the trees take turns: a noisy minute hits them alike
            for name, tree in trees:
                runs[name].append(anyio.run(run_one, args, scenario, tree, backend="asyncio"))
        summary[scenario] = {
            name: {"median": _medians(done), "runs": done} for name, done in runs.items()
        }
        for name in runs:
            median = summary[scenario][name]["median"]
            print(f"{scenario} [{name}]: {json.dumps(median)}", file=sys.stderr)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
