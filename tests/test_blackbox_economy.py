"""Black-box tests of the upstream economy of ``sessionhook run``: list-driven polling
learned from ``updateTime`` (a server that moves it, one that does not, one that stops
mid-run), the background history walk of the first start (interleaved with new work,
killed with SIGKILL and resumed without fetching again what it archived).

As in ``test_blackbox.py``: the real command in a subprocess, the independent stand-in of
the API, a verifying consumer; nothing imported from ``sessionhook``; every wait polls a
condition under a deadline.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.blackbox_consumer import Consumer
from tests.support.relay_process import Harness, Relay, wait_until
from tests.support.standin import StandIn

pytestmark = pytest.mark.process


def economy_config(
    *,
    standin: StandIn,
    store: Path,
    endpoint: tuple[str, str, str],
    mode: str = "auto",
    active: float = 0.3,
    list_interval: float = 0.2,
    safety: float = 60.0,
    discovery: float = 0.5,
    rpm: int = 6000,
    history_share: float = 0.2,
) -> str:
    name, url, secret = endpoint
    return "\n".join(
        [
            "[api]",
            f"base_url = {json.dumps(standin.base_url)}",
            'api_key_env = "SESSIONHOOK_API_KEY"',
            f"requests_per_minute = {rpm}",
            "[store]",
            f"path = {json.dumps(str(store))}",
            "[poll]",
            f'mode = "{mode}"',
            f"active_interval = {active}",
            f"list_interval = {list_interval}",
            f"safety_interval = {safety}",
            f"discovery_interval = {discovery}",
            "idle_interval = 0.5",
            "backfill = false",
            f"history_share = {history_share}",
            "[delivery]",
            "retry_delays = [0.2, 0.5, 1.0]",
            "allow_private_networks = true",
            "[log]",
            'level = "info"',
            'format = "json"',
            "[[endpoints]]",
            f"name = {json.dumps(name)}",
            f"url = {json.dumps(url)}",
            f"secret = {json.dumps(secret)}",
            "",
        ]
    )


_ENDPOINTS: dict[int, tuple[str, str, str]] = {}


def start_relay(harness: Harness, standin: StandIn, consumer: Consumer, **knobs: Any) -> Relay:
    """A relay delivering to the consumer's endpoint ``rx`` (added at the first start)."""
    if id(consumer) not in _ENDPOINTS:
        url, secret = consumer.add_endpoint("rx")
        _ENDPOINTS[id(consumer)] = ("rx", url, secret)
    config = economy_config(
        standin=standin, store=harness.tmp / "relay.db", endpoint=_ENDPOINTS[id(consumer)], **knobs
    )
    return harness.start(f"relay{len(harness.relays)}", config, standin.api_key)


def wait_listing(standin: StandIn, relay: Relay) -> None:
    """Until the relay listed the sessions once: its first start is recorded (what comes
    after is delivered)."""
    wait_until(
        lambda: any(r.status == 200 for r in standin.requests("list_sessions")),
        20,
        "the first list",
        relay.diagnostics,
    )


def learned(relay: Relay) -> list[str]:
    """The verdicts the relay logged, in order."""
    return [
        str(e.get("verdict"))
        for e in relay.log_events()
        if e.get("event") == "poll.update_time_learned"
    ]


def delivered_names(consumer: Consumer) -> set[str]:
    return consumer.delivered_activity_names("rx")


def activity_polls(standin: StandIn, session: str, since: float) -> int:
    return sum(
        1
        for r in standin.requests("list_activities")
        if r.path.endswith(f"{session}/activities") and r.at >= since
    )


def feed(standin: StandIn, session: str, count: int, pause: float) -> list[str]:
    names = []
    for _ in range(count):
        names.append(standin.append_activity(session, "progressUpdated")["name"])
        time.sleep(pause)
    return names


# --------------------------------------------------------------------------- learning


