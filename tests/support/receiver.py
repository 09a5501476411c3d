"""A webhook consumer for tests and benchmarks: verifies, records, misbehaves on request.

Every POST to ``/hook`` is checked with the Standard Webhooks *reference* package
(``standardwebhooks``), not with our own signing code, so a test that passes proves
interoperability. Each arrival is recorded with its local arrival time.

Misbehaviours (all off by default, changeable while running):

* ``fail_first``: refuse the first N attempts of every event id with ``fail_status``
  (503 unless told), optionally with a ``Retry-After`` header;
* ``status``: answer every request with this status (410 to be disabled, 307 to redirect
  to ``/elsewhere``, which records anything that follows it);
* ``delay``: answer after this many seconds (a slow consumer).

Serve it in-process with ``httpx.ASGITransport(receiver.app)`` or on a real loopback socket
with :func:`sessionhook.relay.web.server.serve`.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from standardwebhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["Arrival", "Receiver"]


@dataclass(frozen=True)
class Arrival:
    """One verified delivery attempt as the consumer saw it."""

    event_id: str
    timestamp: int
    body: dict[str, Any]
    headers: dict[str, str]
    arrived_at: float
    attempt: int  # 1 for the first time this event id arrived, 2 for the second...
    answered: int  # the status this receiver answered

    @property
    def type(self) -> str:
        """The event type from the body."""
        return str(self.body["type"])

    @property
    def session(self) -> str:
        """The session resource name from the body."""
        return str(self.body["data"]["session"]["name"])


@dataclass
class Receiver:
    """A recording Standard Webhooks consumer (see the module docstring)."""

    secret: str
    fail_first: int = 0
    fail_status: int = 503
    retry_after: str | None = None
    status: int | None = None
    delay: float = 0.0
    arrivals: list[Arrival] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # why a request failed verification
    followed_redirects: int = 0
    clock: Callable[[], float] = time.time
    #: Requests being answered right now, and the most there ever were at once (in all, and
    #: for any one session).
    in_flight: int = 0
    max_in_flight: int = 0
    max_in_flight_per_session: int = 0

    def __post_init__(self) -> None:
        self._webhook = Webhook(self.secret)
        self._arrived = anyio.Event()
        self._per_session: Counter[str] = Counter()
        self._seen: Counter[str] = Counter()
        self.app = Starlette(
            routes=[
                Route("/hook", self._hook, methods=["POST"]),
                Route("/elsewhere", self._elsewhere, methods=["GET", "POST"]),
            ]
        )

    async def _hook(self, request: Request) -> Response:
        body = await request.body()
        headers = dict(request.headers)
        try:
            self._webhook.verify(body, headers)
        except WebhookVerificationError as exc:
            self.rejected.append(f"{headers.get('webhook-id')}: {exc}")
            return Response("bad signature", status_code=400)
        problems = self._header_problems(headers)
        if problems:
            self.rejected.append(f"{headers.get('webhook-id')}: {problems}")
            return Response(problems, status_code=400)
        event_id = headers["webhook-id"]
        payload = json.loads(body)
        session = str(payload["data"]["session"]["name"])
        self._seen[event_id] += 1
        attempt = self._seen[event_id]
        self.in_flight += 1
        self._per_session[session] += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.max_in_flight_per_session = max(
            self.max_in_flight_per_session, self._per_session[session]
        )
        try:
            if self.delay:
                await anyio.sleep(self.delay)
        finally:
            self.in_flight -= 1
            self._per_session[session] -= 1
        answer, extra = self._answer(attempt)
        self.arrivals.append(
            Arrival(
                event_id=event_id,
                timestamp=int(headers["webhook-timestamp"]),
                body=payload,
                headers=headers,
                arrived_at=self.clock(),
                attempt=attempt,
                answered=answer,
            )
        )
        self._arrived.set()
        self._arrived = anyio.Event()
        return Response("ok" if answer < 300 else "no", status_code=answer, headers=extra)

    @staticmethod
    def _header_problems(headers: dict[str, str]) -> str:
        if headers.get("content-type") != "application/json":
            return f"content-type is {headers.get('content-type')!r}"
        if not headers.get("user-agent", "").startswith("sessionhook/"):
            return f"user-agent is {headers.get('user-agent')!r}"
        return ""

    def _answer(self, attempt: int) -> tuple[int, dict[str, str]]:
        if self.status is not None:
            if 300 <= self.status < 400:
                return self.status, {"location": "/elsewhere"}
            return self.status, {}
        if attempt <= self.fail_first:
            extra = {"retry-after": self.retry_after} if self.retry_after else {}
            return self.fail_status, extra
        return 200, {}

    async def _elsewhere(self, request: Request) -> Response:
        self.followed_redirects += 1
        return Response("you followed a redirect", status_code=200)

    # ----------------------------------------------------------------- queries for tests

    @property
    def delivered(self) -> list[Arrival]:
        """Arrivals this receiver accepted (answered 2xx), in arrival order."""
        return [a for a in self.arrivals if 200 <= a.answered < 300]

    def received_ids(self) -> set[str]:
        """Event ids of every verified request, answered yet or not."""
        return set(self._seen)

    def delivered_ids(self) -> set[str]:
        """Event ids accepted at least once."""
        return {a.event_id for a in self.delivered}

    def first_deliveries(self) -> list[Arrival]:
        """The first accepted arrival of each event id, in arrival order."""
        seen: set[str] = set()
        out: list[Arrival] = []
        for arrival in self.delivered:
            if arrival.event_id not in seen:
                seen.add(arrival.event_id)
                out.append(arrival)
        return out

    def by_session(self) -> dict[str, list[Arrival]]:
        """First accepted arrivals grouped by session, each list in arrival order."""
        out: dict[str, list[Arrival]] = {}
        for arrival in self.first_deliveries():
            out.setdefault(arrival.session, []).append(arrival)
        return out

    async def next_arrival(self, *, within: float) -> None:
        """Wait for the next request to be answered, or ``within`` seconds at most."""
        with anyio.move_on_after(within):
            await self._arrived.wait()

    async def wait_for(self, predicate: Callable[[Receiver], bool], *, within: float) -> None:
        """Wait until ``predicate(self)`` holds (checked on each arrival, and every 0.1 s
        for conditions that depend on time); fail the test after ``within`` seconds."""
        with anyio.move_on_after(within):
            while not predicate(self):
                with anyio.move_on_after(0.1):
                    await self._arrived.wait()
        if not predicate(self):
            raise AssertionError(
                f"receiver condition not met within {within}s: "
                f"{len(self.arrivals)} arrivals, {len(self.delivered_ids())} ids delivered, "
                f"rejected={self.rejected[:3]}"
            )
