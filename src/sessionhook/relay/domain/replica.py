"""This process as a replica of the relay: its identity and the lease arithmetic (pure).

Every ``sessionhook run`` registers as a replica in its store (``replicas`` table) and
heartbeats every :func:`heartbeat_interval`; each heartbeat extends every claim it holds to
``now + lease`` (see :mod:`sessionhook.relay.store.leases`). With SQLite there is one
replica (the daemon lock refuses a second); with PostgreSQL any number share the work.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .rows import ReplicaRow

#: The named lease of an account's poller (discovery, the list's head, the history walk
#: and the schedule of its sessions' polls): ``poller:<account>``.
POLLER_LEASE = "poller:"


@dataclass(frozen=True, slots=True)
class Replica:
    """Who this process is: a random id (unique even when a pid is reused), its host and
    pid (for the operator)."""

    id: str
    host: str
    pid: int

    @classmethod
    def current(cls) -> Replica:
        """This process, with a fresh random id."""
        return cls(id=secrets.token_hex(6), host=os.uname().nodename, pid=os.getpid())

    @property
    def label(self) -> str:
        """``id@host:pid`` for logs and the CLI."""
        return f"{self.id}@{self.host}:{self.pid}"


def poller_lease(account: str) -> str:
    """The name of ``account``'s poller lease."""
    return POLLER_LEASE + account


def heartbeat_interval(lease: float) -> float:
    """Seconds between heartbeats: a third of the lease, so two may be missed (a busy
    machine, a slow commit) before the claims expire."""
    return lease / 3.0


def sending_until(confirmed_at: float, lease: float) -> float:
    """Until when a replica whose last heartbeat committed at ``confirmed_at`` may be
    sending what it claimed: one heartbeat interval before its claims lapse. A rival takes
    them over only once the whole lease has passed, so the two never post to one queue at
    once, even when this replica's heartbeats are late (a loaded machine)."""
    return confirmed_at + lease - heartbeat_interval(lease)


def heartbeat_late(last_ok: float, now: float, lease: float) -> bool:
    """Whether this replica's claims may have expired: no heartbeat committed for more
    than the lease (others may have taken its work over)."""
    return now - last_ok > lease


def dead_replicas(
    rows: Iterable[ReplicaRow], me: Replica, *, alone: bool, pid_alive: Callable[[int], bool]
) -> list[str]:
    """The replicas of ``rows`` known to be dead without waiting for their lease: every
    running one but ``me`` when this process is ``alone`` on the store (SQLite: the daemon
    lock), else those of this host whose pid is gone (a restart after ``kill -9``). A pid
    reused by another process only means waiting for the lease."""
    dead = []
    for r in rows:
        if r.id == me.id or r.stopped_at is not None:
            continue
        if alone or (r.host == me.host and not pid_alive(r.pid)):
            dead.append(r.id)
    return dead


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def replica_health(heartbeat_at: float, lease: float, stopped_at: float | None, now: float) -> str:
    """A replica as the operator sees it: ``stopped`` (left cleanly), ``alive`` (heartbeat
    within the lease), or ``dead`` (silent longer than its lease: its claims are free)."""
    if stopped_at is not None:
        return "stopped"
    return "alive" if now - heartbeat_at <= lease else "dead"
