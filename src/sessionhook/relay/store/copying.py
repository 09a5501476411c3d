"""Copying a whole store into another (``sessionhook store copy``, e.g. SQLite to
PostgreSQL): every row of the archive and the delivery log as it is, ids and stored bytes
included (:data:`ORDERED_TABLES`, then any other table both schemas have), but what the
target derives or what belongs to running processes (:data:`SKIPPED_TABLES`).

The source is opened read-only. The target must be empty unless ``replace`` (its rows
deleted first, in one transaction). Rows go over in batches, one transaction each; then the
target's id generators are moved past the copied ids and every table's count is compared:
a mismatch raises :class:`CopyError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from . import codec
from .dialect import Database, first_value
from .errors import StoreError
from .policy import call

#: Tables in an order that respects their references (parents first).
ORDERED_TABLES = (
    "meta",
    "endpoints",
    "sessions",
    "body_refs",
    "activities",
    "events",
    "deliveries",
    "rendered_bodies",
    "attempts",
    "refused_activities",
    "upstream_requests",
    "request_budget",
    "actions_taken",
)
#: Derived by the target (triggers) or owned by running replicas: never copied.
SKIPPED_TABLES = frozenset(
    {"outbox_heads", "replicas", "leases", "budget_locks", "_sqlite_migrations"}
)
#: Derived from other columns of their row (migration 0008): read, never written.
GENERATED_COLUMNS = frozenset(
    {
        ("activities", "session_name"),
        ("activities", "kind"),
        ("events", "activity_name"),
        ("events", "type"),
    }
)
#: Rows per transaction.
BATCH = 1000


class CopyError(StoreError):
    """The copy cannot start (a non-empty target) or did not copy everything."""


@dataclass(frozen=True, slots=True)
class CopyReport:
    """What was copied: rows per table (the same in source and target)."""

    tables: dict[str, int]

    @property
    def rows(self) -> int:
        """Rows copied in all."""
        return sum(self.tables.values())


def plan(source: CopyQueries, target: CopyQueries) -> list[str]:
    """The tables to copy, parents first: those both stores have, but the skipped ones."""
    theirs = set(target.copy_tables())
    mine = [t for t in source.copy_tables() if t in theirs and t not in SKIPPED_TABLES]
    known = [t for t in ORDERED_TABLES if t in mine]
    return known + sorted(t for t in mine if t not in ORDERED_TABLES)


def copy_store(
    source: CopyQueries,
    target: CopyQueries,
    *,
    replace: bool = False,
    progress: Callable[[str, int, int], None] = lambda table, done, total: None,
    batch: int = BATCH,
) -> CopyReport:
    """Copy every row of ``source`` into ``target`` (see the module docstring).

    ``progress(table, rows done, rows in the table)`` is called after each batch.
    Raises :class:`CopyError` when the target holds rows and ``replace`` is false, or when
    a table's count differs afterwards.
    """
    tables = plan(source, target)
    filled = [t for t in tables if target.copy_count(t)]
    if filled and not replace:
        raise CopyError(
            f"the target is not empty ({', '.join(filled[:4])} hold rows); copy into a new "
            "store, or pass --replace to delete the target's rows first"
        )
    if filled:
        target.copy_clear(list(reversed(tables)))
    copied: dict[str, int] = {}
    for table in tables:
        theirs = set(target.copy_columns(table))
        columns = [c for c in source.copy_columns(table) if c in theirs]
        if "rowid" in theirs and "rowid" not in columns:
            columns.append("rowid")  # the archive order of activities (SQLite's rowid)
        total = source.copy_count(table)
        done = 0
        progress(table, done, total)
        for rows in source.copy_read(table, columns, batch):
            target.copy_write(table, columns, target.copy_adapt(table, columns, rows))
            done += len(rows)
            progress(table, done, total)
        copied[table] = done
    target.copy_finish(tables)
    wrong = {
        t: (copied[t], source.copy_count(t), target.copy_count(t))
        for t in tables
        if not copied[t] == source.copy_count(t) == target.copy_count(t)
    }
    if wrong:
        detail = "; ".join(
            f"{t}: read {r}, source {s}, target {g}" for t, (r, s, g) in wrong.items()
        )
        raise CopyError(f"the copy is incomplete ({detail})")
    return CopyReport(copied)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class CopyQueries:
    """The copy role over one database, on either side of a copy: the SQL is the common subset;
    what the engines do differently (their list of tables, bytes-only bodies, id
    generators) the backend does (:class:`~.dialect.Database`)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    @call
    def copy_tables(self) -> list[str]:
        """The tables of this store's schema (no internal ones)."""
        return self._db.table_names()

    @call
    def copy_columns(self, table: str) -> list[str]:
        """The columns of ``table`` (not those derived from others)."""
        cur = self._db.conn.execute(f"SELECT * FROM {_quote(table)} LIMIT 0")
        columns = [str(d[0]) for d in cur.description]
        cur.fetchall()
        return [c for c in columns if (table, c) not in GENERATED_COLUMNS]

    @call
    def copy_count(self, table: str) -> int:
        """Rows in ``table``."""
        return int(first_value(self._db.conn, f"SELECT COUNT(*) FROM {_quote(table)}"))

    @call
    def copy_read(
        self, table: str, columns: Sequence[str], batch: int
    ) -> Iterator[list[tuple[Any, ...]]]:
        """``table``'s rows (``columns``), in batches of at most ``batch``."""
        names = ", ".join(_quote(c) for c in columns)
        cur = self._db.conn.execute(f"SELECT {names} FROM {_quote(table)}")
        while True:
            rows = cur.fetchmany(batch)
            if not rows:
                return
            yield [tuple(r) for r in rows]

    @call
    def copy_write(self, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Insert ``rows`` into ``table`` in one transaction, ids as given."""
        names = ", ".join(_quote(c) for c in columns)
        marks = ", ".join("?" for _ in columns)
        with self._db.tx() as c:
            c.executemany(f"INSERT INTO {_quote(table)} ({names}) VALUES ({marks})", rows)

    @call
    def copy_adapt(
        self, table: str, columns: Sequence[str], rows: list[tuple[Any, ...]]
    ) -> list[tuple[Any, ...]]:
        """``rows`` as this (target) store stores them. SQLite keeps a column's text or blob
        as it is. PostgreSQL stores event bodies and raw activities as ``BYTEA`` only: the
        plain text of rows written before 0006 is encoded (:mod:`.codec`, without a
        reference or context), so that it decodes to the same bytes."""
        if not self._db.binary_bodies:
            return rows
        if table == "events" and "body" in columns:
            i = columns.index("body")
            return [_with(r, i, _text_body(r[i])) for r in rows]
        if table == "activities" and {"raw", "name", "create_time"} <= set(columns):
            i, n, t = columns.index("raw"), columns.index("name"), columns.index("create_time")
            return [_with(r, i, _text_raw(r[i], r[n], r[t])) for r in rows]
        return rows

    @call
    def copy_clear(self, tables: Sequence[str]) -> None:
        """Delete every row of ``tables`` (children first), in one transaction."""
        with self._db.tx() as c:
            for table in tables:
                c.execute(f"DELETE FROM {_quote(table)}")

    @call
    def copy_finish(self, tables: Sequence[str]) -> None:
        """The backend moves its id generators past the copied ids of ``tables``
        (PostgreSQL's sequences; SQLite's AUTOINCREMENT follows inserted ids by itself)."""
        self._db.advance_ids(tables)


def _with(row: tuple[Any, ...], index: int, value: Any) -> tuple[Any, ...]:
    return (*row[:index], value, *row[index + 1 :])


def _text_body(stored: Any) -> Any:
    """A plain-text event body (before 0006) as a BLOB that decodes to the same bytes."""
    if isinstance(stored, str):
        return codec.encode_body(stored.encode("utf-8"), b"", b"")
    return stored


def _text_raw(stored: Any, name: str, create_time: str) -> Any:
    """A plain-text raw activity (before 0006) as a BLOB that decodes to the same bytes."""
    if isinstance(stored, str):
        return codec.encode_raw(stored.encode("utf-8"), (name + create_time).encode("utf-8"))
    return stored
