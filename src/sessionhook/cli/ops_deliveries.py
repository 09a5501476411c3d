"""The delivery-log commands: ``status``, ``deliveries`` and ``attempts``.

Views of :mod:`sessionhook.relay.ops` (the web console shows the same rows). They
read the daemon's store like every operator command (see :mod:`.ops`, whose plumbing they
share): read-only, safe while the daemon runs, the database found through ``--config``
(default ``$SESSIONHOOK_CONFIG``, else ``/etc/sessionhook/config.toml``) or ``--db``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import click

from ..relay.domain.delivery_states import DELIVERY_STATUSES
from ..wording import counted
from . import cli
from ._output import CliError, echo_json, render_fields, render_table
from .ops import (
    age,
    json_option,
    reading_store,
    reported,
    stamp,
    stamp_ago,
    store_options,
)
from .remote import get_json, refuse_store_options, remote_options

if TYPE_CHECKING:
    from ..relay.domain.rows import AttemptRow, DeliveryRow, RefusedSummary, UpstreamSummary
    from ..relay.ops import HistoryProgress, Overview, ReplicaRow

__all__ = ["attempts", "deliveries", "status"]


# --------------------------------------------------------------------------- status


@cli.command("status")
@store_options
@remote_options
@json_option
@reported
def status(
    config_path: str | None,
    db_path: str | None,
    url: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """Endpoints (enabled or why not, backlog, last hour, last error) and upstream polling;
    with --url, of a running relay (its GET /v1/status)."""
    if url is not None:
        refuse_store_options(config_path, db_path)
        data = get_json(url, token, "/v1/status")
        if as_json:
            echo_json(data)
            return
        from ..relay.ops.wire import overview_from_json

        try:
            overview = overview_from_json(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CliError(f"{url}: /v1/status answered in an unknown shape ({exc!r})") from None
        _print_status(overview, overview.summary.now)
        return
    from ..relay import ops as operator

    now = time.time()
    with reading_store(config_path, db_path) as store:
        overview = operator.status(store, now)
    if as_json:
        from ..relay.ops.wire import status_json

        echo_json(status_json(overview, now))
        return
    _print_status(overview, now)


def _print_status(overview: Overview, now: float) -> None:
    """The text of ``status``: the endpoints' table, then upstream and archive fields."""
    summary, history, accounts = overview.summary, overview.history, overview.accounts
    replicas = list(overview.replicas)
    rows = []
    for ep in summary.endpoints:
        if not ep.configured:
            state = "not in config"
        elif ep.enabled:
            state = "enabled"
        else:
            state = f"disabled: {ep.disabled_reason or 'by an operator'}"
        rows.append(
            [
                ep.name,
                state,
                ep.pending,
                age(ep.oldest_pending_age),
                ep.delivered_last_hour,
                ep.failed_last_hour,
                ep.dead_last_hour,
                # A success since makes the error history (--json: failing_since null).
                ep.last_error if ep.error_is_current else "",
            ]
        )
    headers = ["ENDPOINT", "STATE", "PENDING", "OLDEST", "DELIVERED/1h", "FAILED/1h", "DEAD/1h"]
    click.echo(render_table([*headers, "LAST ERROR"], rows) if rows else "no endpoints yet")
    up = summary.upstream
    click.echo("")
    click.echo(
        render_fields(
            [
                ("last poll", stamp_ago(up.last_poll_at, now)),
                ("last good poll", stamp_ago(up.last_ok_poll_at, now)),
                ("upstream, last hour", _upstream_line(up)),
                (
                    "archive",
                    f"{counted(summary.sessions, 'session')}, "
                    f"{counted(summary.activities, 'activity')}, "
                    f"{counted(summary.events, 'event')}",
                ),
                ("history walk", _history_line(history)),
                (
                    "accounts",
                    ", ".join(f"{name} ({counted(n, 'session')})" for name, n in accounts.items())
                    or "-",
                ),
                ("refused upstream", _refused_line(summary.refused, now)),
                ("replicas", _replicas_line(replicas, now)),
            ]
        )
    )


