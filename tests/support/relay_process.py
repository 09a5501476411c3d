"""The real daemon as a subprocess, for black-box tests: ``sessionhook run`` with its config
written from a few knobs (:func:`relay_config`), its output in files printed when a test
fails (:class:`Relay`), and the servers and processes of one test stopped together
(:class:`Harness`, handed out by the ``harness`` fixture of conftest.py).

Only the command's public contract is used: the config file, signals, exit statuses, the
operator commands and the store file read with ``sqlite3``. Nothing is imported from
``sessionhook``. Every wait polls a condition under a deadline (:func:`wait_until`).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import forked_cli
from tests.support.blackbox_consumer import Consumer
from tests.support.standin import StandIn

SESSIONHOOK = Path(sys.executable).parent / "sessionhook"
#: The variable a PostgreSQL relay's ``store.url_env`` names (the URL stays out of the file).
URL_ENV = "RELAY_TEST_DATABASE_URL"


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what configures a relay (``SESSIONHOOK_*``) or
    ties it to systemd (``NOTIFY_SOCKET``, ``WATCHDOG_*``, ``STATE_DIRECTORY``), plus
    ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SESSIONHOOK_", "NOTIFY_SOCKET", "WATCHDOG_", "STATE_DIRECTORY"))
    }
    env.update(extra)
    return env


def sessionhook(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``sessionhook ARGS`` run to its end (no stdin, text output captured), in ``env``
    (by default :func:`clean_env`)."""
    return subprocess.run(
        [str(SESSIONHOOK), *args],
        capture_output=True,
        text=True,
        env=clean_env() if env is None else env,
        cwd=cwd,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """:func:`sessionhook` for a command whose test is not about the interpreter's start-up:
    a process of its own all the same, forked from a warm interpreter (``forked_cli``), as
    a fresh one costs seconds of CPU on a loaded machine."""
    return forked_cli.run(*args, env=clean_env() if env is None else env, cwd=cwd, timeout=timeout)


def wait_until(
    predicate: Callable[[], bool],
    timeout: float,
    what: str,
    diagnose: Callable[[], str] | None = None,
    *,
    every: float = 0.05,
) -> float:
    """Poll ``predicate`` ``every`` seconds until it holds; return the seconds it took, or
    fail at the deadline. A predicate that runs a command polls less often (``every=0.5``):
    its CPU is taken from the daemon under test."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            detail = f"\n{diagnose()}" if diagnose is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{detail}")
        time.sleep(every)
    return time.monotonic() - started


@dataclass
class Endpoint:
    name: str
    url: str
    secret: str
    events: tuple[str, ...] = ("*",)
    #: More TOML lines of this [[endpoints]] table (format, filter, rate_limit...).
    extra: tuple[str, ...] = ()


def relay_config(
    *,
    standin: StandIn,
    store: Path,
    endpoints: Iterable[Endpoint],
    rpm: int = 6000,
    active: float = 0.3,
    idle: float = 0.5,
    discovery: float = 0.3,
    backfill: bool = False,
    retry_delays: Iterable[float] = (0.2, 0.5, 1.0),
    timeout: float = 5.0,
    concurrency: int = 16,
    listen: str | None = None,
    render_timeout: float | None = None,
    store_url_env: str | None = None,
    more: Mapping[str, Iterable[str]] | None = None,
) -> str:
    """A relay's config for black-box tests: the stand-in's API at a high request budget,
    quick polls and retries, JSON logs, private addresses allowed (the consumers are on
    loopback), ``endpoints``. The store is the file ``store``, or with ``store_url_env`` the
    PostgreSQL database whose URL that variable holds (``url_env``: the password stays out
    of the file). ``more`` adds lines to a table (``{"poll": ["max_pages = 4"]}``)."""

    def s(value: str) -> str:
        return json.dumps(value)  # a TOML basic string for plain ASCII text

    lines = [
        "[api]",
        f"base_url = {s(standin.base_url)}",
        'api_key_env = "SESSIONHOOK_API_KEY"',
        f"requests_per_minute = {rpm}",
        "[store]",
        f"path = {s(str(store))}" if store_url_env is None else f"url_env = {s(store_url_env)}",
        "[poll]",
        f"active_interval = {active}",
        f"idle_interval = {idle}",
        f"discovery_interval = {discovery}",
        f"backfill = {str(backfill).lower()}",
        "[delivery]",
        f"retry_delays = [{', '.join(str(float(d)) for d in retry_delays)}]",
        f"timeout = {timeout}",
        "allow_private_networks = true",
        f"concurrency = {concurrency}",
        *([f"render_timeout = {render_timeout}"] if render_timeout is not None else []),
        "[log]",
        'level = "info"',
        'format = "json"',
    ]
    for e in endpoints:
        events = ", ".join(s(g) for g in e.events)
        lines += [
            "[[endpoints]]",
            f"name = {s(e.name)}",
            f"url = {s(e.url)}",
            f"secret = {s(e.secret)}",
            f"events = [{events}]",
            *e.extra,
        ]
    if listen is not None:
        lines += ["[server]", f"listen = {s(listen)}"]
    for table, added in (more or {}).items():
        at = lines.index(f"[{table}]") + 1
        lines[at:at] = list(added)
    return "\n".join(lines) + "\n"


class Relay:
    """One ``sessionhook run`` subprocess with its output in files."""

    def __init__(self, workdir: Path, label: str, config: str, api_key: str) -> None:
        self.label = label
        self.config_path = workdir / f"{label}.toml"
        self.config_path.write_text(config)
        self.stdout_path = workdir / f"{label}.stdout"
        self.stderr_path = workdir / f"{label}.stderr"
        self.env = clean_env(SESSIONHOOK_API_KEY=api_key)
        self.proc: subprocess.Popen[bytes] | forked_cli.Forked | None = None
        self.returncode: int | None = None
        #: Start the installed script, not a fork of the warm interpreter (a test of the
        #: process's memory or start-up).
        self.fresh = False
        #: Run in the child before the command (e.g. lower its open-files limit).
        self.preexec: Callable[[], None] | None = None

    def start(self, *args: str) -> Relay:
        """Start ``sessionhook run``: forked from the warm interpreter
        (:func:`forked_cli.spawn`), or the installed script when the test is about the
        process's own start (``fresh``, or a ``preexec`` to run in the child)."""
        command = ["run", "--config", str(self.config_path), *args]
        if not (self.fresh or self.preexec):
            self.proc = forked_cli.spawn(
                *command,
                env=self.env,
                cwd=self.config_path.parent,
                stdout=self.stdout_path,
                stderr=self.stderr_path,
            )
            return self
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [str(SESSIONHOOK), *command],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.config_path.parent,
                preexec_fn=self.preexec,
            )
        return self

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.label}: still running {timeout:g} s later\n{self.diagnostics()}"
            ) from None
        return self.returncode

    def command(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """An operator command (``sessionhook status``...) on this relay's config and in
        its environment (read while the daemon runs, or after), by :func:`run_cli`."""
        return run_cli(*args, "--config", str(self.config_path), env=self.env, timeout=timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self, timeout: float = 12.0) -> tuple[int, float]:
        """SIGTERM; returns (exit status, seconds it took to exit)."""
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.wait(timeout)
        return code, time.monotonic() - started

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.returncode = self.proc.wait(timeout=10)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def log_events(self) -> list[dict[str, Any]]:
        events = []
        for line in self.stderr.splitlines():
            try:
                parsed = json.loads(line)
            except ValueError:
                continue
            if isinstance(parsed, dict):
                events.append(parsed)
        return events

    def diagnostics(self, tail: int = 80) -> str:
        err = self.stderr.splitlines()[-tail:]
        out = self.stdout.splitlines()[-tail:]
        return (
            f"--- {self.label} (exit {self.returncode}) stderr, last {len(err)} lines:\n"
            + "\n".join(err)
            + f"\n--- {self.label} stdout:\n"
            + "\n".join(out)
        )


@dataclass
class Harness:
    """Servers and relay processes of one test; everything is stopped at teardown."""

    tmp: Path
    relays: list[Relay] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)
    #: Relays start from the installed script (:attr:`Relay.fresh`).
    fresh: bool = False

    def standin(self, **knobs: Any) -> StandIn:
        standin = StandIn(**knobs).start()
        self.closers.append(standin.stop)
        return standin

    def consumer(self) -> Consumer:
        consumer = Consumer().__enter__()
        self.closers.append(lambda: consumer.__exit__(None, None, None))
        return consumer

    def relay(
        self,
        standin: StandIn,
        label: str,
        *args: str,
        api_key: str | None = None,
        env: Mapping[str, str] | None = None,
        **config: Any,
    ) -> Relay:
        """``sessionhook run ARGS`` on :func:`relay_config` of ``standin`` and ``config``
        (the store ``relay.db`` of this test unless told), with the stand-in's key and
        ``env`` added to its environment."""
        config.setdefault("store", self.tmp / "relay.db")
        key = standin.api_key if api_key is None else api_key
        return self.start(label, relay_config(standin=standin, **config), key, *args, env=env)

    def main_relay(self, standin: StandIn, **config: Any) -> tuple[Consumer, Relay]:
        """A consumer with an endpoint ``main`` and a relay of ``standin`` delivering to it
        (:meth:`relay` with ``config``), once it completed its first discovery pass."""
        consumer = self.consumer()
        url, secret = consumer.add_endpoint("main")
        relay = self.relay(standin, "relay", endpoints=[Endpoint("main", url, secret)], **config)
        wait_ready(standin, relay)
        return consumer, relay

    def start(
        self,
        label: str,
        config: str,
        api_key: str,
        *args: str,
        env: Mapping[str, str] | None = None,
        preexec: Callable[[], None] | None = None,
    ) -> Relay:
        """``sessionhook run ARGS`` on the config text ``config`` (one that
        :func:`relay_config` cannot write) with ``env`` added to its environment and
        ``preexec`` run in the child first, stopped at teardown."""
        relay = Relay(self.tmp, label, config, api_key)
        relay.env.update(env or {})
        relay.preexec = preexec
        relay.fresh = self.fresh
        self.relays.append(relay)
        return relay.start(*args)

    def diagnostics(self) -> str:
        return "\n".join(r.diagnostics() for r in self.relays)

    def close(self) -> None:
        for relay in self.relays:
            relay.kill()
        # The servers shut down in parallel (each takes a moment).
        stoppers = [threading.Thread(target=close) for close in self.closers]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join(timeout=15)
        # Shown by pytest only when the test failed.
        print(self.diagnostics())


