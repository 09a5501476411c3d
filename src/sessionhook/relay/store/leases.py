"""The lease protocol's queries (the leases role): replicas, their claims on outbox heads
and session polls, and named leases (``docs/replicas.md``). A claim lives as long as its
owner is alive (:data:`LIVE_REPLICAS`: ``heartbeat_at + lease`` not passed, not stopped),
so one heartbeat extends them all; it may be taken when free, its owner dead, or the
taker's already (:data:`TAKEABLE`). Only a registered handle (the daemon's) claims; with
SQLite there is one daemon, and the protocol never meets a rival. Times are each replica's
clock: replicas' clocks must agree to well within a lease (NTP).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ..domain.replica import sending_until
from ..domain.rows import ReplicaRow, from_row
from .dialect import Connection, Database, first_value
from .policy import call, read, try_write, write

#: Replicas not heard of for this long, or stopped this long ago, are forgotten.
FORGET_AFTER = 24 * 3600.0
#: The ids of the replicas alive at the parameter ``now`` (a subquery, one parameter).
LIVE_REPLICAS = "SELECT id FROM replicas WHERE stopped_at IS NULL AND heartbeat_at + lease >= ?"
#: The claim column ``{c}`` may be taken by the parameters (me, now): it is free, mine
#: already, or held by a replica that is not alive.
TAKEABLE = "({c} IS NULL OR {c} = ? OR {c} NOT IN (" + LIVE_REPLICAS + "))"


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """A named lease: who holds it and since when (it lives as long as its holder)."""

    name: str
    owner: str
    acquired_at: float


@dataclass(slots=True)
class ReplicaState:
    """Who this store handle is among the replicas, shared by the roles that claim (the
    leases, the outbox's due heads, the request budget)."""

    #: This handle's replica id once registered (the daemon); ``None``: never claims.
    replica_id: str | None = None
    #: Seconds this replica's claims last after its last heartbeat (``store.lease``).
    lease_seconds: float = 30.0
    #: Registered as the only replica there can be (SQLite: the daemon lock): nothing is
    #: claimed, as there is no rival to keep out (the writes saved matter to SQLite's
    #: single writer); the registry and heartbeat are kept (``sessionhook status``).
    exclusive: bool = False
    #: The ``now`` of this replica's last committed heartbeat (or of its registration):
    #: its claims hold until that plus the lease.
    confirmed_at: float = -math.inf

    @property
    def sending_until(self) -> float:
        """Until when this replica may be posting what it claimed (see
        :func:`~..domain.replica.sending_until`); forever when it does not claim."""
        if not self.claims:
            return math.inf
        return sending_until(self.confirmed_at, self.lease_seconds)

    @property
    def claims(self) -> bool:
        """Whether this handle claims what it works on: a registered replica that may have
        rivals. Unregistered (an operator's handle) or :attr:`exclusive`, a claim is a no-op
        (and callers may skip the store call altogether)."""
        return self.replica_id is not None and not self.exclusive


class Leases:
    """The leases role over one database, for the replica
    ``replica`` (shared with the outbox and the budget)."""

    def __init__(self, db: Database, replica: ReplicaState) -> None:
        self._db = db
        self._replica = replica

    # ------------------------------------------------------------------ replicas

    @write
    def register_replica(
        self,
        replica_id: str,
        *,
        host: str,
        pid: int,
        now: float,
        lease: float,
        exclusive: bool = False,
    ) -> None:
        """Record this process as a replica; from now on this handle claims what it works
        on, as ``replica_id``, alive while it heartbeats at least every ``lease`` seconds
        (``exclusive``: see :attr:`ReplicaState.exclusive`). Replicas gone for a day are
        forgotten."""
        with self._db.tx() as c:
            c.execute(
                "INSERT INTO replicas (id, host, pid, started_at, heartbeat_at, lease) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (replica_id, host, pid, now, now, lease),
            )
            c.execute(
                "DELETE FROM replicas WHERE id <> ? AND (stopped_at < ? OR heartbeat_at < ?)",
                (replica_id, now - FORGET_AFTER, now - FORGET_AFTER),
            )
        self._replica.replica_id = replica_id
        self._replica.lease_seconds = lease
        self._replica.exclusive = exclusive
        self._replica.confirmed_at = now

    @try_write
    def heartbeat_replica(self, now: float) -> bool:
        """Say this replica is alive: every claim and lease it holds lasts until ``now +
        lease`` (one row written; the claimed rows are not touched, so a heartbeat never
        waits for a transaction that holds one)."""
        owner = self._replica.replica_id
        if owner is not None:
            with self._db.tx(serialized=False) as c:
                c.execute("UPDATE replicas SET heartbeat_at = ? WHERE id = ?", (now, owner))
            self._replica.confirmed_at = max(self._replica.confirmed_at, now)
        return True

    @call
    def retire_replica(self, now: float) -> None:
        """A clean stop: release every claim and lease at once (no one waits for them to
        expire) and mark the replica stopped."""
        owner = self._replica.replica_id
        if owner is None:
            return
        with self._db.tx() as c:
            _release_all(c, owner, now)
            self._db.notify_outbox(c)
        self._replica.replica_id = None

    @write
    def reap_replicas(self, ids: Iterable[str], now: float) -> int:
        """Replicas known to be dead (their process is gone: see the daemon's start-up)
        lose their claims and leases at once instead of when their lease runs out, and are
        marked stopped. Returns how many were reaped."""
        dead = sorted(i for i in set(ids) if i != self._replica.replica_id)
        if not dead:
            return 0
        with self._db.tx() as c:
            for owner in dead:
                _release_all(c, owner, now)
            self._db.notify_outbox(c)
        return len(dead)

    @call
    def replicas(self) -> list[ReplicaRow]:
        """Every replica known (running, or stopped within a day), with what it holds."""
        conn = self._db.conn
        deliveries = {
            r["owner"]: int(r["n"])
            for r in conn.execute(
                "SELECT claimed_by AS owner, COUNT(*) AS n FROM outbox_heads "
                "WHERE claimed_by IS NOT NULL GROUP BY claimed_by"
            )
        }
        polls = {
            r["owner"]: int(r["n"])
            for r in conn.execute(
                "SELECT poll_owner AS owner, COUNT(*) AS n FROM sessions "
                "WHERE poll_owner IS NOT NULL GROUP BY poll_owner"
            )
        }
        held: dict[str, list[str]] = {}
        for r in conn.execute("SELECT name, owner FROM leases ORDER BY name"):
            held.setdefault(r["owner"], []).append(r["name"])
        rows = conn.execute(
            "SELECT id, host, pid, started_at, heartbeat_at, lease, stopped_at FROM replicas "
            "ORDER BY started_at, id"
        ).fetchall()
        return [
            from_row(
                ReplicaRow,
                r,
                deliveries=deliveries.get(r["id"], 0),
                polls=polls.get(r["id"], 0),
                leases=tuple(held.get(r["id"], ())),
            )
            for r in rows
        ]

    # ------------------------------------------------------------------ outbox claims

    @call
    def delivery_claims(
        self, now: float, ids: Iterable[int] | None = None
    ) -> dict[int, tuple[str, float]]:
        """Outbox heads claimed by a replica alive at ``now``: delivery id -> (replica id,
        when it claimed it); with ``ids``, only those deliveries."""
        rows = self._db.conn.execute(
            "SELECT delivery_id, claimed_by, claimed_at FROM outbox_heads "
            f"WHERE claimed_by IN ({LIVE_REPLICAS})",
            (now,),
        ).fetchall()
        wanted = None if ids is None else set(ids)
        return {
            int(r["delivery_id"]): (str(r["claimed_by"]), float(r["claimed_at"]))
            for r in rows
            if wanted is None or int(r["delivery_id"]) in wanted
        }

    @call
    def endpoint_claims(self, now: float) -> dict[str, dict[str, int]]:
        """Per endpoint: replica id -> outbox heads it holds a live claim on at ``now``
        (deliveries in flight)."""
        out: dict[str, dict[str, int]] = {}
        for r in self._db.conn.execute(
            "SELECT endpoint, claimed_by, COUNT(*) AS n FROM outbox_heads "
            f"WHERE claimed_by IN ({LIVE_REPLICAS}) GROUP BY endpoint, claimed_by",
            (now,),
        ):
            out.setdefault(r["endpoint"], {})[r["claimed_by"]] = int(r["n"])
        return out

    @write
    def release_delivery_claims(self, keys: Iterable[tuple[str, str]]) -> None:
        """Give back this replica's claims on the (endpoint, session) heads ``keys`` (handed
        out but not started)."""
        owner = self._replica.replica_id
        params = sorted((endpoint, session, owner) for endpoint, session in set(keys))
        if not self._replica.claims or not params:
            return
        with self._db.tx(serialized=False) as c:
            # The queues' keys before their heads' rows: the lock order of every writer
            # of a queue (a recording replica holds the keys and then locks the heads).
            self._db.lock_queue_keys(c, [(endpoint, session) for endpoint, session, _ in params])
            c.executemany(
                "UPDATE outbox_heads SET claimed_by = NULL, claimed_at = NULL "
                "WHERE endpoint = ? AND session_name = ? AND claimed_by = ?",
                params,  # in key order, as every writer of the heads (see outbox.py)
            )
            self._db.notify_outbox(c)

    # ------------------------------------------------------------------ session polls

    @write
    def claim_session_poll(self, name: str, now: float) -> bool:
        """Claim ``name``'s activity poll for this replica: ``True`` when it is ours now
        (free, its owner not alive, or ours already); ``False`` while another live replica
        polls it. An unregistered handle claims nothing and always may."""
        owner = self._replica.replica_id
        if not self._replica.claims:
            return True
        with self._db.tx(serialized=False) as c:
            cur = c.execute(
                "UPDATE sessions SET poll_owner = ?, poll_claimed_at = ? WHERE name = ? AND "
                + TAKEABLE.format(c="poll_owner"),
                (owner, now, name, owner, now),
            )
            return int(cur.rowcount) == 1

    @call
    def release_session_poll(self, name: str) -> None:
        """The poll of ``name`` is over (its results committed): release the claim."""
        owner = self._replica.replica_id
        if not self._replica.claims:
            return
        with self._db.tx(serialized=False) as c:
            c.execute(
                "UPDATE sessions SET poll_owner = NULL, poll_claimed_at = NULL "
                "WHERE name = ? AND poll_owner = ?",
                (name, owner),
            )

    # ------------------------------------------------------------------ named leases

    @write
    def acquire_lease(self, name: str, now: float) -> bool:
        """Take or keep the named lease ``name``: ``True`` when this replica holds it now,
        ``False`` while another live replica does (a lease lives as long as its holder).
        An unregistered handle always may (it is alone)."""
        owner = self._replica.replica_id
        if not self._replica.claims:
            return True
        with self._db.tx(serialized=False) as c:
            c.execute(
                "INSERT INTO leases (name, owner, acquired_at) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, "
                "acquired_at = excluded.acquired_at WHERE leases.owner <> excluded.owner "
                f"AND leases.owner NOT IN ({LIVE_REPLICAS})",
                (name, owner, now, now),
            )
            holder = c.execute("SELECT owner FROM leases WHERE name = ?", (name,)).fetchone()
        return holder is not None and holder["owner"] == owner

    @read
    def lease_expires_at(self, name: str) -> float | None:
        """When the named lease's holder stops being alive if it heartbeats no more (its
        last heartbeat plus its lease; Unix seconds), so a standby can try right then;
        ``None`` when nobody running holds it."""
        value = first_value(
            self._db.conn,
            "SELECT r.heartbeat_at + r.lease FROM leases l JOIN replicas r ON r.id = l.owner "
            "WHERE l.name = ? AND r.stopped_at IS NULL",
            (name,),
        )
        return None if value is None else float(value)

    @call
    def leases(self) -> list[LeaseRow]:
        """Every named lease, by name."""
        rows = self._db.conn.execute("SELECT name, owner, acquired_at FROM leases ORDER BY name")
        return [from_row(LeaseRow, r) for r in rows]


def _release_all(c: Connection, owner: str, now: float) -> None:
    """Free every claim and lease of ``owner`` and mark it stopped (one transaction: ``c``)."""
    c.execute(
        "UPDATE outbox_heads SET claimed_by = NULL, claimed_at = NULL WHERE claimed_by = ?",
        (owner,),
    )
    c.execute(
        "UPDATE sessions SET poll_owner = NULL, poll_claimed_at = NULL WHERE poll_owner = ?",
        (owner,),
    )
    c.execute("DELETE FROM leases WHERE owner = ?", (owner,))
    c.execute(
        "UPDATE replicas SET stopped_at = ? WHERE id = ? AND stopped_at IS NULL", (now, owner)
    )
