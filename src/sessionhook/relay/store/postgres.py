"""The PostgreSQL backend: :class:`PostgresDatabase` (``store.url = "postgresql://..."``) and
:class:`PostgresStore`, the store on it, through a ``psycopg_pool.ConnectionPool`` of
autocommit connections binding parameters on the client side (``psycopg.ClientCursor``: an
untyped ``? IS NULL`` is valid, as on SQLite), but for the statements of the dispatcher's
round (:class:`~.dialect.Prepared`): those are bound and prepared on the server, each parsed
and planned once per connection.

A read outside a transaction borrows a connection for one statement (each read sees
committed data), but in ``one_connection`` (the dispatcher's round: its reads and
transactions on one connection, each transaction in psycopg's pipeline mode, see
``docs/store.md``); ``tx`` holds one connection for the block (a thread-local the block's
queries go to) and first takes ``pg_advisory_xact_lock(WRITE_LOCK)``, so writers are
serialized as on SQLite, unless ``tx(serialized=False)``: the replicas' hot paths, each
ordered by its own row locks (``docs/replicas.md``). "Cannot write now" errors (server
unreachable, read-only, a deadlock broken: nothing committed) become
:class:`~.errors.StoreUnwritableError`, ``disk_full`` :class:`~.errors.StoreFullError`, a
mistake at open (wrong password, missing database) a one-line :class:`~.errors.StoreError`;
messages name the database by :func:`display_url` (never the password).

PostgreSQL's ``TEXT`` cannot hold NUL characters: a text parameter holding one has it
replaced by U+FFFD (text from the network never makes a write fail).
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg.conninfo
import psycopg_pool

from ...redact import redact_userinfo
from ..config.database_url import display_url
from . import notify
from .core import StoreCore
from .dialect import Connection, Prepared, WakeSource, refuse_readonly, to_pyformat
from .errors import StoreError, StoreFullError, StoreUnwritableError
from .migrations import POSTGRES, check_current, migrate

#: Connections per relay process (and so the AsyncStore's worker threads).
DEFAULT_POOL_SIZE = 4
#: Seconds to wait for a connection: the server, or a free one in the pool.
CONNECT_TIMEOUT = 5.0
#: Queue keys locked per statement by :meth:`PostgresDatabase.lock_queue_keys`.
KEYS_PER_LOCK = 1000
#: ``pg_advisory_xact_lock`` key serializing write transactions ("sh" + "write").
WRITE_LOCK = 0x7368_7772_6974

#: Set on a thread while it abandons a pipelined transaction (its connection closed on
#: purpose: :meth:`PostgresDatabase._pipelined_tx`).
_abandoning = threading.local()


class _AbandonedPipeline(logging.Filter):
    """Drops psycopg's warning that it could not end a pipeline whose connection was
    closed on purpose ("error ignored terminating <Pipeline ...>"): expected, and the error
    that caused it is raised to the caller."""

    def filter(self, record: logging.LogRecord) -> bool:
        abandoned = getattr(_abandoning, "on", False)
        return not (abandoned and str(record.msg).startswith("error ignored terminating"))


logging.getLogger("psycopg").addFilter(_AbandonedPipeline())

#: SQLSTATE classes and codes meaning "cannot write now, try again later".
#: "40": a serialization failure or a deadlock the server broke (nothing committed).
_RETRY_CLASSES = ("08", "57", "53", "40")  # connection, operator intervention, resources
_READ_ONLY = "25006"
_DISK_FULL = "53100"
#: Raised at connect time for a mistake to fix (exit 2), not a pause to wait out.
_FATAL_AT_CONNECT = (
    "password authentication failed",
    "no password supplied",
    "does not exist",  # database or role
    "no pg_hba.conf entry",
    "authentication failed",
    "permission denied",
    "invalid",  # a bad option or URL parameter
)


class _Row(tuple[Any, ...]):
    """A result row as the queries read it on both engines (as ``sqlite3.Row``): by column
    name (``row["status"]``) or by position; a tuple otherwise. Each column list gets its
    own subclass holding the names (:func:`_row_class`)."""

    __slots__ = ()
    _index: dict[str, int] = {}

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._index)


@functools.lru_cache(maxsize=1024)
def _row_class(names: tuple[bytes | None, ...]) -> type[_Row]:
    index: dict[str, int] = {}
    for i, name in enumerate(names):
        index.setdefault((name or b"").decode(), i)  # the first of a name wins, as in sqlite3.Row
    return type("Row", (_Row,), {"__slots__": (), "_index": index})


def _named_rows(cursor: Any) -> Callable[[Sequence[Any]], Any]:
    """psycopg's row factory for :class:`_Row` (the names read from the result, as
    psycopg's own ``namedtuple_row`` does: no ``description`` built per statement)."""
    result = cursor.pgresult
    if result is None or not result.nfields:
        return tuple
    return _row_class(tuple(result.fname(i) for i in range(result.nfields)))


