"""The daemon lock: one holder per store, released with the holder, PID in the message."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sessionhook.relay.store import StoreLockedError, acquire_daemon_lock
from sessionhook.relay.store.lock import lock_path

pytestmark = pytest.mark.process


def test_a_second_holder_is_refused_with_the_pid(tmp_path: Path) -> None:
    db = tmp_path / "state" / "relay.db"
    with acquire_daemon_lock(db) as held:
        assert held.path == lock_path(db) == tmp_path / "state" / "relay.db.lock"
        assert stat.S_IMODE(held.path.stat().st_mode) == 0o600
        with pytest.raises(StoreLockedError) as caught:
            acquire_daemon_lock(db)
        assert caught.value.pid == os.getpid()
        assert str(caught.value).startswith(f"another sessionhook holds the store {db} (pid ")
    # Released: the next holder gets it, over the leftover file.
    acquire_daemon_lock(db).release()


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    db = tmp_path / "relay.db"
    code = (
        "import os, sys\n"
        "from sessionhook.relay.store import acquire_daemon_lock\n"
        f"acquire_daemon_lock({str(db)!r})\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            with pytest.raises(StoreLockedError) as caught:
                acquire_daemon_lock(db)
            assert caught.value.pid == holder.pid
        finally:
            holder.kill()
            holder.wait(timeout=10)
    acquire_daemon_lock(db).release()  # the leftover file names a dead PID: not a lock
