"""A verifying webhook receiver, and the one-line view of an event: what ``sessionhook
listen`` serves and the demo's consumer is built on.

:class:`Receiver` is an ASGI app that accepts a ``POST`` on any path only when it is a
Standard Webhooks message signed with one of its keys, stamped within the tolerance, and
whose body is a JSON object (204); anything else gets a one-line reason (405, 413, 401,
400). Everything a message carries is the sender's text: :func:`printable` escapes terminal
control characters, and every printed part goes through it.
"""

from __future__ import annotations

import json
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import anyio
import anyio.abc
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from .relay.domain import signing
from .relay.web.server import HealthServerError, serve
from .wording import counted

#: The default bound of a body the receiver reads (the relay's events are far smaller,
#: unless media artifacts are forwarded with a raised ``delivery.max_media_bytes``).
MAX_BODY: Final = 8 * 1024 * 1024
#: How many accepted webhook-ids are remembered to tell duplicates (a bounded memory).
REMEMBERED: Final = 10_000
#: The request headers ``--json`` shows.
INTERESTING_HEADERS: Final = (
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "content-type",
    "user-agent",
)


class ListenError(Exception):
    """The receiver cannot listen (a malformed or taken address); ``str()`` is one line,
    :attr:`hint` what to do."""

    hint = "another --port (0 picks a free one)"


@dataclass(frozen=True, slots=True)
class Delivery:
    """An accepted message: where it came in, its headers of interest and parsed body."""

    path: str
    webhook_id: str
    headers: dict[str, str]
    body: dict[str, Any]
    duplicate: bool
    received_at: float


@dataclass(frozen=True, slots=True)
class Refusal:
    """A refused request: the status answered and the one-line reason."""

    status: int
    reason: str
    method: str
    path: str
    client: str
    webhook_id: str


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Receiver:
    """The ASGI app of a verifying webhook endpoint (see the module's docstring).

    ``keys`` are the secrets and public keys a message may be signed with (any one
    suffices: a rotation in progress signs with several); one that is neither raises
    :class:`ValueError`. ``rejected`` counts refusals. ``respond`` is the status an accepted
    message gets (204; say 500 or 429, with ``retry_after`` seconds, to watch a sender
    retry); a message whose type ``wanted`` says no to is answered 204 and counted in
    ``unwanted``, not handed on.
    """

    def __init__(
        self,
        keys: Iterable[str],
        on_delivery: Callable[[Delivery], Awaitable[None]],
        on_refusal: Callable[[Refusal], Awaitable[None]] | None = None,
        *,
        max_body: int = MAX_BODY,
        tolerance: float = signing.DEFAULT_TOLERANCE,
        respond: int = 204,
        retry_after: int | None = None,
        wanted: Callable[[str], bool] | None = None,
    ) -> None:
        if not 200 <= respond <= 599:
            raise ValueError(f"--respond {respond}: a status from 200 to 599")
        self.respond = respond
        self.retry_after = retry_after
        self._wanted = wanted
        self.unwanted = 0
        self.keys = [key for text in keys for key in text.split()]
        if not self.keys:
            raise ValueError("a receiver needs a secret or a public key to verify with")
        for key in self.keys:
            try:
                signing.check_key(key)
            except ValueError as exc:
                raise ValueError(f"cannot verify with {key[:10]}…: {exc}") from None
        self._on_delivery = on_delivery
        self._on_refusal = on_refusal
        self.max_body = max_body
        self.tolerance = tolerance
        self.rejected = 0
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        try:
            delivery = await self._accept(request)
        except _Refused as refused:
            self.rejected += 1
            client = request.client.host if request.client else ""
            if self._on_refusal is not None:
                await self._on_refusal(
                    Refusal(
                        refused.status,
                        refused.reason,
                        request.method,
                        request.url.path,
                        client,
                        request.headers.get("webhook-id", ""),
                    )
                )
            response: Response = PlainTextResponse(refused.reason + "\n", refused.status)
        else:
            if self._wanted is not None and not self._wanted(str(delivery.body.get("type", ""))):
                self.unwanted += 1
                response = Response(status_code=204)
            else:
                await self._on_delivery(delivery)
                headers = {}
                if self.retry_after is not None:
                    headers["retry-after"] = str(self.retry_after)
                response = Response(status_code=self.respond, headers=headers)
        await response(scope, receive, send)

    async def _accept(self, request: Request) -> Delivery:
        if request.method != "POST":
            raise _Refused(405, f"method {request.method}: a webhook is a POST")
        body = await self._read(request)
        try:
            signing.verify(self.keys, request.headers, body, tolerance=self.tolerance)
        except signing.SignatureError as exc:
            raise _Refused(401, f"signature check failed: {exc.reason}") from None
        try:
            payload = json.loads(body)
        except ValueError as exc:
            raise _Refused(400, f"body is not JSON ({exc})") from None
        except RecursionError:
            raise _Refused(400, "body is JSON nested too deeply to read") from None
        if not isinstance(payload, dict):
            raise _Refused(400, f"body is JSON but not an object ({type(payload).__name__})")
        webhook_id = request.headers["webhook-id"]
        headers = {h: request.headers[h] for h in INTERESTING_HEADERS if h in request.headers}
        return Delivery(
            request.url.path,
            webhook_id,
            headers,
            payload,
            self._remember(request.url.path, webhook_id),
            time.time(),
        )

    async def _read(self, request: Request) -> bytes:
        too_big = _Refused(413, f"body larger than {self.max_body} bytes")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body:
            raise too_big
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    def _remember(self, path: str, webhook_id: str) -> bool:
        """Whether this id came before on this path; remembers it (the last
        :data:`REMEMBERED` only)."""
        key = (path, webhook_id)
        if key in self._seen:
            self._seen.move_to_end(key)
            return True
        self._seen[key] = None
        if len(self._seen) > REMEMBERED:
            self._seen.popitem(last=False)
        return False