def _replicas_line(replicas: list[ReplicaRow], now: float) -> str:
    """Running replicas and what each holds; then how many stopped or died lately.

    ``2 running: 3f2a@db1:812 (heartbeat 2 s ago; 4 in flight, 1 polls; poller:default),
    9c1e@db2:77 (...)``."""
    from ..relay.domain.replica import replica_health

    parts = []
    gone = {"stopped": 0, "dead": 0}
    for r in replicas:
        health = replica_health(r.heartbeat_at, r.lease, r.stopped_at, now)
        if health != "alive":
            gone[health] += 1
            if health == "stopped" or not (r.deliveries or r.polls or r.leases):
                continue
        held = [f"{r.deliveries} in flight", counted(r.polls, "poll"), *r.leases]
        late = "" if health == "alive" else f"DEAD since {age(now - r.heartbeat_at - r.lease)}, "
        parts.append(
            f"{r.id}@{r.host}:{r.pid} ({late}heartbeat {age(now - r.heartbeat_at)} ago; "
            f"{', '.join(held)})"
        )
    line = f"{len(parts)} running: " + ", ".join(parts) if parts else "none running"
    if gone["dead"] or gone["stopped"]:
        line += f" ({gone['stopped']} stopped, {gone['dead']} dead in the last day)"
    return line


def _history_line(history: HistoryProgress) -> str:
    """The history walk's progress: done / total and the time left at the recent pace."""
    if history.total == 0:
        return "none (nothing predates the first start, or backfill = true)"
    if history.remaining == 0:
        return f"done ({counted(history.total, 'session')} archived)"
    eta = history.eta_seconds
    left = "time left unknown yet" if eta is None else f"about {age(eta)} left"
    return f"{history.done} / {counted(history.total, 'session')} archived, {left}"


def _upstream_line(up: UpstreamSummary) -> str:
    """``120 requests, 3 throttled (429), 45 errors (40 key refused (401/403), 5 malformed)``."""
    parts = [
        f"{n} {what}"
        for n, what in (
            (up.rejected_last_hour, "key refused (401/403)"),
            (up.malformed_last_hour, "malformed"),
        )
        if n
    ]
    detail = f" ({', '.join(parts)})" if parts else ""
    return (
        f"{counted(up.requests_last_hour, 'request')}, {up.throttled_last_hour} throttled "
        f"(429), {counted(up.errors_last_hour, 'error')}{detail}"
    )


def _refused_line(refused: RefusedSummary, now: float) -> str:
    """``3 activities (2 too_large, 1 foreign_name), 1 in the last hour; latest ...``."""
    if not refused.total:
        return "none"
    reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(refused.by_reason.items()))
    line = f"{counted(refused.total, 'activity')} ({reasons}), {refused.recent} in the last hour"
    latest = refused.latest
    if latest is not None:
        line += (
            f"; latest {latest.name or '(no name)'} of {latest.session_name}: {latest.reason}, "
            f"{stamp_ago(latest.last_refused_at, now)}"
        )
    return line


# --------------------------------------------------------------------------- deliveries


