"""SessionsClient against httpx.MockTransport: errors, retries, bodies, paths, pagination.

No real sleeping: every client gets a fake ``sleep`` that records the waits it was asked for.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionhook.api import (
    ApiStatusError,
    InvalidArgumentError,
    MalformedResponseError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitedError,
    RetryPolicy,
    ServerError,
    SessionsClient,
    TransportError,
    UnauthenticatedError,
)
from sessionhook.api.client import activity_name, api_root, session_name, source_name
from sessionhook.api.errors import parse_retry_after

pytestmark = pytest.mark.unit

KEY = "sk-test-0123456789abcdef"
BASE = "http://api.test"
NO_JITTER = RetryPolicy(jitter=0.0)

Handler = Callable[[httpx.Request], httpx.Response]


@dataclass
class Rig:
    """A client wired to a handler, with what it sent and how long it was told to wait."""

    client: SessionsClient
    requests: list[httpx.Request] = field(default_factory=list)
    sleeps: list[float] = field(default_factory=list)


@asynccontextmanager
async def rig(handler: Handler, **kwargs: Any) -> AsyncIterator[Rig]:
    requests: list[httpx.Request] = []
    sleeps: list[float] = []

    def record(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        return handler(request)

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    kwargs.setdefault("retry", NO_JITTER)
    kwargs.setdefault("base_url", BASE)
    async with httpx.AsyncClient(transport=httpx.MockTransport(record)) as http:
        client = SessionsClient(http, api_key=KEY, sleep=fake_sleep, **kwargs)
        yield Rig(client, requests, sleeps)


def error_json(code: int, status: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "status": status, "message": message, **extra}}


def sequence(*responses: httpx.Response | Exception) -> Handler:
    """A handler answering each request with the next item (an exception is raised)."""
    items = list(responses)

    def handler(request: httpx.Request) -> httpx.Response:
        item = items.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    return handler


SESSION = {
    "name": "sessions/123",
    "id": "123",
    "title": "t",
    "state": "QUEUED",
    "createTime": "2025-01-01T00:00:00.000001Z",
}


# --------------------------------------------------------------------------- errors

ERROR_CASES = [
    (400, "INVALID_ARGUMENT", InvalidArgumentError),
    (401, "UNAUTHENTICATED", UnauthenticatedError),
    (403, "PERMISSION_DENIED", PermissionDeniedError),
    (404, "NOT_FOUND", NotFoundError),
    (429, "RESOURCE_EXHAUSTED", RateLimitedError),
    (500, "INTERNAL", ServerError),
    (503, "UNAVAILABLE", ServerError),
    (409, "ALREADY_EXISTS", ApiStatusError),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("status", "symbol", "exc_type"), ERROR_CASES)
async def test_error_status_maps_to_exception_with_body_and_request(
    status: int, symbol: str, exc_type: type[ApiStatusError]
) -> None:
    details = [{"@type": "type.googleapis.com/google.rpc.BadRequest", "fieldViolations": []}]
    body = error_json(status, symbol, "it went wrong", details=details)
    async with rig(lambda r: httpx.Response(status, json=body), retry=RetryPolicy(1)) as r:
        with pytest.raises(exc_type) as caught:
            await r.client.get_session("123")
    exc = caught.value
    assert type(exc) is exc_type
    assert exc.status_code == status
    assert exc.error.code == status
    assert exc.error.status == symbol
    assert exc.error.message == "it went wrong"
    assert exc.error.details == details
    assert exc.request is not None
    assert exc.request.method == "GET"
    assert str(exc.request.url) == f"{BASE}/v1alpha/sessions/123"
    assert f"{status} {symbol}: it went wrong" in str(exc)
    # The key is in no message and not even in the request the error carries.
    assert KEY not in str(exc)
    assert KEY not in repr(exc)
    assert exc.request.headers["x-vendor-api-key"] == "[redacted]"
    assert exc.attempts == 1


@pytest.mark.anyio
async def test_error_body_that_is_not_json_still_gives_a_message() -> None:
    html = "<html><body>\n<h1>502 Bad Gateway</h1>\n</body></html>"
    async with rig(lambda r: httpx.Response(502, text=html), retry=RetryPolicy(1)) as r:
        with pytest.raises(ServerError) as caught:
            await r.client.list_sessions()
    assert caught.value.status_code == 502
    assert caught.value.error.code == 502
    assert "502 Bad Gateway" in caught.value.error.message
    assert "\n" not in caught.value.error.message


@pytest.mark.anyio
async def test_redirect_is_an_error_not_followed() -> None:
    redirect = httpx.Response(301, headers={"location": "https://elsewhere.test/"})
    async with rig(sequence(redirect)) as r:
        with pytest.raises(ApiStatusError) as caught:
            await r.client.list_sources()
    assert caught.value.status_code == 301
    assert len(r.requests) == 1


@pytest.mark.anyio
async def test_redirects_are_not_followed_even_if_the_injected_client_would() -> None:
    # Following one would send the key header to whatever host the redirect names.
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(302, headers={"location": "https://attacker.test/steal"})

    transport = httpx.MockTransport(handler)
    async with httpx.AsyncClient(transport=transport, follow_redirects=True) as http:
        client = SessionsClient(http, base_url=BASE, api_key=KEY, retry=RetryPolicy(1))
        with pytest.raises(ApiStatusError) as caught:
            await client.get_session("1")
    assert caught.value.status_code == 302
    assert [str(r.url.host) for r in seen] == ["api.test"]


# --------------------------------------------------------------------------- malformed answers


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"<html>hello</html>", "not JSON"),
        (b'["sessions"]', "not an object"),
        (b'{"id": "123"}', "not a Session: name"),
        (b'{"name": "sessions/1", "outputs": "nope"}', "not a Session: outputs"),
        (b"\xff\xfe\x00garbage", "not JSON"),
    ],
)
async def test_2xx_with_wrong_body_is_malformed_response(content: bytes, expected: str) -> None:
    async with rig(lambda r: httpx.Response(200, content=content)) as r:
        with pytest.raises(MalformedResponseError) as caught:
            await r.client.get_session("1")
    assert expected in str(caught.value)
    assert caught.value.request is not None
    assert KEY not in str(caught.value)
    # A wrong body is not a transient failure: not retried.
    assert len(r.requests) == 1


@pytest.mark.anyio
async def test_wrong_shape_in_a_list_page_is_malformed() -> None:
    body = {"sessions": [{"name": "sessions/1"}, {"title": "no name"}]}
    async with rig(lambda r: httpx.Response(200, json=body)) as r:
        with pytest.raises(MalformedResponseError, match=r"sessions\.1\.name"):
            await r.client.list_sessions()


@pytest.mark.anyio
@pytest.mark.parametrize("content", [b"", b"{}", b'{"unknown": 1}', b"  \n"])
async def test_empty_answers_accept_no_body_or_an_object(content: bytes) -> None:
    async with rig(lambda r: httpx.Response(200, content=content)) as r:
        await r.client.delete_session("1")
        await r.client.send_message("1", "hi")
        await r.client.approve_plan("1")
    assert [q.method for q in r.requests] == ["DELETE", "POST", "POST"]


@pytest.mark.anyio
async def test_empty_answer_that_is_html_is_malformed() -> None:
    async with rig(lambda r: httpx.Response(200, text="<html>login</html>")) as r:
        with pytest.raises(MalformedResponseError):
            await r.client.approve_plan("1")


# Bodies pydantic reads straight from the bytes, and odd ones it must read exactly as
# ``json.loads`` then ``model_validate`` did (or leave to that path): duplicate keys, both
# spellings of a field, lax numbers, NaN, huge numbers, escapes, a BOM. (A lone surrogate
# is refused either way: see test_text_that_is_not_unicode_is_a_malformed_answer.)
_ODD_ACTIVITY_PAGES = [
    b'{"activities": [{"name": "sessions/1/activities/a", "createTime": "t", "x": 1,'
    b' "name": "sessions/1/activities/b", "x": 2, "y": {"k": 1, "k": [1]}}]}',
    b'{"activities": [{"name": "sessions/1/activities/a", "create_time": "1",'
    b' "createTime": "2", "progressUpdated": {"title": "t", "title": "u"}}]}',
    b'{"activities": [{"name": "sessions/1/activities/a", "artifacts": [{"bashOutput":'
    b' {"exitCode": "3"}}, {"bashOutput": {"exitCode": 4.0}}, {"bashOutput": {"exitCode":'
    b" 1e2}}]}]}",
    b'{"activities": [{"name": "sessions/1/activities/a", "f": NaN, "g": -Infinity,'
    b' "h": 1e400, "i": 123456789012345678901234567890, "j": -0.0, "k": 1.5e-7}]}',
    rb'{"activities": [{"name": "sessions/1/activities/a\u00e9\ud83d\ude00",'
    rb' "description": "tab\t nul\u0000 \"q\" \\ \/ \u2028", "o": {}}]}',
    '{"activities": [{"name": "sessions/1/activities/\u00e9\u2603"}]}'.encode(),
    b'\xef\xbb\xbf{"activities": [{"name": "sessions/1/activities/a"}]}',
    b'{"activities": [{"name": "sessions/1/activities/a", "artifacts": [{"bashOutput":'
    b' {"exitCode": true}}]}], "nextPageToken": "n"}',
    b'  {"activities": [], "nextPageToken": "", "extra": [null, false]}  ',
]


def _parsed_the_general_way(content: bytes) -> Any:
    """``json.loads`` then ``model_validate``: what every answer went through before."""
    from sessionhook.api.models import ListActivitiesResponse

    return ListActivitiesResponse.model_validate(json.loads(content))


@pytest.mark.anyio
@pytest.mark.parametrize("content", _ODD_ACTIVITY_PAGES)
async def test_a_page_parses_as_json_loads_then_model_validate(content: bytes) -> None:
    """Whichever way a page is read, the activities (and what the archive keeps of them,
    ``to_wire()``) are those the general way gives, or the same refusal."""
    try:
        expected = _parsed_the_general_way(content)
    except Exception:
        expected = None
    async with rig(lambda r: httpx.Response(200, content=content)) as r:
        if expected is None:
            with pytest.raises(MalformedResponseError):
                await r.client.list_activities("1")
            return
        got = await r.client.list_activities("1")
    assert got.to_wire() == expected.to_wire()
    assert json.dumps(got.to_wire()) == json.dumps(expected.to_wire())  # key order too
    assert [a.event_member for a in got.activities] == [a.event_member for a in expected.activities]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("content", "path"),
    [
        (rb'{"name": "sessions/1", "title": "half an emoji \ud83d"}', "title"),
        (b'{"name": "sessions/1", "title": "raw surrogate \xed\xa0\x80"}', "title"),
        (
            rb'{"name": "sessions/1", "outputs": [{"pullRequest": {"url": "\udc00"}}]}',
            "outputs.0.pullRequest.url",
        ),
        (rb'{"name": "sessions/1", "odd\ud800": "x"}', "odd\ufffd"),
    ],
)
async def test_a_session_with_text_that_is_not_unicode_is_mended(content: bytes, path: str) -> None:
    """json.loads lets a lone surrogate through (from an escape, or raw bytes it decodes
    with surrogatepass); nothing downstream can encode it. A session is mended: U+FFFD in
    its place, and the session says where."""
    async with rig(lambda r: httpx.Response(200, content=content)) as r:
        got = await r.client.get_session("1")
    assert got.name == "sessions/1" and got.repaired == (path,)
    text = json.dumps(got.to_wire(), ensure_ascii=False)
    assert "\ufffd" in text and text.encode("utf-8")
    async with rig(lambda r: httpx.Response(200, json={"name": "sessions/1"})) as r:
        assert (await r.client.get_session("1")).repaired == ()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("content", "call"),
    [
        (rb'{"name": "sessions/1\ud800", "title": "t"}', "get_session"),
        (
            rb'{"name": "sessions/1/activities/a", "agentMessaged": {"agentMessage": "\ud83d"}}',
            "get_activity",
        ),
    ],
)
async def test_text_that_is_not_unicode_elsewhere_is_a_malformed_answer(
    content: bytes, call: str
) -> None:
    """A session's name is its identity (not mended); an activity's text is what the relay
    archives and forwards (not mended either): malformed answers."""
    async with rig(lambda r: httpx.Response(200, content=content)) as r:
        with pytest.raises(MalformedResponseError, match="not Unicode") as caught:
            if call == "get_session":
                await r.client.get_session("1")
            else:
                await r.client.get_activity("sessions/1/activities/a")
    assert caught.value.request is not None


SESSION_PAGE = (
    b'{"sessions": ['
    b'{"name": "sessions/1", "title": "fine"},'
    rb'{"name": "sessions/2", "title": "cut \ud83d"},'
    b'{"name": "sessions/3", "state": 5},'
    rb'{"name": "sessions/4\udc00"},'
    b'{"title": "no name"}'
    b"]}"
)


@pytest.mark.anyio
async def test_the_session_list_is_judged_item_by_item() -> None:
    """One session's broken title does not make the page malformed: it is mended; an item
    that is no session (a state of the wrong type, a name that is not Unicode, no name) is
    refused by itself, named when it has a readable name; the others go through."""
    told: list[bool] = []

    async def on_answer(_response: httpx.Response, malformed: bool) -> None:
        told.append(malformed)

    async with rig(lambda r: httpx.Response(200, content=SESSION_PAGE), on_answer=on_answer) as r:
        pages = [p async for p in r.client.walk_sessions()]
    assert len(pages) == 1
    got = pages[0]
    assert [s.name for s in got.sessions] == ["sessions/1", "sessions/2"]
    assert [s.repaired for s in got.sessions] == [(), ("title",)]
    assert got.sessions[1].title == "cut \ufffd"
    assert [(i.name, i.reason) for i in got.invalid] == [
        ("sessions/3", "malformed"),
        ("", "malformed"),
        ("", "malformed"),
    ]
    assert got.invalid[0].detail.startswith("not a session: state:")
    assert "not Unicode" in got.invalid[1].detail
    assert told == [True]  # an item was refused: the answer was not what the API promises


@pytest.mark.anyio
async def test_a_mended_session_list_is_a_sound_answer_and_iter_sessions_stays_strict() -> None:
    page = rb'{"sessions": [{"name": "sessions/1"}, {"name": "sessions/2", "title": "\ud800"}]}'
    told: list[bool] = []

    async def on_answer(_response: httpx.Response, malformed: bool) -> None:
        told.append(malformed)

    async with rig(lambda r: httpx.Response(200, content=page), on_answer=on_answer) as r:
        walked = [s async for p in r.client.walk_sessions() for s in p.sessions]
        listed = [s async for s in r.client.iter_sessions()]
        one = await r.client.list_sessions()
    for sessions in (walked, listed, one.sessions):
        assert [s.title for s in sessions] == ["", "\ufffd"]
        assert sessions[1].repaired == ("title",)
    assert told == [False, False, False]
    # iter_sessions and list_sessions have no place for an item that is no session.
    async with rig(lambda r: httpx.Response(200, content=SESSION_PAGE)) as r:
        with pytest.raises(MalformedResponseError, match="not a ListSessionsResponse"):
            await r.client.list_sessions()
        with pytest.raises(MalformedResponseError):
            _ = [s async for s in r.client.iter_sessions()]


@pytest.mark.anyio
async def test_a_sound_page_is_not_parsed_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sound answer is parsed and validated in one pass from its bytes: ``json.loads``
    (the general way) is kept for answers that pass would refuse."""
    import sessionhook.api.decoding as decoding_module

    calls: list[bytes] = []
    real_loads = json.loads

    def counting_loads(content: Any, **kwargs: Any) -> Any:
        calls.append(content)
        return real_loads(content, **kwargs)

    monkeypatch.setattr(decoding_module.json, "loads", counting_loads)
    page = {"activities": [{"name": "sessions/1/activities/a", "createTime": "t"}]}
    async with rig(lambda r: httpx.Response(200, json=page)) as r:
        got = await r.client.list_activities("1")
        assert calls == []
        with pytest.raises(MalformedResponseError, match="not JSON"):
            async with rig(lambda r: httpx.Response(200, content=b"{nope")) as bad:
                await bad.client.list_activities("1")
    assert got.activities[0].name == "sessions/1/activities/a"
    assert calls == [b"{nope"]


