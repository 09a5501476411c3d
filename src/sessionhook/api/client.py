"""The typed async client of the Sessions API (``/v1alpha``): :class:`SessionsClient`.

One method per operation, over an injected :class:`httpx.AsyncClient` (tests hand it an
``httpx.MockTransport`` or the emulator through ``httpx.ASGITransport``). Failures are
:class:`~sessionhook.api.errors.ApiError` subclasses; a pydantic ``ValidationError`` never
escapes. Its collaborators: :class:`~sessionhook.api.exchange.Exchange` (which calls are
retried, deadline, size bounds, the key never shown), :class:`~sessionhook.api.decoding.Decoder`
(answers to models) and :mod:`sessionhook.api.paging` (list walks).
"""

from __future__ import annotations

import math
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Final, TypeVar
from urllib.parse import quote

import anyio
import httpx

from .decoding import Decoder, server_time
from .exchange import Exchange, OnAnswer
from .models import (
    Activity,
    CreateSessionRequest,
    HostRepoContext,
    ListActivitiesResponse,
    ListSessionsResponse,
    ListSourcesResponse,
    SendMessageRequest,
    Session,
    Source,
    SourceContext,
)
from .paging import (
    ACTIVITY_SCAN,
    SESSION_LOOP_PAGES,
    ActivityPage,
    Fetch,
    Page,
    SessionPage,
    walk_items,
    walk_pages,
)
from .retry import RetryPolicy

#: Appended to the service address; the version is part of the path (spec part 9).
API_VERSION_PATH: Final = "/v1alpha"
#: The header that carries the API key (spec part 5).
DEFAULT_API_KEY_HEADER: Final = "x-vendor-api-key"
#: The session list's filter for archived sessions (AIP-160, as the official SDK writes it).
ARCHIVED_FILTER: Final = "archived = true"

#: Bytes of one answer the client keeps at most (16 MiB): a page of 100 activities is
#: typically well under 1 MiB; media artifacts make the rest.
DEFAULT_MAX_RESPONSE_BYTES: Final = 16 * 1024 * 1024
#: Nesting the client parses at most. The deepest documented shape (a list of activities
#: with artifacts holding a change set with a patch) is 6 levels deep.
DEFAULT_MAX_DEPTH: Final = 64


_M = TypeVar("_M", Session, Activity, Source)
_L = TypeVar("_L", ListActivitiesResponse, ListSessionsResponse, ListSourcesResponse)

# --------------------------------------------------------------------------- names


def session_name(value: str) -> str:
    """``sessions/<id>`` from a session name or a bare id.

    Raises :class:`ValueError` for anything else (empty, or more path segments).
    """
    ident = value.strip().removeprefix("sessions/")
    if not ident or "/" in ident:
        raise ValueError(f"not a session name (sessions/<id>) or id: {value!r}")
    return f"sessions/{ident}"


def activity_name(value: str, activity_id: str | None = None) -> str:
    """``sessions/<id>/activities/<id>`` from a full name, or from a session and an id.

    Raises :class:`ValueError` when the parts do not make an activity name.
    """
    if activity_id is not None:
        ident = activity_id.strip()
        if not ident or "/" in ident:
            raise ValueError(f"not an activity id: {activity_id!r}")
        return f"{session_name(value)}/activities/{ident}"
    parts = value.strip().split("/")
    if len(parts) != 4 or parts[0] != "sessions" or parts[2] != "activities" or not all(parts):
        raise ValueError(
            f"not an activity name (sessions/<id>/activities/<id>): {value!r}; "
            "or pass the session and the activity id separately"
        )
    return "/".join(parts)


def source_name(value: str) -> str:
    """``sources/<id>`` from a source name or id; ids contain slashes (``github/o/r``).

    Raises :class:`ValueError` for an empty id or an empty path segment.
    """
    ident = value.strip().removeprefix("sources/")
    if not ident or not all(ident.split("/")):
        raise ValueError(f"not a source name (sources/github/<owner>/<repo>) or id: {value!r}")
    return f"sources/{ident}"


def _path(name: str) -> str:
    # Each segment is escaped on its own: the slashes between segments stay slashes
    # (source ids contain them) while a stray "?", "#" or ":" inside an id cannot change
    # the meaning of the URL.
    return "/" + "/".join(quote(segment, safe="") for segment in name.split("/"))