@cli.group("deliveries", invoke_without_command=True)
@store_options
@remote_options
@click.option("--endpoint", metavar="NAME", help="Only this endpoint.")
@click.option("--status", "status_", type=click.Choice(DELIVERY_STATUSES), help="Only this status.")
@click.option("--session", metavar="SESSION", help="Only this session (sessions/…).")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1), help="At most.")
@json_option
@reported
def deliveries(
    config_path: str | None,
    db_path: str | None,
    url: str | None,
    token: str | None,
    endpoint: str | None,
    status_: str | None,
    session: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """The delivery log, newest first: status, attempts, last status code and error.

    An open delivery queued behind an earlier open one of the same endpoint and session
    shows `waiting on #ID` (events of a session go out in order); --json has `waiting_on`.
    `deliveries retry ID` sends one now; `deliveries recover` every failed or dead one of
    an endpoint since a time.
    """
    if click.get_current_context().invoked_subcommand is not None:
        return  # `deliveries retry|recover`: the subcommand does the work
    now = time.time()
    if url is not None:
        refuse_store_options(config_path, db_path)
        from .remote_reads import remote_deliveries

        filters = {"endpoint": endpoint, "status": status_, "session": session}
        rows, claims, data = remote_deliveries(url, token, filters, limit)
        if as_json:
            echo_json(data)
            return
        _print_deliveries(rows, claims, now)
        return
    from ..relay import ops as operator
    from ..relay.domain.rows import OPEN_STATUSES

    with reading_store(config_path, db_path) as store:
        if endpoint is not None:
            operator.find_endpoint(store, endpoint)  # a typo is an error, not "no match"
        rows = operator.deliveries(
            store, endpoint=endpoint, status=status_, session=session, limit=limit
        )
        claims = operator.in_flight(store, now, (r.id for r in rows if r.status in OPEN_STATUSES))
    if as_json:
        from ..relay.ops.wire import delivery_json

        echo_json([delivery_json(row, claims.get(row.id)) for row in rows])
        return
    _print_deliveries(rows, claims, now)


def _print_deliveries(
    rows: Sequence[DeliveryRow], claims: Mapping[int, tuple[str, float]], now: float
) -> None:
    """The text of ``deliveries``: one table row a delivery, or ``no deliveries match``."""
    from ..relay.domain.rows import OPEN_STATUSES

    if not rows:
        click.echo("no deliveries match")
        return
    table = []
    for d in rows:
        claim = claims.get(d.id)
        if claim is not None:  # a live replica holds it (see status: replicas)
            when = f"in flight on {claim[0]} for {age(now - claim[1])}"
        elif d.status == "delivered":
            when = f"delivered {age(now - d.delivered_at)} ago" if d.delivered_at else ""
        elif d.status in OPEN_STATUSES and d.waiting_on is not None:
            when = f"waiting on #{d.waiting_on}"  # its own time means nothing until then
        elif d.status in OPEN_STATUSES and d.next_attempt_at is not None:
            due = d.next_attempt_at - now
            when = "due now" if due <= 0 else f"next in {age(due)}"
        else:
            when = f"{age(now - d.updated_at)} ago"
        table.append(
            [
                d.id,
                d.endpoint,
                d.status + (" (replay)" if d.replayed else ""),
                d.attempts,
                d.last_status_code,
                when,
                d.event_type,
                d.event_id,
                d.session_name,
                d.last_error,
            ]
        )
    headers = ["ID", "ENDPOINT", "STATUS", "ATTEMPTS", "CODE", "WHEN", "TYPE", "EVENT"]
    click.echo(render_table([*headers, "SESSION", "LAST ERROR"], table))


@cli.command("attempts")
@click.argument("target", metavar="DELIVERY|EVENT")
@store_options
@remote_options
@json_option
@reported
def attempts(
    target: str,
    config_path: str | None,
    db_path: str | None,
    url: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """Every attempt of one delivery, or of every delivery of one event: time, status
    code, duration, error, response body.

    DELIVERY is a delivery id as `sessionhook deliveries` shows it (`12` or `#12`); EVENT
    an event id (`evt_…`, the webhook-id): all its deliveries, every endpoint and replay.
    """
    if url is not None:
        refuse_store_options(config_path, db_path)
        from .remote_reads import remote_attempts

        kind, found, data = remote_attempts(url, token, target)
        if as_json:
            echo_json(data)
            return
        _print_attempts(kind, found)
        return
    from ..relay import ops as operator

    with reading_store(config_path, db_path) as store:
        event, found = operator.attempts(store, target)
    if as_json:
        from ..relay.ops.wire import attempts_json

        echo_json(attempts_json(event, found))
        return
    _print_attempts(None if event is None else (event.id, event.type), found)


def _print_attempts(
    event: tuple[str, str] | None, found: Sequence[tuple[DeliveryRow, Sequence[AttemptRow]]]
) -> None:
    """The text of ``attempts``: each delivery (of ``event``, its id and type, if given)
    with its attempts."""
    if event is not None and not found:
        click.echo(
            f"event {event[0]} ({event[1]}) has no delivery: no endpoint subscribed to it, "
            "or it was archived before the first start (see `sessionhook replay`)"
        )
    for i, (delivery, rows_) in enumerate(found):
        if i:
            click.echo("\n" + "-" * 40 + "\n")
        _show_attempts(delivery, rows_)


def _show_attempts(delivery: DeliveryRow, rows: Sequence[AttemptRow]) -> None:
    click.echo(
        render_fields(
            [
                ("delivery", delivery.id),
                ("event", f"{delivery.event_id} ({delivery.event_type})"),
                ("endpoint", delivery.endpoint),
                ("session", delivery.session_name),
                ("status", f"{delivery.status}, {counted(delivery.attempts, 'attempt')}"),
                ("waiting on", f"#{delivery.waiting_on}" if delivery.waiting_on else None),
            ]
        )
    )
    if not rows:
        click.echo("\nno attempt yet")
    for a in rows:
        click.echo("")
        click.echo(
            render_fields(
                [
                    (f"attempt {a.attempt}", stamp(a.started_at)),
                    ("status code", a.status_code if a.status_code is not None else "no answer"),
                    ("duration", f"{a.duration_ms:.0f} ms"),
                    ("error", a.error),
                    ("response", a.response_body),
                ]
            )
        )
