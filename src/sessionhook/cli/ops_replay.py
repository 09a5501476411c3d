"""``sessionhook replay``: deliver archived events again (same webhook-id and body).

A view of :func:`sessionhook.relay.ops.replay`; the plumbing is :mod:`.ops`'s.
"""

from __future__ import annotations

import click

from . import cli
from .ops import ProgressCounter, reported, store_options, time_option, writing_store

__all__ = ["replay"]


@cli.command("replay")
@store_options
@click.option("--endpoint", required=True, metavar="NAME", help="Deliver again to this endpoint.")
@click.option(
    "--since",
    callback=time_option,
    metavar="TIME",
    help="Events from this time (RFC 3339 or 2h, 7d ago).",
)
@click.option(
    "--until",
    callback=time_option,
    metavar="TIME",
    help="...up to this time (exclusive; default now).",
)
@click.option("--event", "event_ids", multiple=True, metavar="ID", help="This event (repeat).")
@click.option("--type", "type_glob", metavar="GLOB", help="Only types matching, e.g. 'activity.*'.")
@click.option("--session", metavar="SESSION", help="Only this session.")
@reported
def replay(
    config_path: str | None,
    db_path: str | None,
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
    """
    from ..relay import ops as operator

    if bool(event_ids) == (since is not None):
        raise click.UsageError("give either --since (with an optional --until) or --event IDs")
    if until is not None and since is None:
        raise click.UsageError("--until needs --since")
    counter = ProgressCounter(f"queued for {endpoint}")
    with writing_store(config_path, db_path) as store:
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
    reason = f": {result.reason}" if result.reason else ""
    click.echo(f"queued {result.queued} deliveries to {endpoint}{reason}")
    if not result.endpoint.active:
        why = result.endpoint.disabled_reason or "it is not enabled in the config"
        click.echo(
            f"note: {endpoint} is disabled ({why}); they go out after "
            f"`sessionhook endpoints enable {endpoint}`",
            err=True,
        )
