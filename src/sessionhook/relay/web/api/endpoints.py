"""``/v1/endpoints``: list, get, create, update (PATCH, or PUT the whole definition),
delete, enable, disable, test, rotate the secret (:mod:`sessionhook.relay.ops.endpoint_edits`,
the same operations as ``sessionhook endpoints ...``).

An endpoint created here lives in the store; its secret is in the create answer (and a
rotation's) once, never in a read. One of the config file is read-only here (409). Verbs
on one endpoint are ``POST /v1/endpoints/{name}:verb``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ... import ops as operator
from ...config import parse_duration
from ...config.endpoint_spec import SPEC_KEYS
from ...ops import endpoint_edits as edits
from ..context import WebContext
from ..headers import SECRET_HEADERS
from .common import (
    ApiProblem,
    EmptyBody,
    bad_request,
    page_answer,
    page_request,
    read_json,
    require_store,
)

__all__ = ["endpoint_routes"]

T = TypeVar("T")


class _Create(BaseModel):
    """A new endpoint: its name, description, optional secret; any other key is one of
    ``[[endpoints]]`` (checked as the config file's are)."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str
    description: str = ""
    secret: str | None = None


class _Update(BaseModel):
    """Changes (PATCH): keys of ``[[endpoints]]`` (``null``: back to the default), a
    description; or (PUT) the whole definition."""

    model_config = ConfigDict(extra="allow", strict=True)
    description: str | None = None


class _Rotate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    #: Seconds (or ``"24h"``) the replaced secret keeps signing beside the new one.
    overlap: float | str = edits.DEFAULT_OVERLAP
    secret: str | None = None


class _Disable(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    reason: str = Field(default="disabled through the API", min_length=1, max_length=200)


def _problem(exc: operator.OperatorError) -> ApiProblem:
    """An operator's refusal as the API's answer (one line)."""
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, edits.EndpointConflictError):
        return ApiProblem(409, message)
    if isinstance(exc, operator.UnknownEndpointError):
        return ApiProblem(404, message)
    return bad_request(message)


async def _off_loop(fn: Callable[[], T]) -> T:
    """``fn()`` in a worker thread (a definition renders its template against samples);
    an operator's refusal as the API's."""
    try:
        return await anyio.to_thread.run_sync(fn)
    except operator.OperatorError as exc:
        raise _problem(exc) from None


def endpoint_routes(ctx: WebContext) -> Sequence[BaseRoute]:
    """The routes of ``/v1/endpoints`` (see the module docstring)."""

    async def in_store(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        store = require_store(ctx)
        try:
            return await store.run(fn, *args, **kwargs)
        except operator.OperatorError as exc:
            raise _problem(exc) from None

    async def answer_for(name: str, status: int = 200, **extra: Any) -> Response:
        (found,) = await in_store(edits.endpoint_answers, ctx.config(), ctx.clock(), name)
        return JSONResponse(found | extra, status)

    async def secret_answer(name: str, secret: str, status: int = 200) -> Response:
        """The answer that shows ``secret``, the one time: kept by no cache."""
        response = await answer_for(name, status, secret=secret)
        response.headers.update(SECRET_HEADERS)
        return response

    async def listing(request: Request) -> Response:
        page = page_request(request)
        every = await in_store(edits.endpoint_answers, ctx.config(), ctx.clock())
        after = page.after or ""
        rest = [e for e in every if e["name"] > after]
        items = rest[: page.size]
        more = items[-1]["name"] if len(rest) > page.size else None
        return JSONResponse(page_answer("endpoints", items, more))

    async def create(request: Request) -> Response:
        body = await read_json(request, _Create)
        config = ctx.config()
        definition, secret = await _off_loop(
            lambda: edits.define_endpoint(
                config,
                body.name,
                body.model_extra or {},
                description=body.description,
                secret=body.secret,
            )
        )
        await in_store(edits.create_endpoint, config, definition, secret)
        ctx.wake()
        # The one time the secret is shown.
        return await secret_answer(body.name, secret, 201)

    async def one(request: Request) -> Response:
        name = _name(request)
        if request.method == "GET":
            return await answer_for(name)
        if request.method == "DELETE":
            closed = await in_store(edits.delete_endpoint, ctx.config(), name)
            ctx.wake()
            return JSONResponse(
                {
                    "name": name,
                    "deleted": True,
                    "deliveries_closed": closed,
                    "deliveries_closed_reason": edits.DELETED_REASON,
                }
            )
        body = await read_json(request, _Update)
        changes = dict(body.model_extra or {})
        if request.method == "PUT":  # the whole definition: what is not given is default
            changes = {key: None for key in SPEC_KEYS} | changes
        if "secret" in changes:
            raise bad_request(f"secret: rotate it with POST /v1/endpoints/{name}:rotateSecret")
        if "name" in changes:
            raise bad_request("name: an endpoint cannot be renamed (create another one)")
        config = ctx.config()
        current = await in_store(edits.stored_or_refused, config, name)
        definition = await _off_loop(
            lambda: edits.redefine_endpoint(config, current, changes, description=body.description)
        )
        await in_store(edits.update_endpoint, definition)
        ctx.wake()
        return await answer_for(name)

    async def enable(request: Request) -> Response:
        name = _name(request)
        await read_json(request, EmptyBody)
        await in_store(operator.enable_endpoint, name)
        ctx.wake()
        return await answer_for(name)

    async def disable(request: Request) -> Response:
        name = _name(request)
        told = await read_json(request, _Disable)
        await in_store(operator.disable_endpoint, name, told.reason)
        return await answer_for(name)

    async def rotate(request: Request) -> Response:
        name = _name(request)
        body = await read_json(request, _Rotate)
        done = await in_store(
            edits.rotate_secret,
            ctx.config(),
            name,
            now=ctx.clock(),
            overlap=_seconds(body.overlap),
            secret=body.secret,
        )
        ctx.wake()
        return await secret_answer(name, done.secret)

    async def test(request: Request) -> Response:
        name = _name(request)
        await read_json(request, EmptyBody)
        await in_store(operator.find_endpoint, name)  # an unknown name: 404 before 503
        return await _test(ctx, name)

    one_path = "/v1/endpoints/{name}"
    return [
        Route("/v1/endpoints", listing, methods=["GET"]),
        Route("/v1/endpoints", create, methods=["POST"]),
        Route(one_path, one, methods=["GET", "PUT", "PATCH", "DELETE"]),
        Route(one_path + ":enable", enable, methods=["POST"]),
        Route(one_path + ":disable", disable, methods=["POST"]),
        Route(one_path + ":test", test, methods=["POST"]),
        Route(one_path + ":rotateSecret", rotate, methods=["POST"]),
    ]


def _name(request: Request) -> str:
    """The endpoint's name in the path."""
    return str(request.path_params["name"])


def _seconds(value: float | str) -> float:
    """An overlap: seconds, or a duration such as ``"24h"``."""
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise bad_request(f"overlap: {exc}") from None
    return float(value)


async def _test(ctx: WebContext, name: str) -> Response:
    """Send ``name`` a signed ``ping`` now and show the answer."""
    if ctx.send_test is None:
        raise ApiProblem(503, "this relay cannot send test events")
    try:
        result = await ctx.send_test(name)
    except operator.OperatorError as exc:
        raise _problem(exc) from None
    return JSONResponse(
        {
            "name": name,
            "ok": result.ok,
            "status_code": result.status_code,
            "error": result.error,
            "duration_ms": round(result.duration_ms, 1),
            "response_body": result.response_body,
        }
    )