# --------------------------------------------------------------------------- retries


@pytest.mark.anyio
async def test_429_retry_after_is_honoured() -> None:
    limited = httpx.Response(
        429,
        headers={"retry-after": "7"},
        json=error_json(429, "RESOURCE_EXHAUSTED", "Resource has been exhausted"),
    )
    async with rig(sequence(limited, httpx.Response(200, json=SESSION))) as r:
        session = await r.client.get_session("123")
    assert session.name == "sessions/123"
    assert r.sleeps == [7.0]
    assert len(r.requests) == 2


@pytest.mark.anyio
async def test_429_without_retry_after_backs_off_exponentially() -> None:
    limited = [httpx.Response(429, json=error_json(429, "RESOURCE_EXHAUSTED", "x"))] * 3
    async with rig(sequence(*limited, httpx.Response(200, json={"sessions": []}))) as r:
        page = await r.client.list_sessions()
    assert page.sessions == []
    assert r.sleeps == [1.0, 2.0, 4.0]


@pytest.mark.anyio
async def test_retry_after_beyond_the_cap_is_raised_at_once_for_the_caller() -> None:
    limited = httpx.Response(429, headers={"retry-after": "3600"}, json=error_json(429, "X", "q"))
    async with rig(sequence(limited)) as r:
        with pytest.raises(RateLimitedError) as caught:
            await r.client.list_sessions()
    assert caught.value.retry_after == 3600.0
    assert r.sleeps == []


