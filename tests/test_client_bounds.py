"""The client's bounds on what the service sends: depth, bytes, the whole-exchange deadline,
pages per walk, and going past one activity too large to read (httpx.MockTransport)."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionhook.api import RetryPolicy, ServerError, SessionsClient
from sessionhook.api._bounds import JsonFieldScanner, nesting_depth_exceeds
from sessionhook.api.errors import (
    ApiError,
    DeadlineExceededError,
    MalformedResponseError,
    PageLimitError,
    PageLoopError,
    ResponseTooDeepError,
    ResponseTooLargeError,
    TransportError,
)

KEY = "sk-test-0123456789abcdef"
BASE = "http://api.test"
LIMIT = 64 * 1024
DEEP = b"[" * 100_000 + b"]" * 100_000

pytestmark = [pytest.mark.unit, pytest.mark.anyio]


def client(
    http: httpx.AsyncClient, *, retry: RetryPolicy | None = None, **kwargs: Any
) -> SessionsClient:
    kwargs.setdefault("max_response_bytes", LIMIT)
    return SessionsClient(
        http, base_url=BASE, api_key=KEY, retry=retry or RetryPolicy(max_attempts=1), **kwargs
    )


def activity(i: int, session: str = "sessions/1", pad: int = 0) -> dict[str, Any]:
    a: dict[str, Any] = {
        "name": f"{session}/activities/{i:032x}",
        "createTime": f"2026-01-01T00:00:{i:02d}.000000Z",
    }
    if pad:
        a["artifacts"] = [{"media": {"mimeType": "image/png", "data": "A" * pad}}]
    return a


class Served:
    """A list of activities served in pages of the asked size, with offset tokens; records
    each asked page size and how many bytes of bodies were consumed."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.sizes: list[int] = []
        self.consumed = 0

    def stream(self, body: bytes) -> AsyncIterator[bytes]:
        async def chunks() -> AsyncIterator[bytes]:
            for i in range(0, len(body), 8192):
                self.consumed += len(body[i : i + 8192])
                yield body[i : i + 8192]

        return chunks()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        size = int(request.url.params.get("pageSize") or 50)
        self.sizes.append(size)
        start = int(request.url.params.get("pageToken") or 0)
        page: dict[str, Any] = {"activities": self.items[start : start + size]}
        if start + size < len(self.items):
            page["nextPageToken"] = str(start + size)
        body = json.dumps(page).encode()
        return httpx.Response(200, content=self.stream(body))


# --------------------------------------------------------------------------- depth


def test_depth_check_ignores_brackets_inside_strings() -> None:
    assert nesting_depth_exceeds(DEEP, 64)
    assert not nesting_depth_exceeds(json.dumps({"a": "[" * 1000}).encode(), 64)
    assert not nesting_depth_exceeds(json.dumps([[[1]]]).encode(), 3)
    assert nesting_depth_exceeds(json.dumps([[[[1]]]]).encode(), 3)


def _depth_exceeds_by_regex(data: bytes, limit: int) -> bool:
    """The depth check as it was before it dropped the strings without a regex."""
    strings = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
    depth = 0
    for byte in strings.sub(b"", data):
        if byte in b"[{":
            depth += 1
            if depth > limit:
                return True
        elif byte in b"]}":
            depth -= 1
    return False


# Strings full of what could fool a string scanner: quotes, backslashes, brackets.
_tricky_text = st.text(alphabet='[]{}"\\\\/ab\n\u00e9\u2603', max_size=12)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | _tricky_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_tricky_text, inner, max_size=4),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(value=_json_values, limit=st.integers(min_value=0, max_value=6))
def test_depth_check_reads_strings_as_a_parser_does(value: object, limit: int) -> None:
    """Escaped quotes and backslashes in keys and values, at any depth: the same verdict as
    the regex that removed whole string literals, in both JSON spellings."""
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
        data = text.encode("utf-8")
        assert nesting_depth_exceeds(data, limit) == _depth_exceeds_by_regex(data, limit)


