"""Black-box tests of ``sessionhook run``: the real command in a subprocess, against an
independent stand-in of the Sessions API (``tests/support/standin.py``) and a verifying webhook
consumer (``tests/support/blackbox_consumer.py``), everything on 127.0.0.1.

Only the command's public contract is used: the config file, signals, exit statuses, the
upstream requests it makes and the webhooks it sends (checked with the Standard Webhooks
reference package). Nothing is imported from ``sessionhook``. The relay's stdout/stderr go
to files that are printed when a test fails.

Every wait polls a condition under a deadline; nothing asserts after a fixed sleep.
"""

from __future__ import annotations

import base64
import itertools
import json
import signal
import sqlite3
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.support.blackbox_consumer import Hit, new_secret
from tests.support.delivery_checks import (
    MEMBER_TYPES,
    assert_activity_bodies,
    assert_all_verified,
    assert_session_events,
    assert_session_order,
    assert_stable_ids,
    assert_summaries_complete,
    missing_activities,
    verified_hits,
    wait_all_delivered,
    wait_settled,
)
from tests.support.relay_process import (
    Endpoint,
    Harness,
    assert_clean_exit,
    clean_env,
    sessionhook,
    wait_ready,
    wait_until,
)
from tests.support.standin import RequestRecord
from tests.support.world import World

pytestmark = pytest.mark.process


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

    hits = verified_hits(consumer, "flaky", world)
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

    hits = verified_hits(consumer, "slow", world)
    assert consumer.max_in_flight_per_session == 1, "two requests of one session at once"
    assert consumer.max_in_flight >= 2, "sessions were delivered one at a time"
    # Sessions do not wait on each other: far quicker than one request after the other.
    serial = sum(h.answered - h.arrived for h in hits)
    elapsed = max(h.answered for h in hits) - min(h.arrived for h in hits)
    assert elapsed < serial / 2, f"took {elapsed:.1f} s; serially it is {serial:.1f} s"


def test_a_long_burst_in_one_session_is_delivered_whole_and_in_order(harness: Harness) -> None:
    """250 activities appear at once in one session (several full pages of 100)."""
    standin = harness.standin(max_page_size=100)
    consumer, relay = harness.main_relay(standin)
    world = World(standin)
    session = world.add("short")
    world.step(session)  # IN_PROGRESS
    for i in range(250):
        standin.append_activity(session, "progressUpdated", description=f"step {i}")
    world.play()
    wait_all_delivered(consumer, ["main"], world, harness, timeout=40)
    wait_settled(consumer, "main", world, harness)
    assert_clean_exit(relay)
    hits = verified_hits(consumer, "main", world)
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
    env = clean_env(SESSIONHOOK_API_KEY="some-key")
    done = sessionhook("run", "--config", str(config), env=env, cwd=tmp_path, timeout=30)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert len(lines) == 1, done.stderr
    assert key in lines[0], lines[0]
    assert not (tmp_path / "sessionhook.db").exists(), "a bad config must not create a store"


def test_missing_api_key_variable_is_a_config_error(tmp_path: Path) -> None:
    """g. The variable named by api.api_key_env unset: exit 2, one line naming the key."""
    config = tmp_path / "cfg.toml"
    config.write_text('[api]\napi_key_env = "SESSIONHOOK_TEST_UNSET_KEY"\n')
    done = sessionhook("run", "--config", str(config), env=clean_env(), cwd=tmp_path, timeout=30)
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
    consumer, relay = harness.main_relay(standin)
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
    consumer, relay = harness.main_relay(standin)
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
    _consumer, relay = harness.main_relay(standin)
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
