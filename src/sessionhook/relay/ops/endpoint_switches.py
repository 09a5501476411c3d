"""The endpoints as the store knows them: listed, found by name, enabled and disabled."""

from __future__ import annotations

from ...wording import counted
from ..domain.rows import EndpointState
from ..store import StoreCore
from ..store.policy import write
from .errors import UnknownEndpointError, shown_name, shown_names


def endpoints(store: StoreCore) -> list[tuple[EndpointState, int]]:
    """Every endpoint the store knows, with its number of open deliveries."""
    backlog = store.outbox.outbox_stats()
    return [(s, backlog.get(s.name, (0, None))[0]) for s in store.endpoints.endpoint_states()]


def find_endpoint(store: StoreCore, name: str) -> EndpointState:
    """The endpoint ``name`` (one row read, however many there are);
    :class:`UnknownEndpointError` naming the known ones otherwise."""
    state = store.endpoints.endpoint_state(name)
    if state is not None:
        return state
    known = shown_names([state.name for state in store.endpoints.endpoint_states()])
    raise UnknownEndpointError(
        f"no endpoint named {shown_name(name)} in the database (known: {known or 'none yet'})"
    )


@write
def enable_endpoint(store: StoreCore, name: str) -> int:
    """Enable ``name`` again and make what waits for it due now (a retry scheduled while
    it failed goes at once); returns how many deliveries wait for it."""
    find_endpoint(store, name)
    store.endpoints.set_endpoint_enabled(name, True)
    store.requeue.due_now(name)
    return store.outbox.pending_count(name)


def enabled_line(name: str, waiting: int) -> str:
    """What the CLI and the console say after :func:`enable_endpoint`."""
    return f"endpoint {name} enabled; {counted(waiting, 'delivery')} waiting"


@write
def disable_endpoint(store: StoreCore, name: str, reason: str = "disabled by an operator") -> None:
    """Stop delivering to ``name``; its events keep being archived (replay them later)."""
    find_endpoint(store, name)
    store.endpoints.set_endpoint_enabled(name, False, reason)
