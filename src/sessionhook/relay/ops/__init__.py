"""The operator layer: the queries and actions behind the CLI, the web console and the
management API, written once over the synchronous store (``StoreCore``; SQL stays in
``relay/store/``). The web routes run them in the store's thread
(``await astore.run(ops.deliveries, ...)``); a failure the operator can fix is an
:class:`OperatorError`, one line meant to be shown as is. The command line reaches the store
only through this package (``.importlinter``). This module names what its modules hold.
"""

from __future__ import annotations

from ..delivery.resolve import Resolver
from ..delivery.sender import Poster
from ..domain.delivery_states import DELIVERY_STATUSES
from ..store import (
    StoreCore,
    StoreError,
    StoreLockedError,
    acquire_daemon_lock,
    database_errors,
)
from ..store.copying import CopyError, CopyReport
from .endpoint_switches import (
    disable_endpoint,
    enable_endpoint,
    enabled_line,
    endpoints,
    find_endpoint,
)
from .errors import OperatorError, UnknownEndpointError
from .following import GAP_SETTLE, EventFilter, EventPage, Follower, resume_position
from .overview import Overview, endpoints_in_flight, in_flight, status
from .ping import PING_TYPE, ping_event, ping_poster, test_endpoint
from .records import EVENT_DELIVERIES, attempts, deliveries, events
from .replaying import REPLAY_CHUNK, ReplayResult, replay
from .store_access import copy_stores, live_replicas, open_copy_side, operator_store

__all__ = [
    "DELIVERY_STATUSES",
    "EVENT_DELIVERIES",
    "GAP_SETTLE",
    "PING_TYPE",
    "REPLAY_CHUNK",
    "CopyError",
    "CopyReport",
    "EventFilter",
    "EventPage",
    "Follower",
    "OperatorError",
    "Overview",
    "Poster",
    "ReplayResult",
    "Resolver",
    "StoreCore",
    "StoreError",
    "StoreLockedError",
    "UnknownEndpointError",
    "acquire_daemon_lock",
    "attempts",
    "copy_stores",
    "database_errors",
    "deliveries",
    "disable_endpoint",
    "enable_endpoint",
    "enabled_line",
    "endpoints",
    "endpoints_in_flight",
    "events",
    "find_endpoint",
    "in_flight",
    "live_replicas",
    "open_copy_side",
    "operator_store",
    "ping_event",
    "ping_poster",
    "replay",
    "resume_position",
    "status",
    "test_endpoint",
]
