"""The shipped systemd units for tests: their paths, their directives parsed
(:func:`directives`), a copy whose ExecStart names a binary that exists here
(:func:`runnable_copy`), and ``systemd-analyze`` (:func:`analyze`, :func:`verify`,
:func:`security_review`: a test that calls one is skipped where it is not installed)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "sessionhook.service"
REPLICA = UNIT.parent / "sessionhook-replica@.service"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")


def directives(text: str) -> dict[str, dict[str, list[str]]]:
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


def runnable_copy(
    unit: Path, directory: Path, text: str | None = None, *, name: str | None = None
) -> Path:
    """``unit`` (or ``text`` in its place) in ``directory`` as ``name`` (by default the
    unit's own), with ExecStart pointing at a binary that exists on this machine."""
    content = unit.read_text() if text is None else text
    content = content.replace("/opt/sessionhook/.venv/bin/sessionhook", sys.executable)
    copy = directory / (name or unit.name)
    copy.write_text(content)
    return copy


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze ARGS`` (text output captured, any exit status); skips the test
    where systemd-analyze is not installed."""
    if SYSTEMD_ANALYZE is None:
        pytest.skip("systemd-analyze is not installed here")
    return subprocess.run(
        [SYSTEMD_ANALYZE, *args], capture_output=True, text=True, timeout=60, check=False
    )


def verify(
    unit: Path, directory: Path, text: str | None = None, *, name: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` of :func:`runnable_copy` (same arguments); it warns on
    stderr, exit status 0, about unknown keys and values it cannot parse."""
    return analyze("verify", "--man=no", str(runnable_copy(unit, directory, text, name=name)))


def security_review(
    unit: Path, directory: Path, *, name: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze security`` of :func:`runnable_copy` (same arguments), failing above
    an overall exposure of 2.0 ("OK"; ``--threshold`` is on the internal 0-100 scale).
    Skips the test where this systemd-analyze has no offline review."""
    copy = runnable_copy(unit, directory, name=name)
    result = analyze("security", "--offline=yes", "--threshold=20", "--no-pager", str(copy))
    if "--offline" in result.stderr and "unrecognized" in result.stderr:
        pytest.skip("this systemd-analyze has no offline security review")
    return result
