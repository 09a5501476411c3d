"""Ctrl-C on a ``sessionhook`` command: exit status 130 and no traceback, wherever it lands.

Two ways to press it. A real SIGINT from the test to a running ``sessionhook`` (the console
script) while it waits in an HTTP call to a server that never answers. And, to land it at
exact points of the start (while the command line or a command's modules are imported), a
fresh interpreter that runs the entry point with an import hook sending SIGINT to its own
process the moment a given module is about to be imported: the interrupt is real, only its
timing is chosen.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from sessionhook.relay.store import Store

pytestmark = pytest.mark.process

SESSIONHOOK = Path(sys.executable).parent / "sessionhook"

_HOOK = """
import importlib.abc, os, signal, sys

class InterruptAt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, InterruptAt())
sys.argv = ["sessionhook", *{args!r}]
from sessionhook.__main__ import main
main()
"""


def _interrupted_at(
    module: str, args: list[str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(_HOOK.format(module=module, args=args))
    env = {**os.environ, "SESSIONHOOK_API_KEY": "k", "SESSIONHOOK_CONFIG": str(tmp_path / "no")}
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.parametrize(
    ("module", "args"),
    [
        # While the command line itself is imported.
        ("click", ["--help"]),
        ("sessionhook.cli.ops_events", ["sessions", "list"]),
        # While a command imports what it needs, after the command line was parsed.
        ("httpx", ["sessions", "list", "--base-url", "http://127.0.0.1:9"]),
        ("sessionhook.relay.store", ["status", "--db", "{db}"]),
        ("sessionhook.relay.store.copying", ["store", "copy", "--from", "{db}", "--to", "{db}2"]),
        ("sessionhook.relay.daemon.daemon", ["run", "--config", "{config}"]),
        ("sessionhook.receiver", ["listen", "--port", "0", "--secret", "whsec_" + "A" * 43]),
    ],
    ids=lambda value: value if isinstance(value, str) else " ".join(value[:2]),
)
def test_ctrl_c_while_importing_exits_130_without_a_traceback(
    module: str, args: list[str], tmp_path: Path
) -> None:
    db = tmp_path / "relay.db"
    Store.open(db).close()
    config = tmp_path / "config.toml"
    config.write_text(f'[store]\npath = "{db}"\n')
    filled = [a.format(db=db, config=config) for a in args]
    done = _interrupted_at(module, filled, tmp_path)
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr
    assert "Aborted" not in done.stderr


def test_ctrl_c_during_an_api_call_exits_130_without_a_traceback(tmp_path: Path) -> None:
    # A server that accepts the request and never answers: the command is inside the call.
    listener = socket.create_server(("127.0.0.1", 0))
    arrived = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        conn, _ = listener.accept()
        held.append(conn)
        conn.recv(65536)
        arrived.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    port = listener.getsockname()[1]
    env = {**os.environ, "SESSIONHOOK_API_KEY": "k"}
    with subprocess.Popen(
        [str(SESSIONHOOK), "sessions", "list", "--base-url", f"http://127.0.0.1:{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    ) as proc:
        try:
            assert arrived.wait(timeout=30), "the command never sent its request"
            time.sleep(0.1)  # well inside the wait for the answer
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
            for conn in held:
                conn.close()
            listener.close()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
