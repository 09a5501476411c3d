"""A minimal, independent stand-in of the Sessions API for black-box tests of the relay and
for the benchmarks (the one fake upstream besides the emulator).

It deliberately imports nothing from ``sessionhook``: it is written from
``sessions-api.md`` and the field notes only, so the relay is checked against a second,
independent reading of the contract, not against the project's own emulator.

Served by uvicorn on ``127.0.0.1`` (an ephemeral port) in a background thread
(``tests/support/loopback.py``); the test drives it through a plain Python API:

* :meth:`StandIn.add_session`, :meth:`StandIn.add_sessions` (many at once, for scale),
  :meth:`StandIn.append_activity`, :meth:`StandIn.set_state`,
  :meth:`StandIn.add_pull_request` change the world; every change moves the session's
  ``updateTime``, except a new activity while ``moves_update_time`` is false (a server
  that does not touch the session when it gains an activity; changeable mid-run);
  :meth:`StandIn.add_recorded_session` serves a session and its history exactly as
  given (a benchmark's generated account); ``routes`` are served before the API (a
  benchmark's control paths);
* knobs: ``create_time_mode`` (how the ``createTime`` query parameter of list activities
  is read: ``exclusive`` = strictly after, ``inclusive`` = at or after, ``ignore``, or
  ``reject``: 400 INVALID_ARGUMENT naming the field),
  ``max_page_size`` (every requested ``pageSize`` is coerced down to it, to force
  paging), :meth:`StandIn.set_broken` (one session's activity list answers 500 or 429),
  :meth:`StandIn.set_latency` (one session's requests answered late),
  :meth:`StandIn.set_faults` (a seeded fraction of 429 with ``Retry-After`` and
  of 500 on any path, decided per path and per request number so that the decisions do
  not depend on how concurrent requests interleave), ``not_found_for`` (a GET of a
  session younger than this many seconds answers 404: eventual consistency);
* hostile knobs (an upstream that is broken or lies): :meth:`StandIn.set_deep` (a list
  answers JSON nested 10^5 levels deep), :meth:`StandIn.set_drip` (headers, then one byte
  every few seconds, forever), :meth:`StandIn.set_runaway` (a fresh ``nextPageToken`` on
  every page, forever: the same page again, or empty pages), :meth:`StandIn.append_raw`
  (an activity JSON served exactly as given: a name of another session, no name,
  ``createTime: "garbage"``), :meth:`StandIn.add_raw_session` (a session list item served
  as given), ``add_session(title=...)`` / :meth:`StandIn.set_title` with a lone surrogate
  (sent as a ``\\ud83d`` escape, as a JSON encoder does), and
  ``append_activity(create_time=...)`` for a time in the year 9999;
* observation: :meth:`StandIn.requests` (every request with its monotonic arrival time,
  label and answered status), :meth:`StandIn.counts`, :attr:`StandIn.items_served`.

Wire shapes follow the field notes: 32-hex activity ids, 20-digit session ids,
microsecond ``Z`` timestamps, zero values omitted, activities without an event member,
activities oldest first, sessions newest first, no ``nextPageToken`` on the last page.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import copy
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from tests.support.loopback import LoopbackServer

__all__ = [
    "CREATE_TIME_MODES",
    "EVENT_MEMBERS",
    "RequestRecord",
    "StandIn",
    "format_time",
    "parse_time",
]

CREATE_TIME_MODES = ("exclusive", "inclusive", "ignore", "reject")
#: The event members of the spec (part 6), in no particular order.
EVENT_MEMBERS = (
    "planGenerated",
    "planApproved",
    "userMessaged",
    "agentMessaged",
    "progressUpdated",
    "sessionCompleted",
    "sessionFailed",
)
STATES = (
    "QUEUED",
    "PLANNING",
    "AWAITING_PLAN_APPROVAL",
    "AWAITING_USER_FEEDBACK",
    "IN_PROGRESS",
    "PAUSED",
    "COMPLETED",
    "FAILED",
)
_PREFIX = "/v1alpha"
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
}


def format_time(moment: datetime) -> str:
    """RFC 3339, UTC, microseconds, trailing ``Z`` (the service's spelling)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    """Parse an RFC 3339 timestamp (``Z`` or an offset, up to 9 fraction digits)."""
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    if "." in value:
        head, _, rest = value.partition(".")
        digits = 0
        while digits < len(rest) and rest[digits].isdigit():
            digits += 1
        value = f"{head}.{rest[:digits][:6].ljust(6, '0')}{rest[digits:]}"
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        raise ValueError("a timestamp needs a time zone")
    return moment.astimezone(UTC)


# --------------------------------------------------------------------------- the world


@dataclass(frozen=True)
class RequestRecord:
    """One request as the stand-in saw it."""

    at: float  # time.monotonic() on arrival
    answered: float  # time.monotonic() when answered (later than ``at`` with a latency)
    method: str
    path: str
    label: str  # list_sessions, get_session, list_activities, get_activity, other
    query: dict[str, str]
    status: int
    fault: bool  # the status was injected


@dataclass
class _Session:
    data: dict[str, Any]
    created_mono: float
    activities: list[dict[str, Any]] = field(default_factory=list)
    #: When each activity (keyed by id() of its dict) counts as created, for ordering and
    #: the createTime filter: its createTime, or its arrival when that is no time at all.
    moments: dict[int, datetime] = field(default_factory=dict)

    def moment(self, activity: dict[str, Any]) -> datetime:
        return self.moments[id(activity)]

    def add(self, activity: dict[str, Any], arrival: datetime) -> None:
        try:
            moment = parse_time(str(activity.get("createTime", "")))
        except ValueError:
            moment = arrival
        self.moments[id(activity)] = moment
        self.activities.append(activity)
        if len(self.activities) > 1 and moment < self.moment(self.activities[-2]):
            self.activities.sort(key=self.moment)  # stable: ties keep their order


@dataclass
class _Faults:
    rate_429: float = 0.0
    rate_500: float = 0.0
    rate_garbage: float = 0.0
    seed: int = 0
    retry_after: str | None = "1"
    max_consecutive: int | None = None
    labels: frozenset[str] | None = None  # None: every path
    forced: list[str] = field(default_factory=list)  # kinds given first, in order


class StandIn:
    """The Sessions API stand-in; see the module docstring. Use as a context manager."""

    def __init__(
        self,
        *,
        api_key: str = "standin-key-0123456789",
        create_time_mode: str = "exclusive",
        max_page_size: int = 3,
        not_found_for: float = 0.0,
        seed: int = 1,
        moves_update_time: bool = True,
        routes: Sequence[BaseRoute] = (),
    ) -> None:
        if create_time_mode not in CREATE_TIME_MODES:
            raise ValueError(f"create_time_mode must be one of {CREATE_TIME_MODES}")
        self.api_key = api_key
        self.create_time_mode = create_time_mode
        self.max_page_size = max_page_size
        self.not_found_for = not_found_for
        #: Whether a new activity moves its session's ``updateTime`` (assignable mid-run).
        self.moves_update_time = moves_update_time
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._ordered: list[_Session] | None = None  # newest first; None = sort again
        self._last_time = datetime.now(UTC) - timedelta(seconds=1)
        self._faults = _Faults()
        self._fault_counters: Counter[str] = Counter()
        self._fault_streaks: Counter[str] = Counter()
        self._forced_paths: set[str] = set()
        self._log: list[RequestRecord] = []
        self._broken: dict[str, tuple[int, str | None]] = {}
        self._latency: dict[str, float] = {}
        self._deep: set[str] = set()
        self._drip: dict[str, float] = {}
        self._runaway: dict[str, bool] = {}  # target -> empty pages (else the same page)
        self._runaway_tokens = 0
        self._raw_sessions: list[Any] = []  # items served first in the session list
        self._stopping = False
        self._in_flight = 0
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        #: Activities returned by list activities, summed over all pages and polls.
        self.items_served = 0
        self._server = LoopbackServer(self._app(routes))

    # ------------------------------------------------------------------ lifecycle

    @property
    def base_url(self) -> str:
        """The service address (the relay appends ``/v1alpha``)."""
        return self._server.url

    def start(self) -> StandIn:
        self._server.start()
        return self

    def stop(self) -> None:
        with self._lock:  # end the waits of set_latency, so shutdown is quick
            self._stopping = True
            for loop, woken in self._waiters:
                loop.call_soon_threadsafe(woken.set)
        self._server.stop()

    def __enter__(self) -> StandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ knobs

    def set_faults(
        self,
        *,
        rate_429: float = 0.0,
        rate_500: float = 0.0,
        rate_garbage: float = 0.0,
        seed: int = 0,
        retry_after: str | None = "1",
        max_consecutive: int | None = None,
        labels: set[str] | None = None,
        forced: tuple[str, ...] = (),
    ) -> None:
        """Inject 429 (with ``Retry-After``), 500 and garbage (a 200 whose body is an HTML
        page, as a misbehaving proxy gives) on a seeded fraction of requests.

        The n-th request of a path is faulty or not by a draw seeded with
        ``(seed, path, n)``: reproducible whatever the interleaving of concurrent
        requests. ``max_consecutive`` bounds the faults in a row on one path (a bounded
        outage, so a test has a bounded worst case). ``labels`` limits the faults to some
        kinds of request (``list_sessions``...). ``forced`` kinds (``"429"``, ``"500"``,
        ``"garbage"``) answer the first eligible requests (one per path), whatever the
        draw: a test can rely on having met each kind.
        """
        with self._lock:
            self._faults = _Faults(
                rate_429,
                rate_500,
                rate_garbage,
                seed,
                retry_after,
                max_consecutive,
                None if labels is None else frozenset(labels),
                list(forced),
            )
            self._fault_counters.clear()
            self._fault_streaks.clear()
            self._forced_paths.clear()

    def set_broken(
        self,
        session: str,
        broken: bool = True,
        *,
        status: int = 500,
        retry_after: str | None = None,
    ) -> None:
        """While broken, listing the session's activities answers ``status`` (500: an outage
        of one session; 429 with ``retry_after``: a throttled one)."""
        with self._lock:
            if broken:
                self._broken[session] = (status, retry_after)
            else:
                self._broken.pop(session, None)

    def set_latency(self, session: str, seconds: float) -> None:
        """Every request about this session (GET, activities) is answered this much later."""
        with self._lock:
            if seconds > 0:
                self._latency[session] = seconds
            else:
                self._latency.pop(session, None)

    def set_deep(self, label: str, on: bool = True) -> None:
        """While on, every ``label`` answer (``list_sessions``, ``list_activities``) is a 200
        whose JSON nests 10^5 arrays deep."""
        with self._lock:
            (self._deep.add if on else self._deep.discard)(label)

    def set_drip(self, target: str, interval: float = 2.0, on: bool = True) -> None:
        """While on, requests for ``target`` (a session name: its activity list; or
        ``"list_sessions"``) answer 200 headers at once, then one byte every ``interval``
        seconds, forever (until turned off or the stand-in stops)."""
        with self._lock:
            if on:
                self._drip[target] = interval
            else:
                self._drip.pop(target, None)

    def set_runaway(self, target: str, on: bool = True, *, empty: bool = False) -> None:
        """While on, every page for ``target`` (a session name: its activity list; or
        ``"list_sessions"``) carries a fresh ``nextPageToken`` that leads to the same page
        again (``empty``: to an empty page, and so on): pagination without end, never
        repeating a token."""
        with self._lock:
            if on:
                self._runaway[target] = empty
            else:
                self._runaway.pop(target, None)

    # ------------------------------------------------------------------ the world

    def _now(self) -> str:
        """A fresh timestamp, strictly after every one given before (caller holds the lock)."""
        moment = datetime.now(UTC)
        if moment <= self._last_time:
            moment = self._last_time + timedelta(microseconds=1)
        self._last_time = moment
        return format_time(moment)

    def _hex(self) -> str:
        return f"{self._rng.getrandbits(128):032x}"

    def add_session(
        self,
        title: str | None = None,
        *,
        prompt: str = "Make the tests pass",
        state: str = "QUEUED",
        source: str | None = "sources/github/acme/api",
        branch: str = "main",
    ) -> str:
        """Create a session; returns its name ``sessions/<id>``."""
        if state not in STATES:
            raise ValueError(f"unknown state {state}")
        with self._lock:
            sid = str(self._rng.randrange(10**19, 10**20))
            while f"sessions/{sid}" in self._sessions:
                sid = str(self._rng.randrange(10**19, 10**20))
            now = self._now()
            data: dict[str, Any] = {
                "name": f"sessions/{sid}",
                "id": sid,
                "prompt": prompt,
                "title": title or prompt,
                "state": state,
                "url": f"https://agent.example.test/session/{sid}",
                "createTime": now,
                "updateTime": now,
            }
            if source is not None:
                data["sourceContext"] = {
                    "source": source,
                    "hostRepoContext": {"startingBranch": branch},
                }
            self._sessions[data["name"]] = _Session(data, time.monotonic())
            self._ordered = None
            return str(data["name"])

    def add_sessions(self, count: int, *, state: str = "COMPLETED", activities: int = 1) -> None:
        """Create ``count`` sessions in ``state`` with ``activities`` progress updates each,
        quickly (a history of thousands for scale tests and benchmarks)."""
        for i in range(count):
            name = self.add_session(f"Old task {i}", state="QUEUED")
            for _ in range(activities):
                self.append_activity(name, "progressUpdated")
            self.set_state(name, state)

    def add_recorded_session(
        self, data: dict[str, Any], activities: Iterable[dict[str, Any]] = ()
    ) -> str:
        """Serve a session exactly as given (``data``: its whole JSON, ``name`` included)
        with ``activities`` (each sorted in at its ``createTime``), as a recording of an
        account's history would be served: names, times and states as they are, nothing
        moved. Taken as they are, not copied (a history of many thousands loads quickly):
        the caller must not change them afterwards. Returns the session's name."""
        with self._lock:
            session = _Session(data, time.monotonic())
            arrival = datetime.now(UTC)
            for activity in activities:
                session.add(activity, arrival)
            self._sessions[data["name"]] = session
            self._ordered = None
            return str(data["name"])

    def add_raw_session(self, item: Any) -> None:
        """Serve ``item`` at the head of the session list exactly as given (no session of
        that name exists for a GET): an item that is not a session, a name of another
        shape."""
        with self._lock:
            self._raw_sessions.insert(0, copy.deepcopy(item))

    def set_title(self, session: str, title: str) -> None:
        """Give the session another title (its ``updateTime`` moves)."""
        with self._lock:
            s = self._sessions[session]
            s.data["title"] = title
            s.data["updateTime"] = self._now()

    def set_state(self, session: str, state: str) -> None:
        """Move a session to ``state`` (its ``updateTime`` moves)."""
        if state not in STATES:
            raise ValueError(f"unknown state {state}")
        with self._lock:
            s = self._sessions[session]
            s.data["state"] = state
            s.data["updateTime"] = self._now()

    def add_pull_request(self, session: str, url: str, title: str = "Fix it") -> None:
        """Add a pull request to the session's ``outputs`` (its ``updateTime`` moves)."""
        with self._lock:
            s = self._sessions[session]
            pr = {"url": url, "title": title, "description": f"{title}.\n\nOpened by the agent."}
            s.data.setdefault("outputs", []).append({"pullRequest": pr})
            s.data["updateTime"] = self._now()

    def append_activity(
        self,
        session: str,
        member: str | None = "progressUpdated",
        payload: dict[str, Any] | None = None,
        *,
        originator: str | None = None,
        description: str | None = None,
        artifacts: list[dict[str, Any]] | None = None,
        create_time: str | None = None,
    ) -> dict[str, Any]:
        """Append an activity; returns (a copy of) its JSON.

        ``member`` is the event member (``None``: an activity without one, like the
        "Session started" system activity; an unknown name: a member from the future).
        ``payload`` defaults to a plausible one for the member. ``create_time`` forces
        the ``createTime`` (ties, or an activity committed late); by default it is a
        fresh, strictly increasing timestamp.
        """
        with self._lock:
            s = self._sessions[session]
            aid = self._hex()
            now = self._now()
            when = create_time if create_time is not None else now
            activity: dict[str, Any] = {
                "name": f"{session}/activities/{aid}",
                "id": aid,
                "originator": originator or _default_originator(member),
                "createTime": when,
            }
            if description is None and member == "progressUpdated":
                description = "Working on it"
            if description:  # zero values are omitted
                activity["description"] = description
            if member is not None:
                activity[member] = payload if payload is not None else self._payload(member, when)
            if artifacts:
                activity["artifacts"] = artifacts
            s.add(activity, parse_time(now))
            if self.moves_update_time:
                s.data["updateTime"] = now
            return copy.deepcopy(activity)

    def append_raw(self, session: str, activity: dict[str, Any]) -> dict[str, Any]:
        """Serve ``activity`` in the session's list exactly as given (any name, any
        createTime); it sorts at its createTime, or at its arrival when that is no time."""
        with self._lock:
            s = self._sessions[session]
            now = self._now()
            stored = copy.deepcopy(activity)
            s.add(stored, parse_time(now))
            s.data["updateTime"] = now
            return copy.deepcopy(stored)

    def _payload(self, member: str, when: str) -> dict[str, Any]:
        if member == "planGenerated":
            steps: list[dict[str, Any]] = [
                {"id": self._hex(), "title": "Read the code"},  # index 0: omitted
                {"id": self._hex(), "index": 1, "title": "Change it", "description": "Edit"},
            ]
            return {"plan": {"id": self._hex(), "steps": steps, "createTime": when}}
        if member == "planApproved":
            return {"planId": self._hex()}
        if member == "userMessaged":
            return {"userMessage": "Please also update the docs"}
        if member == "agentMessaged":
            return {"agentMessage": "Which branch should I use?"}
        if member == "progressUpdated":
            return {"title": "Running tests", "description": "pytest -q"}
        if member == "sessionCompleted":
            return {}
        if member == "sessionFailed":
            return {"reason": "The build is broken"}
        return {"detail": "a member this client does not know yet"}

    def delete_session(self, session: str) -> None:
        with self._lock:
            del self._sessions[session]
            self._ordered = None

    # ------------------------------------------------------------------ inspection

    def session(self, session: str) -> dict[str, Any]:
        """The full session JSON as a GET returns it."""
        with self._lock:
            return copy.deepcopy(self._sessions[session].data)

    def session_names(self) -> list[str]:
        with self._lock:
            return list(self._sessions)

    def activities(self, session: str) -> list[dict[str, Any]]:
        """The session's activities in list order (oldest first)."""
        with self._lock:
            return copy.deepcopy(self._sessions[session].activities)

    def all_activities(self) -> dict[str, dict[str, Any]]:
        """Every activity of every session, by name."""
        with self._lock:
            return {
                a["name"]: copy.deepcopy(a) for s in self._sessions.values() for a in s.activities
            }

    def requests(self, label: str | None = None) -> list[RequestRecord]:
        with self._lock:
            return [r for r in self._log if label is None or r.label == label]

    def in_flight(self) -> int:
        """Requests being answered right now (only a latency makes this last)."""
        with self._lock:
            return self._in_flight

    def counts(self) -> Counter[str]:
        """Requests per label."""
        with self._lock:
            return Counter(r.label for r in self._log)

    def statuses(self) -> Counter[int]:
        with self._lock:
            return Counter(r.status for r in self._log)

    # ------------------------------------------------------------------ HTTP

    def _app(self, routes: Sequence[BaseRoute]) -> Starlette:
        # The caller's routes first (a benchmark's control paths): neither counted nor logged.
        api = Route("/{path:path}", self._handle, methods=["GET", "POST", "DELETE"])
        return Starlette(routes=[*routes, api])

    async def _handle(self, request: Request) -> Response:
        path = request.url.path
        query = dict(request.query_params)
        label, handler = self._route(request.method, path)
        parts = path.removeprefix(_PREFIX).strip("/").split("/")
        arrived = time.monotonic()
        with self._lock:
            latency = self._latency.get("/".join(parts[:2]), 0.0)
            self._in_flight += 1
        try:
            if latency:
                await self._delay(latency)
        finally:
            with self._lock:
                self._in_flight -= 1
        with self._lock:
            status_fault = None
            target = label if label == "list_sessions" else "/".join(parts[:2])
            if request.headers.get("x-vendor-api-key") != self.api_key:
                response = _error(401, "API key not valid. Please pass a valid API key.")
            elif label in ("list_sessions", "list_activities") and target in self._drip:
                response = self._dripping(self._drip[target])
            elif label in ("list_sessions", "list_activities") and label in self._deep:
                key = b"sessions" if label == "list_sessions" else b"activities"
                deep = b'{"' + key + b'": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
                response = Response(deep, media_type="application/json")
            else:
                status_fault = self._fault(path, label)
                response = status_fault if status_fault is not None else handler(path, query)
                if target in self._runaway and response.status_code == 200:
                    response = self._run_away(response, self._runaway[target], query)
            self._log.append(
                RequestRecord(
                    at=arrived,
                    answered=time.monotonic(),
                    method=request.method,
                    path=path,
                    label=label,
                    query=query,
                    status=response.status_code,
                    fault=status_fault is not None,
                )
            )
        return response

    async def _delay(self, seconds: float) -> None:
        """Wait ``seconds``, or less when the stand-in stops (so shutdown is quick)."""
        woken = asyncio.Event()
        waiter = (asyncio.get_running_loop(), woken)
        with self._lock:
            if self._stopping:
                return
            self._waiters.add(waiter)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), seconds)
        finally:
            with self._lock:
                self._waiters.discard(waiter)

    def _dripping(self, interval: float) -> Response:
        """200 headers now, then one byte every ``interval`` s until the stand-in stops."""

        async def drip() -> Any:
            yield b'{"activities": ['
            while not self._stopping:
                await self._delay(interval)
                yield b" "

        return StreamingResponse(drip(), media_type="application/json")

    def _run_away(self, response: Response, empty: bool, query: dict[str, str]) -> Response:
        """The same page again (``empty``: after the first page, an empty one), with a token
        never given before (caller holds the lock)."""
        page = json.loads(bytes(response.body))
        if empty and _is_runaway(query.get("pageToken", "")):
            page = {}
        self._runaway_tokens += 1
        blob = json.dumps({"scope": "runaway", "n": self._runaway_tokens}).encode()
        page["nextPageToken"] = base64.urlsafe_b64encode(blob).decode()
        return _Json(page)

    def _route(
        self, method: str, path: str
    ) -> tuple[str, Callable[[str, dict[str, str]], Response]]:
        parts = path.removeprefix(_PREFIX).strip("/").split("/") if path.startswith(_PREFIX) else []
        if method == "GET" and parts[:1] == ["sessions"]:
            if len(parts) == 1:
                return "list_sessions", self._list_sessions
            if len(parts) == 2:
                return "get_session", self._get_session
            if len(parts) == 3 and parts[2] == "activities":
                return "list_activities", self._list_activities
            if len(parts) == 4 and parts[2] == "activities":
                return "get_activity", self._get_activity
        return "other", lambda _p, _q: _error(404, f"Method {method} {path} not found.")

    def _fault(self, path: str, label: str) -> Response | None:
        f = self._faults
        if not f.forced and f.rate_429 <= 0 and f.rate_500 <= 0 and f.rate_garbage <= 0:
            return None
        if f.labels is not None and label not in f.labels:
            return None
        n = self._fault_counters[path]
        self._fault_counters[path] += 1
        if f.forced and path not in self._forced_paths:
            self._forced_paths.add(path)  # one forced fault per path: no long streak
            return self._fault_of_kind(f.forced.pop(0), path)
        if f.max_consecutive is not None and self._fault_streaks[path] >= f.max_consecutive:
            self._fault_streaks[path] = 0
            return None
        draw = random.Random(f"{f.seed}|{path}|{n}").random()
        if draw < f.rate_429:
            return self._fault_of_kind("429", path)
        if draw < f.rate_429 + f.rate_500:
            return self._fault_of_kind("500", path)
        if draw < f.rate_429 + f.rate_500 + f.rate_garbage:
            return self._fault_of_kind("garbage", path)
        self._fault_streaks[path] = 0
        return None

    def _fault_of_kind(self, kind: str, path: str) -> Response:
        self._fault_streaks[path] += 1
        if kind == "429":
            response = _error(429, "Resource has been exhausted (e.g. check quota).")
            if self._faults.retry_after is not None:
                response.headers["Retry-After"] = self._faults.retry_after
            return response
        if kind == "500":
            return _error(500, "Internal error encountered.")
        if kind == "garbage":
            return Response("<html><body>Bad gateway</body></html>", media_type="text/html")
        raise ValueError(f"unknown fault kind {kind}")

    def _page(
        self, items: list[Any], query: dict[str, str], scope: str
    ) -> tuple[list[Any], str | None] | Response:
        raw_size = query.get("pageSize")
        try:
            size = int(raw_size) if raw_size not in (None, "") else self.max_page_size
        except ValueError:
            return _error(400, "Invalid value at 'page_size'", field_name="page_size")
        if size < 1:
            return _error(400, "page_size must be positive", field_name="page_size")
        size = min(size, 100, self.max_page_size)
        offset = 0
        token = query.get("pageToken")
        if token:
            try:
                decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
                if decoded["scope"] == "runaway":
                    decoded = {"scope": scope, "offset": 0}
                if decoded["scope"] != scope:
                    raise ValueError("token of another list")
                offset = int(decoded["offset"])
            except (ValueError, KeyError, TypeError, binascii.Error):
                return _error(400, "Invalid page token.", field_name="page_token")
        page = items[offset : offset + size]
        following = offset + size
        next_token = None
        if following < len(items):
            blob = json.dumps({"scope": scope, "offset": following}).encode()
            next_token = base64.urlsafe_b64encode(blob).decode()
        return page, next_token

    def _list_sessions(self, _path: str, query: dict[str, str]) -> Response:
        if self._ordered is None:
            self._ordered = sorted(
                self._sessions.values(),
                key=lambda s: parse_time(s.data["createTime"]),
                reverse=True,
            )
        keys = ("name", "id", "title", "state", "createTime", "updateTime")
        ordered: list[Any] = self._ordered
        if self._raw_sessions:
            ordered = [*self._raw_sessions, *({k: s.data[k] for k in keys} for s in ordered)]
        paged = self._page(ordered, query, "sessions")
        if isinstance(paged, Response):
            return paged
        chosen, token = paged
        page = [s if isinstance(s, dict) else {k: s.data[k] for k in keys} for s in chosen]
        body: dict[str, Any] = {"sessions": page} if page else {}  # zero values omitted
        if token:
            body["nextPageToken"] = token
        return _Json(body)

    def _find(self, path: str) -> _Session | None:
        parts = path.removeprefix(_PREFIX).strip("/").split("/")
        return self._sessions.get(f"sessions/{parts[1]}")

    def _get_session(self, path: str, _query: dict[str, str]) -> Response:
        s = self._find(path)
        if s is None or time.monotonic() - s.created_mono < self.not_found_for:
            return _error(404, "Requested entity was not found.")
        return _Json(s.data)

    def _list_activities(self, path: str, query: dict[str, str]) -> Response:
        s = self._find(path)
        if s is None:
            return _error(404, "Requested entity was not found.")
        if s.data["name"] in self._broken:
            status, retry_after = self._broken[s.data["name"]]
            message = "Resource has been exhausted (e.g. check quota)."
            response = _error(status, message if status == 429 else "Internal error encountered.")
            if retry_after is not None:
                response.headers["Retry-After"] = retry_after
            return response
        items = s.activities
        bound_text = query.get("createTime")
        if bound_text and self.create_time_mode == "reject":
            return _error(400, "Unknown parameter 'create_time'", field_name="create_time")
        if bound_text:
            try:
                bound = parse_time(bound_text)
            except ValueError:
                return _error(400, "Invalid value at 'create_time'", field_name="create_time")
            if self.create_time_mode == "exclusive":
                items = [a for a in items if s.moment(a) > bound]
            elif self.create_time_mode == "inclusive":
                items = [a for a in items if s.moment(a) >= bound]
        scope = f"{path}|{bound_text or ''}|{self.create_time_mode}"
        paged = self._page(items, query, scope)
        if isinstance(paged, Response):
            return paged
        page, token = paged
        self.items_served += len(page)
        body: dict[str, Any] = {"activities": page} if page else {}
        if token:
            body["nextPageToken"] = token
        return _Json(body)

    def _get_activity(self, path: str, _query: dict[str, str]) -> Response:
        s = self._find(path)
        name = path.removeprefix(_PREFIX).strip("/")
        for activity in s.activities if s is not None else []:
            if activity["name"] == name:
                return _Json(activity)
        return _error(404, "Requested entity was not found.")


class _Json(JSONResponse):
    """Starlette's JSON answer, but text that is not Unicode (a lone surrogate) is sent as
    an escape (``"\\ud83d"``), as a JSON encoder that escapes non-ASCII does, instead of
    failing to encode: the answer stays valid JSON."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, separators=(",", ":")).encode("ascii")


def _is_runaway(token: str) -> bool:
    """Whether ``token`` is one that :meth:`StandIn._run_away` invented."""
    try:
        return bool(json.loads(base64.urlsafe_b64decode(token.encode()))["scope"] == "runaway")
    except (ValueError, KeyError, TypeError, binascii.Error):
        return False


def _default_originator(member: str | None) -> str:
    if member is None:
        return "system"
    if member in ("userMessaged", "planApproved"):
        return "user"
    return "agent"


def _error(code: int, message: str, *, field_name: str | None = None) -> JSONResponse:
    error: dict[str, Any] = {
        "code": code,
        "message": message,
        "status": _STATUS_NAMES.get(code, "UNKNOWN"),
    }
    if field_name is not None:
        error["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.BadRequest",
                "fieldViolations": [{"field": field_name, "description": message}],
            }
        ]
    return _Json({"error": error}, status_code=code)
