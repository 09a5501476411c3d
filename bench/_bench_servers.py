"""Raw asyncio servers for ``bench/throughput.py``: a stand-in of the Sessions API and a
keep-alive webhook receiver answering 204. Each runs in its own process (``python
bench/_bench_servers.py standin|receiver ...``), prints ``PORT <n>`` and serves until killed.

Deliberately free of frameworks (and of ``sessionhook`` imports): the bench must measure the
relay, not a slow test server. A minimal HTTP/1.1 parser: request line, headers,
``content-length`` bodies, keep-alive. Control paths start with ``/_bench/``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import random
import socket
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

Handler = Any  # (method, target, headers, body) -> (status, body bytes, content type)


class HttpProtocol(asyncio.Protocol):
    """A keep-alive HTTP/1.1 server connection calling ``handler`` per request."""

    def __init__(self, handler: Handler, stats: dict[str, int]) -> None:
        self._handler = handler
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
            self._transport.write(out.encode() + b"\r\n" + payload)


def _listen(port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    return sock


async def _serve(handler: Handler, stats: dict[str, int]) -> None:
    loop = asyncio.get_running_loop()
    sock = _listen()
    server = await loop.create_server(lambda: HttpProtocol(handler, stats), sock=sock)
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


_TS_CACHE: dict[str, float] = {}


def _ts(text: str) -> float:
    value = _TS_CACHE.get(text)
    if value is None:
        value = _TS_CACHE[text] = datetime.fromisoformat(text).timestamp()
    return value


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


class StandIn:
    """The Sessions API: ``sessions`` sessions; ``backlog`` mode gives each ``activities``
    past activities (COMPLETED sessions); ``live`` mode starts them IN_PROGRESS, empty, and
    ``/_bench/start?rate=R&seconds=S`` appends activities round-robin at R per second."""

    def __init__(self, sessions: int, activities: int, mode: str, seed: int) -> None:
        self.rng = random.Random(seed)
        self.stats: dict[str, int] = {}
        self.first_request: float | None = None
        self.requests = 0
        self.sessions: list[dict[str, Any]] = []
        self.acts: dict[str, list[dict[str, Any]]] = {}
        self.created: list[tuple[str, float]] = []  # (createTime, monotonic) of live ones
        base = datetime.now(UTC) - timedelta(days=2)
        self.base = base
        for i in range(sessions):
            at = base + timedelta(seconds=i)
            s = make_session(
                self.rng, i, fmt(at), "COMPLETED" if mode == "backlog" else "IN_PROGRESS"
            )
            self.sessions.append(s)
            self.acts[s["name"]] = []
            if mode == "backlog":
                for j in range(activities):
                    # Activity j of every session before activity j + 1 of any: a time cut
                    # (replay --until) takes the same share of each session.
                    moment = base + timedelta(hours=1, seconds=j * sessions + i)
                    self.acts[s["name"]].append(
                        make_activity(self.rng, s["name"], j, activities, fmt(moment))
                    )
                s["updateTime"] = self.acts[s["name"]][-1]["createTime"]
        self.sessions.sort(key=lambda s: s["createTime"], reverse=True)
        self.by_name = {s["name"]: s for s in self.sessions}
        self.live_activities = activities

    def cut(self, share: float) -> str:
        """A time taking about ``share`` of each session's activities (for replay --until)."""
        j = int(self.live_activities * share)
        return fmt(self.base + timedelta(hours=1, seconds=j * len(self.sessions)))

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes):  # type: ignore[no-untyped-def]
        parts = urlsplit(target)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        path = unquote(parts.path)
        if path.startswith("/_bench/"):
            return self._control(path, query)
        self.requests += 1
        if self.first_request is None:
            self.first_request = time.time()
        segs = path.removeprefix("/v1alpha/").strip("/").split("/")
        if segs[0] != "sessions":
            return _json({"error": {"code": 404, "message": "nf", "status": "NOT_FOUND"}}, 404)
        size = min(100, int(query.get("pageSize", "30")))
        offset = int(query.get("pageToken", "0") or 0)
        if len(segs) == 1:
            page = self.sessions[offset : offset + size]
            reduced = [
                {k: s[k] for k in ("name", "id", "title", "state", "createTime", "updateTime")}
                for s in page
            ]
            out: dict[str, Any] = {"sessions": reduced} if reduced else {}
            if offset + size < len(self.sessions):
                out["nextPageToken"] = str(offset + size)
            return _json(out)
        name = f"sessions/{segs[1]}"
        session = self.by_name.get(name)
        if session is None:
            return _json({"error": {"code": 404, "message": "nf", "status": "NOT_FOUND"}}, 404)
        if len(segs) == 2:
            return _json(session)
        items = self.acts[name]
        bound = query.get("createTime")
        if bound:
            limit = datetime.fromisoformat(bound).timestamp()
            items = [a for a in items if _ts(a["createTime"]) > limit]
        page = items[offset : offset + size]
        out = {"activities": page} if page else {}
        if offset + size < len(items):
            out["nextPageToken"] = str(offset + size)
        return _json(out)

    def _control(self, path: str, query: dict[str, str]):  # type: ignore[no-untyped-def]
        if path == "/_bench/stats":
            return _json(
                {
                    "first_request": self.first_request,
                    "requests": self.requests,
                    "connections": self.stats.get("connections", 0),
                }
            )
        if path == "/_bench/reset":
            self.first_request, self.requests = None, 0
            return _json({})
        if path == "/_bench/cut":
            return _json({"until": self.cut(float(query["share"]))})
        if path == "/_bench/start":
            asyncio.get_running_loop().create_task(
                self._produce(float(query["rate"]), float(query["seconds"]))
            )
            return _json({})
        return _json({}, 404)

    async def _produce(self, rate: float, seconds: float) -> None:
        started = time.monotonic()
        n = 0
        while time.monotonic() - started < seconds:
            s = self.sessions[n % len(self.sessions)]
            now = datetime.now(UTC)
            act = make_activity(self.rng, s["name"], 3 + n, 10**9, fmt(now))
            self.acts[s["name"]].append(act)
            s["updateTime"] = act["createTime"]
            n += 1
            await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))


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
    args = parser.parse_args()
    if args.role == "standin":
        app: Any = StandIn(args.sessions, args.activities, args.mode, args.seed)
    else:
        app = Receiver(args.secret)
    try:
        asyncio.run(_serve(app.handle, app.stats))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
