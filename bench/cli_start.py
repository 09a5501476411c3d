"""CPU time of a ``sessionhook`` command from exec to exit (issue 20, item 14).

Each command runs ``--runs`` times as a child process; its CPU time (user + system) is read
from ``resource.getrusage(RUSAGE_CHILDREN)`` around the run, so neither this script nor the
emulator it talks to is counted. The baseline, measured in the same invocation, is the bare
interpreter (``python -c pass``); each command's median is printed with its ratio to it.
``sessions list`` goes to a ``sessionhook emulator`` started here on loopback, holding a few
sessions.

    .venv/bin/python bench/cli_start.py --runs 7
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SESSIONHOOK = str(Path(sys.executable).parent / "sessionhook")
API_KEY = "bench-key"


def cpu_of(argv: list[str], env: dict[str, str]) -> float:
    """CPU seconds (user + system) the command took; it must exit 0."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, env=env, capture_output=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{argv} exited {done.returncode}: {done.stderr.decode()[-400:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@contextmanager
def emulator() -> Iterator[str]:
    """A ``sessionhook emulator`` on an ephemeral loopback port; yields its base URL."""
    proc = subprocess.Popen(
        [SESSIONHOOK, "emulator", "--port", "0", "--api-key", API_KEY, "--seed", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "... listening on http://127.0.0.1:PORT (...)"
        url = line.split("listening on ", 1)[1].split()[0]
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, emulator() as url:
        env = {**os.environ, "SESSIONHOOK_API_KEY": API_KEY, "SESSIONHOOK_BASE_URL": url}
        env["SESSIONHOOK_CONFIG"] = str(Path(tmp) / "absent.toml")
        for n in range(3):
            cpu_of([SESSIONHOOK, "sessions", "create", f"bench session {n}"], env)
        commands = {
            "python -c pass (baseline)": [sys.executable, "-c", "pass"],
            "sessionhook --help": [SESSIONHOOK, "--help"],
            "sessionhook sessions list --help": [SESSIONHOOK, "sessions", "list", "--help"],
            "sessionhook sessions list": [SESSIONHOOK, "sessions", "list"],
            "sessionhook status --help": [SESSIONHOOK, "status", "--help"],
            "sessionhook run --help": [SESSIONHOOK, "run", "--help"],
        }
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):  # interleaved: a burst of load hits every command alike
            for name, argv in commands.items():
                samples[name].append(cpu_of(argv, env))
    base = statistics.median(samples["python -c pass (baseline)"])
    print(f"CPU (user+sys) per run, median of {args.runs}, load {os.getloadavg()[0]:.1f}")
    for name, values in samples.items():
        median = statistics.median(values)
        ratio = median / base if base else float("nan")
        print(
            f"  {name:<36} {median:6.3f} s  ({ratio:5.1f}x baseline; "
            f"min {min(values):.3f}, max {max(values):.3f})"
        )


if __name__ == "__main__":
    main()
