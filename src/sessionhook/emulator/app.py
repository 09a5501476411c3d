"""The emulator's HTTP surface: every ``/v1alpha`` route, auth, paging, filters and faults.

A request goes through: the optional latency, routing (unknown path 404, wrong method 405
with an ``Allow`` header), the API key (401), the faults (``x-emulator-fault`` header, then
the random ones), the handler. Every error body is ``{"error": {"code", "message", "status",
"details"?}}``. What it chooses where the spec is silent: docs/emulator.md.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import anyio
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_snake
from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..api.models import (
    CreateSessionRequest,
    ErrorBody,
    ErrorDetail,
    HostRepo,
    ListActivitiesResponse,
    ListSessionsResponse,
    ListSourcesResponse,
    SendMessageRequest,
    Source,
    WireModel,
    parse_timestamp,
)
from .agent import Account, to_us
from .world import EmulatorError, TimeBound, World

#: The header carrying the API key (any capitalisation).
API_KEY_HEADER = "x-vendor-api-key"
#: The header the official SDK (``@google/jules-sdk``) sends the key in; taken too.
SDK_KEY_HEADER = "x-goog-api-key"
#: Test header forcing a fault: ``429`` or ``500``.
FAULT_HEADER = "x-emulator-fault"

_M = TypeVar("_M", bound=BaseModel)
_P = TypeVar("_P", int, str)
Handler = Callable[[Request, Account], Awaitable[Response]]

_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
_TIME_FILTER = re.compile(r'\s*(?:create_time|createTime)\s*(>=|>)\s*(?:"([^"]*)"|(\S+))\s*')
_NAME_TERM = re.compile(r"""name\s*=\s*(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)')""")
_OR = re.compile(r"\s+OR\s+")
_ARCHIVED_FILTER = re.compile(r"\s*archived\s*=\s*(true|false)\s*")


class _SessionIdConvertor(Convertor[str]):
    # A session id never holds ':', so ``<id>:sendMessage`` is not read as an id.
    regex = "[^/:]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("session_id", _SessionIdConvertor())


# --------------------------------------------------------------------------- helpers


def _wire(model: WireModel) -> JSONResponse:
    """A 200 JSON response: camelCase, zero values and empty lists omitted (an empty page
    is ``{}``, as the real service answers)."""
    return JSONResponse(model.model_dump(mode="json", by_alias=True, exclude_defaults=True))


def _error(err: EmulatorError) -> JSONResponse:
    detail = ErrorDetail(code=err.code, message=err.message, status=err.status, details=err.details)
    body = ErrorBody(error=detail).model_dump(mode="json", by_alias=True, exclude_defaults=True)
    return JSONResponse(body, status_code=err.code, headers=err.headers)


def _query(request: Request, *names: str) -> str | None:
    """The first of ``names`` present in the query (camelCase and snake_case both work)."""
    for name in names:
        value = request.query_params.get(name)
        if value is not None:
            return value
    return None


def _page_size(request: Request, default: int) -> int:
    raw = (_query(request, "pageSize", "page_size") or "").strip()
    if not raw:
        return default
    if re.fullmatch(r"[+-]?\d+", raw) is None or not 1 <= int(raw) <= 100:
        raise EmulatorError.invalid_argument(
            f"Invalid page_size {raw!r}: must be an integer from 1 to 100.",
            ("page_size", "must be an integer from 1 to 100"),
        )
    return int(raw)


def _time_us(text: str, field: str) -> int:
    # An unencoded '+' in a query string arrives as a space: put it back before an offset.
    value = re.sub(r" (\d{2}:\d{2})$", r"+\1", text.strip())
    try:
        if _RFC3339.fullmatch(value) is None:
            raise ValueError(value)
        moment = parse_timestamp(value)
    except ValueError:
        raise EmulatorError.invalid_argument(
            f"Invalid timestamp {text!r}: expected RFC 3339, e.g. 2025-01-01T00:00:00.000000Z.",
            (field, "must be an RFC 3339 timestamp"),
        ) from None
    return to_us(moment)


def _name_filter(text: str) -> frozenset[str]:
    """``name="a" OR name="b"`` -> the names; anything else is 400 on ``filter``."""
    text, names, pos = text.strip(), set(), 0
    while True:
        term = _NAME_TERM.match(text, pos)
        if term is None:
            break
        value = term[1] if term[1] is not None else term[2]
        names.add(re.sub(r"\\(.)", r"\1", value))
        if term.end() == len(text):
            return frozenset(names)
        separator = _OR.match(text, term.end())
        if separator is None:
            break
        pos = separator.end()
    raise EmulatorError.invalid_argument(
        f'Invalid filter {text!r}: expected name="sources/..." terms joined by OR.',
        ("filter", 'only name="..." terms joined by OR are supported'),
    )


