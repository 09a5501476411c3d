"""``sessionhook emulator`` as a real subprocess on a loopback port."""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.support import forked_cli

pytestmark = pytest.mark.process

SESSIONHOOK = Path(sys.executable).parent / "sessionhook"
STARTUP = re.compile(r"listening on (http://127\.0\.0\.1:(\d+)) \((\d+) accounts?")


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SESSIONHOOK_API_KEY"}
    return {**env, **extra}


def _read_line(process: subprocess.Popen[str], timeout: float) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    if not ready:
        raise AssertionError(f"no startup line within {timeout}s")
    return process.stdout.readline()


@contextmanager
def emulator(
    *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], str, int]]:
    """Start the emulator on a free port; yield the process, its base URL, its accounts."""
    process = subprocess.Popen(
        [str(SESSIONHOOK), "emulator", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or _environment(),
    )
    try:
        line = _read_line(process, timeout=20)
        match = STARTUP.search(line)
        assert match, f"unexpected startup line {line!r}"
        assert int(match[2]) > 0
        yield process, match[1], int(match[3])
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def _stop(process: subprocess.Popen[str], sig: int) -> int:
    process.send_signal(sig)
    return process.wait(timeout=15)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serves_accounts_and_exits_0_on_signal(sig: int) -> None:
    with emulator("--api-key", "k1", "--api-key", "k2,k3", "--seed", "3") as (
        process,
        url,
        accounts,
    ):
        assert accounts == 2
        with httpx.Client(base_url=url, timeout=10) as client:
            sources = client.get("/v1alpha/sources", headers={"x-vendor-api-key": "k1"})
            assert sources.status_code == 200 and len(sources.json()["sources"]) == 4
            created = client.post(
                "/v1alpha/sessions", json={"prompt": "hello"}, headers={"x-vendor-api-key": "k3"}
            )
            assert created.status_code == 200 and created.json()["state"] == "QUEUED"
            path = f"/v1alpha/sessions/{created.json()['id']}"
            assert client.get(path, headers={"X-Vendor-Api-Key": "k2"}).status_code == 200
            assert client.get(path, headers={"x-vendor-api-key": "k1"}).status_code == 403
            assert client.get(path).json()["error"]["status"] == "UNAUTHENTICATED"
        assert _stop(process, sig) == 0


def test_agent_runs_in_real_time_with_a_short_step_delay() -> None:
    with emulator("--api-key", "k", "--step-delay", "0.02") as (process, url, _):
        with httpx.Client(base_url=url, timeout=10, headers={"x-vendor-api-key": "k"}) as client:
            session_id = client.post("/v1alpha/sessions", json={"prompt": "go"}).json()["id"]
            deadline = time.monotonic() + 15
            state = "QUEUED"
            while state != "COMPLETED" and time.monotonic() < deadline:
                time.sleep(0.05)
                state = client.get(f"/v1alpha/sessions/{session_id}").json()["state"]
            assert state == "COMPLETED"
            listed = client.get(f"/v1alpha/sessions/{session_id}/activities").json()
            assert "sessionCompleted" in listed["activities"][-1]
        assert _stop(process, signal.SIGTERM) == 0


def test_key_from_the_environment() -> None:
    with emulator(env=_environment(SESSIONHOOK_API_KEY="from-env")) as (process, url, accounts):
        assert accounts == 1
        response = httpx.get(url + "/v1alpha/sources", headers={"x-vendor-api-key": "from-env"})
        assert response.status_code == 200
        assert _stop(process, signal.SIGTERM) == 0


def test_refuses_to_start_without_a_key() -> None:
    result = forked_cli.run("emulator", "--port", "0", env=_environment(), timeout=30)
    assert result.returncode == 2
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert "--api-key" in line and "SESSIONHOOK_API_KEY" in line


def test_a_busy_port_is_one_clear_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = ["emulator", "--port", str(port), "--api-key", "k"]
        result = forked_cli.run(*args, env=_environment(), timeout=30)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert f"127.0.0.1:{port}" in line


def test_consistency_delay_answers_404_then_the_session() -> None:
    with emulator("--api-key", "k", "--consistency-delay", "3") as (process, url, _):
        with httpx.Client(base_url=url, timeout=10, headers={"x-vendor-api-key": "k"}) as client:
            created = client.post("/v1alpha/sessions", json={"prompt": "go"})
            path = f"/v1alpha/sessions/{created.json()['id']}"
            assert client.get(path).status_code == 404
            assert client.get(path + "/activities").status_code == 404
            deadline = time.monotonic() + 15
            while client.get(path).status_code == 404:
                assert time.monotonic() < deadline, "still 404 long after the delay"
                time.sleep(0.1)
        assert _stop(process, signal.SIGTERM) == 0
    args = ["emulator", "--api-key", "k", "--consistency-delay", "-1"]
    refused = forked_cli.run(*args, env=_environment(), timeout=30)
    assert refused.returncode == 2 and "consistency-delay" in refused.stderr
