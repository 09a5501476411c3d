"""The outbox role: what is due, recording attempts (one transaction per batch: group commit),
the bytes a delivery sends (kept from its first attempt), and pruning the delivery log.

Due deliveries come from ``outbox_heads`` (one row per (endpoint, session) queue: its oldest
open delivery, kept exact by triggers, see migration ``0005_outbox_heads``). The query walks
the covering index ``outbox_heads_due (endpoint, next_attempt_at, delivery_id, claimed_by)``
of each active endpoint with a free slot and stops after its cap (plus the busy keys it
skips): its cost depends on how many are asked for, not on how many deliveries wait. Only
then are the rows of the heads handed out read, by key, in one query. A round of a
dispatcher with many endpoints asks only those that have a head at all (a skip-scan of
the same index, :attr:`Round.queued_only`): an idle round costs a seek per endpoint with
an open queue, not two statements per configured endpoint.

Claims (replicas, see :mod:`.leases`): a registered store claims the heads it hands out
(``claimed_by``) in the transaction that reads them, so per (endpoint, session) at most one
delivery is in flight across every replica sharing the store, oldest first. A head claimed
by another live replica is skipped; recording an attempt releases its head's claim in the
same transaction.

Lock order: every transaction that writes several heads (claiming, recording a batch,
releasing) writes them in (endpoint, session) order, as ingest does (one session, its
endpoints by name), so two replicas' transactions never wait for each other in a circle.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..domain.retry import AttemptResult, Dead, Decision, Delivered, DisableEndpoint, Retry
from ..domain.rows import OPEN_STATUSES, ActiveEndpoints, DueDelivery, from_row
from .bodies import BODY_COLUMNS, Bodies
from .dialect import Connection, Database, Prepared, first_value
from .endpoints import ACTIVE
from .errors import StoreError
from .leases import TAKEABLE, Leases, ReplicaState
from .policy import call, read, write, writes_when

#: Rows deleted per transaction when pruning: the daemon's writes wait at most this long.
PRUNE_BATCH = 2000


#: A head ``h`` of one endpoint, due, that this owner may take (parameters: endpoint, now,
#: owner, now): what :data:`HEADS_SQL` and :func:`due_rows_sql` walk.
_DUE_HEAD = "h.endpoint = ? AND h.next_attempt_at <= ? AND " + TAKEABLE.format(c="h.claimed_by")


#: Due heads of one endpoint, soonest first, that this owner may take: only the index
#: ``outbox_heads_due (endpoint, next_attempt_at, delivery_id, claimed_by)`` is read (it
#: covers the query; the key's session_name comes with it), from its start, and the walk
#: stops at the LIMIT. Heads in flight are skipped by the caller before any row behind them
#: is read. Parameters: endpoint, now, owner, now, limit.
HEADS_SQL = (
    "SELECT h.next_attempt_at, h.delivery_id, h.session_name FROM outbox_heads h "
    "WHERE " + _DUE_HEAD + " ORDER BY h.next_attempt_at, h.delivery_id LIMIT ?"
)


#: The active endpoints' names, sorted, with the newest revision of any endpoint's
#: definition in every row (a scalar subquery, on the revisions' index).
ACTIVE_SQL = (
    "SELECT name, (SELECT MAX(revision) FROM endpoints) AS newest FROM endpoints "
    f"WHERE {ACTIVE} ORDER BY name"
)

#: Beyond this many endpoints a dispatcher's round reads only those with a queue head
#: (:attr:`Round.queued_only`): 8 us more a round for one endpoint, where reading each
#: one's heads took 130 ms of the store's thread a round at 10,000.
QUEUED_ONLY_ABOVE = 16

#: :data:`ACTIVE_SQL` for the endpoints that have a queue head only, found by a skip-scan
#: of ``outbox_heads_due`` (one seek per such endpoint), the same on both engines.
ACTIVE_QUEUED_SQL = (
    "WITH RECURSIVE q(name) AS ("
    "SELECT (SELECT endpoint FROM outbox_heads ORDER BY endpoint LIMIT 1) "
    "UNION ALL SELECT (SELECT endpoint FROM outbox_heads WHERE endpoint > q.name "
    "ORDER BY endpoint LIMIT 1) FROM q WHERE q.name IS NOT NULL) "
    "SELECT ep.name, (SELECT MAX(revision) FROM endpoints) AS newest "
    f"FROM q JOIN endpoints ep ON ep.name = q.name WHERE {ACTIVE} ORDER BY ep.name"
)

#: What an attempt needs of a delivery ``d`` (its event ``e``, endpoint ``ep`` and the
#: activity ``a`` of its event): every table reached by its key from ``d``.
ROW_COLUMNS = (
    "d.id, d.event_id, e.type AS event_type, d.endpoint, ep.url, d.session_name, "
    "d.attempts, d.created_at, d.status, " + BODY_COLUMNS
)
ROW_JOINS = (
    "JOIN endpoints ep ON ep.name = d.endpoint "
    "JOIN events e ON e.id = d.event_id "
    "LEFT JOIN activities a ON a.name = e.activity_name"
)
_ROW_SQL = "SELECT " + ROW_COLUMNS + " FROM deliveries d " + ROW_JOINS


@functools.lru_cache(maxsize=64)
def rows_sql(count: int) -> str:
    """What an attempt needs of ``count`` chosen deliveries (one ``?`` per id). The status
    is checked by the caller: in the WHERE clause it tempted SQLite's planner into walking
    ``deliveries_by_update`` with a round's worth of ids (VM steps 25 -> 727 with a
    backlog)."""
    return Prepared(_ROW_SQL + " WHERE d.id IN (" + ", ".join("?" * count) + ")")


@functools.lru_cache(maxsize=16)
def claim_due_sql(endpoints: int) -> str:
    """:meth:`Outbox.due_deliveries` of a claiming replica in ONE statement, where the
    database runs an ``UPDATE`` in a ``WITH`` clause (PostgreSQL): per endpoint (a
    ``(?, ?)`` each: its name, its cap) its due heads as :data:`HEADS_SQL` walks them,
    without the keys in flight, locked (those a rival is claiming skipped); the soonest
    ``limit`` of them claimed; the rows of those claimed, soonest first. Parameters: the
    endpoints', now, owner, now, the keys in flight (a JSON list of ``endpoint + chr(10)
    + session``), limit, owner, now. Nothing waits for another transaction: no row is
    locked but by ``SKIP LOCKED``."""
    values = ", ".join(["(CAST(? AS TEXT), CAST(? AS INTEGER))"] * endpoints)
    return Prepared(
        "WITH h AS (SELECT h.endpoint, h.session_name, h.delivery_id, h.next_attempt_at "
        "FROM (VALUES " + values + ") AS cap(endpoint, n) CROSS JOIN LATERAL ("
        "SELECT h.endpoint, h.session_name, h.delivery_id, h.next_attempt_at "
        "FROM outbox_heads h WHERE h.endpoint = cap.endpoint "
        "AND h.next_attempt_at <= CAST(? AS DOUBLE PRECISION) "
        "AND " + TAKEABLE.format(c="h.claimed_by") + " "
        "AND h.endpoint || chr(10) || h.session_name NOT IN "
        "(SELECT value FROM json_each(?)) "
        "ORDER BY h.next_attempt_at, h.delivery_id LIMIT cap.n "
        "FOR UPDATE OF h SKIP LOCKED) AS h "
        "ORDER BY h.next_attempt_at, h.delivery_id LIMIT CAST(? AS INTEGER)), "
        "claimed AS (UPDATE outbox_heads SET claimed_by = ?, claimed_at = ? FROM h "
        "WHERE outbox_heads.endpoint = h.endpoint "
        "AND outbox_heads.session_name = h.session_name "
        "AND outbox_heads.delivery_id = h.delivery_id "
        "RETURNING h.delivery_id, h.next_attempt_at) "
        + _ROW_SQL
        + " JOIN claimed ON claimed.delivery_id = d.id "
        "ORDER BY claimed.next_attempt_at, claimed.delivery_id"
    )


@functools.lru_cache(maxsize=64)
def due_rows_sql(skipped: int) -> str:
    """:data:`HEADS_SQL`'s walk with each head's row joined as in :func:`rows_sql`, in ONE
    statement (a store that claims nothing: its heads need no claim between the two),
    without the ``skipped`` sessions in flight (one ``?`` each), which are passed over in
    the index, their rows never read. Parameters: endpoint, now, owner, now, the skipped
    sessions, limit. The status is checked by the caller (see :func:`rows_sql`)."""
    return Prepared(
        "SELECT h.next_attempt_at AS head_at, " + ROW_COLUMNS + " FROM outbox_heads h "
        "JOIN deliveries d ON d.id = h.delivery_id " + ROW_JOINS + " "
        "WHERE "
        + _DUE_HEAD
        + (" AND h.session_name NOT IN (" + ", ".join("?" * skipped) + ")" if skipped else "")
        + " ORDER BY h.next_attempt_at, h.delivery_id LIMIT ?"
    )


#: Claim the heads handed out, ``{values}`` a ``(?, ?, ?)`` per (endpoint, session,
#: delivery id), those still takeable (a rival may have taken one since it was read).
CLAIM_SQL = (
    "UPDATE outbox_heads SET claimed_by = ?, claimed_at = ? "
    "WHERE (endpoint, session_name, delivery_id) IN (VALUES {values}) AND "
    + TAKEABLE.format(c="claimed_by")
    + " RETURNING delivery_id"
)


@functools.lru_cache(maxsize=64)
def record_sql(count: int, verb: str = "UPDATE") -> str:
    """Decide ``count`` deliveries and count their attempts in ONE statement (one round
    trip on PostgreSQL), a ``(?, ?, ?, ?, ?, ?, ?, ?)`` per delivery: (id, status,
    updated_at, last_status_code, last_error, keep next_attempt_at (0/1), next_attempt_at,
    delivered_at); RETURNING each row's endpoint and attempt number. The values are cast:
    a column of NULLs only is text on PostgreSQL. A delivery closed as dead while it was
    in flight (its endpoint deleted) stays dead unless this attempt delivered it: never
    opened again for nobody. ``verb``: the database's
    :attr:`~.dialect.Database.update_many`."""
    return Prepared(
        verb + " deliveries SET "
        "status = CASE WHEN status = 'dead' AND v.column2 <> 'delivered' THEN 'dead' "
        "ELSE v.column2 END, "
        "attempts = attempts + 1, updated_at = CAST(v.column3 AS DOUBLE PRECISION), "
        "last_status_code = CAST(v.column4 AS INTEGER), last_error = CAST(v.column5 AS TEXT), "
        "next_attempt_at = CASE WHEN v.column6 = 1 THEN next_attempt_at "
        "ELSE CAST(v.column7 AS DOUBLE PRECISION) END, "
        "delivered_at = COALESCE(CAST(v.column8 AS DOUBLE PRECISION), delivered_at) "
        "FROM (VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * count) + ") AS v "
        "WHERE deliveries.id = v.column1 RETURNING id, endpoint, attempts"
    )


@functools.lru_cache(maxsize=64)
def attempts_sql(count: int) -> str:
    """Insert ``count`` attempt rows in ONE statement (one round trip on PostgreSQL)."""
    return Prepared(
        "INSERT INTO attempts (delivery_id, attempt, started_at, duration_ms, "
        "status_code, error, response_body) VALUES " + ", ".join(["(?, ?, ?, ?, ?, ?, ?)"] * count)
    )


class AttemptRecord(NamedTuple):
    """One finished attempt to record: the delivery, what happened, what was decided
    (immutable; a NamedTuple: the dispatcher builds one per delivery on the event loop, and
    a frozen dataclass's ``__init__`` cost three times as much)."""

    delivery_id: int
    attempt: AttemptResult
    decision: Decision


@dataclass(frozen=True, slots=True)
class Caps(Mapping[str, int]):
    """:attr:`Round.caps` without an entry per endpoint: ``given`` where it has one, else
    ``default`` for an endpoint in ``known``; one in neither may have none (absent). A
    dispatcher over 10,000 endpoints builds one per round from those with deliveries in
    flight or a rate limit (a dict of every endpoint cost 5 ms of the event loop a round).
    Immutable parts only: it is read in the store's thread."""

    given: Mapping[str, int]
    known: Set[str]
    default: int

    def __getitem__(self, name: str) -> int:
        found = self.given.get(name)
        if found is not None:
            return found
        if name in self.known:
            return self.default
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.known | self.given.keys())

    def __len__(self) -> int:
        return len(self.known | self.given.keys())