def feed_until_learned(standin: StandIn, relay: Relay, session: str, verdict: str) -> list[str]:
    """Feed ``session`` an activity every 0.1 s until the relay logged ``verdict``; the
    names of what it was fed."""
    sent: list[str] = []

    def learned_it() -> bool:
        sent.extend(feed(standin, session, 1, 0.1))
        return verdict in learned(relay)

    wait_until(learned_it, 30, f"the verdict {verdict!r}", relay.diagnostics)
    return sent


def test_a_server_that_moves_update_time_is_polled_from_the_list(harness: Harness) -> None:
    standin = harness.standin(max_page_size=100)
    consumer = harness.consumer()
    relay = start_relay(harness, standin, consumer)
    wait_listing(standin, relay)
    busy = standin.add_session("Busy", state="IN_PROGRESS")
    quiet = standin.add_session("Quiet", state="IN_PROGRESS")
    sent = feed_until_learned(standin, relay, busy, "moves")
    # List mode: the quiet working session is left alone (its safety poll is a minute
    # away) while the busy one is polled as the list shows it move. On the timer (every
    # 0.3 s) the quiet one would have been polled about ten times in the next 3 s.
    settled = time.monotonic() + 0.5
    deadline = settled + 3.0
    while time.monotonic() < deadline:
        sent.extend(feed(standin, busy, 1, 0.2))
    assert activity_polls(standin, quiet, settled) == 0
    # And when the quiet session does something, the list shows it: it is delivered.
    late = standin.append_activity(quiet, "agentMessaged")["name"]
    wait_until(
        lambda: {*sent, late} <= delivered_names(consumer),
        20,
        "every activity delivered",
        relay.diagnostics,
    )
    assert learned(relay) == ["moves"]


def test_a_server_that_never_moves_update_time_keeps_the_timer(harness: Harness) -> None:
    standin = harness.standin(max_page_size=100, moves_update_time=False)
    consumer = harness.consumer()
    relay = start_relay(harness, standin, consumer)
    wait_listing(standin, relay)
    busy = standin.add_session("Busy", state="IN_PROGRESS")
    quiet = standin.add_session("Quiet", state="IN_PROGRESS")
    sent = feed(standin, busy, 4, 0.4)
    wait_until(lambda: "still" in learned(relay), 20, "the verdict 'still'", relay.diagnostics)
    sent += feed(standin, busy, 6, 0.3)
    since = time.monotonic()
    sent += feed(standin, quiet, 2, 0.3)
    wait_until(
        lambda: set(sent) <= delivered_names(consumer),
        20,
        "every activity delivered (nothing lost)",
        relay.diagnostics,
    )
    assert "moves" not in learned(relay)
    # Still on the timer: the quiet session is polled although the list never moves.
    wait_until(
        lambda: activity_polls(standin, quiet, since) >= 3,
        10,
        "timer polls of the quiet session",
        relay.diagnostics,
    )


def test_a_server_that_stops_moving_update_time_mid_run_loses_nothing(
    harness: Harness,
) -> None:
    standin = harness.standin(max_page_size=100)
    consumer = harness.consumer()
    relay = start_relay(harness, standin, consumer, safety=2.0)
    wait_listing(standin, relay)
    busy = standin.add_session("Busy", state="IN_PROGRESS")
    sent = feed_until_learned(standin, relay, busy, "moves")
    standin.moves_update_time = False  # the server changes its behaviour
    changed = feed(standin, busy, 3, 0.2)
    # Only the safety poll can find these; it also teaches the relay the server changed.
    wait_until(
        lambda: set(changed) <= delivered_names(consumer),
        20,
        "the activities the list no longer shows",
        relay.diagnostics,
    )
    wait_until(
        lambda: learned(relay)[-1:] == ["still"], 10, "the verdict 'still'", relay.diagnostics
    )
    after = feed(standin, busy, 3, 0.2)  # back on the timer
    wait_until(
        lambda: {*sent, *changed, *after} <= delivered_names(consumer),
        20,
        "every activity delivered",
        relay.diagnostics,
    )
    assert learned(relay) == ["moves", "still"]


# --------------------------------------------------------------------------- history


