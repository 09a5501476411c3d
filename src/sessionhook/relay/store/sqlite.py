"""The SQLite backend: :class:`SqliteDatabase` (``store.path``), one file on a local disk,
and :class:`Store`, the store on it: the file created ``0600``, its pragmas (WAL,
``synchronous=NORMAL``: ``kill -9`` loses nothing committed, a power loss at most the last
commits, which are polled or sent again), ``BEGIN IMMEDIATE`` transactions, SQLite's
errors mapped to :class:`~.errors.StoreFullError` / :class:`~.errors.StoreUnwritableError`.
One daemon per file (:mod:`.lock`); operator commands read a WAL snapshot beside it
(``mode=ro``). See ``docs/store.md``, "Two backends, one query text".
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

from .core import StoreCore
from .dialect import Connection, WakeSource, first_value, refuse_readonly
from .errors import StoreError, StoreFullError, StoreUnwritableError
from .migrations import SQLITE, check_current, migrate, pending

BUSY_TIMEOUT_MS = 10_000


class _Row(sqlite3.Row):
    """A result row read by column name (``row["status"]``) or by position, that equals,
    hashes, sorts and prints as the tuple of its values (as the PostgreSQL store's rows do)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return tuple(self) == other

    def __lt__(self, other: object) -> bool:
        return tuple(self) < (tuple(other) if isinstance(other, sqlite3.Row) else other)  # type: ignore[operator]

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


class SqliteDatabase:
    """One SQLite relay database, opened with :meth:`open` or :meth:`open_readonly` (the
    :class:`~.dialect.Database` the queries run on)."""

    #: One writer connection: the store's calls run one at a time.
    concurrency = 1
    #: One daemon per file (the daemon lock, :mod:`.lock`): a replica here has no rival.
    exclusive = True
    #: A column keeps the text or the blob it was given.
    binary_bodies = False
    #: A failing statement fails its transaction, which :meth:`tx` rolls back whole: no
    #: statement journal to undo the statement alone (see ``Database.update_many``).
    update_many = "UPDATE OR FAIL"
    #: No ``UPDATE`` in a ``WITH`` clause (see ``Database.claims_in_one_statement``).
    claims_in_one_statement = False

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        *,
        readonly: bool,
        clock: Callable[[], float] = time.time,
    ) -> None:
        #: The one connection, reads and writes (a plain attribute: tests wrap it); rows
        #: are read by column name (``row["status"]``).
        conn.row_factory = _Row
        self.conn = conn
        self.path: Path = path
        self.location = str(path)
        self.readonly = readonly
        self.clock = clock

    # ----------------------------------------------------------------- opening

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time
    ) -> SqliteDatabase:
        """Open (creating the directory and file if needed) and migrate the database.

        Raises :class:`StoreError` when the directory cannot be created or written, when the
        file is not a SQLite database, or is one that sessionhook did not create.
        """
        db_path = Path(path)
        parent = db_path.parent
        try:
            parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create directory {parent}: {exc.strerror or exc}", path=db_path
            ) from None
        if not os.access(parent, os.W_OK | os.X_OK):
            raise StoreError(
                f"directory {parent} is not writable (SQLite creates {db_path.name}-wal and "
                f"{db_path.name}-shm next to the database)",
                path=db_path,
            )
        if db_path.exists() and not os.access(db_path, os.R_OK | os.W_OK):
            raise StoreError(f"{db_path} is not readable and writable", path=db_path)
        created = _create_private(db_path)
        # A full disk: an existing store opens again once space returns (the daemon waits);
        # an empty file just created is not a store: leave nothing half-made.
        with _opening(db_path, db_path, lambda exc: f"{db_path}: {exc}", created) as conn:
            # Before anything changes the file: a foreign or newer database is left exactly
            # as it was.
            pending(conn, SQLITE, str(db_path), db_path)
            mode = _wal(conn)
            if str(mode).lower() != "wal":
                raise StoreError(f"{db_path}: cannot use WAL journal (got {mode})", path=db_path)
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            # Truncate the WAL file after checkpoints instead of leaving it at its peak size.
            conn.execute(f"PRAGMA journal_size_limit = {64 * 1024 * 1024}")
            # A trigger's writes may fire it again, as on PostgreSQL.
            conn.execute("PRAGMA recursive_triggers = ON")
            migrate(conn, SQLITE, str(db_path), db_path)
        return cls(conn, db_path, readonly=False, clock=clock)

    @classmethod
    def open_readonly(
        cls, path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time
    ) -> SqliteDatabase:
        """Open an existing database read-only (``mode=ro``), e.g. while the daemon runs.

        Write methods then raise :class:`StoreError`. The schema must be current.
        """
        db_path = Path(path)
        if not db_path.is_file():
            raise StoreError(f"no database at {db_path}", path=db_path)
        uri = f"file:{urllib.parse.quote(str(db_path.absolute()))}?mode=ro"

        # Even a reader needs room for the -shm index.
        def full(exc: BaseException) -> str:
            return f"{db_path}: the disk is full ({exc}); free some space to read it"

        with _opening(uri, db_path, full) as conn:
            conn.execute("PRAGMA query_only = ON")
            check_current(conn, SQLITE, str(db_path), db_path)
        return cls(conn, db_path, readonly=True, clock=clock)

    def unwritable_error(self, exc: BaseException) -> StoreUnwritableError | None:
        """A full disk (growing the ``-shm`` index on a read) or a read-only file."""
        if not isinstance(exc, sqlite3.Error | OSError):
            return None
        if is_full_error(exc):
            return StoreFullError(f"{self.path}: {exc}", path=self.path)
        if is_readonly_error(exc):
            return StoreUnwritableError(f"{self.path}: {exc}", path=self.path)
        return None

    def close(self) -> None:
        """Close the connection (a checkpoint folds the WAL into the database file)."""
        self.conn.close()

    # ----------------------------------------------------------------- what differs

    def lock_queues(self, c: Connection, delivery_ids: Sequence[int]) -> None:
        """Nothing: one writer (see :meth:`~.dialect.Database.lock_queues`)."""

    def lock_queue_keys(self, c: Connection, keys: Iterable[tuple[str, str]]) -> None:
        """Nothing: one writer (see :meth:`~.dialect.Database.lock_queues`)."""

    def skip_locked(self, alias: str) -> str:
        """Nothing: one writer, no rival transaction to skip."""
        return ""

    def for_update(self) -> str:
        """Nothing: one writer, no rival transaction to wait for."""
        return ""

    def notify_outbox(self, c: Connection) -> None:
        """Nothing: one process, whose poller wakes its dispatcher directly."""

    def wake_source(self) -> WakeSource | None:
        """None: no other process writes this file."""
        return None

    def table_names(self) -> list[str]:
        """The tables of ``sqlite_master`` but SQLite's own."""
        rows = self.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        ).fetchall()
        return sorted(str(r["name"]) for r in rows)

    def advance_ids(self, tables: Sequence[str]) -> None:
        """Nothing: AUTOINCREMENT follows the ids inserted."""

    # ----------------------------------------------------------------- transactions

    def one_connection(self) -> AbstractContextManager[None]:
        """Nothing to do: one connection, and statements are calls, not round trips."""
        return nullcontext()

    @contextmanager
    def tx(self, serialized: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction; the write lock is taken up front (no upgrade deadlock).
        SQLite has one writer: every transaction is serialized (``serialized`` is ignored).

        A write that fails for lack of space raises :class:`StoreFullError` with nothing
        committed and the connection usable again (a failed ``COMMIT`` leaves SQLite's
        transaction open: it is rolled back here, or every later ``BEGIN`` would fail).
        """
        refuse_readonly(self)
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                # Some errors (SQLITE_FULL, IOERR...) already rolled back; do not mask them.
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except (sqlite3.Error, OSError) as exc:
            mapped = self.unwritable_error(exc)
            if mapped is not None:
                raise mapped from exc
            raise


#: SQLITE_IOERR_SHMSIZE: no room for the ``-shm`` wal-index (a full filesystem when a WAL
#: database is opened, or when its index grows).
_FULL_CODES = {sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR_SHMSIZE}
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}


def is_full_error(exc: BaseException) -> bool:
    """Whether ``exc`` means the disk (or quota) is full: retry the write later."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        return code in _FULL_CODES or (code is None and "database or disk is full" in str(exc))
    return isinstance(exc, OSError) and exc.errno in _NO_SPACE


def is_readonly_error(exc: BaseException) -> bool:
    """Whether ``exc`` means the store cannot be written for now (read-only file or mount,
    ``query_only``): retry the write later rather than give up the daemon."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF == 8


@contextmanager
def _opening(
    target: str | Path,
    db_path: Path,
    full: Callable[[BaseException], str],
    created: bool = False,
) -> Iterator[sqlite3.Connection]:
    """A connection to ``target`` (the file, or a ``file:`` URI) with its busy timeout, for
    the block that prepares it; closed when the block raises. A full disk raises
    :class:`StoreFullError` with the message ``full(error)``, the file removed again when it
    was ``created`` empty; any other database error is "not a usable SQLite database"."""
    try:
        conn = sqlite3.connect(
            target, uri=isinstance(target, str), isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open {db_path}: {exc}", path=db_path) from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        yield conn
    except sqlite3.DatabaseError as exc:
        conn.close()
        if is_full_error(exc):
            if created:
                _remove_empty(db_path)
            raise StoreFullError(full(exc), path=db_path) from None
        raise StoreError(
            f"{db_path} is not a usable SQLite database: {exc}", path=db_path
        ) from None
    except BaseException:
        conn.close()
        raise


def _wal(conn: sqlite3.Connection) -> object:
    """``PRAGMA journal_mode = WAL``, asked again while another connection holds the lock
    it needs (up to :data:`BUSY_TIMEOUT_MS`): SQLite answers ``SQLITE_BUSY`` at once there,
    without the busy timeout, when several processes open a new file together. The mode
    the database is in afterwards."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            return first_value(conn, "PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as exc:
            busy = getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY
            if not busy or time.monotonic() > deadline:
                raise
        time.sleep(0.01)


def _remove_empty(db_path: Path) -> None:
    for path in (db_path, Path(f"{db_path}-wal"), Path(f"{db_path}-shm")):
        with contextlib.suppress(OSError):
            if path.stat().st_size == 0:
                path.unlink()


def _create_private(db_path: Path) -> bool:
    """Create an empty database file ``0600`` unless one exists; return whether it did.

    SQLite would create it ``0644`` (less the umask), readable by every local user, and it
    holds the whole archive. It gives the ``-wal`` and ``-shm`` files it creates later the
    mode of the database file, so creating this one ``0600`` covers all three.
    """
    try:
        fd = os.open(db_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False
    except OSError as exc:
        error = StoreFullError if is_full_error(exc) else StoreError
        raise error(f"cannot create {db_path}: {exc.strerror or exc}", path=db_path) from None
    os.close(fd)
    return True


class Store(StoreCore):
    """A relay store in a SQLite file. Open with :meth:`open` or :meth:`open_readonly`; the
    daemon goes through :class:`~.aio.AsyncStore`."""

    db: SqliteDatabase

    def __init__(self, db: SqliteDatabase) -> None:
        super().__init__(db)
        self.db = db

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time) -> Store:
        """:meth:`SqliteDatabase.open`: open (creating the directory and file if needed) and
        migrate the database."""
        return cls(SqliteDatabase.open(path, clock=clock))

    @classmethod
    def open_readonly(
        cls, path: str | os.PathLike[str], *, clock: Callable[[], float] = time.time
    ) -> Store:
        """:meth:`SqliteDatabase.open_readonly`: an existing database, read-only."""
        return cls(SqliteDatabase.open_readonly(path, clock=clock))