@dataclass(slots=True)
class Round:
    """One round of the dispatcher (:meth:`Outbox.dispatch_round`): the attempts that
    finished, to record; then at most ``limit`` due deliveries at ``now``, without the keys
    in flight (``busy``) and at most ``caps[endpoint]`` of an endpoint; ``release``: the
    keys handed out by the previous round and not started, whose claims go back first."""

    records: Sequence[AttemptRecord]
    now: float
    limit: int
    busy: Iterable[tuple[str, str]] = ()
    release: Sequence[tuple[str, str]] = ()
    caps: Mapping[str, int] | None = None
    #: Read only the active endpoints that have a queue head (see
    #: :meth:`Outbox.active_revisions`): for a dispatcher with more than
    #: :data:`QUEUED_ONLY_ABOVE` endpoints.
    queued_only: bool = False
    #: Per record, the endpoint's failing_since once the records are committed: a round
    #: tried again after a failure (a full disk waited out) does not record them twice.
    failing: list[float | None] | None = field(default=None)


def _round_writes(outbox: Outbox, round_: Round) -> bool:
    """Whether a round writes (see :meth:`Outbox.dispatch_round`): it has records, claims
    to give back on a store with rivals, or claims what it reads (a replica)."""
    replica = outbox._replica
    return bool(
        round_.records
        or (round_.release and not replica.exclusive)
        or (round_.limit > 0 and replica.claims)
    )