def _archived_filter(text: str) -> bool:
    """``archived = true`` / ``archived = false`` (AIP-160 equality) -> the flag; anything
    else is 400 naming the expression."""
    match = _ARCHIVED_FILTER.fullmatch(text)
    if match is None:
        raise EmulatorError.invalid_argument(
            f"Invalid filter {text!r}: only archived = true or archived = false is supported.",
            ("filter", "only archived = true or archived = false is supported"),
        )
    return match[1] == "true"


def _listed(source: Source) -> Source:
    """A list item of a source: name, id, owner and repo (privacy and branches on get)."""
    host = source.host_repo
    listed = HostRepo(owner=host.owner, repo=host.repo) if host else None
    return Source(name=source.name, id=source.id, host_repo=listed)


async def _json_object(request: Request) -> dict[str, Any]:
    """The request body as a JSON object; an empty body is ``{}``."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise EmulatorError.invalid_argument("Invalid JSON payload received.") from None
    if not isinstance(body, dict):
        raise EmulatorError.invalid_argument("Invalid JSON payload received: expected an object.")
    return body


def _validate(model: type[_M], body: dict[str, Any]) -> _M:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        violations = [
            (".".join(to_snake(str(part)) for part in error["loc"]), error["msg"])
            for error in exc.errors()
        ]
        raise EmulatorError.invalid_argument(
            f"Invalid request: {violations[0][0]}: {violations[0][1]}.", *violations
        ) from None


class _Pager:
    """Opaque, tamper-proof page tokens bound to the query that produced them: urlsafe
    base64 of ``[position, mac]``, the HMAC covering the position and the query (endpoint,
    account, parent, filters)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _mac(self, query: str, position: int | str) -> str:
        message = f"{query}\x00{json.dumps(position)}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()[:24]

    def token(self, query: str, position: int | str | None) -> str:
        """The next page token, or ``""`` (omitted from the reply) on the last page."""
        if position is None:
            return ""
        payload = json.dumps([position, self._mac(query, position)], separators=(",", ":"))
        return base64.urlsafe_b64encode(payload.encode()).decode("ascii").rstrip("=")

    def position(self, query: str, token: str | None, kind: type[_P]) -> _P | None:
        """Where the page of ``token`` starts; ``None`` for the first page."""
        if not token:
            return None
        try:
            position, mac = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
            valid = type(position) is kind and hmac.compare_digest(
                str(mac), self._mac(query, position)
            )
        except (ValueError, TypeError):
            valid = False
        if not valid:
            raise EmulatorError.invalid_argument(
                "Invalid page_token: it does not belong to this query.",
                ("page_token", "not a token returned for this query"),
            )
        result: _P = position
        return result


