"""Private hosts spelled the way HTTP clients normalize (fullwidth digits, ideographic full
stops, circled letters, a trailing dot, percent escapes, legacy IPv4, IPv4-mapped IPv6,
userinfo that looks like a host), against ``sessionhook run`` as a subprocess with
``delivery.allow_private_networks = false``: refused by the config at start-up, by the
management API at create and update (400, one line, never a 500), by ``:test`` and
``endpoints test`` (one line), and at every POST of endpoints that reached the store
unchecked; not one connection reaches the loopback listener they all lead to."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from sessionhook.cli import cli
from sessionhook.relay.config import Config
from sessionhook.relay.ops import endpoint_edits as edits
from sessionhook.relay.store import Store
from tests.support.loopback import free_port
from tests.support.rebinding import PRIVATE, Listener
from tests.support.relay_process import (
    Harness,
    clean_env,
    read_store,
    relay_config,
    run_cli,
    wait_ready,
)
from tests.support.relay_process import wait_until as wait_for
from tests.support.spellings import ELSEWHERE, loopback_spellings
from tests.support.standin import StandIn
from tests.support.web_relay import api_error

pytestmark = pytest.mark.process

TOKEN = "blackbox-ssrf-token-" + "s" * 30
AUTH = {"authorization": f"Bearer {TOKEN}"}
REFUSED = "refused while delivery.allow_private_networks = false"


@pytest.fixture
def listener() -> Iterator[Listener]:
    """The loopback service every spelling leads to; counts the connections it accepts."""
    served = Listener(PRIVATE, 0)
    try:
        yield served
    finally:
        served.close()


def _strict(standin: StandIn, store: Path, port: int) -> str:
    """A relay config of ``standin`` without endpoints, private addresses refused, the
    management API on ``127.0.0.1:port``."""
    text = relay_config(
        standin=standin,
        store=store,
        endpoints=[],
        listen=f"127.0.0.1:{port}",
        more={"server": ['token_env = "SESSIONHOOK_WEB_TOKEN"']},
    )
    assert "allow_private_networks = true" in text
    return text.replace("allow_private_networks = true", "allow_private_networks = false")


def _store_unchecked(store: Path, urls: list[str]) -> list[str]:
    """Endpoints ``s0``, ``s1``... at ``urls``, written into the store as a relay that
    allows private addresses writes them (what the strict relay must still never reach)."""
    allowing = Config.model_validate({"delivery": {"allow_private_networks": True}})
    names = [f"s{i}" for i in range(len(urls))]
    with Store.open(store) as opened:
        for name, url in zip(names, urls, strict=True):
            definition, secret = edits.define_endpoint(allowing, name, {"url": url})
            edits.create_endpoint(opened, allowing, definition, secret)
    return names


def test_the_config_refuses_every_spelling_at_start_up(
    harness: Harness, listener: Listener, tmp_path: Path
) -> None:
    standin = harness.standin()
    spellings = [*loopback_spellings(listener.port), *ELSEWHERE]
    config = tmp_path / "strict.toml"
    runner = CliRunner()
    for url in spellings:
        text = _strict(standin, tmp_path / "relay.db", free_port())
        text += (
            f'[[endpoints]]\nname = "ci"\nurl = {json.dumps(url)}\nsecret = "whsec_{"A" * 32}"\n'
        )
        config.write_text(text)
        ran = runner.invoke(
            cli,
            ["run", "--once", "--config", str(config)],
            env={"SESSIONHOOK_API_KEY": standin.api_key},
        )
        assert ran.exit_code == 2, (url, ran.output)
        [line] = ran.stderr.splitlines()
        assert line.startswith("config error: endpoints[0].url: ") and REFUSED in line, line
    # The same, as a process: two of the spellings the issue names.
    for url in loopback_spellings(listener.port)[:2]:
        text = _strict(standin, tmp_path / "relay.db", free_port())
        text += (
            f'[[endpoints]]\nname = "ci"\nurl = {json.dumps(url)}\nsecret = "whsec_{"A" * 32}"\n'
        )
        relay = harness.start(f"refused{len(harness.relays)}", text, standin.api_key, "--once")
        assert relay.wait(60) == 2, relay.diagnostics()
        [line] = relay.stderr.splitlines()
        assert line.startswith("config error: endpoints[0].url: ") and "loopback" in line, line
    assert listener.connections == 0


def test_the_api_ping_and_every_post_refuse_every_spelling(
    harness: Harness, listener: Listener, tmp_path: Path
) -> None:
    standin = harness.standin()
    store = tmp_path / "relay.db"
    stored = _store_unchecked(store, loopback_spellings(listener.port))
    port = free_port()
    relay = harness.start(
        "strict",
        _strict(standin, store, port),
        standin.api_key,
        env={"SESSIONHOOK_WEB_TOKEN": TOKEN},
    )
    wait_ready(standin, relay)
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, headers=AUTH, timeout=10) as http:
        for url in [*loopback_spellings(listener.port), *ELSEWHERE]:
            created = http.post("/v1/endpoints", json={"name": "spelled", "url": url})
            assert api_error(created, 400, REFUSED).startswith("url: "), url
            changed = http.patch(f"/v1/endpoints/{stored[0]}", json={"url": url})
            assert api_error(changed, 400, REFUSED).startswith("url: "), url
        assert http.get("/v1/endpoints/spelled").status_code == 404
        for name in stored:
            tested = http.post(f"/v1/endpoints/{name}:test")
            message = api_error(tested, 400, "refused: ", "is a loopback")
            assert message.startswith(f"{name}: "), message
    # The CLI through the running relay gets the API's answer, in one line.
    for url in loopback_spellings(listener.port)[:2]:
        for args in (["create", "spelled"], ["update", stored[0]]):
            made = run_cli(
                "endpoints",
                *args,
                "--url",
                url,
                "--relay-url",
                base,
                env=clean_env(SESSIONHOOK_WEB_TOKEN=TOKEN),
            )
            assert made.returncode == 1, (made.stdout, made.stderr)
            [line] = made.stderr.splitlines()
            assert line.startswith("error: url: ") and REFUSED in line, line

    # Deliveries: every endpoint of the store gets the session's events, every attempt is
    # refused before anything is sent.
    standin.add_session("to every spelling", state="IN_PROGRESS")

    def attempted() -> list[tuple[str, str]]:
        sql = "SELECT endpoint, last_error FROM deliveries WHERE attempts > 0"
        return [(str(e), str(error)) for e, error in read_store(store, sql)]

    wait_for(
        lambda: {e for e, _ in attempted()} >= set(stored),
        60,
        "an attempt to every stored endpoint",
        relay.diagnostics,
    )
    for endpoint, error in attempted():
        assert error.startswith("refused: ") and "is a loopback" in error, (endpoint, error)

    # The operator's own ping, outside the daemon, judges the same way.
    for name in stored[:2]:
        pinged = relay.command("endpoints", "test", name)
        assert pinged.returncode == 1, pinged.stderr
        [line] = pinged.stderr.splitlines()
        assert "refused: " in line and "is a loopback" in line, line
    assert relay.alive()
    assert listener.connections == 0
    # Refused deliveries go dead at the end of their retries; nothing else went wrong.
    errors = [e for e in relay.log_events() if e.get("level") == "error"]
    assert {e["event"] for e in errors} <= {"delivery.dead"}, errors
    assert "Traceback" not in relay.stderr
