"""A new SQLite store made by copying a migrated one (the ``migrated_template`` fixture of
conftest.py): running the eleven migrations on each test's new store was most of what
opening it cost (~25 ms of CPU and a checkpoint's fsync each).

:class:`Template` migrates one database per worker with the real runner, then stands in for
:func:`~sessionhook.relay.store.migrations.migrate` in the SQLite engine: a database that
lacks every migration (a new, empty one) gets the template's pages through SQLite's backup
API, in one transaction; any other (an old store, a partly migrated one, a test's own list
of migrations) goes to the real runner. Everything else ``Store.open`` does (the file
created ``0600``, the refusals, WAL, the pragmas) runs as it does in the daemon. A test about
the migrations themselves is marked ``real_migrations``: it runs them all.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sessionhook.relay.store import Store, migrations
from sessionhook.relay.store.migrations import SQLITE, Engine, Executes


class Template:
    """One worker's migrated database, copied into each new one."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "template.db"
        self.real = migrations.migrate
        self.original = migrations.MIGRATIONS
        Store.open(self.path).close()  # by the real runner: the template is current

    def migrate(
        self, conn: Executes, engine: Engine, location: str, path: Path | None = None
    ) -> None:
        """The template's pages for a new database, else the real runner."""
        if (
            engine is SQLITE
            and migrations.MIGRATIONS is self.original
            and isinstance(conn, sqlite3.Connection)
            and len(migrations.pending(conn, engine, location, path)) == len(self.original)
        ):
            source = sqlite3.connect(self.path)
            try:
                source.backup(conn)
                return
            except sqlite3.Error:
                pass  # a full disk, a lock: the real runner meets it and says what it is
            finally:
                source.close()
        self.real(conn, engine, location, path)
