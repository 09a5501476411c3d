"""The servers of the delivery benchmarks (``bench/throughput.py``,
``bench/replicas_throughput.py``), each in its own process (``python bench/_bench_servers.py
standin|receiver ...`` prints ``PORT <n>`` and serves until killed; :func:`spawn` starts
one, :func:`get_json` asks one, :func:`stop` ends a relay):

* ``standin``: the tests' stand-in of the Sessions API (``tests/support/standin.py``, the
  one fake upstream besides the emulator) serving a generated account: sessions and
  activities of plausible shapes and sizes (field notes), text that compresses about like
  prose. Control paths start with ``/_bench/``.
* ``receiver``: a keep-alive webhook receiver answering 204 at once (``--delay-ms``: that
  long after the request, as a receiver that works before it answers), checking every
  signature, counting per path. Raw asyncio, free of frameworks (and of ``sessionhook``
  imports): the bench must measure the relay, not a slow test server. A minimal HTTP/1.1
  parser: request line, headers, ``content-length`` bodies, keep-alive.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the stand-in of the tests
#: Clock ticks a second of /proc's CPU times.
TICK = os.sysconf("SC_CLK_TCK")
#: The key the stand-in takes (the benchmarks' relays are configured with it).
API_KEY = "bench-api-key-0123456789"


# --------------------------------------------------------------------------- processes


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def server_cpu_seconds(postmaster: int) -> float:
    """CPU of a PostgreSQL server: the postmaster, its children alive (the backends, the
    background processes) and those it has reaped (``cutime``/``cstime``), from /proc."""
    fields = Path(f"/proc/{postmaster}/stat").read_text().rsplit(")", 1)[1].split()
    total = sum(int(f) for f in fields[11:15])
    for child in Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split():
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def migrated_copy(store: Path, to: Path, env: dict[str, str] | None) -> Path:
    """A copy of the SQLite ``store`` at ``to``, migrated to the schema of the tree whose
    environment is ``env`` (``sessionhook store copy`` reads its source read-only, so a store
    an older tree ingested must be opened writable by the newer one first)."""
    shutil.copy(store, to)
    migrate = (
        "import sys; from sessionhook.relay.store import Store; Store.open(sys.argv[1]).close()"
    )
    subprocess.run([sys.executable, "-c", migrate, str(to)], env=env, check=True)
    return to


def spawn(args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int]:
    """Start a server of this module (``args``: its role and options); (process, port)."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__)), *args], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return proc, int(line.split()[1])


def get_json(port: int, path: str) -> Any:
    """GET ``path`` of a server on 127.0.0.1 (a control path): its JSON answer."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as answer:
        return json.loads(answer.read())


def stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM (a relay drains and exits), SIGKILL after 30 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------- serving


Handler = Any  # (method, target, headers, body) -> (status, body bytes, content type)


class HttpProtocol(asyncio.Protocol):
    """A keep-alive HTTP/1.1 server connection calling ``handler`` per request."""

    def __init__(self, handler: Handler, stats: dict[str, int], delay: float = 0.0) -> None:
        self._handler = handler
        self._delay = delay  # seconds before each answer (in order: equal delays keep it)
        self._buf = b""
        self._transport: asyncio.Transport | None = None
        self._stats = stats
        self._counted = False  # connections that carried a POST (not the bench's own GETs)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while True:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self._buf[:end].decode("latin-1").split("\r\n")
            headers: dict[str, str] = {}
            for line in head[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0") or 0)
            if len(self._buf) < end + 4 + length:
                return
            body = self._buf[end + 4 : end + 4 + length]
            self._buf = self._buf[end + 4 + length :]
            method, target, _ = head[0].split(" ", 2)
            if method == "POST" and not self._counted:
                self._counted = True
                self._stats["connections"] = self._stats.get("connections", 0) + 1
            status, payload, ctype = self._handler(method, target, headers, body)
            reason = {200: "OK", 204: "No Content", 404: "Not Found", 400: "Bad Request"}
            out = f"HTTP/1.1 {status} {reason.get(status, 'X')}\r\n"
            if status != 204:
                out += f"content-type: {ctype}\r\ncontent-length: {len(payload)}\r\n"
            assert self._transport is not None
            answer = out.encode() + b"\r\n" + payload
            if self._delay > 0 and not target.startswith("/_bench/"):
                asyncio.get_running_loop().call_later(self._delay, self._answer, answer)
            else:
                self._transport.write(answer)

    def _answer(self, answer: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(answer)


def _listen(port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    return sock


async def _serve(handler: Handler, stats: dict[str, int], delay: float = 0.0) -> None:
    loop = asyncio.get_running_loop()
    sock = _listen()
    server = await loop.create_server(lambda: HttpProtocol(handler, stats, delay), sock=sock)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def _json(obj: Any, status: int = 200) -> tuple[int, bytes, str]:
    return status, json.dumps(obj, separators=(",", ":")).encode(), "application/json"


# --------------------------------------------------------------------------- data


def fmt(moment: datetime) -> str:
    """The service's timestamp spelling: UTC, microseconds, ``Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _vocabulary(size: int = 3000) -> tuple[list[str], list[float]]:
    """Pseudo-words with Zipf frequencies: text that compresses about like prose (a list of
    25 real words would compress far better than anything an agent writes)."""
    rng = random.Random(42)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    weights_l = [12, 9, 8, 8, 7, 7, 6, 6, 6, 4, 4, 3, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1]
    words = sorted(
        {"".join(rng.choices(letters, weights_l, k=rng.randint(2, 9))) for _ in range(size)}
    )
    rng.shuffle(words)
    return words, [1 / (rank + 1) for rank in range(len(words))]


