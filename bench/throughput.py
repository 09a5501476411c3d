"""Delivery throughput, ingest rate, storage and latency of ``sessionhook run``, black-box.

Everything runs as separate processes on 127.0.0.1, as a user would run them:

* the tests' stand-in of the Sessions API (``tests/support/standin.py``, served by
  ``bench/_bench_servers.py standin``): ``--sessions`` x ``--activities`` past activities
  (COMPLETED sessions), shapes as in the field notes;
* a raw asyncio keep-alive receiver answering 204 (``_bench_servers.py receiver``) that
  checks every signature and counts per path;
* the REAL ``sessionhook run`` subprocess of each tree under test (``--tree name=path``: the
  ``src`` directory is put first on ``PYTHONPATH``, so one run can hold main and a branch);
* a bare-client baseline (``_baseline`` below, its own process): signs the same kind of
  bodies and POSTs them with the same HTTP client at the same concurrency, storing nothing.

Per repetition and tree, interleaved: (1) **ingest**: a fresh store, backfill on, endpoints
configured but disabled: activities archived per second from the relay's first request to
the last activity archived; (2) **user** (the headline: the case a user has): the ingested
store, every event replayed to one endpoint, then ``run`` configured as a user does (every
setting at its default but the upstream, the store, the endpoint and private addresses:
log level ``info``, the default poll intervals and request budget), the stand-in up and
answering its polls of the finished sessions (``upstream_requests``); figures as in (3);
(3) **deliver**: the same with the bench's settings (log level ``warning``, a larger
budget, slower polls): every event replayed to one endpoint (``sessionhook replay``), then
``run``: deliveries per second (first to last arrival),
CPU per delivery (``/proc`` of the relay, from the first arrival: start-up excluded), CPU
per delivery in the first 2,000 (backlog about 20,000) and in the last 2,000 (backlog
2,000 -> 200); peak RSS (VmHWM); new connections; the mean body size;
bytes per event of the store afterwards; (3b) **pg1**: (3) on a copy of the store in a
throwaway PostgreSQL cluster (``tests/support/pg.py``, ``sessionhook store copy``): the
relay's CPU per delivery and the server's (every process of the cluster), beside (3)'s on
SQLite (``--skip pg`` leaves it out); (4) **fan-out**: four endpoints, each replayed a
quarter of the events (the same total); (5) **latency**: a live stand-in appends activities
at ``--live-rate`` per second; p50/p90 activity createTime -> arrival; (6) **e2e**: a fresh
store, backfill on, one endpoint enabled from the start, so ingest and delivery share the
relay (a first start on an account with history): deliveries per second from the first
arrival to the last, and from the relay's first request. Then the bare loop (by default
the relay's own poster, ``--baseline relay=<first tree>``), whose ratio to (2) and (3) is
reported per repetition.
Medians over ``--reps``; the load average is printed with each figure. Before the first
repetition each tree ingests once untimed (``--no-warmup`` skips it): the first relay of a
run was the slowest, which penalised whichever tree came first.

    .venv/bin/python bench/throughput.py --tree after=src --tree before=/tmp/before/src
    .venv/bin/python bench/throughput.py --activities 25 --reps 1     # a quick look
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import hmac
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
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _bench_servers import (
    API_KEY,
    TICK,
    cpu_seconds,
    fmt,
    get_json,
    make_activity,
    make_session,
    migrated_copy,
    server_cpu_seconds,
    spawn,
    stop,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


# --------------------------------------------------------------------------- processes


def main_thread_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process's main thread (the relay's event loop), from /proc."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "PYTHONPATH")}
    env["PYTHONPATH"] = str(tree)
    return env


def _config(
    path: Path,
    db: Path | str,
    api_port: int,
    hook_port: int,
    secret: str,
    endpoints: list[tuple[str, bool]],
    *,
    concurrency: int,
    live: bool = False,
    as_configured: bool = False,
) -> None:
    """A relay config. ``as_configured``: what a user writes (the upstream, the store, the
    endpoint, private addresses allowed for the loopback receiver): every other setting
    at its default: the request budget, the poll intervals, log level ``info``."""
    key = path.parent / "api_key"
    key.write_text(API_KEY)
    key.chmod(0o600)  # a secret file others can read is refused
    lines = [
        "[api]",
        f'base_url = "http://127.0.0.1:{api_port}"',
        f'api_key_file = "{key}"',
        "[store]",
        f'url = "{db}"' if str(db).startswith("postgresql://") else f'path = "{db}"',
        "[delivery]",
        "allow_private_networks = true",
        f"concurrency = {concurrency}",
    ]
    if not as_configured:
        lines[3:3] = ["requests_per_minute = 60000"]
        lines += [
            "[poll]",
            f"active_interval = {0.3 if live else 2}",
            f"idle_interval = {2 if live else 60}",
            f"discovery_interval = {0.5 if live else 30}",
            "backfill = true",
            "[log]",
            'level = "warning"',
            'format = "json"',
        ]
    for name, enabled in endpoints:
        lines += [
            "[[endpoints]]",
            f'name = "{name}"',
            f'url = "http://127.0.0.1:{hook_port}/{name}"',
            f'secret = "{secret}"',
            f"enabled = {'true' if enabled else 'false'}",
        ]
    path.write_text("\n".join(lines) + "\n")


def _relay(tree: Path, config: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sessionhook.cli", "run", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env=_env(tree),
    )


def _count(db: Path, table: str) -> int:
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def _open_deliveries(db: Path) -> int:
    """Deliveries not delivered yet (pending or failed); -1 while the table is missing."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            row = conn.execute(
                "SELECT COUNT(*) FROM deliveries WHERE status IN ('pending', 'failed')"
            ).fetchone()
            return int(row[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return -1


def _bytes_per_event(db: Path) -> float:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        events = conn.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    finally:
        conn.close()
    return (pages - free) * size / max(1, events)


# --------------------------------------------------------------------------- scenarios


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.secret = "whsec_" + base64.b64encode(random.Random(7).randbytes(32)).decode()
        n = args.sessions * args.activities
        self.activities = n
        self.standin, self.api_port = spawn(
            ["standin", "--sessions", str(args.sessions), "--activities", str(args.activities)]
        )
        self.receiver, self.hook_port = spawn(["receiver", "--secret", self.secret])
        self.cluster: Any = None
        if "pg" not in args.skip:
            # The PostgreSQL scenario's throwaway cluster (the tests' own harness).
            sys.path.insert(0, str(ROOT))
            from tests.support.pg import Cluster

            self.cluster = Cluster()
            self.cluster.start()
            pid_file = self.cluster.data / "postmaster.pid"
            self.postmaster = int(pid_file.read_text().split()[0])

    def servers_cpu(self) -> float:
        """CPU seconds the stand-in and the receiver have used so far: on two cores they
        compete with the relay, so each scenario reports their share too."""
        return cpu_seconds(self.standin.pid) + cpu_seconds(self.receiver.pid)

    def close(self) -> None:
        for proc in (self.standin, self.receiver):
            proc.kill()
            proc.wait()
        if self.cluster is not None:
            self.cluster.destroy()

    def _configure(
        self,
        work: Path,
        endpoints: list[tuple[str, bool]],
        *,
        concurrency: int | None = None,
        api_port: int | None = None,
        live: bool = False,
        as_configured: bool = False,
        store: str | None = None,
    ) -> Path:
        """Write a relay's config in ``work`` (its store ``work/relay.db`` or the
        ``store`` URL, this run's receiver and secret; the stand-in at ``api_port``, by
        default the backlog one) and return its path."""
        config = work / "config.toml"
        _config(
            config,
            store or work / "relay.db",
            self.api_port if api_port is None else api_port,
            self.hook_port,
            self.secret,
            endpoints,
            concurrency=self.args.concurrency if concurrency is None else concurrency,
            live=live,
            as_configured=as_configured,
        )
        return config

    def ingest(self, name: str, tree: Path) -> tuple[dict[str, float], Path]:
        work = Path(tempfile.mkdtemp(dir=self.tmp, prefix=f"ingest-{name}-"))
        db = work / "relay.db"
        names = [("e1", False), ("e2", False), ("e3", False), ("e4", False)]
        config = self._configure(work, names, concurrency=16)
        get_json(self.api_port, "/_bench/reset")
        with self._running(tree, config, work, f"ingest-{name}") as (relay, load, servers):
            cpu = self._until(
                relay, work, lambda: _count(db, "activities") >= self.activities, "ingest"
            )
            done = time.time()
            upstream = get_json(self.api_port, "/_bench/stats")
            rss = peak_rss_mb(relay.pid)
        rate = self.activities / (done - upstream["first_request"])
        figures = {
            "ingest_per_s": rate,
            # Requests the stand-in answered up to the last activity archived.
            "ingest_requests": upstream["requests"],
            "ingest_cpu_ms": cpu * 1000 / self.activities,
            "ingest_rss_mb": rss,
            "servers_cpu_ms": (self.servers_cpu() - servers) * 1000 / self.activities,
            "load": load,
        }
        return figures, db

    @contextlib.contextmanager
    def _running(
        self, tree: Path, config: Path, work: Path, label: str
    ) -> Iterator[tuple[subprocess.Popen[bytes], float, float]]:
        """The relay of ``tree`` on ``config`` (py-spy on it with ``--profile``, as
        ``label``), stopped on leaving: yields (the process, the load average and the
        servers' CPU seconds, both read just before it started)."""
        load = loadavg()
        servers = self.servers_cpu()
        relay = _relay(tree, config, work / "relay.log")
        profiler = self._profile(relay.pid, label)
        try:
            yield relay, load, servers
        finally:
            stop(relay)
            if profiler is not None:
                profiler.wait()

    def _until(
        self, relay: subprocess.Popen[bytes], work: Path, finished: Callable[[], bool], what: str
    ) -> float:
        """Wait until ``finished()``; the relay's CPU seconds from its first request to
        then (start-up, the imports, excluded)."""
        cpu_first: float | None = None
        deadline = time.monotonic() + self.args.timeout
        while not finished():
            if relay.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not finish; see {work / 'relay.log'}")
            if cpu_first is None and get_json(self.api_port, "/_bench/stats")["first_request"]:
                cpu_first = cpu_seconds(relay.pid)
            time.sleep(0.05)
        return cpu_seconds(relay.pid) - (cpu_first or 0.0)

    def _profile(self, pid: int, label: str) -> subprocess.Popen[bytes] | None:
        """``--profile DIR``: py-spy records the relay (raw folded stacks) while it works."""
        if self.args.profile is None:
            return None
        self.args.profile.mkdir(parents=True, exist_ok=True)
        out = self.args.profile / f"{label}.txt"
        return subprocess.Popen(
            ["py-spy", "record", "-p", str(pid), "-r", "250", "-f", "raw", "-o", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def deliver(
        self,
        name: str,
        tree: Path,
        base_db: Path,
        fanout: int,
        *,
        as_configured: bool = False,
        postgres: bool = False,
    ) -> dict[str, float]:
        """Every event of ``base_db`` replayed to ``fanout`` endpoints, then ``run``.
        ``as_configured``: the user's case, the relay with its default settings (see
        :func:`_config`); the stand-in answers its polls of the finished sessions either
        way (it stays up), ``upstream_requests`` counts them. ``postgres``: the store
        copied into a fresh PostgreSQL database first (``sessionhook store copy``); the
        server's CPU per delivery is measured beside the relay's."""
        label = "user" if as_configured else f"{'pg' if postgres else 'deliver'}{fanout}"
        work = Path(tempfile.mkdtemp(dir=self.tmp, prefix=f"{label}-{name}-"))
        db = work / "relay.db"
        store: str | None = None
        if postgres:
            store = self.cluster.url(self.cluster.create_database())
            source = migrated_copy(base_db, work / "source.db", _env(tree))
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "sessionhook.cli",
                    "store",
                    "copy",
                    "--from",
                    str(source),
                    "--to",
                    store,
                ],
                capture_output=True,
                env=_env(tree),
                check=True,
            )
            config = self._configure(work, [("e1", True)], store=store)
        else:
            shutil.copy(base_db, db)
        names = [f"e{i + 1}" for i in range(fanout)]
        expected = 0
        for i, endpoint in enumerate(names):
            cmd = [sys.executable, "-m", "sessionhook.cli", "replay"]
            cmd += ["--config", str(config)] if postgres else ["--db", str(db)]
            cmd += ["--endpoint", endpoint, "--since", "1970-01-01T00:00:00Z"]
            if fanout > 1:
                # Each endpoint gets a quarter of every session's history: the same total.
                lo = get_json(self.api_port, f"/_bench/cut?share={i / fanout}")["until"]
                hi = get_json(self.api_port, f"/_bench/cut?share={(i + 1) / fanout}")["until"]
                cmd[-1] = "1970-01-01T00:00:00Z" if i == 0 else lo
                if i < fanout - 1:
                    cmd += ["--until", hi]
            out = subprocess.run(
                cmd, capture_output=True, text=True, env=_env(tree), check=True
            ).stdout
            expected += int(re.search(r"queued (\d+)", out).group(1))  # type: ignore[union-attr]
        config = self._configure(
            work, [(e, True) for e in names], as_configured=as_configured, store=store
        )
        get_json(self.hook_port, "/_bench/reset")
        get_json(self.api_port, "/_bench/reset")
        samples: list[tuple[float, int, float]] = []
        loop_samples: list[tuple[float, int, float]] = []  # the main thread's (event loop)
        server_samples: list[tuple[float, int, float]] = []  # PostgreSQL's
        with self._running(tree, config, work, f"{label}-{name}") as (relay, load, servers):
            deadline = time.monotonic() + self.args.timeout
            while True:
                got = get_json(self.hook_port, "/_bench/stats")["total"]
                samples.append((time.time(), got, cpu_seconds(relay.pid)))
                loop_samples.append((time.time(), got, main_thread_cpu_seconds(relay.pid)))
                if postgres:
                    server_samples.append((time.time(), got, server_cpu_seconds(self.postmaster)))
                if got >= expected:
                    break
                if relay.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"delivery stalled at {got}/{expected}; see {work}")
                time.sleep(0.1)
            stats = get_json(self.hook_port, "/_bench/stats")
            upstream = get_json(self.api_port, "/_bench/stats")["requests"]
            rss = peak_rss_mb(relay.pid)
        seconds = stats["last"] - stats["first"]
        result = {
            "deliveries": expected,
            "per_s": expected / seconds,
            "body_bytes": stats["body_bytes"] / max(1, stats["total"]),
            "upstream_requests": upstream,
            # From the first arrival: start-up (imports, opening the store) is not delivery
            # work (about 1 s of CPU, 0.05-0.1 ms per delivery on 10-20k deliveries).
            "cpu_ms": _cpu_between(samples, 1, expected) * 1000 / (expected - 1),
            # The event loop's thread alone: the one that bounds deliveries/s.
            "loop_cpu_ms": _cpu_between(loop_samples, 1, expected) * 1000 / (expected - 1),
            "rss_mb": rss,
            "connections": stats["connections"],
            "bad_signatures": stats["bad_signatures"],
            "servers_cpu_ms": (self.servers_cpu() - servers) * 1000 / expected,
            "load": load,
        }
        if postgres:
            server = _cpu_between(server_samples, 1, expected) * 1000 / (expected - 1)
            result["server_cpu_ms"] = server
            result["total_cpu_ms"] = result["cpu_ms"] + server
            return result
        if fanout == 1 and expected >= 5000:
            early = _cpu_between(samples, 500, 2500) / 2000
            late = _cpu_between(samples, expected - 2000, expected - 200) / 1800
            result["cpu_ms_backlog_high"] = early * 1000
            result["cpu_ms_backlog_low"] = late * 1000
            result["bytes_per_event"] = _bytes_per_event(db)
        return result

    def e2e(self, name: str, tree: Path) -> dict[str, float]:
        """Ingest and deliver at once, as a first start with ``backfill = true`` and one
        endpoint does: deliveries per second from the first arrival to the last, and from
        the relay's first request to the last arrival."""
        work = Path(tempfile.mkdtemp(dir=self.tmp, prefix=f"e2e-{name}-"))
        db = work / "relay.db"
        config = self._configure(work, [("e1", True)])
        get_json(self.api_port, "/_bench/reset")
        get_json(self.hook_port, "/_bench/reset")
        with self._running(tree, config, work, f"e2e-{name}") as (relay, load, servers):
            # Every activity archived and no delivery open: every event was delivered.
            cpu = self._until(
                relay,
                work,
                lambda: _count(db, "activities") >= self.activities and _open_deliveries(db) == 0,
                "end-to-end run",
            )
            rss = peak_rss_mb(relay.pid)
            stats = get_json(self.hook_port, "/_bench/stats")
            first_request = get_json(self.api_port, "/_bench/stats")["first_request"]
        total = stats["total"]
        return {
            "deliveries": total,
            "per_s": total / (stats["last"] - stats["first"]),
            "from_first_request_per_s": total / (stats["last"] - first_request),
            "cpu_ms": cpu * 1000 / total,
            "rss_mb": rss,
            "bad_signatures": stats["bad_signatures"],
            "servers_cpu_ms": (self.servers_cpu() - servers) * 1000 / total,
            "load": load,
        }

    def latency(self, name: str, tree: Path) -> dict[str, float]:
        work = Path(tempfile.mkdtemp(dir=self.tmp, prefix=f"latency-{name}-"))
        live, port = spawn(["standin", "--mode", "live", "--sessions", "20"])
        config = self._configure(work, [("lat", True)], api_port=port, live=True)
        get_json(self.hook_port, "/_bench/reset")
        relay = _relay(tree, config, work / "relay.log")
        rate, seconds = self.args.live_rate, 10.0
        try:
            while get_json(self.hook_port, "/_bench/stats")["total"] < 20:  # session.discovered
                if relay.poll() is not None:
                    raise RuntimeError(f"relay died; see {work}")
                time.sleep(0.1)
            load = loadavg()
            get_json(port, f"/_bench/start?rate={rate}&seconds={seconds}")
            time.sleep(seconds + 3)
            stats = get_json(self.hook_port, "/_bench/stats?latency=1")
            rss = peak_rss_mb(relay.pid)
        finally:
            stop(relay)
            live.kill()
            live.wait()
        lat = sorted(stats["latencies"])
        return {
            "p50_ms": 1000 * statistics.median(lat),
            "p90_ms": 1000 * lat[int(0.9 * (len(lat) - 1))],
            "arrived": len(lat),
            "rss_mb": rss,
            "load": load,
        }

    def baseline(self, client: str, count: int, tree: Path) -> dict[str, float]:
        cmd = [
            sys.executable,
            str(Path(__file__)),
            "_baseline",
            "--client",
            client,
            "--count",
            str(count),
            "--concurrency",
            str(self.args.concurrency),
            "--url",
            f"http://127.0.0.1:{self.hook_port}/base",
            "--secret",
            self.secret,
        ]
        get_json(self.hook_port, "/_bench/reset")
        load = loadavg()
        out = subprocess.run(cmd, capture_output=True, text=True, env=_env(tree), check=True)
        result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
        stats = get_json(self.hook_port, "/_bench/stats")
        result["connections"] = stats["connections"]
        result["bad_signatures"] = stats["bad_signatures"]
        result["load"] = load
        return result


def _cpu_between(samples: list[tuple[float, int, float]], lo: int, hi: int) -> float:
    """CPU spent between delivery number ``lo`` and ``hi``, interpolated from the samples."""

    def at(n: int) -> float:
        prev = samples[0]
        for sample in samples:
            if sample[1] >= n:
                if sample[1] == prev[1]:
                    return sample[2]
                share = (n - prev[1]) / (sample[1] - prev[1])
                return prev[2] + share * (sample[2] - prev[2])
            prev = sample
        return samples[-1][2]

    return at(hi) - at(lo)


# --------------------------------------------------------------------------- baseline


async def _baseline_run(args: argparse.Namespace) -> dict[str, float]:
    """POST ``count`` signed bodies, ``concurrency`` in flight, storing nothing."""
    rng = random.Random(3)
    session = make_session(rng, 0, fmt(datetime.now(UTC)), "COMPLETED")
    bodies = []
    for j in range(200):
        act = make_activity(rng, session["name"], j, 200, fmt(datetime.now(UTC)))
        data = {"session": session, "activity": act}
        body = {"type": "activity.progress_updated", "timestamp": act["createTime"], "data": data}
        bodies.append(json.dumps(body, separators=(",", ":")).encode())
    key = base64.b64decode(args.secret.removeprefix("whsec_"))

    def headers(i: int, body: bytes) -> dict[str, str]:
        msg_id = f"evt_{i:032x}"
        ts = str(int(time.time()))
        digest = hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()
        return {
            "webhook-id": msg_id,
            "webhook-timestamp": ts,
            "webhook-signature": "v1," + base64.b64encode(digest).decode(),
            "content-type": "application/json",
            "user-agent": "sessionhook-bench",
        }

    counter = iter(range(args.count))
    post = await _client(args.client)
    cpu0, started = time.process_time(), time.perf_counter()

    async def worker() -> None:
        for i in counter:
            body = bodies[i % len(bodies)]
            status = await post.send(args.url, body, headers(i, body))
            if not 200 <= status < 300:
                raise RuntimeError(f"status {status}")

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu0
    await post.close()
    return {"per_s": args.count / seconds, "cpu_ms": cpu * 1000 / args.count}


async def _client(kind: str) -> Any:
    """A sender with ``send(url, body, headers) -> status`` for the baseline."""
    if kind == "httpx":
        import anyio
        import httpx

        class Httpx:
            # The call pattern of sessionhook 0.1's post_event: stream, read the answer
            # bounded, whole exchange under move_on_after.
            def __init__(self) -> None:
                self.http = httpx.AsyncClient(follow_redirects=False)

            async def send(self, url: str, body: bytes, headers: dict[str, str]) -> int:
                with anyio.move_on_after(15):
                    request = self.http.build_request(
                        "POST", url, content=body, headers=headers, timeout=httpx.Timeout(15)
                    )
                    response = await self.http.send(request, stream=True, follow_redirects=False)
                    try:
                        async for _chunk in response.aiter_bytes():
                            pass
                    finally:
                        await response.aclose()
                    return response.status_code
                return 0

            async def close(self) -> None:
                await self.http.aclose()

        return Httpx()
    if kind == "aiohttp":
        import aiohttp

        class Aiohttp:
            def __init__(self) -> None:
                self.http = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
                )

            async def send(self, url: str, body: bytes, headers: dict[str, str]) -> int:
                async with self.http.post(
                    url,
                    data=body,
                    headers=headers,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=15),
                ) as response:
                    await response.content.read(4096)
                    return response.status

            async def close(self) -> None:
                await self.http.close()

        return Aiohttp()
    if kind == "relay":
        # The relay's own webhook client (sessionhook.relay.delivery.sender.AiohttpPoster).
        from sessionhook.relay.delivery.sender import AiohttpPoster

        class Relay:
            def __init__(self) -> None:
                self.poster = AiohttpPoster(allow_private=True)

            async def send(self, url: str, body: bytes, headers: dict[str, str]) -> int:
                answer = await self.poster.post(url, body, headers, timeout=15, body_limit=4096)
                return answer.status

            async def close(self) -> None:
                await self.poster.aclose()

        return Relay()
    raise ValueError(f"unknown client {kind}")


