"""Failover of replicas on one PostgreSQL store: kill -9 a random replica every few seconds
while sessions work, restart it, and check every guarantee at the consumer.

Everything is real and on 127.0.0.1: a throwaway PostgreSQL cluster (``tests/support/pg.py``:
``initdb`` + ``pg_ctl`` in a temporary directory), the independent stand-in of the Sessions
API (``tests/support/standin.py``), the verifying consumer
(``tests/support/blackbox_consumer.py``, every signature checked with the Standard Webhooks
reference package) and ``--replicas`` real ``sessionhook run`` processes sharing the store.

One repetition: ``--sessions`` working sessions gain an activity each about every
``--step`` seconds for ``--duration`` seconds; once the replicas deliver (the first
acknowledgement), every ``--kill-every`` seconds (+-25 %) a
random replica is killed with SIGKILL and started again ``--restart-after`` seconds later
(default: the lease + 1 s, so that its work is taken over through the lease, not by the
restart's reaping of a dead pid). Then the sessions complete, and the run waits until the
consumer acknowledged every activity.

Reported per repetition, and as medians over ``--reps``:

* ``delivered``: activities acknowledged at least once / activities created (must be all);
* ``duplicates``: 2xx answers beyond the first per webhook-id (only attempts in flight at a
  kill may be sent twice);
* ``two_ids``: activities that arrived under more than one webhook-id (must be 0);
* ``order``: activities sent before the previous activity of their session had been
  acknowledged (must be 0);
* ``pause``: the longest wait after a kill: for each kill, the activities created before it
  and first acknowledged after it, the longest ``first ack - max(kill, created)``; against
  the target ``lease + 2 s``.

    .venv/bin/python bench/failover.py                       # 3 x 60 s, 3 replicas, 40 sessions
    .venv/bin/python bench/failover.py --reps 1 --duration 20  # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.blackbox_consumer import Consumer, Hit  # noqa: E402
from tests.support.pg import Cluster  # noqa: E402
from tests.support.standin import StandIn  # noqa: E402

SESSIONHOOK = Path(sys.executable).parent / "sessionhook"


@dataclass
class Run:
    """One repetition's world and observations."""

    created: dict[str, float] = field(default_factory=dict)  # activity name -> monotonic
    order: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    kills: list[float] = field(default_factory=list)
    killed: list[tuple[float, int]] = field(default_factory=list)  # (Unix time, slot)


def config(standin: StandIn, url: str, endpoint: str, secret: str, lease: float, i: int) -> str:
    return "\n".join(
        [
            "[api]",
            f'base_url = "{standin.base_url}"',
            'api_key_env = "SESSIONHOOK_API_KEY"',
            "requests_per_minute = 60000",
            "[store]",
            f'url = "{url}"',
            f"lease = {lease}",
            "[poll]",
            "active_interval = 0.5",
            "discovery_interval = 1.0",
            "backfill = true",
            "[delivery]",
            "retry_delays = [0.5, 1.0, 2.0, 2.0, 2.0, 2.0]",
            "timeout = 5.0",
            "allow_private_networks = true",
            "concurrency = 16",
            "[log]",
            'level = "info"',
            'format = "json"',
            "[[endpoints]]",
            'name = "main"',
            f'url = "{endpoint}"',
            f'secret = "{secret}"',
            "",
        ]
    ) + (f"# replica {i}\n")


class Replicas:
    """The ``sessionhook run`` processes, by slot."""

    def __init__(self, workdir: Path, configs: list[Path], api_key: str) -> None:
        self.workdir = workdir
        self.configs = configs
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
        self.env["SESSIONHOOK_API_KEY"] = api_key
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * len(configs)
        self.starts = 0

    def start(self, slot: int) -> None:
        self.starts += 1
        log = (self.workdir / f"replica-{slot}-{self.starts}.log").open("wb")
        self.procs[slot] = subprocess.Popen(
            [str(SESSIONHOOK), "run", "--config", str(self.configs[slot])],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=self.env,
        )

    def kill(self, slot: int) -> None:
        proc = self.procs[slot]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        self.procs[slot] = None

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            if proc is not None:
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()


def produce(
    standin: StandIn, run: Run, names: list[str], args: argparse.Namespace, stop: threading.Event
) -> None:
    """Each session gains an activity about every ``--step`` s, round robin, until ``stop``."""
    pause = args.step / len(names)
    while not stop.is_set():
        for name in names:
            created = standin.append_activity(name, "progressUpdated")["name"]
            run.created[created] = time.monotonic()
            run.order[name].append(created)
            time.sleep(pause)


def chaos(replicas: Replicas, run: Run, args: argparse.Namespace, rng: random.Random) -> None:
    """Kill a random replica every ``--kill-every`` s (+-25 %), restart it later."""
    end = time.monotonic() + args.duration
    restart_after = args.restart_after if args.restart_after is not None else args.lease + 1.0
    pending: list[tuple[float, int]] = []
    next_kill = time.monotonic() + args.kill_every * rng.uniform(0.75, 1.25)
    while time.monotonic() < end or pending:
        now = time.monotonic()
        for at, slot in [p for p in pending if p[0] <= now]:
            pending.remove((at, slot))
            replicas.start(slot)
        if now >= next_kill and now < end:
            alive = [i for i, p in enumerate(replicas.procs) if p is not None]
            if len(alive) > 1:  # never all at once
                slot = rng.choice(alive)
                replicas.kill(slot)
                run.kills.append(time.monotonic())
                run.killed.append((time.time(), slot))
                pending.append((time.monotonic() + restart_after, slot))
            next_kill = now + args.kill_every * rng.uniform(0.75, 1.25)
        time.sleep(0.05)


