"""A real full disk for tests: a small tmpfs mounted on a test directory, and a ballast file
that fills it to the brim and gives the space back.

Mounting needs root (CAP_SYS_ADMIN); where that is not available the test is skipped with
the reason (the same cases run on SQLite's ``max_page_count`` in tests/test_store_full.py,
which needs nothing).
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["Ballast", "tiny_filesystem"]


@contextlib.contextmanager
def tiny_filesystem(path: Path, size_kib: int) -> Iterator[Path]:
    """Mount a ``size_kib`` KiB tmpfs on ``path`` (created) for the block, then unmount."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


class Ballast:
    """A file that takes every free byte of its filesystem until :meth:`free`."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "ballast"

    def fill(self) -> int:
        """Write until the filesystem is full; returns the bytes the ballast now holds."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (65536, 4096, 512, 1):
                block = b"\0" * chunk
                while True:
                    try:
                        os.write(fd, block)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)
        return self.path.stat().st_size

    def free(self) -> None:
        """Give the space back."""
        self.path.unlink(missing_ok=True)
