"""Peak RSS of ``sessionhook run`` following a large account: ``--sessions`` finished sessions
with ``--activities`` each (100,000 and 10: a million events), all archived.

The archive is written first through the store's own ingest calls (what a relay that
followed the account wrote: each session, its ``session.discovered``, its activities and
events, its poll recorded at the listed ``updateTime``), in this process; the stand-in of
the tests (``tests/support/standin.py``) lists the same sessions, in this process too (its
memory is not the relay's). Then the real daemon starts on that store, as after a restart:
it looks up what it archived, walks the whole list (``--passes`` full passes, 1,000 pages
each at 100,000 sessions: ``poll.max_pages`` is raised to cover them, as
config.example.toml says for an account over 20,000 sessions) and reads its head every
second; nothing moved, so nothing else is read. A pass is over when the next one reads its
second page (the head's reads are first pages only). The figure: the daemon's high-water
mark of resident memory (``VmHWM``) once the passes are done, and its RSS then, with the
seconds its first pass took (until it read the last page) and the high-water mark after
it. Each run gets a fresh archive (``--archive-copy DIR``: one built once, copied).

``--python`` runs the daemon with another interpreter: a venv of
``requirements/runtime.txt`` measures the relay as installed (the test extras' venv also
loads what some libraries import when it is there: trio by httpcore, rich by structlog,
4-6 MB). ``--trace FILE`` runs it under ``tracemalloc`` (``bench/_traced_relay.py``) and
writes what Python holds at the end by line, and at the highest sample what it held more.

    python3 -m venv --without-pip /tmp/rt && scripts/install /tmp/rt requirements/runtime.txt
    .venv/bin/python bench/scale_rss.py --sessions 100000 --activities 10 --runs 3 \
        --python /tmp/rt/bin/python --tree after=src --tree before=/tmp/before/src
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
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


def _offsets(standin: StandIn) -> Counter[int]:
    """How many times the stand-in answered each page of the whole session list (by the
    offset of its first item; the archived sessions' list, ``filter``, not counted)."""
    found: Counter[int] = Counter()
    for r in standin.requests("list_sessions"):
        if r.query.get("filter") or r.status != 200:
            continue
        token = r.query.get("pageToken")
        found[json.loads(base64.urlsafe_b64decode(token))["offset"] if token else 0] += 1
    return found


def one_run(args: argparse.Namespace, tree: Path | None) -> dict[str, Any]:
    account = _account(args.sessions, args.activities)
    with tempfile.TemporaryDirectory(prefix="sessionhook-scale-") as tmp:
        db = Path(tmp) / "relay.db"
        if args.archive_copy is not None:
            saved = Path(args.archive_copy) / f"scale-{args.sessions}-{args.activities}.db"
            if not saved.exists():
                _archive(saved, account)
            began = time.monotonic()
            shutil.copyfile(saved, db)
            os.chmod(db, 0o600)
            archive_s = time.monotonic() - began
        else:
            archive_s = _archive(db, account)
        with StandIn(api_key=API_KEY, max_page_size=100) as standin:
            for data, _ in account:  # the list is what is read; nothing moved
                standin.add_recorded_session(data)
            del account
            pages = -(-args.sessions // 100)
            config = Path(tmp) / "relay.toml"
            config.write_text(
                "[api]\n"
                f"base_url = {json.dumps(standin.base_url)}\n"
                'api_key_env = "SESSIONHOOK_API_KEY"\n'
                "requests_per_minute = 1000000\n"
                f"[store]\npath = {json.dumps(str(db))}\n"
                # every page of the list in each pass (config.example.toml: "raise it
                # for accounts with more than 20,000 sessions")
                f"[poll]\nmax_pages = {pages + 10}\n"
                '[log]\nlevel = "warning"\nformat = "json"\n'
            )
            env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIONHOOK_")}
            env["SESSIONHOOK_API_KEY"] = API_KEY
            if tree is not None:
                env["PYTHONPATH"] = str(tree)
            command = [args.python, "-m", "sessionhook.cli"]
            if args.trace is not None:
                command = [args.python, str(Path(__file__).parent / "_traced_relay.py")]
                env["TRACE_OUT"] = args.trace
            with (Path(tmp) / "relay.log").open("wb") as log:
                relay = subprocess.Popen(
                    [*command, "run", "--config", str(config)],
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    env=env,
                )
            started = time.monotonic()
            try:
                first_pass: float | None = None
                first_hwm = 0.0
                deadline = started + args.timeout
                while time.monotonic() < deadline:
                    time.sleep(0.5)
                    if relay.poll() is not None:
                        raise RuntimeError((Path(tmp) / "relay.log").read_text()[-2000:])
                    offsets = _offsets(standin)
                    if first_pass is None and offsets[(pages - 1) * 100] >= 1:
                        first_pass = time.monotonic() - started
                    if first_pass is not None and not first_hwm and offsets[100] >= 2:
                        first_hwm = _memory(relay.pid)[0]
                    # A pass reads the list's pages in turn, the next one only once it is
                    # over: the second page read for the pass after the last is its end.
                    # (The head's reads, every second, are first pages.)
                    if offsets[(pages - 1) * 100] >= args.passes and offsets[100] > args.passes:
                        break
                else:
                    raise RuntimeError("the passes did not end within --timeout")
                hwm, rss = _memory(relay.pid)
                if args.trace is not None:
                    done = Path(args.trace + ".done")
                    done.unlink(missing_ok=True)
                    relay.send_signal(signal.SIGUSR1)
                    while not done.exists():
                        time.sleep(0.5)
                others = {k: v for k, v in standin.counts().items() if k != "list_sessions"}
            finally:
                relay.terminate()
                relay.wait(30)
    return {
        "sessions": args.sessions,
        "events": args.sessions * (args.activities + 1),
        "archive_written_s": round(archive_s, 1),
        "first_pass_s": None if first_pass is None else round(first_pass, 1),
        "peak_rss_first_pass_mb": round(first_hwm, 1),
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
    parser.add_argument(
        "--archive-copy", metavar="DIR", help="build the archive once here, copy it per run"
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the relay's interpreter: a venv of requirements/runtime.txt, as installed",
    )
    parser.add_argument("--trace", metavar="FILE", help="tracemalloc top stats of the relay")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument(
        "--tree", action="append", default=[], metavar="NAME=SRC", help="a relay source tree"
    )
    args = parser.parse_args()
    if args.sessions <= 100:
        parser.error("--sessions: more than one page (100) is needed to tell a pass's end")
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
