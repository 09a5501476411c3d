"""One daemon per SQLite store: :func:`acquire_daemon_lock` takes an exclusive ``flock(2)``
on ``<database>.lock`` and writes the holder's PID into it (two daemons on one database
would deliver every event twice). The kernel releases it when the process ends, however it
ends, so a stale lock never blocks a restart. Only the daemon takes it; operator commands
read or write through SQLite's own locking. ``flock`` holds on a local filesystem, where a
SQLite store must live anyway; a PostgreSQL store takes none (replicas share it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

from .errors import StoreError


class StoreLockedError(StoreError):
    """Another process holds the daemon lock of the store; ``pid`` is its PID if known."""

    def __init__(self, message: str, *, path: Path, pid: int | None) -> None:
        super().__init__(message, path=path)
        self.pid = pid


def lock_path(db_path: Path) -> Path:
    """The lock file of the database at ``db_path``: ``<name>.lock`` beside it."""
    return db_path.with_name(db_path.name + ".lock")


class DaemonLock:
    """A held daemon lock; :meth:`release` (or process exit) lets the next daemon in."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    def release(self) -> None:
        """Release the lock (the file stays: removing it would race with a new holder)."""
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None

    def __enter__(self) -> DaemonLock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _holder(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def acquire_daemon_lock(db_path: str | os.PathLike[str]) -> DaemonLock:
    """Take the daemon lock of the store at ``db_path`` without waiting.

    Raises :class:`StoreLockedError` naming the store and the holder's PID when another
    process holds it, and :class:`StoreError` when the lock file cannot be created. The
    file is created ``0600``, beside the database (its directory is created ``0700`` if
    missing).
    """
    db = Path(db_path)
    path = lock_path(db)
    try:
        db.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StoreError(
            f"cannot create the lock file {path}: {exc.strerror or exc}", path=db
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        pid = _holder(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            holder = f"pid {pid}" if pid is not None else "pid unknown"
            raise StoreLockedError(
                f"another sessionhook holds the store {db} ({holder}); "
                "one daemon per store (operator commands still work)",
                path=db,
                pid=pid,
            ) from None
        raise StoreError(f"cannot lock {path}: {exc.strerror or exc}", path=db) from None
    # The PID is for the message above only; a full disk must not stop the daemon here
    # (the lock itself needs no space), so a failed write is ignored.
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return DaemonLock(fd, path)