@pytest.mark.anyio
async def test_5xx_is_retried_then_succeeds() -> None:
    answers = sequence(
        httpx.Response(500, json=error_json(500, "INTERNAL", "boom")),
        httpx.Response(503, text="unavailable"),
        httpx.Response(200, json=SESSION),
    )
    async with rig(answers) as r:
        session = await r.client.get_session("sessions/123")
    assert session.state == "QUEUED"
    assert r.sleeps == [1.0, 2.0]
    assert len(r.requests) == 3


@pytest.mark.anyio
async def test_retries_stop_after_max_attempts() -> None:
    def always_500(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json=error_json(500, "INTERNAL", "boom"))

    policy = RetryPolicy(max_attempts=4, base_delay=0.5, jitter=0.0)
    async with rig(always_500, retry=policy) as r:
        with pytest.raises(ServerError) as caught:
            await r.client.list_activities("1")
    assert len(r.requests) == 4
    assert r.sleeps == [0.5, 1.0, 2.0]
    assert caught.value.attempts == 4


@pytest.mark.anyio
async def test_max_attempts_one_disables_retries() -> None:
    async with rig(sequence(httpx.Response(503)), retry=RetryPolicy(max_attempts=1)) as r:
        with pytest.raises(ServerError):
            await r.client.list_sources()
    assert len(r.requests) == 1
    assert r.sleeps == []


