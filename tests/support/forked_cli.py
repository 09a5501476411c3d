"""The ``sessionhook`` command, each call a child forked from a warm interpreter.

A fresh ``sessionhook`` spends most of a second of CPU importing its command's modules
(pydantic models, the store, the HTTP clients) before it does anything: a test that runs
dozens of commands, or starts a daemon for each case, spends minutes of a shared machine on
that. Here one server process imports the command line once and forks a child per call: the
child is a process of its own (its own pid, stdin on /dev/null, stdout and stderr,
environment, working directory, signals and exit status) that runs ``sessionhook``'s entry
point, as the installed script does. Tests about the interpreter itself (start-up, lazy
imports, memory from a fresh start) run the real script
(:func:`tests.support.relay_process.sessionhook`, ``Relay(fresh=True)``).

:func:`run` runs a command to its end and returns its output; :func:`spawn` starts one (a
daemon) and returns a :class:`Forked` to signal and wait on. The server is this module run as
a program (``python -m``), started on first use and ended when the test process closes its
socket; it kills the daemons it started that still run.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import importlib
import itertools
import json
import math
import os
import pkgutil
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["Forked", "run", "spawn"]

#: What the commands load on demand, imported by the server before it forks.
PRELOAD = ("sessionhook.cli", "sessionhook.relay", "sessionhook.emulator")


class _Client:
    """The test process's side: one socket to the server, a thread that reads its answers."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.forked_cli", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            cwd=Path(__file__).resolve().parents[2],
        )
        theirs.close()
        self.sock = ours
        self.send_lock = threading.Lock()
        self.changed = threading.Condition()
        self.answers: dict[int, dict[str, Any]] = {}
        self.ids = itertools.count(1)
        self.ended = False
        threading.Thread(target=self._read, name="forked-cli", daemon=True).start()

    def send(self, request: dict[str, Any]) -> int:
        """Send ``request``; the id its answers carry (a command's end: the id; a spawned
        child's pid, at once: minus the id)."""
        key = next(self.ids)
        with self.send_lock:
            self.sock.sendall(json.dumps({**request, "id": key}).encode() + b"\n")
        return key

    def wait_for(self, key: int, timeout: float | None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.changed:
            while key not in self.answers:
                if self.ended:
                    raise RuntimeError(f"the forked-cli server ended ({self.process.poll()})")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError
                self.changed.wait(left)
            return self.answers[key]

    def _read(self) -> None:
        with contextlib.suppress(OSError), self.sock.makefile("rb") as answers:
            for line in answers:
                answer = json.loads(line)
                with self.changed:
                    self.answers[answer["id"]] = answer
                    self.changed.notify_all()
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    def close(self) -> None:
        self.sock.close()  # the server reads its end: it ends
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


_client: _Client | None = None
_client_lock = threading.Lock()


def _connected() -> _Client:
    global _client
    with _client_lock:
        if _client is None or _client.ended or _client.process.poll() is not None:
            _client = _Client()
            atexit.register(_client.close)
        return _client


def run(
    *args: str,
    env: dict[str, str],
    cwd: Path | None = None,
    timeout: float | None = None,
    umask: int | None = None,
) -> subprocess.CompletedProcess[str]:
    """``sessionhook ARGS`` to its end in ``env`` (no stdin, text output captured), in a
    child forked from the warm server, with ``umask`` if given (else the server's).
    Blocking: call it from a thread in async code. A child still running ``timeout``
    seconds later (rounded up) is killed and :class:`subprocess.TimeoutExpired` raised, as
    :func:`subprocess.run` does."""
    alarm = 0 if timeout is None else max(1, math.ceil(timeout))
    client = _connected()
    request = {"args": list(args), "env": env, "cwd": str(cwd or Path.cwd()), "alarm": alarm}
    key = client.send(request | {"umask": umask})
    done = client.wait_for(key, None)
    out, err = (base64.b64decode(done[k]).decode() for k in ("stdout", "stderr"))
    if alarm and done["returncode"] == -signal.SIGALRM:
        raise subprocess.TimeoutExpired(["sessionhook", *args], alarm, out, err)
    return subprocess.CompletedProcess(["sessionhook", *args], done["returncode"], out, err)


class Forked:
    """A ``sessionhook`` started by :func:`spawn`: what a test uses of
    :class:`subprocess.Popen` (``pid``, ``returncode``, ``poll``, ``wait``, ``send_signal``,
    ``kill``). Its exit status comes from the server, which is its parent."""

    def __init__(self, client: _Client, key: int, pid: int, args: list[str]) -> None:
        self._client = client
        self._key = key
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.wait(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                ended = self._client.wait_for(self._key, timeout)
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
            self.returncode = int(ended["returncode"])
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never a signal to a pid that may be reused
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn(*args: str, env: dict[str, str], cwd: Path, stdout: Path, stderr: Path) -> Forked:
    """Start ``sessionhook ARGS`` in ``env`` and ``cwd`` (stdin on /dev/null, stdout and
    stderr written to the files named), forked from the warm server; it runs until it ends
    or is signalled."""
    client = _connected()
    request = {"args": list(args), "env": env, "cwd": str(cwd), "alarm": 0, "spawn": True}
    key = client.send(request | {"stdout": str(stdout), "stderr": str(stderr)})
    pid = client.wait_for(-key, None)["pid"]
    return Forked(client, key, pid, ["sessionhook", *args])


# --------------------------------------------------------------------------- the server


class _Server:
    """Reads requests and forks a child for each; reaps children and answers for them."""

    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # the wake-up fd does the work
        #: pid -> (request id, output files of a command run to its end, or None).
        self.children: dict[int, tuple[int, tuple[Any, Any] | None]] = {}

    def serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ)
        selector.register(self.wake_r, selectors.EVENT_READ)
        pending = b""
        while True:
            for key, _ in selector.select():
                if key.fileobj is self.wake_r:
                    os.read(self.wake_r, 4096)
                    continue
                data = self.sock.recv(65536)
                if not data:
                    return self.stop()
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self.fork(json.loads(line))
            self.reap()

    def fork(self, request: dict[str, Any]) -> None:
        outputs = None
        if not request.get("spawn"):  # closed once the child is reaped
            outputs = (tempfile.TemporaryFile(), tempfile.TemporaryFile())  # noqa: SIM115
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self.child(request, outputs)
        self.children[pid] = (request["id"], outputs)
        if outputs is None:
            self.answer({"id": -request["id"], "pid": pid})

    def child(self, request: dict[str, Any], outputs: tuple[Any, Any] | None) -> None:
        """The forked child: never returns."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (self.sock.fileno(), self.wake_r, self.wake_w):
                os.close(fd)
            if outputs is None:
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                out, err = (os.open(request[k], flags, 0o644) for k in ("stdout", "stderr"))
            else:
                out, err = (file.fileno() for file in outputs)
            devnull = os.open(os.devnull, os.O_RDONLY)
            for fd, target in ((0, devnull), (1, out), (2, err)):
                os.dup2(target, fd)
            os.chdir(request["cwd"])
            if request.get("umask") is not None:
                os.umask(request["umask"])
            os.environ.clear()
            os.environ.update(request["env"])
            signal.alarm(request["alarm"])  # its default action ends the child
            sys.argv = [str(Path(sys.executable).parent / "sessionhook"), *request["args"]]
            code = _main()
        finally:
            os._exit(code)

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            key, outputs = self.children.pop(pid)
            answer: dict[str, Any] = {"id": key, "returncode": os.waitstatus_to_exitcode(status)}
            for name, file in zip(("stdout", "stderr"), outputs or (), strict=False):
                file.seek(0)
                answer[name] = base64.b64encode(file.read()).decode()
                file.close()
            self.answer(answer)

    def answer(self, answer: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(json.dumps(answer).encode() + b"\n")

    def stop(self) -> None:
        """The test process is gone: so are the daemons it started."""
        for pid, (_, outputs) in self.children.items():
            if outputs is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


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


def _serve(fd: int) -> None:
    for name in PRELOAD:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(getattr(package, "__path__", []), name + "."):
            importlib.import_module(module.name)
    _Server(fd).serve()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
