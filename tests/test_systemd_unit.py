"""The systemd unit: accepted by ``systemd-analyze verify`` and carrying the promised directives."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sessionhook.relay.config import ServerConfig
from sessionhook.relay.daemon.daemon import DRAIN_SECONDS
from tests.support.systemd_units import UNIT, directives, security_review, verify

pytestmark = pytest.mark.process

DOCUMENTED_EXEC_START = (
    "/opt/sessionhook/.venv/bin/sessionhook run --config /etc/sessionhook/config.toml"
)


def _complaints(result: subprocess.CompletedProcess[str]) -> list[str]:
    # verify exits 0 on unknown keys and unparsable values, only warning on stderr about
    # the file: those warnings count as failures here.
    return [line for line in result.stderr.splitlines() if "sessionhook.service" in line]


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    result = verify(UNIT, tmp_path)
    assert result.returncode == 0, result.stderr
    assert _complaints(result) == []


def test_verify_would_catch_a_mistake(tmp_path: Path) -> None:
    # The control for the test above: the same check notices a misspelled directive.
    broken = UNIT.read_text().replace("ProtectHome=yes", "ProtectHomme=yes")
    assert _complaints(verify(UNIT, tmp_path, broken))


def test_security_exposure_is_low(tmp_path: Path) -> None:
    result = security_review(UNIT, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert "Overall exposure level" in result.stdout


def test_key_directives() -> None:
    unit = directives(UNIT.read_text())
    service = unit["Service"]

    def one(key: str) -> str:
        [value] = service[key]
        return value

    assert one("Type") == "notify"
    assert one("WatchdogSec") == "30"
    assert one("ExecStart") == DOCUMENTED_EXEC_START
    assert one("ExecReload") == "/bin/kill -HUP $MAINPID"
    assert one("Restart") == "on-failure"
    assert one("DynamicUser") == "yes"
    assert one("StateDirectory") == "sessionhook"
    # The daemon drains deliveries on SIGTERM: systemd must wait longer before SIGKILL.
    assert int(one("TimeoutStopSec")) >= DRAIN_SECONDS + 5
    # The listener may use half the open-files limit: the default cap must fit with room.
    assert int(one("LimitNOFILE")) >= 4 * ServerConfig().max_connections
    credentials = dict(value.split(":", 1) for value in service["LoadCredential"])
    assert credentials["api_key"] == "/etc/sessionhook/api_key"
    assert all(path.startswith("/etc/sessionhook/") for path in credentials.values())
    hardening = {
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
        "CapabilityBoundingSet": "",
    }
    assert {key: one(key) for key in hardening} == hardening
    assert "@system-service" in service["SystemCallFilter"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_documented_credential_paths_match_the_unit() -> None:
    # The header tells operators which path to put in the config for each credential.
    text = UNIT.read_text()
    names = [v.split(":", 1)[0] for v in directives(text)["Service"]["LoadCredential"]]
    for name in names:
        assert f"/run/credentials/sessionhook.service/{name}" in text