@pytest.mark.anyio
@pytest.mark.parametrize("status", [429, 500, 503])
async def test_post_is_not_retried_after_a_status(status: int) -> None:
    async with rig(sequence(httpx.Response(status, json=error_json(status, "X", "no")))) as r:
        with pytest.raises(ApiStatusError):
            await r.client.create_session("do it")
    assert len(r.requests) == 1
    assert r.sleeps == []


@pytest.mark.anyio
@pytest.mark.parametrize(
    "failure", [httpx.ReadTimeout("read timed out"), httpx.ReadError("connection reset")]
)
async def test_post_is_not_retried_when_the_request_may_have_left(failure: Exception) -> None:
    async with rig(sequence(failure)) as r:
        with pytest.raises(TransportError):
            await r.client.send_message("1", "hello")
    assert len(r.requests) == 1


@pytest.mark.anyio
@pytest.mark.parametrize(
    "failure",
    [
        httpx.ConnectError("connection refused"),
        httpx.ConnectTimeout("connect timed out"),
        httpx.PoolTimeout("no free connection"),
    ],
)
async def test_post_is_retried_when_the_request_never_left(failure: Exception) -> None:
    async with rig(sequence(failure, httpx.Response(200, json=SESSION))) as r:
        session = await r.client.create_session("do it")
    assert session.id == "123"
    assert len(r.requests) == 2
    assert r.sleeps == [1.0]


