"""The economy role: the poller's queries about its upstream requests. The history walk
(sessions that existed before the first start, archived in the background), what the
archive knows of the sessions on a page of the list, the request budget's window (kept
here so that a restart within a minute does not exceed ``requests_per_minute``; replicas
sharing a database share the budget through the same verb, serialized per budget), and the
per-minute counters of upstream requests and discovery passes (``sessionhook status``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sessionhook.api.models import Session

from ..domain.events import discovered_id
from ..domain.rows import HistoryProgress, from_row
from .dialect import Database, first_value
from .leases import ReplicaState
from .policy import call, read, try_write, write

#: The window of ``requests_per_minute``.
BUDGET_WINDOW = 60.0
#: Per-minute upstream counters older than this many minutes are pruned.
_UPSTREAM_KEEP_MINUTES = 2 * 24 * 60
#: How ``upstream_requests.status`` stores what is not an HTTP status.
UPSTREAM_NO_ANSWER = -1
UPSTREAM_MALFORMED = -2
#: The history walk's rate is judged over this many recent seconds (for the estimate).
_RATE_SPAN = 600.0


@dataclass(frozen=True, slots=True)
class KnownSession:
    """What the poller needs at start of a session the history walk has still to archive."""

    name: str
    state: str
    polled_update_time: str | None
    first_seen_at: float


@dataclass(frozen=True, slots=True)
class ArchivedSession:
    """What the poller needs to follow again a session it archived before (a restart): its
    row's state and times, and whether its ``session.discovered`` is archived too."""

    state: str
    polled_update_time: str | None
    first_seen_at: float
    baseline: bool
    announced: bool


