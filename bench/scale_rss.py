"""Peak RSS of ``sessionhook run`` following a large account: ``--sessions`` finished sessions
with ``--activities`` each (100,000 and 10: a million events), all archived.

The archive is written first through the store's own ingest calls (what a relay that
followed the account wrote: each session, its ``session.discovered``, its activities and
events, its poll recorded at the listed ``updateTime``), in this process; the stand-in of
the tests (``tests/support/standin.py``) lists the same sessions. Then the real daemon
starts on that store, as after a restart: it loads what it archived, walks the whole list
(``--passes`` full passes, 1,000 pages each at 100,000 sessions) and reads its head every
second; nothing moved, so nothing else is read. The figure: the daemon's high-water mark of
resident memory (``VmHWM``) once the passes are done, and its RSS then, with the seconds
its first pass took. Each run gets a fresh archive.

    .venv/bin/python bench/scale_rss.py --sessions 100000 --activities 10 --runs 3
    .venv/bin/python bench/scale_rss.py --tree after=src --tree before=/tmp/before/src
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sessionhook.api.models import Activity, Session
from sessionhook.relay.domain import events
from sessionhook.relay.store.sqlite import Store

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the stand-in of the tests
from tests.support.standin import StandIn  # noqa: E402

API_KEY = "bench-scale-key-0123456789"
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def _time(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _account(sessions: int, activities: int) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """The account: finished sessions a minute apart, their activities a second apart."""
    account = []
    for i in range(sessions):
        sid = str(10**19 + i)
        name = f"sessions/{sid}"
        start = i * 60.0
        acts = [
            {
                "name": f"{name}/activities/{j:032x}",
                "id": f"{j:032x}",
                "originator": "agent",
                "description": "Working on it",
                "createTime": _time(start + 1 + j),
                "progressUpdated": {"title": "Running tests", "description": "pytest -q"},
            }
            for j in range(activities)
        ]
        data = {
            "name": name,
            "id": sid,
            "title": f"Old task {i}",
            "state": "COMPLETED",
            "createTime": _time(start),
            "updateTime": _time(start + 1 + activities),
        }
        account.append((data, acts))
    return account


def _archive(db: Path, account: list[tuple[dict[str, Any], list[dict[str, Any]]]]) -> float:
    """Write the account into a fresh store as the relay archives it; seconds taken."""
    began = time.monotonic()
    store = Store.open(db)
    try:
        for data, acts in account:
            session = Session.model_validate(data)
            found = events.session_discovered(session)
            store.ingest.archive_discovered(session, found, baseline=True)
            page = [Activity.model_validate(a) for a in acts]
            built, raws = events.archived_page(session, page, max_media_bytes=262144)
            store.ingest.ingest_activities(session.name, page, built, False, raws=raws)
            store.ingest.finish_poll(
                session.name,
                None,
                baseline=True,
                next_poll_at=None,
                polled_update_time=session.update_time,
            )
    finally:
        store.close()
    return time.monotonic() - began


def _memory(pid: int) -> tuple[float, float]:
    """(VmHWM, VmRSS) of a process in MB."""
    found: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            found[key] = int(value.split()[0]) / 1024
    return found["VmHWM"], found["VmRSS"]


def one_run(args: argparse.Namespace, tree: Path | None) -> dict[str, Any]:
    account = _account(args.sessions, args.activities)
    with tempfile.TemporaryDirectory(prefix="sessionhook-scale-") as tmp:
        db = Path(tmp) / "relay.db"
        archive_s = _archive(db, account)
        with StandIn(api_key=API_KEY, max_page_size=100) as standin:
            for data, _ in account:  # the list is what is read; nothing moved
                standin.add_recorded_session(data)
            del account
            config = Path(tmp) / "relay.toml"
            config.write_text(
                "[api]\n"
                f"base_url = {json.dumps(standin.base_url)}\n"
                'api_key_env = "SESSIONHOOK_API_KEY"\n'
                "requests_per_minute = 1000000\n"
                f"[store]\npath = {json.dumps(str(db))}\n"
                '[log]\nlevel = "warning"\nformat = "json"\n'
            )
            env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
            env["SESSIONHOOK_API_KEY"] = API_KEY
            if tree is not None:
                env["PYTHONPATH"] = str(tree)
            pages = -(-args.sessions // 100)
            with (Path(tmp) / "relay.log").open("wb") as log:
                relay = subprocess.Popen(
                    [sys.executable, "-m", "sessionhook.cli", "run", "--config", str(config)],
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    env=env,
                )
            started = time.monotonic()
            try:
                first_pass: float | None = None
                deadline = started + args.timeout
                while time.monotonic() < deadline:
                    time.sleep(0.5)
                    if relay.poll() is not None:
                        raise RuntimeError((Path(tmp) / "relay.log").read_text()[-2000:])
                    listed = len(standin.requests("list_sessions"))
                    if first_pass is None and listed >= pages:
                        first_pass = time.monotonic() - started
                    # each pass: every page; the head's reads in between add a few
                    if listed >= args.passes * pages + 2:
                        break
                else:
                    raise RuntimeError("the passes did not end within --timeout")
                hwm, rss = _memory(relay.pid)
                others = {k: v for k, v in standin.counts().items() if k != "list_sessions"}
            finally:
                relay.terminate()
                relay.wait(30)
    return {
        "sessions": args.sessions,
        "events": args.sessions * (args.activities + 1),
        "archive_written_s": round(archive_s, 1),
        "first_pass_s": None if first_pass is None else round(first_pass, 1),
        "peak_rss_mb": round(hwm, 1),
        "rss_mb": round(rss, 1),
        "other_requests": others,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--activities", type=int, default=10)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument(
        "--tree", action="append", default=[], metavar="NAME=SRC", help="a relay source tree"
    )
    args = parser.parse_args()
    trees: list[tuple[str, Path | None]] = [
        (t.split("=", 1)[0], Path(t.split("=", 1)[1]).resolve()) for t in args.tree
    ] or [("installed", None)]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in trees}
    for _ in range(args.runs):  # the trees take turns
        for name, tree in trees:
            result = one_run(args, tree)
            runs[name].append(result)
            print(f"{name}: {json.dumps(result)}", file=sys.stderr)
    summary = {
        name: {
            "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in done),
            "runs": done,
        }
        for name, done in runs.items()
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
