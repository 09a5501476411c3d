"""The real daemon in process, for tests of its lifecycle and of what it wires: the emulator
and a consumer (:class:`~tests.support.receiver.Receiver`) behind ASGI transports, a config
from a real TOML file (:func:`write_config`), bundled as :class:`Setup`; the ``[server]``
of a daemon whose listener needs a token (:func:`token_server`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette

from sessionhook.api.client import SessionsClient
from sessionhook.emulator.app import create_app
from sessionhook.relay.config import Config, load_config
from sessionhook.relay.daemon.daemon import Daemon
from sessionhook.relay.domain.signing import generate_secret
from tests.support.loopback import free_port
from tests.support.receiver import Receiver

API_KEY = "test-key"


def write_config(
    directory: Path,
    *,
    base_url: str = "http://emu.test",
    hook_url: str = "http://rx.test/hook",
    secret: str,
    api_key: str = API_KEY,
    extra: str = "",
    **sections: dict[str, Any],
) -> Path:
    """A TOML config for the relay; ``sections`` override keys (``poll={"backfill": True}``)."""
    key_file = directory / "api_key"
    key_file.write_text(api_key)
    key_file.chmod(0o600)  # a secret file others can read is refused
    values: dict[str, dict[str, Any]] = {
        # A budget to match the quick polls (the default 600 a minute would pace them).
        "api": {"base_url": base_url, "api_key_file": str(key_file), "requests_per_minute": 6000},
        "store": {"path": str(directory / "relay.db")},
        "poll": {"active_interval": 0.05, "idle_interval": 0.5, "discovery_interval": 0.2},
        "delivery": {"retry_delays": [0.05, 0.05, 0.05], "allow_private_networks": True},
        "log": {"level": "info"},
    }
    for name, overrides in sections.items():
        values.setdefault(name, {}).update(overrides)
    if "url" in values["store"]:  # a PostgreSQL store instead of the file
        del values["store"]["path"]
    lines = []
    for name, table in values.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in table.items()]
    lines += [
        "[[endpoints]]",
        'name = "rx"',
        f"url = {json.dumps(hook_url)}",
        f"secret = {json.dumps(secret)}",
        extra,
    ]
    path = directory / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def token_server(directory: Path, token: str) -> dict[str, Any]:
    """A ``[server]`` section: a free loopback port, ``token`` in a file of ``directory``
    that only its owner may read (a token file others can read is refused)."""
    token_file = directory / "web-token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    return {"listen": f"127.0.0.1:{free_port()}", "token_file": str(token_file)}


class Setup:
    """Emulator + receiver + a config file in ``tmp_path``."""

    def __init__(
        self, tmp_path: Path, *, clock: Callable[[], float] | None = None, **config: Any
    ) -> None:
        self.secret = generate_secret()
        self.receiver = Receiver(self.secret)
        self.emulator: Starlette = create_app(
            api_keys=(API_KEY,), step_delay=0.05, seed=11, clock=clock
        )
        self.config_path = write_config(tmp_path, secret=self.secret, **config)
        self.config: Config = load_config(self.config_path)

    def daemon(self, **kwargs: Any) -> Daemon:
        kwargs.setdefault("upstream_transport", httpx.ASGITransport(self.emulator))
        kwargs.setdefault("delivery_transport", httpx.ASGITransport(self.receiver.app))
        return Daemon(self.config, config_path=self.config_path, **kwargs)

    def api(self, http: httpx.AsyncClient) -> SessionsClient:
        return SessionsClient(http, base_url="http://emu.test", api_key=API_KEY)

    def api_http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(self.emulator))


def completed(receiver: Receiver, count: int) -> bool:
    """At least ``count`` sessions' completions were delivered (first deliveries)."""
    return sum(a.type == "activity.session_completed" for a in receiver.first_deliveries()) >= count
