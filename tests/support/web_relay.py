"""The relay's web app on a real loopback socket without the daemon: a store, a bell and the
app's context (:func:`web_context`), events archived as the poller does
(:meth:`WebRelay.archive`), an event-stream reader that parses as the SSE spec says
(:func:`read_messages`), and the check of a management API error (:func:`api_error`)."""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from sessionhook.api.models import Session
from sessionhook.relay.config import Config
from sessionhook.relay.domain.events import make_event
from sessionhook.relay.domain.rows import EventRow
from sessionhook.relay.store import AsyncStore, OperatorQueries
from sessionhook.relay.telemetry.metrics import Metrics
from sessionhook.relay.web import Bell, WebAuth, WebContext

#: The web app's token (:func:`web_context`) and the header that presents it.
TOKEN = "stream-token-" + "x" * 30
AUTH = {"authorization": f"Bearer {TOKEN}"}


def api_error(answer: httpx.Response, status: int, *words: str) -> str:
    """Check that ``answer`` is the API's error with ``status``, in the Sessions API's shape
    and one non-empty line holding each of ``words``; its message."""
    assert answer.status_code == status, (answer.request.url, answer.text)
    error = answer.json()["error"]
    message = error["message"]
    assert error["code"] == status and message and "\n" not in message, error
    for word in words:
        assert word in message, (word, message)
    return str(message)


@dataclass
class Message:
    """One server-sent event as a client parses it."""

    id: str
    event: str
    data: str


class WebRelay:
    """A store, a bell and the web app served on a free loopback port."""

    def __init__(self, store: AsyncStore, url: str, bell: Bell) -> None:
        self.astore = store
        self.url = url
        self.bell = bell
        self.count = 0

    async def archive(
        self, n: int, *, session: str = "sessions/1", kind: str = "x.note", size: int = 0
    ) -> list[EventRow]:
        """Archive ``n`` new events (ringing the bell, as the poller does); their rows."""
        store = self.astore.store
        first = self.count
        evs = []
        for i in range(first, first + n):
            data = {"i": i, "text": "é\nline" + "p" * size}
            evs.append(
                make_event(f"evt_{i:05d}", kind, session, None, "2026-11-23T10:00:00Z", data)
            )
        self.count += n

        def write() -> None:
            raw = {
                "name": session,
                "id": session.split("/")[1],
                "title": "t",
                "state": "IN_PROGRESS",
                "createTime": "2026-11-23T10:00:00Z",
                "updateTime": "2026-11-23T10:00:00Z",
            }
            store.ingest.upsert_session(Session.model_validate(raw), baseline=False)
            store.ingest.ingest_session_events(session, evs, False)

        await self.astore.run(lambda _: write())
        self.bell.ring()
        return [
            r
            for r in await self.astore.run(OperatorQueries.events_after, 0, limit=100_000)
            if r.id in {e.id for e in evs}
        ]


def web_context(astore: AsyncStore, listen: str, **server: Any) -> WebContext:
    """What the web app gets of a daemon: ``astore``, a config whose ``[server]`` listens on
    ``listen`` (more keys in ``server``), :data:`TOKEN` as its token, a fresh bell."""
    config = Config.model_validate({"server": {"listen": listen, "token_env": "T", **server}})
    return WebContext(
        config=lambda: config,
        store=lambda: astore,
        metrics=Metrics(),
        auth=WebAuth(TOKEN),
        bell=Bell(),
    )


# Per response, not per id(response): a finished response's id is reused by a new one,
# which then got the old, exhausted line iterator ("stream ended after 0 of 1 messages").
_lines: weakref.WeakKeyDictionary[httpx.Response, AsyncIterator[str]] = weakref.WeakKeyDictionary()


async def read_messages(response: httpx.Response, count: int, within: float = 20) -> list[Message]:
    """The next ``count`` SSE messages (comments skipped), parsed as the spec says."""
    lines = _lines.setdefault(response, response.aiter_lines())
    out: list[Message] = []
    fields: dict[str, list[str]] = {}
    with anyio.fail_after(within):
        async for line in lines:
            if line == "":
                if "data" in fields:
                    out.append(
                        Message(
                            fields.get("id", [""])[-1],
                            fields.get("event", ["message"])[-1],
                            "\n".join(fields["data"]),
                        )
                    )
                fields = {}
                if len(out) == count:
                    return out
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            fields.setdefault(name, []).append(value.removeprefix(" "))
    raise AssertionError(f"stream ended after {len(out)} of {count} messages")