def test_depth_check_escapes_at_string_ends() -> None:
    """A string ending in escaped backslashes closes at its quote; an escaped quote does not
    close it, so the brackets after it are still inside."""
    assert nesting_depth_exceeds(b'["\\\\", [[1]]]', 2)
    assert not nesting_depth_exceeds(b'["\\" [[[[", 1]', 1)
    assert not nesting_depth_exceeds(b'["\\\\\\" [[[[", 1]', 1)


@pytest.mark.parametrize("path", ["sessions", "activities"])
async def test_deeply_nested_answer_is_malformed_not_a_recursion_error(path: str) -> None:
    body = b'{"' + path.encode() + b'": [{"name": "x", "deep": ' + DEEP + b"}]}"

    async with httpx.AsyncClient(
        transport=httpx.MockTransport(lambda r: httpx.Response(200, content=body))
    ) as http:
        api = client(http, max_response_bytes=1 << 20)
        with pytest.raises(ResponseTooDeepError) as caught:
            if path == "sessions":
                await api.list_sessions()
            else:
                await api.list_activities("1")
    assert isinstance(caught.value, MalformedResponseError)
    assert caught.value.kind == "too_deep"
    assert "deeper than 64" in str(caught.value)


async def test_deeply_nested_error_body_still_gives_a_status_error() -> None:
    body = b'{"error": ' + DEEP + b"}"
    async with httpx.AsyncClient(
        transport=httpx.MockTransport(lambda r: httpx.Response(500, content=body))
    ) as http:
        with pytest.raises(ServerError):
            await client(http, max_response_bytes=1 << 20).get_session("1")


# --------------------------------------------------------------------------- size


async def test_an_answer_over_the_bound_is_not_read_whole() -> None:
    served = Served([activity(0, pad=4 * LIMIT)])
    async with httpx.AsyncClient(transport=httpx.MockTransport(served)) as http:
        with pytest.raises(ResponseTooLargeError) as caught:
            await client(http).list_activities("1", page_size=1)
    assert caught.value.limit == LIMIT
    assert caught.value.kind == "too_large"
    assert caught.value.page_size == 1
    # Reading stopped at the bound (plus the chunk that crossed it).
    assert served.consumed <= LIMIT + 8192


async def test_a_declared_length_over_the_bound_is_refused_before_reading() -> None:
    pulled = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal pulled
        pulled += 1
        yield b"{}"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-length": str(LIMIT + 1)}, content=body())

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        with pytest.raises(ResponseTooLargeError):
            await client(http).get_session("1")
    assert pulled == 0


