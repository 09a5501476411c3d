"""CPU time of a ``sessionhook`` command from exec to exit.

Each command runs ``--runs`` times as a child process; its CPU time (user + system) is read
from ``resource.getrusage(RUSAGE_CHILDREN)`` around the run, so neither this script nor the
emulator it talks to is counted. The baseline, measured in the same invocation, is the bare
interpreter (``python -c pass``); every median is printed with its ratio to it. A second
reference is the floor of an API command: the same list request made by httpx on anyio
with nothing else imported. Runs are interleaved (a burst of load hits every command
alike).

Each ``--tree NAME=SRC`` is a source tree of sessionhook run by this venv's interpreter
(``SRC`` first on ``sys.path``, then its entry point: ``sessionhook.__main__`` where it
exists, else the older ``sessionhook.cli``), so a tree before a change and after it are
measured in one run. ``sessions list`` goes to a ``sessionhook emulator`` started here on
loopback, holding a few sessions; it is measured twice, the second time with ``trio``
hidden: httpcore imports trio when it is installed (about 0.1 s), and only the test extra
(selenium) installs it.

    git worktree add /tmp/before d9fa701
    .venv/bin/python bench/cli_start.py --tree now=src --tree before=/tmp/before/src --runs 9
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

ROOT = Path(__file__).resolve().parent.parent
SESSIONHOOK = str(Path(sys.executable).parent / "sessionhook")
API_KEY = "bench-key"
#: Runs a tree's entry point: argv[1] is the tree, argv[2] "hide-trio" or "-", the rest
#: the command line.
BOOT = """
import sys
src, hide = sys.argv[1], sys.argv[2]
sys.path.insert(0, src)
if hide == "hide-trio":
    sys.modules["trio"] = None
sys.argv = ["sessionhook", *sys.argv[3:]]
try:
    from sessionhook.__main__ import main
except ImportError:
    from sessionhook.cli import main
main()
"""
#: The floor under any API command: the same GET with httpx on anyio, nothing else loaded.
BARE_GET = """
import sys, anyio, httpx
async def get():
    async with httpx.AsyncClient() as http:
        answer = await http.get(sys.argv[1] + "/v1alpha/sessions",
                                headers={"x-vendor-api-key": sys.argv[2]})
        answer.raise_for_status()
        answer.json()
anyio.run(get)
"""
COMMANDS = {
    "sessionhook --help": ["--help"],
    "sessionhook sessions list --help": ["sessions", "list", "--help"],
    "sessionhook sessions list": ["sessions", "list"],
    "sessions list, trio hidden": ["sessions", "list"],
    "sessionhook status --help": ["status", "--help"],
    "sessionhook run --help": ["run", "--help"],
}


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
        yield line.split("listening on ", 1)[1].split()[0]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument(
        "--tree", action="append", metavar="NAME=SRC", help="A tree to measure (default: src)."
    )
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree or [f"now={ROOT / 'src'}"])
    argvs: dict[str, list[str]] = {"python -c pass (baseline)": [sys.executable, "-c", "pass"]}
    for tree, src in trees.items():
        for name, command in COMMANDS.items():
            hide = "hide-trio" if "trio hidden" in name else "-"
            label = name if len(trees) == 1 else f"{tree}: {name}"
            argvs[label] = [sys.executable, "-c", BOOT, str(Path(src).resolve()), hide, *command]
    with tempfile.TemporaryDirectory() as tmp, emulator() as url:
        argvs["bare httpx GET on anyio (floor)"] = [sys.executable, "-c", BARE_GET, url, API_KEY]
        env = {**os.environ, "SESSIONHOOK_API_KEY": API_KEY, "SESSIONHOOK_BASE_URL": url}
        env["SESSIONHOOK_CONFIG"] = str(Path(tmp) / "absent.toml")
        for n in range(3):
            cpu_of([SESSIONHOOK, "sessions", "create", f"bench session {n}"], env)
        samples: dict[str, list[float]] = {name: [] for name in argvs}
        for _ in range(args.runs):
            for name, argv in argvs.items():
                samples[name].append(cpu_of(argv, env))
    base = statistics.median(samples["python -c pass (baseline)"])
    print(f"CPU (user+sys) per run, median of {args.runs}, load {os.getloadavg()[0]:.1f}")
    for name, values in samples.items():
        median = statistics.median(values)
        ratio = median / base if base else float("nan")
        print(
            f"  {name:<44} {median:6.3f} s  ({ratio:5.1f}x baseline; "
            f"min {min(values):.3f}, max {max(values):.3f})"
        )


if __name__ == "__main__":
    main()
