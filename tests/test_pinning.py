"""DNS rebinding cannot steer a webhook to a private address: the name is resolved once,
every address vetted, and the connection made to a vetted one, for the dispatcher and for
``sessionhook endpoints test``.

Everything stays on loopback: the injected address policy treats ``127.0.0.2`` as public
and every other address as private, and two real listeners share one port, one on
``127.0.0.2`` (the "public" consumer) and one on ``127.0.0.1`` (the private service a
rebinding attack aims at). The injected resolver answers like a rebinding DNS server:
``127.0.0.2`` first, ``127.0.0.1`` next, and so on.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from standardwebhooks import Webhook

from sessionhook.cli import cli
from sessionhook.cli._output import Runtime
from sessionhook.relay.config import load_config
from sessionhook.relay.delivery.dispatcher import DeliverySettings, Dispatcher
from sessionhook.relay.delivery.pinning import PinnedTransport
from sessionhook.relay.delivery.post import post_event
from sessionhook.relay.domain.addresses import BlockedAddressError
from sessionhook.relay.domain.signing import generate_secret
from sessionhook.relay.store import AsyncStore
from tests.support.dispatch_rig import PER_SESSION, seed_sessions
from tests.support.rebinding import PRIVATE, PUBLIC, Listener, Rebinder, rebinding_config

# --------------------------------------------------------------------------- the transport


@pytest.mark.anyio
async def test_the_connection_goes_to_the_vetted_address_with_the_urls_host(
    listeners: tuple[Listener, Listener],
) -> None:
    public, private = listeners
    resolver = Rebinder(PUBLIC, PRIVATE)
    transport = PinnedTransport(allow_private=False, resolve=resolver, policy=Rebinder.policy)
    async with httpx.AsyncClient(transport=transport) as http:
        answer = await http.post(public.rebind_url, content=b"one")
        assert answer.status_code == 200
        # The listener closed the connection: the next request connects (and resolves) anew,
        # and this time the name rebinds to the private address.
        with pytest.raises(BlockedAddressError, match=r"resolves to 127\.0\.0\.1"):
            await http.post(public.rebind_url, content=b"two")
    assert resolver.asked == [("hooks.rebind.test", public.port)] * 2
    [(path, headers, body)] = public.requests
    assert (path, body) == ("/hook", b"one")
    assert headers["Host"] == f"hooks.rebind.test:{public.port}"  # the URL's name, not the IP
    assert private.connections == 0


@pytest.mark.anyio
async def test_allow_private_connects_to_what_the_name_resolved_to(
    listeners: tuple[Listener, Listener],
) -> None:
    public, private = listeners
    resolver = Rebinder(PRIVATE)
    transport = PinnedTransport(allow_private=True, resolve=resolver, policy=Rebinder.policy)
    async with httpx.AsyncClient(transport=transport) as http:
        assert (await http.post(public.rebind_url, content=b"x")).status_code == 200
    assert len(private.requests) == 1 and not public.requests


@pytest.mark.anyio
async def test_post_event_reports_a_refused_address_as_a_failed_attempt(
    listeners: tuple[Listener, Listener],
) -> None:
    public, private = listeners
    transport = PinnedTransport(
        allow_private=False, resolve=Rebinder(PRIVATE), policy=Rebinder.policy
    )
    async with httpx.AsyncClient(transport=transport) as http:
        result = await post_event(
            http,
            url=public.rebind_url,
            secrets=[generate_secret()],
            event_id="evt_1",
            body=b"{}",
            timeout=5.0,
            body_limit=100,
        )
    assert result.status_code is None
    assert result.error == (
        "refused: hooks.rebind.test resolves to 127.0.0.1, a private address (test policy) "
        "(set delivery.allow_private_networks = true to allow)"
    )
    assert private.connections == 0 and public.connections == 0


# --------------------------------------------------------------------------- the dispatcher


@pytest.mark.anyio
async def test_the_dispatcher_never_reaches_the_rebound_address(
    tmp_path: Path, listeners: tuple[Listener, Listener]
) -> None:
    """Every attempt resolves once: the public answers deliver, the rebound ones are
    refused and retried, and nothing ever reaches the private listener."""
    public, private = listeners
    secret = generate_secret()
    config = rebinding_config(public.rebind_url, secret)
    resolver = Rebinder.alternating()
    store = await AsyncStore.open(tmp_path / "relay.db")
    try:
        await store.endpoints.sync_endpoints(config.endpoints)
        expected = await seed_sessions(store, sessions=2)
        transport = PinnedTransport(allow_private=False, resolve=resolver, policy=Rebinder.policy)
        async with httpx.AsyncClient(transport=transport) as http:
            dispatcher = Dispatcher(store, http, DeliverySettings.from_config(config))
            await dispatcher.run_until_idle()
        rows = store.store.operator.list_deliveries()
    finally:
        await store.close()
    assert private.connections == 0
    assert {r.status for r in rows} == {"delivered"}
    delivered = [json.loads(body) for _path, _headers, body in public.requests]
    assert len(delivered) == 2 * PER_SESSION == sum(len(ids) for ids in expected.values())
    for _path, headers, body in public.requests:
        Webhook(secret).verify(body, {k.lower(): v for k, v in headers.items()})
    refused = [r for r in rows if r.attempts > 1]
    assert refused, "the resolver rebound: some attempts must have been refused"
    assert len(resolver.asked) == sum(r.attempts for r in rows)  # once per attempt


# --------------------------------------------------------------------------- the CLI


def _config_file(tmp_path: Path, url: str, secret: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(
        "[api]\n"
        'api_key_env = "NO_SUCH_KEY_NEEDED"\n'
        "[store]\n"
        f"path = {json.dumps(str(tmp_path / 'relay.db'))}\n"
        "[delivery]\n"
        "allow_private_networks = false\n"
        "[[endpoints]]\n"
        'name = "ci"\n'
        f"url = {json.dumps(url)}\n"
        f"secret = {json.dumps(secret)}\n"
    )
    return path


def test_endpoints_test_connects_to_the_vetted_address(
    tmp_path: Path, listeners: tuple[Listener, Listener]
) -> None:
    public, private = listeners
    secret = generate_secret()
    config = _config_file(tmp_path, public.rebind_url, secret)
    runner = CliRunner()
    runtime = Runtime(resolve=Rebinder(PUBLIC, PRIVATE), address_policy=Rebinder.policy)
    sent = runner.invoke(cli, ["endpoints", "test", "ci", "--config", str(config)], obj=runtime)
    assert sent.exit_code == 0, sent.output
    [(_path, headers, body)] = public.requests
    Webhook(secret).verify(body, {k.lower(): v for k, v in headers.items()})

    # Resolved again for a new run: this time the name rebinds to the private address.
    refused = runner.invoke(cli, ["endpoints", "test", "ci", "--config", str(config)], obj=runtime)
    assert refused.exit_code == 1
    assert "hooks.rebind.test resolves to 127.0.0.1" in refused.stderr
    assert "Traceback" not in refused.output
    assert private.connections == 0 and len(public.requests) == 1


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:9/hook", "127.0.0.1 is a loopback address"),
        ("http://[::1]/hook", "::1 is a loopback address"),
        ("http://localhost:8080/hook", "localhost is a loopback name"),
        ("http://10.1.2.3/hook", "10.1.2.3 is a private address"),
        ("http://169.254.169.254/", "169.254.169.254 is a cloud metadata address"),
    ],
)
def test_a_private_only_endpoint_is_a_config_error(tmp_path: Path, url: str, reason: str) -> None:
    config = _config_file(tmp_path, url, generate_secret())
    with pytest.raises(Exception, match="config error") as caught:
        load_config(config, resolve_secrets=False)
    assert str(caught.value) == (
        f"config error: endpoints[0].url: {reason}, "
        "refused while delivery.allow_private_networks = false"
    )
    allowed = config.read_text().replace("= false", "= true")
    config.write_text(allowed)
    assert load_config(config, resolve_secrets=False).endpoints[0].url == url


def test_a_name_is_not_judged_at_load_time(tmp_path: Path) -> None:
    config = _config_file(tmp_path, "https://hooks.example.com/x", generate_secret())
    assert load_config(config, resolve_secrets=False).endpoints[0].url.startswith("https://")
