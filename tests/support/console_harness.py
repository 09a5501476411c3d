"""What the console's browser tests drive: a real ``sessionhook run`` fed by the emulator,
a consumer that can be made to fail, and headless Chromium through Selenium.

* :class:`Consumer`: a webhook endpoint on 127.0.0.1 that answers ``status`` (200 unless
  told) with ``body`` (hostile HTML by default when failing, to check the console escapes
  it); it records the webhook-ids it saw.
* :class:`Stack`: the emulator and two consumers served from a background event loop
  (an anyio blocking portal), and the daemon as a subprocess with ``[server] listen``, on a
  SQLite file or a PostgreSQL database.
* :func:`chromium`: a Selenium Chrome driver on Debian's ``/usr/bin/chromium`` and
  ``/usr/bin/chromedriver`` (no browser download is possible here), with the flags the
  closed network needs and a fresh profile. With ``CI=true`` a missing browser fails the
  tests; elsewhere they are skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sessionhook.emulator.app import create_app
from sessionhook.emulator.world import World
from sessionhook.relay.domain.signing import generate_secret
from sessionhook.relay.web.server import serve
from tests.support.loopback import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
API_KEY = "console-test-key"
#: The console's access token (``[server] token_file``).
TOKEN = "console-browser-test-token-" + "0123456789abcdef"
#: The flags Chromium needs here: no sandbox as root, and none of its background traffic
#: (the closed network refuses it, and each refusal slows the browser down).
CHROME_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)
#: The variable ``[store] url_env`` names when the stack runs on PostgreSQL.
DATABASE_ENV = "CONSOLE_TEST_DATABASE_URL"
HOSTILE = '<script>window.__pwned = 1</script><img src="x" id="pwned">'


@dataclass
class Consumer:
    """A webhook endpoint: answers ``status`` with ``body``; records webhook-ids."""

    status: int = 200
    body: str = "ok"
    seen: list[str] = field(default_factory=list)
    #: The bodies received, in order (the action links' browser test reads their links).
    bodies: list[bytes] = field(default_factory=list)

    def app(self) -> Starlette:
        async def hook(request: Request) -> Response:
            self.bodies.append(await request.body())
            self.seen.append(request.headers.get("webhook-id", ""))
            return Response(self.body, status_code=self.status, media_type="text/html")

        return Starlette(routes=[Route("/hook", hook, methods=["POST"])])

    def fail(self, status: int = 500) -> None:
        """Refuse from now on, answering hostile HTML."""
        self.status, self.body = status, f"upstream broke: {HOSTILE}"

    def recover(self) -> None:
        """Accept from now on."""
        self.status, self.body = 200, "ok"


def _config(
    directory: Path,
    base_url: str,
    hooks: dict[str, str],
    listen: str,
    token: str,
    database: str | None = None,
    actions: bool = False,
) -> Path:
    key_file = directory / "api_key"
    key_file.write_text(API_KEY)
    key_file.chmod(0o600)  # a secret file others can read is refused
    token_file = directory / "web_token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    lines = [
        "[api]",
        f"base_url = {json.dumps(base_url)}",
        f"api_key_file = {json.dumps(str(key_file))}",
        "requests_per_minute = 6000",  # to match the quick polls below
        "[store]",
        # A SQLite file, or the PostgreSQL database (its URL from the environment).
        f"path = {json.dumps(str(directory / 'relay.db'))}"
        if database is None
        else f"url_env = {json.dumps(DATABASE_ENV)}",
        "[poll]",
        "active_interval = 0.1",
        "idle_interval = 0.5",
        "discovery_interval = 0.2",
        "backfill = true",
        "[delivery]",
        "retry_delays = [0.2, 0.2]",
        "allow_private_networks = true",
        "[server]",
        f"listen = {json.dumps(listen)}",
        f"token_file = {json.dumps(str(token_file))}",
        "[log]",
        'level = "info"',
        'format = "json"',
    ]
    if actions:  # signed action links, their pages on the listener
        lines += ["[actions]", "enabled = true", f"public_url = {json.dumps('http://' + listen)}"]
    for name, url in hooks.items():
        lines += [
            "[[endpoints]]",
            f"name = {json.dumps(name)}",
            f"url = {json.dumps(url)}",
            f"secret = {json.dumps(generate_secret())}",
        ]
    path = directory / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


class Stack:
    """Emulator + consumers (in a background event loop) + ``sessionhook run`` on a SQLite
    file, or on the PostgreSQL ``database`` (a URL) when one is given."""

    def __init__(
        self,
        directory: Path,
        *,
        step_delay: float = 0.2,
        database: str | None = None,
        actions: bool = False,
    ) -> None:
        self.directory = directory
        self.database = database
        self.actions = actions
        self.emulator = create_app(api_keys=(API_KEY,), step_delay=step_delay, seed=5)
        self.world: World = self.emulator.state.world
        self.consumers = {"alpha": Consumer(), "beta": Consumer()}
        self.base = ""
        #: Sessions a test module created and refers to by role.
        self.hostile = ""
        self.calm = ""
        self.log = directory / "relay.log"
        self._stack = ExitStack()
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Stack:
        portal: BlockingPortal = self._stack.enter_context(start_blocking_portal())
        served, (_, emu_port) = portal.start_task(serve, "127.0.0.1:0", self.emulator)
        self._stack.callback(served.cancel)
        hooks = {}
        for name, consumer in self.consumers.items():
            served, (_, port) = portal.start_task(serve, "127.0.0.1:0", consumer.app())
            self._stack.callback(served.cancel)
            hooks[name] = f"http://127.0.0.1:{port}/hook"
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        config = _config(
            self.directory,
            f"http://127.0.0.1:{emu_port}",
            hooks,
            f"127.0.0.1:{port}",
            TOKEN,
            self.database,
            self.actions,
        )
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        if self.database is not None:
            env[DATABASE_ENV] = self.database
        with self.log.open("ab") as err:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "sessionhook.cli", "run", "--config", str(config)],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
            )
        self._stack.callback(self._stop)
        self.wait_for(lambda: self._console_up(), within=30, what="the console to answer")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def _console_up(self) -> bool:
        if self._process is not None and self._process.poll() is not None:
            raise AssertionError(f"sessionhook run exited: {self.log.read_text()[-2000:]}")
        try:
            return self.get("/console").status_code == 200
        except httpx.HTTPError:
            return False

    def session(self, prompt: str, title: str = "", *, approval: bool = False) -> str:
        """Create an emulator session (``approval``: its plan waits for :meth:`approve`);
        returns its resource name."""
        record = self.world.create_session(
            self.world.accounts[0], prompt=prompt, title=title, require_plan_approval=approval
        )
        return str(record.name)

    def approve(self, name: str) -> None:
        """Approve the session's waiting plan: it goes on (new activities follow)."""
        self.world.approve_plan(self.world.accounts[0], name.removeprefix("sessions/"))

    def get(self, path: str) -> httpx.Response:
        """A plain GET of the console with the bearer token (no browser)."""
        return httpx.get(
            f"{self.base}{path}", headers={"authorization": f"Bearer {TOKEN}"}, timeout=10
        )

    @staticmethod
    def wait_for(check: Callable[[], Any], *, within: float, what: str) -> Any:
        """Poll ``check`` until it returns something truthy, at most ``within`` seconds."""
        deadline = time.monotonic() + within
        while True:
            result = check()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {within}s waiting for {what}")
            time.sleep(0.1)


def browser_missing() -> str | None:
    """Why no browser test can run here, or ``None``."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is not installed"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is missing (scripts/system-deps installs it)"
    return None


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium driven by Selenium; fails under ``CI=true`` when missing."""
    missing = browser_missing()
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser tests cannot run: {missing}")
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="sessionhook-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in CHROME_FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        driver.set_page_load_timeout(30)
        try:
            yield driver
        finally:
            driver.quit()
