"""Black box: ``sessionhook run`` (a real process) against the emulator on a loopback port, as
the official SDK's users drive the real service: a session archived while it works pauses,
leaves the default list, and a message resumes it; the relay follows it to its completion
and says ``session.archived`` on the way. Nothing but HTTP between the three."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest

from sessionhook.emulator.app import create_app
from tests.support.loopback import LoopbackServer
from tests.support.relay_process import Endpoint, Harness, relay_config, wait_until

pytestmark = pytest.mark.process

KEY = "blackbox-archive-key"


@pytest.fixture
def emulator() -> Iterator[str]:
    # One agent step a second, on the real clock: time to archive a session at work.
    server = LoopbackServer(create_app(api_keys=(KEY,), step_delay=1.0, seed=21))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def test_a_session_archived_mid_work_is_followed_to_its_completion(
    harness: Harness, emulator: str
) -> None:
    consumer = harness.consumer()
    url, secret = consumer.add_endpoint("main")
    config = relay_config(
        standin=SimpleNamespace(base_url=emulator),  # type: ignore[arg-type]
        store=harness.tmp / "relay.db",
        endpoints=[Endpoint("main", url, secret)],
        active=0.2,
        discovery=0.3,
    )
    relay = harness.start("relay", config, KEY)

    def types() -> list[str | None]:
        return [h.type for h in consumer.delivered("main")]

    def states() -> list[str]:
        return [
            h.body["data"]["session"]["state"]
            for h in consumer.delivered("main")
            if h.type == "session.state_changed" and h.body is not None
        ]

    headers = {"x-vendor-api-key": KEY}
    with httpx.Client(base_url=emulator + "/v1alpha", headers=headers, timeout=10) as api:
        wait_until(lambda: "relay.ready" in relay.stderr, 30, "ready", relay.diagnostics)
        made = api.post(
            "/sessions", json={"prompt": "Add a changelog", "requirePlanApproval": True}
        )
        name = made.raise_for_status().json()["name"]
        wait_until(lambda: "session.action_required" in types(), 30, "the plan", relay.diagnostics)
        api.post(f"/{name}:approvePlan", json={}).raise_for_status()
        archived = api.post(f"/{name}:archive").raise_for_status().json()
        assert (archived["state"], archived["archived"]) == ("PAUSED", True)
        assert api.get("/sessions").json() == {}  # out of the default list
        wait_until(lambda: "PAUSED" in states(), 30, "PAUSED", relay.diagnostics)
        api.post(f"/{name}:sendMessage", json={"prompt": "Go on"}).raise_for_status()
        wait_until(lambda: "session.completed" in types(), 60, "the completion", relay.diagnostics)
    seen = types()
    assert seen.count("session.completed") == 1 and seen.count("session.archived") == 1
    assert seen.index("session.archived") < seen.index("session.completed")
    assert states()[-1] == "COMPLETED"
    assert all(h.ok for h in consumer.delivered("main"))
