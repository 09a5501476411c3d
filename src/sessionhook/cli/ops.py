"""The operator's commands: ``replay``, ``endpoints``, ``events``, ``secret`` and ``verify``
here; ``status``, ``deliveries`` and ``attempts`` in :mod:`.ops_deliveries`, on the same
plumbing (defined here).

They read the daemon's SQLite file directly and are safe while it runs: read commands open
it read-only (WAL gives them a consistent snapshot), write commands (``replay``,
``endpoints enable|disable``) take short write transactions that the daemon's busy timeout
waits out. The database is found through the daemon's configuration (``--config``, default
``$SESSIONHOOK_CONFIG``, else ``/etc/sessionhook/config.toml``) or given with ``--db``.

Times (``--since``, ``--until``) are RFC 3339 (UTC when no offset is given) or an age such
as ``90s``, ``30m``, ``2h``, ``7d``. Every failure is one line on stderr and a non-zero exit
status; a bad configuration exits 2.
"""

from __future__ import annotations

import functools
import json
import re
import secrets as _random
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Final, TypeVar

import click
import httpx

from ..api.models import Session, parse_timestamp
from ..redact import redact_userinfo
from ..relay import render
from ..relay.config import Config, ConfigError, load_config
from ..relay.dispatch import post_event
from ..relay.events import EVENT_TYPES, matches, session_summary
from ..relay.pinning import PinnedTransport
from ..relay.retry import AttemptResult
from ..relay.signing import SignatureError, generate_keypair, generate_secret, verify
from ..relay.store import EndpointState, EventRow, Store, StoreError
from . import cli
from ._output import (
    DEFAULT_CONFIG,
    ENV_CONFIG,
    CliError,
    current_runtime,
    echo_json,
    handle_errors,
    register_user_error,
    render_fields,
    render_table,
)
from ._output import config_path as _config_file
from ._output import run as run_async

__all__ = [
    "DEFAULT_CONFIG",
    "ENV_CONFIG",
    "endpoints",
    "events",
    "parse_headers",
    "parse_time",
    "ping_event",
    "replay",
    "replay_events",
    "secret",
    "verify_command",
]

#: Events queued per replay transaction: short write locks next to a running daemon.
REPLAY_CHUNK: Final = 1000
#: Type of the event ``endpoints test`` sends (never archived, never retried).
PING_TYPE: Final = "ping"
DELIVERY_STATUSES: Final = ("pending", "failed", "dead", "delivered")

register_user_error(ConfigError, exit_code=2)
register_user_error(StoreError, exit_code=1)

_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")


# --------------------------------------------------------------------------- parsing

_AGE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$", re.IGNORECASE)
_UNIT_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_time(text: str, now: float) -> float:
    """Unix seconds from RFC 3339 (``2026-11-22T12:00:00Z``; UTC without an offset), a date,
    ``now``, or an age before ``now`` (``90s``, ``30m``, ``2h``, ``7d``, ``1w``)."""
    if text.strip().lower() == "now":
        return now
    if match := _AGE.match(text):
        return now - float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
    try:
        return parse_timestamp(text).timestamp()
    except ValueError:
        raise ValueError(
            f"{text!r} is neither RFC 3339 (2026-11-22T12:00:00Z) nor an age (30m, 2h, 7d)"
        ) from None


