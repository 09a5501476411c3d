"""A throwaway PostgreSQL cluster for the tests: ``initdb`` + ``pg_ctl`` in a temporary
directory, on a free 127.0.0.1 port, its unix socket inside that directory.

PostgreSQL refuses to run as root; CI runs as root, so then the cluster is created and run
as an unprivileged user (``nobody``) through ``runuser``, its directory chowned to it.
``fsync`` is off (a test cluster need not survive a power cut), but ``synchronous_commit``
stays on: a commit reaches the operating system before it is acknowledged, so a crash of
the server (``pg_ctl stop -m immediate``, as the restart test does) loses nothing that was
committed, as in production. With it off, an acknowledged commit could vanish with the
crash and the relay would rightly re-archive an activity after a later one. Passwords are
checked on TCP (``scram-sha-256``) so a wrong password can be tested; the superuser's is
:data:`PASSWORD`.

Each test gets a fresh database copied from a migrated template (``CREATE DATABASE ...
TEMPLATE``, a file copy: far faster than migrating each time), dropped afterwards.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg

from tests.support.loopback import free_port

PASSWORD = "test-secret-pw"
USER = "postgres"
#: The unprivileged account the cluster runs as when the tests run as root.
RUN_AS = "nobody"
#: The migrated database each test's database is copied from (``conftest.pg_cluster``).
TEMPLATE = "sessionhook_template"


def find_bin(name: str) -> Path | None:
    """A PostgreSQL server binary: the newest ``/usr/lib/postgresql/*/bin``, else PATH."""
    roots = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    for root in reversed(roots):
        if (root / name).is_file():
            return root / name
    found = shutil.which(name)
    return Path(found) if found else None


class Cluster:
    """One running cluster; :meth:`start` / :meth:`stop` (also used to restart it)."""

    def __init__(self) -> None:
        initdb, pg_ctl = find_bin("initdb"), find_bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            raise FileNotFoundError("initdb/pg_ctl not found (install the postgresql package)")
        self.initdb, self.pg_ctl = initdb, pg_ctl
        self.root = Path(tempfile.mkdtemp(prefix="sessionhook-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.log = self.root / "server.log"
        self.port = free_port()
        self._names = itertools.count(1)
        self.sockets.mkdir()
        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if os.geteuid() == 0:
            shutil.chown(self.root, RUN_AS)
            for path in (self.sockets, pwfile):
                shutil.chown(path, RUN_AS)
        self._run(
            str(self.initdb),
            "-D",
            str(self.data),
            "-U",
            USER,
            "--pwfile",
            str(pwfile),
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-E",
            "UTF8",
            "--no-locale",
            "--no-sync",
        )

    def _run(self, *argv: str) -> None:
        if os.geteuid() == 0:
            argv = ("runuser", "-u", RUN_AS, "--", *argv)
        subprocess.run(argv, check=True, cwd=self.root, capture_output=True, text=True, timeout=120)

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = (
            f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c full_page_writes=off "
            "-c max_connections=200 -c shared_buffers=32MB"
        )
        try:
            self._run(
                str(self.pg_ctl),
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "start",
            )
        except subprocess.CalledProcessError as exc:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {exc.stderr}\n{log}") from None

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate``: as a crash would)."""
        with contextlib.suppress(subprocess.CalledProcessError, FileNotFoundError):
            self._run(str(self.pg_ctl), "-D", str(self.data), "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        """Stop the server and remove its directory."""
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, dbname: str = "postgres", *, password: str = PASSWORD) -> str:
        """A ``postgresql://`` URL of a database over TCP, with the password."""
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{dbname}"

    @contextlib.contextmanager
    def admin(self) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            yield conn

    def create_database(self, template: str | None = None) -> str:
        """A new empty database (or a copy of ``template``); returns its name."""
        name = f"t{next(self._names)}"
        clause = f' TEMPLATE "{template}"' if template else ""
        with self.admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"{clause}'.encode())
        return name

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
