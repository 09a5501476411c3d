"""In-memory state of the emulator (no HTTP): accounts and keys, sources, sessions.

Each method the routes call first lets every agent catch up with the clock
(:meth:`World.advance`). Lists are keyset-paginated: a page ends at a *position* (a
session's sequence number, an activity's index, a source's name) and the next starts
strictly after it, so items created or deleted between pages never shift the rest.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Generic, TypeVar

from ..api.models import AUTO_CREATE_PR, Activity, Branch, HostRepo, Source, SourceContext
from .agent import Account, SessionRecord, make_title

#: At most this many API keys per account (spec part 8).
MAX_KEYS_PER_ACCOUNT = 3
#: How list-activities reads its ``createTime`` parameter: after it, from it, or not at all.
CREATE_TIME_FILTERS = ("exclusive", "inclusive", "ignore")
AUTOMATION_MODES = frozenset({"", "AUTOMATION_MODE_UNSPECIFIED", AUTO_CREATE_PR})

# owner, repo, private, default branch, other branches: connected for every account.
_SEED_SOURCES = (
    ("acme", "webapp", True, "main", ("develop", "feature/dark-mode")),
    ("acme", "api-server", True, "main", ("release/2.x",)),
    ("octocat", "hello-world", False, "master", ("test",)),
    ("sessionhook", "demo", False, "main", ()),
)

P = TypeVar("P")
T = TypeVar("T")


class EmulatorError(Exception):
    """An API error: HTTP status, symbolic status, message, optional details and headers."""

    def __init__(
        self,
        code: int,
        status: str,
        message: str,
        *,
        details: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message
        self.details = details or []
        self.headers = headers or {}

    @classmethod
    def invalid_argument(cls, message: str, *violations: tuple[str | None, str]) -> EmulatorError:
        """400 INVALID_ARGUMENT with a ``google.rpc.BadRequest`` of (field, description) pairs.

        A ``None`` field (a problem with the whole body) leaves ``field`` out.
        """
        found = violations or ((None, message),)
        items = [
            {"description": text} if field is None else {"field": field, "description": text}
            for field, text in found
        ]
        detail = {"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": items}
        return cls(400, "INVALID_ARGUMENT", message, details=[detail])

    @classmethod
    def not_found(cls, message: str) -> EmulatorError:
        """404 NOT_FOUND."""
        return cls(404, "NOT_FOUND", message)


@dataclass(frozen=True)
class TimeBound:
    """Activities created after ``time_us`` (or at it, when ``inclusive``)."""

    time_us: int
    inclusive: bool

    def admits(self, time_us: int) -> bool:
        """Whether an activity created at ``time_us`` passes the bound."""
        return time_us >= self.time_us if self.inclusive else time_us > self.time_us


@dataclass(frozen=True)
class Page(Generic[T, P]):
    """One page of a list; ``next_position`` is ``None`` on the last page."""

    items: list[T]
    next_position: P | None


def _page(candidates: Iterable[tuple[P, T]], limit: int) -> Page[T, P]:
    """The first ``limit`` (position, item) candidates; one more tells that a page follows."""
    found = list(islice(candidates, limit + 1))
    shown = found[:limit]
    more = len(found) > limit and bool(shown)
    return Page([item for _, item in shown], shown[-1][0] if more else None)


def _seed_sources() -> dict[str, Source]:
    sources = {}
    for owner, repo, private, default, others in _SEED_SOURCES:
        source_id = f"github/{owner}/{repo}"
        host = HostRepo(
            owner=owner,
            repo=repo,
            is_private=private,
            default_branch=Branch(display_name=default),
            branches=[Branch(display_name=b) for b in (default, *others)],
        )
        sources[source_id] = Source(name=f"sources/{source_id}", id=source_id, host_repo=host)
    return dict(sorted(sources.items()))


class World:
    """Accounts, sources and sessions of one emulator, advanced lazily from ``clock``.

    ``accounts`` holds one sequence of API keys per account (at most three each).
    ``seed`` makes every id and every generated artifact reproducible.
    """

    def __init__(
        self,
        accounts: Sequence[Sequence[str]],
        *,
        step_delay: float = 0.5,
        seed: int | None = None,
        clock: Callable[[], float] | None = None,
        create_time_filter: str = "exclusive",
        consistency_delay: float = 0.0,
    ) -> None:
        if consistency_delay < 0:
            raise ValueError("consistency_delay must not be negative")
        if create_time_filter not in CREATE_TIME_FILTERS:
            raise ValueError(f"create_time_filter must be one of {', '.join(CREATE_TIME_FILTERS)}")
        if step_delay < 0:
            raise ValueError("step_delay must not be negative")
        self._accounts = tuple(_make_account(i, keys) for i, keys in enumerate(accounts))
        if not self._accounts:
            raise ValueError("the emulator needs at least one account (API key)")
        self._by_key = {key: a for a in self._accounts for key in a.keys}
        if len(self._by_key) != sum(len(a.keys) for a in self._accounts):
            raise ValueError("an API key may belong to one account only")
        self.create_time_filter = create_time_filter
        self._clock = clock or time.time
        self._step_us = round(step_delay * 1_000_000)
        #: A session and its activities answer 404 this long after creation (eventual
        #: consistency, as the real service shows right after a create).
        self._consistency_us = round(consistency_delay * 1_000_000)
        self._rng = random.Random(seed)
        #: Key of the page-token MACs; derived from the seed, so tokens are reproducible too.
        self.page_secret = self._rng.getrandbits(128).to_bytes(16, "big")
        self._sources = _seed_sources()
        self._sessions: dict[str, SessionRecord] = {}
        self._seq = 0
        self._lock = threading.RLock()

    @property
    def accounts(self) -> tuple[Account, ...]:
        """Every account, in the order given."""
        return self._accounts

    def account_for_key(self, key: str) -> Account | None:
        """The account owning ``key``, or ``None`` for a missing or unknown key."""
        return self._by_key.get(key)

    def advance(self) -> int:
        """Apply every agent step due by now; return now (microseconds)."""
        with self._lock:
            now = round(self._clock() * 1_000_000)
            for session in list(self._sessions.values()):
                session.agent.advance(now)
            return now

    # ------------------------------------------------------------------ sessions

    def create_session(
        self,
        account: Account,
        *,
        prompt: str,
        title: str = "",
        source_context: SourceContext | None = None,
        require_plan_approval: bool = False,
        automation_mode: str = "",
    ) -> SessionRecord:
        """Create a QUEUED session; its agent starts one step delay from now."""
        if not prompt.strip():
            raise EmulatorError.invalid_argument(
                "prompt must not be empty.", ("prompt", "prompt must not be empty")
            )
        if automation_mode not in AUTOMATION_MODES:
            raise EmulatorError.invalid_argument(
                f"Invalid value for automation_mode: {automation_mode!r}.",
                ("automation_mode", f"unknown automation mode {automation_mode!r}"),
            )
        if source_context is not None:
            self._check_source_context(source_context)
        with self._lock:
            now = self.advance()
            session_id = str(self._rng.randrange(10**19, 10**20))
            while session_id in self._sessions:
                session_id = str(self._rng.randrange(10**19, 10**20))
            self._seq += 1
            session = SessionRecord(
                seq=self._seq,
                id=session_id,
                account=account,
                prompt=prompt,
                title=title.strip() or make_title(prompt),
                source_context=source_context,
                require_plan_approval=require_plan_approval,
                automation_mode=automation_mode,
                create_us=now,
                rng=random.Random(self._rng.getrandbits(64)),
                step_us=self._step_us,
            )
            self._sessions[session_id] = session
            return session

    def _check_source_context(self, context: SourceContext) -> None:
        name = context.source
        source = self._sources.get(name[len("sources/") :]) if name.startswith("sources/") else None
        if source is None:
            raise EmulatorError.invalid_argument(
                f"Source {context.source!r} is not connected to this account.",
                ("source_context.source", "must name a connected source, sources/<id>"),
            )
        branch = context.host_repo_context.starting_branch if context.host_repo_context else ""
        branches = [b.display_name for b in source.host_repo.branches] if source.host_repo else []
        if branch and branch not in branches:
            raise EmulatorError.invalid_argument(
                f"Branch {branch!r} does not exist in {source.name}.",
                ("source_context.host_repo_context.starting_branch", "unknown branch"),
            )

    def list_sessions(
        self, account: Account, *, after: int | None, limit: int, archived: bool = False
    ) -> Page[SessionRecord, int]:
        """The account's sessions, newest first, strictly after position ``after``: those
        whose ``archived`` flag is ``archived`` (the default list leaves archived ones out,
        as the real service does)."""
        with self._lock:
            self.advance()
            newest_first = sorted(self._sessions.values(), key=lambda s: -s.seq)
            return _page(
                (
                    (session.seq, session)
                    for session in newest_first
                    if session.account is account
                    and session.archived is archived
                    and (after is None or session.seq < after)
                ),
                limit,
            )

    def set_archived(self, account: Account, session_id: str, archived: bool) -> SessionRecord:
        """Archive or unarchive the session (beyond the interface spec: the official SDK
        calls it). Archiving a working session pauses it; a message resumes it."""
        with self._lock:
            now = self.advance()
            session = self._visible(self._owned(account, session_id), now)
            if session.archived is not archived:
                session.archived = archived
                session.update_us = max(session.update_us, now)
                if archived:
                    session.agent.pause(now)
            return session

    def get_session(self, account: Account, session_id: str) -> SessionRecord:
        """The session, 404 if there is none, 403 if it belongs to another account."""
        with self._lock:
            now = self.advance()
            return self._visible(self._owned(account, session_id), now)

    def delete_session(self, account: Account, session_id: str) -> None:
        """Delete the session; it answers 404 from then on."""
        with self._lock:
            self.advance()
            del self._sessions[self._owned(account, session_id).id]

    def send_message(self, account: Account, session_id: str, text: str) -> None:
        """A user message: a userMessaged activity now and an agent reply one step later."""
        if not text.strip():
            raise EmulatorError.invalid_argument(
                "prompt must not be empty.", ("prompt", "prompt must not be empty")
            )
        with self._lock:
            now = self.advance()
            self._owned(account, session_id).agent.on_message(now, text)

    def approve_plan(self, account: Account, session_id: str) -> None:
        """Approve the waiting plan; 400 when no plan waits for approval."""
        with self._lock:
            now = self.advance()
            session = self._owned(account, session_id)
            if not session.agent.awaiting_plan_approval:
                raise EmulatorError.invalid_argument(
                    f"No plan of {session.name} is awaiting approval (state {session.state}).",
                    ("session", "no plan is awaiting approval"),
                )
            session.agent.approve_plan(now)

    def _visible(self, session: SessionRecord, now_us: int) -> SessionRecord:
        """404 while the session is younger than the consistency delay."""
        if now_us - session.create_us < self._consistency_us:
            raise EmulatorError.not_found(f"Session {session.name} was not found.")
        return session

    def _owned(self, account: Account, session_id: str) -> SessionRecord:
        session = self._sessions.get(session_id)
        if session is None:
            raise EmulatorError.not_found(f"Session sessions/{session_id} was not found.")
        if session.account is not account:
            raise EmulatorError(
                403,
                "PERMISSION_DENIED",
                f"The caller does not have permission to access sessions/{session_id}.",
            )
        return session

    # ------------------------------------------------------------------ activities

    def list_activities(
        self,
        account: Account,
        session_id: str,
        *,
        after: int | None,
        limit: int,
        since: TimeBound | None = None,
    ) -> Page[Activity, int]:
        """The session's activities, oldest first, after position ``after`` and ``since``."""
        with self._lock:
            now = self.advance()
            session = self._visible(self._owned(account, session_id), now)
            start = 0 if after is None else after + 1
            return _page(
                (
                    (index, activity)
                    for index, (time_us, activity) in enumerate(session.activities[start:], start)
                    if since is None or since.admits(time_us)
                ),
                limit,
            )

    def get_activity(self, account: Account, session_id: str, activity_id: str) -> Activity:
        """One activity of the session, 404 when the session has no such activity."""
        with self._lock:
            now = self.advance()
            session = self._visible(self._owned(account, session_id), now)
            index = session.activity_index.get(activity_id)
            if index is None:
                raise EmulatorError.not_found(
                    f"Activity {session.name}/activities/{activity_id} was not found."
                )
            return session.activities[index][1]

    # ------------------------------------------------------------------ sources

    def list_sources(
        self,
        account: Account,
        *,
        after: str | None,
        limit: int,
        names: frozenset[str] | None = None,
    ) -> Page[Source, str]:
        """Connected sources by name, after ``after``; only ``names`` when given.

        Every account has the same sources, so any key can create sessions on them.
        """
        return _page(
            (
                (source.name, source)
                for source in self._sources.values()
                if (after is None or source.name > after)
                and (names is None or source.name in names)
            ),
            limit,
        )

    def get_source(self, account: Account, source_id: str) -> Source:
        """One source by id (``github/<owner>/<repo>``), 404 when not connected."""
        source = self._sources.get(source_id)
        if source is None:
            raise EmulatorError.not_found(f"Source sources/{source_id} was not found.")
        return source


def _make_account(index: int, keys: Sequence[str]) -> Account:
    keys = tuple(keys)
    if not keys or len(keys) > MAX_KEYS_PER_ACCOUNT:
        raise ValueError(f"an account holds 1 to {MAX_KEYS_PER_ACCOUNT} API keys, got {len(keys)}")
    if not all(isinstance(k, str) and k.strip() == k and k for k in keys):
        raise ValueError("API keys must be non-empty strings without surrounding spaces")
    return Account(id=f"accounts/{index + 1}", keys=keys)