_WORDS, _WEIGHTS = _vocabulary()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(_WORDS, _WEIGHTS, k=words)).capitalize() + "."


def _patch(rng: random.Random, lines: int) -> str:
    body = "".join(f"+    {_text(rng, 6)}\n" for _ in range(lines))
    return f"--- a/src/mod.py\n+++ b/src/mod.py\n@@ -1,3 +1,{lines + 3} @@\n{body}"


def make_activity(
    rng: random.Random, session: str, index: int, total: int, at: str
) -> dict[str, Any]:
    """One plausible activity (field notes shapes) of a session's history."""
    aid = f"{rng.getrandbits(128):032x}"
    act: dict[str, Any] = {
        "name": f"{session}/activities/{aid}",
        "id": aid,
        "createTime": at,
        "originator": "agent",
    }
    if index == 0:
        act["originator"] = "system"
        act["description"] = "Session started"
    elif index == 1:
        steps = [
            {"id": f"{rng.getrandbits(128):032x}", "title": _text(rng, 5), "index": i}
            for i in range(5)
        ]
        steps[0].pop("index")
        act["planGenerated"] = {"plan": {"id": f"{rng.getrandbits(128):032x}", "steps": steps}}
    elif index == 2:
        act["originator"] = "user"
        act["planApproved"] = {"planId": f"{rng.getrandbits(128):032x}"}
    elif index == total - 1:
        act["sessionCompleted"] = {}
        act["artifacts"] = [
            {
                "changeSet": {
                    "source": "sources/github/acme/api",
                    "gitPatch": {
                        "unidiffPatch": _patch(rng, 8),
                        "baseCommitId": f"{rng.getrandbits(160):040x}",
                        "suggestedCommitMessage": _text(rng, 8),
                    },
                }
            }
        ]
    elif index % 10 == 5:
        act["agentMessaged"] = {"agentMessage": _text(rng, 30)}
    else:
        act["progressUpdated"] = {"title": _text(rng, 6), "description": _text(rng, 14)}
        kind = index % 3
        if kind == 0:
            act["artifacts"] = [
                {
                    "changeSet": {
                        "source": "sources/github/acme/api",
                        "gitPatch": {
                            "unidiffPatch": _patch(rng, 4),
                            "baseCommitId": f"{rng.getrandbits(160):040x}",
                        },
                    }
                }
            ]
        elif kind == 1:
            act["artifacts"] = [{"bashOutput": {"command": "pytest -q", "output": _text(rng, 16)}}]
    return act


def make_session(rng: random.Random, i: int, at: str, state: str) -> dict[str, Any]:
    sid = str(rng.randrange(10**19, 10**20))
    return {
        "name": f"sessions/{sid}",
        "id": sid,
        "prompt": f"Task {i}: " + _text(rng, 24),
        "title": f"Task {i}: " + _text(rng, 5),
        "state": state,
        "url": f"https://agent.example.test/session/{sid}",
        "createTime": at,
        "updateTime": at,
        "sourceContext": {
            "source": "sources/github/acme/api",
            "githubRepoContext": {"startingBranch": "main"},
        },
    }


# --------------------------------------------------------------------------- stand-in


def generate(
    sessions: int, activities: int, mode: str, seed: int, base: datetime
) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """An account's history: ``sessions`` sessions created a second apart from ``base``;
    ``backlog`` mode gives each ``activities`` past activities (COMPLETED sessions, activity
    j of every session before activity j + 1 of any: a time cut, replay --until, takes the
    same share of each session); ``live`` mode starts them IN_PROGRESS and empty."""
    rng = random.Random(seed)
    made = []
    for i in range(sessions):
        at = base + timedelta(seconds=i)
        state = "COMPLETED" if mode == "backlog" else "IN_PROGRESS"
        s = make_session(rng, i, fmt(at), state)
        acts = []
        if mode == "backlog":
            for j in range(activities):
                moment = base + timedelta(hours=1, seconds=j * sessions + i)
                acts.append(make_activity(rng, s["name"], j, activities, fmt(moment)))
            s["updateTime"] = acts[-1]["createTime"]
        made.append((s, acts))
    return made


