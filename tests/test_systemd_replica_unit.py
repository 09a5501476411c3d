"""The replica's systemd unit (``systemd/sessionhook-replica@.service``): accepted by
``systemd-analyze verify``, as hardened as the single relay's unit, and carrying what a
replica needs (its own config per instance, the database password as a credential)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sessionhook.relay.daemon.daemon import DRAIN_SECONDS

from .test_systemd_unit import (
    SYSTEMD_ANALYZE,
    UNIT,
    _directives,
    needs_systemd_analyze,
)

REPLICA = UNIT.parent / "sessionhook-replica@.service"


def _instance(tmp_path: Path, text: str | None = None) -> Path:
    """The template as instance ``1``, ExecStart pointing at a binary that exists here."""
    content = REPLICA.read_text() if text is None else text
    content = content.replace("/opt/sessionhook/.venv/bin/sessionhook", sys.executable)
    copy = tmp_path / "sessionhook-replica@1.service"
    copy.write_text(content)
    return copy


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    assert SYSTEMD_ANALYZE is not None
    return subprocess.run(
        [SYSTEMD_ANALYZE, *args], capture_output=True, text=True, timeout=60, check=False
    )


@needs_systemd_analyze
def test_systemd_analyze_verifies_the_replica_unit(tmp_path: Path) -> None:
    result = _run("verify", "--man=no", str(_instance(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines() if "sessionhook-replica" in line] == []
    broken = REPLICA.read_text().replace("ProtectHome=yes", "ProtectHomme=yes")
    control = _run("verify", "--man=no", str(_instance(tmp_path, broken)))
    assert any("ProtectHomme" in line for line in control.stderr.splitlines())


@needs_systemd_analyze
def test_replica_unit_exposure_is_low(tmp_path: Path) -> None:
    result = _run(
        "security", "--offline=yes", "--threshold=20", "--no-pager", str(_instance(tmp_path))
    )
    if "--offline" in result.stderr and "unrecognized" in result.stderr:
        pytest.skip("this systemd-analyze has no offline security review")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr


def test_replica_directives() -> None:
    unit = _directives(REPLICA.read_text())
    single = _directives(UNIT.read_text())["Service"]
    service = unit["Service"]

    def one(key: str) -> str:
        [value] = service[key]
        return value

    assert one("Type") == "notify"
    assert one("ExecStart") == (
        "/opt/sessionhook/.venv/bin/sessionhook run --config /etc/sessionhook/replica-%i.toml"
    )
    assert int(one("TimeoutStopSec")) >= DRAIN_SECONDS + 5
    assert one("RestartPreventExitStatus") == "2"
    assert one("LimitNOFILE") == single["LimitNOFILE"][0]
    # No state on the machine: the store is the database.
    assert "StateDirectory" not in service
    credentials = dict(value.split(":", 1) for value in service["LoadCredential"])
    assert credentials["pgpass"] == "/etc/sessionhook/pgpass"
    assert (
        "PGPASSFILE=/run/credentials/sessionhook-replica@%i.service/pgpass"
        in service["Environment"]
    )
    # Every hardening directive of the single relay's unit, with the same value.
    hardening = [
        key
        for key in single
        if key.startswith(("Protect", "Private", "Restrict", "System", "Memory", "Capab"))
        or key in ("NoNewPrivileges", "LockPersonality", "RemoveIPC", "AmbientCapabilities")
    ]
    assert len(hardening) > 20
    assert {k: service[k] for k in hardening} == {k: single[k] for k in hardening}
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
