"""One SQL text, two engines: what the query modules may assume of a connection.

Every query in this package is written ONCE, in the subset of SQL that SQLite (3.40 here)
and PostgreSQL both accept, with ``?`` placeholders:

* ``INSERT ... ON CONFLICT (...) DO NOTHING / DO UPDATE SET ... = excluded. ...`` (never
  ``INSERT OR IGNORE / REPLACE``);
* ``INSERT ... RETURNING id`` for a generated key (never ``lastrowid``);
* a list parameter is passed as one JSON text and read with ``json_each(?)``:
  ``x IN (SELECT value FROM json_each(?))``. That is the one textual hook: on PostgreSQL
  :func:`to_pyformat` rewrites it to ``json_array_elements_text(CAST(? AS json))``, whose
  column is named ``value`` too (the values are text on both: use it for text keys);
* flags are ``INTEGER`` 0/1 on both (``enabled = 1``), never booleans;
* no SQL functions of our own (``create_function``): glob matching and payload conditions
  are applied in Python on the rows a query returns;
* every selected column is grouped or aggregated; no ``LIMIT -1``; no ``typeof``; no
  ``rowid`` except ``activities.rowid``, which the PostgreSQL schema declares as a column.

A query module sees a :class:`Connection`: ``sqlite3.Connection`` fits it as it is (the
SQLite store hands its connection over untouched: no wrapper on the hot path), and the
PostgreSQL store hands a small adapter (:mod:`.postgres`) that translates the text once
(:func:`to_pyformat`, cached) and binds parameters on the client side
(``psycopg.ClientCursor``), so that an untyped ``? IS NULL`` is valid.

The query collaborators (ingest, outbox, leases...) receive a :class:`Database`: that
connection, the write transactions, the clock, and the few things the engines do
differently, each as a method or attribute of the backend (:mod:`.sqlite`, :mod:`.postgres`)
rather than a test of the engine's name.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from .errors import StoreError, StoreUnwritableError


class Connection(Protocol):
    """What a query module may call on the connection the store gives it."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Any: ...

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Any: ...


class Prepared(str):
    """SQL text of a statement run on every delivery, which the PostgreSQL store prepares
    on the server (parsed and planned once per connection, then bound with typed
    parameters: every parameter's type must follow from the text, e.g. no untyped
    ``? IS NULL``); SQLite's statement cache prepares any text anyway."""

    __slots__ = ()


def first_value(conn: Connection, sql: str, params: Sequence[Any] = ()) -> Any:
    """The first column of the first row of ``sql`` (``None`` when there is no row)."""
    row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


_T = TypeVar("_T")

#: A write over many outbox queues (a recovery, a replay, deleting an endpoint) commits
#: every this many queues: each queue's key lock is held to the end of its transaction, and
#: PostgreSQL's lock table holds some ten thousand locks for all its sessions at once.
QUEUES_PER_TX = 500


def batches(items: Sequence[_T]) -> Iterator[Sequence[_T]]:
    """``items`` in slices of at most :data:`QUEUES_PER_TX`; none when empty."""
    for start in range(0, len(items), QUEUES_PER_TX):
        yield items[start : start + QUEUES_PER_TX]


def refuse_readonly(db: Database) -> None:
    """Raise :class:`~.errors.StoreError` when ``db`` is open read-only: the first step of
    every write transaction (:meth:`Database.tx`), and of a write that reads before its
    first one."""
    if db.readonly:
        raise StoreError(f"{db.location} is open read-only", path=db.path)


def queue_keys(
    conn: Connection, endpoint: str, rows: str, params: Sequence[Any]
) -> Iterator[tuple[str, str]]:
    """The (endpoint, session) queue keys of ``endpoint`` for the sessions of ``rows`` (a
    ``FROM ... WHERE ...`` of a table aliased ``e`` with a ``session_name``), read when
    iterated (:meth:`Database.lock_queue_keys` reads them only where it takes locks)."""
    for row in conn.execute(f"SELECT DISTINCT e.session_name {rows}", params):
        yield endpoint, str(row["session_name"])


#: Listens for wake-ups forever, calling its argument at each one (see :mod:`.notify`).
WakeSource = Callable[[Callable[[], None]], Awaitable[None]]