class _Faults:
    """Deterministic (header) and random (seeded) faults, checked after authentication."""

    def __init__(self, rate_limit: float, error: float, seed: int | None) -> None:
        for name, value in (("fault_rate_limit", rate_limit), ("fault_error", error)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability between 0 and 1")
        self._rate_limit = rate_limit
        self._error = error
        self._rng = random.Random(None if seed is None else f"faults:{seed}")

    def check(self, request: Request) -> None:
        """Raise the fault this request gets, if any."""
        forced = request.headers.get(FAULT_HEADER)
        if forced is not None:
            if forced.strip() == "429":
                raise _rate_limited()
            if forced.strip() == "500":
                raise _internal()
            raise EmulatorError.invalid_argument(
                f"{FAULT_HEADER} must be 429 or 500, got {forced!r}.", (FAULT_HEADER, "429 or 500")
            )
        if self._rate_limit and self._rng.random() < self._rate_limit:
            raise _rate_limited()
        if self._error and self._rng.random() < self._error:
            raise _internal()


def _rate_limited() -> EmulatorError:
    return EmulatorError(
        429,
        "RESOURCE_EXHAUSTED",
        "Resource has been exhausted (e.g. check quota).",
        headers={"Retry-After": "1"},
    )


def _internal() -> EmulatorError:
    return EmulatorError(500, "INTERNAL", "Internal error encountered.")


def _unauthenticated(message: str) -> EmulatorError:
    info = {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "API_KEY_INVALID",
        "domain": "sessionhook.emulator",
    }
    return EmulatorError(401, "UNAUTHENTICATED", message, details=[info])


# --------------------------------------------------------------------------- routes


class _Api:
    """The route handlers; each gets the authenticated account."""

    def __init__(self, world: World, faults: _Faults, latency_ms: int) -> None:
        self._world = world
        self._faults = faults
        self._latency = latency_ms / 1000
        self._pager = _Pager(world.page_secret)

    def guard(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """Wrap a handler with latency, authentication, faults and error bodies."""

        async def endpoint(request: Request) -> Response:
            if self._latency > 0:
                await anyio.sleep(self._latency)
            try:
                key = (
                    request.headers.get(API_KEY_HEADER) or request.headers.get(SDK_KEY_HEADER, "")
                ).strip()
                if not key:
                    raise _unauthenticated(
                        f"API key not valid: the request has no {API_KEY_HEADER} header. "
                        "Please pass a valid API key."
                    )
                account = self._world.account_for_key(key)
                if account is None:
                    raise _unauthenticated("API key not valid. Please pass a valid API key.")
                self._faults.check(request)
                return await handler(request, account)
            except EmulatorError as err:
                return _error(err)

        return endpoint

    async def sessions(self, request: Request, account: Account) -> Response:
        """POST: create a session (4.1); GET: list sessions (4.2)."""
        if request.method == "POST":
            body = _validate(CreateSessionRequest, await _json_object(request))
            session = self._world.create_session(
                account,
                prompt=body.prompt,
                title=body.title or "",
                source_context=body.source_context,
                require_plan_approval=bool(body.require_plan_approval),
                automation_mode=body.automation_mode or "",
            )
            return _wire(session.to_session())
        size = _page_size(request, 30)
        expression = request.query_params.get("filter", "")
        archived = _archived_filter(expression) if expression.strip() else False
        query = f"sessions|{account.id}|{archived}"
        after = self._pager.position(query, _query(request, "pageToken", "page_token"), int)
        page = self._world.list_sessions(account, after=after, limit=size, archived=archived)
        reply = ListSessionsResponse(
            sessions=[s.to_session(full=False) for s in page.items],
            next_page_token=self._pager.token(query, page.next_position),
        )
        return _wire(reply)

    async def session(self, request: Request, account: Account) -> Response:
        """GET: the full session (4.3); DELETE: delete it (4.4)."""
        session_id = request.path_params["session_id"]
        if request.method == "DELETE":
            self._world.delete_session(account, session_id)
            return JSONResponse({})
        return _wire(self._world.get_session(account, session_id).to_session())

    async def archive(self, request: Request, account: Account) -> Response:
        """POST ``:archive`` (beyond the spec, as the official SDK calls it): the session."""
        return await self._set_archived(request, account, True)

    async def unarchive(self, request: Request, account: Account) -> Response:
        """POST ``:unarchive``: the session, back in the default list."""
        return await self._set_archived(request, account, False)

    async def _set_archived(self, request: Request, account: Account, archived: bool) -> Response:
        await _json_object(request)  # an empty body; only checked as JSON
        session_id = request.path_params["session_id"]
        return _wire(self._world.set_archived(account, session_id, archived).to_session())

    async def send_message(self, request: Request, account: Account) -> Response:
        """POST ``:sendMessage`` (4.5)."""
        body = _validate(SendMessageRequest, await _json_object(request))
        self._world.send_message(account, request.path_params["session_id"], body.prompt)
        return JSONResponse({})

    async def approve_plan(self, request: Request, account: Account) -> Response:
        """POST ``:approvePlan`` (4.6); the body is an empty object (and only checked as JSON)."""
        await _json_object(request)
        self._world.approve_plan(account, request.path_params["session_id"])
        return JSONResponse({})

    async def activities(self, request: Request, account: Account) -> Response:
        """GET the session's activities (4.7)."""
        session_id = request.path_params["session_id"]
        size = _page_size(request, 50)
        raw_time = _query(request, "createTime", "create_time") or ""
        expression = request.query_params.get("filter", "")
        since = self._since(raw_time, expression)
        query = f"activities|{account.id}|{session_id}|{raw_time}|{expression}"
        after = self._pager.position(query, _query(request, "pageToken", "page_token"), int)
        page = self._world.list_activities(
            account, session_id, after=after, limit=size, since=since
        )
        reply = ListActivitiesResponse(
            activities=page.items, next_page_token=self._pager.token(query, page.next_position)
        )
        return _wire(reply)

    def _since(self, raw_time: str, expression: str) -> TimeBound | None:
        mode = self._world.create_time_filter
        bounds = []
        if raw_time.strip():
            time_us = _time_us(raw_time, "create_time")
            bounds.append(TimeBound(time_us, inclusive=mode == "inclusive"))
        if expression.strip():
            match = _TIME_FILTER.fullmatch(expression)
            if match is None:
                raise EmulatorError.invalid_argument(
                    f'Invalid filter {expression!r}: expected create_time>"<RFC 3339>".',
                    ("filter", 'only create_time>"..." or create_time>="..." is supported'),
                )
            text = match[2] if match[2] is not None else match[3]
            bounds.append(TimeBound(_time_us(text, "filter"), inclusive=match[1] == ">="))
        if mode == "ignore" or not bounds:
            return None
        return max(bounds, key=lambda b: (b.time_us, not b.inclusive))

    async def activity(self, request: Request, account: Account) -> Response:
        """GET one activity (4.8)."""
        params = request.path_params
        return _wire(self._world.get_activity(account, params["session_id"], params["activity_id"]))

    async def sources(self, request: Request, account: Account) -> Response:
        """GET the connected sources (4.9); list items leave out privacy and branches."""
        size = _page_size(request, 30)
        expression = request.query_params.get("filter", "")
        names = _name_filter(expression) if expression.strip() else None
        query = f"sources|{account.id}|{expression}"
        after = self._pager.position(query, _query(request, "pageToken", "page_token"), str)
        page = self._world.list_sources(account, after=after, limit=size, names=names)
        items = [_listed(source) for source in page.items]
        reply = ListSourcesResponse(
            sources=items, next_page_token=self._pager.token(query, page.next_position)
        )
        return _wire(reply)

    async def source(self, request: Request, account: Account) -> Response:
        """GET one source with its branches (4.10)."""
        return _wire(self._world.get_source(account, request.path_params["source_id"]))


async def _http_error(request: Request, exc: Exception) -> Response:
    """Routing errors (unknown path, wrong method) as error bodies."""
    code = exc.status_code if isinstance(exc, HTTPException) else 500
    headers = dict(exc.headers or {}) if isinstance(exc, HTTPException) else {}
    where = f"{request.method} {request.url.path}"
    if code == 405:
        err = EmulatorError(
            405, "METHOD_NOT_ALLOWED", f"Method not allowed: {where}.", headers=headers
        )
    elif code == 404:
        err = EmulatorError.not_found(f"No route for {where}.")
    else:
        err = EmulatorError(code, "UNKNOWN", f"HTTP {code}: {where}.", headers=headers)
    return _error(err)


async def _crash(request: Request, exc: Exception) -> Response:
    """A bug in the emulator: 500 INTERNAL (Starlette still logs the traceback)."""
    return _error(_internal())


def create_app(
    *,
    api_keys: Sequence[str | Sequence[str]] = ("test-key",),
    step_delay: float = 0.5,
    seed: int | None = None,
    fault_rate_limit: float = 0.0,
    fault_error: float = 0.0,
    latency_ms: int = 0,
    create_time_filter: str = "exclusive",
    clock: Callable[[], float] | None = None,
    consistency_delay: float = 0.0,
) -> Starlette:
    """The emulator as an ASGI app; ``app.state.world`` is its :class:`World`.

    Each ``api_keys`` item is one account: a string is its only key, a sequence holds up
    to three keys of the same account. The agent advances lazily from ``clock`` (default
    :func:`time.time`), one step per ``step_delay`` seconds. ``seed`` fixes every id.
    ``fault_rate_limit`` and ``fault_error`` are probabilities of a 429 or 500 answer;
    ``latency_ms`` delays every answer. ``create_time_filter`` is ``exclusive``,
    ``inclusive`` or ``ignore``: how list-activities reads its ``createTime`` parameter.
    ``consistency_delay`` (seconds): a new session and its activities answer 404 that long.
    """
    if latency_ms < 0:
        raise ValueError("latency_ms must not be negative")
    accounts = [(keys,) if isinstance(keys, str) else tuple(keys) for keys in api_keys]
    world = World(
        accounts,
        step_delay=step_delay,
        seed=seed,
        clock=clock,
        create_time_filter=create_time_filter,
        consistency_delay=consistency_delay,
    )
    api = _Api(world, _Faults(fault_rate_limit, fault_error, seed), latency_ms)
    session_path = "/v1alpha/sessions/{session_id:session_id}"
    routes = [
        Route("/v1alpha/sessions", api.guard(api.sessions), methods=["GET", "POST"]),
        Route(session_path, api.guard(api.session), methods=["GET", "DELETE"]),
        Route(session_path + ":sendMessage", api.guard(api.send_message), methods=["POST"]),
        Route(session_path + ":approvePlan", api.guard(api.approve_plan), methods=["POST"]),
        Route(session_path + ":archive", api.guard(api.archive), methods=["POST"]),
        Route(session_path + ":unarchive", api.guard(api.unarchive), methods=["POST"]),
        Route(session_path + "/activities", api.guard(api.activities), methods=["GET"]),
        Route(
            session_path + "/activities/{activity_id}",
            api.guard(api.activity),
            methods=["GET"],
        ),
        Route("/v1alpha/sources", api.guard(api.sources), methods=["GET"]),
        Route("/v1alpha/sources/{source_id:path}", api.guard(api.source), methods=["GET"]),
    ]
    app = Starlette(
        routes=routes, exception_handlers={HTTPException: _http_error, Exception: _crash}
    )
    # A trailing slash is a different, unknown path (404), not a redirect.
    app.router.redirect_slashes = False
    app.state.world = world
    return app
