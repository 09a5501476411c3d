"""Wall and CPU time of ``make demo``'s install (``make .venv/.runtime``) on a fresh copy of
a checkout, with the package caches empty (cold) and filled by an earlier run (warm).

Each ``--tree NAME=CHECKOUT`` is copied (its tracked and untracked, not ignored, files) into
a new temporary directory for every run, and ``make .venv/.runtime`` runs there with pip's
and uv's caches pointed at a directory of this script's: a new empty one for a cold run, the
tree's own (filled by one unmeasured run first) for a warm one. ``--no-pip-config``: pip
reads no config file, as on a machine whose pip.conf names no local mirror of wheels. CPU is
user + system of make and everything it started (``RUSAGE_CHILDREN``). Runs are
interleaved, tree after tree, so a burst of load hits each alike; every median is printed
with its ratio to the first tree's median (the baseline), and the median of the
per-repetition ratios.

    git worktree add --detach /tmp/main main
    .venv/bin/python bench/install.py --tree pip=/tmp/main --tree uv=. --reps 5
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

TARGET = ".venv/.runtime"


def copy_checkout(checkout: Path, into: Path) -> None:
    listed = subprocess.run(
        [
            "git",
            "-C",
            str(checkout),
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ],
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = checkout / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)


def install(checkout: Path, cache: Path, env: dict[str, str]) -> tuple[float, float]:
    """One ``make .venv/.runtime`` in a fresh copy of ``checkout``: (wall, CPU) seconds."""
    with tempfile.TemporaryDirectory(prefix="bench-install-") as tmp:
        work = Path(tmp)
        copy_checkout(checkout, work)
        env = {**env, "PIP_CACHE_DIR": str(cache / "pip"), "UV_CACHE_DIR": str(cache / "uv")}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        subprocess.run(["make", "--quiet", TARGET], cwd=work, env=env, check=True)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        assert (work / TARGET).exists()
        return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=CHECKOUT")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--no-pip-config",
        action="store_true",
        help="pip reads no config file (a machine's pip.conf may point it at a local mirror)",
    )
    args = parser.parse_args()
    env = dict(os.environ, **({"PIP_CONFIG_FILE": os.devnull} if args.no_pip_config else {}))
    trees = {name: Path(path).resolve() for name, _, path in (t.partition("=") for t in args.tree)}
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-install-caches-") as caches:
        warm = {name: Path(caches) / name for name in trees}
        for name, checkout in trees.items():
            install(checkout, warm[name], env)  # fills the tree's warm cache
        for rep in range(args.reps):
            for name, checkout in trees.items():
                cold = Path(caches) / f"cold-{name}-{rep}"
                for mode, cache in (("cold", cold), ("warm", warm[name])):
                    wall, cpu = install(checkout, cache, env)
                    results.setdefault((mode, name), []).append((wall, cpu))
                    print(f"rep {rep + 1} {mode} {name}: wall {wall:.1f} s, CPU {cpu:.1f} s")
                shutil.rmtree(cold, ignore_errors=True)
    baseline = next(iter(trees))
    print(f"\nmedians of {args.reps}; ratios to {baseline} (median of per-repetition ratios)")
    for mode in ("cold", "warm"):
        base = results[(mode, baseline)]
        for name in trees:
            runs = results[(mode, name)]
            line = [f"{mode} {name:>8}:"]
            for i, what in ((0, "wall"), (1, "CPU")):
                median = statistics.median(r[i] for r in runs)
                ratio = statistics.median(r[i] / b[i] for r, b in zip(runs, base, strict=True))
                line.append(f"{what} {median:6.1f} s ({ratio:.2f}x)")
            print("  ".join(line))


if __name__ == "__main__":
    main()
