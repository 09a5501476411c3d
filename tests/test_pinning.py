"""DNS rebinding cannot steer ``sessionhook endpoints test`` to a private address: the ping
goes through the deliveries' own sender (aiohttp; its rebinding tests with the dispatcher are
in tests/test_sender.py), the name resolved once, every address vetted, and the connection
made to a vetted one; a URL that can only be private is a config error.

Everything stays on loopback: the injected address policy treats ``127.0.0.2`` as public
and every other address as private, and two real listeners share one port, one on
``127.0.0.2`` (the "public" consumer) and one on ``127.0.0.1`` (the private service a
rebinding attack aims at). The injected resolver answers like a rebinding DNS server:
``127.0.0.2`` first, ``127.0.0.1`` next, and so on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from standardwebhooks import Webhook

from sessionhook.cli import cli
from sessionhook.cli._output import Runtime
from sessionhook.relay.config import load_config
from sessionhook.relay.domain.signing import generate_secret
from tests.support.rebinding import PRIVATE, PUBLIC, Listener, Rebinder

pytestmark = pytest.mark.app

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
