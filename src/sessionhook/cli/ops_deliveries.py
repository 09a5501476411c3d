"""``sessionhook status``, ``deliveries`` and ``attempts``: the delivery log, read-only
(the console shows the same rows); the plumbing is :mod:`.ops`'s."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import quote

import click

from ..relay.domain.delivery_states import DELIVERY_STATUSES
from ..wording import counted
from . import cli
from ._output import CliError, render_fields, render_table
from .ops import Where, age, json_option, operator_options, show, stamp, stamp_ago
from .remote import get, get_pages

if TYPE_CHECKING:
    from ..relay.domain.api_models import (
        ApiAttempt,
        ApiDelivery,
        ApiDeliveryAttempts,
        ApiDeliveryRow,
        ApiEventAttempts,
        ApiHistoryWalk,
        ApiRefused,
        ApiReplica,
        ApiStatus,
        ApiUpstream,
    )


# --------------------------------------------------------------------------- status


@cli.command("status")
@operator_options
@json_option
def status(where: Where, as_json: bool) -> None:
    """Endpoints (enabled or why not, backlog, last hour, last error) and upstream polling;
    with --url, of a running relay (its GET /v1/status)."""
    from ..relay.domain.api_models import ApiStatus

    if (url := where.relay()) is not None:
        answer = get(url, where.token, "/v1/status", ApiStatus)
    else:
        from ..relay import ops as operator
        from ..relay.ops.wire import status_answer

        now = time.time()
        with where.reading() as store:
            answer = status_answer(operator.status(store, now), now)
    show(answer, as_json, lambda: _print_status(answer))


def _print_status(status: ApiStatus) -> None:
    """The text of ``status``: the endpoints' table, then upstream and archive fields."""
    now, history = status.now, status.history_walk
    rows = []
    for ep in status.endpoints:
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
    up = status.upstream
    click.echo("")
    click.echo(
        render_fields(
            [
                ("last poll", stamp_ago(up.last_poll_at, now)),
                *_good_poll_rows(up, now),
                ("upstream, last hour", _upstream_line(up)),
                (
                    "archive",
                    f"{counted(status.sessions, 'session')}, "
                    f"{counted(status.activities, 'activity')}, "
                    f"{counted(status.events, 'event')}",
                ),
                ("history walk", _history_line(history)),
                (
                    "accounts",
                    ", ".join(
                        f"{name} ({counted(n, 'session')})" for name, n in status.accounts.items()
                    )
                    or "-",
                ),
                ("refused upstream", _refused_line(status.refused, now)),
                ("replicas", _replicas_line(status.replicas, now)),
                *_list_cut_rows(up),
            ]
        )
    )


def _replicas_line(replicas: Sequence[ApiReplica], now: float) -> str:
    """Running replicas and what each holds; then how many stopped or died lately.

    ``2 running: 3f2a@db1:812 (heartbeat 2 s ago; 4 in flight, 1 polls; poller:default),
    9c1e@db2:77 (...)``."""
    parts = []
    gone = {"stopped": 0, "dead": 0}
    for r in replicas:
        health = r.health
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


def _history_line(history: ApiHistoryWalk) -> str:
    """The history walk's progress: done / total and the time left at the recent pace."""
    if history.total == 0:
        return "none (nothing predates the first start, or backfill = true)"
    if history.remaining == 0:
        return f"done ({counted(history.total, 'session')} archived)"
    eta = history.eta_seconds
    left = "time left unknown yet" if eta is None else f"about {age(eta)} left"
    return f"{history.done} / {counted(history.total, 'session')} archived, {left}"


def _upstream_line(up: ApiUpstream) -> str:
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


def _good_poll_rows(up: ApiUpstream, now: float) -> list[tuple[str, str]]:
    """When a pass last succeeded: one row, or one per account when there are several (an
    account whose passes fail stands out)."""
    if len(up.accounts) < 2:
        return [("last good poll", stamp_ago(up.last_ok_poll_at, now))]
    return [
        (f"last good poll ({a.account})", stamp_ago(a.last_ok_poll_at, now)) for a in up.accounts
    ]


def _list_cut_rows(up: ApiUpstream) -> list[tuple[str, str]]:
    """A row per account whose session list goes on past ``poll.max_pages``, only while it
    does (the account named when there are several)."""
    several = len(up.accounts) > 1
    return [
        (
            f"session list ({a.account})" if several else "session list",
            f"cut at poll.max_pages: the newest {counted(a.list_cut, 'session')} followed, "
            "older ones not (raise poll.max_pages)",
        )
        for a in up.accounts
        if a.list_cut is not None
    ]


