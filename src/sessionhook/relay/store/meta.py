"""The ``meta`` table: the relay's own small facts (the baseline, the discovery's learned
verdicts, probes of a full disk), one value per key."""

from __future__ import annotations

from .dialect import Database, first_value

__all__ = ["MetaQueries"]


class MetaQueries:
    """The meta role (:class:`~.roles.MetaRole`) over one database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def get_meta(self, key: str) -> str | None:
        """A value of the ``meta`` table."""
        value = first_value(self._db.conn, "SELECT value FROM meta WHERE key = ?", (key,))
        return None if value is None else str(value)

    def set_meta(self, key: str, value: str) -> None:
        """Set a value of the ``meta`` table."""
        with self._db.tx() as c:
            c.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def is_baseline_complete(self) -> bool:
        """Whether the first discovery pass (the baseline of ``backfill = false``) finished."""
        return self.get_meta("baseline_complete") == "1"

    def mark_baseline_complete(self) -> None:
        """Record that the first discovery pass finished."""
        self.set_meta("baseline_complete", "1")
