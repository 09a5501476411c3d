"""``sessionhook`` under ``tracemalloc`` (``bench/scale_rss.py --trace FILE``): on SIGUSR1 it
writes to ``$TRACE_OUT`` what Python holds, the largest first, by line (``$TRACE_FRAMES``
frames of traceback each, 1 by default), then creates ``$TRACE_OUT.done``.

Only Python's allocations are traced: SQLite's page cache, the interpreter and the
libraries' own memory are not; the figures of resident memory come from runs without it
(tracing slows the relay down about threefold and adds its own memory).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from types import FrameType

FRAMES = int(os.environ.get("TRACE_FRAMES", "1"))
TOP = int(os.environ.get("TRACE_TOP", "40"))


#: The snapshot taken when the traced memory was highest (sampled every second).
_highest: list[tuple[int, tracemalloc.Snapshot]] = []


def _snapshot() -> tracemalloc.Snapshot:
    return tracemalloc.take_snapshot().filter_traces(
        [
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
        ]
    )


def _sample() -> None:
    while True:
        time.sleep(1.0)
        current = tracemalloc.get_traced_memory()[0]
        if not _highest or current > _highest[0][0] + 2**20:
            _highest[:] = [(current, _snapshot())]


def _top(stats: list[tracemalloc.StatisticDiff] | list[tracemalloc.Statistic]) -> list[str]:
    lines = []
    for stat in stats[:TOP]:
        diff = (
            f" ({stat.size_diff / 2**20:+.2f})"
            if isinstance(stat, tracemalloc.StatisticDiff)
            else ""
        )
        lines.append(f"{stat.size / 2**20:8.2f} MB{diff} {stat.count:9d} blocks")
        lines.extend("        " + line for line in stat.traceback.format(limit=FRAMES))
    return lines


def _dump(_signum: int, _frame: FrameType | None) -> None:
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    snapshot = _snapshot()
    status = Path("/proc/self/status").read_text().splitlines()
    key = "traceback" if FRAMES > 1 else "lineno"
    lines = [
        f"traced now {current / 2**20:.1f} MB, peak {peak / 2**20:.1f} MB",
        *(line for line in status if line.startswith(("VmRSS", "VmHWM"))),
        "",
        *_top(snapshot.statistics(key)),
    ]
    if _highest:
        highest, then = _highest[0]
        lines += [
            "",
            f"at the highest sample, {highest / 2**20:.1f} MB: what it held more than now",
            *_top(then.compare_to(snapshot, key)),
        ]
    out = os.environ["TRACE_OUT"]
    Path(out).write_text("\n".join(lines) + "\n")
    Path(out + ".done").touch()


def main() -> None:
    tracemalloc.start(FRAMES)
    signal.signal(signal.SIGUSR1, _dump)
    threading.Thread(target=_sample, daemon=True).start()
    from sessionhook.__main__ import main as sessionhook

    sys.argv = ["sessionhook", *sys.argv[1:]]
    sessionhook()


if __name__ == "__main__":
    main()
