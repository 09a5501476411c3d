"""Helpers every command module shares: output, error reporting, config, HTTP clients.

Every string shown (tables, fields, JSON, error lines) passes through
:func:`sessionhook.redact.redact_userinfo`: a URL's ``user:password@`` never reaches the
terminal. :func:`handle_errors` turns an API error, or an exception type registered with
:func:`register_user_error`, into ONE line on stderr and a non-zero exit status; an
unexpected exception (a bug) keeps its traceback. Tests route a command's HTTP through
``CliRunner.invoke(..., obj=Runtime(transport=...))``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Final, TypeVar

import click

from ..redact import redact_userinfo

if TYPE_CHECKING:
    # Imported where they are used: `sessionhook --help` loads neither httpx nor the API
    # client nor the relay (about 1 s of CPU together: bench/cli_start.py).
    import httpx

    from ..api.errors import ApiError
    from ..relay.config import Config
    from ..relay.domain.addresses import AddressPolicy
    from ..relay.ops import Poster, Resolver

_T = TypeVar("_T")

#: The environment variable naming the daemon's config when ``--config`` is not given.
ENV_CONFIG: Final = "SESSIONHOOK_CONFIG"
#: The config file used when neither ``--config`` nor ``$SESSIONHOOK_CONFIG`` is given.
DEFAULT_CONFIG: Final = "/etc/sessionhook/config.toml"
#: Said when :data:`DEFAULT_CONFIG` does not exist (docs/troubleshooting.md quotes it).
NO_CONFIG_HINT: Final = f"give --config FILE or set {ENV_CONFIG}"

#: Cells longer than this are cut in tables (the --json output is never cut).
MAX_CELL: Final = 60
_ELLIPSIS: Final = "…"
# A message that already names itself an error ("config error: ...") gets no second prefix.
_SELF_NAMED: Final = re.compile(r"^(?:\w+ ){0,3}error:", re.IGNORECASE)

# Exception types (beyond ApiError) that are a user's problem, with their exit status.
_user_errors: dict[type[Exception], int] = {}


# --------------------------------------------------------------------------- errors


def one_line(text: object) -> str:
    """``text`` with every run of whitespace (newlines included) made one space."""
    return " ".join(str(text).split())


def error_line(message: str, hint: str | None = None) -> str:
    """``error: <message> — <hint>`` on one line, URL user-info redacted."""
    text = redact_userinfo(one_line(message))
    if not _SELF_NAMED.match(text):
        text = f"error: {text}"
    return f"{text} — {redact_userinfo(one_line(hint))}" if hint else text


class CliError(click.ClickException):
    """A failure reported as one line on stderr with its own exit status."""

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int = 1) -> None:
        super().__init__(message)
        self.hint = hint
        # click types exit_code as a ClassVar but reads it from the instance when exiting;
        # a per-instance value lets one class carry both 1 (failed call) and 2 (config).
        self.exit_code = exit_code  # type: ignore[misc]

    def format_message(self) -> str:
        """The one line this error prints."""
        return error_line(self.message, self.hint)

    def show(self, file: IO[Any] | None = None) -> None:
        """Print the line on stderr (click would prefix a capitalized ``Error:``)."""
        click.echo(self.format_message(), file=file, err=file is None)


def register_user_error(exc_type: type[Exception], *, exit_code: int = 2) -> None:
    """Report ``exc_type``, an error the user is to fix, as one line (its ``str()`` and any
    ``hint`` attribute) with ``exit_code``."""
    _user_errors[exc_type] = exit_code


def _api_message(exc: ApiError) -> str:
    from ..api.errors import ApiStatusError

    message = str(exc)
    if exc.attempts > 1:
        message += f", after {exc.attempts} attempts"
    if isinstance(exc, ApiStatusError) and exc.retry_after is not None:
        message += f"; the service asks to retry after {exc.retry_after:g} s"
    return message


def _as_cli_error(exc: BaseException) -> CliError | None:
    if isinstance(exc, CliError):
        return exc
    from ..api.errors import ApiError

    if isinstance(exc, ApiError):
        return CliError(_api_message(exc), hint=exc.hint, exit_code=1)
    # The most specific registered type decides (a subclass may have its own status).
    for exc_type in type(exc).__mro__:
        exit_code = _user_errors.get(exc_type)
        if exit_code is not None:
            hint = getattr(exc, "hint", None)
            return CliError(
                str(exc), hint=hint if isinstance(hint, str) else None, exit_code=exit_code
            )
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        # A task group wraps even a single failure; report the failure itself.
        return _as_cli_error(exc.exceptions[0])
    return None


@contextmanager
def handle_errors() -> Iterator[None]:
    """Turn API errors and registered user errors into a :class:`CliError` (one line);
    anything else (a bug) propagates with its traceback."""
    try:
        yield
    except Exception as exc:
        converted = _as_cli_error(exc)
        if converted is None or converted is exc:
            raise
        raise converted from None


@contextmanager
def quiet_on_closed_pipe() -> Iterator[None]:
    """A closed stdout (``| head``) ends the command quietly (status 0); what is left in
    the buffer goes to /dev/null so that Python's flush at exit does not complain either."""
    try:
        yield
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def run(main: Callable[[], Awaitable[_T]]) -> _T:
    """``anyio.run(main)`` with errors reported as by :func:`handle_errors`."""
    import anyio

    with handle_errors():
        return anyio.run(main)