@pytest.mark.anyio
async def test_timeout_becomes_transport_error_after_retries() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    async with rig(slow, retry=RetryPolicy(max_attempts=3, jitter=0.0), timeout=2.5) as r:
        with pytest.raises(TransportError) as caught:
            await r.client.get_source("github/o/r")
    assert "ReadTimeout: no answer within 2.5 s" in str(caught.value)
    assert caught.value.attempts == 3
    assert r.sleeps == [1.0, 2.0]
    assert isinstance(caught.value.__cause__, httpx.ReadTimeout)
    assert KEY not in str(caught.value)


@pytest.mark.anyio
async def test_every_request_carries_the_timeout() -> None:
    async with rig(lambda r: httpx.Response(200, json=SESSION), timeout=4.0) as r:
        await r.client.get_session("123")
        await r.client.create_session("x")
    for request in r.requests:
        assert request.extensions["timeout"] == httpx.Timeout(4.0).as_dict()


@pytest.mark.anyio
async def test_get_transport_error_is_retried_then_succeeds() -> None:
    answers = sequence(httpx.RemoteProtocolError("eof"), httpx.Response(200, json=SESSION))
    async with rig(answers) as r:
        assert (await r.client.get_session("123")).title == "t"
    assert r.sleeps == [1.0]


@pytest.mark.anyio
async def test_delete_is_retried_and_a_404_after_an_ambiguous_failure_is_success() -> None:
    answers = sequence(
        httpx.ReadTimeout("timed out"),
        httpx.Response(404, json=error_json(404, "NOT_FOUND", "gone")),
    )
    async with rig(answers) as r:
        await r.client.delete_session("123")
    assert [q.method for q in r.requests] == ["DELETE", "DELETE"]


@pytest.mark.anyio
async def test_delete_404_after_a_5xx_is_success() -> None:
    answers = sequence(httpx.Response(502), httpx.Response(404))
    async with rig(answers) as r:
        await r.client.delete_session("123")
    assert len(r.requests) == 2


@pytest.mark.anyio
async def test_delete_404_is_not_found_when_no_attempt_could_have_deleted() -> None:
    # A connect error proves the first attempt never arrived, so the 404 is genuine.
    answers = sequence(httpx.ConnectError("refused"), httpx.Response(404))
    async with rig(answers) as r:
        with pytest.raises(NotFoundError):
            await r.client.delete_session("123")
    async with rig(sequence(httpx.Response(404))) as r:
        with pytest.raises(NotFoundError):
            await r.client.delete_session("123")


@pytest.mark.anyio
async def test_retries_are_logged_without_the_key(caplog: pytest.LogCaptureFixture) -> None:
    answers = sequence(httpx.Response(500), httpx.Response(200, json=SESSION))
    with caplog.at_level(logging.INFO, logger="sessionhook.api.exchange"):
        async with rig(answers) as r:
            await r.client.get_session("123")
    messages = [record.getMessage() for record in caplog.records]
    assert any(m.startswith("api.retry method=GET") and "reason=500" in m for m in messages)
    assert all(KEY not in m for m in messages)


# --------------------------------------------------------------------------- requests sent


@pytest.mark.anyio
async def test_default_header_and_user_agent() -> None:
    async with rig(lambda r: httpx.Response(200, json={"sessions": []})) as r:
        await r.client.list_sessions()
    sent = r.requests[0]
    assert sent.headers["x-vendor-api-key"] == KEY
    assert sent.headers["user-agent"].startswith("sessionhook/")
    assert sent.headers["accept"] == "application/json"


@pytest.mark.anyio
async def test_api_key_header_name_can_be_overridden() -> None:
    async with rig(lambda r: httpx.Response(200, json={}), api_key_header="X-Goog-Api-Key") as r:
        await r.client.list_sources()
    sent = r.requests[0]
    assert sent.headers["x-goog-api-key"] == KEY
    assert "x-vendor-api-key" not in sent.headers


