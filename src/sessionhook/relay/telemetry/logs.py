"""Structured logging for the daemon and the operator CLI: :func:`configure`.

JSON lines when the output is not a terminal, a readable rendering on one; dotted event
names with flat key/values, ids bound through :mod:`structlog.contextvars`. A redaction
processor runs on every event before the renderer (the standard :mod:`logging` records of
uvicorn, httpx and asyncio included): it masks sensitive keys, scrubs every string given
to :func:`register_secret` from every value, and hides the user-info of URLs.
:class:`LineBudget` bounds the lines of one kind a second, counting the rest for a summary.
"""

from __future__ import annotations

import bisect
import functools
import logging as stdlib_logging
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol, TextIO

import structlog
from structlog.typing import EventDict, FilteringBoundLogger, Processor, WrappedLogger

from ...redact import redact_userinfo

REDACTED: Final = "[redacted]"

LEVELS: Final[Mapping[str, int]] = {
    "debug": stdlib_logging.DEBUG,
    "info": stdlib_logging.INFO,
    "warning": stdlib_logging.WARNING,
    "warn": stdlib_logging.WARNING,
    "error": stdlib_logging.ERROR,
    "critical": stdlib_logging.CRITICAL,
}

# A key is sensitive when its normalized name contains one of these words.
_SENSITIVE_WORDS: Final = (
    "api_key",
    "apikey",
    "secret",
    "authorization",
    "password",
    "passwd",
    "credential",
    "cookie",
    "token",
)
# ...except these, which carry no secret and help debug pagination.
_NOT_SENSITIVE: Final = frozenset({"page_token", "next_page_token", "pagetoken", "nextpagetoken"})
# Registering a very short string would shred every log line; real secrets are long.
_MIN_SECRET_LENGTH: Final = 6
_WEBHOOK_SECRET_PREFIX: Final = "whsec_"

_secrets: set[str] = set()
_secrets_lock = threading.Lock()
#: ``_secrets`` longest first (so a secret containing another is replaced whole), kept in
#: order as each one is added rather than sorted on every event.
_secrets_sorted: list[str] = []
_HANDLER_NAME: Final = "sessionhook"
# Keys structlog's ProcessorFormatter adds for itself (the LogRecord) and removes before output.
_PROCESSOR_META: Final = frozenset({"_record", "_from_structlog"})


class _SecretLike(Protocol):
    def get_secret_value(self) -> str: ...


def register_secret(value: str | _SecretLike | None) -> None:
    """Scrub ``value`` from every later log event (a ``whsec_`` secret's bare key too); very
    short values are ignored: they would mask innocent text."""
    if value is None:
        return
    raw = value if isinstance(value, str) else value.get_secret_value()
    candidates = {raw}
    if raw.startswith(_WEBHOOK_SECRET_PREFIX):
        candidates.add(raw[len(_WEBHOOK_SECRET_PREFIX) :])
    with _secrets_lock:
        for secret in candidates:
            if len(secret) >= _MIN_SECRET_LENGTH and secret not in _secrets:
                _secrets.add(secret)
                # In place, not sorted again (thousands of run-time endpoints register one
                # by one); a scrub reading meanwhile misses none it held.
                bisect.insort(_secrets_sorted, secret, key=_longest_first)


def _longest_first(secret: str) -> int:
    return -len(secret)


def clear_secrets() -> None:
    """Forget every registered secret (a reload re-registers the current ones; tests)."""
    global _secrets_sorted
    with _secrets_lock:
        _secrets.clear()
        _secrets_sorted = []


@functools.lru_cache(maxsize=1024)  # the same few dozen keys, on every line: a third of its cost
def _is_sensitive(key: str) -> bool:
    normalized = key.lower().replace("-", "_")
    if normalized in _NOT_SENSITIVE:
        return False
    return any(word in normalized for word in _SENSITIVE_WORDS)