# --------------------------------------------------------------------------- config


def config_path(flag: str | None) -> str:
    """The daemon's config file: ``--config`` first, then ``$SESSIONHOOK_CONFIG``, then
    :data:`DEFAULT_CONFIG` (the precedence of every command, ``run`` included)."""
    return flag or os.environ.get(ENV_CONFIG) or DEFAULT_CONFIG


def load_daemon_config(flag: str | None, **options: Any) -> tuple[Config, str]:
    """The config :func:`config_path` picks, loaded with ``options`` (those of
    :func:`~sessionhook.relay.config.load_config`), and its path; a missing default file's
    error says how to name another (:data:`NO_CONFIG_HINT`)."""
    from ..relay.config import ConfigError, load_config

    path = config_path(flag)
    try:
        return load_config(path, **options), path
    except ConfigError as exc:
        if path == DEFAULT_CONFIG and exc.problem == "file not found":
            raise ConfigError(exc.key, f"{exc.problem} ({NO_CONFIG_HINT})") from None
        raise


# --------------------------------------------------------------------------- HTTP


@dataclass(frozen=True)
class Runtime:
    """What a command takes from its surroundings, injectable through ``ctx.obj`` (tests):
    the network, the waits between retries, DNS and the address guard's judgement;
    ``None`` means the real thing."""

    transport: httpx.AsyncBaseTransport | None = None
    sleep: Callable[[float], Awaitable[None]] | None = None
    resolve: Resolver | None = None
    address_policy: AddressPolicy | None = None


def current_runtime() -> Runtime:
    """The :class:`Runtime` found in the click context chain, or the default one."""
    ctx = click.get_current_context(silent=True)
    found = ctx.find_object(Runtime) if ctx is not None else None
    return found if found is not None else Runtime()


def consumer_poster(config: Config) -> AbstractAsyncContextManager[Poster]:
    """The daemon's sender for a command's POST to a consumer (``ops.ping_poster``: the
    URL judged as a delivery's, the name resolved once, every address vetted, the
    connection made to a vetted one), on this runtime's network, DNS and address guard."""
    from ..relay import ops

    runtime = current_runtime()
    return ops.ping_poster(
        config,
        transport=runtime.transport,
        resolve=runtime.resolve,
        policy=runtime.address_policy,
    )


def http_client(*, timeout: float, base_url: str) -> httpx.AsyncClient:
    """A fresh :class:`httpx.AsyncClient` for one command (redirects are not followed).

    A plain ``http://`` service never needs TLS, so its client skips loading the CA bundle
    (a sixth of an API command's cost: ``bench/cli_start.py``).
    """
    import httpx

    return httpx.AsyncClient(
        transport=current_runtime().transport,
        timeout=httpx.Timeout(timeout),
        follow_redirects=False,
        verify=not base_url.lower().startswith("http://"),
    )


# --------------------------------------------------------------------------- output


def shown(data: Any) -> Any:
    """``data`` with URL user-info redacted in every string, nested containers included."""
    if isinstance(data, str):
        return redact_userinfo(data)
    if isinstance(data, dict):
        return {key: shown(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [shown(value) for value in data]
    return data


def echo_json(data: Any) -> None:
    """Print ``data`` as indented JSON (non-ASCII kept; URL user-info redacted)."""
    click.echo(json.dumps(shown(data), indent=2, ensure_ascii=False))


def _cell(value: object, limit: int) -> str:
    text = "" if value is None else redact_userinfo(one_line(value))
    return text if len(text) <= limit else text[: limit - 1] + _ELLIPSIS


def render_table(
    headers: Sequence[str], rows: Iterable[Sequence[object]], *, max_cell: int = MAX_CELL
) -> str:
    """Left-aligned columns separated by two spaces, a header line first; cells made one
    line and cut at ``max_cell`` characters (``None``: empty), trailing spaces stripped."""
    cells = [[_cell(value, max_cell) for value in row] for row in rows]
    for row in cells:
        if len(row) != len(headers):
            raise ValueError(f"row has {len(row)} cells for {len(headers)} headers: {row!r}")
    widths = [len(header) for header in headers]
    for row in cells:
        widths = [max(width, len(text)) for width, text in zip(widths, row, strict=True)]
    lines = [
        "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip()
        for line in [list(headers), *cells]
    ]
    return "\n".join(lines)


def render_fields(fields: Iterable[tuple[str, object]]) -> str:
    """``label:  value`` lines with the values aligned, empty values left out; a value's
    further lines indented under its first."""
    present = [
        (label, redact_userinfo(str(value)))
        for label, value in fields
        if value not in (None, "", [])
    ]
    if not present:
        return ""
    width = max(len(label) for label, _ in present) + 1
    lines = []
    for label, value in present:
        first, *rest = value.splitlines() or [""]
        lines.append(f"{(label + ':').ljust(width)}  {first}".rstrip())
        lines.extend(f"{'':{width}}  {line}".rstrip() for line in rest)
    return "\n".join(lines)
