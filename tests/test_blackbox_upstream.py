"""Black-box tests of ``sessionhook run`` against a hostile upstream: the real command in a
subprocess, the independent stand-in (``tests/support/standin.py``) misbehaving on purpose, a
verifying webhook consumer. Nothing is imported from ``sessionhook``.

Each case is one the relay used to lose to: a 10^5-deep answer (the daemon died), a 50 MB
answer (read whole), a slow drip (polling froze), runaway pagination (the budget spent),
a createTime in the year 9999 (later activities held back), activities named for another
session or for nothing (archived under the wrong session) and ``createTime: "garbage"``
(copied into the webhook's ``timestamp``).
"""

from __future__ import annotations

import itertools
import urllib.request
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.blackbox_consumer import Consumer
from tests.support.relay_process import Endpoint, Harness, Relay, run_cli, wait_until
from tests.support.standin import StandIn, parse_time

pytestmark = pytest.mark.process


def logged(relay: Relay, event: str, **fields: Any) -> list[dict[str, Any]]:
    return [
        e
        for e in relay.log_events()
        if e.get("event") == event and all(e.get(k) == v for k, v in fields.items())
    ]


def wait_logged(
    relay: Relay, event: str, what: str, *, times: int = 1, timeout: float = 20, **fields: Any
) -> None:
    """Until the relay logged ``event`` (with ``fields``) at least ``times`` times."""
    wait_until(
        lambda: len(logged(relay, event, **fields)) >= times, timeout, what, relay.diagnostics
    )


def status_output(relay: Relay) -> str:
    done = relay.command("status")
    assert done.returncode == 0, done.stderr
    return done.stdout