def status(relay: Relay) -> dict[str, Any]:
    out = relay.command("status", "--json")
    assert out.returncode == 0, out.stderr
    parsed: dict[str, Any] = json.loads(out.stdout)
    return parsed


def archived_history(store: Path) -> set[str]:
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT name FROM sessions WHERE history = 1 AND history_done_at IS NOT NULL"
        ).fetchall()
    return {r[0] for r in rows}


def test_history_walk_runs_behind_new_work_and_resumes_after_kill_9(harness: Harness) -> None:
    standin = harness.standin(max_page_size=10)
    consumer = harness.consumer()
    standin.add_sessions(40)  # finished before the first start: the history
    history = set(standin.session_names())
    working = standin.add_session("Working before the start", state="IN_PROGRESS")
    # 1200 a minute, a quarter for the history: about 2.5 history sessions a second.
    knobs: dict[str, Any] = {"rpm": 1200, "history_share": 0.25, "discovery": 2.0}
    relay = start_relay(harness, standin, consumer, **knobs)
    wait_listing(standin, relay)
    fresh = standin.add_session("Created during the walk", state="IN_PROGRESS")
    new_work = [
        standin.append_activity(fresh, "planGenerated")["name"],
        standin.append_activity(working, "agentMessaged")["name"],
    ]
    wait_until(
        lambda: set(new_work) <= delivered_names(consumer),
        20,
        "the new work delivered",
        relay.diagnostics,
    )
    delivered_at = max(h.arrived for h in consumer.hits("rx") if h.activity_name in new_work)

    def history_gets(until: float = float("inf"), since: float = 0.0) -> list[str]:
        return [
            r.path.split("/v1alpha/")[1]
            for r in standin.requests("get_session")
            if since <= r.at < until and r.path.split("/v1alpha/")[1] in history
        ]

    # New work went first: delivered while most of the history was still to walk.
    assert len(history_gets(delivered_at)) < len(history) / 2
    # Nothing of the history was fetched before the list was walked once (5 pages).
    first_history = min(
        (r.at for r in standin.requests("get_session") if r.path.split("/v1alpha/")[1] in history),
        default=float("inf"),
    )
    pages_before = [r for r in standin.requests("list_sessions") if r.at < first_history]
    assert len(pages_before) >= 5

    def progressing() -> bool:
        walk = status(relay)["history_walk"]
        return bool(walk["total"] == len(history) and 8 <= walk["done"] < len(history))

    wait_until(progressing, 30, "the history walk under way", relay.diagnostics, every=0.5)
    relay.kill()  # SIGKILL, mid-walk
    done_before = archived_history(harness.tmp / "relay.db")
    assert 8 <= len(done_before) < len(history)
    restarted = time.monotonic()
    relay = start_relay(harness, standin, consumer, **knobs)
    wait_until(
        lambda: status(relay)["history_walk"]["remaining"] == 0,
        60,
        "the history walk finished",
        relay.diagnostics,
        every=0.5,
    )
    # Resumed without fetching again what was archived before the kill...
    refetched = [
        r.path
        for r in standin.requests()
        if r.at >= restarted
        and r.label in ("get_session", "list_activities")
        and any(
            r.path.endswith(name) or r.path.endswith(f"{name}/activities") for name in done_before
        )
    ]
    assert refetched == []
    # ...and every session of the history was archived with its activities.
    assert archived_history(harness.tmp / "relay.db") == history
    with sqlite3.connect(f"file:{harness.tmp / 'relay.db'}?mode=ro", uri=True) as db:
        archived = {r[0] for r in db.execute("SELECT session_name FROM activities")}
        announced = {
            r[0]
            for r in db.execute("SELECT session_name FROM events WHERE type = 'session.discovered'")
        }
    assert history <= archived
    assert history <= announced  # session.discovered archived too (not delivered)
    # The history is archived, not delivered.
    assert not {h.session for h in consumer.hits("rx")} & history
    done = relay.command("status")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert f"done ({len(history)} sessions archived)" in text


