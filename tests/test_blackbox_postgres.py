"""Black-box tests of ``sessionhook run`` on a PostgreSQL store (``store.url_env``): the real
command in a subprocess against the stand-in (``tests/support/standin.py``), the verifying consumer
and the session's throwaway PostgreSQL cluster (``tests/support/pg.py``), everything on 127.0.0.1.
Nothing is imported from ``sessionhook``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.delivery_checks import (
    assert_activity_bodies,
    assert_all_verified,
    assert_session_order,
    assert_stable_ids,
    wait_all_delivered,
)
from tests.support.loopback import free_port
from tests.support.pg import PASSWORD, Cluster
from tests.support.relay_process import (
    URL_ENV,
    Endpoint,
    Harness,
    Relay,
    assert_clean_exit,
    readyz,
    wait_ready,
    wait_until,
)
from tests.support.standin import StandIn
from tests.support.world import World

pytestmark = pytest.mark.process


def postgres_relay(harness: Harness, standin: StandIn, url: str, port: int, **config: Any) -> Relay:
    """A relay whose ``[store]`` names the database through ``url_env`` (the password is
    in the environment, never in the file)."""
    listen = f"127.0.0.1:{port}"
    env = {URL_ENV: url}
    return harness.relay(standin, "relay", store_url_env=URL_ENV, env=env, listen=listen, **config)


def test_a_postgresql_restart_mid_run_loses_nothing(
    harness: Harness, pg_cluster: Cluster, pg_url: str
) -> None:
    standin = harness.standin()
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("alpha")
    port = free_port()
    endpoints = [Endpoint("alpha", url, secret)]
    relay = postgres_relay(harness, standin, pg_url, port, endpoints=endpoints)
    wait_ready(standin, relay)
    _, body = readyz(port)
    database = f"127.0.0.1:{pg_cluster.port}/{pg_url.rsplit('/', 1)[1]}"
    assert body["store"] == {"backend": "postgresql", "database": body["store"]["database"]}
    assert body["store"]["database"].endswith(database)

    world = World(standin)
    for kind in ("pr", "feedback", "resumed"):
        world.add(kind)
    world.play(pause=0.05)
    # The database goes away while the relay works (as a crash would), and comes back.
    pg_cluster.stop("immediate")
    world.add("fail", source=None)
    world.play(pause=0.05)

    def unready() -> bool:
        try:
            code, answer = readyz(port)
        except TimeoutError:  # the first probe may wait out the pool for a connection
            return False
        return code == 503 and any("127.0.0.1" in r for r in answer["reasons"])

    wait_until(unready, 30, "/readyz to name the unreachable database", harness.diagnostics)
    assert relay.alive(), relay.diagnostics()
    pg_cluster.start()

    wait_all_delivered(consumer, ["alpha"], world, harness, timeout=60)
    wait_until(lambda: readyz(port)[0] == 200, 30, "/readyz to recover", harness.diagnostics)
    hits = consumer.hits("alpha")
    assert_all_verified(hits)
    assert_stable_ids(hits, standin.all_activities())
    assert_activity_bodies(hits, standin)
    assert_session_order(hits, world.order())

    # The operator commands read the same database while the daemon runs.
    run = relay.command("status", "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["activities"] == len(standin.all_activities())
    assert_clean_exit(relay)
    assert PASSWORD not in relay.stderr + relay.stdout + run.stdout + run.stderr
    events = {e.get("event") for e in relay.log_events()}
    assert "store.not_writable" in events, events  # the outage was seen and logged


def test_a_wrong_password_is_one_line_and_exit_2(
    harness: Harness, pg_cluster: Cluster, pg_url: str
) -> None:
    standin = harness.standin()
    wrong = pg_url.replace(PASSWORD, "not-the-password")
    relay = postgres_relay(harness, standin, wrong, free_port(), endpoints=[])
    assert relay.wait(30) == 2
    lines = [line for line in relay.stderr.splitlines() if line.strip()]
    assert any("password authentication failed" in line for line in lines), relay.stderr
    assert "Traceback" not in relay.stderr
    assert "not-the-password" not in relay.stderr + relay.stdout