def _clean(value: Any) -> Any:
    if isinstance(value, str) and "\x00" in value:
        return value.replace("\x00", "\ufffd")
    return value


@functools.lru_cache(maxsize=1024)
def _query(sql: str) -> bytes:
    return to_pyformat(sql).encode()


def _run(conn: psycopg.Connection[Any], sql: str, params: list[Any]) -> Any:
    """``sql`` on ``conn``: a :class:`~.dialect.Prepared` statement bound on the server and
    prepared there at its first run (psycopg keeps it per connection); any other bound on
    the client (see the module docstring)."""
    if isinstance(sql, Prepared):
        return psycopg.RawCursor(conn).execute(_numbered(sql), params, prepare=True)
    return conn.execute(_query(sql), params)


@functools.lru_cache(maxsize=1024)
def _numbered(sql: str) -> bytes:
    """``sql`` with ``$1, $2...`` placeholders (:func:`to_pyformat`'s ``%s`` numbered, its
    ``%%`` a ``%`` again), for a ``RawCursor``: psycopg then parses no query text per run
    (it does for a long ``%s`` one: over 50 parameters is not cached)."""
    numbers = itertools.count(1)
    return _PYFORMAT.sub(
        lambda m: "%" if m.group(0) == "%%" else f"${next(numbers)}", to_pyformat(sql)
    ).encode()


_PYFORMAT = re.compile(r"%%|%s")


class _Adapter:
    """The :class:`~.dialect.Connection` the shared queries see on PostgreSQL."""

    def __init__(self, pool: psycopg_pool.ConnectionPool[Any]) -> None:
        self.pool = pool
        self.local = threading.local()

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any:
        params = [_clean(p) for p in parameters]
        local = self.local
        conn: psycopg.Connection[Any] | None = getattr(local, "conn", None) or getattr(
            local, "pinned", None
        )
        if conn is not None:
            return _run(conn, sql, params)
        with self.pool.connection(timeout=CONNECT_TIMEOUT) as borrowed:
            return _run(borrowed, sql, params)

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Any:
        rows = [[_clean(p) for p in row] for row in parameters]
        conn: psycopg.Connection[Any] | None = getattr(self.local, "conn", None)
        if conn is None:  # pragma: no cover - the queries only write in a transaction
            raise RuntimeError("executemany outside a transaction")
        cursor = conn.cursor()
        if rows:
            cursor.executemany(_query(sql), rows)
        return cursor


def _connect_kwargs(readonly: bool) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "autocommit": True,
        "cursor_factory": psycopg.ClientCursor,
        "row_factory": _named_rows,
        "connect_timeout": int(CONNECT_TIMEOUT),
        "application_name": "sessionhook",
    }
    if readonly:
        kwargs["options"] = "-c default_transaction_read_only=on"
    return kwargs


