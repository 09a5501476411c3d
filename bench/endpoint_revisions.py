"""What seeing endpoints created at run time costs a dispatcher, and how soon another
replica sees one, on SQLite and PostgreSQL in one run.

1. The per-round read: the dispatcher reads the active endpoints once per round, and the
   newest revision of any definition with them (``active_revisions``: a scalar subquery on
   the revisions' index). Measured against the names alone (``active_endpoints``) and
   against the names plus a separate version query (the alternative: a version row read
   each round), with 20 endpoints, per call (median of ``--calls`` calls, repeated
   ``--reps`` times).
2. The pickup on PostgreSQL: a replica's dispatcher runs idle (nothing to send); another
   handle creates an endpoint; the time until the dispatcher's settings hold it, woken by
   the store's notification (the daemon's LISTEN), and without it (its one-second timer).

    .venv/bin/python bench/endpoint_revisions.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.pg import Cluster  # noqa: E402
from tests.support.store_rows import Ep  # noqa: E402

from sessionhook.relay.config import Config  # noqa: E402
from sessionhook.relay.delivery.dispatcher import DeliverySettings, Dispatcher  # noqa: E402
from sessionhook.relay.ops import endpoint_edits as edits  # noqa: E402
from sessionhook.relay.store import AsyncStore, PostgresStore, Store, StoreCore  # noqa: E402


def per_call(fn: Callable[[], object], calls: int) -> float:
    """Median microseconds of one call of ``fn``."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def reads(store: StoreCore, calls: int, reps: int) -> dict[str, float]:
    store.endpoints.sync_endpoints([Ep(f"ep{n}") for n in range(20)])
    conn = store.db.conn

    def with_version_row() -> None:
        store.outbox.active_endpoints()
        conn.execute("SELECT value FROM meta WHERE key = 'endpoints_version'").fetchall()

    variants = {
        "names alone": store.outbox.active_endpoints,
        "names + newest revision": store.outbox.active_revisions,
        "names + a version row": with_version_row,
    }
    out: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(reps):
        for name, fn in variants.items():
            out[name].append(per_call(fn, calls))
    return {k: statistics.median(v) for k, v in out.items()}


async def pickup(url: str, notified: bool) -> float:
    """Seconds from a create committed by another handle to the dispatcher holding it."""
    config = Config.model_validate({})
    astore = AsyncStore(PostgresStore.open(url))
    writer = PostgresStore.open(url)
    dispatcher = Dispatcher(
        astore, httpx.AsyncClient(), DeliverySettings.from_config(config), max_wait=1.0
    )
    name = f"ep-{time.monotonic_ns()}"
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.run)
            listen = astore.wake_source()
            if notified and listen is not None:
                tg.start_soon(listen, dispatcher.wake)
            await anyio.sleep(1.5)  # the listener in place, the dispatcher idle
            definition, secret = edits.define_endpoint(
                config, name, {"url": "https://hooks.example.com/x"}
            )
            start = time.perf_counter()
            await anyio.to_thread.run_sync(
                edits.create_endpoint, writer, config, definition, secret
            )
            # A poll of the settings (a bench: 1 ms resolution is enough).
            while name not in dispatcher.settings.endpoints:  # noqa: ASYNC110
                await anyio.sleep(0.001)
            took = time.perf_counter() - start
            tg.cancel_scope.cancel()
        return took
    finally:
        writer.close()
        await astore.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--pickups", type=int, default=5)
    args = parser.parse_args()
    cluster = Cluster()
    cluster.start()
    try:
        with tempfile.TemporaryDirectory() as tmp, Store.open(Path(tmp) / "bench.db") as sqlite:
            for name, us in reads(sqlite, args.calls, args.reps).items():
                print(f"sqlite      {name:26s} {us:8.1f} us per round")
        with cluster.admin() as conn:
            conn.execute(b'CREATE DATABASE "bench"')
        url = cluster.url("bench")
        with PostgresStore.open(url) as pg:
            for name, us in reads(pg, args.calls, args.reps).items():
                print(f"postgresql  {name:26s} {us:8.1f} us per round")
        for notified in (True, False):
            took = [anyio.run(pickup, url, notified) for _ in range(args.pickups)]
            label = "notified" if notified else "timer only"
            print(
                f"postgresql  pickup, {label:10s}  median {statistics.median(took) * 1000:7.1f} ms"
                f"  (runs: {', '.join(f'{t * 1000:.0f}' for t in took)})"
            )
    finally:
        cluster.destroy()


if __name__ == "__main__":
    main()
