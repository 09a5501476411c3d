"""Replay: archived events delivered again to an endpoint, and why none when none."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ..domain.rows import EndpointState
from ..store import StoreCore
from ..store.policy import write
from .endpoint_switches import find_endpoint
from .errors import OperatorError

#: Events queued per replay transaction: short write locks next to a running daemon.
REPLAY_CHUNK: Final = 1000


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """How many deliveries a replay queued, and the endpoint's state (a disabled one
    sends them once enabled)."""

    queued: int
    endpoint: EndpointState
    #: Why nothing was queued (``None`` when something was).
    reason: str | None = None


@write
def replay(
    store: StoreCore,
    endpoint: str,
    *,
    event_ids: tuple[str, ...] | list[str] = (),
    since: float | None = None,
    until: float | None = None,
    type_glob: str | None = None,
    session: str | None = None,
    on_progress: Callable[[int], None] = lambda n: None,
    chunk: int = REPLAY_CHUNK,
) -> ReplayResult:
    """Deliver archived events again to ``endpoint``: same webhook-id and body, new attempts.

    Either ``event_ids`` or a time range (``since``, optional ``until``); ``type_glob`` and
    ``session`` narrow either. A range is read and queued ``chunk`` events at a time, each
    chunk in its own short transaction, so a replay of a million events neither sits in
    memory nor holds the write lock long enough to stall the daemon. Events the endpoint
    does not subscribe to, or already on their way, are not queued.
    """
    if bool(event_ids) == (since is not None):
        raise OperatorError("give either a start time (and an optional end) or event ids")
    if until is not None and since is None:
        raise OperatorError("an end time needs a start time")
    state = find_endpoint(store, endpoint)
    if event_ids:
        missing = [i for i in event_ids if store.operator.get_event(i) is None]
        if missing:
            raise OperatorError(f"no archived event {', '.join(missing)}")
        queued = store.operator.replay(
            endpoint, event_ids=list(event_ids), type_glob=type_glob, session=session
        )
        on_progress(queued)
        why = None if queued else _replay_none(store, endpoint, event_ids, None, None, session)
        return ReplayResult(queued, state, why)
    total, cursor = 0, 0
    while True:
        page = store.operator.event_ids_after(
            cursor, session=session, since=since, until=until, limit=chunk
        )
        if not page:
            why = None if total else _replay_none(store, endpoint, (), since, until, session)
            return ReplayResult(total, state, why)
        cursor = page[-1][0]
        ids = [
            i for _seq, i, kind in page if type_glob is None or fnmatch.fnmatchcase(kind, type_glob)
        ]
        if ids:
            queued = store.operator.replay(endpoint, event_ids=ids)
            total += queued
            on_progress(queued)


def _replay_none(
    store: StoreCore,
    endpoint: str,
    event_ids: tuple[str, ...] | list[str],
    since: float | None,
    until: float | None,
    session: str | None,
) -> str:
    """Why a replay queued nothing, in one line."""
    selected, on_way = store.operator.replay_census(
        endpoint,
        since=since,
        until=until,
        event_ids=list(event_ids) if event_ids else None,
        session=session,
    )
    if selected == 0:
        where = f" of {session}" if session else ""
        return f"no archived event{where} in that range" if not event_ids else "no such event"
    if on_way == selected:
        if selected == 1:
            return (
                f"the event selected is on its way to {endpoint} already (an open delivery): "
                "if it failed, send it now with `sessionhook deliveries recover --endpoint "
                f"{endpoint} --since TIME` or `deliveries retry ID`"
            )
        return (
            f"the {selected} events selected are on their way to {endpoint} already (an open "
            "delivery each): send the failed ones now with `sessionhook deliveries recover "
            f"--endpoint {endpoint} --since TIME` or `deliveries retry ID`"
        )
    if on_way == 0:
        return (
            f"the {'event' if selected == 1 else f'{selected} events'} selected "
            f"{'is' if selected == 1 else 'are'} of types {endpoint} does not subscribe to "
            "(or fail its filter or --type)"
        )
    return (
        f"of the {selected} events selected, {on_way} {'is' if on_way == 1 else 'are'} on "
        f"{'its' if on_way == 1 else 'their'} way already and the others are of types "
        f"{endpoint} does not subscribe to (or fail its filter or --type)"
    )
