"""Prometheus metrics of the relay, in a registry of their own.

Each :class:`Metrics` owns a private registry, so two daemons in one process, or a reload,
never collide. The outbox gauges describe the database: :meth:`Metrics.refresh_outbox` sets
them on each scrape. docs/operations.md ("Health and metrics") lists the families.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Final, Protocol, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from ... import __version__
from .delivery_metrics import DeliveryStats

#: A cache key of labelled children (see _child).
_K = TypeVar("_K", bound=Hashable)

NAMESPACE: Final = "sessionhook"
CONTENT_TYPE: Final[str] = CONTENT_TYPE_LATEST

# Webhook endpoints answer in milliseconds to tens of seconds (timeouts are 10-30 s).
_DURATION_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0)


class ReplicaLike(Protocol):
    """What :meth:`Metrics.refresh_replicas` reads of a replica (``domain.rows.ReplicaRow``;
    telemetry does not import the domain)."""

    @property
    def id(self) -> str: ...
    @property
    def heartbeat_at(self) -> float: ...
    @property
    def lease(self) -> float: ...
    @property
    def stopped_at(self) -> float | None: ...
    @property
    def deliveries(self) -> int: ...
    @property
    def polls(self) -> int: ...
    @property
    def leases(self) -> tuple[str, ...]: ...


#: ``(pending, oldest_created_at)`` per endpoint, as ``store.outbox.outbox_stats()`` returns it.
OutboxStats = Mapping[str, tuple[int, float | None]]


class Metrics:
    """The relay's metrics; the daemon owns one instance and passes it where needed."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        """Create every family in ``registry`` (a fresh private registry by default)."""
        self.registry = r = CollectorRegistry(auto_describe=True) if registry is None else registry

        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, labels, namespace=NAMESPACE, registry=r)

        def gauge(name: str, doc: str, *labels: str) -> Gauge:
            return Gauge(name, doc, labels, namespace=NAMESPACE, registry=r)

        #: Children of the ingest-side families, by label values (see event_ingested).
        self._ingested_children: dict[str, Counter] = {}
        self._upstream_children: dict[tuple[str, str], Counter] = {}
        self.events_ingested = counter(
            "events_ingested",
            "Events archived from upstream activity and session changes, by event type.",
            "type",
        )
        #: deliveries_total and delivery_attempt_duration_seconds: counted per attempt
        #: without prometheus_client's per-value locks (see :mod:`.delivery_metrics`).
        self._delivery_stats = DeliveryStats(
            NAMESPACE,
            _DURATION_BUCKETS,
            counter_help=(
                "Delivery attempts by endpoint and outcome (delivered, retry, dead, disabled)."
            ),
            histogram_help=(
                "Duration of one webhook POST, from connect to the capped response body."
            ),
        )
        r.register(self._delivery_stats)
        self.dead_letters = counter(
            "dead_letters",
            "Deliveries that exhausted their retries and were dead-lettered.",
            "endpoint",
        )
        self.endpoint_disabled = counter(
            "endpoint_disabled",
            "Endpoints disabled by the relay (gone, failing for disable_after), by reason.",
            "endpoint",
            "reason",
        )
        self.endpoint_enabled = gauge(
            "endpoint_enabled",
            "1 when the endpoint receives deliveries, 0 when it is disabled.",
            "endpoint",
        )
        self.upstream_requests = counter(
            "upstream_requests",
            "Requests to the Sessions API by endpoint and HTTP status ('error': no answer, "
            "'malformed': a 2xx answer whose body was not what the API promises).",
            "endpoint",
            "status",
        )
        self.upstream_failures = counter(
            "upstream_failures",
            "Failed upstream calls as the poller saw them, by loop (discovery, session, "
            "announce) and kind (transport, deadline, malformed, too_deep, too_large, "
            "page_limit, page_loop, status).",
            "loop",
            "kind",
        )
        self.activities_refused = counter(
            "activities_refused",
            "Upstream activities refused, each counted once (too_large, foreign_name, "
            "not_a_name, duplicate_name, malformed); sessionhook status lists them.",
            "reason",
        )
        self.sessions_refused = counter(
            "sessions_refused",
            "Items of the session list that are no session, refused (not tracked), each "
            "counted once per process (malformed, not_a_name).",
            "reason",
        )
        self.sessions_repaired = counter(
            "sessions_repaired",
            "Sessions whose text was not Unicode (a lone surrogate), relayed with U+FFFD in "
            "its place, each counted once per process.",
        )
        self.unknown_values = counter(
            "unknown_values",
            "Enum values of the service this version does not know (a new session state, an "
            "automationMode), kept as text: each session's counted once per process.",
            "field",
        )
        self.outbox_pending = gauge(
            "outbox_pending",
            "Deliveries waiting to be delivered (never tried or retry scheduled).",
            "endpoint",
        )
        self.outbox_oldest_pending_age = gauge(
            "outbox_oldest_pending_age_seconds",
            "Age of the oldest waiting delivery (0 when none waits).",
            "endpoint",
        )
        self.poll_lag = gauge(
            "poll_lag_seconds",
            "Seconds since the last successful upstream poll, as of the last scrape.",
        )
        self.last_successful_poll = gauge(
            "last_successful_poll_timestamp_seconds",
            "Unix time of the last successful upstream poll (0 before the first).",
        )
        self.store_unwritable = gauge(
            "store_unwritable",
            "1 while writes to the store fail (disk full, read-only): polling and deliveries "
            "paused, else 0.",
        )
        self.store_write_failures = counter(
            "store_write_failures",
            "Rounds of store writes that failed and are retried later, by reason ('full', "
            "'unwritable').",
            "reason",
        )
        self.web_auth_failures = counter(
            "web_auth_failures",
            "Requests to the console or the event stream with a wrong token, by how it came "
            "('bearer', 'login').",
            "via",
        )
        self.mcp_open = gauge(
            "mcp_open",
            "What MCP clients hold open: 'waits' (wait_for_session calls) and "
            "'subscriptions' (resources subscribed, both protocol revisions).",
            "kind",
        )
        self.actions = counter(
            "actions",
            "Actions asked through signed links, Slack, the console, the API or MCP, by action "
            "('approve_plan', 'reply', 'unknown' for a token that says none) and result "
            "('done', 'upstream failed', or why nothing was done: 'expired', 'used'...).",
            "action",
            "result",
        )
        self.event_streams = gauge(
            "event_streams", "Event streams (GET /v1/events/stream) open now."
        )
        self.web_connections = gauge(
            "web_connections",
            "Connections the listener ([server] listen) holds open now (at most "
            "server.max_connections).",
        )
        self.web_connections_closed = counter(
            "web_connections_closed",
            "Listener connections closed by the relay, by reason ('request_timeout': no "
            "complete request in time; 'stuck_close': the peer read nothing).",
            "reason",
        )
        self.build_info = gauge(
            "build_info", "Always 1; the labels carry the running version.", "version"
        )
        self.build_info.labels(version=__version__).set(1)
        self.replicas_alive = gauge(
            "replicas_alive",
            "Replicas of the relay sharing this store whose heartbeat is within their lease.",
        )
        self.replica_heartbeat_age = gauge(
            "replica_heartbeat_age_seconds",
            "Seconds since each running replica's last heartbeat (above its lease: dead).",
            "replica",
        )
        self.replica_claims = gauge(
            "replica_claims",
            "Claims each replica holds: 'delivery' (attempts in flight), 'poll' (session polls).",
            "replica",
            "kind",
        )
        self.lease_held = gauge(
            "lease_held",
            "1 for each named lease (an account's poller) and the replica holding it.",
            "lease",
            "replica",
        )
        self.replica_heartbeat_late_total = counter(
            "replica_heartbeat_late",
            "Times this replica could not heartbeat for longer than its lease.",
        )
        self._last_success_at: float | None = None

    # -- updated as things happen --------------------------------------------------------

    def event_ingested(self, event_type: str, count: int = 1) -> None:
        """Count ``count`` newly archived events of ``event_type``."""
        if count:
            _child(self._ingested_children, event_type, self.events_ingested, type=event_type).inc(
                count
            )

    def delivery_attempted(self, endpoint: str, outcome: str, duration_seconds: float) -> None:
        """Record one POST's outcome and duration (``dead`` also counts a dead letter)."""
        self._delivery_stats.attempted(endpoint, outcome, duration_seconds)
        if outcome == "dead":
            self.dead_letters.labels(endpoint=endpoint).inc()

    def endpoint_was_disabled(self, endpoint: str, reason: str) -> None:
        """Record that the relay disabled ``endpoint`` (``reason`` is a short category)."""
        self.endpoint_disabled.labels(endpoint=endpoint, reason=reason).inc()
        self.endpoint_enabled.labels(endpoint=endpoint).set(0)

    def upstream_request(self, endpoint: str, status: int | str | None) -> None:
        """Count a Sessions API request; ``status`` ``None`` means no answer (timeout...),
        ``"malformed"`` a 2xx answer that did not parse."""
        label = "error" if status is None else str(status)
        _child(
            self._upstream_children,
            (endpoint, label),
            self.upstream_requests,
            endpoint=endpoint,
            status=label,
        ).inc()

    def web_auth_failed(self, via: str) -> None:
        """Count a wrong token shown to the web layer (``bearer`` header or ``login`` form)."""
        self.web_auth_failures.labels(via=via).inc()

    def action_asked(self, action: str, result: str) -> None:
        """Count an action asked for (see the ``actions_total`` family)."""
        self.actions.labels(action=action, result=result).inc()

    def poll_succeeded(self, at: float) -> None:
        """Note a successful upstream poll at Unix time ``at``."""
        self._last_success_at = at
        self.last_successful_poll.set(at)

    # -- refreshed from the database before a scrape -------------------------------------

    def refresh_outbox(self, stats: OutboxStats, now: float, endpoints: Iterable[str] = ()) -> None:
        """Set the outbox gauges from ``store.outbox.outbox_stats()``.

        ``endpoints`` lists configured endpoints so that those with nothing waiting show an
        explicit 0; endpoints no longer in either are dropped, not left stale.
        """
        self.outbox_pending.clear()
        self.outbox_oldest_pending_age.clear()
        for name in {*endpoints, *stats}:
            pending, oldest = stats.get(name, (0, None))
            age = 0.0 if oldest is None or not pending else max(0.0, now - oldest)
            self.outbox_pending.labels(endpoint=name).set(pending)
            self.outbox_oldest_pending_age.labels(endpoint=name).set(age)
        self.refresh_poll_lag(now)

    def refresh_poll_lag(self, now: float) -> None:
        """Recompute ``poll_lag_seconds`` against ``now`` (left at 0 before any success)."""
        if self._last_success_at is not None:
            self.poll_lag.set(max(0.0, now - self._last_success_at))

    def refresh_endpoints(self, enabled: Mapping[str, bool]) -> None:
        """Set ``endpoint_enabled`` from ``{name: enabled}``
        (``store.endpoints.endpoint_states()``)."""
        self.endpoint_enabled.clear()
        for name, on in enabled.items():
            self.endpoint_enabled.labels(endpoint=name).set(1 if on else 0)

    def refresh_replicas(self, replicas: Iterable[ReplicaLike], now: float) -> None:
        """Set the replica families from ``store.leases.replicas()`` (stopped ones are left out)."""
        for gauge in (self.replica_heartbeat_age, self.replica_claims, self.lease_held):
            gauge.clear()
        alive = 0
        for r in replicas:
            if r.stopped_at is not None:
                continue
            age = max(0.0, now - r.heartbeat_at)
            alive += age <= r.lease
            self.replica_heartbeat_age.labels(replica=r.id).set(age)
            self.replica_claims.labels(replica=r.id, kind="delivery").set(r.deliveries)
            self.replica_claims.labels(replica=r.id, kind="poll").set(r.polls)
            for lease in r.leases:
                self.lease_held.labels(lease=lease, replica=r.id).set(1)
        self.replicas_alive.set(alive)

    def render(self) -> bytes:
        """The registry in the Prometheus text exposition format (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


def _child(cache: dict[_K, Counter], key: _K, family: Counter, **labels: str) -> Counter:
    """``family.labels(**labels)``, cached under ``key`` (``labels()`` per call was 5 % of the
    poller's CPU in a backfill); the cache is cleared past 4,096 entries."""
    child = cache.get(key)
    if child is None:
        if len(cache) >= 4096:
            cache.clear()
        child = cache[key] = family.labels(**labels)
    return child
