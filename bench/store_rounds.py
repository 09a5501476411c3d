"""The store's share of delivering, on SQLite and on PostgreSQL, in one run.

A dispatcher round against the store alone, no HTTP: claim what is due (at most
``--batch``), record every attempt as delivered (one transaction, as the dispatcher's group
commit), ask when the next one is due; until ``--deliveries`` are recorded. The outbox
holds ``--sessions`` x ``--per-session`` deliveries to one endpoint; on PostgreSQL the
store is a registered replica, so it claims what it reads (as every replica does), on
SQLite it is the exclusive one (as the daemon is). PostgreSQL is a throwaway cluster
(``tests/support/pg.py``) on 127.0.0.1, with its default ``synchronous_commit``.

Prints, per engine and repetition, deliveries per second (wall) and the CPU per delivery
of this process (the server's CPU is not in it), then the medians and the
PostgreSQL/SQLite ratio of the same repetitions. Engines alternate within a repetition.

    .venv/bin/python bench/store_rounds.py                 # 5 repetitions
    /other/tree/.venv/bin/python bench/store_rounds.py     # another tree's store, same rounds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.backlog import fill, ok  # noqa: E402
from tests.support.clock import T0, Clock  # noqa: E402
from tests.support.pg import Cluster  # noqa: E402
from tests.support.store_rows import Ep  # noqa: E402

from sessionhook.relay.domain.retry import Delivered  # noqa: E402
from sessionhook.relay.store import AttemptRecord, PostgresStore, Store  # noqa: E402


def rounds(store: Store | PostgresStore, total: int, batch: int) -> tuple[int, float, float]:
    done = 0
    wall, cpu = time.perf_counter(), time.process_time()
    while done < total:
        due = sorted(store.outbox.due_deliveries(T0 + 1, batch), key=lambda d: d.key)
        if not due:
            break
        store.outbox.record_attempts([AttemptRecord(d.id, ok(), Delivered()) for d in due])
        store.outbox.next_due_at(after=T0 + 1)
        done += len(due)
    return done, time.perf_counter() - wall, time.process_time() - cpu


def prepared(store: Store | PostgresStore, args: argparse.Namespace, *, exclusive: bool) -> None:
    store.endpoints.sync_endpoints([Ep("ep")])
    fill(store, args.sessions, args.per_session)
    store.leases.register_replica(
        "bench0", host="bench", pid=os.getpid(), now=T0, lease=1e9, exclusive=exclusive
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--per-session", type=int, default=20)
    parser.add_argument("--deliveries", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {"sqlite": [], "postgresql": []}
    cluster = Cluster()
    cluster.start()
    try:
        with tempfile.TemporaryDirectory(prefix="sessionhook-rounds-") as tmp:
            for rep in range(args.reps):
                for engine in ("sqlite", "postgresql"):
                    if engine == "sqlite":
                        store: Store | PostgresStore = Store.open(
                            Path(tmp) / f"r{rep}.db", clock=Clock()
                        )
                    else:
                        store = PostgresStore.open(
                            cluster.url(cluster.create_database()), clock=Clock()
                        )
                    try:
                        prepared(store, args, exclusive=engine == "sqlite")
                        n, wall, cpu = rounds(store, args.deliveries, args.batch)
                    finally:
                        store.close()
                    row = {"per_s": round(n / wall, 1), "cpu_ms": round(cpu / n * 1000, 3)}
                    results[engine].append((row["per_s"], row["cpu_ms"]))
                    load = round(os.getloadavg()[0], 2)
                    print(json.dumps({"rep": rep + 1, "engine": engine, **row, "load": load}))
    finally:
        cluster.destroy()
    ratios = [p[0] / s[0] for s, p in zip(results["sqlite"], results["postgresql"], strict=True)]
    print(
        json.dumps(
            {
                "median_per_s": {k: statistics.median(r[0] for r in v) for k, v in results.items()},
                "median_cpu_ms": {
                    k: statistics.median(r[1] for r in v) for k, v in results.items()
                },
                "median_ratio_pg_sqlite": round(statistics.median(ratios), 3),
                "reps": args.reps,
            }
        )
    )


if __name__ == "__main__":
    main()
