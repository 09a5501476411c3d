"""Retry now and recover: deliveries made due at once, failed and dead ones re-opened.

A re-opened delivery is the SAME row: the same event (so the same ``webhook-id`` and
body), the bytes saved by its first attempt (see ``Outbox.save_rendered``), its attempt
log going on (a re-opened dead delivery has used its retry schedule: it gets one attempt
now and is dead again if that fails; a replay queues a new delivery with a fresh one).

Order: the dispatcher sends only the head of an (endpoint, session) queue, its oldest open
delivery (``outbox_heads``, kept by triggers). A re-opened row takes its place in that
order by its id: later deliveries of the session wait behind it, and an earlier open one
goes before it (retry makes that one due now too, so "now" means now).

Writers of the heads (see :mod:`.outbox`): the queues are written in (endpoint, session)
order, one UPDATE per queue (on PostgreSQL the queue's lock first, then its head and its
rows, as when an attempt is recorded), and a head's claim by a replica that has it in
flight is carried over to the re-derived head (the trigger makes a new, unclaimed row): a
queue is never sent by two replicas at once because of a retry.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from ..domain.rows import Recovered, Retried
from .dialect import Connection, Database, batches, first_value, refuse_readonly
from .policy import write

_OPEN: Final = "('pending', 'failed')"


def _stuck(column: str = "status") -> str:
    """Failed or dead, spelt as the predicate of the partial index ``deliveries_stuck``
    (SQLite uses a partial index only for a query that repeats its predicate)."""
    return f"({column} = 'failed' OR {column} = 'dead')"


class Requeue:
    """The requeue role over one database: retry now, recover, make an endpoint's backlog
    due."""

    def __init__(self, db: Database) -> None:
        self._db = db

    @write
    def retry(self, delivery_id: int) -> Retried | None:
        """Make delivery ``delivery_id`` due now (a failed or dead one re-opened as
        ``pending``; an earlier open one of its queue due now too); ``None``: no such
        delivery. A delivered one is left as it is (``previous == "delivered"``)."""
        now = self._db.clock()
        with self._db.tx() as c:
            row = c.execute(
                "SELECT status, endpoint, session_name FROM deliveries WHERE id = ?",
                (delivery_id,),
            ).fetchone()
            if row is None:
                return None
            status, endpoint, session = row["status"], row["endpoint"], row["session_name"]
            if status == "delivered":
                return Retried(status)
            head = first_value(
                c,
                "SELECT MIN(id) FROM deliveries WHERE endpoint = ? AND session_name = ? "
                f"AND status IN {_OPEN} AND id < ?",
                (endpoint, session, delivery_id),
            )
            ids = [delivery_id] if head is None else [int(head), delivery_id]
            with _claim_kept(self._db, c, endpoint, session):
                c.execute(
                    "UPDATE deliveries SET status = CASE WHEN id = ? THEN 'pending' "
                    "ELSE status END, next_attempt_at = ?, updated_at = ? "
                    f"WHERE id IN ({', '.join('?' * len(ids))})",
                    (delivery_id, now, now, *ids),
                )
            self._db.notify_outbox(c)
        return Retried(status, None if head is None else int(head))

    @write
    def recover(self, endpoint: str, since: float) -> Recovered:
        """Re-open every failed or dead delivery to ``endpoint`` whose event happened at or
        after ``since`` (Unix seconds), due now, queue by queue in (endpoint, session)
        order, a transaction per :data:`~.dialect.QUEUES_PER_TX` queues (a recovery met
        partway, by a crash, is finished by running it again); what was done and what was
        left (:class:`Recovered`)."""
        refuse_readonly(self._db)
        now = self._db.clock()
        stuck = (
            f"FROM deliveries d JOIN events e ON e.id = d.event_id "
            f"WHERE d.endpoint = ? AND {_stuck('d.status')}"
        )
        sessions = sorted(
            str(r["session_name"])
            for r in self._db.conn.execute(
                f"SELECT DISTINCT d.session_name {stuck} AND e.occurred_ts >= ?",
                (endpoint, since),
            )
        )
        ids: list[int] = []
        behind = 0
        for batch in batches(sessions):
            with self._db.tx() as c:
                for session in batch:
                    with _claim_kept(self._db, c, endpoint, session):
                        reopened = c.execute(
                            "UPDATE deliveries SET status = 'pending', next_attempt_at = ?, "
                            "updated_at = ? WHERE endpoint = ? AND session_name = ? "
                            f"AND {_stuck()} AND event_id IN "
                            "(SELECT id FROM events WHERE session_name = ? AND occurred_ts >= ?) "
                            "RETURNING id",
                            (now, now, endpoint, session, session, since),
                        ).fetchall()
                    ids += (int(r["id"]) for r in reopened)
                    behind += int(
                        first_value(
                            c,
                            "SELECT COUNT(*) FROM deliveries WHERE endpoint = ? "
                            f"AND session_name = ? AND status IN {_OPEN}",
                            (endpoint, session),
                        )
                    ) - len(reopened)
                self._db.notify_outbox(c)
        conn = self._db.conn
        older = conn.execute(
            f"SELECT COUNT(*) AS n, MAX(e.occurred_ts) AS newest {stuck}", (endpoint,)
        ).fetchone()
        still_open = first_value(
            conn,
            f"SELECT COUNT(*) FROM deliveries WHERE endpoint = ? AND status IN {_OPEN}",
            (endpoint,),
        )
        return Recovered(
            ids=tuple(sorted(ids)),
            behind=max(0, behind),
            older=int(older["n"]),
            newest_older_at=None if older["newest"] is None else float(older["newest"]),
            open=int(still_open),
        )

    @write
    def due_now(self, endpoint: str) -> None:
        """Make every open delivery to ``endpoint`` that waits for a later retry due now
        (it was enabled again: what waits behind a failed head goes at once rather than at
        the head's next retry, 300 s later say), queue by queue in session order, a
        transaction per :data:`~.dialect.QUEUES_PER_TX` queues; dead ones stay as they are
        (recover)."""
        refuse_readonly(self._db)
        now = self._db.clock()
        sessions = sorted(
            str(r["session_name"])
            for r in self._db.conn.execute(
                "SELECT DISTINCT session_name FROM deliveries WHERE endpoint = ? "
                f"AND status IN {_OPEN} AND next_attempt_at > ?",
                (endpoint, now),
            )
        )
        for batch in batches(sessions):
            with self._db.tx() as c:
                for session in batch:
                    with _claim_kept(self._db, c, endpoint, session):
                        c.execute(
                            "UPDATE deliveries SET next_attempt_at = ?, updated_at = ? "
                            "WHERE endpoint = ? AND session_name = ? "
                            f"AND status IN {_OPEN} AND next_attempt_at > ?",
                            (now, now, endpoint, session, now),
                        )
                self._db.notify_outbox(c)


@contextmanager
def _claim_kept(db: Database, c: Connection, endpoint: str, session: str) -> Iterator[None]:
    """Around an UPDATE of one queue's deliveries: the claim its head had (a replica has it
    in flight) is put back on the head the trigger re-derived. The queue's lock is taken
    first (a replica recording an attempt of it holds it before its rows: taken after
    them, the two deadlocked). The head is read locked: a replica claiming it at this
    moment (its own transaction, not serialized with this one) is waited for and its claim
    read, not lost to a read of the head before it."""
    db.lock_queue_keys(c, [(endpoint, session)])
    row = c.execute(
        "SELECT claimed_by, claimed_at FROM outbox_heads WHERE endpoint = ? AND session_name = ?"
        + db.for_update(),
        (endpoint, session),
    ).fetchone()
    yield
    if row is not None and row["claimed_by"] is not None:
        c.execute(
            "UPDATE outbox_heads SET claimed_by = ?, claimed_at = ? "
            "WHERE endpoint = ? AND session_name = ?",
            (row["claimed_by"], row["claimed_at"], endpoint, session),
        )
