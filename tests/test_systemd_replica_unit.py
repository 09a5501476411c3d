"""The replica's systemd unit (``systemd/sessionhook-replica@.service``): accepted by
``systemd-analyze verify``, as hardened as the single relay's unit, and carrying what a
replica needs (its own config per instance, the database password as a credential)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionhook.relay.daemon.daemon import DRAIN_SECONDS
from tests.support.systemd_units import REPLICA, UNIT, directives, security_review, verify

pytestmark = pytest.mark.process

INSTANCE = "sessionhook-replica@1.service"  # the template as instance 1


def test_systemd_analyze_verifies_the_replica_unit(tmp_path: Path) -> None:
    result = verify(REPLICA, tmp_path, name=INSTANCE)
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines() if "sessionhook-replica" in line] == []
    broken = REPLICA.read_text().replace("ProtectHome=yes", "ProtectHomme=yes")
    control = verify(REPLICA, tmp_path, broken, name=INSTANCE)
    assert any("ProtectHomme" in line for line in control.stderr.splitlines())


def test_replica_unit_exposure_is_low(tmp_path: Path) -> None:
    result = security_review(REPLICA, tmp_path, name=INSTANCE)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr


def test_replica_directives() -> None:
    unit = directives(REPLICA.read_text())
    single = directives(UNIT.read_text())["Service"]
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
