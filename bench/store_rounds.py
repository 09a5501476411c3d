"""The store's share of delivering, on SQLite and on PostgreSQL, in one run.

The dispatcher's rounds against the store alone, no HTTP (``Outbox.dispatch_round``, as the
daemon calls it): ``--in-flight`` deliveries kept in flight; each round records the oldest
half as delivered (one transaction, as the dispatcher's group commit) and claims as many
due ones, until ``--deliveries`` are recorded. The outbox holds ``--sessions`` x
``--per-session`` deliveries to one endpoint; on PostgreSQL the store is a registered
replica, so it claims what it reads (as every replica does), on SQLite it is the exclusive
one (as the daemon is). PostgreSQL is a throwaway cluster (``tests/support/pg.py``) on
127.0.0.1, with its default ``synchronous_commit``; ``--rtt-ms`` puts a proxy delaying
each direction by half of it between the store and the server (a database on another
host: a round then waits for the server as many times as it has round trips).

Prints, per tree, engine and repetition, deliveries per second (wall), the CPU per delivery
of the process running the rounds (the proxy's thread excluded) and, on PostgreSQL, of the
server (every process of the cluster, from ``/proc``), then the medians and the
PostgreSQL/SQLite ratio of the same repetitions. Trees and engines alternate within a
repetition; each tree runs in a child process of its own (``--tree name=path/to/src``,
several allowed: the tree under test and its baseline in one run).

    .venv/bin/python bench/store_rounds.py                  # this tree, 5 repetitions
    .venv/bin/python bench/store_rounds.py --tree after=src --tree before=/tmp/before/src \\
        --engine postgresql --rtt-ms 1 --reps 3
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _bench_servers import server_cpu_seconds  # noqa: E402
from tests.support.pg import Cluster  # noqa: E402

ENGINES = ("sqlite", "postgresql")


def rounds(store: object, total: int, in_flight: int) -> tuple[int, float, float]:
    """The dispatcher's rounds until ``total`` are recorded: (recorded, wall s, thread CPU s)."""
    from tests.support.backlog import ok
    from tests.support.clock import T0

    from sessionhook.relay.domain.retry import Delivered
    from sessionhook.relay.store import AttemptRecord
    from sessionhook.relay.store.outbox import Round

    outbox = store.outbox  # type: ignore[attr-defined]
    flying: collections.deque[object] = collections.deque()
    done = 0
    wall, cpu = time.perf_counter(), time.thread_time()
    while done < total:
        finished = sorted(
            (flying.popleft() for _ in range(min(in_flight // 2, len(flying)))),
            key=lambda d: d.key,  # type: ignore[attr-defined]
        )
        records = [AttemptRecord(d.id, ok(), Delivered()) for d in finished]  # type: ignore[attr-defined]
        busy = {d.key for d in flying}  # type: ignore[attr-defined]
        free = in_flight - len(busy)
        _failing, due, _next, _active = outbox.dispatch_round(
            Round(records, T0 + 1, free, busy, (), {"ep": free})
        )
        done += len(finished)
        flying.extend(due)
        if not flying:
            break
    return done, time.perf_counter() - wall, time.thread_time() - cpu


def delaying_proxy(port: int, delay: float) -> int:
    """A TCP proxy to 127.0.0.1:``port`` holding every chunk ``delay`` seconds in each
    direction (in order), in a thread of its own; returns its port."""
    listener = socket.create_server(("127.0.0.1", 0))

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                at, data = await queue.get()
                if not data:
                    writer.close()
                    return
                await asyncio.sleep(max(0.0, at - loop.time()))
                writer.write(data)

        sender = asyncio.ensure_future(send())
        while True:
            data = await reader.read(65536)
            queue.put_nowait((loop.time() + delay, data))
            if not data:
                break
        await sender

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        for w in (writer, up_writer):
            w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(
            pump(reader, up_writer), pump(up_reader, writer), return_exceptions=True
        )

    async def serve() -> None:
        server = await asyncio.start_server(handle, sock=listener)
        await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(serve()), daemon=True).start()
    return int(listener.getsockname()[1])


def child(args: argparse.Namespace) -> None:
    """One engine's rounds on this process's tree; prints one JSON line."""
    from tests.support.backlog import fill
    from tests.support.clock import T0, Clock
    from tests.support.store_rows import Ep

    from sessionhook.relay.store import PostgresStore, Store

    if args.url:
        url = args.url
        if args.rtt_ms:
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            url = url.replace(f":{port}/", f":{delaying_proxy(port, args.rtt_ms / 2000)}/")
        store: object = PostgresStore.open(url, clock=Clock())
    else:
        store = Store.open(Path(args.path), clock=Clock())
    try:
        store.endpoints.sync_endpoints([Ep("ep")])  # type: ignore[attr-defined]
        fill(store, args.sessions, args.per_session)  # type: ignore[arg-type]
        store.leases.register_replica(  # type: ignore[attr-defined]
            "bench0", host="bench", pid=os.getpid(), now=T0, lease=1e9, exclusive=not args.url
        )
        postmaster = args.postmaster
        server = server_cpu_seconds(postmaster) if postmaster else 0.0
        n, wall, cpu = rounds(store, args.deliveries, args.in_flight)
        server = server_cpu_seconds(postmaster) - server if postmaster else 0.0
    finally:
        store.close()  # type: ignore[attr-defined]
    print(
        json.dumps(
            {
                "per_s": round(n / wall, 1),
                "cpu_ms": round(cpu / n * 1000, 4),
                "server_ms": round(server / n * 1000, 4),
                "total_ms": round((cpu + server) / n * 1000, 4),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--per-session", type=int, default=20)
    parser.add_argument("--deliveries", type=int, default=3000)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rtt-ms", type=float, default=0.0)
    parser.add_argument("--engine", action="append", choices=ENGINES, default=[])
    parser.add_argument("--tree", action="append", default=[], help="name=path/to/src")
    parser.add_argument("--url", help=argparse.SUPPRESS)  # a child's database
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--postmaster", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    engines = args.engine or list(ENGINES)
    trees = [tuple(t.split("=", 1)) for t in args.tree] or [("this", str(ROOT / "src"))]
    results: dict[tuple[str, str], list[dict[str, float]]] = collections.defaultdict(list)
    cluster = Cluster()
    cluster.start()
    postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])
    try:
        with tempfile.TemporaryDirectory(prefix="sessionhook-rounds-") as tmp:
            for rep in range(args.reps):
                for name, src in trees:
                    for engine in engines:
                        cmd = [sys.executable, __file__, "--child"]
                        cmd += [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in (
                            "sessions", "per_session", "deliveries", "in_flight", "rtt_ms"
                        )]  # fmt: skip
                        if engine == "postgresql":
                            url = cluster.url(cluster.create_database())
                            cmd += ["--url", url, "--postmaster", str(postmaster)]
                        else:
                            cmd += ["--path", str(Path(tmp) / f"{name}-{rep}.db")]
                        env = {**os.environ, "PYTHONPATH": src}
                        out = subprocess.run(
                            cmd, env=env, capture_output=True, text=True, check=True
                        ).stdout
                        row = json.loads(out.strip().splitlines()[-1])
                        results[(name, engine)].append(row)
                        load = round(os.getloadavg()[0], 2)
                        print(json.dumps({"rep": rep + 1, "tree": name, "engine": engine,
                                          **row, "load": load}), flush=True)  # fmt: skip
    finally:
        cluster.destroy()
    for (name, engine), rows in results.items():
        medians = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(json.dumps({"median": f"{name}/{engine}", **medians}))
    if set(engines) == set(ENGINES):
        for name, _src in trees:
            sq, pg = results[(name, "sqlite")], results[(name, "postgresql")]
            ratios = [p["total_ms"] / s["total_ms"] for s, p in zip(sq, pg, strict=True)]
            print(json.dumps({"tree": name, "pg_sqlite_cpu": round(statistics.median(ratios), 3)}))
    if len(trees) > 1:
        base = trees[-1][0]
        for name, _src in trees[:-1]:
            for engine in engines:
                a, b = results[(name, engine)], results[(base, engine)]
                for k in ("per_s", "total_ms", "server_ms"):
                    ratios = [x[k] / y[k] for x, y in zip(a, b, strict=True) if y[k]]
                    if ratios:
                        print(json.dumps({f"{name}/{base}": f"{engine} {k}",
                                          "median": round(statistics.median(ratios), 3),
                                          "each": [round(r, 3) for r in ratios]}))  # fmt: skip


if __name__ == "__main__":
    main()
