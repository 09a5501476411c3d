"""The ``meta`` table: the relay's own small facts (the baseline, the discovery's learned
verdicts, probes of a full disk), one value per key."""

from __future__ import annotations

from .dialect import Connection, Database, first_value
from .policy import read, try_write, write


def put_meta(c: Connection, key: str, value: str) -> None:
    """Set a value of the ``meta`` table in the write transaction ``c``."""
    c.execute(
        "INSERT INTO meta (key, value) VALUES (?, ?) "
        "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (key, value),
    )


class MetaQueries:
    """The meta role over one database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    @read
    def get_meta(self, key: str) -> str | None:
        """A value of the ``meta`` table."""
        value = first_value(self._db.conn, "SELECT value FROM meta WHERE key = ?", (key,))
        return None if value is None else str(value)

    @write
    def set_meta(self, key: str, value: str) -> None:
        """Set a value of the ``meta`` table."""
        with self._db.tx() as c:
            put_meta(c, key, value)

    @try_write
    def probe(self, key: str, value: str) -> bool:
        """A tiny write (the readiness probe, a full disk's probe): through the door,
        whether the store takes writes now; not even tried while it is unwritable and its
        retry is not due."""
        self.set_meta(key, value)
        return True

    @read
    def is_baseline_complete(self) -> bool:
        """Whether the first discovery pass (the baseline of ``backfill = false``) finished."""
        return self.get_meta("baseline_complete") == "1"

    @write
    def mark_baseline_complete(self) -> None:
        """Record that the first discovery pass finished."""
        self.set_meta("baseline_complete", "1")