class Outbox:
    """The outbox role over one database, for the replica ``replica`` (a registered one
    claims the heads it hands out, and gives them back through ``leases``)."""

    def __init__(self, db: Database, bodies: Bodies, replica: ReplicaState, leases: Leases) -> None:
        self._db = db
        self._bodies = bodies
        self._replica = replica
        self._leases = leases

    def _claimed_rows(
        self, c: Connection, owner: str, now: float, heads: Sequence[tuple[float, int, str, str]]
    ) -> list[Any]:
        """Claim ``heads`` (next_attempt_at, delivery id, endpoint, session: see
        :meth:`_due_heads`) for ``owner`` in ONE statement, and the rows of those taken.
        Each is still checked takeable (a rival may have claimed it since it was read; on
        PostgreSQL the read locked them already: nothing here waits). The rows of every
        head are asked for before the claim's answer is read (one round trip for both in
        :meth:`~.dialect.Database.one_connection`); those not taken are left out."""
        keys = sorted((h[2], h[3], h[1]) for h in heads)  # the lock order, see above
        values = ", ".join(["(?, ?, ?)"] * len(keys))
        claimed = c.execute(
            Prepared(CLAIM_SQL.format(values=values)),
            (owner, now, *(v for key in keys for v in key), owner, now),
        )
        ids = [h[1] for h in heads]
        rows = c.execute(rows_sql(len(ids)), ids)
        taken = {int(r["delivery_id"]) for r in claimed.fetchall()}
        return self._open_rows(rows, [i for i in ids if i in taken])

    @call
    def active_endpoints(self) -> list[str]:
        """The names of the endpoints deliveries go to now (enabled and configured), sorted;
        a dispatcher round reads them once for :meth:`due_deliveries` and
        :meth:`next_due_at`."""
        return [
            row["name"]
            for row in self._db.conn.execute(
                f"SELECT name FROM endpoints WHERE {ACTIVE} ORDER BY name"
            )
        ]

    @call
    def active_revisions(self, *, queued_only: bool = False) -> ActiveEndpoints:
        """:meth:`active_endpoints` with the newest revision of any endpoint's definition
        (see :mod:`.endpoints`): a dispatcher's round reads them instead, and reads the
        definitions changed since the revision it holds when this one is newer (one query
        a round, the newest revision from the revisions' index). ``queued_only``: only
        the active endpoints that have a queue head (nothing is due at the others; see
        :data:`QUEUED_ONLY_ABOVE`)."""
        conn = self._db.conn
        sql = ACTIVE_QUEUED_SQL if queued_only else ACTIVE_SQL
        rows = conn.execute(Prepared(sql)).fetchall()
        # No endpoint active: the newest revision asked apart (a create makes one active).
        newest = (
            rows[0]["newest"] if rows else first_value(conn, "SELECT MAX(revision) FROM endpoints")
        )
        return ActiveEndpoints([row["name"] for row in rows], int(newest or 0))

    @call
    def due_deliveries(
        self,
        now: float,
        limit: int,
        busy: Iterable[tuple[str, str]] = (),
        caps: Mapping[str, int] | None = None,
        *,
        active: Sequence[str] | None = None,
    ) -> list[DueDelivery]:
        """Deliveries to attempt now, soonest first, at most ``limit``.

        Per (endpoint, session) only the oldest open (pending/failed) delivery is eligible,
        so a session's events reach an endpoint in order; it must be due
        (``next_attempt_at <= now``) and its endpoint active. Keys in ``busy`` (in flight)
        are skipped. Dead and delivered rows never block. Rows visited: at most
        ``limit + len(busy)`` per active endpoint, whatever the backlog.

        ``caps``: at most this many of an endpoint (the dispatcher's free slots for it; an
        endpoint missing from it: none), so a replica claims only what it can start now.
        ``active``: :meth:`active_endpoints`, when the caller just read them.

        Heads claimed by another replica alive at ``now`` are skipped. A registered store
        (a replica) claims what it returns in the same transaction; the claim is released
        when the attempt is recorded (:meth:`record_attempts`), by
        :meth:`release_delivery_claims`, or lapses with its owner.
        """
        limit = max(0, limit)
        if limit == 0:
            return []
        owner = self._replica.replica_id
        names = self.active_endpoints() if active is None else active
        # Each endpoint with a free slot, and how many of its heads may be handed out.
        slots = [
            (name, cap)
            for name in names
            for cap in [limit if caps is None else min(limit, caps.get(name, 0))]
            if cap > 0
        ]
        if owner is None or self._replica.exclusive:  # an operator's, or alone: no claim
            rows = self._due_rows(now, limit, busy, slots)
        elif self._db.claims_in_one_statement:
            rows = self._claimed_at_once(owner, now, limit, busy, slots)
        else:
            with self._db.tx(serialized=False) as c:
                heads = self._due_heads(c, now, limit, set(busy), owner, slots)
                rows = self._claimed_rows(c, owner, now, heads) if heads else []
        return [from_row(DueDelivery, r, body=self._bodies.decode_row(r)) for r in rows]

    def _claimed_at_once(
        self,
        owner: str,
        now: float,
        limit: int,
        busy: Iterable[tuple[str, str]],
        slots: Sequence[tuple[str, int]],
    ) -> list[Any]:
        """:meth:`due_deliveries`' claim in one statement (:func:`claim_due_sql`, one
        round trip, its own transaction): the rows of the heads claimed, still open."""
        if not slots:
            return []
        flying = json.dumps([f"{endpoint}\n{session}" for endpoint, session in busy])
        endpoints = [value for slot in slots for value in slot]
        params = (*endpoints, now, owner, now, flying, limit, owner, now)
        rows = self._db.conn.execute(claim_due_sql(len(slots)), params).fetchall()
        return [r for r in rows if r["status"] in OPEN_STATUSES]

    def _due_heads(
        self,
        c: Connection,
        now: float,
        limit: int,
        skip: set[tuple[str, str]],
        owner: str,
        slots: Sequence[tuple[str, int]],
    ) -> list[tuple[float, int, str, str]]:
        """The due heads (next_attempt_at, delivery id, endpoint, session), soonest first,
        at most ``limit`` (and each endpoint's cap of ``slots``), without ``skip``: read
        from the heads index alone; an endpoint with no free slot is not read at all."""
        # A claiming read skips, rather than waits for, heads a rival is claiming.
        sql = Prepared(HEADS_SQL + (self._db.skip_locked("h") if owner else ""))
        found: list[tuple[float, int, str, str]] = []
        for endpoint, cap in slots:
            taken = sum(1 for key in skip if key[0] == endpoint)
            heads = [
                (float(h["next_attempt_at"]), int(h["delivery_id"]), endpoint, h["session_name"])
                for h in c.execute(sql, (endpoint, now, owner, now, cap + taken)).fetchall()
                if (endpoint, h["session_name"]) not in skip
            ]
            found += heads[:cap]
        found.sort(key=lambda h: (h[0], h[1]))
        return found[:limit]

    def _due_rows(
        self,
        now: float,
        limit: int,
        busy: Iterable[tuple[str, str]],
        slots: Sequence[tuple[str, int]],
    ) -> list[Any]:
        """The rows of the due heads, soonest first, at most ``limit`` (and each endpoint's
        cap of ``slots``), without the keys in ``busy``, still open, for a store that
        claims nothing: one statement per endpoint with a free slot (:func:`due_rows_sql`).
        A row read is a call into the engine (on SQLite a ``sqlite3_step``, which lets the
        GIL go) and a row object: read apart, the heads (those in flight included) and
        then their rows were three times the rows with as many in flight as handed out."""
        skip: dict[str, list[str]] = {}
        for endpoint, session in busy:
            skip.setdefault(endpoint, []).append(session)
        found: list[Any] = []
        for endpoint, cap in slots:
            skipped = skip.get(endpoint, [])
            found += self._db.conn.execute(
                due_rows_sql(len(skipped)), (endpoint, now, "", now, *skipped, cap)
            ).fetchall()
        if len(slots) > 1:
            found.sort(key=lambda r: (float(r["head_at"]), int(r["id"])))
        return [r for r in found[:limit] if r["status"] in OPEN_STATUSES]

    @staticmethod
    def _open_rows(cursor: Any, ids: list[int]) -> list[Any]:
        """The rows of ``cursor`` (:func:`rows_sql`'s) of ``ids``, in their order, still
        open."""
        rows = {r["id"]: r for r in cursor.fetchall()}
        return [
            r
            for r in (rows.get(delivery_id) for delivery_id in ids)
            if r is not None and r["status"] in OPEN_STATUSES
        ]

    @call
    def next_due_at(
        self, after: float | None = None, *, active: Sequence[str] | None = None
    ) -> float | None:
        """When the earliest queue head of an active endpoint is due (``None``: none);
        with ``after``, the earliest one due strictly after it (the heads due already are
        in flight or just handed out). ``active``: see :meth:`due_deliveries`."""
        best: float | None = None
        for endpoint in self.active_endpoints() if active is None else active:
            value = first_value(
                self._db.conn,
                Prepared(
                    "SELECT MIN(next_attempt_at) FROM outbox_heads "
                    "WHERE endpoint = ? AND next_attempt_at > ?"
                ),
                (endpoint, float("-inf") if after is None else after),
            )
            if value is not None and (best is None or value < best):
                best = float(value)
        return best

    @writes_when(_round_writes)
    def dispatch_round(
        self, round_: Round
    ) -> tuple[list[float | None], list[DueDelivery], float | None, ActiveEndpoints]:
        """One round of the dispatcher in ONE call to the store's thread: record the
        round's records in one transaction (:meth:`record_attempts`, committed before
        anything is read), give its ``release`` claims back, then :meth:`due_deliveries`
        and, when fewer than ``limit`` are due, :meth:`next_due_at` after ``now`` (else
        ``now``). Returns (failing_since per record, due deliveries, next due time, the
        active endpoints (with a queue head, when ``queued_only``) and the newest revision
        of a definition: :meth:`active_revisions`).
        A round that writes (records, claims given back or taken) waits out a full disk
        (the batch is tried again whole: nothing of it was committed); else it is a read,
        once."""
        with self._db.one_connection():
            if round_.failing is None:
                round_.failing = self.record_attempts(round_.records)
            if round_.release:
                self._leases.release_delivery_claims(round_.release)
            # Read once for both queries; the newest revision tells the dispatcher whether
            # endpoints created through the API changed (see active_revisions).
            active = self.active_revisions(queued_only=round_.queued_only)
            names, now, limit = active.names, round_.now, round_.limit
            due = self.due_deliveries(now, limit, set(round_.busy), round_.caps, active=names)
            if limit > 0 and len(due) >= limit:
                return round_.failing, due, now, active
            return round_.failing, due, self.next_due_at(after=now, active=names), active

    @write
    def record_attempt(
        self, delivery_id: int, attempt: AttemptResult, decision: Decision
    ) -> float | None:
        """Log an attempt and apply its decision, in one transaction (see
        :meth:`record_attempts`). Returns the endpoint's ``failing_since`` afterwards."""
        return self.record_attempts([AttemptRecord(delivery_id, attempt, decision)])[0]

    @write
    def record_attempts(self, records: Sequence[AttemptRecord]) -> list[float | None]:
        """Log attempts and apply their decisions, ALL in one transaction (group commit:
        nothing of the batch is reported before this returns).

        * :class:`Delivered`: the delivery is final; the endpoint's ``last_success_at`` is
          set and its ``failing_since`` cleared.
        * :class:`Retry`: status ``failed``, ``next_attempt_at = decision.at``.
        * :class:`Dead`: status ``dead`` (replayable).
        * :class:`DisableEndpoint`: the endpoint is disabled with the reason; the delivery
          stays ``pending`` and goes out first once the endpoint is enabled again.

        Any failure sets the endpoint's ``failing_since`` if it was not set. Returns, per
        record in order, the endpoint's ``failing_since`` after it (``None`` when healthy),
        which the caller hands to ``retry.should_disable``.
        """
        if not records:
            return []
        with self._db.tx(serialized=False) as c:
            out, state = self._record(c, records)
            self._bookkeep(c, state)
        return out

    def _record(
        self, c: Connection, records: Sequence[AttemptRecord]
    ) -> tuple[list[float | None], dict[str, dict[str, Any]]]:
        """:meth:`record_attempts` in ``c``'s transaction but for the endpoints' rows: the
        failing_since per record, and the batch's state per endpoint for
        :meth:`_bookkeep`."""
        # Each queue's lock first, for every record, in (endpoint, session) order: the
        # lock order of every writer of the heads (see the module docstring). Taken up
        # front, not by the heads' trigger: the statement's plan may visit the rows in
        # any order, and a row locked before its queue deadlocks with a rival replica
        # recording the same delivery. Then one UPDATE decides every delivery of the
        # batch and counts its attempt (RETURNING its number); the trigger it fires
        # re-derives each head as a new, unclaimed row: recording releases this
        # replica's claim with it.
        self._db.lock_queues(c, [record.delivery_id for record in records])
        values: list[Any] = []
        for record in records:
            values += _decided(record)
        sql = record_sql(len(records), self._db.update_many)
        updated = {
            int(row["id"]): (row["endpoint"], row["attempts"])
            for row in c.execute(sql, values).fetchall()
        }
        # Endpoint bookkeeping is folded per batch: one UPDATE per endpoint, not per row.
        state: dict[str, dict[str, Any]] = {}
        logged: list[Any] = []
        out: list[float | None] = []
        for record in records:
            found = updated.get(record.delivery_id)
            if found is None:
                raise StoreError(f"unknown delivery {record.delivery_id}", path=self._db.path)
            out.append(self._apply(c, record, *found, state, logged))
        # One statement for the batch's attempt rows: one round trip on PostgreSQL.
        c.execute(attempts_sql(len(records)), logged)
        return out, state

    @staticmethod
    def _bookkeep(c: Connection, state: dict[str, dict[str, Any]]) -> None:
        """The endpoints' rows after a batch (:meth:`_record`'s ``state``), one UPDATE per
        endpoint, in name order. Replicas delivering to one endpoint all write its row:
        the row's lock is held from here to the commit, so this comes last."""
        for endpoint, s in sorted(state.items()):
            # After a success in this batch, failing_since is this batch's (NULL or
            # its later failure); otherwise the earliest of what is stored (a rival
            # replica may have written since it was read) and this batch's.
            c.execute(
                Prepared(
                    "UPDATE endpoints SET failing_since = CASE WHEN ? = 1 THEN ? "
                    "ELSE COALESCE(failing_since, ?) END, "
                    "last_success_at = COALESCE(?, last_success_at), "
                    "last_error = COALESCE(?, last_error), "
                    "last_error_at = COALESCE(?, last_error_at) WHERE name = ?"
                ),
                (
                    int(s["succeeded"]),
                    s["failing_since"],
                    s["failing_since"],
                    s["last_success_at"],
                    s["last_error"],
                    s["last_error_at"],
                    endpoint,
                ),
            )

    def _apply(
        self,
        c: Connection,
        record: AttemptRecord,
        endpoint: str,
        number: int,
        state: dict[str, dict[str, Any]],
        logged: list[Any],
    ) -> float | None:
        """Fold one recorded attempt (its delivery decided, the attempt ``number`` to
        ``endpoint``) into the batch's endpoint ``state``; its attempt row's values go to
        ``logged`` (inserted for the whole batch at once)."""
        attempt, decision = record.attempt, record.decision
        finished = attempt.finished_at
        code = attempt.status_code
        s = state.get(endpoint)
        if s is None:
            s = state[endpoint] = {
                "failing_since": None,
                "read": False,  # the stored failing_since: read at the first failure
                "succeeded": False,
                "last_success_at": None,
                "last_error": None,
                "last_error_at": None,
            }
        logged += (
            record.delivery_id,
            number,
            attempt.started_at,
            attempt.duration_ms,
            code,
            attempt.error,
            attempt.response_body,
        )
        if isinstance(decision, Delivered):
            s["last_success_at"] = finished
            s["failing_since"] = None
            s["succeeded"] = True
        else:
            if isinstance(decision, DisableEndpoint):
                c.execute(
                    "UPDATE endpoints SET enabled = 0, disabled_reason = ?, "
                    "disabled_at = ? WHERE name = ?",
                    (decision.reason, finished, endpoint),
                )
            if not s["read"] and not s["succeeded"]:
                # A success earlier in the batch cleared it; otherwise the stored one counts.
                s["failing_since"] = first_value(
                    c, "SELECT failing_since FROM endpoints WHERE name = ?", (endpoint,)
                )
            s["read"] = True
            if s["failing_since"] is None:
                s["failing_since"] = attempt.started_at
            s["last_error"], s["last_error_at"] = _error_of(attempt), finished
        value = s["failing_since"]
        return None if value is None else float(value)

    @call
    def pending_count(self, endpoint: str | None = None) -> int:
        """Open (pending or failed) deliveries, of one endpoint or all."""
        sql = "SELECT COUNT(*) FROM deliveries WHERE status IN ('pending', 'failed')"
        if endpoint is None:
            return int(first_value(self._db.conn, sql))
        return int(first_value(self._db.conn, sql + " AND endpoint = ?", (endpoint,)))

    @call
    def outbox_stats(self) -> dict[str, tuple[int, float | None]]:
        """Per known endpoint: (open deliveries, ``created_at`` of the oldest) for metrics."""
        rows = self._db.conn.execute(
            "SELECT ep.name, COUNT(d.id), MIN(d.created_at) FROM endpoints ep "
            "LEFT JOIN deliveries d ON d.endpoint = ep.name "
            "AND d.status IN ('pending', 'failed') GROUP BY ep.name ORDER BY ep.name"
        ).fetchall()
        return {name: (count, oldest) for name, count, oldest in rows}

    @write
    def prune_delivery_log(
        self, before: float, *, batch: int = PRUNE_BATCH, rounds: int | None = None
    ) -> tuple[int, int]:
        """Delete the delivery log older than ``before`` (Unix seconds): attempts started
        before it, and delivered deliveries delivered before it (with their attempts).

        Open and dead deliveries stay (a dead letter is replayable and its row says why);
        the archive (sessions, activities, events) is never touched. Works in transactions
        of at most ``batch`` rows so the daemon's writes never wait long. Returns (attempts,
        deliveries) deleted. ``rounds`` bounds the transactions of each kind (the daemon
        takes one of each at a time, so its own writes go in between).
        """
        attempts = deliveries = 0
        n = 0
        while rounds is None or n < rounds:
            n += 1
            with self._db.tx() as c:
                cur = c.execute(
                    "DELETE FROM attempts WHERE id IN (SELECT id FROM attempts "
                    "WHERE started_at < ? ORDER BY started_at LIMIT ?)",
                    (before, batch),
                )
                attempts += cur.rowcount
            if cur.rowcount < batch:
                break
        n = 0
        while rounds is None or n < rounds:
            n += 1
            with self._db.tx() as c:
                ids = [
                    r["id"]
                    for r in c.execute(
                        "SELECT id FROM deliveries WHERE status = 'delivered' "
                        "AND updated_at < ? ORDER BY updated_at LIMIT ?",
                        (before, batch),
                    )
                ]
                if ids:
                    c.executemany("DELETE FROM attempts WHERE delivery_id = ?", [(i,) for i in ids])
                    c.executemany("DELETE FROM deliveries WHERE id = ?", [(i,) for i in ids])
                deliveries += len(ids)
            if len(ids) < batch:
                break
        return attempts, deliveries

    @write
    def save_rendered(self, delivery_id: int, body: bytes, content_type: str) -> None:
        """Keep the bytes a delivery's first attempt sends (a format or a template made
        them); the first ones saved win, so every retry sends the same bytes."""
        with self._db.tx() as c:
            c.execute(
                "INSERT INTO rendered_bodies (delivery_id, content_type, body) "
                "VALUES (?, ?, ?) ON CONFLICT (delivery_id) DO NOTHING",
                (delivery_id, content_type, body),
            )

    @read
    def rendered_body(self, delivery_id: int) -> tuple[bytes, str] | None:
        """``(body, content_type)`` saved by :meth:`save_rendered`, or ``None``."""
        row = self._db.conn.execute(
            "SELECT body, content_type FROM rendered_bodies WHERE delivery_id = ?",
            (delivery_id,),
        ).fetchone()
        return None if row is None else (bytes(row["body"]), row["content_type"])


def _error_of(attempt: AttemptResult) -> str | None:
    """The error a delivery row keeps of an attempt: its own, or a non-2xx status."""
    return attempt.error or (None if attempt.ok else f"HTTP {attempt.status_code}")


def _decided(record: AttemptRecord) -> tuple[Any, ...]:
    """One record's values for :func:`record_sql`."""
    attempt = record.attempt
    finished = attempt.finished_at
    status, keep_next, next_at, delivered_at = _outcome(record.decision, finished)
    code, error = attempt.status_code, _error_of(attempt)
    return (record.delivery_id, status, finished, code, error, keep_next, next_at, delivered_at)


def _outcome(decision: Decision, finished: float) -> tuple[str, int, float | None, float | None]:
    """A decision as the delivery row's (status, keep next_attempt_at (0/1), next_attempt_at,
    delivered_at)."""
    if isinstance(decision, Delivered):
        return "delivered", 0, None, finished
    if isinstance(decision, Retry):
        return "failed", 0, decision.at, None
    if isinstance(decision, Dead):
        return "dead", 0, None, None
    return "pending", 1, None, None  # DisableEndpoint: waits, first, for the endpoint's return
