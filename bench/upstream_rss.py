"""Peak RSS of ``sessionhook run`` while the upstream serves one huge answer.

Runs the real daemon against the independent stand-in (``tests/support/standin.py``) whose one
session holds a small activity, one with a media artifact of ``--mb`` megabytes (so the
answer that carries it is that large), and another small one. It waits until the daemon has
refused the huge activity and archived the two others, then reads the daemon's high-water
mark of resident memory (``VmHWM`` in ``/proc/<pid>/status``). The same run without the huge
activity gives the baseline, measured in the same invocation.

    .venv/bin/python bench/upstream_rss.py --mb 50 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the stand-in of the tests
from tests.support.standin import StandIn  # noqa: E402

SESSIONHOOK = Path(sys.executable).parent / "sessionhook"


def vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def archived(db: Path) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM activities").fetchone()[0])
    except sqlite3.Error:
        return 0


def one_run(megabytes: int) -> float:
    with tempfile.TemporaryDirectory() as tmp, StandIn(max_page_size=100) as standin:
        db = Path(tmp) / "relay.db"
        config = Path(tmp) / "relay.toml"
        config.write_text(
            "[api]\n"
            f"base_url = {json.dumps(standin.base_url)}\n"
            "[store]\n"
            f"path = {json.dumps(str(db))}\n"
            "[poll]\nactive_interval = 0.3\ndiscovery_interval = 0.3\nbackfill = true\n"
            '[log]\nlevel = "warning"\nformat = "json"\n'
        )
        name = standin.add_session("Screenshots", state="AWAITING_USER_FEEDBACK")
        standin.append_activity(name, "agentMessaged")
        if megabytes:
            media = {"media": {"mimeType": "image/png", "data": "A" * (megabytes * 1_000_000)}}
            standin.append_activity(name, "progressUpdated", artifacts=[media])
            del media
        standin.append_activity(name, "agentMessaged")
        env = {**os.environ, "SESSIONHOOK_API_KEY": standin.api_key}
        proc = subprocess.Popen(
            [str(SESSIONHOOK), "run", "--config", str(config)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 120
            while archived(db) < 2:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the daemon did not archive the two small activities")
                time.sleep(0.1)
            time.sleep(1.0)  # a poll or two more over the huge page
            return vm_hwm_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=50, help="size of the huge artifact")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    base = [one_run(0) for _ in range(args.runs)]
    huge = [one_run(args.mb) for _ in range(args.runs)]
    print(f"baseline peak RSS (no huge answer): median {statistics.median(base):.1f} MB {base}")
    print(
        f"peak RSS with a {args.mb} MB answer served: median {statistics.median(huge):.1f} MB "
        f"{[round(x, 1) for x in huge]}"
    )


if __name__ == "__main__":
    main()