@pytest.mark.anyio
@pytest.mark.parametrize(
    "base",
    ["http://api.test", "http://api.test/", "http://api.test/v1alpha", "http://api.test/v1alpha/"],
)
async def test_version_path_is_appended_once(base: str) -> None:
    async with rig(lambda r: httpx.Response(200, json={}), base_url=base) as r:
        await r.client.list_sessions()
    assert str(r.requests[0].url) == "http://api.test/v1alpha/sessions"
    assert r.client.base_url == "http://api.test/v1alpha"


def test_api_root_keeps_a_path_prefix_and_rejects_non_http() -> None:
    assert api_root("https://h.test/proxy/") == "https://h.test/proxy/v1alpha"
    for bad in ("127.0.0.1:8080", "ftp://h.test", "", "not a url"):
        with pytest.raises(ValueError, match="base_url"):
            api_root(bad)


@pytest.mark.anyio
async def test_constructor_validates_and_repr_hides_the_key() -> None:
    async with httpx.AsyncClient() as http:
        with pytest.raises(ValueError, match="api_key"):
            SessionsClient(http, base_url=BASE, api_key="")
        with pytest.raises(ValueError, match="timeout"):
            SessionsClient(http, base_url=BASE, api_key=KEY, timeout=0)
        client = SessionsClient(http, base_url=BASE, api_key=KEY)
    assert KEY not in repr(client)
    assert "api.test" in repr(client)


@pytest.mark.anyio
async def test_create_session_body_with_every_option() -> None:
    async with rig(lambda r: httpx.Response(200, json=SESSION)) as r:
        await r.client.create_session(
            "Fix the bug",
            title="Bug fix",
            source="github/acme/app",
            starting_branch="main",
            require_plan_approval=True,
            automation_mode="AUTO_CREATE_PR",
        )
    sent = r.requests[0]
    assert sent.method == "POST"
    assert str(sent.url) == f"{BASE}/v1alpha/sessions"
    assert sent.headers["content-type"] == "application/json"
    assert json.loads(sent.content) == {
        "prompt": "Fix the bug",
        "title": "Bug fix",
        "sourceContext": {
            "source": "sources/github/acme/app",
            "hostRepoContext": {"startingBranch": "main"},
        },
        "requirePlanApproval": True,
        "automationMode": "AUTO_CREATE_PR",
    }


@pytest.mark.anyio
async def test_create_session_minimal_body_has_only_the_prompt() -> None:
    async with rig(lambda r: httpx.Response(200, json=SESSION)) as r:
        await r.client.create_session("Say hi")
        await r.client.create_session("On a repo", source="sources/github/o/r")
        with pytest.raises(ValueError, match="starting_branch needs a source"):
            await r.client.create_session("x", starting_branch="main")
    assert json.loads(r.requests[0].content) == {"prompt": "Say hi"}
    assert json.loads(r.requests[1].content) == {
        "prompt": "On a repo",
        "sourceContext": {"source": "sources/github/o/r"},
    }
    assert len(r.requests) == 2


@pytest.mark.anyio
async def test_message_and_approve_paths_and_bodies() -> None:
    async with rig(lambda r: httpx.Response(200, json={})) as r:
        await r.client.send_message("sessions/42", "also add tests")
        await r.client.approve_plan("42")
    message, approve = r.requests
    assert message.url.raw_path == b"/v1alpha/sessions/42:sendMessage"
    assert json.loads(message.content) == {"prompt": "also add tests"}
    assert approve.url.raw_path == b"/v1alpha/sessions/42:approvePlan"
    assert json.loads(approve.content) == {}


@pytest.mark.anyio
async def test_resource_paths_accept_names_and_ids() -> None:
    activity = {"name": "sessions/42/activities/abc", "id": "abc"}
    source = {"name": "sources/github/o/r", "id": "github/o/r"}

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.raw_path.decode()
        if "/activities/" in path:
            return httpx.Response(200, json=activity)
        if path.startswith("/v1alpha/sources/"):
            return httpx.Response(200, json=source)
        return httpx.Response(200, json={"name": "sessions/42"})

    async with rig(handler) as r:
        await r.client.get_session("42")
        await r.client.get_session("sessions/42")
        await r.client.delete_session("42")
        await r.client.get_activity("sessions/42/activities/abc")
        await r.client.get_activity("42", "abc")
        await r.client.get_activity("sessions/42", "abc")
        got = await r.client.get_source("github/o/r")
        await r.client.get_source("sources/github/o/r")
    paths = [q.url.raw_path.decode() for q in r.requests]
    assert paths == [
        "/v1alpha/sessions/42",
        "/v1alpha/sessions/42",
        "/v1alpha/sessions/42",
        *["/v1alpha/sessions/42/activities/abc"] * 3,
        # The slashes of a source id stay slashes.
        *["/v1alpha/sources/github/o/r"] * 2,
    ]
    assert got.id == "github/o/r"


