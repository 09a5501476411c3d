"""Black-box test of issue 20 item 4 through the real ``sessionhook run``: a user template
that loops long on a real event never hangs the daemon.

Two templates pass the start-up samples and run away on sessions titled "deploy ...":
``steps`` is the issue's nested ``range(100000)`` (stopped by the step budget, or by the
time budget on a machine too busy to take a million steps in time), ``clock`` counts the
words of a 120 kB title again and again, little per step, much per second, making nothing
(stopped by ``delivery.render_timeout`` in its child process). While they run,
``/healthz`` answers, the standard endpoint gets every event, and SIGTERM stops the daemon
within the drain bound with no child process left behind.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import pytest

from tests.support.processes import alive, children_of
from tests.support.relay_process import Endpoint, Harness, Relay, wait_ready, wait_until

pytestmark = pytest.mark.process

#: What both templates send when they finish: the type and the session (for the consumer).
BODY = '{"type": {{ type | tojson }}, "data": {"session": {"name": {{ session.name | tojson }}}}}'
STEPS = (
    '{% if "deploy" in session.title %}'
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% endif %}" + BODY
)
CLOCK = (
    "{% if session.title | length > 100000 %}{% for i in range(100000) %}"
    "{{ session.title | wordcount }}{% endfor %}{% endif %}" + BODY
)
SLOW_TITLE = "deploy " + "zyxwvutsrq" * 12_000
RENDER_TIMEOUT = 3.0
#: SIGTERM drains for at most 10 s (daemon.DRAIN_SECONDS), then cancels what is left.
DRAIN_BOUND = 10.0


def failures(relay: Relay, endpoint: str) -> list[dict[str, Any]]:
    return [
        e
        for e in relay.log_events()
        if e.get("event") == "delivery.failed" and e.get("endpoint") == endpoint
    ]


def test_a_runaway_template_fails_its_own_deliveries_and_nothing_else(
    harness: Harness, free_tcp_port: int
) -> None:
    standin = harness.standin()
    consumer = harness.consumer()
    endpoints = []
    for name, extra in (
        ("std", ()),
        ("steps", (f"template = {json.dumps(STEPS)}",)),
        ("clock", (f"template = {json.dumps(CLOCK)}",)),
    ):
        url, secret = consumer.add_endpoint(name)
        endpoints.append(Endpoint(name, url, secret, ("*",), extra))
    relay = harness.relay(
        standin,
        "relay",
        endpoints=endpoints,
        listen=f"127.0.0.1:{free_tcp_port}",
        retry_delays=(60.0,),
        render_timeout=RENDER_TIMEOUT,
    )
    wait_ready(standin, relay)
    ordinary = standin.add_session("an ordinary task")
    standin.append_activity(ordinary, "progressUpdated")

    def everywhere(session: str, count: int) -> bool:
        return all(
            len([h for h in consumer.delivered(e) if h.session == session]) >= count
            for e in ("std", "steps", "clock")
        )

    wait_until(lambda: everywhere(ordinary, 2), 30, "the ordinary session", relay.diagnostics)

    # Six sessions that make both templates run away: "clock" then renders for ~18 s.
    slow = [standin.add_session(SLOW_TITLE) for _ in range(6)]
    wait_until(
        lambda: failures(relay, "clock"), 30, "a render over its time budget", relay.diagnostics
    )
    # The other slow renders are queued behind the first: the daemon answers meanwhile.
    health = f"http://127.0.0.1:{free_tcp_port}/healthz"
    for _ in range(5):
        # A busy machine (two cores, three processes at work) answers slowly, but answers:
        # a render on the event loop would hold it for hours.
        assert httpx.get(health, timeout=10.0).status_code == 200
        time.sleep(0.2)
    later = standin.add_session("a task added while the template runs away")
    standin.append_activity(later, "progressUpdated")
    wait_until(
        lambda: len([h for h in consumer.delivered("std") if h.session == later]) >= 2,
        20,
        "the standard endpoint's deliveries during the runaway renders",
        relay.diagnostics,
    )
    assert len(children_of(relay.proc.pid if relay.proc else 0)) >= 2  # a child per template
    renderers = children_of(relay.proc.pid if relay.proc else 0)

    # SIGTERM while "clock" renders: the daemon drains, cancels, kills its children.
    code, took = relay.terminate(timeout=DRAIN_BOUND + 15)
    assert code == 0, relay.diagnostics()
    assert took <= DRAIN_BOUND + 15
    assert "Traceback" not in relay.stderr, relay.diagnostics()
    assert not [pid for pid in renderers if alive(pid)]
    (stopping,) = [e for e in relay.log_events() if e.get("event") == "relay.stopping"]
    assert stopping["in_flight"] >= 1  # it was stopped mid-render, not after

    # What the delivery log says, per endpoint.
    clock_errors = {e["error"] for e in failures(relay, "clock")}
    assert clock_errors == {f"render failed: template over its time budget of {RENDER_TIMEOUT:g} s"}
    step_errors = {e["error"] for e in failures(relay, "steps")}
    assert step_errors and all(
        re.fullmatch(
            r"render failed: template over its (budget of 1000000 steps on \S+|time budget of 3 s)",
            error,
        )
        for error in step_errors
    ), step_errors
    for session in slow:  # every event of the slow sessions still reached "std"
        assert [h for h in consumer.delivered("std") if h.session == session]
    assert not [h for h in consumer.delivered("steps") if h.session in slow]
    assert not [h for h in consumer.delivered("clock") if h.session in slow]
