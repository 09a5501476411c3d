"""What the relay refused to archive from upstream, and why (table ``refused_activities``).

An activity is refused, never silently skipped, when it is too large to read even alone
(``too_large``), when its ``name`` belongs to another session (``foreign_name``) or is no
activity name at all (``not_a_name``), when its name is archived under another session
already (``duplicate_name``), or when it is no activity at all (``malformed``: no string
``name``, a field of the wrong type; those without a name share one row per session).
Each refusal is one row per session, name and reason; meeting it again bumps ``count`` and
``last_refused_at``. ``sessionhook status`` shows the figures.
"""

from __future__ import annotations

from ..domain.rows import RefusedRow, RefusedSummary, from_row
from .dialect import Database, first_value
from .ingest import advance_cursor as move_cursor
from .policy import call, write

#: Why an activity was refused (the ``reason`` column, a metric label).
REFUSAL_REASONS = ("too_large", "foreign_name", "not_a_name", "duplicate_name", "malformed")
#: Names and details are upstream text: stored cut to this many characters.
_MAX_TEXT = 512


class Refusals:
    """The refusals role over one database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    @write
    def refuse_activity(
        self,
        session_name: str,
        name: str,
        reason: str,
        *,
        create_time: str = "",
        detail: str = "",
        size: int | None = None,
        cursor_limit: str | None = None,
        advance_cursor: bool = False,
    ) -> bool:
        """Record that an activity was refused; returns whether it is the first time.

        With ``advance_cursor`` (an activity of this session that is too large), the
        session's ``activity_cursor`` moves to its ``create_time`` in the same transaction,
        as if it had been archived (never past ``cursor_limit``), so that polling goes on
        after it instead of meeting it at every poll.
        """
        if reason not in REFUSAL_REASONS:
            raise ValueError(f"unknown refusal reason {reason!r}")
        now = self._db.clock()
        with self._db.tx() as c:
            known = c.execute(
                "SELECT 1 FROM refused_activities WHERE session_name = ? AND name = ? "
                "AND reason = ?",
                (session_name, name[:_MAX_TEXT], reason),
            ).fetchone()
            c.execute(
                "INSERT INTO refused_activities (session_name, name, create_time, reason, "
                "detail, size, first_refused_at, last_refused_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (session_name, name, reason) DO UPDATE SET "
                "count = refused_activities.count + 1, last_refused_at = excluded.last_refused_at, "
                "detail = excluded.detail, size = excluded.size",
                (
                    session_name,
                    name[:_MAX_TEXT],
                    create_time[:_MAX_TEXT],
                    reason,
                    detail[:_MAX_TEXT],
                    size,
                    now,
                    now,
                ),
            )
            if advance_cursor and create_time:
                move_cursor(c, session_name, [create_time], cursor_limit)
            return known is None

    @call
    def refused_summary(self, since: float) -> RefusedSummary:
        """Refusals in total, by reason, since ``since`` (Unix seconds), and the latest."""
        by_reason = {
            r["reason"]: int(r["n"])
            for r in self._db.conn.execute(
                "SELECT reason, COUNT(*) AS n FROM refused_activities GROUP BY reason"
            )
        }
        recent = int(
            first_value(
                self._db.conn,
                "SELECT COUNT(*) FROM refused_activities WHERE last_refused_at >= ?",
                (since,),
            )
        )
        latest = self.refused_activities(limit=1)
        return RefusedSummary(
            total=sum(by_reason.values()),
            by_reason=by_reason,
            recent=recent,
            latest=latest[0] if latest else None,
        )

    @call
    def refused_activities(self, limit: int = 100) -> list[RefusedRow]:
        """The most recently refused activities, newest first."""
        rows = self._db.conn.execute(
            "SELECT session_name, name, create_time, reason, detail, size, first_refused_at, "
            "last_refused_at, count FROM refused_activities "
            "ORDER BY last_refused_at DESC, name LIMIT ?",
            (limit,),
        ).fetchall()
        return [from_row(RefusedRow, row) for row in rows]