def api_root(base_url: str) -> str:
    """The API root for a service address: ``/v1alpha`` appended unless already there.

    Raises :class:`ValueError` unless ``base_url`` is an absolute http(s) URL.
    """
    try:
        url = httpx.URL(base_url.strip())
    except httpx.InvalidURL as exc:
        raise ValueError(f"base_url is not a URL: {base_url!r} ({exc})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"base_url must be an http(s) URL such as https://host, not {base_url!r}")
    root = str(url.copy_with(query=None, fragment=None)).rstrip("/")
    if not root.endswith(API_VERSION_PATH):
        root += API_VERSION_PATH
    return root


# --------------------------------------------------------------------------- the client


class SessionsClient:
    """Every endpoint of the Sessions API over an injected :class:`httpx.AsyncClient`.

    ``base_url`` is the service address; ``/v1alpha`` is appended unless it is already
    there. The injected client's own ``base_url``, auth and timeout are not used: every
    request carries an absolute URL, the key header and ``timeout`` (seconds: the deadline
    of one attempt's whole exchange). ``max_response_bytes`` and ``max_depth`` bound what
    an answer may be (see :mod:`~sessionhook.api.exchange` and
    :mod:`~sessionhook.api.decoding`). ``gate`` is awaited before each attempt,
    outside its deadline (a request budget: waiting for it is not the service being slow).
    ``sleep`` and ``rng`` are injectable so that tests observe backoff without waiting.
    ``await on_answer(response, malformed)`` (optional) is told about every 2xx answer once
    its body was checked: the relay counts a 2xx answer that does not parse as malformed.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        base_url: str,
        api_key: str,
        api_key_header: str = DEFAULT_API_KEY_HEADER,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_depth: int = DEFAULT_MAX_DEPTH,
        gate: Callable[[], Awaitable[None]] | None = None,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        rng: random.Random | None = None,
        on_answer: OnAnswer | None = None,
    ) -> None:
        if not api_key:
            raise ValueError("api_key is empty")
        if not api_key_header.strip():
            raise ValueError("api_key_header is empty")
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        if max_response_bytes < 1024:
            raise ValueError(f"max_response_bytes must be at least 1024, not {max_response_bytes}")
        if max_depth < 8:
            raise ValueError(f"max_depth must be at least 8, not {max_depth}")
        self._root = api_root(base_url)
        self._exchange = Exchange(
            http=http,
            root=self._root,
            api_key=api_key,
            key_header=api_key_header.strip().lower(),
            timeout=timeout,
            retry=retry if retry is not None else RetryPolicy(),
            max_response_bytes=max_response_bytes,
            max_depth=max_depth,
            gate=gate,
            sleep=sleep,
            rng=rng if rng is not None else random.Random(),
            on_answer=on_answer,
        )
        self._decoder = Decoder(
            max_depth=max_depth, redact=self._exchange.redact, answered=self._exchange.answered
        )

    def __repr__(self) -> str:
        return f"SessionsClient(base_url={self._root!r})"

    @property
    def base_url(self) -> str:
        """The API root every path is appended to, ``/v1alpha`` included."""
        return self._root

    # ----------------------------------------------------------------------- sessions

    async def create_session(
        self,
        prompt: str,
        *,
        title: str | None = None,
        source: str | None = None,
        starting_branch: str | None = None,
        require_plan_approval: bool | None = None,
        automation_mode: str | None = None,
    ) -> Session:
        """Create a session (``POST /sessions``); it starts ``QUEUED``.

        ``source`` is a source name or id (``github/<owner>/<repo>``); without it the
        session is repoless. ``starting_branch`` needs a ``source``. ``automation_mode``
        :data:`AUTO_CREATE_PR` makes the service open a pull request by itself. Not
        retried except when the request provably never left (see :mod:`.exchange`).
        """
        context: SourceContext | None = None
        if source is not None:
            context = SourceContext(
                source=source_name(source),
                host_repo_context=(
                    HostRepoContext(starting_branch=starting_branch) if starting_branch else None
                ),
            )
        elif starting_branch:
            raise ValueError("starting_branch needs a source")
        request = CreateSessionRequest(
            prompt=prompt,
            title=title,
            source_context=context,
            require_plan_approval=require_plan_approval,
            automation_mode=automation_mode,
        )
        body = request.model_dump(mode="json", by_alias=True, exclude_none=True)
        response = await self._exchange.request("POST", "/sessions", body=body, idempotent=False)
        return await self._decoder.decode(Session, response)

    async def list_sessions(
        self,
        *,
        page_size: int | None = None,
        page_token: str | None = None,
        filter: str | None = None,  # the API's own name for it
    ) -> ListSessionsResponse:
        """One page of the account's sessions (newest first in practice).

        The last page has an empty ``next_page_token``. List items carry a reduced set of
        fields; :meth:`get_session` returns the whole session. Text that is not Unicode is
        mended (:attr:`Session.repaired`); an item that is no session fails the page.
        ``filter`` is an AIP-160 expression: :data:`ARCHIVED_FILTER` lists the archived
        sessions, which the default list leaves out (beyond the interface spec).
        """
        page = await self._sessions(filter=filter)(page_token, page_size, False)
        parsed: ListSessionsResponse = page.parsed
        return parsed

    def iter_sessions(
        self,
        *,
        page_size: int | None = None,
        max_pages: int | None = None,
        filter: str | None = None,  # the API's own name for it
    ) -> AsyncIterator[Session]:
        """Every session of the account, walking all pages (each name yielded once).

        A page too large to read is asked again with half the page size; more than
        ``max_pages`` pages raise :class:`~sessionhook.api.errors.PageLimitError`, three
        pages in a row with nothing new :class:`~sessionhook.api.errors.PageLoopError`.
        """
        return walk_items(
            self._sessions(filter=filter),
            page_size=page_size,
            max_pages=max_pages,
            loop_pages=SESSION_LOOP_PAGES,
        )

    async def walk_sessions(
        self,
        *,
        page_size: int | None = None,
        max_pages: int | None = None,
        filter: str | None = None,  # the API's own name for it
        kept: Callable[[str], str] | None = None,
    ) -> AsyncGenerator[SessionPage, None]:
        """Every session of the account, page by page, going past items that are no session.

        Like :meth:`iter_sessions`, but an item that is no session (no string ``name``, a
        field of the wrong type, a ``name`` that is not Unicode) does not fail its page: it
        comes back in :attr:`SessionPage.invalid`, the others of the page as usual.
        ``kept``: see :func:`~.paging.walk_pages`.
        """
        async for page in walk_pages(
            self._sessions(lenient=True, filter=filter),
            page_size=page_size,
            max_pages=max_pages,
            refuse_oversize=False,
            loop_pages=SESSION_LOOP_PAGES,
            kept=kept,
        ):
            yield SessionPage(page.items, page.invalid)

    def _sessions(self, *, lenient: bool = False, filter: str | None = None) -> Fetch[Session]:
        params = {"filter": filter}
        return self._lister("/sessions", ListSessionsResponse, "sessions", params, lenient)

    def _lister(
        self,
        path: str,
        model: type[_L],
        key: str,
        params: dict[str, str | None],
        lenient: bool = False,
    ) -> Fetch[Any]:
        """The ``fetch`` of one list for :mod:`.paging` (``key``: the envelope's member).

        ``lenient``: an item that does not validate is refused, not its whole page.
        """

        async def fetch(token: str | None, page_size: int | None, scan: bool) -> Page[Any]:
            response = await self._exchange.request(
                "GET",
                path,
                params={"pageSize": page_size, "pageToken": token, **params},
                idempotent=True,
                page_size=page_size,
                scan=ACTIVITY_SCAN if scan else (),
            )
            parsed, invalid = await self._decoder.decode_list(model, key, response, lenient=lenient)
            return Page(
                getattr(parsed, key),
                parsed.next_page_token,
                server_time(response),
                invalid=invalid,
                parsed=parsed,
            )

        return fetch

    async def get_session(self, session: str) -> Session:
        """The full session (``outputs`` included); accepts ``sessions/<id>`` or ``<id>``.

        Text that is not Unicode is mended (:attr:`Session.repaired`), except in ``name``.
        """
        return await self._get(Session, session_name(session))

    async def delete_session(self, session: str) -> None:
        """Delete a session; accepts ``sessions/<id>`` or ``<id>``.

        Retried like a read, since deleting is idempotent; see :mod:`.exchange` for how a
        404 after an ambiguous failure is treated.
        """
        response = await self._exchange.request(
            "DELETE",
            _path(session_name(session)),
            idempotent=True,
            missing_ok_after_retry=True,
        )
        await self._decoder.decode_empty(response)

    async def send_message(self, session: str, prompt: str) -> None:
        """Send a user message to a session; the agent answers in a later activity.

        Not retried except when the request provably never left.
        """
        body = SendMessageRequest(prompt=prompt).model_dump(mode="json", by_alias=True)
        await self._act(session, ":sendMessage", body)

    async def approve_plan(self, session: str) -> None:
        """Approve the pending plan of a session created with ``require_plan_approval``.

        Not retried except when the request provably never left.
        """
        await self._act(session, ":approvePlan", {})

    async def archive(self, session: str) -> Session:
        """Archive a session (beyond the interface spec, as the official SDK calls it): it
        leaves the default list; archiving a working session pauses it. Retried like a read,
        since archiving twice is archiving once."""
        return await self._archive(session, ":archive")

    async def unarchive(self, session: str) -> Session:
        """Unarchive a session: it is back in the default list."""
        return await self._archive(session, ":unarchive")

    async def _archive(self, session: str, verb: str) -> Session:
        path = _path(session_name(session)) + verb
        response = await self._exchange.request("POST", path, body={}, idempotent=True)
        return await self._decoder.decode(Session, response)

    async def _act(self, session: str, verb: str, body: dict[str, Any]) -> None:
        """POST a custom method (``:verb``) of a session, whose answer carries nothing."""
        path = _path(session_name(session)) + verb
        response = await self._exchange.request("POST", path, body=body, idempotent=False)
        await self._decoder.decode_empty(response)

    async def _get(self, model: type[_M], name: str) -> _M:
        response = await self._exchange.request("GET", _path(name), idempotent=True)
        return await self._decoder.decode(model, response)

    # ----------------------------------------------------------------------- activities

    async def list_activities(
        self,
        session: str,
        *,
        page_size: int | None = None,
        page_token: str | None = None,
        create_time: str | None = None,
    ) -> ListActivitiesResponse:
        """One page of a session's activities, oldest first.

        ``create_time`` (RFC 3339) asks for activities from that time on; whether the bound
        is inclusive is the server's choice, and a server may ignore it, so callers that
        poll must deduplicate by activity name.
        """
        page = await self._activities(session, create_time)(page_token, page_size, False)
        parsed: ListActivitiesResponse = page.parsed
        return parsed

    def iter_activities(
        self,
        session: str,
        *,
        page_size: int | None = None,
        create_time: str | None = None,
        max_pages: int | None = None,
    ) -> AsyncIterator[Activity]:
        """Every activity of a session (from ``create_time``), walking all pages.

        Each name is yielded once within one walk. A page too large to read is asked again
        with half the page size; a single activity too large to read raises
        :class:`~sessionhook.api.errors.ResponseTooLargeError` (:meth:`walk_activities`
        goes past it instead).
        """
        fetch = self._activities(session, create_time)
        return walk_items(fetch, page_size=page_size, max_pages=max_pages)

    async def walk_activities(
        self,
        session: str,
        *,
        page_size: int | None = None,
        create_time: str | None = None,
        max_pages: int | None = None,
    ) -> AsyncIterator[ActivityPage]:
        """Every activity of a session, page by page, going past what cannot be read.

        Like :meth:`iter_activities`, but each page comes with the service's clock (its
        ``Date`` header), and a single activity too large to read is not an error: its page
        is scanned as it streams by, never kept, and comes back as
        :attr:`ActivityPage.refused` (with the ``name`` and ``createTime`` the scan found);
        the walk goes on with the page token the scan found. Items that are not activities
        (no string ``name``...) come back in :attr:`ActivityPage.invalid`, the others of
        their page as usual. More than ``max_pages`` pages
        raise :class:`~sessionhook.api.errors.PageLimitError` after the last one allowed; a
        page that brings nothing new raises :class:`~sessionhook.api.errors.PageLoopError`
        after it (both: when it offers another page).
        """
        fetch = self._activities(session, create_time, lenient=True)
        async for page in walk_pages(
            fetch, page_size=page_size, max_pages=max_pages, refuse_oversize=True
        ):
            yield ActivityPage(page.items, page.refused, page.server_time, page.invalid)

    def _activities(
        self, session: str, create_time: str | None, *, lenient: bool = False
    ) -> Fetch[Activity]:
        path = _path(session_name(session)) + "/activities"
        params = {"createTime": create_time}
        return self._lister(path, ListActivitiesResponse, "activities", params, lenient)

    async def get_activity(self, name: str, activity_id: str | None = None) -> Activity:
        """One activity with its artifacts.

        Either its full name (``sessions/<id>/activities/<id>``), or a session (name or id)
        and ``activity_id``.
        """
        return await self._get(Activity, activity_name(name, activity_id))

    # ----------------------------------------------------------------------- sources

    async def list_sources(
        self,
        *,
        page_size: int | None = None,
        page_token: str | None = None,
        filter: str | None = None,  # the API's own name for it
    ) -> ListSourcesResponse:
        """One page of the sources connected to the account.

        ``filter`` is an AIP-160 expression, for example
        ``name=sources/github/o/a OR name=sources/github/o/b``; it is URL-encoded here.
        """
        page = await self._sources(filter)(page_token, page_size, False)
        parsed: ListSourcesResponse = page.parsed
        return parsed

    def iter_sources(
        self,
        *,
        page_size: int | None = None,
        filter: str | None = None,  # the API's own name for it
    ) -> AsyncIterator[Source]:
        """Every connected source (matching ``filter``), walking all pages."""
        return walk_items(self._sources(filter), page_size=page_size, max_pages=None)

    def _sources(self, filter: str | None) -> Fetch[Source]:
        return self._lister("/sources", ListSourcesResponse, "sources", {"filter": filter})

    async def get_source(self, source: str) -> Source:
        """One source with its branches; accepts ``sources/github/o/r`` or ``github/o/r``."""
        return await self._get(Source, source_name(source))