def wait_ready(standin: StandIn, relay: Relay, timeout: float = 20.0) -> None:
    """Until the relay completed a discovery pass (a second successful one was answered)."""

    def ready() -> bool:
        if not relay.alive():
            raise AssertionError(f"the relay exited early\n{relay.diagnostics()}")
        answered = [r for r in standin.requests("list_sessions") if r.status == 200]
        return len(answered) >= 2

    wait_until(ready, timeout, "the relay's first discovery pass", relay.diagnostics)


def outbox_empty(relay: Relay, endpoint: str) -> bool:
    """Whether ``sessionhook status --json`` shows nothing waiting for ``endpoint`` (the
    operator's view of the outbox, read while the daemon runs)."""
    run = relay.command("status", "--json")
    if run.returncode != 0:
        return False
    waiting = {e["name"]: e["pending"] for e in json.loads(run.stdout)["endpoints"]}
    return waiting.get(endpoint) == 0


def assert_clean_exit(relay: Relay, within: float = 12.0) -> None:
    code, took = relay.terminate(timeout=within)
    assert code == 0, f"exit status {code} after SIGTERM\n{relay.diagnostics()}"
    assert took <= within
    assert "Traceback" not in relay.stderr, relay.diagnostics()


def readyz(port: int) -> tuple[int, dict[str, Any]]:
    """A daemon's ``GET /readyz``: its status and JSON body (503 included)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def read_store(store: Path, sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` on a relay's SQLite store, opened read-only (as an operator might)."""
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()
