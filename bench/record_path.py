"""Where a SQLite dispatcher round's CPU goes, per delivery: each statement's thread CPU and
the WAL pages the round writes.

The outbox holds ``--sessions`` x ``--per-session`` deliveries to one endpoint (filled once
per tree, with that tree); then, per repetition and tree (``--tree name=src``, interleaved,
each in a child process with its ``src`` first on ``sys.path``), a copy of it goes through
:meth:`Outbox.dispatch_round` as the dispatcher calls it, in rounds of ``--batch``: the
previous round's deliveries recorded as delivered, the next ones read (``--busy``: those of
the round before, the last round's being in flight). Prints the thread CPU
per delivery of each statement (the first 60 characters of its text), the rest (Python: the
rows, the bodies' decoding), the total, and the WAL pages written per delivery (automatic
checkpoints off for the count: deterministic, whatever the load), then the medians.

    .venv/bin/python bench/record_path.py --tree before=/tmp/before/src --tree after=src
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: A WAL frame: a 24-byte header and a 4,096-byte page.
FRAME = 24 + 4096


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One repetition with the tree on ``sys.path``; the figures."""
    sys.path.insert(0, str(ROOT))
    from tests.support.backlog import fill, ok
    from tests.support.clock import T0, Clock
    from tests.support.store_rows import Ep

    from sessionhook.relay.domain.retry import Delivered
    from sessionhook.relay.store import AttemptRecord, Outbox, Round, Store

    base = args.work / "base.db"
    if not base.exists():
        store = Store.open(base, clock=Clock())
        store.endpoints.sync_endpoints([Ep("ep")])
        fill(store, args.sessions, args.per_session)
        store.close()
    db = args.work / "run.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    shutil.copy(base, db)
    store = Store.open(db, clock=Clock())
    conn = store.db.conn
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    spent: collections.Counter[str] = collections.Counter()

    class Rows:
        """A cursor's rows, fetched while the statement was timed."""

        def __init__(self, rows: list[Any]) -> None:
            self.rows = rows

        def fetchall(self) -> list[Any]:
            return self.rows

        def fetchone(self) -> Any:
            return self.rows[0] if self.rows else None

        def __iter__(self) -> Any:
            return iter(self.rows)

    class Timed:
        """The store's connection, each statement's thread CPU counted (rows included)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(conn, name)

        def execute(self, sql: Any, *params: Any) -> Any:
            began = time.thread_time()
            result: Any = Rows(conn.execute(sql, *params).fetchall())
            spent[str(sql)[:60]] += time.thread_time() - began
            return result

    store.db.conn = Timed()  # type: ignore[assignment]
    done, due, sending = 0, [], []
    began = time.thread_time()
    while done < args.deliveries:
        # --busy: the last round's deliveries are still being sent (busy), the round's
        # before them are recorded, as the dispatcher's rounds go with 2 x batch in flight.
        finished, sending = (sending, due) if args.busy else (due, [])
        records = [
            AttemptRecord(d.id, ok(), Delivered()) for d in sorted(finished, key=lambda d: d.key)
        ]
        caps = {"ep": args.batch}
        busy = [d.key for d in sending]
        _failing, due, _next, _active = Outbox.dispatch_round(
            store.outbox, Round(records, T0 + 1, args.batch, busy, (), caps)
        )
        done += len(records)
        if not due and not sending:
            break
    total = time.thread_time() - began
    store.db.conn = conn
    frames = Path(f"{db}-wal").stat().st_size / FRAME
    store.close()
    us = {sql: round(t / done * 1e6, 1) for sql, t in spent.most_common()}
    return {
        "deliveries": done,
        "total_us": round(total / done * 1e6, 1),
        "python_us": round((total - sum(spent.values())) / done * 1e6, 1),
        "wal_pages": round(frames / done, 3),
        "statements_us": us,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=SRC")
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--per-session", type=int, default=60)
    parser.add_argument("--deliveries", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument(
        "--busy",
        action="store_true",
        help="2 x batch in flight: each round records the deliveries of the round before "
        "the last, the last one's still busy (as the dispatcher's rounds go)",
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        sys.path.insert(0, str(args.child))
        print(json.dumps(child(args)))
        return
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree]
    trees = trees or [("current", ROOT / "src")]
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="sessionhook-record-") as tmp:
        for rep in range(args.reps):
            for name, src in trees if rep % 2 == 0 else trees[::-1]:
                work = Path(tmp) / name
                work.mkdir(exist_ok=True)
                env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                env["PYTHONPATH"] = str(src)
                out = subprocess.run(
                    [sys.executable, __file__, "--child", str(src), "--work", str(work)]
                    + [f"--{k}={getattr(args, k.replace('-', '_'))}" for k in _SIZES]
                    + (["--busy"] if args.busy else []),
                    capture_output=True,
                    text=True,
                    env=env,
                    check=True,
                ).stdout
                row = json.loads(out)
                row["load"] = round(os.getloadavg()[0], 2)
                results.setdefault(name, []).append(row)
                print(json.dumps({"rep": rep + 1, "tree": name, **row}), flush=True)
    for name, rows in results.items():
        statements: dict[str, float] = {}
        for sql in rows[0]["statements_us"]:
            statements[sql] = statistics.median(r["statements_us"].get(sql, 0.0) for r in rows)
        summary = {
            key: statistics.median(r[key] for r in rows)
            for key in ("total_us", "python_us", "wal_pages")
        }
        print(json.dumps({"median": name, **summary, "statements_us": statements}, indent=1))


#: The options a child is given again.
_SIZES = ("sessions", "per-session", "deliveries", "batch")


if __name__ == "__main__":
    main()