def judge(run: Run, hits: list[Hit]) -> dict[str, float]:
    ok = [h for h in hits if h.ok and h.activity_name is not None]
    first_ack: dict[str, float] = {}
    first_ack_seq: dict[str, int] = {}
    ids: dict[str, set[str]] = defaultdict(set)
    acks: dict[str, int] = defaultdict(int)
    for h in ok:
        name = h.activity_name
        assert name is not None
        ids[name].add(h.webhook_id)
        acks[h.webhook_id] += 1
        if name not in first_ack:
            first_ack[name], first_ack_seq[name] = h.answered, h.answered_seq
    delivered = sum(1 for name in run.created if name in first_ack)
    duplicates = sum(n - 1 for n in acks.values())
    two_ids = sum(1 for s in ids.values() if len(s) > 1)
    # Order: no activity sent before its predecessor in the session was acknowledged.
    position = {n: (s, i) for s, names in run.order.items() for i, n in enumerate(names)}
    violations = 0
    for h in hits:
        name = h.activity_name
        if name is None or name not in position:
            continue
        session, index = position[name]
        if index == 0:
            continue
        before = run.order[session][index - 1]
        if first_ack_seq.get(before, 1 << 62) > h.seq:
            violations += 1
    per_kill = []
    for kill in run.kills:
        waits = [
            first_ack[n] - max(kill, created)
            for n, created in run.created.items()
            if created < kill and first_ack.get(n, 0.0) > kill
        ]
        per_kill.append(max(waits, default=0.0))
    pause = max(per_kill, default=0.0)
    print(json.dumps({"pause_per_kill_s": [round(p, 2) for p in per_kill]}), flush=True)
    return {
        "created": float(len(run.created)),
        "delivered": float(delivered),
        "duplicates": float(duplicates),
        "two_ids": float(two_ids),
        "order": float(violations),
        "pause_s": round(pause, 2),
        "kills": float(len(run.kills)),
    }


def repetition(cluster: Cluster, args: argparse.Namespace, rep: int, tmp: Path) -> dict[str, float]:
    rng = random.Random(args.seed + rep)
    database = cluster.create_database()
    workdir = tmp / f"rep{rep}"
    workdir.mkdir()
    standin = StandIn(max_page_size=100).start()
    consumer = Consumer().__enter__()
    replicas: Replicas | None = None
    try:
        endpoint, secret = consumer.add_endpoint("main")
        names = [
            standin.add_session(f"Task {i}", state="IN_PROGRESS") for i in range(args.sessions)
        ]
        configs = []
        for i in range(args.replicas):
            path = workdir / f"replica-{i}.toml"
            path.write_text(config(standin, cluster.url(database), endpoint, secret, args.lease, i))
            configs.append(path)
        replicas = Replicas(workdir, configs, standin.api_key)
        for slot in range(args.replicas):
            replicas.start(slot)
        run = Run()
        stop = threading.Event()
        producer = threading.Thread(target=produce, args=(standin, run, names, args, stop))
        producer.start()
        # The kills start once the replicas deliver (their start-up, imports and first
        # discovery, is not a failover), then go on for --duration while activities come.
        up = time.monotonic() + 60.0
        while not consumer.delivered("main") and time.monotonic() < up:
            time.sleep(0.1)
        try:
            chaos(replicas, run, args, rng)
        finally:
            stop.set()
            producer.join()
        for name in names:
            standin.set_state(name, "COMPLETED")
        deadline = time.monotonic() + args.drain
        while time.monotonic() < deadline:
            acked = {h.activity_name for h in consumer.delivered("main")}
            if all(n in acked for n in run.created):
                break
            time.sleep(0.2)
        (workdir / "kills.json").write_text(json.dumps(run.killed))
        result = judge(run, consumer.hits("main"))
        result["unverified"] = float(sum(1 for h in consumer.hits("main") if not h.verified))
        return result
    finally:
        if replicas is not None:
            replicas.stop_all()
        consumer.__exit__(None, None, None)
        standin.stop()
        cluster.drop_database(database)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of kills")
    parser.add_argument("--step", type=float, default=2.0, help="s between a session's activities")
    parser.add_argument("--kill-every", type=float, default=8.0)
    parser.add_argument("--restart-after", type=float, default=None)
    parser.add_argument("--lease", type=float, default=5.0, help="store.lease of the replicas")
    parser.add_argument("--drain", type=float, default=90.0, help="s to wait for the last acks")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, default=None, help="keep the replicas' logs here")
    args = parser.parse_args()
    cluster = Cluster()
    rows = []
    with tempfile.TemporaryDirectory(prefix="sessionhook-failover-") as scratch:
        tmp = str(args.keep) if args.keep is not None else scratch
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
        try:
            cluster.start()
            for rep in range(args.reps):
                row = repetition(cluster, args, rep, Path(tmp))
                row["load"] = round(os.getloadavg()[0], 2)
                rows.append(row)
                print(json.dumps({"rep": rep + 1, **row}), flush=True)
        finally:
            cluster.destroy()
    target = args.lease + 2.0
    medians: dict[str, Any] = {
        key: statistics.median(r[key] for r in rows) for key in rows[0] if key != "load"
    }
    worst_pause = max(r["pause_s"] for r in rows)
    print(
        json.dumps(
            {
                "medians": medians,
                "worst_pause_s": worst_pause,
                "pause_target_s": target,
                "all_delivered": all(r["delivered"] == r["created"] for r in rows),
                "two_ids_total": sum(r["two_ids"] for r in rows),
                "order_total": sum(r["order"] for r in rows),
                "pause_within_target": worst_pause <= target,
            }
        )
    )


if __name__ == "__main__":
    main()
