"""The ``sessionhook`` command, each call a child forked from a warm interpreter.

A fresh ``sessionhook`` spends most of a second of CPU importing its command's modules
(pydantic models, the store, the HTTP clients) before it does anything: a test that runs
dozens of commands for their output spends minutes of a shared machine on that. Here one
server process imports the command line once and forks a child per call: the child is a
process of its own (its own stdin on /dev/null, stdout and stderr, environment, working
directory and exit status) that runs ``sessionhook``'s entry point, as the installed script
does. Tests about the interpreter itself (start-up, lazy imports, signals, Ctrl-C) run the
real script (:func:`tests.support.relay_process.sessionhook`).

:func:`run` is the client; the server is this module run as a program (``python -m``),
started on first use and ended when the test process closes its socket.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import importlib
import json
import math
import os
import pkgutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

__all__ = ["run"]

#: What the commands load on demand, imported by the server before it forks.
PRELOAD = ("sessionhook.cli", "sessionhook.relay.config", "sessionhook.relay.ops")

_server: tuple[subprocess.Popen[bytes], socket.socket] | None = None
_lock = threading.Lock()


def run(
    *args: str, env: dict[str, str], cwd: Path | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """``sessionhook ARGS`` to its end in ``env`` (no stdin, text output captured), in a
    child forked from the warm server. Blocking: call it from a thread in async code.
    A child still running ``timeout`` seconds later (rounded up) is killed and
    :class:`subprocess.TimeoutExpired` raised, as :func:`subprocess.run` does."""
    global _server
    alarm = 0 if timeout is None else max(1, math.ceil(timeout))
    request = {"args": list(args), "env": env, "cwd": str(cwd or Path.cwd()), "alarm": alarm}
    with _lock:
        if _server is None or _server[0].poll() is not None:
            _server = _start()
        process, sock = _server
        sock.sendall(json.dumps(request).encode() + b"\n")
        answer = _read_line(sock)
        if not answer:
            raise RuntimeError(f"the forked-cli server ended ({process.poll()})")
    done = json.loads(answer)
    out, err = (base64.b64decode(done[k]).decode() for k in ("stdout", "stderr"))
    if alarm and done["returncode"] == -signal.SIGALRM:
        raise subprocess.TimeoutExpired(["sessionhook", *args], alarm, out, err)
    return subprocess.CompletedProcess(["sessionhook", *args], done["returncode"], out, err)


def _start() -> tuple[subprocess.Popen[bytes], socket.socket]:
    ours, theirs = socket.socketpair()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.support.forked_cli", str(theirs.fileno())],
        pass_fds=(theirs.fileno(),),
        stdin=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parents[2],
    )
    theirs.close()
    atexit.register(_stop, process, ours)
    return process, ours


def _stop(process: subprocess.Popen[bytes], sock: socket.socket) -> None:
    sock.close()  # the server reads its end: it ends
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        data += chunk
    return data


# --------------------------------------------------------------------------- the server


def _serve(fd: int) -> None:
    for name in PRELOAD:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(getattr(package, "__path__", []), name + "."):
            importlib.import_module(module.name)
    sock = socket.socket(fileno=fd)
    with sock, sock.makefile("rb") as requests:
        for line in requests:
            answer = _fork(json.loads(line), sock.fileno())
            sock.sendall(json.dumps(answer).encode() + b"\n")


def _fork(request: dict[str, Any], server_fd: int) -> dict[str, Any]:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                os.close(server_fd)
                devnull = os.open(os.devnull, os.O_RDONLY)
                for fd, target in ((0, devnull), (1, out.fileno()), (2, err.fileno())):
                    os.dup2(target, fd)
                os.chdir(request["cwd"])
                os.environ.clear()
                os.environ.update(request["env"])
                signal.alarm(request["alarm"])  # its default action ends the child
                sys.argv = [str(Path(sys.executable).parent / "sessionhook"), *request["args"]]
                code = _main()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        outputs = {}
        for key, file in (("stdout", out), ("stderr", err)):
            file.seek(0)
            outputs[key] = base64.b64encode(file.read()).decode()
    return {"returncode": os.waitstatus_to_exitcode(status), **outputs}


def _main() -> int:
    """``sessionhook.__main__.main()`` as the process's whole life: its exit status."""
    from sessionhook.__main__ import main

    try:
        main()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    return code


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