async def test_a_page_over_the_bound_is_asked_again_with_half_the_page_size() -> None:
    # Each activity is ~1/3 of the bound: pages of 8 and 4 are too large, 2 fits.
    items = [activity(i, pad=LIMIT // 3) for i in range(7)]
    served = Served(items)
    async with httpx.AsyncClient(transport=httpx.MockTransport(served)) as http:
        got = [a.name async for a in client(http).iter_activities("1", page_size=8)]
    assert got == [a["name"] for a in items]
    assert served.sizes[:3] == [8, 4, 2]
    assert set(served.sizes[3:]) == {2}  # the rest of the walk keeps the size that fit


async def test_iter_activities_raises_for_one_activity_over_the_bound() -> None:
    served = Served([activity(0), activity(1, pad=2 * LIMIT), activity(2)])
    async with httpx.AsyncClient(transport=httpx.MockTransport(served)) as http:
        with pytest.raises(ResponseTooLargeError):
            [a async for a in client(http).iter_activities("1", page_size=4)]
    assert served.sizes == [4, 2, 1, 1]


async def test_walk_activities_goes_past_one_activity_too_large_and_names_it() -> None:
    items = [activity(0), activity(1, pad=3 * LIMIT), activity(2), activity(3)]
    served = Served(items)
    async with httpx.AsyncClient(transport=httpx.MockTransport(served)) as http:
        pages = [p async for p in client(http).walk_activities("1", page_size=4)]
    names = [a.name for p in pages for a in p.activities]
    assert names == [items[0]["name"], items[2]["name"], items[3]["name"]]
    refused = [p.refused for p in pages if p.refused is not None]
    assert len(refused) == 1
    assert refused[0].name == items[1]["name"]
    assert refused[0].create_time == items[1]["createTime"]
    assert refused[0].size > 3 * LIMIT  # scanned to its end, never kept
    assert refused[0].limit == LIMIT
    assert 1 in served.sizes


def test_the_scanner_finds_fields_after_a_huge_string_in_any_split() -> None:
    doc = {
        "activities": [{"x": [1, {"name": "inner"}], "name": 'a"\\b\u00e9', "createTime": "t"}],
        "nextPageToken": "p,]}",
    }
    text = json.dumps(doc).encode()
    wanted = [("activities", 0, "name"), ("activities", 0, "createTime"), ("nextPageToken",)]
    for cut in range(1, len(text)):
        scanner = JsonFieldScanner(wanted)
        scanner.feed(text[:cut])
        scanner.feed(text[cut:])
        assert scanner.found == {
            ("activities", 0, "name"): 'a"\\b\u00e9',
            ("activities", 0, "createTime"): "t",
            ("nextPageToken",): "p,]}",
        }, cut
    scanner = JsonFieldScanner(wanted, max_depth=8)
    scanner.feed(DEEP)
    assert scanner.gave_up


# --------------------------------------------------------------------------- time


def drip(request: httpx.Request) -> httpx.Response:
    """Headers at once, then one byte every 50 ms, forever."""

    async def forever() -> AsyncIterator[bytes]:
        yield b'{"sessions": ['
        while True:
            await anyio.sleep(0.05)
            yield b" "

    return httpx.Response(200, content=forever())


async def test_a_slow_drip_fails_at_the_deadline_of_the_whole_exchange() -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(drip)) as http:
        with anyio.fail_after(10):  # a hang would fail here, not run until pytest-timeout
            with pytest.raises(DeadlineExceededError) as caught:
                await client(http, timeout=0.3).list_sessions()
    assert isinstance(caught.value, TransportError)
    assert caught.value.kind == "deadline"
    assert caught.value.deadline == 0.3


async def test_a_drip_is_retried_like_a_transport_error() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return drip(request) if calls == 1 else httpx.Response(200, json={"sessions": []})

    async def no_sleep(_: float) -> None:
        return None

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        api = client(http, timeout=0.3, retry=RetryPolicy(max_attempts=2), sleep=no_sleep)
        page = await api.list_sessions()
    assert page.sessions == [] and calls == 2


async def test_waiting_at_the_gate_is_not_part_of_the_deadline() -> None:
    gated = 0

    async def gate() -> None:
        nonlocal gated
        gated += 1
        await anyio.sleep(0.5)  # longer than the deadline

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"sessions": []})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        await client(http, timeout=0.2, gate=gate).list_sessions()
    assert gated == 1


# --------------------------------------------------------------------------- pages


async def test_runaway_pagination_stops_at_max_pages() -> None:
    asked = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal asked
        asked += 1
        return httpx.Response(
            200,
            json={"sessions": [{"name": f"sessions/{asked}"}], "nextPageToken": f"t{asked}"},
        )

    got: list[str] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        with pytest.raises(PageLimitError) as caught:
            async for s in client(http).iter_sessions(max_pages=5):
                got.append(s.name)
    assert asked == 5
    assert got == [f"sessions/{i}" for i in range(1, 6)]
    assert caught.value.kind == "page_limit"
    assert caught.value.max_pages == 5