# --------------------------------------------------------------------------- main


def _median(rows: list[dict[str, float]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="bench", choices=("bench", "_baseline"))
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=SRC")
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--activities", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--live-rate", type=float, default=100.0)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--baseline", action="append", default=[], metavar="CLIENT=TREE")
    parser.add_argument(
        "--baseline-count", type=int, default=0, help="cap the bare loop's POSTs (0: as relay)"
    )
    parser.add_argument(
        "--skip", action="append", default=[], help="ingest|user|pg|fanout|latency|e2e"
    )
    parser.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="skip the untimed ingest of each tree before the first repetition",
    )
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument("--profile", type=Path, help="py-spy the relay, folded stacks here")
    parser.add_argument(
        "--workdir", type=Path, help="keep stores and logs here (default: a temp dir)"
    )
    # _baseline worker options
    parser.add_argument("--client", default="httpx")
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--url", default="")
    parser.add_argument("--secret", default="")
    args = parser.parse_args()
    if args.mode == "_baseline":
        print(json.dumps(asyncio.run(_baseline_run(args))))
        return
    trees = [(t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree]
    if not trees:
        trees = [("current", ROOT / "src")]
    # The headline's ratio needs the bare loop of the relay's own poster: run by default.
    spec = args.baseline or [f"relay={trees[0][0]}"]
    baselines = [(b.split("=", 1)[0], dict(trees)[b.split("=", 1)[1]]) for b in spec]
    results: dict[str, list[dict[str, float]]] = {}

    def note(key: str, row: dict[str, float]) -> None:
        results.setdefault(key, []).append(row)
        shown = ", ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
        )
        print(f"  {key}: {shown}", flush=True)

    print(f"load average at start: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="sessionhook-throughput-") as tmp_dir:
        work = Path(tmp_dir)
        if args.workdir is not None:
            args.workdir.mkdir(parents=True, exist_ok=True)
            work = args.workdir
        bench = Bench(args, work)
        try:
            if args.warmup:
                # The first relay of a run was the slowest (bytecode compiled, files read
                # from disk): every tree runs once untimed, so no tree pays it in the figures.
                for name, tree in trees:
                    print(f"warm-up: {name}", flush=True)
                    bench.ingest(name, tree)
            shared_db: Path | None = None
            if "ingest" in args.skip:
                # One store, ingested once by the first tree, delivered from by every tree
                # and repetition: the delivery figures alone, interleaved more often. Name
                # the oldest tree first: an older tree refuses a newer schema's store.
                shared_db = bench.ingest(*trees[0])[1]
            for rep in range(args.reps):
                print(f"repetition {rep + 1}/{args.reps}", flush=True)
                # Every other repetition in the reverse order: on a shared machine the load
                # drifts within a repetition, and a fixed order handed it to one tree.
                for name, tree in trees if rep % 2 == 0 else trees[::-1]:
                    if shared_db is None:
                        figures, base_db = bench.ingest(name, tree)
                        note(f"{name}/ingest", figures)
                    else:
                        base_db = shared_db
                    # The headline: the daemon with its default settings (the user's case).
                    if "user" not in args.skip:
                        user = bench.deliver(name, tree, base_db, 1, as_configured=True)
                        note(f"{name}/user", user)
                    note(f"{name}/deliver1", bench.deliver(name, tree, base_db, 1))
                    if "pg" not in args.skip:
                        pg = bench.deliver(name, tree, base_db, 1, postgres=True)
                        note(f"{name}/pg1", pg)
                    if "fanout" not in args.skip:
                        note(f"{name}/deliver4", bench.deliver(name, tree, base_db, 4))
                    if "latency" not in args.skip:
                        note(f"{name}/latency", bench.latency(name, tree))
                    if "e2e" not in args.skip:
                        note(f"{name}/e2e", bench.e2e(name, tree))
                    count = int(results[f"{name}/deliver1"][-1]["deliveries"])
                for client, tree in baselines:
                    n = min(count, args.baseline_count) if args.baseline_count else count
                    note(f"baseline-{client}", bench.baseline(client, n, tree))
        finally:
            bench.close()
    print("\nmedians")
    summary: dict[str, dict[str, float | None]] = {}
    for key, rows in results.items():
        summary[key] = {k: _median(rows, k) for k in rows[0]}
        shown = ", ".join(f"{k}={v:.4g}" for k, v in summary[key].items() if v is not None)
        print(f"  {key}: {shown}")
    print("same-run ratios (per repetition, then the median)")
    ratios: dict[str, float] = {}

    def ratio(label: str, top: str, bottom: str, field: str = "per_s") -> None:
        pairs = list(zip(results.get(top, []), results.get(bottom, []), strict=False))
        values = [t[field] / b[field] for t, b in pairs if t.get(field) and b.get(field)]
        if values:
            ratios[label] = statistics.median(values)
            shown = ", ".join(f"{v:.2f}" for v in values)
            print(f"  {label}: {ratios[label]:.2f} ({shown})")

    def backlog_ratio(name: str) -> None:
        rows = results.get(f"{name}/deliver1", [])
        values = [
            r["cpu_ms_backlog_high"] / r["cpu_ms_backlog_low"]
            for r in rows
            if r.get("cpu_ms_backlog_high") and r.get("cpu_ms_backlog_low")
        ]
        if values:
            shown = ", ".join(f"{v:.2f}" for v in values)
            print(
                f"  {name}: CPU per delivery, backlog ~20k / ~1k: "
                f"{statistics.median(values):.2f} ({shown})"
            )

    def pg_ratio(name: str) -> None:
        """PostgreSQL (relay + server) against SQLite (the relay), CPU per delivery."""
        pairs = zip(
            results.get(f"{name}/pg1", []), results.get(f"{name}/deliver1", []), strict=False
        )
        values = [p["total_cpu_ms"] / s["cpu_ms"] for p, s in pairs]
        if values:
            ratios[f"{name}: PostgreSQL / SQLite, CPU per delivery"] = statistics.median(values)
            shown = ", ".join(f"{v:.2f}" for v in values)
            print(
                f"  {name}: PostgreSQL (relay + server) / SQLite, CPU per delivery: "
                f"{statistics.median(values):.2f} ({shown})"
            )

    for name, _tree in trees:
        ratio(f"{name}: fan-out 4 / 1 endpoint", f"{name}/deliver4", f"{name}/deliver1")
        backlog_ratio(name)
        for client, _t in baselines:
            ratio(f"{name}: user's case / bare {client} loop", f"{name}/user", f"baseline-{client}")
            ratio(f"{name}: relay / bare {client} loop", f"{name}/deliver1", f"baseline-{client}")
            ratio(
                f"{name}: user's case / bare {client} loop, CPU per delivery",
                f"{name}/user",
                f"baseline-{client}",
                "cpu_ms",
            )
            ratio(
                f"{name}: relay / bare {client} loop, CPU per delivery",
                f"{name}/deliver1",
                f"baseline-{client}",
                "cpu_ms",
            )
        pg_ratio(name)
    if len(trees) == 2:
        (a, _), (b, _) = trees
        ratio(f"user's case deliveries/s {a} / {b}", f"{a}/user", f"{b}/user")
        ratio(f"deliveries/s {a} / {b}", f"{a}/deliver1", f"{b}/deliver1")
        ratio(f"end-to-end deliveries/s {a} / {b}", f"{a}/e2e", f"{b}/e2e")
        ratio(f"ingest/s {a} / {b}", f"{a}/ingest", f"{b}/ingest", "ingest_per_s")
    print(f"load average at end: {Path('/proc/loadavg').read_text().strip()}")
    if args.json:
        args.json.write_text(
            json.dumps({"runs": results, "medians": summary, "ratios": ratios}, indent=1)
        )


if __name__ == "__main__":
    main()