def _scrub(value: Any, secrets: Sequence[str]) -> Any:
    if isinstance(value, str):
        value = redact_userinfo(value)
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return value
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, Mapping):
        return {
            k: REDACTED if isinstance(k, str) and _is_sensitive(k) else _scrub(v, secrets)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return [_scrub(v, secrets) for v in value]
    if isinstance(value, bytes):
        return _scrub(value.decode("utf-8", "replace"), secrets)
    # Anything else would be rendered through repr()/str() later, out of our sight: render it
    # now, so a secret inside an object's repr (headers, a request) is scrubbed too.
    return _scrub(repr(value), secrets)


def redact(_logger: WrappedLogger, _method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: mask sensitive keys and scrub registered secrets from all values."""
    secrets = _secrets_sorted
    for key in list(event_dict):
        if key in _PROCESSOR_META:
            continue
        if _is_sensitive(key):
            event_dict[key] = REDACTED
        else:
            event_dict[key] = _scrub(event_dict[key], secrets)
    return event_dict


def _shared_processors() -> list[Processor]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        # Render exceptions to text *before* redaction: a traceback can quote a secret.
        structlog.processors.format_exc_info,
        redact,
    ]


def configure(level: str = "info", fmt: str = "auto", stream: TextIO | None = None) -> None:
    """Configure structlog (and the stdlib ``logging`` bridge) for this process; again on
    a reload. ``fmt``: ``"auto"`` (JSON unless ``stream`` is a terminal), ``"json"`` or
    ``"console"``; ``stream`` defaults to standard error.
    """
    try:
        threshold = LEVELS[level.lower()]
    except KeyError:
        raise ValueError(
            f"unknown log level {level!r}; expected one of {', '.join(LEVELS)}"
        ) from None
    if fmt not in ("auto", "json", "console"):
        raise ValueError(f"unknown log format {fmt!r}; expected auto, json or console")
    out = sys.stderr if stream is None else stream
    isatty = getattr(out, "isatty", None)
    tty = bool(callable(isatty) and isatty())
    renderer: Processor
    if fmt == "json" or (fmt == "auto" and not tty):
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=tty)

    structlog.configure(
        processors=[*_shared_processors(), renderer],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.WriteLoggerFactory(file=out),
        # A reload reconfigures: loggers created before it must follow.
        cache_logger_on_first_use=False,
    )
    _configure_stdlib(threshold, renderer, out)


def _configure_stdlib(threshold: int, renderer: Processor, out: TextIO) -> None:
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *_shared_processors()],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    )
    handler = stdlib_logging.StreamHandler(out)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(formatter)
    root = _without_our_handler()
    root.addHandler(handler)
    root.setLevel(threshold)
    # One INFO line per HTTP request every few seconds, uvicorn's "Started server process",
    # asyncio's "Using selector": noise next to our own dotted events, even at debug level.
    # Their warnings and errors still show.
    for noisy in ("httpx", "httpcore", "uvicorn", "asyncio"):
        stdlib_logging.getLogger(noisy).setLevel(max(threshold, stdlib_logging.WARNING))
    # uvicorn's own logging config (applied by any uvicorn run with the default log_config in
    # this process) gives its loggers private handlers that bypass redaction: take them back.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        own = stdlib_logging.getLogger(name)
        for existing in list(own.handlers):
            own.removeHandler(existing)
        own.propagate = True


def reset() -> None:
    """Undo :func:`configure` (tests): structlog defaults, our handler removed, no secrets."""
    structlog.reset_defaults()
    _without_our_handler()
    clear_secrets()


def _without_our_handler() -> stdlib_logging.Logger:
    """The root logger, our handler removed (only ours: test harnesses attach theirs too)."""
    root = stdlib_logging.getLogger()
    for existing in list(root.handlers):
        if existing.get_name() == _HANDLER_NAME:
            root.removeHandler(existing)
    return root


def get_logger(**initial: Any) -> FilteringBoundLogger:
    """A structlog logger with ``initial`` bound; a lazy proxy that follows a later
    :func:`configure`, so modules may create it at import time."""
    logger: FilteringBoundLogger = structlog.get_logger(**initial)
    return logger


class LineBudget:
    """At most ``per_second`` lines of one kind in each second; the others are counted by
    key (an endpoint) for one summary line per key once their second is over.

    A line costs the loop 25-45 us, so a backlog at 2,000 deliveries a second spent a tenth of
    the CPU on success lines, and journald's rate limit then dropped the warnings too.
    ``clock``: monotonic seconds. Used from the event loop only.
    """

    def __init__(self, per_second: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_second = per_second
        self._clock = clock
        self._second_started = -math.inf
        self._written = 0
        self._unlisted: dict[str, int] = {}

    def admit(self, key: str) -> bool:
        """Whether a line may be written now; if not, it is counted under ``key``."""
        now = self._clock()
        if now - self._second_started >= 1.0:
            self._second_started, self._written = now, 0
        if self._written < self.per_second:
            self._written += 1
            return True
        self._unlisted[key] = self._unlisted.get(key, 0) + 1
        return False

    def unlisted(self, *, now: bool = False) -> dict[str, int]:
        """The lines counted instead of written, by key, once the second they fell in is
        over (``now``: at once, e.g. when stopping); each count is handed out once."""
        if not self._unlisted:
            return {}
        if not now and self._clock() - self._second_started < 1.0:
            return {}
        taken, self._unlisted = self._unlisted, {}
        return taken