class PostgresDatabase:
    """A relay database on PostgreSQL, opened with :meth:`open` or :meth:`open_readonly`
    (the :class:`~.dialect.Database` the queries run on): several relays may share it."""

    #: Shared by replicas: each claims what it works on.
    exclusive = False
    #: Bodies and raw activities are ``BYTEA``.
    binary_bodies = True
    #: See ``Database.update_many``.
    update_many = "UPDATE"
    #: See ``Database.claims_in_one_statement``.
    claims_in_one_statement = True

    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool[Any],
        url: str,
        *,
        readonly: bool,
        clock: Callable[[], float] = time.time,
        pool_size: int = DEFAULT_POOL_SIZE,
    ) -> None:
        self._adapter = _Adapter(pool)
        #: What reads run on: the adapter (a plain attribute: tests wrap it).
        self.conn: Connection = self._adapter
        self._pool = pool
        self.url = url
        self.path = None
        self.location = display_url(url)
        self.readonly = readonly
        self.clock = clock
        #: The pool's size: as many of the store's calls at once.
        self.concurrency = pool_size

    # ----------------------------------------------------------------- opening

    @classmethod
    def open(
        cls,
        url: str,
        *,
        readonly: bool = False,
        clock: Callable[[], float] = time.time,
        pool_size: int = DEFAULT_POOL_SIZE,
    ) -> PostgresDatabase:
        """Connect, migrate (one transaction, see :mod:`.migrations`) and start the pool; or
        with ``readonly``, connect read-only (``default_transaction_read_only``), e.g. while
        the daemon runs: write methods raise :class:`StoreError`, the schema must be current.

        Raises :class:`StoreError` for a wrong password, a missing database, a database
        that is not ours or is newer; :class:`StoreUnwritableError` when the server cannot
        be reached or is read-only for now (the daemon waits for it).
        """
        prepare = check_current if readonly else migrate
        location = display_url(url)
        with _connect(url, location, readonly=readonly) as conn:
            try:
                prepare(_Direct(conn), POSTGRES, location)
            except psycopg.Error as exc:
                raise _mapped(exc, location, opening=True) from None
        return cls(
            _pool(url, pool_size, readonly=readonly),
            url,
            readonly=readonly,
            clock=clock,
            pool_size=pool_size,
        )

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.close()

    # ----------------------------------------------------------------- what differs

    def lock_queues(self, c: Connection, delivery_ids: Sequence[int]) -> None:
        """``outbox_key_lock`` (the heads triggers' lock, re-entrant in a transaction) of
        each key of ``delivery_ids``, in key order, in one statement, before any of their
        rows is locked. One delivery too: left to its trigger, the lock came after the
        row's, and two replicas recording that delivery (a claim taken over from a replica
        whose lease lapsed) deadlocked when the other's batch held the key first."""
        if delivery_ids:
            c.execute(
                Prepared(
                    "SELECT outbox_key_lock(k.endpoint, k.session_name) FROM "
                    "(SELECT DISTINCT endpoint, session_name FROM deliveries WHERE id IN ("
                    + ", ".join("?" * len(delivery_ids))
                    + ") ORDER BY endpoint, session_name) AS k"
                ),
                delivery_ids,
            )

    def lock_queue_keys(self, c: Connection, keys: Iterable[tuple[str, str]]) -> None:
        """``outbox_key_lock`` of each of ``keys``, in key order, a statement per
        :data:`KEYS_PER_LOCK` keys (a statement holds at most 65,535 parameters)."""
        ordered = sorted(set(keys))
        for start in range(0, len(ordered), KEYS_PER_LOCK):
            chunk = ordered[start : start + KEYS_PER_LOCK]
            c.execute(
                "SELECT outbox_key_lock(k.column1, k.column2) FROM (VALUES "
                + ", ".join(["(CAST(? AS TEXT), CAST(? AS TEXT))"] * len(chunk))
                + ") AS k",
                [value for key in chunk for value in key],
            )

    def skip_locked(self, alias: str) -> str:
        """``FOR UPDATE OF alias SKIP LOCKED``: heads another replica's transaction is
        claiming are skipped, not waited for."""
        return f" FOR UPDATE OF {alias} SKIP LOCKED"

    def for_update(self) -> str:
        """``FOR UPDATE``: the rows are locked; a transaction writing them is waited for,
        and what it committed is read."""
        return " FOR UPDATE"

    def notify_outbox(self, c: Connection) -> None:
        """``pg_notify`` on :data:`~.notify.OUTBOX_CHANNEL`, sent when ``c``'s transaction
        commits (see :mod:`.notify`)."""
        c.execute(f"SELECT pg_notify('{notify.OUTBOX_CHANNEL}', '')")

    def wake_source(self) -> WakeSource | None:
        """:func:`~.notify.listen` on this database, on a connection of its own."""
        url = self.url

        async def listen(on_notify: Callable[[], None]) -> None:
            await notify.listen(url, on_notify)

        return listen

    def table_names(self) -> list[str]:
        """The base tables of the current schema."""
        rows = self.conn.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
        ).fetchall()
        return sorted(str(r["table_name"]) for r in rows)

    def advance_ids(self, tables: Sequence[str]) -> None:
        """Each identity column's sequence moved to the largest id, so the next row gets
        the next id (not one inserted as given)."""
        with self.tx() as c:
            for table in tables:
                for row in c.execute(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = current_schema() AND table_name = ? "
                    "AND is_identity = 'YES'",
                    (table,),
                ).fetchall():
                    column = row["column_name"]
                    c.execute(
                        f"SELECT setval(pg_get_serial_sequence(?, ?), "
                        f"COALESCE(MAX({_quote(column)}), 0) + 1, false) FROM {_quote(table)}",
                        (table, column),
                    )

    # ----------------------------------------------------------------- transactions

    @contextmanager
    def one_connection(self) -> Iterator[None]:
        """The block's reads and transactions on ONE pooled connection (borrowed and checked
        once), each transaction in pipeline mode (see :meth:`tx`). PostgreSQL's "cannot
        write now" errors become :class:`StoreUnwritableError`."""
        local = self._adapter.local
        if getattr(local, "pinned", None) is not None or getattr(local, "conn", None) is not None:
            yield  # pragma: no cover - already on one connection
            return
        with self._unwritable_raised(), self._pool.connection(timeout=CONNECT_TIMEOUT) as conn:
            local.pinned = conn
            try:
                yield
            finally:
                local.pinned = None

    @contextmanager
    def tx(self, serialized: bool = True) -> Iterator[_Adapter]:
        """One write transaction on one pooled connection (in :meth:`one_connection`, its
        one, the transaction pipelined: :meth:`_pipelined_tx`), writers serialized unless
        ``serialized=False`` (see the module docstring); PostgreSQL's "cannot write now"
        errors become :class:`StoreUnwritableError` with nothing committed."""
        refuse_readonly(self)
        local = self._adapter.local
        if getattr(local, "conn", None) is not None:  # pragma: no cover - a bug
            raise RuntimeError("nested store transaction")
        pinned: psycopg.Connection[Any] | None = getattr(local, "pinned", None)
        if pinned is not None:
            with self._pipelined_tx(pinned, serialized):
                yield self._adapter
            return
        with (
            self._unwritable_raised(),
            self._pool.connection(timeout=CONNECT_TIMEOUT) as conn,
            conn.transaction(),
        ):
            if serialized:
                conn.execute(f"SELECT pg_advisory_xact_lock({WRITE_LOCK})".encode())
            local.conn = conn
            try:
                yield self._adapter
            finally:
                local.conn = None

    @contextmanager
    def _unwritable_raised(self) -> Iterator[None]:
        """PostgreSQL's "cannot write now" errors of the block raised as
        :class:`StoreUnwritableError` (:meth:`unwritable_error`), the others as they are."""
        try:
            yield
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            mapped = self.unwritable_error(exc)
            if mapped is not None:
                raise mapped from exc
            raise

    @contextmanager
    def _pipelined_tx(self, conn: psycopg.Connection[Any], serialized: bool) -> Iterator[None]:
        """:meth:`tx` on ``conn`` in pipeline mode: each statement is sent at once but
        waited for only when its result is read, and the end of the block sends a sync and
        waits for every result. The block's statements are ONE transaction without a
        ``BEGIN`` or a ``COMMIT``: the implicit one of the extended protocol, from the
        first statement after a sync to the next sync (a result is read with a flush, not
        a sync), committed by the sync at the end. After a failure the connection is
        closed before that sync is sent (a pipeline ends with one even then): the server
        rolls the transaction back, the pool opens another connection (psycopg's warning
        that it could not end the pipeline is dropped: :class:`_AbandonedPipeline`)."""
        local = self._adapter.local
        with self._unwritable_raised():
            try:
                with conn.pipeline():
                    try:
                        if serialized:
                            conn.execute(f"SELECT pg_advisory_xact_lock({WRITE_LOCK})".encode())
                        local.conn = conn
                        try:
                            yield
                        finally:
                            local.conn = None
                    except BaseException:
                        _abandoning.on = True
                        conn.close()  # before the pipeline's closing sync would commit
                        raise
            except BaseException:
                conn.close()
                raise
            finally:
                _abandoning.on = False

    def unwritable_error(self, exc: BaseException) -> StoreUnwritableError | None:
        """The server unreachable, restarting, read-only or out of disk (see the module
        docstring); ``None`` for anything else."""
        if isinstance(exc, psycopg_pool.PoolTimeout):
            return StoreUnwritableError(f"{self.location}: no connection: {exc}")
        if not isinstance(exc, psycopg.Error):
            return None
        mapped = _mapped(exc, self.location, opening=False)
        return mapped if isinstance(mapped, StoreUnwritableError) else None


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _retryable(exc: psycopg.Error) -> bool:
    state = exc.sqlstate or ""
    if state == _READ_ONLY or state.startswith(_RETRY_CLASSES):
        return True
    # No SQLSTATE: the connection itself failed (refused, reset, closed by the server).
    return not state and isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)