class Looping:
    """Pages served in turn from ``pages`` (each a list of items), the last one again and
    again, always with a token never given before: pagination that never ends."""

    def __init__(self, key: str, pages: list[list[Any]]) -> None:
        self.key = key
        self.pages = pages
        self.asked = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        items = self.pages[min(self.asked, len(self.pages) - 1)]
        self.asked += 1
        return httpx.Response(200, json={self.key: items, "nextPageToken": f"t{self.asked}"})


async def walk_to_the_end(
    handler: Callable[[httpx.Request], httpx.Response],
    walk: Callable[[SessionsClient], AsyncIterator[Any]],
) -> tuple[list[Any], ApiError]:
    """What ``walk`` yields until it raises, and what it raises (it must)."""
    got: list[Any] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        with pytest.raises(ApiError) as caught:
            async for item in walk(client(http)):
                got.append(item)
    return got, caught.value


async def test_an_activity_page_that_brings_nothing_new_ends_the_walk_at_once() -> None:
    """The same activities again under a fresh token: the second page is the loop (not the
    200th, max_pages); what the first page brought was yielded."""
    served = Looping("activities", [[activity(1), activity(2)]])
    got, error = await walk_to_the_end(served, lambda c: c.iter_activities("1", max_pages=200))
    assert served.asked == 2
    assert [a.name for a in got] == [activity(1)["name"], activity(2)["name"]]
    assert isinstance(error, PageLoopError) and error.kind == "page_loop" and error.pages == 2
    assert "page 2 brought nothing new" in str(error)


async def test_a_page_of_items_met_on_any_earlier_page_is_a_loop() -> None:
    """A, B, A: the third page repeats the first; a page mixing old and new items is news."""
    a, b = [activity(1), activity(2)], [activity(2), activity(3)]
    served = Looping("activities", [a, b, a])
    _, error = await walk_to_the_end(served, lambda c: c.iter_activities("1", max_pages=200))
    assert isinstance(error, PageLoopError) and served.asked == 3


async def test_repeated_refusals_are_no_news_and_new_ones_are() -> None:
    """Items that are no activities count by their refusal: the same one again is a loop,
    yielded once; another one (another name) is news."""
    bad = {"name": "sessions/1/activities/x", "createTime": 5}  # createTime not a string
    served = Looping("activities", [[bad]])
    pages, error = await walk_to_the_end(served, lambda c: c.walk_activities("1", max_pages=50))
    assert isinstance(error, PageLoopError) and served.asked == 2
    assert [r.name for p in pages for r in p.invalid] == [bad["name"]]
    others = [[{**bad, "name": f"sessions/1/activities/{i}"}] for i in range(4)]
    served = Looping("activities", [*others, []])  # then empty pages: bounded by max_pages
    _, error = await walk_to_the_end(served, lambda c: c.walk_activities("1", max_pages=6))
    assert isinstance(error, PageLimitError) and served.asked == 6


async def test_empty_pages_with_a_next_token_are_allowed_up_to_max_pages() -> None:
    """AIP-158: a page may hold no item and still not be the last (a filter cut it short).
    Empty pages neither end the walk as a loop nor hide one: what comes after them is read."""
    served = Looping("activities", [[activity(1)], [], [], [], [activity(2)], []])
    got, error = await walk_to_the_end(served, lambda c: c.iter_activities("1", max_pages=8))
    assert isinstance(error, PageLimitError) and served.asked == 8
    assert [a.name for a in got] == [activity(1)["name"], activity(2)["name"]]
    served = Looping("activities", [[activity(1)], [], [activity(1)]])
    _, error = await walk_to_the_end(served, lambda c: c.iter_activities("1", max_pages=8))
    assert isinstance(error, PageLoopError) and served.asked == 3  # a repeat after an empty


def sessions(*numbers: int) -> list[dict[str, str]]:
    return [{"name": f"sessions/{n}"} for n in numbers]


