"""Endpoints created at run time, against ``sessionhook run`` as a subprocess: an endpoint
created over ``/v1/endpoints`` receives signed deliveries at once, one created by the CLI
beside the running daemon too, and a deleted one receives nothing more."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.blackbox_consumer import Consumer
from tests.support.loopback import free_port
from tests.support.relay_process import Endpoint, Harness, Relay, wait_ready, wait_until
from tests.support.standin import StandIn

pytestmark = pytest.mark.process

TOKEN = "blackbox-endpoints-token-" + "b" * 30
AUTH = {"authorization": f"Bearer {TOKEN}"}


def _relay(harness: Harness) -> tuple[StandIn, Consumer, Relay, str]:
    standin = harness.standin()
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("filed")
    port = free_port()
    relay = harness.relay(
        standin,
        "relay",
        env={"SESSIONHOOK_WEB_TOKEN": TOKEN},
        endpoints=[Endpoint("filed", url, secret)],
        listen=f"127.0.0.1:{port}",
        more={"server": ['token_env = "SESSIONHOOK_WEB_TOKEN"']},
    )
    wait_ready(standin, relay)
    return standin, consumer, relay, f"http://127.0.0.1:{port}"


def test_endpoints_created_over_http_and_by_the_cli_get_signed_deliveries(
    harness: Harness,
) -> None:
    standin, consumer, relay, base = _relay(harness)
    url, secret = consumer.add_endpoint("laptop")
    created = httpx.post(
        f"{base}/v1/endpoints",
        json={"name": "laptop", "url": url, "secret": secret, "events": ["session.*"]},
        headers=AUTH,
        timeout=10,
    )
    assert created.status_code == 201, created.text
    assert created.json()["secret"] == secret
    cli_url, _ = consumer.add_endpoint("cli")
    made = relay.command("endpoints", "create", "cli", "--url", cli_url, "--json")
    assert made.returncode == 0, made.stderr
    # The consumer checks each signature with the secret it was given: the CLI's is new.
    consumer.behave("cli", secret=json.loads(made.stdout)["secret"])

    standin.add_session("after both were created", state="IN_PROGRESS")
    wait_until(
        lambda: bool(consumer.delivered("laptop")) and bool(consumer.delivered("cli")),
        30,
        "deliveries to both endpoints",
    )
    for name in ("laptop", "cli"):
        hits = consumer.hits(name)
        assert hits and all(h.verified for h in hits), [h.error for h in hits]
    assert all(str(h.type).startswith("session.") for h in consumer.hits("laptop"))

    gone = httpx.delete(f"{base}/v1/endpoints/laptop", headers=AUTH, timeout=10)
    assert gone.status_code == 200, gone.text
    session = standin.add_session("after the delete", state="IN_PROGRESS")
    wait_until(
        lambda: any(session in h.raw.decode() for h in consumer.delivered("filed")),
        30,
        "the config file's endpoint to get the new session",
    )
    assert not any(session in h.raw.decode() for h in consumer.hits("laptop"))
