"""Walking a list of the API page by page, and reading a page item by item.

A walk (:func:`walk_pages`) asks for pages until the service gives no next page token, and
keeps every name (and every refusal) to itself once:

* a page that is too large to read is asked again with half the page size (the rest of the
  walk keeps the smaller size), down to one item; with ``refuse_oversize`` a single item
  still too large becomes a page whose :attr:`Page.refused` is set, and the walk goes on with
  the page token the scan of that answer found (see :class:`RefusedItem`);
* it stops after ``max_pages`` pages (:class:`~sessionhook.api.errors.PageLimitError`), and
  at a page that brings nothing new while offering another
  (:class:`~sessionhook.api.errors.PageLoopError`): a page *brings nothing new* when it holds
  at least one item and every one of them (by name; an item refused as too large or
  malformed: the same refusal) was met earlier in the same walk. An activity list ends at
  the first such page (it grows only at its end: a page of repeats is never a shift); the
  session list, newest first, at the third in a row (:data:`SESSION_LOOP_PAGES`: every
  session created during the walk shifts it, and a burst of a page's worth repeats a whole
  page legitimately). An EMPTY page with a next token is not one: AIP-158 lets a server
  answer fewer items than asked, none included, before the end (a page cut short by a
  filter), so only ``max_pages`` bounds a run of empty pages;
* a page token handed out twice is a
  :class:`~sessionhook.api.errors.MalformedResponseError` (the walk would loop forever).

A page whose envelope is sound must not be lost for one item that is not what the API
promises: :func:`items_one_by_one` keeps the items that validate (sessions mended, see
:mod:`._unicode`) and describes the others as :class:`RefusedItem` (``malformed``), so that
the caller can name them and go on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import datetime
from typing import Any, Final, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from ..wording import counted
from ._bounds import JsonPath
from ._unicode import NotUnicodeError, is_unicode, mended
from .errors import MalformedResponseError, PageLimitError, PageLoopError, ResponseTooLargeError
from .models import (
    Activity,
    ListActivitiesResponse,
    ListSessionsResponse,
    ListSourcesResponse,
    Session,
    Source,
)

#: Pages in a row that bring nothing new before a walk ends as a loop: an activity list at
#: once, the session list (which shifts while it is walked) at the third.
LOOP_PAGES: Final = 1
SESSION_LOOP_PAGES: Final = 3
#: What a one-activity page too large to keep is scanned for, as it streams by.
ACTIVITY_SCAN: Final[tuple[JsonPath, ...]] = (
    ("activities", 0, "name"),
    ("activities", 0, "createTime"),
    ("nextPageToken",),
)
# The server's default page size is unknown when none was asked; halving starts here.
_UNKNOWN_PAGE_SIZE: Final = 100
# What each list's items are, by the envelope's key.
_ITEMS: Final[dict[str, tuple[type[BaseModel], str]]] = {
    "activities": (Activity, "an activity"),
    "sessions": (Session, "a session"),
    "sources": (Source, "a source"),
}

_log = logging.getLogger(__name__)

_R = TypeVar("_R", Session, Activity, Source)
_L = TypeVar("_L", ListActivitiesResponse, ListSessionsResponse, ListSourcesResponse)


@dataclass(frozen=True)
class RefusedItem:
    """One item of a list that cannot be read: ``reason`` says why.

    ``too_large``: the item alone (a page of one) is over the bound. Its answer was scanned
    as it streamed by, never kept: ``name`` and ``create_time`` are what the scan found
    (empty when the item did not say), ``size`` the bytes the answer had and ``limit`` the
    bound it broke. ``malformed``: the item is not an activity (or session): no string
    ``name``, a field of the wrong type; ``detail`` says what is wrong, ``name`` and
    ``create_time`` are given when they are strings.
    """

    name: str
    create_time: str
    size: int
    limit: int
    reason: str = "too_large"
    detail: str = ""


@dataclass(frozen=True)
class ActivityPage:
    """One page of :meth:`~sessionhook.api.client.SessionsClient.walk_activities`.

    ``activities`` are those not yielded before in the walk; ``refused`` is set when the page
    was a single activity too large to read; ``server_time`` is the answer's ``Date`` header
    (the service's own clock), ``None`` when absent or unreadable.
    """

    activities: list[Activity]
    refused: RefusedItem | None = None
    server_time: datetime | None = None
    #: Items of the page that are not activities (``reason="malformed"``); the others of
    #: the page are in ``activities``.
    invalid: list[RefusedItem] = dataclass_field(default_factory=list)


@dataclass(frozen=True)
class SessionPage:
    """One page of :meth:`~sessionhook.api.client.SessionsClient.walk_sessions`: the
    sessions not yielded before in the walk (mended ones among them, see
    :attr:`Session.repaired`), and the items of the page that are no session
    (``reason="malformed"``)."""

    sessions: list[Session]
    invalid: list[RefusedItem] = dataclass_field(default_factory=list)


@dataclass
class Page(Generic[_R]):
    """One page as a walk sees it; the walk drops from ``items``, ``invalid`` and
    ``refused`` what it met before."""

    items: list[_R]
    next_token: str
    server_time: datetime | None = None
    refused: RefusedItem | None = None
    invalid: list[RefusedItem] = dataclass_field(default_factory=list)
    #: The whole parsed answer (what ``list_*`` returns).
    parsed: Any = None


#: ``fetch(page_token, page_size, scan)`` of a list walk: one page; ``scan`` asks a page of
#: one that is too large to be scanned for :data:`ACTIVITY_SCAN` as it streams by.
Fetch = Callable[[str | None, int | None, bool], Awaitable[Page[_R]]]


async def walk_items(
    fetch: Fetch[_R],
    *,
    page_size: int | None,
    max_pages: int | None,
    loop_pages: int = LOOP_PAGES,
) -> AsyncIterator[_R]:
    """The items of :func:`walk_pages` one by one (an item too large to read raises)."""
    async for page in walk_pages(
        fetch,
        page_size=page_size,
        max_pages=max_pages,
        refuse_oversize=False,
        loop_pages=loop_pages,
    ):
        for item in page.items:
            yield item


async def walk_pages(
    fetch: Fetch[_R],
    *,
    page_size: int | None,
    max_pages: int | None,
    refuse_oversize: bool,
    loop_pages: int = LOOP_PAGES,
    kept: Callable[[str], str] | None = None,
) -> AsyncIterator[Page[_R]]:
    """Walk a list page by page, each name (and each refusal) yielded once; see the
    module docstring. Names are deduplicated because a list that shifts while it is walked
    (a session created meanwhile) can repeat an item across a page boundary. ``kept(name)``:
    an equal string the caller keeps already, remembered instead of the item's own (a walk
    of 100,000 sessions then keeps no second copy of each name)."""
    token: str | None = None
    size = page_size
    tokens_seen: set[str] = set()
    names_seen: set[str] = set()
    refusals_seen: set[RefusedItem] = set()
    repeats = 0  # pages in a row that brought nothing new (empty pages do not count)
    pages = 0
    while True:
        try:
            page = await fetch(token, size, refuse_oversize and size == 1)
        except ResponseTooLargeError as exc:
            if size is None or size > 1:
                smaller = max(1, (size or _UNKNOWN_PAGE_SIZE) // 2)
                _log.info(
                    "api.page_too_large url=%s page_size=%s limit=%d retry_page_size=%d",
                    exc.request.url if exc.request is not None else "",
                    size,
                    exc.limit,
                    smaller,
                )
                size = smaller
                continue
            if not refuse_oversize:
                raise
            page = Page(
                [],
                exc.scanned.get("nextPageToken", ""),
                refused=RefusedItem(
                    name=exc.scanned.get("activities.0.name", ""),
                    create_time=exc.scanned.get("activities.0.createTime", ""),
                    size=exc.size,
                    limit=exc.limit,
                ),
            )
        pages += 1
        held = bool(page.items or page.invalid or page.refused)
        fresh = [item for item in page.items if item.name not in names_seen]
        names_seen.update(
            (item.name for item in fresh) if kept is None else (kept(item.name) for item in fresh)
        )
        page.items = fresh
        page.invalid = [item for item in page.invalid if item not in refusals_seen]
        if page.refused in refusals_seen:
            page.refused = None
        refusals_seen.update(page.invalid)
        if page.refused is not None:
            refusals_seen.add(page.refused)
        if held:
            news = bool(page.items or page.invalid or page.refused)
            repeats = 0 if news else repeats + 1
        yield page
        next_token = page.next_token
        if not next_token:
            return
        if next_token in tokens_seen:
            raise MalformedResponseError(
                f"the service returned page token {next_token!r} twice; pagination loops",
                body=next_token,
            )
        if repeats >= loop_pages:
            raise PageLoopError(
                f"{_pages_phrase(repeats, pages)} brought nothing new to this walk (every "
                "item met on an earlier page) yet offered another page token; "
                "pagination loops",
                pages=pages,
                repeats=repeats,
            )
        if max_pages is not None and pages >= max_pages:
            raise PageLimitError(
                f"still a next page after {counted(pages, 'page')} (the bound of one walk); "
                "the service may paginate without end",
                max_pages=max_pages,
            )
        tokens_seen.add(next_token)
        token = next_token


def _pages_phrase(repeats: int, last: int) -> str:
    """``page 2`` or ``pages 3 to 5``: the pages of a walk that brought nothing new."""
    return f"page {last}" if repeats == 1 else f"pages {last - repeats + 1} to {last}"


def items_one_by_one(
    envelope_model: type[_L], key: str, content: bytes, error: MalformedResponseError
) -> tuple[_L, list[RefusedItem]]:
    """The envelope with the ``key`` items that validate, and the others as ``malformed``
    :class:`RefusedItem`; re-raises ``error`` when the envelope itself is wrong."""
    data = json.loads(content)
    items = data.get(key) if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise error
    try:
        envelope = envelope_model.model_validate({k: v for k, v in data.items() if k != key})
    except ValidationError:
        raise error from None
    if not is_unicode(envelope.to_wire()):
        raise error  # a page token nobody can send back
    item_model, noun = _ITEMS[key]
    kept: list[Any] = getattr(envelope, key)
    invalid: list[RefusedItem] = []
    for raw in items:
        try:
            unicode = is_unicode(raw)
            kept.append(item_model.model_validate(raw) if unicode else mended(item_model, raw))
        except (ValidationError, NotUnicodeError) as exc:
            invalid.append(_refused(raw, exc, noun))
    return envelope, invalid


def _refused(raw: Any, exc: ValidationError | NotUnicodeError, noun: str) -> RefusedItem:
    """The :class:`RefusedItem` of an item that is not ``noun``."""
    fields = raw if isinstance(raw, dict) else {}
    name, when = fields.get("name"), fields.get("createTime")
    return RefusedItem(
        name=name if isinstance(name, str) and is_unicode(name) else "",
        create_time=when if isinstance(when, str) and is_unicode(when) else "",
        size=len(json.dumps(raw)),
        limit=0,
        reason="malformed",
        detail=f"not {noun}: {invalid_reason(exc, 'item')}",
    )


def invalid_reason(exc: ValidationError | NotUnicodeError, whole: str) -> str:
    """What is wrong first, at which dotted path (``whole`` when at the top)."""
    if isinstance(exc, NotUnicodeError):
        return str(exc)
    first = exc.errors()[0]
    return f"{'.'.join(str(part) for part in first['loc']) or whole}: {first['msg']}"
