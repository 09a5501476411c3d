"""What a new user does, as the README says it: copy the example config, export the
documented variables, start the emulator, run the relay; and the API CLI commands of the
README, read from the README itself and run as written.

Real subprocesses only (``sessionhook emulator``, ``sessionhook run``, the API CLI), on
127.0.0.1. The example's ``api.base_url`` is the emulator's default address,
``127.0.0.1:8080``, and its health listener ``127.0.0.1:9187``: test runs on this machine
take those ports in turn (a file lock); should something else hold one, the copy is pointed
at free ports instead (the only change).
"""

from __future__ import annotations

import fcntl
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
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import httpx
import pytest

from tests.support.loopback import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
SESSIONHOOK = Path(sys.executable).parent / "sessionhook"
API_KEY = "dev-key-for-the-readme"
EXAMPLE_BASE_URL = "http://127.0.0.1:8080"
#: Held while a test uses the example's fixed ports (8080 emulator, 9187 health).
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
    return subprocess.run(
        [str(SESSIONHOOK), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=90,
        stdin=subprocess.DEVNULL,
    )


@contextmanager
def emulator(*args: str, env: dict[str, str], cwd: Path) -> Iterator[str | None]:
    """``sessionhook emulator ARGS`` until the block ends; yields its base URL, or ``None``
    when it could not listen (the port is taken)."""
    out = (cwd / "emulator.out").open("w+")
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


# --------------------------------------------------------------------------- the example config


def console_block(section: str) -> list[str]:
    """The commands (``$ `` lines, continuations joined, comments dropped) of the first
    console block under the README heading ``## section``."""
    text = (REPO / "README.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1]
    block = body.split("```console\n", 1)[1].split("\n```", 1)[0]
    commands: list[str] = []
    for line in block.replace("\\\n", " ").splitlines():
        if line.startswith("$ "):
            commands.append(re.sub(r"\s+#\s.*$", "", line[2:]).strip())
    return commands


def free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_example_config_runs_as_copied_against_the_emulator(tmp_path: Path) -> None:
    """README, "Running the relay", done line by line: cp config.example.toml
    config.toml, the exports, then both `run` commands, against the emulator started as
    the README says (`sessionhook emulator --api-key "$SESSIONHOOK_API_KEY"`)."""
    env = clean_env()
    runs: list[list[str]] = []
    for command in console_block("Running the relay"):
        argv = shlex.split(command)
        if argv == ["cp", "config.example.toml", "config.toml"]:
            shutil.copyfile(REPO / argv[1], tmp_path / argv[2])
        elif argv == ["export", "SESSIONHOOK_API_KEY=..."]:
            env["SESSIONHOOK_API_KEY"] = API_KEY
        elif match := re.fullmatch(
            r"export (\w+)=\$\(sessionhook secret (generate|token)\)", command
        ):
            generated = sh("secret", match.group(2), env=env, cwd=tmp_path)
            assert generated.returncode == 0, generated.stderr
            env[match.group(1)] = generated.stdout.strip()
        elif argv[:2] == ["sessionhook", "run"]:
            runs.append(argv[2:])
        else:
            raise AssertionError(f"the README has a new step this test does not do: {command}")
    assert runs == [["--config", "config.toml"], ["--config", "config.toml", "--once"]]
    config = tmp_path / "config.toml"
    assert config.read_bytes() == (REPO / "config.example.toml").read_bytes()

    started = ["--api-key", env["SESSIONHOOK_API_KEY"]]
    with example_ports_turn(), emulator(*started, env=env, cwd=tmp_path) as url:
        health = 9187
        if url is None or not free(health):
            # Something else holds 8080 or 9187: the same runs on free ports; the copy
            # differs from the example in those addresses only.
            with emulator(*started, "--port", "0", env=env, cwd=tmp_path) as url:
                assert url is not None
                health = free_port()
                text = config.read_text().replace(EXAMPLE_BASE_URL, url, 1)
                config.write_text(text.replace("127.0.0.1:9187", f"127.0.0.1:{health}", 1))
                _run_the_copy(config, url, health, env)
        else:
            assert url == EXAMPLE_BASE_URL
            _run_the_copy(config, url, health, env)


def _run_the_copy(config: Path, url: str, health: int, env: dict[str, str]) -> None:
    session = create_session(url, "Add a health check")
    # $ sessionhook run --config config.toml: ready, then SIGTERM stops it cleanly.
    out = (config.parent / "run.err").open("w+")
    daemon = subprocess.Popen(
        [str(SESSIONHOOK), "run", "--config", "config.toml"],
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=config.parent,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert daemon.poll() is None, (config.parent / "run.err").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{health}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (config.parent / "run.err").read_text()
            time.sleep(0.1)
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=20) == 0, (config.parent / "run.err").read_text()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(timeout=10)
        out.close()
    assert "Traceback" not in (config.parent / "run.err").read_text()
    # $ sessionhook run --config config.toml --once
    once = sh("run", "--config", "config.toml", "--once", env=env, cwd=config.parent)
    assert once.returncode == 0, once.stderr
    assert "Traceback" not in once.stderr
    status = sh("status", "--config", "config.toml", "--json", env=env, cwd=config.parent)
    assert status.returncode == 0, status.stderr
    summary = json.loads(status.stdout)
    assert summary["sessions"] == 1 and summary["events"] >= 1
    assert {e["name"] for e in summary["endpoints"]} == {"ci-bot", "chat"}
    assert all(e["configured"] and e["enabled"] for e in summary["endpoints"])
    assert (config.parent / "sessionhook.db").is_file()  # next to the config, as documented
    events = sh(
        "events", "--config", "config.toml", "--session", session, env=env, cwd=config.parent
    )
    assert events.returncode == 0 and "session.discovered" in events.stdout, events.stderr


def test_readme_emulator_command_works_as_written(tmp_path: Path) -> None:
    """## The emulator: the command with and without its [optional] parts."""
    [command] = console_block("The emulator")
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


def readme_commands(section: str) -> list[str]:
    """The ``sessionhook ...`` commands of the first console block under ``## section``."""
    return [c for c in console_block(section) if c.startswith("sessionhook ")]


def variants(command: str) -> list[list[str]]:
    """The command without its ``[optional]`` parts, and with all of them."""
    bare = re.sub(r"\s*\[[^\]]*\]", "", command)
    full = re.sub(r"\[([^\]]*)\]", r"\1", command)
    return [shlex.split(bare)] + ([shlex.split(full)] if full != bare else [])


def test_readme_api_cli_commands_work_as_written(tmp_path: Path) -> None:
    commands = readme_commands("The API CLI")
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