def _mapped(exc: psycopg.Error, location: str, *, opening: bool) -> StoreError:
    """A psycopg error as the store's: full, unwritable for now, or a plain StoreError."""
    text = redact_userinfo(str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc))
    if exc.sqlstate == _DISK_FULL:
        return StoreFullError(f"{location}: the database is out of disk space ({text})")
    if opening and any(marker in str(exc) for marker in _FATAL_AT_CONNECT):
        return StoreError(f"cannot open {location}: {text}")
    if _retryable(exc):
        return StoreUnwritableError(f"{location}: database unavailable ({text})")
    return StoreError(f"{location}: {text}")


@contextmanager
def _connect(url: str, location: str, *, readonly: bool) -> Iterator[psycopg.Connection[Any]]:
    """One direct connection (not pooled), its errors mapped for the opening."""
    kwargs = _connect_kwargs(readonly)
    kwargs.pop("cursor_factory")
    try:
        conn = psycopg.connect(url, **kwargs)
    except psycopg.Error as exc:
        raise _mapped(exc, location, opening=True) from None
    try:
        yield conn
    finally:
        conn.close()


class _Direct:
    """The opening's connection as the migrations see it (``?`` placeholders)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any:
        return self.conn.execute(_query(sql), list(parameters))


def _pool(url: str, size: int, *, readonly: bool) -> psycopg_pool.ConnectionPool[Any]:
    pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
        url,
        min_size=1,
        max_size=max(1, size),
        kwargs=_connect_kwargs(readonly),
        check=psycopg_pool.ConnectionPool.check_connection,
        timeout=CONNECT_TIMEOUT,
        name="sessionhook",
        open=False,
    )
    pool.open(wait=False)
    return pool


class PostgresStore(StoreCore):
    """A relay store in a PostgreSQL database. Open with :meth:`open` or
    :meth:`open_readonly`; the daemon goes through :class:`~.aio.AsyncStore`, whose
    worker threads (one per pooled connection) run the store's calls concurrently."""

    db: PostgresDatabase

    def __init__(self, db: PostgresDatabase) -> None:
        super().__init__(db)
        self.db = db

    @property
    def url(self) -> str:
        """The database's URL (with its password: never shown)."""
        return self.db.url

    @classmethod
    def open(
        cls,
        url: str,
        *,
        clock: Callable[[], float] = time.time,
        pool_size: int = DEFAULT_POOL_SIZE,
    ) -> PostgresStore:
        """:meth:`PostgresDatabase.open`: connect, migrate and start the pool."""
        return cls(PostgresDatabase.open(url, clock=clock, pool_size=pool_size))

    @classmethod
    def open_readonly(
        cls, url: str, *, clock: Callable[[], float] = time.time, pool_size: int = 2
    ) -> PostgresStore:
        """:meth:`PostgresDatabase.open` read-only."""
        return cls(PostgresDatabase.open(url, readonly=True, clock=clock, pool_size=pool_size))