class Economy:
    """The economy role over one database, for the replica
    ``replica`` (alone on its store, the budget needs no lock row)."""

    def __init__(self, db: Database, replica: ReplicaState) -> None:
        self._db = db
        self._replica = replica

    @read
    def archived_among(self, names: Sequence[str], *, account: str) -> dict[str, ArchivedSession]:
        """Those of ``names`` (the untracked sessions of one page of the list) that are
        archived sessions of ``account``, those the history walk has still to archive left
        out; two reads for the page, however many sessions it holds."""
        if not names:
            return {}
        marks = ", ".join("?" * len(names))
        rows = self._db.conn.execute(
            "SELECT name, state, polled_update_time, first_seen_at, baseline FROM sessions "
            f"WHERE account = ? AND name IN ({marks}) "
            "AND NOT (history = 1 AND history_done_at IS NULL)",
            (account, *names),
        ).fetchall()
        if not rows:
            return {}
        ids = {discovered_id(r["name"]): r["name"] for r in rows}
        announced = {
            ids[r["id"]]
            for r in self._db.conn.execute(
                f"SELECT id FROM events WHERE id IN ({', '.join('?' * len(ids))})", tuple(ids)
            )
        }
        return {
            r["name"]: from_row(
                ArchivedSession, r, baseline=bool(r["baseline"]), announced=r["name"] in announced
            )
            for r in rows
        }

    @write
    def record_history(self, sessions: Sequence[Session], *, account: str = "default") -> int:
        """Archive list items of sessions that existed before the first start, for the
        history walk (``baseline``, pending); one transaction. Known names are left alone.
        Returns how many were new."""
        now = self._db.clock()
        params: list[tuple[Any, ...]] = []
        for s in sessions:
            wire = s.to_wire()
            params.append(
                (
                    s.name,
                    s.session_id,
                    s.title,
                    s.state,
                    s.create_time,
                    s.update_time,
                    json.dumps(wire, separators=(",", ":"), ensure_ascii=False),
                    now,
                    s.update_time,
                    account,
                )
            )
        with self._db.tx() as c:
            cur = c.executemany(
                "INSERT INTO sessions (name, id, title, state, create_time, update_time, raw, "
                "first_seen_at, baseline, polled_update_time, history, account) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1, ?, 1, ?) ON CONFLICT (name) DO NOTHING",
                params,
            )
            return int(cur.rowcount)

    @call
    def accounts_summary(self) -> dict[str, int]:
        """Archived sessions per account (``sessionhook status``)."""
        rows = self._db.conn.execute(
            "SELECT account, COUNT(*) FROM sessions GROUP BY account ORDER BY account"
        ).fetchall()
        return {account: count for account, count in rows}

    @read
    def history_pending(self, *, account: str | None = None) -> list[KnownSession]:
        """The sessions the history walk has still to archive, newest first."""
        sql = (
            "SELECT name, state, polled_update_time, first_seen_at FROM sessions "
            "WHERE history = 1 AND history_done_at IS NULL"
            + (" AND account = ?" if account is not None else "")
            + " ORDER BY create_time DESC, name"
        )
        rows = self._db.conn.execute(sql, () if account is None else (account,))
        return [from_row(KnownSession, r) for r in rows]

    @write
    def finish_history(self, name: str, at: float) -> None:
        """Mark a session's history archived (a restart does not fetch it again)."""
        with self._db.tx() as c:
            c.execute(
                "UPDATE sessions SET history_done_at = ? "
                "WHERE name = ? AND history = 1 AND history_done_at IS NULL",
                (at, name),
            )

    @call
    def history_progress(self, now: float) -> HistoryProgress:
        """The history walk's progress at ``now`` (works on a read-only connection)."""
        row = self._db.conn.execute(
            "SELECT COUNT(*) AS total, COUNT(history_done_at) AS done, "
            "COALESCE(SUM(CASE WHEN history_done_at >= ? THEN 1 ELSE 0 END), 0) AS recent "
            "FROM sessions WHERE history = 1",
            (now - _RATE_SPAN,),
        ).fetchone()
        first = first_value(
            self._db.conn,
            "SELECT MIN(history_done_at) FROM sessions WHERE history_done_at >= ?",
            (now - _RATE_SPAN,),
        )
        span = min(_RATE_SPAN, max(1.0, now - first)) if first is not None else _RATE_SPAN
        recent = row["recent"]
        return HistoryProgress(
            total=row["total"], done=row["done"], rate=recent / span if recent else 0.0
        )

    @call
    def take_budget(
        self, key: str, now: float, limit: int, window: float = BUDGET_WINDOW, count: int = 1
    ) -> tuple[int, float]:
        """Take up to ``count`` request grants of budget ``key`` at ``now`` (Unix seconds),
        as many as keep the last ``window`` seconds at most ``limit``. Returns ``(granted,
        0.0)``, or ``(0, seconds to wait)`` when the window is full (nothing taken). One
        transaction, serialized per budget by a write to its ``budget_locks`` row first:
        two processes (a restart, or replicas on a shared database) never take the same
        last grant, so the account has ONE budget however many replicas poll it. A grant
        taken and not used still counts (conservative).
        """
        with self._db.tx(serialized=False) as c:
            # First a write to the budget's own row: replicas' transactions on one budget
            # queue behind its row lock (PostgreSQL; SQLite has one writer anyway), so the
            # count below cannot be read by two of them at once.
            if not self._replica.exclusive:  # alone on the store: no rival
                c.execute(
                    "INSERT INTO budget_locks (budget, touched_at) VALUES (?, ?) "
                    "ON CONFLICT (budget) DO UPDATE SET touched_at = excluded.touched_at",
                    (key, now),
                )
            c.execute(
                "DELETE FROM request_budget WHERE budget = ? AND at <= ?", (key, now - window)
            )
            row = c.execute(
                "SELECT COUNT(*) AS used, MIN(at) AS oldest FROM request_budget WHERE budget = ?",
                (key,),
            ).fetchone()
            granted = max(0, min(count, limit - row["used"]))
            if not granted:
                return 0, max(0.001, float(row["oldest"]) + window - now)
            c.executemany(
                "INSERT INTO request_budget (budget, at) VALUES (?, ?)", [(key, now)] * granted
            )
            return granted, 0.0

    # ----------------------------------------------------------------- upstream counters

    @try_write
    def record_upstream(self, label: str, status: int | str | None, at: float) -> bool:
        """Count one upstream request in its minute bucket.

        ``status`` is the HTTP status, ``None`` for no answer (stored as -1) or
        ``"malformed"`` for a 2xx answer that did not parse (stored as -2).
        """
        return self.record_upstream_counts({(label, status, int(at // 60)): 1})

    @try_write
    def record_upstream_counts(
        self, counts: Mapping[tuple[str, int | str | None, int], int]
    ) -> bool:
        """Count many upstream requests at once: ``counts[(label, status, minute)]`` requests
        (``minute`` = Unix seconds // 60; ``status`` as in :meth:`record_upstream`). One
        transaction, the same rows as that many :meth:`record_upstream` calls."""
        if not counts:
            return True
        with self._db.tx(serialized=False) as c:  # upserts and a prune: no read
            c.executemany(
                "INSERT INTO upstream_requests (minute, label, status, count) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (minute, label, status) "
                "DO UPDATE SET count = upstream_requests.count + excluded.count",
                [
                    (minute, label, _upstream_code(status), n)
                    for (label, status, minute), n in counts.items()
                ],
            )
            c.execute(
                "DELETE FROM upstream_requests WHERE minute < ?",
                (max(minute for _, _, minute in counts) - _UPSTREAM_KEEP_MINUTES,),
            )
        return True

    @try_write
    def mark_poll(
        self, ok: bool, at: float, list_cut: int | None = None, *, account: str = "default"
    ) -> bool:
        """Record a discovery pass of ``account``: when it ran and, if it succeeded, when
        it last did and how many sessions it followed when the session list went on past
        ``poll.max_pages`` (``list_cut``; ``None``: it read the whole list)."""
        with self._db.tx(serialized=False) as c:  # an upsert: no read
            if ok:
                c.execute(
                    "INSERT INTO account_polls (account, last_poll_at, last_ok_poll_at, list_cut) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (account) DO UPDATE SET "
                    "last_poll_at = excluded.last_poll_at, "
                    "last_ok_poll_at = excluded.last_ok_poll_at, list_cut = excluded.list_cut",
                    (account, at, at, list_cut),
                )
            else:
                c.execute(
                    "INSERT INTO account_polls (account, last_poll_at) VALUES (?, ?) "
                    "ON CONFLICT (account) DO UPDATE SET last_poll_at = excluded.last_poll_at",
                    (account, at),
                )
        return True

    @read
    def last_ok_poll_at(self, account: str) -> float | None:
        """When a discovery pass of ``account`` last succeeded (``None``: never)."""
        value = first_value(
            self._db.conn,
            "SELECT last_ok_poll_at FROM account_polls WHERE account = ?",
            (account,),
        )
        return None if value is None else float(value)


def _upstream_code(status: int | str | None) -> int:
    if status is None:
        return UPSTREAM_NO_ANSWER
    if isinstance(status, str):  # "malformed", the only non-HTTP outcome
        return UPSTREAM_MALFORMED
    return status
