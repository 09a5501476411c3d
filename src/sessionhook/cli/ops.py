"""The operator commands' shared plumbing (the commands live in ``ops_*.py``, one module
per group, each a thin view of :mod:`sessionhook.relay.ops`, which the console uses too).

They read the daemon's store, found through ``--config`` (default ``$SESSIONHOOK_CONFIG``,
else ``/etc/sessionhook/config.toml``) or given with ``--db``, and are safe while it runs:
read commands open it read-only, write commands take short write transactions that the
daemon's busy timeout waits out. With ``--url`` they ask a running relay's API instead
(:mod:`.remote`). Every failure is one line on stderr and a non-zero exit status.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click

from ._output import (
    DEFAULT_CONFIG,
    ENV_CONFIG,
    CliError,
    echo_json,
    handle_errors,
    load_daemon_config,
    register_user_error,
)
from .remote import refuse_store_options, remote_option_pair

if TYPE_CHECKING:
    # The relay (config, store, operator: most of a second of CPU) is imported by the
    # command that runs, not by `sessionhook --help` or another group's command.
    from ..relay.config import Config
    from ..relay.domain.api_models import ApiModel
    from ..relay.ops import StoreCore

_F = TypeVar("_F", bound=Callable[..., Any])


def _relay_errors() -> tuple[type[Exception], ...]:
    """Register the relay's user errors (one line each) and return the database errors
    (when a command starts: it imports the relay anyway)."""
    import logging

    from ..relay.config import ConfigError
    from ..relay.ops import OperatorError, StoreError, UnknownEndpointError, database_errors

    # psycopg's pool logs each failed (re)connection at WARNING, which Python would print
    # raw on a terminal: a command reports an unreachable database itself, in one line. (A
    # handler here only keeps the last-resort printer away: the daemon's own log still
    # gets them.)
    logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())
    register_user_error(ConfigError, exit_code=2)
    register_user_error(StoreError, exit_code=1)
    register_user_error(OperatorError, exit_code=1)
    register_user_error(UnknownEndpointError, exit_code=2)  # a bad argument, like a typo
    return database_errors()


# --------------------------------------------------------------------------- parsing


def time_flag(flag: str, help: str) -> Callable[[_F], _F]:
    """``flag TIME``, given to the command as Unix seconds (:func:`time_option`)."""
    return click.option(flag, callback=time_option, metavar="TIME", help=help)


def time_option(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """click callback: an option's TIME text as Unix seconds (a usage error when malformed):
    RFC 3339, ``now``, or an age (``90s``, ``2h``, ``7d``), the API's spelling."""
    from ..relay.ops.wire import parse_moment

    if value is None:
        return None
    try:
        return parse_moment(value, time.time())
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


def age(seconds: float | None) -> str:
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


def stamp(ts: float | None) -> str:
    """Unix seconds as ``2026-11-22T12:00:03Z``; empty for ``None``."""
    if ts is None:
        return ""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stamp_ago(ts: float | None, now: float) -> str:
    """:func:`stamp` and how long before ``now`` it was; ``never`` for ``None``."""
    return "never" if ts is None else f"{stamp(ts)} ({age(now - ts)} ago)"


def show(
    answer: ApiModel | Sequence[ApiModel] | dict[str, Any],
    as_json: bool,
    text: str | Callable[[], None],
    *,
    empty: str = "",
) -> None:
    """With ``--json`` the answer as the API's JSON (moments RFC 3339), else ``text``: a
    line, or what prints the answer for people; ``empty`` (if given) for an empty list."""
    from ..relay.domain.api_models import api_data

    if as_json:
        echo_json(answer if isinstance(answer, dict) else api_data(answer))
    elif empty and isinstance(answer, Sequence) and not answer:
        click.echo(empty)
    elif isinstance(text, str):
        click.echo(text)
    else:
        text()


# --------------------------------------------------------------------------- plumbing


@dataclass(frozen=True)
class StoreTarget:
    """Where the database is, and the config it was found through (if any)."""

    path: Path
    config: Config | None
    config_path: str | None

    def database_url(self) -> str | None:
        """The PostgreSQL store of the config (``--db`` always names a SQLite file)."""
        if self.config is None or self.path != self.config.store.path:
            return None
        return self.config.store.database_url()

    @property
    def pool_size(self) -> int:
        return 2 if self.config is None else self.config.store.pool_size


