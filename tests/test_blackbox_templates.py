"""Issue 26 item 2 through the real ``sessionhook run``: a template that fills memory never
runs in the daemon's process.

The issue's template doubles a string 25 times (268 MB of text, 416 MB of the daemon's
memory when it was rendered at create). Now: ``POST /v1/endpoints`` answers 400 naming the
size budget, and the daemon's peak resident memory (``VmHWM`` in ``/proc/<pid>/status``)
grows by less than 20 MB; one written into the store directly (past every check) is never
rendered by the daemon when it loads it, at a reload or at start-up (its deliveries fail
in the render child, naming the budget, and the daemon's peak memory stays where it was);
one in the config file stops ``run --once`` with one line naming the endpoint and the
budget, exit status 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from sessionhook.relay.domain.rows import EndpointSpec
from sessionhook.relay.store import Store
from tests.support.blackbox_consumer import Consumer
from tests.support.loopback import free_port
from tests.support.relay_process import Endpoint, Harness, Relay, wait_ready, wait_until
from tests.support.standin import StandIn
from tests.support.web_relay import api_error

pytestmark = pytest.mark.process

TOKEN = "blackbox-templates-token-" + "t" * 30
AUTH = {"authorization": f"Bearer {TOKEN}"}
#: The issue's template.
DOUBLING = (
    '{% set ns = namespace(s="12345678") %}{% for i in range(25) %}'
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
    '{"n": {{ ns.s | length }}}'
)
#: What the daemon's peak resident memory may grow by.
GROWTH_MB = 20


def peak_mb(relay: Relay) -> float:
    """The daemon's high-water mark of resident memory (VmHWM), in MB."""
    assert relay.proc is not None
    for line in Path(f"/proc/{relay.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def start(harness: Harness, standin: StandIn, consumer: Consumer, label: str) -> tuple[Relay, str]:
    """A relay with a listener (the token in its environment) and one endpoint of its
    config file, once it completed its first discovery pass; its base URL."""
    url, secret = consumer.add_endpoint("filed")
    port = free_port()
    relay = harness.relay(
        standin,
        label,
        env={"SESSIONHOOK_WEB_TOKEN": TOKEN},
        endpoints=[Endpoint("filed", url, secret)],
        listen=f"127.0.0.1:{port}",
        more={"server": ['token_env = "SESSIONHOOK_WEB_TOKEN"']},
    )
    wait_ready(standin, relay)
    return relay, f"http://127.0.0.1:{port}"


def create(base: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{base}/v1/endpoints", json=body, headers=AUTH, timeout=60)


def render_failures(relay: Relay, endpoint: str) -> set[str]:
    return {
        str(e.get("error"))
        for e in relay.log_events()
        if e.get("event") == "delivery.failed" and e.get("endpoint") == endpoint
    }


def test_a_template_filling_memory_is_refused_at_create_and_the_daemon_stays_small(
    harness: Harness,
) -> None:
    standin, consumer = harness.standin(), harness.consumer()
    relay, base = start(harness, standin, consumer, "relay")
    url, _secret = consumer.add_endpoint("chat")
    # A template that renders: the check's first child, its imports, done once.
    warm = create(base, name="warm", url=url, template='{"t": {{ type | tojson }}}')
    assert warm.status_code == 201, warm.text
    before = peak_mb(relay)

    refused = create(base, name="chat", url=url, template=DOUBLING)
    api_error(refused, 400, "template over its size budget of", "characters on session.")
    assert peak_mb(relay) - before < GROWTH_MB
    assert httpx.get(f"{base}/v1/endpoints/chat", headers=AUTH, timeout=10).status_code == 404
    assert relay.alive()
    assert "Traceback" not in relay.stderr, relay.diagnostics()


def test_a_stored_template_never_renders_in_the_daemon_at_a_reload_or_a_start(
    harness: Harness,
) -> None:
    standin, consumer = harness.standin(), harness.consumer()
    relay, _base = start(harness, standin, consumer, "relay")
    url, secret = consumer.add_endpoint("stored")
    first_peak = peak_mb(relay)
    # Written into the store directly: past every check a create makes.
    with Store.open(harness.tmp / "relay.db") as store:
        spec = {"url": url, "template": DOUBLING}
        store.endpoints.create_endpoint(EndpointSpec("stored", url, ("*",), {}, None, spec), secret)
    standin.add_session("a session for the stored endpoint", state="IN_PROGRESS")
    wait_until(
        lambda: bool(render_failures(relay, "stored")),
        60,
        "a failed render of the stored template",
        relay.diagnostics,
    )
    (error,) = render_failures(relay, "stored")
    assert error.startswith("render failed: template over its size budget of"), error
    assert peak_mb(relay) - first_peak < GROWTH_MB  # loaded by the catalog, never rendered

    code, _took = relay.terminate()
    assert code == 0, relay.diagnostics()
    again, _base = start(harness, standin, consumer, "again")
    assert peak_mb(again) - first_peak < GROWTH_MB  # start-up loads it, never renders it
    assert "Traceback" not in again.stderr, again.diagnostics()


def test_a_config_template_over_the_budget_stops_the_start_in_one_line(
    harness: Harness,
) -> None:
    standin, consumer = harness.standin(), harness.consumer()
    url, secret = consumer.add_endpoint("chat")
    template = (f"template = {json.dumps(DOUBLING)}",)
    relay = harness.relay(
        standin, "once", "--once", endpoints=[Endpoint("chat", url, secret, extra=template)]
    )
    assert relay.wait(60) == 2, relay.diagnostics()
    (line,) = relay.stderr.strip().splitlines()
    assert line.startswith("config error: endpoints[0].template: endpoint 'chat': "), line
    assert "template over its size budget of" in line, line
    assert not (harness.tmp / "relay.db").exists()  # refused before anything started
