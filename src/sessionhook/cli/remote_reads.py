"""The ``--url`` side of the read commands: their rows from a relay's ``/v1/`` routes.

Each function asks the API and reads its JSON back into the rows the local command reads
from the store (:mod:`sessionhook.relay.ops.wire`), so one printer serves both; it also
returns the JSON as the local command's ``--json`` spells it. A shape it cannot read is
one line (:func:`~.remote.unknown_shape`), never a traceback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ._output import CliError
from .remote import get_json, get_pages, unknown_shape

if TYPE_CHECKING:
    from ..relay.domain.rows import AttemptRow, DeliveryRow, EndpointState

__all__ = ["SHAPE_ERRORS", "remote_attempts", "remote_deliveries", "remote_endpoints"]

#: What reading an answer of another shape raises (a field missing, of another type).
SHAPE_ERRORS = (KeyError, TypeError, ValueError, AttributeError)


def remote_deliveries(
    url: str, token: str | None, filters: dict[str, str | None], limit: int
) -> tuple[list[DeliveryRow], dict[int, tuple[str, float]], list[Any]]:
    """``GET /v1/deliveries`` (``limit`` rows, newest first): rows, claims and the JSON."""
    from ..relay.ops.wire import delivery_from_json

    params = {k: v for k, v in filters.items() if v is not None}
    items = get_pages(url, token, "/v1/deliveries", "deliveries", params, limit)
    rows, claims = [], {}
    try:
        for item in items:
            row, claim = delivery_from_json(item)
            rows.append(row)
            if claim is not None:
                claims[row.id] = claim
    except SHAPE_ERRORS as exc:
        raise unknown_shape(url, "/v1/deliveries", exc) from None
    return rows, claims, items


def remote_attempts(
    url: str, token: str | None, target: str
) -> tuple[tuple[str, str] | None, list[tuple[DeliveryRow, list[AttemptRow]]], dict[str, Any]]:
    """``attempts`` of a delivery (``GET /v1/deliveries/{id}``) or of every delivery of an
    event (``GET /v1/events/{id}``, then each of its deliveries): ``(the event's id and
    type or None, [(delivery, attempts)], the JSON)``."""
    from ..relay.ops.wire import attempts_from_json

    key = target.strip().removeprefix("#")
    try:
        if key.isdigit():
            block = get_json(url, token, f"/v1/deliveries/{key}")
            return None, [attempts_from_json(block)], block
        try:
            answer = get_json(url, token, f"/v1/events/{quote(key, safe='')}")
        except CliError as exc:
            if not exc.message.startswith("no event "):
                raise
            # Neither a delivery id nor an archived event: what the local command says.
            raise CliError(f"no delivery or event {target!r}", hint=exc.hint) from None
        event = answer["event"]
        ids = sorted(int(d["id"]) for d in answer["deliveries"])
        blocks = [get_json(url, token, f"/v1/deliveries/{i}") for i in ids]
        found = [attempts_from_json(b) for b in blocks]
        return (
            (str(event["id"]), str(event["type"])),
            found,
            {
                "event": event["id"],
                "deliveries": blocks,
            },
        )
    except SHAPE_ERRORS as exc:
        raise unknown_shape(url, "/v1/deliveries", exc) from None


def remote_endpoints(
    url: str, token: str | None
) -> tuple[list[tuple[EndpointState, int, dict[str, int]]], list[Any]]:
    """``GET /v1/endpoints`` (every page): each endpoint's state, open deliveries and in
    flight per replica, and the JSON of the local ``endpoints list --json`` (the API's
    answer also has each endpoint's definition: left out, as the local command has none)."""
    from ..relay.ops.wire import endpoint_from_json, endpoint_json

    items = get_pages(url, token, "/v1/endpoints", "endpoints", {}, 10_000)
    try:
        listed = [endpoint_from_json(item) for item in items]
    except SHAPE_ERRORS as exc:
        raise unknown_shape(url, "/v1/endpoints", exc) from None
    return listed, [endpoint_json(*row) for row in listed]
