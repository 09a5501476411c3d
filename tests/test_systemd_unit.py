"""The systemd unit: accepted by ``systemd-analyze verify`` and carrying the promised directives."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from sessionhook.relay.config import ServerConfig
from sessionhook.relay.daemon.daemon import DRAIN_SECONDS

UNIT = Path(__file__).resolve().parent.parent / "systemd" / "sessionhook.service"
DOCUMENTED_EXEC_START = (
    "/opt/sessionhook/.venv/bin/sessionhook run --config /etc/sessionhook/config.toml"
)
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed here"
)


def _directives(text: str) -> dict[str, dict[str, list[str]]]:
    """section -> key -> values; systemd allows a key several times (LoadCredential=...)."""
    sections: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not a KEY=VALUE line: {raw!r}"
        sections[section][key.strip()].append(value.strip())
    return sections


def _copy_runnable(tmp_path: Path, text: str | None = None) -> Path:
    """The unit with ExecStart pointing at a binary that exists on this machine."""
    content = UNIT.read_text() if text is None else text
    content = content.replace("/opt/sessionhook/.venv/bin/sessionhook", sys.executable)
    copy = tmp_path / "sessionhook.service"
    copy.write_text(content)
    return copy


def _verify(unit: Path) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _complaints(result: subprocess.CompletedProcess[str]) -> list[str]:
    # verify exits 0 on unknown keys and unparsable values, only warning on stderr about
    # the file: those warnings count as failures here.
    return [line for line in result.stderr.splitlines() if "sessionhook.service" in line]


@needs_systemd_analyze
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    result = _verify(_copy_runnable(tmp_path))
    assert result.returncode == 0, result.stderr
    assert _complaints(result) == []


@needs_systemd_analyze
def test_verify_would_catch_a_mistake(tmp_path: Path) -> None:
    # The control for the test above: the same check notices a misspelled directive.
    broken = UNIT.read_text().replace("ProtectHome=yes", "ProtectHomme=yes")
    assert _complaints(_verify(_copy_runnable(tmp_path, broken)))


@needs_systemd_analyze
def test_security_exposure_is_low(tmp_path: Path) -> None:
    # --threshold is on the internal 0-100 scale: 20 is an overall exposure of 2.0 ("OK").
    assert SYSTEMD_ANALYZE is not None
    result = subprocess.run(
        [
            SYSTEMD_ANALYZE,
            "security",
            "--offline=yes",
            "--threshold=20",
            "--no-pager",
            str(_copy_runnable(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if "--offline" in result.stderr and "unrecognized" in result.stderr:
        pytest.skip("this systemd-analyze has no offline security review")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert "Overall exposure level" in result.stdout


def test_key_directives() -> None:
    unit = _directives(UNIT.read_text())
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
    names = [v.split(":", 1)[0] for v in _directives(text)["Service"]["LoadCredential"]]
    for name in names:
        assert f"/run/credentials/sessionhook.service/{name}" in text
