"""Delivery throughput on PostgreSQL with 1 and 2 replicas, against SQLite, in one run.

Everything is a separate process on 127.0.0.1: the stand-in (``tests/support/standin.py``)
and the raw receiver of ``bench/_bench_servers.py`` (every signature checked), a throwaway
PostgreSQL cluster (``tests/support/pg.py``), and the real ``sessionhook`` commands.

Per repetition: (1) one relay on SQLite ingests ``--sessions`` x ``--activities`` events
with its endpoint disabled (no delivery rows); (2) **sqlite**: a copy of that store, every
event replayed to the endpoint (``sessionhook replay``), ``run``: deliveries per second from
the first to the last arrival; (3) **pg1** / **pg2**: the same store copied into a fresh
PostgreSQL database (``sessionhook store copy``), replayed, then 1 or 2 ``run`` processes
on it. The three are measured back to back on the same machine in the same repetition;
the figure that matters is the ratio to SQLite of the same repetition. Beside each: the CPU
per delivery of the relays, of the PostgreSQL server and of the receiver, and the cores
they kept busy together (``cores_busy``, from the first arrival on): two replicas cannot
go faster than the cores left to them allow. Medians over ``--reps``; the load average is
printed with each figure.

``--receiver-delay-ms MS`` makes the receiver answer each POST that late, as receivers
that work before they answer do: a replica then waits on its ``--concurrency`` POSTs in
flight rather than on a core, and a second replica adds its own. Without it the receiver
answers at once and the figure is bounded by the cores the relays and the server get.

``--tree NAME=SRC`` (repeatable) runs the commands of each tree (its ``src`` first on
``PYTHONPATH``), interleaved in every repetition on the same ingested store, so a change is
measured beside what it changes. The first tree ingests: name the oldest first (a newer
schema's store is refused by an older tree).

    .venv/bin/python bench/replicas_throughput.py                 # 3 reps, 100 x 50 events
    .venv/bin/python bench/replicas_throughput.py --tree before=/tmp/b/src --tree after=src
    .venv/bin/python bench/replicas_throughput.py --reps 1 --activities 20   # a quick look
    .venv/bin/python bench/replicas_throughput.py --receiver-delay-ms 100    # waiting receivers
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from bench._bench_servers import (  # noqa: E402
    API_KEY,
    cpu_seconds,
    get_json,
    migrated_copy,
    server_cpu_seconds,
    spawn,
    stop,
)
from tests.support.pg import Cluster  # noqa: E402

SESSIONHOOK = [sys.executable, "-m", "sessionhook.cli"]


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.secret = "whsec_" + base64.b64encode(random.Random(7).randbytes(32)).decode()
        self.events = args.sessions * args.activities
        self.standin, self.api_port = spawn(
            ["standin", "--sessions", str(args.sessions), "--activities", str(args.activities)]
        )
        self.receiver, self.hook_port = spawn(
            ["receiver", "--secret", self.secret, "--delay-ms", str(args.receiver_delay_ms)]
        )
        self.cluster = Cluster()
        self.cluster.start()
        self.postmaster = int((self.cluster.data / "postmaster.pid").read_text().split()[0])

    def close(self) -> None:
        for proc in (self.standin, self.receiver):
            proc.kill()
            proc.wait()
        self.cluster.destroy()

    def config(self, path: Path, store: str, *, enabled: bool) -> Path:
        key = path.parent / "api_key"
        key.write_text(API_KEY)
        key.chmod(0o600)  # a secret file others can read is refused
        where = f'url = "{store}"' if store.startswith("postgresql://") else f'path = "{store}"'
        lines = [
            "[api]",
            f'base_url = "http://127.0.0.1:{self.api_port}"',
            f'api_key_file = "{key}"',
            "requests_per_minute = 60000",
            "[store]",
            where,
            "[poll]",
            "active_interval = 2",
            "idle_interval = 60",
            "discovery_interval = 30",
            "backfill = true",
            "[delivery]",
            "allow_private_networks = true",
            f"concurrency = {self.args.concurrency}",
            "[log]",
            'level = "warning"',
            'format = "json"',
            "[[endpoints]]",
            'name = "e1"',
            f'url = "http://127.0.0.1:{self.hook_port}/e1"',
            f'secret = "{self.secret}"',
            f"enabled = {'true' if enabled else 'false'}",
        ]
        path.write_text("\n".join(lines) + "\n")
        return path

    def run(self, config: Path, log: Path, tree: Path | None = None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [*SESSIONHOOK, "run", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=log.open("ab"),
            env=_env(tree),
        )

    def ingest(self, rep: int, tree: Path | None = None) -> Path:
        work = self.tmp / f"ingest-{rep}"
        work.mkdir()
        db = work / "relay.db"
        config = self.config(work / "config.toml", str(db), enabled=False)
        get_json(self.api_port, "/_bench/reset")
        relay = self.run(config, work / "relay.log", tree)
        try:
            deadline = time.monotonic() + self.args.timeout
            while _count(db) < self.events:
                if relay.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"ingest did not finish; see {work / 'relay.log'}")
                time.sleep(0.1)
        finally:
            stop(relay)
        return db

    def deliver(
        self, label: str, base: Path, replicas: int, rep: int, tree: Path | None = None
    ) -> dict[str, float]:
        work = Path(tempfile.mkdtemp(dir=self.tmp, prefix=f"{label}-{rep}-"))
        if label == "sqlite":
            store = str(work / "relay.db")
            shutil.copy(base, store)
        else:
            store = self.cluster.url(self.cluster.create_database())
            copied = subprocess.run(
                [
                    *SESSIONHOOK,
                    "store",
                    "copy",
                    "--from",
                    str(migrated_copy(base, work / "source.db", _env(tree))),
                    "--to",
                    store,
                ],
                capture_output=True,
                text=True,
                check=False,
                env=_env(tree),
            )
            if copied.returncode != 0:
                raise RuntimeError(f"store copy failed: {copied.stderr}")
        config = self.config(work / "config.toml", store, enabled=True)
        replay = subprocess.run(
            [
                *SESSIONHOOK,
                "replay",
                "--config",
                str(config),
                "--endpoint",
                "e1",
                "--since",
                "1970-01-01T00:00:00Z",
            ],
            capture_output=True,
            text=True,
            check=False,
            env=_env(tree),
        )
        found = re.search(r"queued (\d+)", replay.stdout)
        if replay.returncode != 0 or found is None:
            raise RuntimeError(f"replay failed: {replay.stdout} {replay.stderr}")
        expected = int(found.group(1))
        get_json(self.hook_port, "/_bench/reset")
        load = os.getloadavg()[0]
        relays = [self.run(config, work / f"relay-{i}.log", tree) for i in range(replicas)]
        postgres = label != "sqlite"

        def cpu() -> tuple[float, float, float, float]:
            """(wall, the relays' CPU, the server's, the receiver's) seconds so far."""
            return (
                time.monotonic(),
                sum(cpu_seconds(r.pid) for r in relays),
                server_cpu_seconds(self.postmaster) if postgres else 0.0,
                cpu_seconds(self.receiver.pid),
            )

        first: tuple[float, float, float, float] | None = None
        try:
            deadline = time.monotonic() + self.args.timeout
            while True:
                got = get_json(self.hook_port, "/_bench/stats")["total"]
                if got > 0 and first is None:
                    first, first_got = cpu(), got  # start-up (imports, the store) left out
                if got >= expected:
                    break
                if any(r.poll() is not None for r in relays) or time.monotonic() > deadline:
                    raise RuntimeError(f"{label}: delivery stalled; see {work}")
                time.sleep(0.1)
            last = cpu()
            stats = get_json(self.hook_port, "/_bench/stats")
        finally:
            for relay in relays:
                stop(relay)
        assert first is not None
        n = expected - first_got
        wall, relay_cpu, server_cpu, receiver_cpu = (
            b - a for a, b in zip(first, last, strict=True)
        )
        return {
            "deliveries": float(expected),
            "received": float(stats["total"]),
            "per_s": round(expected / (stats["last"] - stats["first"]), 1),
            "bad_signatures": float(stats["bad_signatures"]),
            # CPU per delivery from the first arrival on: the relays (all of them), the
            # PostgreSQL server (every process of the cluster), the receiver.
            "relay_cpu_ms": round(relay_cpu * 1000 / n, 3),
            "server_cpu_ms": round(server_cpu * 1000 / n, 3),
            "receiver_cpu_ms": round(receiver_cpu * 1000 / n, 3),
            # Cores the three kept busy meanwhile (the machine has os.cpu_count()).
            "cores_busy": round((relay_cpu + server_cpu + receiver_cpu) / wall, 2),
            "load": round(load, 2),
        }


def _env(tree: Path | None) -> dict[str, str] | None:
    """The environment of a command of ``tree`` (its ``src`` first on ``PYTHONPATH``)."""
    if tree is None:
        return None
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tree)
    return env


