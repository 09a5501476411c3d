"""The relay's own CPU per delivery, without HTTP: the real dispatcher and SQLite store, a stub
poster that answers 204 at once.

One store is filled with ``--sessions`` x ``--per-session`` deliveries to one endpoint
(once, with this tree); then, per repetition and tree (``--tree name=src``, the ``src``
directory put first on ``PYTHONPATH`` of a child process, trees interleaved), a copy of it
is delivered by a :class:`~sessionhook.relay.delivery.dispatcher.Dispatcher` with
``concurrency = 16`` and logging at ``--log-level`` (``warning`` unless told, as
``bench/throughput.py`` configures the relay but for its user's case; ``info``: the
default). Prints the process CPU per delivery (both threads: the event loop and the
store's), the event loop's own (``loop_cpu_ms``: the main thread's, the one that bounds
deliveries/s), deliveries per second, context switches per delivery and deliveries per
dispatcher round, then the medians. What it leaves out, aiohttp and the kernel, is what
``bench/throughput.py``'s bare loop measures.

    .venv/bin/python bench/dispatcher_cpu.py --tree after=src --tree before=/tmp/before/src
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def fill(db: Path, sessions: int, per_session: int) -> None:
    """The outbox: every event of every session queued for one endpoint."""
    sys.path.insert(0, str(ROOT))
    # Imported here, once the checkout (where tests.support lives) is on sys.path.
    from tests.support import backlog
    from tests.support.store_rows import Ep

    from sessionhook.relay.store import Store

    store = Store.open(db)
    store.endpoints.sync_endpoints([Ep("ep", url="http://127.0.0.1:9/hook")])
    backlog.fill(store, sessions, per_session)
    store.close()


def child(db: Path, log_level: str) -> dict[str, float]:
    """Deliver everything in ``db`` with the tree on ``sys.path``; the figures. Log lines
    (JSON, at ``log_level``) go to a file beside ``db``, as the daemon's go to journald."""
    import anyio
    from pydantic import SecretStr

    from sessionhook.relay.config import Config, DeliveryConfig, EndpointConfig
    from sessionhook.relay.delivery.dispatcher import DeliverySettings, Dispatcher
    from sessionhook.relay.delivery.sender import Answer
    from sessionhook.relay.store import AsyncStore, Store
    from sessionhook.relay.telemetry import logs as relay_logging
    from sessionhook.relay.telemetry.metrics import Metrics

    class Stub:
        bounds_exchange = True

        def __init__(self) -> None:
            self.sent, self.total = 0, 0
            self.all_sent = anyio.Event()

        async def post(self, url: str, body: bytes, headers: Any, **_: Any) -> Answer:
            for _ in range(3):  # a POST gives the loop away a few times
                await asyncio.sleep(0)
            self.sent += 1
            if self.sent >= self.total:
                self.all_sent.set()
            return Answer(204, None, b"")

        async def aclose(self) -> None:
            pass

    async def deliver() -> dict[str, float]:
        endpoint = EndpointConfig(
            name="ep", url="http://127.0.0.1:9/hook", secret=SecretStr(SECRET)
        )
        delivery = DeliveryConfig(concurrency=16, allow_private_networks=True, timeout=5.0)
        config = Config(delivery=delivery, endpoints=(endpoint,))
        raw = Store.open(db)
        raw.leases.register_replica(
            "bench", host="bench", pid=os.getpid(), now=time.time(), lease=1e9, exclusive=True
        )
        store, stub = AsyncStore(raw), Stub()
        settings = DeliverySettings.from_config(config)
        dispatcher = Dispatcher(store, stub, settings, metrics=Metrics())  # type: ignore[arg-type]
        total = stub.total = raw.outbox.pending_count()
        before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        loop_cpu = time.thread_time()  # this thread's: the event loop's, the bottleneck
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.run)
            await stub.all_sent.wait()
            await dispatcher.drain()  # the last results committed; run() then returns
        loop_cpu = time.thread_time() - loop_cpu
        after, seconds = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - started
        left = raw.outbox.pending_count()
        raw.close()
        if left:
            raise RuntimeError(f"{left} deliveries left undelivered")
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        switches = after.ru_nvcsw + after.ru_nivcsw - before.ru_nvcsw - before.ru_nivcsw
        return {
            "deliveries": total,
            "cpu_ms": cpu * 1000 / total,
            "loop_cpu_ms": loop_cpu * 1000 / total,
            "per_s": total / seconds,
            "switches_per_delivery": switches / total,
            # Older trees do not count their rounds.
            "per_round": total / rounds if (rounds := getattr(dispatcher, "rounds", 0)) else 0.0,
        }

    with db.with_suffix(".log").open("w") as log:
        relay_logging.configure(log_level, "json", stream=log)
        return anyio.run(deliver)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=SRC")
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--per-session", type=int, default=50)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument(
        "--log-level",
        default="warning",
        help="the relay's log level (info: the default, a line per delivery)",
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.log_level)))
        return
    trees = [t.split("=", 1) for t in args.tree] or [["cur", str(ROOT / "src")]]
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.db"
        fill(base, args.sessions, args.per_session)
        rows: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
        for rep in range(args.reps):
            for name, src in trees:
                db = Path(tmp) / f"{name}-{rep}.db"
                shutil.copy(base, db)
                env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{ROOT}"}
                out = subprocess.run(
                    [sys.executable, __file__, "--child", str(db), "--log-level", args.log_level],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                row = json.loads(out.strip().splitlines()[-1])
                rows[name].append(row)
                load = os.getloadavg()[0]
                print(
                    f"{rep + 1}/{args.reps} {name}: "
                    + ", ".join(f"{k}={v:.3g}" for k, v in row.items())
                    + f", load={load:.2f}",
                    flush=True,
                )
        print("medians")
        for name, got in rows.items():
            print(
                f"  {name}: "
                + ", ".join(f"{k}={statistics.median(r[k] for r in got):.3g}" for k in got[0])
            )


if __name__ == "__main__":
    main()
