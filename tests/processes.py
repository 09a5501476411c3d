"""Which processes a process started, read from /proc (Linux): for tests that check a
child process is gone."""

from __future__ import annotations

from pathlib import Path


def children_of(pid: int) -> set[int]:
    """The children of ``pid`` (over all its threads), live or not yet reaped."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(child) for child in (task / "children").read_text().split()}
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (it exists and is no zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
