"""``sessionhook replay``: deliver archived events again (same webhook-id and body).

A view of :func:`sessionhook.relay.ops.replay`; the plumbing is :mod:`.ops`'s.
"""

from __future__ import annotations

from urllib.parse import quote

import click

from ..wording import counted
from . import cli
from .ops import ProgressCounter, Where, operator_options, time_flag
from .remote import get, post, refuse_with_url


@cli.command("replay")
@operator_options
@click.option("--endpoint", required=True, metavar="NAME", help="Deliver again to this endpoint.")
@time_flag("--since", "Events from this time (RFC 3339 or 2h, 7d ago).")
@time_flag("--until", "...up to this time (exclusive; default now).")
@click.option("--event", "event_ids", multiple=True, metavar="ID", help="This event (repeat).")
@click.option("--type", "type_glob", metavar="GLOB", help="Only types matching, e.g. 'activity.*'.")
@click.option("--session", metavar="SESSION", help="Only this session.")
def replay(
    where: Where,
    endpoint: str,
    since: float | None,
    until: float | None,
    event_ids: tuple[str, ...],
    type_glob: str | None,
    session: str | None,
) -> None:
    """Deliver archived events again: same webhook-id and body, new attempts.

    Choose the events by time (--since, optionally --until) or by id (--event, repeated);
    --type and --session narrow either. Dead letters are replayed like any other event.
    Prints how many deliveries were queued; the running daemon sends them within a second.
    With --url, a running relay replays each --event (its API replays by id only).
    """
    from ..relay import ops as operator

    if (url := where.relay()) is not None:
        refuse_with_url(since=since, until=until, type=type_glob, session=session)
        if not event_ids:
            raise click.UsageError("with --url give --event IDs")
        queued, reason, active, why = _replay_remote(url, where.token, endpoint, event_ids)
        _print_replayed(endpoint, queued, reason, active, why)
        return
    if bool(event_ids) == (since is not None):
        raise click.UsageError("give either --since (with an optional --until) or --event IDs")
    if until is not None and since is None:
        raise click.UsageError("--until needs --since")
    counter = ProgressCounter(f"queued for {endpoint}")
    with where.writing() as store:
        try:
            result = operator.replay(
                store,
                endpoint,
                event_ids=event_ids,
                since=since,
                until=until,
                type_glob=type_glob,
                session=session,
                on_progress=counter.add if not event_ids else lambda n: None,
            )
        finally:
            counter.done()
    state = result.endpoint
    _print_replayed(endpoint, result.queued, result.reason, state.active, state.disabled_reason)


def _replay_remote(
    url: str, token: str | None, endpoint: str, event_ids: tuple[str, ...]
) -> tuple[int, str | None, bool, str | None]:
    """``POST /v1/events/{id}:replay`` of each event: how many were queued, the reason
    of the last that queued none, and whether the endpoint is active (and why not)."""
    from ..relay.domain.api_models import ApiEndpoint, ApiReplayed

    state = get(url, token, f"/v1/endpoints/{quote(endpoint, safe='')}", ApiEndpoint)
    queued, reason = 0, None
    for event_id in event_ids:
        path = f"/v1/events/{quote(event_id, safe='')}:replay"
        answer = post(url, token, path, ApiReplayed, {"endpoint": endpoint})
        queued += answer.queued
        reason = answer.reason or reason
    active = state.configured and state.enabled
    return queued, None if queued else reason, active, state.disabled_reason


def _print_replayed(
    endpoint: str, queued: int, reason: str | None, active: bool, disabled_reason: str | None
) -> None:
    """``queued N deliveries to E``, the reason when none, a note when E is not active."""
    because = f": {reason}" if reason else ""
    click.echo(f"queued {counted(queued, 'delivery')} to {endpoint}{because}")
    if not active:
        why = disabled_reason or "it is not enabled in the config"
        click.echo(
            f"note: {endpoint} is disabled ({why}); they go out after "
            f"`sessionhook endpoints enable {endpoint}`",
            err=True,
        )