@pytest.mark.anyio
async def test_odd_characters_in_ids_are_escaped_per_segment() -> None:
    async with rig(lambda r: httpx.Response(200, json={"name": "sessions/x"})) as r:
        await r.client.get_session("a?b#c")
    assert r.requests[0].url.raw_path == b"/v1alpha/sessions/a%3Fb%23c"


def test_name_helpers_reject_what_the_spec_patterns_reject() -> None:
    assert session_name(" 7 ") == "sessions/7"
    assert activity_name("sessions/7/activities/a") == "sessions/7/activities/a"
    assert activity_name("7", "a") == "sessions/7/activities/a"
    assert source_name("github/o/r") == "sources/github/o/r"
    bad_calls: list[Callable[[], str]] = [
        lambda: session_name(""),
        lambda: session_name("sessions/"),
        lambda: session_name("sessions/1/activities/2"),
        lambda: activity_name("sessions/1"),
        lambda: activity_name("sessions/1/activities/"),
        lambda: activity_name("sessions/1", "a/b"),
        lambda: source_name("sources/"),
        lambda: source_name("github//r"),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()


@pytest.mark.anyio
async def test_invalid_names_fail_before_any_request() -> None:
    async with rig(lambda r: httpx.Response(200, json={})) as r:
        with pytest.raises(ValueError):
            await r.client.get_session("sessions/1/2")
        with pytest.raises(ValueError):
            await r.client.get_activity("sessions/1")
    assert r.requests == []


@pytest.mark.anyio
async def test_list_query_parameters() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={})

    flt = 'name="sources/github/o/a" OR name="sources/github/o/b"'
    async with rig(handler) as r:
        await r.client.list_sessions(page_size=10, page_token="tok 1")
        await r.client.list_activities(
            "sessions/5", page_size=100, create_time="2025-01-01T00:00:00.000000Z"
        )
        await r.client.list_sources(filter=flt)
        await r.client.list_sessions()
    sessions, acts, sources, bare = (q.url for q in r.requests)
    assert dict(sessions.params) == {"pageSize": "10", "pageToken": "tok 1"}
    assert acts.path == "/v1alpha/sessions/5/activities"
    assert dict(acts.params) == {"pageSize": "100", "createTime": "2025-01-01T00:00:00.000000Z"}
    assert sources.params["filter"] == flt
    # URL-encoded on the wire (spec 4.9): no raw quotes or spaces in the query.
    assert b'"' not in sources.query and b" " not in sources.query
    assert bare.query == b""


@pytest.mark.anyio
async def test_unknown_fields_are_kept() -> None:
    body = {**SESSION, "archived": True, "outputs": [{"pullRequest": {"url": "u", "baseRef": "m"}}]}
    async with rig(lambda r: httpx.Response(200, json=body)) as r:
        session = await r.client.get_session("123")
    assert session.to_wire() == body
    assert session.pull_requests[0].url == "u"


# --------------------------------------------------------------------------- pagination


def paged(items: list[dict[str, Any]], key: str, size: int) -> Handler:
    """Serve ``items`` in pages of ``size`` with integer-offset tokens; last page has none."""

    def handler(request: httpx.Request) -> httpx.Response:
        start = int(request.url.params.get("pageToken") or 0)
        page: dict[str, Any] = {key: items[start : start + size]}
        if start + size < len(items):
            page["nextPageToken"] = str(start + size)
        return httpx.Response(200, json=page)

    return handler


@pytest.mark.anyio
async def test_iter_sessions_walks_every_page() -> None:
    items = [{"name": f"sessions/{i}", "id": str(i)} for i in range(7)]
    async with rig(paged(items, "sessions", 3)) as r:
        names = [s.name async for s in r.client.iter_sessions(page_size=3)]
    assert names == [item["name"] for item in items]
    assert [q.url.params.get("pageToken") for q in r.requests] == [None, "3", "6"]
    assert all(q.url.params["pageSize"] == "3" for q in r.requests)


@pytest.mark.anyio
async def test_iter_activities_and_sources_walk_every_page() -> None:
    acts = [{"name": f"sessions/1/activities/{i:032x}"} for i in range(5)]
    srcs = [{"name": f"sources/github/o/r{i}"} for i in range(4)]
    async with rig(paged(acts, "activities", 2)) as r:
        got = [
            a.name async for a in r.client.iter_activities("1", create_time="2025-01-01T00:00:00Z")
        ]
    assert got == [a["name"] for a in acts]
    assert all(q.url.params["createTime"] == "2025-01-01T00:00:00Z" for q in r.requests)
    async with rig(paged(srcs, "sources", 3)) as r:
        got = [s.name async for s in r.client.iter_sources(filter="name=x")]
    assert got == [s["name"] for s in srcs]
    assert len(r.requests) == 2