def _time_option(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """click callback: an option's TIME text as Unix seconds (a usage error when malformed)."""
    if value is None:
        return None
    try:
        return parse_time(value, time.time())
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def parse_headers(text: str) -> dict[str, str]:
    """Headers from a JSON object, or from ``Name: value`` lines as captured from a request
    (a request or status line such as ``POST /hook HTTP/1.1`` and blank lines are skipped)."""
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"headers file is not valid JSON: {exc.msg} (line {exc.lineno})"
            ) from None
        if not isinstance(data, dict):
            raise ValueError("headers JSON must be an object of name -> value")
        return {str(k).strip().lower(): str(v).strip() for k, v in data.items()}
    headers: dict[str, str] = {}
    for raw in stripped.splitlines():
        line = raw.strip()
        if not line or " HTTP/" in line or line.startswith("HTTP/"):
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip() or " " in name.strip():
            raise ValueError(f"not a 'name: value' header line: {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return headers


# --------------------------------------------------------------------------- rendering


def _age(seconds: float | None) -> str:
    """``42s``, ``5m``, ``3h 20m``, ``2d 4h``; empty for ``None``."""
    if seconds is None:
        return ""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def _stamp(ts: float | None) -> str:
    """Unix seconds as ``2026-11-22T12:00:03Z``; empty for ``None``."""
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stamp_ago(ts: float | None, now: float) -> str:
    return "never" if ts is None else f"{_stamp(ts)} ({_age(now - ts)} ago)"


def _event_json(row: EventRow) -> dict[str, Any]:
    return {
        "seq": row.seq,
        "id": row.id,
        "type": row.type,
        "session": row.session_name,
        "activity": row.activity_name,
        "occurred_at": row.occurred_at,
        "archived_at": _stamp(row.created_at),
        "body": row.payload(),
    }


# --------------------------------------------------------------------------- plumbing


@dataclass(frozen=True)
class _Target:
    """Where the database is, and the config it was found through (if any)."""

    db: Path
    config: Config | None
    config_path: str | None


def _store_options(fn: _F) -> _F:
    fn = click.option(
        "--db",
        "db_path",
        metavar="PATH",
        help="The SQLite database (default: store.path of the config).",
    )(fn)
    fn = click.option(
        "--config",
        "config_path",
        metavar="FILE",
        help=f"The daemon's config (default: ${ENV_CONFIG}, else {DEFAULT_CONFIG}).",
    )(fn)
    return fn


def _json_option(fn: _F) -> _F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")(fn)


def _reported(fn: Callable[..., None]) -> Callable[..., None]:
    """Run the command body with every expected failure reported as one line."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        with handle_errors():
            try:
                fn(*args, **kwargs)
            except sqlite3.Error as exc:
                raise CliError(
                    f"database error: {exc}", hint="is the file a sessionhook database?"
                ) from None

    return wrapper


def _target(config_path: str | None, db_path: str | None, *, need_config: bool = False) -> _Target:
    if db_path is not None and not need_config:
        return _Target(Path(db_path), None, None)
    path = _config_file(config_path)
    # Only `endpoints test` needs secrets, and only the endpoints': it never calls the API.
    config = load_config(path, resolve_secrets=need_config, need_api_key=False)
    return _Target(Path(db_path) if db_path else config.store.path, config, path)


def _require_db(target: _Target) -> None:
    if not target.db.is_file():
        via = f"--config {target.config_path}" if target.config_path else f"--db {target.db}"
        raise CliError(
            f"no database at {target.db} — has `sessionhook run` started with this config?",
            hint=f"found through {via}",
        )


@contextmanager
def _reading(config_path: str | None, db_path: str | None) -> Iterator[Store]:
    target = _target(config_path, db_path)
    _require_db(target)
    with Store.open_readonly(target.db) as store:
        yield store


@contextmanager
def _writing(config_path: str | None, db_path: str | None) -> Iterator[Store]:
    target = _target(config_path, db_path)
    _require_db(target)  # never create an empty database by mistake
    with Store.open(target.db) as store:
        yield store


def _known_endpoint(store: Store, name: str) -> EndpointState:
    states = store.endpoint_states()
    for state in states:
        if state.name == name:
            return state
    known = ", ".join(state.name for state in states) or "none yet"
    raise CliError(f"no endpoint named {name!r} in the database (known: {known})")


class _Counter:
    """A one-line progress counter on stderr when it is a terminal; silent otherwise."""

    def __init__(self, label: str, stream: IO[str] | None = None) -> None:
        self._label = label
        self._stream = sys.stderr if stream is None else stream
        isatty = getattr(self._stream, "isatty", None)
        self.enabled = bool(callable(isatty) and isatty())
        self.count = 0

    def add(self, n: int) -> None:
        self.count += n
        if self.enabled:
            self._stream.write(f"\r{self._label}: {self.count}")
            self._stream.flush()

    def done(self) -> None:
        if self.enabled:
            self._stream.write("\n")
            self._stream.flush()


# --------------------------------------------------------------------------- replay


def replay_events(
    store: Store,
    reader: Store,
    endpoint: str,
    *,
    since: float | None,
    until: float | None,
    type_glob: str | None,
    session: str | None,
    on_progress: Callable[[int], None] = lambda n: None,
    chunk: int = REPLAY_CHUNK,
) -> int:
    """Queue the archived events matching the filters for ``endpoint``, ``chunk`` at a time.

    ``reader`` (a read-only store on the same file) streams the matching event ids; each
    chunk is queued by ``store.replay`` in its own short transaction, so a replay of a
    million events never holds the write lock long enough to stall the running daemon.
    Returns how many deliveries were queued (events the endpoint does not subscribe to,
    or that are already on their way, are not).
    """
    total = 0
    ids: list[str] = []

    def flush() -> None:
        nonlocal total
        queued = store.replay(endpoint, event_ids=list(ids))
        total += queued
        on_progress(queued)
        ids.clear()

    for row in reader.iter_events(session, type_glob, since, until=until):
        ids.append(row.id)
        if len(ids) >= chunk:
            flush()
    if ids:
        flush()
    return total


@cli.command("replay")
@_store_options
@click.option("--endpoint", required=True, metavar="NAME", help="Deliver again to this endpoint.")
@click.option(
    "--since",
    callback=_time_option,
    metavar="TIME",
    help="Events from this time (RFC 3339 or 2h, 7d ago).",
)
@click.option(
    "--until",
    callback=_time_option,
    metavar="TIME",
    help="...up to this time (exclusive; default now).",
)
@click.option("--event", "event_ids", multiple=True, metavar="ID", help="This event (repeat).")
@click.option("--type", "type_glob", metavar="GLOB", help="Only types matching, e.g. 'activity.*'.")
@click.option("--session", metavar="SESSION", help="Only this session.")
@_reported
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
    if bool(event_ids) == (since is not None):
        raise click.UsageError("give either --since (with an optional --until) or --event IDs")
    if until is not None and since is None:
        raise click.UsageError("--until needs --since")
    with _writing(config_path, db_path) as store:
        state = _known_endpoint(store, endpoint)
        if event_ids:
            missing = [i for i in event_ids if store.get_event(i) is None]
            if missing:
                raise CliError(f"no archived event {', '.join(missing)}")
            queued = store.replay(
                endpoint, event_ids=list(event_ids), type_glob=type_glob, session=session
            )
        else:
            counter = _Counter(f"queued for {endpoint}")
            try:
                with Store.open_readonly(store.path) as reader:
                    queued = replay_events(
                        store,
                        reader,
                        endpoint,
                        since=since,
                        until=until,
                        type_glob=type_glob,
                        session=session,
                        on_progress=counter.add,
                    )
            finally:
                counter.done()
    click.echo(f"queued {queued} deliveries to {endpoint}")
    if not state.active:
        why = state.disabled_reason or "it is not enabled in the config"
        click.echo(
            f"note: {endpoint} is disabled ({why}); they go out after "
            f"`sessionhook endpoints enable {endpoint}`",
            err=True,
        )


# --------------------------------------------------------------------------- endpoints


@cli.group("endpoints")
def endpoints() -> None:
    """Webhook endpoints: list, enable, disable, test."""


@endpoints.command("list")
@_store_options
@_json_option
@_reported
def endpoints_list(config_path: str | None, db_path: str | None, as_json: bool) -> None:
    """Every endpoint the daemon knows, with its state and backlog."""
    now = time.time()
    with _reading(config_path, db_path) as store:
        states = store.endpoint_states()
        backlog = store.outbox_stats()
    if as_json:
        echo_json([{**asdict(s), "pending": backlog.get(s.name, (0, None))[0]} for s in states])
        return
    if not states:
        click.echo("no endpoints yet (the daemon adds them from its config when it starts)")
        return
    rows = []
    for s in states:
        if not s.configured:
            state = "not in config"
        elif s.enabled:
            state = "enabled"
        else:
            state = f"disabled {_age(now - s.disabled_at) + ' ago' if s.disabled_at else ''}"
        rows.append(
            [
                s.name,
                state.strip(),
                backlog.get(s.name, (0, None))[0],
                _stamp(s.last_success_at) or "never",
                f"{_age(now - s.failing_since)}" if s.failing_since else "",
                s.disabled_reason,
                s.url,
            ]
        )
    headers = ["NAME", "STATE", "PENDING", "LAST SUCCESS", "FAILING FOR", "REASON", "URL"]
    click.echo(render_table(headers, rows))


@endpoints.command("enable")
@click.argument("name")
@_store_options
@_reported
def endpoints_enable(name: str, config_path: str | None, db_path: str | None) -> None:
    """Enable NAME again; what waited for it (and replays) is delivered."""
    with _writing(config_path, db_path) as store:
        _known_endpoint(store, name)
        store.set_endpoint_enabled(name, True)
        waiting = store.pending_count(name)
    click.echo(f"endpoint {name} enabled; {waiting} deliveries waiting")


@endpoints.command("disable")
@click.argument("name")
@click.option("--reason", default="disabled by an operator", show_default=True)
@_store_options
@_reported
def endpoints_disable(name: str, reason: str, config_path: str | None, db_path: str | None) -> None:
    """Stop delivering to NAME; its events keep being archived (replay them later)."""
    with _writing(config_path, db_path) as store:
        _known_endpoint(store, name)
        store.set_endpoint_enabled(name, False, reason)
    click.echo(f"endpoint {name} disabled: {reason}")


def ping_event(endpoint: str, now: float) -> tuple[str, bytes]:
    """A fresh ``(event id, body)`` for ``endpoints test``: never archived, unique id.

    The body has the envelope of every event (``type``, ``timestamp``, ``data.session``),
    with an empty session, so that a consumer written against the documented shape does
    not fail on the ping itself and the answer reflects its reachability and signature
    check; ``type`` is ``ping``, which a consumer can acknowledge and ignore.
    """
    event_id = "evt_" + _random.token_hex(16)
    body = {
        "type": PING_TYPE,
        "timestamp": datetime.fromtimestamp(now, UTC).isoformat().replace("+00:00", "Z"),
        "data": {
            "session": session_summary(Session(name="")),
            "endpoint": endpoint,
            "message": "sessionhook endpoints test",
        },
    }
    return event_id, json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


@endpoints.command("test")
@click.argument("name")
@click.option("--config", "config_path", metavar="FILE", help="The daemon's config.")
@_reported
def endpoints_test(name: str, config_path: str | None) -> None:
    """Send NAME a signed `ping` event and show the answer (exit 1 unless 2xx).

    Signed with the endpoint's secret(s) from the config, like every delivery, shaped by
    its payload/format/template, and subject to the same address check. The ping does not
    enter the outbox.
    """
    target = _target(config_path, None, need_config=True)
    assert target.config is not None
    config = target.config
    endpoint = config.endpoint_by_name(name)
    if endpoint is None:
        known = ", ".join(e.name for e in config.endpoints) or "none"
        raise CliError(f"no endpoint named {name!r} in {target.config_path} (known: {known})")
    event_id, body = ping_event(name, time.time())
    try:
        # Shaped like the endpoint's deliveries: a chat webhook gets a chat message.
        body, content_type = render.render(event_id, body, endpoint.shape)
    except render.RenderError as exc:
        raise CliError(f"{name}: the ping does not render: {exc}") from None
    timeout = config.delivery.timeout
    runtime = current_runtime()
    # The daemon's transport: the name is resolved once, every address vetted, and the
    # connection made to a vetted address (a literal private URL failed loading the config).
    transport = runtime.transport or PinnedTransport(
        allow_private=config.delivery.allow_private_networks,
        resolve=runtime.resolve,
        policy=runtime.address_policy,
    )

    async def send() -> AttemptResult:
        async with httpx.AsyncClient(
            transport=transport, timeout=httpx.Timeout(timeout), follow_redirects=False
        ) as http:
            # The one place that signs and POSTs, shared with the dispatcher.
            return await post_event(
                http,
                url=endpoint.url,
                secrets=[s.get_secret_value() for s in endpoint.secrets],
                event_id=event_id,
                body=body,
                timeout=timeout,
                body_limit=config.delivery.response_body_limit,
                content_type=content_type,
            )

    result = run_async(send)
    answer = "no answer" if result.status_code is None else str(result.status_code)
    click.echo(f"POST {redact_userinfo(endpoint.url)}  webhook-id {event_id}")
    click.echo(
        render_fields(
            [
                ("answer", answer),
                ("duration", f"{result.duration_ms:.0f} ms"),
                ("error", result.error),
                ("response", result.response_body),
            ]
        )
    )
    if not result.ok:
        raise CliError(f"{name} did not accept the ping ({result.error or answer})")


# --------------------------------------------------------------------------- events


@cli.command("events")
@_store_options
@click.option("--session", metavar="SESSION", help="Only this session.")
@click.option("--type", "type_glob", metavar="GLOB", help="Only types matching, e.g. 'session.*'.")
@click.option(
    "--since",
    callback=_time_option,
    metavar="TIME",
    help="Events from this time (RFC 3339 or 2h, 7d ago).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "ndjson"]),
    default="table",
    show_default=True,
    help="ndjson streams one event per line, whatever the size of the archive.",
)
@click.option("--limit", type=click.IntRange(1), help="At most this many (oldest first).")
@_reported
def events(
    config_path: str | None,
    db_path: str | None,
    session: str | None,
    type_glob: str | None,
    since: float | None,
    fmt: str,
    limit: int | None,
) -> None:
    """The event archive, oldest first, with the exact bodies that were delivered."""
    if type_glob and not any(matches([type_glob], t) for t in EVENT_TYPES):
        click.echo(f"note: {type_glob!r} matches no known event type", err=True)
    with _reading(config_path, db_path) as store:
        rows: Iterator[EventRow] = store.iter_events(session, type_glob, since)
        if limit is not None:
            rows = _take(rows, limit)
        if fmt == "ndjson":
            for row in rows:
                click.echo(json.dumps(_event_json(row), ensure_ascii=False))
        elif fmt == "json":
            # Streamed too: one element at a time, valid JSON once complete.
            click.echo("[", nl=False)
            for i, row in enumerate(rows):
                click.echo(("," if i else "") + "\n  " + json.dumps(_event_json(row)), nl=False)
            click.echo("\n]")
        else:
            table = [
                [r.seq, r.occurred_at, r.type, r.session_name, r.id, r.activity_name] for r in rows
            ]
            if not table:
                click.echo("no events match")
                return
            headers = ["SEQ", "OCCURRED", "TYPE", "SESSION", "EVENT", "ACTIVITY"]
            click.echo(render_table(headers, table))


def _take(rows: Iterator[_T], n: int) -> Iterator[_T]:
    for i, row in enumerate(rows):
        if i >= n:
            return
        yield row


# --------------------------------------------------------------------------- secrets


@cli.group("secret")
def secret() -> None:
    """Webhook signing secrets."""


@secret.command("generate")
@click.option(
    "--asymmetric",
    is_flag=True,
    help='An ed25519 pair for signature = "v1a": the whsk_ signing key on stdout (the '
    "endpoint's secret), its whpk_ public key for consumers on stderr.",
)
def secret_generate(asymmetric: bool) -> None:
    """Print a new random `whsec_` secret (for an endpoint's secret file)."""
    if asymmetric:
        signing_key, public_key = generate_keypair()
        click.echo(signing_key)
        click.echo(f"public key for consumers: {public_key}", err=True)
        return
    click.echo(generate_secret())


@secret.command("token")
def secret_token() -> None:
    """Print a new random bearer token for the web console and the event stream
    (`[server] token_file` / `token_env`): 43 URL-safe characters, 256 bits."""
    click.echo(_random.token_urlsafe(32))


@cli.command("verify")
@click.option(
    "--secret",
    "secret_text",
    required=True,
    envvar="SESSIONHOOK_SECRET",
    metavar="S",
    help="The endpoint's whsec_ secret or whpk_ public key (or $SESSIONHOOK_SECRET, kept "
    "out of shell history).",
)
@click.option(
    "--headers",
    "headers_file",
    required=True,
    type=click.File("r"),
    metavar="FILE",
    help="The request's headers: 'name: value' lines or a JSON object.",
)
@click.option("--tolerance", default=300, show_default=True, help="Seconds of clock skew allowed.")
@click.option(
    "--ignore-timestamp", is_flag=True, help="Check only the signature (an old captured request)."
)
@click.argument("body", type=click.File("rb"))
def verify_command(
    secret_text: str,
    headers_file: IO[str],
    tolerance: int,
    ignore_timestamp: bool,
    body: IO[bytes],
) -> None:
    """Check a captured webhook request as a consumer should: print `signature ok` (exit 0)
    or the reason it fails (exit 1). BODY is the raw body file, or - for standard input."""
    try:
        headers = parse_headers(headers_file.read())
    except ValueError as exc:
        raise CliError(str(exc), exit_code=2) from None
    raw = body.read()
    now: float | None = None
    if ignore_timestamp:
        try:
            now = float(headers.get("webhook-timestamp", ""))
        except ValueError:
            now = None  # verify reports the malformed timestamp itself
    try:
        verify(secret_text, headers, raw, tolerance=tolerance, now=now)
    except SignatureError as exc:
        hint = None
        if exc.reason.startswith("timestamp too"):
            hint = "--ignore-timestamp checks only the signature of an old capture"
        elif exc.reason == "no matching signature":
            hint = "wrong secret, or the body was altered (even a trailing newline counts)"
        raise CliError(f"signature invalid: {exc.reason}", hint=hint) from None
    except ValueError as exc:  # a secret that is not whsec_ + base64
        raise CliError(f"bad secret: {exc}", exit_code=2) from None
    click.echo("signature ok")