async def test_the_session_list_ends_as_a_loop_at_the_third_page_of_repeats() -> None:
    served = Looping("sessions", [sessions(9, 8)])
    _, error = await walk_to_the_end(served, lambda c: c.iter_sessions(max_pages=200))
    assert isinstance(error, PageLoopError) and error.repeats == 3 and served.asked == 4
    assert "pages 2 to 4 brought nothing new" in str(error)


async def test_a_session_list_shifted_by_a_burst_is_walked_to_its_end() -> None:
    """Newest first, offset tokens: two sessions created while page 1 was read push it
    whole onto page 2 (nothing new there), then the walk goes on and finds the rest."""
    pages = [sessions(9, 8), sessions(9, 8), sessions(7, 6), sessions(5)]

    def handler(request: httpx.Request) -> httpx.Response:
        n = int(request.url.params.get("pageToken") or 0)
        body: dict[str, Any] = {"sessions": pages[n]}
        if n + 1 < len(pages):
            body["nextPageToken"] = str(n + 1)
        return httpx.Response(200, json=body)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        got = [s.name async for s in client(http).iter_sessions()]
    assert got == [f"sessions/{n}" for n in (9, 8, 7, 6, 5)]


async def test_pages_carry_the_server_clock() -> None:
    date = "Tue, 15 Nov 1994 08:12:31 GMT"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"date": date}, json={"activities": [activity(0)]})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        pages = [p async for p in client(http).walk_activities("1")]
    assert pages[0].server_time is not None
    assert pages[0].server_time.isoformat() == "1994-11-15T08:12:31+00:00"


async def test_a_date_past_year_9999_in_utc_is_no_server_clock() -> None:
    """A ``Date`` header that parses but overflows in UTC is unreadable, not a crash."""

    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"date": "Fri, 31 Dec 9999 23:59:59 -0100"}
        return httpx.Response(200, headers=headers, json={"activities": [activity(0)]})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        pages = [p async for p in client(http).walk_activities("1")]
    assert [a.name for a in pages[0].activities] == [activity(0)["name"]]
    assert pages[0].server_time is None


def test_bounds_are_validated() -> None:
    http: Callable[..., Any] = httpx.AsyncClient
    with pytest.raises(ValueError, match="max_response_bytes"):
        SessionsClient(http(), base_url=BASE, api_key=KEY, max_response_bytes=10)
    with pytest.raises(ValueError, match="max_depth"):
        SessionsClient(http(), base_url=BASE, api_key=KEY, max_depth=1)


async def test_an_answer_over_the_bounds_is_reported_as_malformed_to_on_answer() -> None:
    told: list[tuple[int, bool]] = []

    async def on_answer(response: httpx.Response, malformed: bool) -> None:
        told.append((response.status_code, malformed))

    served = Served([activity(0, pad=2 * LIMIT)])
    async with httpx.AsyncClient(transport=httpx.MockTransport(served)) as http:
        with pytest.raises(ResponseTooLargeError):
            await client(http, on_answer=on_answer).list_activities("1", page_size=1)
    assert told == [(200, True)]


async def test_walk_activities_sets_aside_items_that_are_no_activity() -> None:
    body = {"activities": [activity(0), {"createTime": "x"}, {"name": 7}, activity(1)]}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=body)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        pages = [p async for p in client(http).walk_activities("1")]
        assert [a.name for a in pages[0].activities] == [activity(0)["name"], activity(1)["name"]]
        assert [(i.reason, i.name, i.create_time) for i in pages[0].invalid] == [
            ("malformed", "", "x"),
            ("malformed", "", ""),
        ]
        assert "name" in pages[0].invalid[0].detail
        # The plain iterator (the CLI) still says the answer is malformed.
        with pytest.raises(MalformedResponseError):
            [a async for a in client(http).iter_activities("1")]


async def test_a_broken_envelope_is_still_malformed_in_a_walk() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"activities": [activity(0)], "nextPageToken": 5})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        with pytest.raises(MalformedResponseError):
            [p async for p in client(http).walk_activities("1")]