# --------------------------------------------------------------------------- accounts


def test_accounts_are_polled_apart_and_one_rejected_key_stops_no_other(
    harness: Harness,
) -> None:
    # Different seeds: session names are unique across the accounts of one service.
    alpha = harness.standin(api_key="alpha-key-0123456789", max_page_size=100, seed=2)
    beta = harness.standin(api_key="beta-key-0123456789", max_page_size=100, seed=3)
    gamma = harness.standin(api_key="gamma-key-0123456789", max_page_size=100, seed=4)
    consumer = harness.consumer()
    every_url, every_secret = consumer.add_endpoint("every")
    beta_url, beta_secret = consumer.add_endpoint("beta-only")
    lines = [
        "[api]",
        "requests_per_minute = 3000",
        "[store]",
        f"path = {json.dumps(str(harness.tmp / 'relay.db'))}",
        "[poll]",
        "active_interval = 0.3",
        "discovery_interval = 0.5",
        "[delivery]",
        "retry_delays = [0.2, 0.5, 1.0]",
        "allow_private_networks = true",
        "[log]",
        'level = "info"',
        'format = "json"',
    ]
    for name, standin in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
        lines += [
            "[[accounts]]",
            f'name = "{name}"',
            f"base_url = {json.dumps(standin.base_url)}",
            f'api_key_env = "{name.upper()}_KEY"',
        ]
    lines += [
        "[[endpoints]]",
        'name = "every"',
        f"url = {json.dumps(every_url)}",
        f"secret = {json.dumps(every_secret)}",
        "[[endpoints]]",
        'name = "beta-only"',
        f"url = {json.dumps(beta_url)}",
        f"secret = {json.dumps(beta_secret)}",
        'accounts = ["beta"]',
        "",
    ]
    keys = {"ALPHA_KEY": alpha.api_key, "BETA_KEY": beta.api_key}
    keys["GAMMA_KEY"] = "a-key-gamma-rejects"
    relay = harness.start("accounts", "\n".join(lines), "unused", env=keys)
    for standin in (alpha, beta):
        wait_listing(standin, relay)
    # gamma's key is rejected: logged loudly, naming the account...
    wait_until(
        lambda: any(
            e.get("event") == "upstream.unauthenticated" and e.get("account") == "gamma"
            for e in relay.log_events()
        ),
        20,
        "gamma's 401 logged",
        relay.diagnostics,
    )
    # ...and the other accounts go on: their new work is delivered, each event naming
    # its account; the endpoint limited to beta gets beta's events only.
    a = alpha.add_session("Alpha's", state="IN_PROGRESS")
    b = beta.add_session("Beta's", state="IN_PROGRESS")
    sent = {
        "alpha": {alpha.append_activity(a, "agentMessaged")["name"]},
        "beta": {beta.append_activity(b, "agentMessaged")["name"]},
    }
    wait_until(
        lambda: (
            sent["alpha"] | sent["beta"] <= consumer.delivered_activity_names("every")
            and sent["beta"] <= consumer.delivered_activity_names("beta-only")
        ),
        20,
        "alpha's and beta's activities delivered",
        relay.diagnostics,
    )
    for hit in consumer.hits("every"):
        assert hit.body is not None
        expected = "alpha" if hit.session == a else "beta"
        assert hit.body["data"]["account"] == expected, hit.body
    assert {h.session for h in consumer.hits("beta-only")} == {b}
    assert relay.alive()
    shown = status(relay)
    assert shown["accounts"] == {"alpha": 1, "beta": 1}
    # gamma's passes fail: status says so, whatever alpha's and beta's good ones say.
    polls = {a["account"]: a for a in shown["upstream"]["accounts"]}
    assert sorted(polls) == ["alpha", "beta", "gamma"]
    assert polls["alpha"]["last_ok_poll_at"] and polls["beta"]["last_ok_poll_at"]
    assert polls["gamma"]["last_poll_at"] and polls["gamma"]["last_ok_poll_at"] is None
    assert shown["upstream"]["last_ok_poll_at"] is None