@pytest.mark.anyio
async def test_iterator_skips_empty_pages_and_repeated_items() -> None:
    pages = sequence(
        httpx.Response(200, json={"sessions": [{"name": "sessions/1"}], "nextPageToken": "a"}),
        httpx.Response(200, json={"sessions": [], "nextPageToken": "b"}),
        # The list shifted: sessions/1 shows up again on the next page.
        httpx.Response(200, json={"sessions": [{"name": "sessions/1"}, {"name": "sessions/2"}]}),
    )
    async with rig(pages) as r:
        names = [s.name async for s in r.client.iter_sessions()]
    assert names == ["sessions/1", "sessions/2"]


@pytest.mark.anyio
async def test_iterator_refuses_a_token_loop() -> None:
    def loop(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"sessions": [], "nextPageToken": "same"})

    async with rig(loop) as r:
        with pytest.raises(MalformedResponseError, match="twice"):
            [s async for s in r.client.iter_sessions()]
    assert len(r.requests) == 2


@pytest.mark.anyio
async def test_iterator_retries_a_failed_page_and_goes_on() -> None:
    pages = sequence(
        httpx.Response(200, json={"sources": [{"name": "sources/a"}], "nextPageToken": "t"}),
        httpx.Response(503),
        httpx.Response(200, json={"sources": [{"name": "sources/b"}]}),
    )
    async with rig(pages) as r:
        names = [s.name async for s in r.client.iter_sources()]
    assert names == ["sources/a", "sources/b"]
    assert r.requests[2].url.params["pageToken"] == "t"


# --------------------------------------------------------------------------- RetryPolicy.delay


def test_delay_doubles_from_base_and_caps_without_jitter() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=30.0, jitter=0.0)
    rng = random.Random(0)
    assert [policy.delay(n, None, rng) for n in range(1, 9)] == [1, 2, 4, 8, 16, 30, 30, 30]


def test_delay_does_not_overflow_on_huge_attempt_numbers() -> None:
    assert RetryPolicy(jitter=0.0).delay(10_000, None, random.Random(0)) == 30.0


def test_delay_is_reproducible_with_a_seeded_rng() -> None:
    policy = RetryPolicy()
    first = [policy.delay(n, None, random.Random(42)) for n in range(1, 6)]
    again = [policy.delay(n, None, random.Random(42)) for n in range(1, 6)]
    assert first == again


@given(
    attempt=st.integers(min_value=1, max_value=200),
    seed=st.integers(min_value=0, max_value=2**32),
    jitter=st.floats(min_value=0.0, max_value=0.9),
)
def test_delay_stays_within_the_jitter_band(attempt: int, seed: int, jitter: float) -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=30.0, jitter=jitter)
    nominal = min(30.0, 2.0 ** (attempt - 1)) if attempt < 64 else 30.0
    wait = policy.delay(attempt, None, random.Random(seed))
    assert nominal * (1 - jitter) - 1e-9 <= wait <= nominal * (1 + jitter) + 1e-9


@given(
    attempt=st.integers(min_value=1, max_value=20),
    retry_after=st.floats(min_value=0.0, max_value=1000.0),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_retry_after_is_a_floor_capped_at_max_retry_after(
    attempt: int, retry_after: float, seed: int
) -> None:
    policy = RetryPolicy(max_retry_after=120.0)
    wait = policy.delay(attempt, retry_after, random.Random(seed))
    assert wait >= min(retry_after, 120.0)
    assert wait <= max(min(retry_after, 120.0), 30.0 * 1.2)
    assert policy.gives_up_on(retry_after) == (retry_after > 120.0)


def test_retry_after_below_the_backoff_does_not_shorten_it() -> None:
    policy = RetryPolicy(jitter=0.0)
    assert policy.delay(4, 0.5, random.Random(0)) == 8.0
    assert policy.delay(1, 12.0, random.Random(0)) == 12.0
    assert policy.gives_up_on(None) is False


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"base_delay": -1.0},
        {"max_delay": float("inf")},
        {"jitter": 1.0},
        {"jitter": -0.1},
        {"max_retry_after": float("nan")},
    ],
)
def test_retry_policy_rejects_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)


def test_delay_rejects_attempt_zero() -> None:
    with pytest.raises(ValueError):
        RetryPolicy().delay(0, None, random.Random(0))


# --------------------------------------------------------------------------- Retry-After header


def test_parse_retry_after_forms() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after("5") == 5.0
    assert parse_retry_after(" 2.5 ") == 2.5
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("Wed, 01 Jan 2025 12:00:30 GMT", now=lambda: now) == 30.0
    assert parse_retry_after("Wed, 01 Jan 2025 11:00:00 GMT", now=lambda: now) == 0.0
    for junk in (None, "", "soon", "nan", "inf"):
        assert parse_retry_after(junk) is None


@pytest.mark.anyio
async def test_rate_limited_error_carries_retry_after_date() -> None:
    limited = httpx.Response(429, headers={"retry-after": "Thu, 01 Jan 2099 00:00:00 GMT"})
    async with rig(sequence(limited), retry=RetryPolicy(max_attempts=1)) as r:
        with pytest.raises(RateLimitedError) as caught:
            await r.client.list_sessions()
    assert caught.value.retry_after is not None
    assert caught.value.retry_after > 10**9
