"""``sessionhook store copy``: move an archive to another store (SQLite to PostgreSQL),
every row with its ids (:mod:`sessionhook.relay.store.copying`), the source read-only.

Neither side may be live: a SQLite store held by a daemon's lock, or a PostgreSQL store
with a replica alive, is refused (exit 2); the copy holds a SQLite side's lock until it is
done. Exit statuses: 0 copied and verified; 1 failed or incomplete; 2 a usage problem.
"""

from __future__ import annotations

import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click

from ..redact import redact_userinfo
from ..wording import counted
from . import cli
from ._output import CliError


@cli.group("store")
def store_group() -> None:
    """Operations on a whole store (the SQLite file or PostgreSQL database): copy."""


def _is_url(spec: str) -> bool:
    return spec.startswith(("postgresql://", "postgres://"))


def _same_store(a: str, b: str) -> bool:
    if a == b:
        return True
    if _is_url(a) or _is_url(b):
        return False
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def _claim_idle(spec: str, store: Any, side: str) -> Any:
    """Refuse a live store (see the module's docstring) with one line, exit 2; for a SQLite
    store, return its daemon lock, held by this process until it is released."""
    from sessionhook.relay import ops

    if _is_url(spec):
        now = time.time()
        running = ops.live_replicas(store, now)
        if running:
            shown = ", ".join(f"{r.id}@{r.host}:{r.pid}" for r in running)
            raise CliError(
                f"the {side} database {redact_userinfo(spec)} has "
                f"{counted(len(running), 'running replica')} ({shown}): stop "
                f"{'it' if len(running) == 1 else 'them'} first",
                hint="a replica goes on delivering what the copy hands to the new store",
                exit_code=2,
            )
        return None
    from sessionhook.relay.ops import StoreError, StoreLockedError, acquire_daemon_lock

    path = Path(spec).expanduser()
    try:
        return acquire_daemon_lock(path)
    except StoreLockedError as exc:
        holder = f"pid {exc.pid}" if exc.pid is not None else "pid unknown"
        raise CliError(
            f"a daemon is running on the {side} store {path} ({holder}): stop it first",
            hint="sudo systemctl stop sessionhook",
            exit_code=2,
        ) from None
    except StoreError as exc:
        raise CliError(f"cannot lock the {side} store: {exc}", exit_code=2) from None


@store_group.command("copy")
@click.option("--from", "source", required=True, metavar="PATH|URL", help="The store to read.")
@click.option("--to", "target", required=True, metavar="URL|PATH", help="The store to fill.")
@click.option(
    "--replace",
    is_flag=True,
    help="Delete the target's rows first (refused without it when the target holds any).",
)
def copy_command(source: str, target: str, replace: bool) -> None:
    """Copy every session, activity, event, delivery and attempt, the endpoints' state and
    the relay's bookkeeping from one store to another, ids and webhook-ids unchanged.

    Typically --from /var/lib/sessionhook/sessionhook.db --to postgresql://relay@db/relay,
    with the daemon stopped; then point store.url at the target and start the replicas.
    Progress goes to stderr; the counts of every table are compared at the end.
    """
    from sessionhook.relay import ops
    from sessionhook.relay.ops import CopyError, StoreError

    if _same_store(source, target):
        raise CliError("--from and --to are the same store", exit_code=2)
    shown_target = redact_userinfo(target)
    with ExitStack() as held:
        try:
            src = ops.open_copy_side(source, writable=False)
        except StoreError as exc:
            raise CliError(f"cannot read the source: {exc}", exit_code=2) from None
        held.callback(src.close)
        if (lock := _claim_idle(source, src, "source")) is not None:
            held.callback(lock.release)
        if not _is_url(target) and (lock := _claim_idle(target, None, "target")) is not None:
            held.callback(lock.release)  # before the target is opened: no daemon starts on it
        try:
            dst = ops.open_copy_side(target, writable=True)
        except StoreError as exc:
            raise CliError(f"cannot open the target: {exc}", exit_code=1) from None
        held.callback(dst.close)
        if _is_url(target):
            _claim_idle(target, dst, "target")
        try:
            started = time.monotonic()
            report = ops.copy_stores(src, dst, replace=replace, progress=_Progress())
        except CopyError as exc:
            code = 2 if "not empty" in str(exc) else 1
            raise CliError(str(exc), exit_code=code) from None
        except StoreError as exc:
            raise CliError(f"the copy failed: {exc}") from None
    took = time.monotonic() - started
    click.echo(
        f"copied {counted(report.rows, 'row')} from {source} to {shown_target} in {took:.1f} s "
        "(counts verified)"
    )
    for table, rows in report.tables.items():
        click.echo(f"  {table:<20} {rows}")


class _Progress:
    """Progress on stderr: each table as it starts and ends, and at most once a second
    in between (a long copy shows it moves)."""

    def __init__(self) -> None:
        self._last = 0.0

    def __call__(self, table: str, done: int, total: int) -> None:
        now = time.monotonic()
        if 0 < done < total and now - self._last < 1.0:
            return
        self._last = now
        percent = 100.0 if not total else 100.0 * done / total
        print(f"copy: {table} {done}/{total} ({percent:.0f} %)", file=sys.stderr, flush=True)
