"""What a relay loads: on the defaults (SQLite, v1 HMAC signatures) neither psycopg (about
10 MB of memory) nor cryptography (about 9 MB, ed25519 for v1a) is imported (issue 8's
peak-RSS target), and the errors of the engine it does load are still caught everywhere a
store failure must not crash anything.

Each check runs in a fresh interpreter: this test process has psycopg loaded already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sessionhook.emulator.app import create_app
from sessionhook.relay.store import database_errors, store_failures
from tests.support.backends import Backend
from tests.support.loopback import LoopbackServer
from tests.support.processes import run_python

pytestmark = pytest.mark.process


def _run(script: str, tmp_path: Path) -> str:
    return run_python(script, tmp_path)


def test_a_relay_on_the_defaults_imports_neither_psycopg_nor_cryptography(tmp_path: Path) -> None:
    # What `sessionhook run` loads on the default store: the command line, the daemon, the
    # store opened, the web app built, a store failure matched, a v1 signature made.
    out = _run(
        f"""
        import sqlite3, sys
        import sessionhook.cli, sessionhook.relay.daemon.daemon
        from sessionhook.relay.config import Config
        from sessionhook.relay.telemetry.metrics import Metrics
        from sessionhook.relay.domain.signing import generate_secret, signature_header
        from sessionhook.relay.store import open_store, store_failures
        from sessionhook.relay.web import WebAuth, WebContext, create_app

        config = Config.model_validate(
            {{"store": {{"path": {str(tmp_path / "s.db")!r}}},
              "server": {{"listen": "127.0.0.1:9187", "token_env": "T"}}}}
        )
        store = open_store(config.store)
        ctx = WebContext(config=lambda: config, store=lambda: None, metrics=Metrics(),
                         auth=WebAuth("t" * 32))
        create_app(ctx)
        try:
            raise sqlite3.OperationalError("disk I/O error")
        except store_failures():
            pass
        store.close()
        header = signature_header([generate_secret()], "msg_1", 1700000000, b"[]")
        assert header.startswith("v1,")
        loaded = (name for name in sys.modules if name.startswith(("psycopg", "cryptography")))
        print(sorted(loaded))
        """,
        tmp_path,
    )
    assert out == "[]"


def test_the_web_app_answers_a_postgresql_error_with_503_before_the_store_opens(
    tmp_path: Path,
) -> None:
    # The daemon builds its web app before it opens the store (so /readyz can say why the
    # store cannot open): psycopg's errors must be in the handler table all the same.
    out = _run(
        """
        import asyncio, sys
        import httpx
        from starlette.routing import Route
        from sessionhook.relay.config import Config
        from sessionhook.relay.telemetry.metrics import Metrics
        from sessionhook.relay.store import database_errors
        from sessionhook.relay.web import WebAuth, WebContext, create_app

        assert "psycopg" not in sys.modules
        config = Config.model_validate(
            {"server": {"listen": "127.0.0.1:9187", "token_env": "T"}}
        )

        def boom(request):
            import psycopg
            raise psycopg.OperationalError("server closed the connection unexpectedly")

        ctx = WebContext(config=lambda: config, store=lambda: None, metrics=Metrics(),
                         auth=WebAuth("t" * 32),
                         store_errors=database_errors(postgresql=True))
        app = create_app(
            ctx,
            providers=[lambda ctx: [Route("/boom", boom)]],
        )

        async def main():
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            bearer = {"Authorization": "Bearer " + "t" * 32}
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                response = await c.get("/boom", headers=bearer)
                print(response.status_code, response.headers.get("retry-after"))

        asyncio.run(main())
        """,
        tmp_path,
    )
    assert out.splitlines()[-1].split()[0] == "503", out


def test_a_postgresql_error_is_a_store_failure_once_postgresql_is_open(backend: Backend) -> None:
    store = backend.open()
    try:
        names = {kind.__module__.split(".")[0] for kind in database_errors()}
        if backend.name == "postgresql":
            import psycopg

            assert psycopg.Error in database_errors()
            try:
                raise psycopg.errors.AdminShutdown("terminating connection")
            except store_failures() as exc:
                assert store.unwritable_error(exc) is not None
        assert "sqlite3" in names
    finally:
        store.close()


# --------------------------------------------------------------------------- the command line

#: What a command that does not need them must not import (issue 20: `sessionhook --help`
#: took a second of CPU importing the relay). The relay's vocabulary module imports nothing.
_RELAY_LIGHT = {
    "sessionhook.relay",
    "sessionhook.relay.domain",
    "sessionhook.relay.domain.delivery_states",
}
_NEVER_FOR_THE_API = (
    "sqlite3",
    "psycopg",
    "aiohttp",
    "starlette",
    "uvicorn",
    "jinja2",
    "structlog",
    "cryptography",
    "prometheus_client",
)
_NOT_FOR_HELP = (*_NEVER_FOR_THE_API, "sessionhook.api", "httpx", "httpcore", "pydantic", "anyio")


def _loaded_by(args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> set[str]:
    """The modules a ``sessionhook`` command line loads, run through the console entry point
    in a fresh interpreter; the command must exit 0."""
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.argv = ["sessionhook", *{args!r}]
        from sessionhook.__main__ import main
        try:
            main()
        except SystemExit as exc:
            code = exc.code
        print(json.dumps({{"code": code, "modules": sorted(sys.modules)}}), file=sys.stderr)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SESSIONHOOK_CONFIG": str(tmp_path / "absent.toml"), **(env or {})},
    )
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, done.stderr
    return set(report["modules"])


def _under(modules: set[str], roots: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if m in roots or m.startswith(tuple(f"{r}." for r in roots)))


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["sessions", "--help"],
        ["sessions", "list", "--help"],
        ["status", "--help"],
        ["run", "--help"],
        ["store", "copy", "--help"],
    ],
    ids=" ".join,
)
def test_help_loads_neither_the_relay_nor_the_api_client(args: list[str], tmp_path: Path) -> None:
    loaded = _loaded_by(args, tmp_path)
    assert "sessionhook.cli" in loaded  # the command line itself ran
    assert _under(loaded, _NOT_FOR_HELP) == []
    assert sorted(m for m in loaded if m.startswith("sessionhook.relay")) == sorted(_RELAY_LIGHT)


def test_an_api_command_loads_the_client_but_not_the_relay(tmp_path: Path) -> None:
    server = LoopbackServer(create_app(api_keys=["lazy-key"], seed=3))
    server.start()
    try:
        env = {"SESSIONHOOK_API_KEY": "lazy-key", "SESSIONHOOK_BASE_URL": server.url}
        loaded = _loaded_by(["sessions", "list"], tmp_path, env)
    finally:
        server.stop()
    assert "sessionhook.api.client" in loaded  # it did call the service
    assert _under(loaded, _NEVER_FOR_THE_API) == []
    assert sorted(m for m in loaded if m.startswith("sessionhook.relay")) == sorted(_RELAY_LIGHT)