class Database(Protocol):
    """One open database, as the query collaborators use it (a backend implements it:
    :class:`~.sqlite.SqliteDatabase`, :class:`~.postgres.PostgresDatabase`)."""

    @property
    def conn(self) -> Connection:
        """What reads run on: autocommit statements, each sees committed data."""
        ...

    @property
    def clock(self) -> Callable[[], float]:
        """Unix seconds for the store's own bookkeeping (``created_at``...)."""
        ...

    @property
    def path(self) -> Path | None:
        """The SQLite file (``None`` on PostgreSQL), for :class:`~.errors.StoreError`."""
        ...

    @property
    def location(self) -> str:
        """The store in messages: the file, or the URL without its password."""
        ...

    @property
    def readonly(self) -> bool:
        """Opened read-only: every write raises :class:`~.errors.StoreError`."""
        ...

    @property
    def concurrency(self) -> int:
        """How many threads may use the database at once (the async door's limit)."""
        ...

    @property
    def exclusive(self) -> bool:
        """At most one daemon runs on this database (SQLite: the daemon lock): a replica
        registered on it has no rival, so it claims nothing."""
        ...

    @property
    def binary_bodies(self) -> bool:
        """Bodies and raw activities are stored as bytes only (PostgreSQL's ``BYTEA``):
        plain text written by SQLite before 0006 is encoded when copied in."""
        ...

    @property
    def update_many(self) -> str:
        """How a statement updating many rows of a table with triggers begins, inside a
        write transaction that is rolled back whole when it fails: ``UPDATE OR FAIL`` on
        SQLite, which then keeps no statement journal (for a batch of records it outgrew
        64 KiB and went to a temporary file, every round), ``UPDATE`` on PostgreSQL."""
        ...

    @property
    def claims_in_one_statement(self) -> bool:
        """A replica's claim of due heads runs as one statement, an ``UPDATE`` in a
        ``WITH`` clause (PostgreSQL: one round trip, no explicit transaction); SQLite has no
        such statement (and its one daemon claims nothing)."""
        ...

    def tx(self, serialized: bool = True) -> AbstractContextManager[Connection]:
        """ONE write transaction, committed when the block ends, rolled back whole when it
        raises ("cannot write now" becomes :class:`~.errors.StoreUnwritableError`).
        ``serialized=False``: the block orders itself by row locks (conditional updates,
        ``FOR UPDATE``, the outbox heads' per-key lock), so it does not wait for
        PostgreSQL's global write lock (SQLite has one writer anyway)."""
        ...

    def one_connection(self) -> AbstractContextManager[None]:
        """The block's reads and transactions on one connection (the dispatcher's round),
        each transaction's statements sent as they come and waited for when a result is
        read and at the commit (PostgreSQL's pipeline mode); nothing where a statement is a
        call in the process (SQLite)."""
        ...

    def lock_queues(self, c: Connection, delivery_ids: Sequence[int]) -> None:
        """Take the queue locks of these deliveries' (endpoint, session) keys in key order
        (the lock order of every writer of the heads), before one statement writes them
        all in whatever order its plan visits them (PostgreSQL); nothing where there is one
        writer."""
        ...

    def lock_queue_keys(self, c: Connection, keys: Iterable[tuple[str, str]]) -> None:
        """:meth:`lock_queues` by (endpoint, session) key: for a writer of whole queues,
        before it locks any of their rows. ``keys`` may be lazy (a query's rows): read only
        where there are locks to take."""
        ...

    def skip_locked(self, alias: str) -> str:
        """Appended to a claiming read of ``alias``'s rows: rows another transaction is
        claiming are skipped, not waited for (PostgreSQL); empty where there is one writer."""
        ...

    def for_update(self) -> str:
        """Appended to a read of rows the transaction goes on to change: it waits for a
        transaction writing them and reads what that one committed (PostgreSQL); empty
        where there is one writer."""
        ...

    def notify_outbox(self, c: Connection) -> None:
        """Tell every replica, when ``c``'s transaction commits, to look at the outbox
        (claims were given back); nothing where there is no other replica to tell."""
        ...

    def wake_source(self) -> WakeSource | None:
        """What wakes this replica when another one enqueued deliveries (PostgreSQL's
        ``LISTEN``); ``None`` where no other process writes (SQLite)."""
        ...

    def table_names(self) -> list[str]:
        """The tables of this database's schema, sorted (no internal ones of the engine)."""
        ...

    def advance_ids(self, tables: Sequence[str]) -> None:
        """Move the id generators of ``tables`` past the ids inserted as given (a copy)."""
        ...

    def unwritable_error(self, exc: BaseException) -> StoreUnwritableError | None:
        """``exc`` (raised outside a write transaction) as the
        :class:`~.errors.StoreUnwritableError` it means, or ``None``."""
        ...

    def close(self) -> None:
        """Release the connection(s)."""
        ...


# A string literal, a quoted identifier, a placeholder, a percent sign, or json_each(?).
_TOKENS = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|json_each\(\?\)|\?|%")


@functools.lru_cache(maxsize=1024)
def to_pyformat(sql: str) -> str:
    """``sql`` (``?`` placeholders, see the module docstring) for psycopg: ``?`` becomes
    ``%s``, a literal ``%`` becomes ``%%``, ``json_each(?)`` becomes
    ``json_array_elements_text(CAST(%s AS json))``; quoted text is left alone."""

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "?":
            return "%s"
        if token == "%":
            return "%%"
        if token == "json_each(?)":
            return "json_array_elements_text(CAST(%s AS json))"
        return token.replace("%", "%%")  # a literal: psycopg still reads % in it

    return _TOKENS.sub(replace, sql)