def _count(db: Path) -> int:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return int(conn.execute("SELECT COUNT(*) FROM activities").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--activities", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--receiver-delay-ms", type=float, default=0.0, metavar="MS")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=SRC")
    args = parser.parse_args()
    trees: list[tuple[str, Path | None]] = [
        (t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree
    ] or [("current", None)]
    runs = (("sqlite", 1), ("pg1", 1), ("pg2", 2))
    rows: dict[str, list[dict[str, float]]] = {}
    ratios: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="sessionhook-replicas-") as tmp:
        bench = Bench(args, Path(tmp))
        try:
            for rep in range(args.reps):
                base = bench.ingest(rep, trees[0][1])
                # Every other repetition in the reverse order (the load drifts).
                for name, tree in trees if rep % 2 == 0 else trees[::-1]:
                    now: dict[str, float] = {}
                    for label, replicas in runs:
                        row = bench.deliver(label, base, replicas, rep, tree)
                        rows.setdefault(f"{name}/{label}", []).append(row)
                        now[label] = row["per_s"]
                        shown = {"rep": rep + 1, "tree": name, "run": label, **row}
                        print(json.dumps(shown), flush=True)
                    for top, bottom in (("pg1", "sqlite"), ("pg2", "sqlite"), ("pg2", "pg1")):
                        key = f"{name}: {top}/{bottom}"
                        ratios.setdefault(key, []).append(now[top] / now[bottom])
        finally:
            bench.close()
    print(
        json.dumps(
            {
                "median_per_s": {
                    k: statistics.median(r["per_s"] for r in v) for k, v in rows.items()
                },
                "median_ratio": {k: round(statistics.median(v), 2) for k, v in ratios.items()},
                "ratios": {k: [round(x, 2) for x in v] for k, v in ratios.items()},
                "events": args.sessions * args.activities,
                "concurrency": args.concurrency,
                "receiver_delay_ms": args.receiver_delay_ms,
                "reps": args.reps,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
