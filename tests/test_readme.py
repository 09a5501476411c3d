"""What a new user does, as the docs say it: the README's first real run (activate the
virtual environment, start the emulator, write the secrets to their files, start the
receiver, copy and edit the example config, run the relay, create a session, watch its
events, ping the endpoint, approve through the printed link), ``run --once`` as the
operations page gives it, and the emulator and API CLI commands of their pages, each read
from the page itself and run as written.

Real subprocesses only (``sessionhook emulator``, ``sessionhook run``, the API CLI), on
127.0.0.1. The example's ``api.base_url`` is the emulator's default address,
``127.0.0.1:8080``, and its listener ``127.0.0.1:9187``: test runs on this machine take
those ports in turn (a file lock); should something else hold one, the copy is pointed at
free ports instead (the only change, and ``SESSIONHOOK_BASE_URL`` for the API CLI).
"""

from __future__ import annotations

import fcntl
import html
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from tests.support import forked_cli
from tests.support.loopback import free_port

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[1]
SESSIONHOOK = Path(sys.executable).parent / "sessionhook"
API_KEY = "dev-key-for-the-readme"
EXAMPLE_BASE_URL = "http://127.0.0.1:8080"
#: Held while a test uses the example's fixed ports (8080 emulator, 9187 health, 8000 the
#: README's `listen`).
PORTS_LOCK = Path("/tmp/sessionhook-tests-example-ports.lock")


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SESSIONHOOK_", "CI_BOT_", "CHAT_", "CREDENTIALS_", "STATE_DIR"))
    }
    env.update(extra)
    return env


def sh(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``sessionhook ARGS`` as typed, forked from a warm interpreter
    (tests/support/forked_cli.py)."""
    return forked_cli.run(*args, env=env, cwd=cwd, timeout=90)


@contextmanager
def emulator(
    *args: str,
    env: dict[str, str],
    cwd: Path,
    logs: Path | None = None,
    on_start: Callable[[subprocess.Popen[str]], None] | None = None,
) -> Iterator[str | None]:
    """``sessionhook emulator ARGS`` until the block ends; yields its base URL, or ``None``
    when it could not listen (the port is taken). Its output goes to ``logs`` (default
    ``cwd``); ``on_start`` sees the process."""
    out = ((logs or cwd) / "emulator.out").open("w+")
    proc = subprocess.Popen(
        [str(SESSIONHOOK), "emulator", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        text=True,
    )
    try:
        if on_start is not None:
            on_start(proc)
        yield _listening(proc, out)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        out.close()


def _listening(proc: subprocess.Popen[str], out: IO[str]) -> str | None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out.seek(0)
        text = out.read()
        if match := re.search(r"listening on (http://\S+)", text):
            url = match.group(1)
            while time.monotonic() < deadline:  # answering, not only bound
                try:
                    httpx.get(f"{url}/v1alpha/sessions", timeout=2)
                    return url
                except httpx.HTTPError:
                    time.sleep(0.1)
        if proc.poll() is not None:
            if "cannot listen" in text:
                return None
            raise AssertionError(f"the emulator exited {proc.returncode}:\n{text}")
        time.sleep(0.05)
    raise AssertionError("the emulator did not start within 30 s")


@contextmanager
def example_ports_turn() -> Iterator[None]:
    """Test runs on this machine (several checkouts) take the example's ports in turn."""
    with PORTS_LOCK.open("a") as lock:
        deadline = time.monotonic() + 180
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{PORTS_LOCK} held for 3 minutes") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def create_session(base_url: str, prompt: str, **extra: object) -> str:
    body = {
        "prompt": prompt,
        "sourceContext": {
            "source": "sources/github/acme/api-server",
            "hostRepoContext": {"startingBranch": "main"},
        },
        **extra,
    }
    answer = httpx.post(
        f"{base_url}/v1alpha/sessions", json=body, headers={"x-vendor-api-key": API_KEY}
    )
    answer.raise_for_status()
    return str(answer.json()["name"])


# --------------------------------------------------------------------------- the docs' commands


def console_blocks(page: str, section: str) -> list[list[str]]:
    """The commands (``$ `` lines, continuations joined, comments dropped) of each console
    block under the heading ``section`` (any level) of ``page``, up to the next heading."""
    text = (REPO / page).read_text()
    match = re.search(rf"^#+ {re.escape(section)}\n(.*?)(?=^#+ |\Z)", text, re.M | re.S)
    assert match is not None, f"{page} has no heading {section!r}"
    blocks: list[list[str]] = []
    for block in re.findall(r"```console\n(.*?)\n```", match.group(1), re.S):
        commands = [
            re.sub(r"\s+#\s.*$", "", line[2:]).strip()
            for line in block.replace("\\\n", " ").splitlines()
            if line.startswith("$ ")
        ]
        blocks.append(commands)
    assert blocks, f"{page}, {section!r}: no console block"
    return blocks


def console_block(page: str, section: str) -> list[str]:
    """The commands of the first console block under ``section`` of ``page``."""
    return console_blocks(page, section)[0]


def expand(text: str, env: dict[str, str], cwd: Path | None = None) -> str:
    """``$NAME``, ``${NAME}`` (from ``env``) and ``$(cat FILE)`` (in ``cwd``) as the shell
    expands them."""
    if cwd is not None:
        text = re.sub(
            r"\$\(cat ([\w.-]+)\)", lambda m: (cwd / m.group(1)).read_text().strip(), text
        )
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env[m.group(1)], text)


