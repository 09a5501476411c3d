"""Processes for tests: which ones a process started and whether they live, read from /proc
(Linux), for tests that check a child process is gone; Ctrl-C for a command that follows
something (:func:`interrupt`); and a script run in a fresh interpreter of this venv, for
what must not happen in the test process itself."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path


def children_of(pid: int) -> set[int]:
    """The children of ``pid`` (over all its threads), live or not yet reaped."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            listed = (task / "children").read_text()
        except FileNotFoundError:  # a thread that ended since the directory was listed
            continue
        found |= {int(child) for child in listed.split()}
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (it exists and is no zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def interrupt(proc: subprocess.Popen[bytes]) -> str:
    """Ctrl-C, as at a terminal: the command must exit 0 within 10 s. Its stderr."""
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 0
    assert proc.stderr is not None
    return proc.stderr.read().decode()


def run_python(script: str, cwd: Path) -> str:
    """Run ``script`` (dedented) in a fresh interpreter of this venv; its stdout, stripped.
    For what must not happen in this test process (imports already made here, a frozen
    heap). A failing script fails the test with its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
