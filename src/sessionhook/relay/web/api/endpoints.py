"""``/v1/endpoints``: list, get, create, update (PATCH, or PUT the whole definition),
delete, enable, disable, test, trigger a sample, rotate the secret
(:mod:`sessionhook.relay.ops.endpoint_edits`, the same operations as ``sessionhook
endpoints ...`` and ``sessionhook trigger``).

An endpoint created here lives in the store; its secret is in the create answer (and a
rotation's) once, never in a read. One of the config file is read-only here (409). Verbs
on one endpoint are ``POST /v1/endpoints/{name}:verb``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from ... import ops as operator
from ...config import parse_duration
from ...config.endpoint_spec import SPEC_KEYS
from ...domain.api_models import (
    ApiDisableBody,
    ApiEmptyBody,
    ApiEndpoint,
    ApiEndpointChange,
    ApiEndpointCreate,
    ApiEndpointDeleted,
    ApiEndpointPage,
    ApiPing,
    ApiRotateBody,
    ApiTriggerBody,
    ApiTriggered,
)
from ...domain.retry import AttemptResult
from ...ops import endpoint_edits as edits
from ...ops.pages import page_of
from ..answers import api_answer, api_route, refusal_status
from ..context import WebContext
from ..headers import SECRET_HEADERS
from .common import (
    ApiProblem,
    bad_request,
    page_answer,
    page_request,
    read_json,
    require_store,
)

T = TypeVar("T")


def _problem(exc: operator.OperatorError) -> ApiProblem:
    """An operator's refusal as the API's answer (one line)."""
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return ApiProblem(refusal_status(exc), message)


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

    async def found(name: str) -> ApiEndpoint:
        (one,) = await in_store(edits.endpoint_answers, ctx.config(), ctx.clock(), name)
        return one

    async def secret_answer(name: str, secret: str, status: int = 200) -> Response:
        """The answer that shows ``secret``, the one time: kept by no cache."""
        shown = (await found(name)).model_copy(update={"secret": secret})
        return api_answer(shown, status, SECRET_HEADERS)

    async def listing(request: Request) -> Response:
        page = page_request(request)
        every = await in_store(edits.endpoint_answers, ctx.config(), ctx.clock())
        after = page.after or ""
        found = page_of([e for e in every if e.name > after], page.size, lambda e: e.name)
        return api_answer(page_answer(ApiEndpointPage, found.items, found.after))

    async def create(request: Request) -> Response:
        body = await read_json(request, ApiEndpointCreate)
        config = ctx.config()
        definition, secret = await _off_loop(
            lambda: edits.define_endpoint(
                config,
                body.name,
                body.definition(),
                description=body.description,
                secret=body.secret,
            )
        )
        await in_store(edits.create_endpoint, config, definition, secret)
        ctx.wake()
        # The one time the secret is shown.
        return await secret_answer(body.name, secret, 201)

    async def get(request: Request) -> Response:
        return api_answer(await found(_name(request)))

    async def delete(request: Request) -> Response:
        name = _name(request)
        closed = await in_store(edits.delete_endpoint, ctx.config(), name)
        ctx.wake()
        return api_answer(
            ApiEndpointDeleted(
                name=name,
                deleted=True,
                deliveries_closed=closed,
                deliveries_closed_reason=edits.DELETED_REASON,
            )
        )

    async def change(request: Request) -> Response:
        name = _name(request)
        body = await read_json(request, ApiEndpointChange)
        changes = body.definition()
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
        return api_answer(await found(name))

    async def enable(request: Request) -> Response:
        name = _name(request)
        await read_json(request, ApiEmptyBody)
        await in_store(operator.enable_endpoint, name)
        ctx.wake()
        return api_answer(await found(name))

    async def disable(request: Request) -> Response:
        name = _name(request)
        told = await read_json(request, ApiDisableBody)
        await in_store(operator.disable_endpoint, name, told.reason)
        return api_answer(await found(name))

    async def rotate(request: Request) -> Response:
        name = _name(request)
        body = await read_json(request, ApiRotateBody)
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
        await read_json(request, ApiEmptyBody)
        await in_store(operator.find_endpoint, name)  # an unknown name: 404 before 503
        return await _test(ctx, name)

    async def trigger(request: Request) -> Response:
        name = _name(request)
        body = await read_json(request, ApiTriggerBody)
        await in_store(operator.find_endpoint, name)  # an unknown name: 404 before 503
        if ctx.send_sample is None:
            raise ApiProblem(503, "this relay cannot send sample events")
        try:
            webhook_id, result = await ctx.send_sample(name, body.type, body.session)
        except operator.OperatorError as exc:
            raise _problem(exc) from None
        return api_answer(
            ApiTriggered(type=body.type, webhook_id=webhook_id, **_answered(name, result))
        )

    return [
        api_route("listEndpoints", listing),
        api_route("createEndpoint", create),
        api_route("getEndpoint", get),
        api_route("replaceEndpoint", change),
        api_route("updateEndpoint", change),
        api_route("deleteEndpoint", delete),
        api_route("enableEndpoint", enable),
        api_route("disableEndpoint", disable),
        api_route("testEndpoint", test),
        api_route("triggerEndpoint", trigger),
        api_route("rotateEndpointSecret", rotate),
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
    return api_answer(ApiPing(**_answered(name, result)))


def _answered(name: str, result: AttemptResult) -> dict[str, Any]:
    """:class:`ApiPing`'s fields of the POST ``name`` just answered (``:test``, ``:trigger``)."""
    return {
        "name": name,
        "ok": result.ok,
        "status_code": result.status_code,
        "error": result.error,
        "duration_ms": round(result.duration_ms, 1),
        "response_body": result.response_body,
    }