def serve_standin(args: argparse.Namespace) -> None:
    """The tests' stand-in of the Sessions API (tests/support/standin.py) serving a
    generated account (:func:`generate`), with the bench's control paths: ``stats`` (the
    first API request's wall time and the requests since the last ``reset``), ``reset``,
    ``cut?share=S`` (a time taking about S of each session's activities) and, in ``live``
    mode, ``start?rate=R&seconds=S`` (activities appended round-robin at R a second)."""
    # Imported here: the receiver's process (the other role) stays free of Starlette.
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from tests.support.standin import StandIn

    base = datetime.now(UTC) - timedelta(days=2)
    history = generate(args.sessions, args.activities, args.mode, args.seed, base)
    counted_from = 0  # requests before the last reset

    async def control(request: Request) -> JSONResponse:
        nonlocal counted_from
        what = request.path_params["what"]
        seen = standin.requests()
        if what == "stats":
            mine = seen[counted_from:]
            first = time.time() - (time.monotonic() - mine[0].at) if mine else None
            return JSONResponse({"first_request": first, "requests": len(mine)})
        if what == "reset":
            counted_from = len(seen)
            return JSONResponse({})
        if what == "cut":
            j = int(args.activities * float(request.query_params["share"]))
            until = base + timedelta(hours=1, seconds=j * args.sessions)
            return JSONResponse({"until": fmt(until)})
        if what == "start":
            rate = float(request.query_params["rate"])
            seconds = float(request.query_params["seconds"])
            names = [s["name"] for s, _ in history]
            threading.Thread(target=produce, args=(names, rate, seconds), daemon=True).start()
            return JSONResponse({})
        return JSONResponse({}, status_code=404)

    def produce(names: list[str], rate: float, seconds: float) -> None:
        rng = random.Random(args.seed + 1)
        started = time.monotonic()
        n = 0
        while time.monotonic() - started < seconds:
            name = names[n % len(names)]
            standin.append_raw(name, make_activity(rng, name, 3 + n, 10**9, fmt(datetime.now(UTC))))
            n += 1
            time.sleep(max(0.0, started + n / rate - time.monotonic()))

    standin = StandIn(api_key=API_KEY, max_page_size=100, routes=[Route("/_bench/{what}", control)])
    for session, activities in history:
        standin.add_recorded_session(session, activities)
    with standin:
        print(f"PORT {standin.base_url.rsplit(':', 1)[1]}", flush=True)
        threading.Event().wait()


# --------------------------------------------------------------------------- receiver


class Receiver:
    """Counts verified POSTs per path; answers 204 at once. ``/_bench/stats`` reports,
    ``/_bench/reset`` clears. Every signature is checked (HMAC-SHA256, Standard Webhooks);
    with ``latency`` the body's ``timestamp`` is kept to compute created -> received."""

    def __init__(self, secret: str) -> None:
        self.key = base64.b64decode(secret.removeprefix("whsec_"))
        self.stats: dict[str, int] = {}
        self.reset()

    def reset(self) -> None:
        self.counts: dict[str, int] = {}
        self.first: float | None = None
        self.last: float | None = None
        self.bad = 0
        self.body_bytes = 0
        self.stamps: list[tuple[float, bytes]] = []
        self.conn_base = self.stats.get("connections", 0)

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes):  # type: ignore[no-untyped-def]
        if target.startswith("/_bench/"):
            return self._control(target)
        now = time.time()
        msg = f"{headers.get('webhook-id')}.{headers.get('webhook-timestamp')}.".encode() + body
        expected = base64.b64encode(hmac.new(self.key, msg, hashlib.sha256).digest()).decode()
        given = [s.partition(",")[2] for s in headers.get("webhook-signature", "").split()]
        if not any(hmac.compare_digest(expected, g) for g in given):
            self.bad += 1
        self.counts[target] = self.counts.get(target, 0) + 1
        self.body_bytes += len(body)
        if self.first is None:
            self.first = now
        self.last = now
        if target.endswith("/lat"):
            start = body.find(b'"timestamp":"')
            self.stamps.append((now, body[start + 13 : start + 13 + 27]))
        return 204, b"", ""

    def _control(self, target: str):  # type: ignore[no-untyped-def]
        if target.startswith("/_bench/reset"):
            self.reset()
            return _json({})
        latencies = []
        for arrived, stamp in self.stamps:
            created = datetime.strptime(stamp.decode(), "%Y-%m-%dT%H:%M:%S.%fZ")
            latencies.append(arrived - created.replace(tzinfo=UTC).timestamp())
        return _json(
            {
                "counts": self.counts,
                "total": sum(self.counts.values()),
                "first": self.first,
                "last": self.last,
                "bad_signatures": self.bad,
                "body_bytes": self.body_bytes,
                "connections": self.stats.get("connections", 0) - self.conn_base,
                "latencies": latencies if "latency" in target else [],
            }
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("standin", "receiver"))
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--activities", type=int, default=100)
    parser.add_argument("--mode", choices=("backlog", "live"), default="backlog")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--secret", default="")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="receiver: answer this late")
    args = parser.parse_args()
    try:
        if args.role == "standin":
            serve_standin(args)
        else:
            receiver = Receiver(args.secret)
            asyncio.run(_serve(receiver.handle, receiver.stats, args.delay_ms / 1000))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