async def serve_receiver(
    host: str,
    port: int,
    receiver: Receiver,
    *,
    task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``receiver`` on ``host:port`` until cancelled (the relay's listener, with its
    bounds on connections and slow requests); ``task_status`` gets the bound address."""
    listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        await serve(listen, receiver, task_status=task_status)
    except HealthServerError as exc:
        raise ListenError(str(exc)) from None


# --------------------------------------------------------------------------- printing

# C0 and C1 controls (ESC, CSI, BEL, backspace, carriage return...), DEL, line and
# paragraph separators, and the bidirectional overrides that reorder what a terminal shows.
_UNSAFE: Final = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """``text`` with every terminal control character written as an escape (``\\x1b``,
    ``\\u202e``): safe to print, and still showing what was sent."""

    def escape(match: re.Match[str]) -> str:
        code = ord(match.group())
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return _UNSAFE.sub(escape, str(text))


def json_line(record: dict[str, Any]) -> str:
    """``record`` as one line of JSON, non-ASCII kept but no control character raw (JSON
    escapes C0 itself; C1 and the others are escaped here, always inside strings). A
    ``body`` nested too deeply to write (parsed at the edge of the stack) is replaced by a
    note saying so."""
    try:
        text = json.dumps(record, ensure_ascii=False)
    except RecursionError:
        text = json.dumps({**record, "body": "(nested too deeply to print)"}, ensure_ascii=False)
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def clip(text: object, width: int = 60) -> str:
    """``text`` on one line, escaped (:func:`printable`), cut at ``width`` characters."""
    line = printable(" ".join(str(text).split()))
    return line if len(line) <= width else line[: width - 1] + "…"


def short_session(session_name: str) -> str:
    """``sessions/7363187880…`` shortened to ``sessions/736318…``, escaped; ``-`` for none."""
    if not session_name:
        return "-"
    ident = printable(session_name.removeprefix("sessions/"))
    return "sessions/" + (ident[:6] + "…" if len(ident) > 7 else ident)


def _tail(data: dict[str, Any]) -> str:
    path = printable(_dict(data.get("call")).get("path", ""))
    return path[path.rfind(":") :] if ":" in path else path


def _link(url: object) -> str:
    """A signed action link (http or https), whole: it is what a person opens, and a link
    cut short works for nobody. Escaped, as every part of a line; empty for anything else."""
    if not isinstance(url, str) or not url.startswith(("https://", "http://")):
        return ""
    return printable(url)


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(value: object) -> int:
    return len(value) if isinstance(value, list) else 0


def summarize(event: dict[str, Any]) -> str:
    """A short human description of an event body, for one printed line (escaped)."""
    kind = str(event.get("type", ""))
    data = _dict(event.get("data"))
    session = _dict(data.get("session"))
    activity = _dict(data.get("activity"))
    if kind == "session.discovered":
        return clip(f'"{session.get("title", "")}" ({session.get("state", "")})')
    if kind == "session.state_changed":
        return clip(f"{data.get('previous_state', '?')} -> {session.get('state', '?')}")
    if kind in ("session.archived", "session.unarchived"):
        return clip(f'"{session.get("title", "")}" {kind.removeprefix("session.")}')
    if kind == "session.pull_request_opened":
        return clip(_dict(data.get("pull_request")).get("url", ""), 100)
    if kind == "activity.plan_generated":
        steps = _dict(_dict(activity.get("planGenerated")).get("plan")).get("steps")
        return f"plan with {counted(_count(steps), 'step')}"
    if kind == "activity.plan_approved":
        return clip(f"plan approved (by {activity.get('originator', '?')})")
    member = {
        "activity.user_messaged": ("userMessaged", "userMessage"),
        "activity.agent_messaged": ("agentMessaged", "agentMessage"),
        "activity.progress_updated": ("progressUpdated", "title"),
        "activity.session_failed": ("sessionFailed", "reason"),
    }.get(kind)
    if member is not None:
        return clip(_dict(activity.get(member[0])).get(member[1], ""))
    if kind == "activity.session_completed":
        return "session completed"
    if kind == "session.action_required":
        links = _dict(data.get("links"))  # signed links, with the relay's [actions] on
        if data.get("action") == "approve_plan":
            steps = _dict(data.get("plan")).get("steps")
            where = _link(links.get("approve")) or f"POST …{_tail(data)}"
            return f"approve the plan ({counted(_count(steps), 'step')}): {where}"
        where = _link(links.get("reply")) or f"POST …{_tail(data)}"
        return clip(f"answer: {data.get('question', '')}", 40) + f" {where}"
    if kind == "session.completed":
        outputs = _dict(data.get("outputs"))
        change = _dict(outputs.get("change_set"))
        prs = outputs.get("pull_requests")
        last = prs[-1] if isinstance(prs, list) and prs else None
        files = change.get("files_changed", 0)
        text = counted(files, "file") if isinstance(files, int) else "? files"
        text += f" +{change.get('lines_added', 0)} "
        text += f"-{change.get('lines_removed', 0)}"
        url = _dict(last).get("url", "")
        return clip(text + (f", {url}" if url else ""), 100)
    if kind == "session.failed":
        return clip(data.get("reason", ""))
    return clip(activity.get("description") or "(no event member)")


def event_line(body: dict[str, Any], *, stamp: str | None = None, note: str = "") -> str:
    """``HH:MM:SS  type  session  summary  note``: one event on one line, every part of
    it escaped."""
    when = time.strftime("%H:%M:%S") if stamp is None else stamp
    kind = clip(body.get("type", ""), 40)
    name = short_session(str(_dict(_dict(body.get("data")).get("session")).get("name", "")))
    line = f"{when}  {kind:<29} {name:<17} {summarize(body):<62} {note}"
    return line.rstrip()