def _refused_line(refused: ApiRefused, now: float) -> str:
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
@operator_options
@click.option("--endpoint", metavar="NAME", help="Only this endpoint.")
@click.option("--status", "status_", type=click.Choice(DELIVERY_STATUSES), help="Only this status.")
@click.option("--session", metavar="SESSION", help="Only this session (sessions/…).")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1), help="At most.")
@json_option
def deliveries(
    where: Where,
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
    if (url := where.relay()) is not None:
        from ..relay.domain.api_models import ApiDeliveryPage

        filters = {"endpoint": endpoint, "status": status_, "session": session}
        params = {k: v for k, v in filters.items() if v is not None}
        rows = get_pages(url, where.token, "/v1/deliveries", ApiDeliveryPage, params, limit)
    else:
        from ..relay import ops as operator
        from ..relay.domain.rows import OPEN_STATUSES
        from ..relay.ops.wire import delivery_answer

        with where.reading() as store:
            if endpoint is not None:
                operator.find_endpoint(store, endpoint)  # a typo is an error, not "no match"
            found = operator.deliveries(
                store, endpoint=endpoint, status=status_, session=session, limit=limit
            )
            open_ = (r.id for r in found if r.status in OPEN_STATUSES)
            claims = operator.in_flight(store, now, open_)
        rows = [delivery_answer(row, claims.get(row.id)) for row in found]
    show(rows, as_json, lambda: _print_deliveries(rows, now), empty="no deliveries match")


def _print_deliveries(rows: Sequence[ApiDelivery], now: float) -> None:
    """The table of ``deliveries``: one row a delivery."""
    from ..relay.domain.rows import OPEN_STATUSES

    table = []
    for d in rows:
        if d.claimed_by is not None and d.claimed_at is not None:
            # A live replica holds it (see status: replicas).
            when = f"in flight on {d.claimed_by} for {age(now - d.claimed_at)}"
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
@operator_options
@json_option
def attempts(target: str, where: Where, as_json: bool) -> None:
    """Every attempt of one delivery, or of every delivery of one event: time, status
    code, duration, error, response body.

    DELIVERY is a delivery id as `sessionhook deliveries` shows it (`12` or `#12`); EVENT
    an event id (`evt_…`, the webhook-id): all its deliveries, every endpoint and replay.
    """
    if (url := where.relay()) is not None:
        event, answer = _remote_attempts(url, where.token, target)
    else:
        from ..relay import ops as operator
        from ..relay.ops.wire import attempts_answer

        with where.reading() as store:
            row, found = operator.attempts(store, target)
        event = None if row is None else (row.id, row.type)
        answer = attempts_answer(row, found)
    show(answer, as_json, lambda: _print_attempts(event, answer))


def _remote_attempts(
    url: str, token: str | None, target: str
) -> tuple[tuple[str, str] | None, ApiDeliveryAttempts | ApiEventAttempts]:
    """``attempts`` of a delivery (``GET /v1/deliveries/{id}``) or of every delivery of an
    event (``GET /v1/events/{id}``, then each of its deliveries): the event's id and type
    (``None`` for a delivery), and what the local command finds."""
    from ..relay.domain.api_models import (
        ApiDeliveryAttempts,
        ApiEventAttempts,
        ApiEventDetail,
    )

    key = target.strip().removeprefix("#")
    if key.isdigit():
        return None, get(url, token, f"/v1/deliveries/{key}", ApiDeliveryAttempts)
    try:
        detail = get(url, token, f"/v1/events/{quote(key, safe='')}", ApiEventDetail)
    except CliError as exc:
        if not exc.message.startswith("no event "):
            raise
        # Neither a delivery id nor an archived event: what the local command says.
        raise CliError(f"no delivery or event {target!r}", hint=exc.hint) from None
    ids = sorted(d.id for d in detail.deliveries)
    blocks = [get(url, token, f"/v1/deliveries/{i}", ApiDeliveryAttempts) for i in ids]
    event = detail.event
    return (event.id, event.type), ApiEventAttempts(event=event.id, deliveries=blocks)


def _print_attempts(
    event: tuple[str, str] | None, answer: ApiDeliveryAttempts | ApiEventAttempts
) -> None:
    """The text of ``attempts``: each delivery (of ``event``, its id and type, if given)
    with its attempts."""
    from ..relay.domain.api_models import ApiEventAttempts

    found = answer.deliveries if isinstance(answer, ApiEventAttempts) else [answer]
    if event is not None and not found:
        click.echo(
            f"event {event[0]} ({event[1]}) has no delivery: no endpoint subscribed to it, "
            "or it was archived before the first start (see `sessionhook replay`)"
        )
    for i, block in enumerate(found):
        if i:
            click.echo("\n" + "-" * 40 + "\n")
        _show_attempts(block.delivery, block.attempts)


def _show_attempts(delivery: ApiDeliveryRow, rows: Sequence[ApiAttempt]) -> None:
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
