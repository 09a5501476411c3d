"""``sessionhook trigger``: one signed sample event of a type, sent now to an endpoint as a
delivery of that type would be (its filters, its shape, its secrets), or to any URL.

A triggered event is a sample: its ``webhook-id`` starts with :data:`TRIGGER_ID_PREFIX`,
its body carries ``data.sample: true``, and its action links (with ``[actions]`` on) open
pages that say so and never act upstream. It is never archived, never retried and never
counted as a delivery.
"""

from __future__ import annotations

import json
import secrets
from typing import Final

import httpx

from sessionhook.api.client import session_name
from sessionhook.api.models import EVENT_MEMBERS, Activity, Session

from ..config import Config, EndpointConfig
from ..delivery.post import post_event
from ..delivery.render_process import Renderer
from ..delivery.sender import Poster
from ..domain import samples
from ..domain.action_links import ActionLinks
from ..domain.addresses import AddressPolicy, UnusableUrlError
from ..domain.events import Event, matches, payload_matches
from ..domain.retry import AttemptResult
from ..domain.signing import signature_header
from ..store import StoreCore
from .errors import OperatorError, shown_name, shown_names
from .forwarding import forward_target
from .ping import configured_endpoint, send_to_endpoint

#: The ``webhook-id`` of a triggered event starts so (a real event's: ``evt_``).
TRIGGER_ID_PREFIX: Final = "msg_trigger_"


def trigger_types() -> list[tuple[str, str]]:
    """Every type ``trigger`` sends, with what its sample shows (``trigger --list``)."""
    return list(samples.SAMPLE_LINES.items())


def check_type(event_type: str) -> str:
    """``event_type`` when the relay emits it; else :class:`OperatorError` naming the known."""
    if event_type not in samples.SAMPLE_LINES:
        raise OperatorError(
            f"unknown event type {shown_name(event_type)} (known: "
            f"{shown_names(list(samples.SAMPLE_LINES))}; sessionhook trigger --list)"
        )
    return event_type


def archived_session(core: StoreCore, name: str) -> tuple[Session, dict[str, Activity]]:
    """An archived session's data for a ``--session`` sample: the session and, by event
    member, its newest archived activity of each kind. :class:`OperatorError` when the
    archive does not hold it. ``name``: ``sessions/<id>`` or ``<id>``."""
    try:
        name = session_name(name)
    except ValueError as exc:
        raise OperatorError(f"--session: {exc}") from None
    row = core.ingest.get_session(name)
    if row is None:
        raise OperatorError(f"no archived session {shown_name(name)} in this store")
    found = {}
    for member in EVENT_MEMBERS:  # the newest archived activity of each kind
        activity = core.ingest.latest_activity(name, member)
        if activity is not None:
            found[member] = activity
    return row.to_session(), found


def sample(
    event_type: str,
    *,
    links: ActionLinks | None,
    now: float,
    session: tuple[Session, dict[str, Activity]] | None = None,
) -> tuple[str, Event]:
    """(``webhook-id``, the sample event of ``event_type``), fresh and marked."""
    real, activities = session if session is not None else (None, None)
    event = samples.triggered(
        check_type(event_type), links=links, session=real, activities=activities, now=now
    )
    return TRIGGER_ID_PREFIX + secrets.token_hex(16), event


def _admits(endpoint: EndpointConfig, event: Event) -> None:
    """:class:`OperatorError` when the endpoint's ``events`` or ``filter`` leave the event
    out: a real event of that type would not be delivered to it either."""
    if not matches(endpoint.events, event.type):
        raise OperatorError(
            f"{endpoint.name} does not take {event.type}: its events "
            f"({', '.join(endpoint.events)}) leave it out; nothing was sent"
        )
    if endpoint.filter and not payload_matches(endpoint.filter, json.loads(event.body)):
        raise OperatorError(
            f"{endpoint.name} does not take this {event.type}: its filter leaves it out; "
            "nothing was sent"
        )


async def trigger_endpoint(
    config: Config,
    name: str,
    event_type: str,
    *,
    poster: Poster,
    now: float,
    links: ActionLinks | None,
    endpoint: EndpointConfig | None = None,
    session: tuple[Session, dict[str, Activity]] | None = None,
    renderer: Renderer | None = None,
    policy: AddressPolicy | None = None,
) -> tuple[str, AttemptResult]:
    """Send endpoint ``name`` the sample of ``event_type`` as its delivery would be: its
    ``events`` and ``filter`` first, then its shape and secrets (:func:`.ping.send_to_endpoint`);
    returns the webhook-id and the answer."""
    endpoint = configured_endpoint(config, name, endpoint)
    event_id, event = sample(event_type, links=links, now=now, session=session)
    _admits(endpoint, event)
    result = await send_to_endpoint(
        config,
        endpoint,
        event_id,
        event.body,
        poster=poster,
        policy=policy,
        renderer=renderer,
        what=f"the sample {event.type}",
    )
    return event_id, result


def check_secret(secret: str) -> str:
    """A secret (``whsec_``) or signing key (``whsk_``) for ``--to``; :class:`OperatorError`
    saying what is wrong with anything else."""
    try:
        signature_header([secret], "msg_check", 0, b"")
    except ValueError as exc:
        raise OperatorError(f"the secret is not usable: {exc}") from None
    return secret


async def trigger_url(
    url: str,
    secret: str,
    event_type: str,
    *,
    poster: Poster | httpx.AsyncClient,
    now: float,
    timeout: float,  # noqa: ASYNC109 - post_event bounds the whole exchange by it
) -> tuple[str, AttemptResult]:
    """Send the standard JSON sample of ``event_type`` to ``url`` (``--to``: no endpoint,
    so no filter and no shape; private addresses allowed, as ``listen`` forwards), signed
    with ``secret``; the webhook-id and the answer."""
    try:
        target = forward_target(url)
    except UnusableUrlError as exc:
        raise OperatorError(f"--to: refused: {exc.reason}") from None
    check_secret(secret)
    event_id, event = sample(event_type, links=None, now=now)
    result = await post_event(
        poster,
        url=target,
        secrets=[secret],
        event_id=event_id,
        body=event.body,
        timeout=timeout,
        body_limit=4096,
    )
    return event_id, result
