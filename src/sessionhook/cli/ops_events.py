"""``sessionhook events``: the event archive, and ``--follow`` to tail it live.

``--follow`` reads the store every :data:`FOLLOW_POLL` seconds after the last event printed
(a database out of reach is a note on stderr and a read again later, never the end), or
with ``--url`` a daemon's event stream, reconnecting with ``Last-Event-ID`` = the last
event printed, so nothing is missed or printed twice. Ctrl-C (or a closed pipe) stops it
with exit status 0 and no traceback.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Final

import click

from ..redact import redact_userinfo
from . import cli
from ._output import CliError, quiet_on_closed_pipe, render_table
from .ops import opened_store, reported, store_options, time_flag
from .remote import (
    check_url,
    error_message,
    need_token,
    refuse_store_options,
    refuse_with_url,
    token_options,
)
from .sse import SkippedEvent, StreamEvent, parse_sse

if TYPE_CHECKING:
    import httpx

    from ..relay.domain.api_models import ApiEvent
    from ..relay.ops import EventFilter

#: ``--follow`` on the store reads this often.
FOLLOW_POLL: Final = 0.5
#: Reconnection delays after a stream failure: doubling up to the last.
_BACKOFF: Final = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
#: No byte for this long (heartbeats come every 15 s): the connection is dead.
_READ_TIMEOUT: Final = 45.0


@cli.command("events")
@store_options
@click.option("--session", metavar="SESSION", help="Only this session.")
@click.option(
    "--type",
    "type_globs",
    multiple=True,
    metavar="GLOB",
    help="Only types matching, e.g. 'session.*' (repeat: any one).",
)
@time_flag("--since", "Events from this time (RFC 3339 or 2h, 7d ago).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "ndjson"]),
    default="table",
    show_default=True,
    help="ndjson streams one event per line, whatever the size of the archive.",
)
@click.option("--limit", type=click.IntRange(1), help="At most this many (oldest first).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events as they arrive.")
@click.option(
    "--last-event-id",
    metavar="ID",
    help="With --follow: start right after this event (a webhook-id).",
)
@click.option(
    "--url",
    metavar="URL",
    help="A daemon's [server] address, e.g. http://127.0.0.1:9187: its /v1/events (with "
    "--follow its event stream) instead of the store.",
)
@token_options("--url", whose="daemon")
@reported
def events(
    config_path: str | None,
    db_path: str | None,
    session: str | None,
    type_globs: tuple[str, ...],
    since: float | None,
    fmt: str,
    limit: int | None,
    follow: bool,
    last_event_id: str | None,
    url: str | None,
    token: str | None,
) -> None:
    """The event archive, oldest first, with the exact bodies that were delivered;
    --follow tails it live (from the store, or a daemon's event stream with --url)."""
    import anyio

    from ..relay.ops import EventFilter

    note_unknown_types(type_globs)
    wanted = EventFilter(type_globs, session)
    if not follow:
        if last_event_id:
            raise click.UsageError("--last-event-id goes with --follow")
        if url is not None:
            refuse_store_options(config_path, db_path)
            refuse_with_url(since=since)
            _print_events(_remote_events(url, token, wanted, limit), fmt)
            return
        _list(config_path, db_path, wanted, since, fmt, limit)
        return
    if fmt == "json":
        raise click.UsageError("--follow never ends: use --format ndjson or table")
    if limit is not None:
        raise click.UsageError("--limit does not go with --follow")
    try:
        with quiet_on_closed_pipe():
            if url is not None:
                if since is not None:
                    raise click.UsageError(
                        "--since reads the store; with --url use --last-event-id"
                    )
                token = need_token(token)
                anyio.run(_print_stream, check_url(url), token, wanted, last_event_id, fmt)
            else:
                _follow_store(config_path, db_path, wanted, since, last_event_id, fmt)
    except KeyboardInterrupt:
        pass  # Ctrl-C: the way to stop following


def note_unknown_types(globs: Iterable[str]) -> None:
    """A note on stderr for each type glob that matches no known event type (a typo?)."""
    from ..relay.domain.events import EVENT_TYPES, matches

    for glob in globs:
        if not any(matches([glob], t) for t in EVENT_TYPES):
            click.echo(f"note: {glob!r} matches no known event type", err=True)


def _list(
    config_path: str | None,
    db_path: str | None,
    wanted: EventFilter,
    since: float | None,
    fmt: str,
    limit: int | None,
) -> None:
    from ..relay import ops as operator
    from ..relay.ops.wire import event_answer

    # One glob is filtered by the store; several are matched here.
    single = wanted.types[0] if len(wanted.types) == 1 else None
    with opened_store(config_path, db_path, readonly=True) as store:
        rows = operator.events(store, session=wanted.session, type_glob=single, since=since)
        found = (event_answer(r) for r in rows if single is not None or wanted.matches(r.type))
        _print_events(islice(found, limit), fmt)


def _remote_events(
    url: str, token: str | None, wanted: EventFilter, limit: int | None
) -> Iterator[ApiEvent]:
    """``GET /v1/events`` as the local list reads the store: oldest first, at most
    ``limit`` of those ``wanted`` (one glob is the relay's filter, several are matched
    here, as locally)."""
    from ..relay.domain.api_models import ApiEventPage
    from .remote import iter_pages

    params = {} if wanted.session is None else {"session": wanted.session}
    if len(wanted.types) == 1:
        params["type"] = wanted.types[0]
    found = (
        item
        for item in iter_pages(url, token, "/v1/events", ApiEventPage, params)
        if len(wanted.types) < 2 or wanted.matches(item.type)
    )
    return islice(found, limit)


def _print_events(items: Iterator[ApiEvent], fmt: str) -> None:
    """What ``events`` prints of archived events as the API answers them, one at a time
    (an archive of any size)."""
    if fmt == "ndjson":
        for item in items:
            click.echo(json.dumps(item.model_dump(mode="json"), ensure_ascii=False))
    elif fmt == "json":
        # Streamed too: one element at a time, valid JSON once complete.
        click.echo("[", nl=False)
        for i, item in enumerate(items):
            click.echo(
                ("," if i else "") + "\n  " + json.dumps(item.model_dump(mode="json")), nl=False
            )
        click.echo("\n]")
    else:
        table = [[e.seq, e.occurred_at, e.type, e.session, e.id, e.activity] for e in items]
        if not table:
            click.echo("no events match")
            return
        headers = ["SEQ", "OCCURRED", "TYPE", "SESSION", "EVENT", "ACTIVITY"]
        click.echo(render_table(headers, table))


def _emit(line: str) -> None:
    click.echo(line)
    sys.stdout.flush()


def _line(occurred: str, event_type: str, session: str, event_id: str) -> str:
    return f"{occurred}  {event_type:<34} {session}  {event_id}"


def _follow_store(
    config_path: str | None,
    db_path: str | None,
    wanted: EventFilter,
    since: float | None,
    last_event_id: str | None,
    fmt: str,
) -> None:
    from ..relay import ops as operator
    from ..relay.ops import database_errors
    from ..relay.ops.wire import event_answer

    with opened_store(config_path, db_path, readonly=True) as store:
        start = operator.resume_position(store, last_event_id)
        if since is not None and last_event_id is None:
            start = 0  # the archive from --since first, then what comes
        follower = operator.Follower(start, wanted)
        failures = 0
        while True:
            try:
                page = follower.read(store, limit=500)
            except database_errors() as exc:
                # The database restarting or out of reach (PostgreSQL): wait and read on
                # from the same position; anything else is an error for the user.
                unreachable = store.unwritable_error(exc)
                if unreachable is None:
                    raise
                delay = _BACKOFF[min(failures, len(_BACKOFF) - 1)]
                failures += 1
                click.echo(f"note: {unreachable}; reading again in {delay:g} s", err=True)
                time.sleep(delay)
                continue
            failures = 0
            for row in page.events:
                if since is not None and row.occurred_ts < since:
                    continue
                if fmt == "ndjson":
                    shown = event_answer(row).model_dump(mode="json")
                    _emit(json.dumps(shown, ensure_ascii=False))
                else:
                    _emit(_line(row.occurred_at, row.type, row.session_name, row.id))
            if not page.more:
                time.sleep(FOLLOW_POLL)


# --------------------------------------------------------------------------- the stream


async def follow_stream(
    http: httpx.AsyncClient,
    url: str,
    token: str,
    wanted: EventFilter,
    last_event_id: str | None,
) -> AsyncIterator[StreamEvent | SkippedEvent]:
    """Every event of the daemon's stream at ``url``, forever, a message too large to take
    as a :class:`.sse.SkippedEvent`: after a failure it reconnects (backing off) with
    ``Last-Event-ID`` = the last event yielded. A 401 (wrong token) or 400 (unknown id,
    bad filter) is a :class:`CliError`: retrying would not help."""
    import anyio
    import httpx

    params: list[tuple[str, str | int | float | bool | None]] = [("type", g) for g in wanted.types]
    if wanted.session:
        params.append(("session", wanted.session))
    endpoint = url.rstrip("/") + "/v1/events/stream"
    last = last_event_id
    failures = 0
    while True:
        headers = {"authorization": f"Bearer {token}", "accept": "text/event-stream"}
        if last:
            headers["last-event-id"] = last
        problem: str
        try:
            async with http.stream("GET", endpoint, params=params, headers=headers) as answer:
                if answer.status_code in (400, 401, 403, 404):
                    await answer.aread()
                    raise CliError(f"{endpoint}: {answer.status_code} {error_message(answer)}")
                if answer.status_code != 200:
                    problem = f"answered {answer.status_code}"
                else:
                    failures = 0
                    async for event in parse_sse(answer.aiter_bytes()):
                        last = event.id or last
                        yield event
                    problem = "the stream ended"
        except httpx.HTTPError as exc:
            problem = f"{type(exc).__name__}: {exc}"
        delay = _BACKOFF[min(failures, len(_BACKOFF) - 1)]
        failures += 1
        shown = redact_userinfo(f"{endpoint}: {problem}")  # a URL's password stays unsaid
        click.echo(f"note: {shown}; reconnecting in {delay:g} s", err=True)
        await anyio.sleep(delay)


def stream_client() -> httpx.AsyncClient:
    """The HTTP client :func:`follow_stream` reads with: a connection that sends nothing,
    not even a heartbeat, for 45 s is taken for dead (and reconnected)."""
    import httpx

    timeout = httpx.Timeout(10.0, read=_READ_TIMEOUT)
    return httpx.AsyncClient(timeout=timeout, follow_redirects=False)


async def _print_stream(
    url: str, token: str, wanted: EventFilter, last_event_id: str | None, fmt: str
) -> None:
    async with stream_client() as http:
        async for event in follow_stream(http, url, token, wanted, last_event_id):
            if isinstance(event, SkippedEvent):
                click.echo(f"note: {event.note()}", err=True)
                continue
            body = event.payload()
            session = ((body.get("data") or {}).get("session") or {}).get("name") or ""
            if fmt == "ndjson":
                record = {"id": event.id, "type": event.type, "session": session, "body": body}
                _emit(json.dumps(record, ensure_ascii=False))
            else:
                _emit(_line(str(body.get("timestamp", "")), event.type, session, event.id))