def store_options(fn: _F) -> _F:
    """``--db`` and ``--config``: where an operator command finds the store."""
    fn = click.option(
        "--db",
        "db_path",
        metavar="PATH",
        help="A SQLite database file (default: the store of the config).",
    )(fn)
    fn = click.option(
        "--config",
        "config_path",
        metavar="FILE",
        help=f"The daemon's config (default: ${ENV_CONFIG}, else {DEFAULT_CONFIG}).",
    )(fn)
    return fn


def json_option(fn: _F) -> _F:
    """``--json``: print JSON for scripts (``as_json``)."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")(fn)


def reported(fn: Callable[..., None]) -> Callable[..., None]:
    """Run the command body with every expected failure reported as one line."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        database_errors = _relay_errors()
        with handle_errors():
            try:
                fn(*args, **kwargs)
            except database_errors as exc:
                raise CliError(
                    f"database error: {exc}", hint="is the file a sessionhook database?"
                ) from None

    return wrapper


@dataclass(frozen=True)
class Where:
    """Where an operator command reads and writes: the store (``--config``, ``--db``) or,
    with ``--url``, a running relay's API (``--token``)."""

    config_path: str | None
    db_path: str | None
    url: str | None
    token: str | None

    def relay(self) -> str | None:
        """``--url`` (a usage error beside ``--config`` or ``--db``), ``None`` without it."""
        if self.url is not None:
            refuse_store_options(self.config_path, self.db_path)
        return self.url

    def reading(self) -> AbstractContextManager[StoreCore]:
        return opened_store(self.config_path, self.db_path, readonly=True)

    def writing(self) -> AbstractContextManager[StoreCore]:
        return opened_store(self.config_path, self.db_path, readonly=False)


def _where_options(flag: str, name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        @store_options
        @remote_option_pair(flag, name)
        @functools.wraps(fn)
        def wrapper(
            *args: Any,
            config_path: str | None,
            db_path: str | None,
            token: str | None,
            **kwargs: Any,
        ) -> None:
            url = kwargs.pop(name)
            fn(*args, where=Where(config_path, db_path, url, token), **kwargs)

        return reported(wrapper)

    return decorate


#: ``--config``, ``--db``, ``--url`` and ``--token``, given to the command as one
#: ``where: Where``; its failures reported as one line (:func:`reported`).
operator_options = _where_options("--url", "url")
#: :data:`operator_options` with ``--relay-url`` (``endpoints create|update``, whose
#: ``--url`` is the endpoint's).
relay_url_operator_options = _where_options("--relay-url", "relay_url")


def store_target(
    config_path: str | None, db_path: str | None, *, secrets_of: str | None = None
) -> StoreTarget:
    """The store ``--db`` names, else the one of the config (loaded). ``secrets_of``: the
    endpoint whose secret is read too (the config is then loaded even with ``--db``); no
    other secret is: a command reads only what it uses."""
    if db_path is not None and secrets_of is None:
        return StoreTarget(Path(db_path), None, None)
    # Only `endpoints test` needs a secret, and only its endpoint's: it never calls the API.
    config, path = load_daemon_config(
        config_path,
        resolve_secrets=secrets_of is not None,
        need_api_key=False,
        endpoint_secrets=None if secrets_of is None else (secrets_of,),
    )
    return StoreTarget(Path(db_path) if db_path else config.store.path, config, path)


@contextmanager
def opened_store(
    config_path: str | None, db_path: str | None, *, readonly: bool
) -> Iterator[StoreCore]:
    """The store, read-only or for short write transactions; it must exist (never create
    an empty database by mistake)."""
    from ..relay.ops import operator_store

    target = store_target(config_path, db_path)
    if target.database_url() is None and not target.path.is_file():
        via = f"--config {target.config_path}" if target.config_path else f"--db {target.path}"
        raise CliError(
            f"no database at {target.path} — has `sessionhook run` started with this config?",
            hint=f"found through {via}",
        )
    with operator_store(target, readonly=readonly) as store:
        yield store


class ProgressCounter:
    """A one-line progress counter on stderr when it is a terminal; silent otherwise."""

    def __init__(self, label: str, stream: IO[str] | None = None) -> None:
        self._label = label
        self._stream = sys.stderr if stream is None else stream
        isatty = getattr(self._stream, "isatty", None)
        self.enabled = bool(callable(isatty) and isatty())
        self.count = 0

    def add(self, n: int) -> None:
        """Count ``n`` more and show the total."""
        self.count += n
        if self.enabled:
            self._stream.write(f"\r{self._label}: {self.count}")
            self._stream.flush()

    def done(self) -> None:
        """End the counter's line."""
        if self.enabled:
            self._stream.write("\n")
            self._stream.flush()