def peak_rss_mb(relay: Relay) -> float:
    """The process's high-water mark of resident memory (VmHWM), in MB."""
    assert relay.proc is not None
    for line in Path(f"/proc/{relay.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def alive(relay: Relay) -> None:
    assert relay.alive(), relay.diagnostics()
    assert "Traceback" not in relay.stderr, relay.diagnostics()


def relay_on_standin(harness: Harness, **config: Any) -> tuple[StandIn, Consumer, Relay]:
    """A stand-in, a consumer with endpoint ``main``, and the relay after its first pass."""
    standin = harness.standin()
    consumer, relay = harness.main_relay(standin, **config)
    return standin, consumer, relay


def wait_delivered(
    consumer: Consumer,
    relay: Relay,
    what: str,
    activities: Sequence[dict[str, Any]] = (),
    *,
    sessions: tuple[str, ...] = (),
    timeout: float = 30,
) -> None:
    """Until ``activities`` and an event of each of ``sessions`` reached ``main``."""
    names = {a["name"] for a in activities}

    def arrived() -> bool:
        seen = {h.session for h in consumer.delivered("main")}
        return names <= consumer.delivered_activity_names("main") and set(sessions) <= seen

    wait_until(arrived, timeout, what, relay.diagnostics)


def stops_cleanly(relay: Relay) -> None:
    alive(relay)
    code, _ = relay.terminate()
    assert code == 0, relay.diagnostics()


def test_deeply_nested_answers_are_malformed_and_the_daemon_stays_up(harness: Harness) -> None:
    standin = harness.standin()
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main")
    standin.set_deep("list_sessions")
    relay = harness.relay(standin, "relay", endpoints=[Endpoint("main", url, secret)])
    wait_logged(
        relay,
        "discovery.failed",
        "discovery to fail on the deep answer, twice",
        kind="too_deep",
        times=2,
    )
    alive(relay)
    # The API command line says it in one line, no traceback.
    env = {**relay.env, "SESSIONHOOK_BASE_URL": standin.base_url}
    listed = run_cli("sessions", "list", env=env, timeout=30)
    assert listed.returncode == 1, listed
    assert "Traceback" not in listed.stderr
    assert len(listed.stderr.strip().splitlines()) == 1, listed.stderr
    assert "deeper than" in listed.stderr

    standin.set_deep("list_sessions", on=False)
    name = standin.add_session("Deep one", state="IN_PROGRESS")
    first = standin.append_activity(name, "planGenerated")
    wait_delivered(consumer, relay, "delivery once the session list heals", [first], timeout=20)
    standin.set_deep("list_activities")
    second = standin.append_activity(name, "agentMessaged")
    wait_logged(
        relay,
        "poll.failed",
        "the activity poll to fail on the deep answer",
        kind="too_deep",
        session=name,
    )
    alive(relay)
    standin.set_deep("list_activities", on=False)
    wait_delivered(consumer, relay, "delivery once the activity list heals", [second], timeout=20)
    code, _ = relay.terminate()
    assert code == 0 and "Traceback" not in relay.stderr, relay.diagnostics()


def test_a_50_mb_activity_is_refused_by_name_in_bounded_memory_and_the_rest_delivered(
    harness: Harness,
) -> None:
    harness.fresh = True  # its memory from a fresh start, not the warm interpreter's
    standin, consumer, relay = relay_on_standin(harness)
    # Not working: polled only when its updateTime moves, so the huge page is walked once
    # per change rather than every active_interval.
    name = standin.add_session("Screenshots", state="AWAITING_USER_FEEDBACK")
    before = standin.append_activity(name, "agentMessaged")
    media = {"media": {"mimeType": "image/png", "data": "A" * 50_000_000}}
    huge = standin.append_activity(name, "progressUpdated", artifacts=[media])
    after = standin.append_activity(name, "agentMessaged")
    del media
    wait_delivered(
        consumer, relay, "the activities around the huge one", [before, after], timeout=60
    )
    refused = logged(relay, "poll.activity_refused", reason="too_large")
    assert refused and refused[0]["name"] == huge["name"], relay.diagnostics()
    assert refused[0]["session"] == name
    assert huge["name"] not in consumer.delivered_activity_names("main")
    rss = peak_rss_mb(relay)
    assert rss < 150, f"peak RSS {rss:.0f} MB while a 50 MB answer was served"
    # Polling goes on after it: a later activity arrives.
    later = standin.append_activity(name, "userMessaged")
    wait_delivered(consumer, relay, "an activity after the refused one", [later], timeout=60)
    alive(relay)
    text = status_output(relay)
    assert "refused upstream" in text and "too_large" in text, text
    assert huge["name"] in text, text
    code, _ = relay.terminate()
    assert code == 0, relay.diagnostics()


def test_a_slow_drip_is_cut_at_the_deadline_and_polling_resumes(harness: Harness) -> None:
    standin, consumer, relay = relay_on_standin(harness, more={"api": ['timeout = "1s"']})
    stuck = standin.add_session("Stuck", state="IN_PROGRESS")
    healthy = standin.add_session("Healthy", state="IN_PROGRESS")
    standin.append_activity(stuck, "planGenerated")
    wait_delivered(
        consumer, relay, "both sessions announced", sessions=(stuck, healthy), timeout=20
    )
    standin.set_drip(stuck, interval=0.2)  # a byte every 0.2 s: no read ever times out
    held = standin.append_activity(stuck, "agentMessaged")
    fine = [standin.append_activity(healthy, "progressUpdated") for _ in range(3)]
    wait_delivered(
        consumer, relay, "the healthy session's activities while the other drips", fine, timeout=20
    )
    wait_logged(
        relay,
        "poll.failed",
        "the dripping poll to be cut at the deadline, twice",
        kind="deadline",
        session=stuck,
        times=2,
    )
    # Discovery drips too: it fails at the deadline, and recovers on its own.
    standin.set_drip("list_sessions", interval=0.2)
    wait_logged(relay, "discovery.failed", "discovery to be cut at the deadline", kind="deadline")
    standin.set_drip("list_sessions", on=False)
    standin.set_drip(stuck, on=False)
    newcomer = standin.add_session("Newcomer", state="IN_PROGRESS")
    wait_until(
        lambda: (
            held["name"] in consumer.delivered_activity_names("main")
            and newcomer in {h.session for h in consumer.delivered("main")}
        ),
        30,
        "polling and discovery to resume once the upstream heals",
        relay.diagnostics,
    )
    stops_cleanly(relay)


def test_runaway_pagination_is_bounded_warned_and_backed_off(harness: Harness) -> None:
    """Empty pages under fresh tokens (a page may be empty before the end, AIP-158): only
    max_pages bounds the walk."""
    standin, consumer, relay = relay_on_standin(harness, more={"poll": ["max_pages = 4"]})
    endless = standin.add_session("Endless", state="IN_PROGRESS")
    healthy = standin.add_session("Healthy", state="IN_PROGRESS")
    first = standin.append_activity(endless, "planGenerated")
    wait_delivered(consumer, relay, "the endless session's first activity", [first], timeout=20)
    standin.set_runaway(endless, empty=True)
    path = f"/v1alpha/{endless}/activities"

    def walks() -> list[float]:
        """Start times of the walks: a request without a page token opens one."""
        return [
            r.at
            for r in standin.requests("list_activities")
            if r.path == path and "pageToken" not in r.query
        ]

    started = len(walks())
    mine = [standin.append_activity(healthy, "progressUpdated") for _ in range(3)]
    wait_until(lambda: len(walks()) >= started + 5, 40, "five runaway walks", relay.diagnostics)
    assert {a["name"] for a in mine} <= consumer.delivered_activity_names("main")
    warned = logged(relay, "poll.failed", kind="page_limit", session=endless)
    assert len(warned) >= 4, relay.diagnostics()
    gaps = [b - a for a, b in itertools.pairwise(walks()[started:])]
    assert gaps[-1] > 2 * gaps[0], f"not backing off: gaps {gaps}"
    # Every walk stopped at the bound.
    tokens = sum(1 for r in standin.requests("list_activities") if r.path == path)
    assert tokens <= 4 * len(walks()) + 4
    # The session list runs away too: discovery fails the same way.
    standin.set_runaway("list_sessions", empty=True)
    wait_logged(relay, "discovery.failed", "discovery to stop at the page bound", kind="page_limit")
    standin.set_runaway("list_sessions", on=False)
    standin.set_runaway(endless, on=False)
    later = standin.append_activity(endless, "agentMessaged")
    wait_delivered(
        consumer, relay, "the session to resume once its pagination ends", [later], timeout=40
    )
    stops_cleanly(relay)


def test_pagination_that_repeats_itself_ends_at_once_as_a_loop(harness: Harness) -> None:
    """The same page again under a fresh token: the walk ends at the first page that brings
    nothing new (the session list: the third in a row), warned and backed off, long before
    poll.max_pages (200, the default); what the first page brought is delivered."""
    standin, consumer, relay = relay_on_standin(harness)
    looping = standin.add_session("Looping", state="IN_PROGRESS")
    healthy = standin.add_session("Healthy", state="IN_PROGRESS")
    first = standin.append_activity(looping, "planGenerated")
    wait_delivered(consumer, relay, "the looping session's first activity", [first])
    standin.set_runaway(looping)
    path = f"/v1alpha/{looping}/activities"

    def asked(label: str, where: str) -> tuple[int, int]:
        """(walks, requests) of ``where``: a request without a page token opens a walk."""
        mine = [r for r in standin.requests(label) if r.path == where]
        return sum("pageToken" not in r.query for r in mine), len(mine)

    walks_before, requests_before = asked("list_activities", path)
    second = standin.append_activity(looping, "agentMessaged")
    mine = [standin.append_activity(healthy, "progressUpdated") for _ in range(3)]
    wait_logged(
        relay,
        "poll.failed",
        "three walks of the looping session ended as loops",
        kind="page_loop",
        session=looping,
        times=3,
        timeout=40,
    )
    wait_delivered(consumer, relay, "what the first pages brought", [second, *mine], timeout=5)
    warned = logged(relay, "poll.failed", kind="page_loop", session=looping)
    assert "page 2 brought nothing new" in warned[0]["error"], warned[0]
    assert not logged(relay, "poll.failed", kind="page_limit"), relay.diagnostics()
    walks, requests = asked("list_activities", path)
    # Two requests a walk (the page, then its repeat); one walk may be under way.
    assert requests - requests_before <= 2 * (walks - walks_before) + 1, (walks, requests)
    # The session list repeats itself: discovery ends at its third page of repeats.
    standin.set_runaway("list_sessions")
    passes_before, listed_before = asked("list_sessions", "/v1alpha/sessions")
    wait_logged(
        relay,
        "discovery.failed",
        "two discovery passes ended as loops",
        kind="page_loop",
        times=2,
        timeout=30,
    )
    passes, listed = asked("list_sessions", "/v1alpha/sessions")
    assert listed - listed_before <= 4 * (passes - passes_before) + 3, (passes, listed)
    assert "pages 2 to 4 brought nothing new" in logged(relay, "discovery.failed")[-1]["error"]
    standin.set_runaway("list_sessions", on=False)
    standin.set_runaway(looping, on=False)
    later = standin.append_activity(looping, "userMessaged")
    newcomer = standin.add_session("Newcomer", state="IN_PROGRESS")
    wait_delivered(
        consumer, relay, "polling and discovery to resume", [later], sessions=(newcomer,)
    )
    stops_cleanly(relay)


def titles(consumer: Any, session: str, event_type: str) -> list[str]:
    """``data.session.title`` of the events of ``event_type`` delivered about ``session``."""
    return [
        h.body["data"]["session"]["title"]
        for h in consumer.delivered("main")
        if h.session == session and h.type == event_type and h.body is not None
    ]


def test_one_bad_session_list_item_does_not_stop_discovery_for_the_account(
    harness: Harness, free_tcp_port: int
) -> None:
    """A title cut inside an emoji (a lone surrogate) used to make the whole session list
    malformed: nothing of the account was discovered, retried forever. Items are judged one
    by one: that session is relayed with U+FFFD in its title (warned, counted once); items
    that are no session are refused by name; every other session is delivered as usual."""
    standin, consumer, relay = relay_on_standin(harness, listen=f"127.0.0.1:{free_tcp_port}")
    broken = standin.add_session("Half an emoji \ud83d", state="IN_PROGRESS")
    unrelated = standin.add_session("Unrelated", state="IN_PROGRESS")
    wanted = [
        standin.append_activity(unrelated, "planGenerated"),
        standin.append_activity(unrelated, "agentMessaged"),
        standin.append_activity(broken, "progressUpdated"),
    ]
    wait_delivered(consumer, relay, "the activities of both sessions", wanted)
    assert titles(consumer, broken, "session.discovered") == ["Half an emoji \ufffd"]
    assert titles(consumer, unrelated, "session.discovered") == ["Unrelated"]
    assert not logged(relay, "discovery.failed"), relay.diagnostics()
    repaired = logged(relay, "discovery.session_repaired", session=broken)
    assert [(e["fields"], e["level"]) for e in repaired] == [("title", "warning")], repaired
    # Items that are no session are refused by name; a session listed after them is not.
    standin.add_raw_session({"name": "sessions/33", "state": 5})
    standin.add_raw_session({"name": "sessions/a/b", "title": "two ids"})  # stopped the daemon
    newcomer = standin.add_session("Newcomer", state="IN_PROGRESS")
    late = standin.append_activity(newcomer, "planGenerated")
    wait_delivered(consumer, relay, "a session listed after items that are no session", [late])
    refused = {
        (e["session"], e["reason"], e["level"]) for e in logged(relay, "discovery.session_refused")
    }
    assert refused == {
        ("sessions/33", "malformed", "warning"),
        ("sessions/a/b", "not_a_name", "warning"),
    }, relay.diagnostics()
    with urllib.request.urlopen(f"http://127.0.0.1:{free_tcp_port}/metrics", timeout=5) as got:
        metrics = got.read().decode()
    assert "sessionhook_sessions_repaired_total 1.0" in metrics, metrics
    for reason in ("malformed", "not_a_name"):
        assert f'sessionhook_sessions_refused_total{{reason="{reason}"}} 1.0' in metrics
    # Upstream fixes the title: the next read of the session carries it.
    standin.set_title(broken, "Fixed title")
    standin.set_state(broken, "COMPLETED")
    wait_until(
        lambda: titles(consumer, broken, "session.state_changed") == ["Fixed title"],
        30,
        "the state change with the fixed title",
        relay.diagnostics,
    )
    stops_cleanly(relay)


def test_a_createtime_in_the_year_9999_does_not_hold_back_later_activities(
    harness: Harness,
) -> None:
    standin, consumer, relay = relay_on_standin(harness)
    name = standin.add_session("Time traveller", state="IN_PROGRESS")
    future = standin.append_activity(
        name, "progressUpdated", create_time="9999-12-31T23:59:59.999999Z"
    )
    wait_delivered(
        consumer,
        relay,
        "the activity from the future (archived and delivered, not dropped)",
        [future],
        timeout=20,
    )
    hit = next(h for h in consumer.delivered("main") if h.activity_name == future["name"])
    assert hit.body is not None and hit.body["timestamp"] == future["createTime"]
    # The session keeps working: what it does next must arrive like anything else.
    later = [standin.append_activity(name, "agentMessaged") for _ in range(3)]
    wait_delivered(
        consumer, relay, "the activities after the one from the future", later, timeout=15
    )
    stops_cleanly(relay)


def test_foreign_names_are_refused_and_garbage_times_become_rfc3339(harness: Harness) -> None:
    standin, consumer, relay = relay_on_standin(harness)
    victim = standin.add_session("Victim", state="IN_PROGRESS")
    host = standin.add_session("Host", state="IN_PROGRESS")
    wait_delivered(consumer, relay, "both sessions announced", sessions=(victim, host), timeout=20)
    stolen = {
        "name": f"{victim}/activities/{'5' * 32}",
        "id": "5" * 32,
        "originator": "agent",
        "createTime": "2026-01-01T00:00:00.000000Z",
        "agentMessaged": {"agentMessage": "I belong to the victim"},
    }
    strangers = [
        {**stolen, "name": "sessions/OTHER/activities/x", "id": "x"},
        {**stolen, "name": "no resource name at all", "id": "y"},
        stolen,  # the victim's activity, served under the host first
    ]
    for activity in strangers:
        standin.append_raw(host, activity)
    # No name at all: no activity, and its page must not be lost for it.
    standin.append_raw(host, {"id": "z", "createTime": "2026-01-01T00:00:01.000000Z"})
    valid = standin.append_activity(host, "planGenerated")
    garbled = standin.append_raw(
        host,
        {
            "name": f"{host}/activities/{'6' * 32}",
            "id": "6" * 32,
            "originator": "agent",
            "createTime": "garbage",
            "agentMessaged": {"agentMessage": "my clock is broken"},
        },
    )
    wait_delivered(
        consumer,
        relay,
        "the valid activities of the page with the strangers",
        [valid, garbled],
        timeout=20,
    )
    # Only now does the victim's own list serve it: it must be delivered, as the victim's.
    standin.append_raw(victim, stolen)
    wait_delivered(consumer, relay, "the victim's activity under the victim", [stolen], timeout=20)
    for h in consumer.delivered("main"):
        if h.activity_name is not None:
            assert h.session is not None
            assert h.activity_name.startswith(h.session + "/activities/"), (
                h.session,
                h.activity_name,
            )
    names = consumer.delivered_activity_names("main")
    assert "sessions/OTHER/activities/x" not in names
    assert "no resource name at all" not in names
    refused = {(e["name"], e["reason"]) for e in logged(relay, "poll.activity_refused")}
    assert refused >= {
        ("sessions/OTHER/activities/x", "foreign_name"),
        ("no resource name at all", "not_a_name"),
        (stolen["name"], "foreign_name"),
        ("", "malformed"),
    }, relay.diagnostics()
    hit = next(h for h in consumer.delivered("main") if h.activity_name == garbled["name"])
    assert hit.body is not None and hit.activity is not None
    assert hit.activity["createTime"] == "garbage"  # the raw value stays in the activity
    stamp = parse_time(hit.body["timestamp"])  # RFC 3339, readable by a second parser
    assert isinstance(stamp, datetime) and stamp.year >= 2025
    text = status_output(relay)
    assert "refused upstream" in text and "foreign_name" in text and "not_a_name" in text, text
    assert "malformed" in text, text
    stops_cleanly(relay)