def free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for(condition: Callable[[], bool], what: str, *, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


#: The README's secret files, and the one the relay makes on its first start with
#: ``[actions]`` on.
SECRET_FILES = ("ci-bot.secret", "chat.secret", "web.token", "action-links.key")


@dataclass
class FirstRun:
    """The README's four terminals, played by one test: what each started or printed."""

    #: The checkout the README runs in (a git work tree holding the repository's
    #: .gitignore and config.example.toml).
    work: Path
    #: What the processes printed: kept out of the checkout.
    logs: Path
    emulator_url: str | None = None
    #: The listener's port (9187 in the example; another when that one is taken).
    health: int = 9187
    daemon: subprocess.Popen[bytes] | None = None
    session: str | None = None
    followed: str = ""
    status: str = ""
    pinged: str = ""
    stack: ExitStack = field(default_factory=ExitStack)
    #: The shell of the terminal that started the relay.
    relay_env: dict[str, str] = field(default_factory=dict)
    #: ``sessionhook listen``, the receiver (its port: 8000 as written, or a free one).
    listener: subprocess.Popen[bytes] | None = None
    listen_port: int = 8000
    #: The command line of every process started: as given, and as /proc shows it.
    command_lines: list[str] = field(default_factory=list)

    def step(self, command: str, env: dict[str, str]) -> None:
        """One README line, done as a user's shell would."""
        argv = shlex.split(command)
        if argv == [".", ".venv/bin/activate"]:
            # make demo (Makefile: VENV := .venv) left sessionhook in .venv/bin.
            assert (REPO / ".venv/bin/activate").is_file()
            assert (REPO / ".venv/bin/sessionhook").is_file()
        elif match := re.fullmatch(r"export (\w+)=([\w.-]+)", command):
            env[match.group(1)] = match.group(2)
        elif argv[0] == "sed":
            edited = subprocess.run(argv, cwd=self.work, capture_output=True, text=True)
            assert edited.returncode == 0, edited.stderr
        elif argv[:2] == ["sessionhook", "secret"]:
            assert "--out" in argv, f"a secret printed, not kept in a file: {command}"
            self.sh(argv[1:], env)
        elif argv[:2] == ["sessionhook", "listen"]:
            self.start_listener([expand(a, env, self.work) for a in argv[2:]], env)
        elif argv == ["cp", "config.example.toml", "config.toml"]:
            shutil.copyfile(self.work / argv[1], self.work / argv[2])
        elif argv[:2] == ["sessionhook", "emulator"]:
            self.start_emulator([expand(a, env) for a in argv[2:]], env)
        elif argv == ["sessionhook", "run", "--config", "config.toml"]:
            self.relay_env = env
            self.start_relay(env)
        elif argv[:3] == ["sessionhook", "sessions", "create"]:
            assert self.emulator_url is not None
            if self.emulator_url != EXAMPLE_BASE_URL:
                env["SESSIONHOOK_BASE_URL"] = self.emulator_url
            found = re.search(r"sessions/\d+", self.sh(argv[1:], env))
            assert found is not None
            self.session = found.group(0)
        elif argv[:2] == ["sessionhook", "events"] and "--follow" in argv:
            self.follow(argv[1:], env)
        elif argv[:3] == ["sessionhook", "endpoints", "test"]:
            self.pinged = self.sh(argv[1:], env)
        elif argv[:2] == ["sessionhook", "status"]:
            self.status = self.sh(argv[1:], env)
        else:
            raise AssertionError(f"the README has a new step this test does not do: {command}")

    def sh(self, args: list[str], env: dict[str, str]) -> str:
        """``sessionhook ARGS`` in the checkout, which must succeed; its stdout."""
        self.command_lines.append(shlex.join(args))
        done = sh(*args, env=env, cwd=self.work)
        assert done.returncode == 0, f"$ sessionhook {shlex.join(args)}\n{done.stderr}"
        assert "Traceback" not in done.stderr
        return done.stdout

    def started(self, proc: subprocess.Popen[Any]) -> None:
        """Note a long-running process's command line, as ``ps`` shows it to everyone."""
        self.command_lines.append(shlex.join(str(a) for a in proc.args))  # type: ignore[union-attr]
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        self.command_lines.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))

    def start_emulator(self, args: list[str], env: dict[str, str]) -> None:
        self.emulator_url = self.stack.enter_context(
            emulator(*args, env=env, cwd=self.work, logs=self.logs, on_start=self.started)
        )
        if self.emulator_url is None or not free(self.health):
            # Something else holds 8080 or 9187: the same run on free ports; the copy
            # of the example differs in those addresses only.
            if self.emulator_url is None:
                self.emulator_url = self.stack.enter_context(
                    emulator(
                        *args,
                        "--port",
                        "0",
                        env=env,
                        cwd=self.work,
                        logs=self.logs,
                        on_start=self.started,
                    )
                )
            assert self.emulator_url is not None
            self.health = free_port()
        else:
            assert self.emulator_url == EXAMPLE_BASE_URL

    def start_listener(self, args: list[str], env: dict[str, str]) -> None:
        """``sessionhook listen`` as written (on a free port when 8000 is taken)."""
        assert args[:2] == ["--port", "8000"], args
        if not free(8000):
            self.listen_port = free_port()
            args[1] = str(self.listen_port)
        out = self.stack.enter_context((self.logs / "listen.out").open("w+b"))
        err = self.stack.enter_context((self.logs / "listen.err").open("w+b"))
        self.listener = subprocess.Popen(
            [str(SESSIONHOOK), "listen", *args],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=self.work,
        )
        self.stack.callback(self.kill, self.listener)
        self.started(self.listener)
        wait_for(
            lambda: "listening on" in self.listened()[1],
            f"listen did not start:\n{self.listened()}",
            seconds=30,
        )

    def listened(self) -> tuple[str, str]:
        """What the listener printed: stdout (the events), stderr (the rest)."""
        return tuple(  # type: ignore[return-value]
            (self.logs / f"listen.{name}").read_text(errors="replace") for name in ("out", "err")
        )

    def start_relay(self, env: dict[str, str]) -> None:
        assert self.emulator_url is not None, "the README starts the relay before the emulator"
        config = self.work / "config.toml"
        # The example as copied, with the README's edits: ci-bot at the listener, loopback
        # endpoints allowed, [actions] on at the relay's own address.
        example = (self.work / "config.example.toml").read_text()
        edited = (
            example.replace(
                'url = "https://hooks.example.com/sessions"',
                'url = "http://127.0.0.1:8000/ci-bot"',
                1,
            )
            .replace("\nallow_private_networks = false\n", "\nallow_private_networks = true\n", 1)
            .replace("\nenabled = false\n", "\nenabled = true\n", 1)
            .replace(
                '\npublic_url = "https://relay.example.com"\n',
                '\npublic_url = "http://127.0.0.1:9187"\n',
                1,
            )
        )
        assert edited.count("127.0.0.1:8000") == 1 and "networks = true" in edited
        assert edited.count("\nenabled = true\n") == 3  # ci-bot's, [actions]' and [mcp]'
        assert config.read_text() == edited
        if self.emulator_url != EXAMPLE_BASE_URL or self.health != 9187 or self.listen_port != 8000:
            text = config.read_text().replace(EXAMPLE_BASE_URL, self.emulator_url, 1)
            text = text.replace("127.0.0.1:8000", f"127.0.0.1:{self.listen_port}", 1)
            config.write_text(text.replace("127.0.0.1:9187", f"127.0.0.1:{self.health}"))
        out = self.stack.enter_context((self.logs / "run.out").open("w+b"))
        self.daemon = subprocess.Popen(
            [str(SESSIONHOOK), "run", "--config", "config.toml"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=self.work,
        )
        self.stack.callback(self.kill, self.daemon)
        self.started(self.daemon)
        wait_for(self.ready, f"the relay never got ready:\n{self.relay_log()}", seconds=30)

    def ready(self) -> bool:
        assert self.daemon is not None and self.daemon.poll() is None, self.relay_log()
        try:
            answer = httpx.get(f"http://127.0.0.1:{self.health}/readyz", timeout=2)
        except httpx.HTTPError:
            return False
        return answer.status_code == 200

    def relay_log(self) -> str:
        return (self.logs / "run.out").read_text(errors="replace")

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def follow(self, args: list[str], env: dict[str, str]) -> None:
        """``events --follow`` until the new session's first event shows, then Ctrl-C."""
        assert self.session is not None, "the README follows events before creating a session"
        path = self.logs / "follow.out"
        with path.open("w+b") as out:
            follower = subprocess.Popen(
                [str(SESSIONHOOK), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.work,
            )
            try:
                self.started(follower)
                wait_for(
                    lambda: "session.discovered" in path.read_text() or follower.poll() is not None,
                    f"no event of the new session within 60 s:\n{self.relay_log()}",
                )
                assert follower.poll() is None, path.read_text()
                follower.send_signal(signal.SIGINT)  # Ctrl-C stops it
                assert follower.wait(timeout=20) == 0, path.read_text()
            finally:
                if follower.poll() is None:
                    follower.kill()
                    follower.wait(timeout=10)
        self.followed = path.read_text()

    def approve(self) -> str:
        """Open the approve link the receiver printed, and approve, as a person in a
        browser would: the page (GET), then its form (POST). The link, as printed."""
        wait_for(
            lambda: "session.action_required" in self.listened()[0],
            f"listen printed no action:\n{self.listened()}\n{self.relay_log()}",
        )
        [line] = [x for x in self.listened()[0].splitlines() if "session.action_required" in x]
        found = re.search(r"approve the plan \(\d+ steps\): (\S+)", line)
        assert found is not None, line
        link = found.group(1)
        assert link.startswith(f"http://127.0.0.1:{self.health}/actions/"), line
        with httpx.Client(timeout=30) as browser:
            page = browser.get(link)
            assert page.status_code == 200, page.text  # the link, whole, works
            form = re.search(r'name="form_token" value="([^"]+)"', page.text)
            assert form is not None, page.text
            done = browser.post(link, data={"form_token": html.unescape(form.group(1))})
            assert done.status_code == 200, done.text
        return link


def git(work: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_first_real_run_works_as_written(tmp_path: Path) -> None:
    """README, "A first real run", line by line, each terminal with a shell of its own, in
    a checkout (the repository's .gitignore and example config): the emulator,
    ``sessionhook listen`` as the receiver, the relay on the example config as copied and
    edited, a session created and its events followed, a ping, ``status``, and the
    receiver's verified lines; the approve link it printed, opened and used. Every secret
    in a file of mode 0600, none on any command line, none needed where it is not used
    (``endpoints test`` with the chat endpoint's secret gone); the console and the API
    with the token of ``web.token``; nothing left in the checkout that git would add. Then
    Ctrl-C, and ``run --once`` as the operations page writes it."""
    terminals = console_blocks("README.md", "A first real run")
    assert len(terminals) == 4, terminals
    work, logs = tmp_path / "checkout", tmp_path / "logs"
    work.mkdir()
    logs.mkdir()
    for name in (".gitignore", "config.example.toml"):
        shutil.copyfile(REPO / name, work / name)
    git(work, "init", "-q")
    git(work, "add", ".")
    git(work, "commit", "-q", "-m", "the checkout")
    run = FirstRun(work, logs)
    with example_ports_turn(), run.stack:
        for commands in terminals:
            env = clean_env()
            for command in commands:
                run.step(command, env)
        assert run.session is not None and run.daemon is not None
        assert run.session in run.followed and "session.discovered" in run.followed
        assert "ci-bot" in run.status and "chat" in run.status
        assert run.pinged.startswith("POST http://127.0.0.1:") and "204" in run.pinged
        # The receiver got the new session's events from ci-bot, signatures verified.
        assert run.listener is not None
        wait_for(
            lambda: "session.discovered" in run.listened()[0],
            f"listen printed no event:\n{run.listened()}\n{run.relay_log()}",
        )
        shown = run.session.removeprefix("sessions/")[:6]
        [line] = [x for x in run.listened()[0].splitlines() if "session.discovered" in x]
        assert f"sessions/{shown}" in line and line.endswith("signature ok"), line
        [ping] = [x for x in run.listened()[0].splitlines() if "  ping " in x]
        assert ping.endswith("signature ok"), ping
        # The session waits for its plan's approval: the link the receiver printed, whole,
        # approves it.
        run.approve()
        wait_for(
            lambda: "activity.plan_approved" in run.listened()[0],
            f"the plan was not approved:\n{run.listened()}\n{run.relay_log()}",
        )
        assert "refused" not in run.listened()[1], run.listened()
        # Every secret in a file only its owner reads; none on a command line.
        secrets = {"dev-key"}
        for name in SECRET_FILES:
            assert (work / name).stat().st_mode & 0o777 == 0o600, name
            # (the key file's lines: a key and when it retires, "-" for the current one)
            secrets |= {word for word in (work / name).read_text().split() if len(word) > 16}
        for line in run.command_lines:
            assert not any(secret in line for secret in secrets), line
        # The token of web.token opens the console (its login form) and the API.
        token = (work / "web.token").read_text().strip()
        base = f"http://127.0.0.1:{run.health}"
        with httpx.Client(base_url=base) as browser:
            assert browser.get("/console").status_code == 401
            login = browser.post("/login", data={"token": token, "next": "/console"})
            assert login.status_code == 303, login.text
            assert browser.get("/console").status_code == 200
        api = sh("status", "--url", base, env=clean_env(SESSIONHOOK_WEB_TOKEN=token), cwd=work)
        assert api.returncode == 0 and "ci-bot" in api.stdout, api.stderr
        # `endpoints test` reads the secret it signs with, no other: the chat endpoint's
        # file gone, no API key, no token.
        (work / "chat.secret").rename(logs / "chat.secret")
        again = sh(
            "endpoints", "test", "ci-bot", "--config", "config.toml", env=clean_env(), cwd=work
        )
        assert again.returncode == 0, again.stderr
        (logs / "chat.secret").rename(work / "chat.secret")
        run.listener.send_signal(signal.SIGINT)  # Ctrl-C stops it
        assert run.listener.wait(timeout=20) == 130, run.listened()
        # Ctrl-C: the relay drains and exits 0.
        run.daemon.send_signal(signal.SIGINT)
        assert run.daemon.wait(timeout=20) == 0, run.relay_log()
        assert "Traceback" not in run.relay_log()
        # Operations, "Running it by hand": the same config, one pass, then exit.
        [foreground, once] = console_block("docs/operations.md", "Running it by hand")
        assert shlex.split(foreground) == ["sessionhook", "run", "--config", "config.toml"]
        assert shlex.split(once) == ["sessionhook", "run", "--config", "config.toml", "--once"]
        passed = sh(*shlex.split(once)[1:], env=run.relay_env, cwd=work)
        assert passed.returncode == 0, passed.stderr
        assert "Traceback" not in passed.stderr
    status = sh("status", "--config", "config.toml", "--json", env=clean_env(), cwd=work)
    assert status.returncode == 0, status.stderr
    summary = json.loads(status.stdout)
    assert summary["sessions"] == 1 and summary["events"] >= 1
    assert {e["name"] for e in summary["endpoints"]} == {"ci-bot", "chat"}
    assert all(e["configured"] and e["enabled"] for e in summary["endpoints"])
    assert (work / "sessionhook.db").is_file()  # next to the config, as documented
    # What the run left in the checkout (the store, its lock, the secrets, the edited
    # config) is ignored by git: `git add .` takes none of it.
    assert git(work, "status", "--porcelain", "--untracked-files=all") == ""


def test_the_emulator_command_works_as_written(tmp_path: Path) -> None:
    """docs/emulator.md, "Running it": the command with and without its [optional] parts."""
    [command] = console_block("docs/emulator.md", "Running it")
    env = clean_env()
    for argv in variants(command):
        args = [a for a in argv[1:] if a != "..."]
        args = [{"KEY": API_KEY, "KEY2": "second-key", "N": "7"}.get(a, a) for a in args]
        assert args[0] == "emulator" and "--port" in args
        with example_ports_turn():
            port = args[args.index("--port") + 1]
            if not free(int(port)):
                args[args.index("--port") + 1] = "0"
            with emulator(*args[1:], env=env, cwd=tmp_path) as url:
                assert url is not None
                for key in {API_KEY, "second-key"} & set(args):
                    answer = httpx.get(f"{url}/v1alpha/sources", headers={"x-vendor-api-key": key})
                    assert answer.status_code in (200, 429, 500), answer.text  # faults on


# --------------------------------------------------------------------------- the API CLI


def page_commands(page: str, section: str) -> list[str]:
    """The ``sessionhook ...`` commands of the first console block under ``section``."""
    return [c for c in console_block(page, section) if c.startswith("sessionhook ")]


def variants(command: str) -> list[list[str]]:
    """The command without its ``[optional]`` parts, and with all of them."""
    bare = re.sub(r"\s*\[[^\]]*\]", "", command)
    full = re.sub(r"\[([^\]]*)\]", r"\1", command)
    return [shlex.split(bare)] + ([shlex.split(full)] if full != bare else [])


def test_the_api_cli_commands_work_as_written(tmp_path: Path) -> None:
    commands = page_commands("docs/client.md", "The API CLI")
    assert len(commands) >= 6, commands
    env = clean_env(SESSIONHOOK_API_KEY=API_KEY)
    with emulator(
        "--api-key", API_KEY, "--port", "0", "--step-delay", "0.1", env=env, cwd=tmp_path
    ) as url:
        assert url is not None
        env["SESSIONHOOK_BASE_URL"] = url
        waiting = create_session(url, "Wait for me", requirePlanApproval=True)
        deadline = time.monotonic() + 30
        while (
            httpx.get(f"{url}/v1alpha/{waiting}", headers={"x-vendor-api-key": API_KEY}).json()[
                "state"
            ]
            != "AWAITING_PLAN_APPROVAL"
        ):
            assert time.monotonic() < deadline, "the session never waited for approval"
            time.sleep(0.1)
        created: str | None = None
        since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for command in commands:
            for argv in variants(command):
                args = argv[1:]
                session = waiting if args[:2] == ["sessions", "approve"] else created
                if "SESSION" in args:
                    assert session is not None, f"{command}: no session created before it"
                    args = [session if a == "SESSION" else a for a in args]
                args = [since if a == "T" else a for a in args]
                proc = sh(*args, env=env, cwd=tmp_path)
                assert proc.returncode == 0, f"$ sessionhook {shlex.join(args)}\n{proc.stderr}"
                if args[:2] == ["sessions", "create"]:
                    created = re.search(r"sessions/\d+", proc.stdout).group(0)  # type: ignore[union-attr]


# --------------------------------------------------------------------------- the two commands


def make_plan(target: str, tmp_path: Path) -> list[str]:
    """What ``make TARGET`` would run in a fresh checkout (no .venv yet): ``make -n``."""
    shutil.copyfile(REPO / "Makefile", tmp_path / "Makefile")
    shutil.copyfile(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    # Under ``make test`` the outer make's variables would make this one print
    # "Entering/Leaving directory" lines; the plan is what a fresh shell would run.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    for folder in ("requirements", "tests/jules-sdk"):
        shutil.copytree(REPO / folder, tmp_path / folder, dirs_exist_ok=True)
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", target],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_make_demo_installs_what_it_runs_and_make_test_everything(tmp_path: Path) -> None:
    """The README's two commands on a fresh machine: ``make demo`` installs the package
    (what the demo runs), not the test extras; ``make test`` installs those too, and the
    official Jules SDK: each from its lock."""
    demo = make_plan("demo", tmp_path)
    installs = [line for line in demo if "install" in line]
    assert installs == ["scripts/install .venv requirements/runtime.txt"], demo
    assert demo[-1] == ".venv/bin/sessionhook demo"
    test = make_plan("test", tmp_path)
    assert "scripts/install .venv requirements/test.txt" in test, test
    assert any(line.startswith("npm ci --prefix .cache/jules-sdk") for line in test), test
    assert (REPO / ".ci/run").read_text().strip().endswith("make test")


def _locked(lock: str) -> dict[str, tuple[str, int]]:
    """``requirements/LOCK``'s pins: name -> (version, how many hashes)."""
    pins: dict[str, tuple[str, int]] = {}
    name = ""
    for line in (REPO / "requirements" / lock).read_text().splitlines():
        if match := re.match(r"([A-Za-z0-9._-]+)==([^ ;\\]+)", line):
            name = match[1].lower().replace("_", "-").replace(".", "-")
            pins[name] = (match[2], 0)
        elif line.strip().startswith("--hash=sha256:"):
            pins[name] = (pins[name][0], pins[name][1] + 1)
    return pins


def test_the_locks_hold_what_pyproject_asks_each_pin_hashed() -> None:
    """requirements/runtime.txt pins every dependency of pyproject.toml within its range,
    test.txt every one of the test extras too, at the same versions (the runtime's lock is
    a subset of the tests'), and every pin has its hashes; uv.txt pins uv."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime, test = _locked("runtime.txt"), _locked("test.txt")
    for lock, wanted in (
        (runtime, project["dependencies"]),
        (test, project["dependencies"] + project["optional-dependencies"]["test"]),
    ):
        for requirement in map(Requirement, wanted):
            name = requirement.name.lower().replace("_", "-").replace(".", "-")
            assert name in lock, f"{requirement} is not locked: make lock"
            version, _ = lock[name]
            assert requirement.specifier.contains(version), f"{requirement}: {version} locked"
    assert {name: test[name] for name in runtime} == runtime
    uv = _locked("uv.txt")
    assert list(uv) == ["uv"]
    assert all(hashes for _, hashes in [*runtime.values(), *test.values(), *uv.values()])
