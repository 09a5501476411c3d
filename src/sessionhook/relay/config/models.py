"""The relay's configuration: frozen pydantic models loaded once from TOML.

:func:`load_config` reads the file, validates it (unknown keys are errors), anchors relative
paths at the config file's directory and resolves secrets from the environment or files. Any
problem is one :class:`ConfigError` whose ``str()`` is a single line naming the key::

    config error: endpoints[1].url: must be an http(s) URL

Secrets are :class:`pydantic.SecretStr` (``config.api.api_key``, ``endpoint.secrets``,
``endpoint.secret_value``), so printing a config or logging it never shows them.

Paths: ``store.path``, ``api.api_key_file`` and ``endpoints[].secret_file`` may use
``$VAR`` / ``${VAR}`` (for example ``${CREDENTIALS_DIRECTORY}/api-key`` under systemd) and
``~``; relative paths are relative to the directory of the config file. Without
``store.path`` the database is ``$STATE_DIRECTORY/sessionhook.db`` when systemd set
``STATE_DIRECTORY``, else ``sessionhook.db`` next to the config file.

Types are strict: a boolean is ``true`` or ``false`` (never ``"yes"`` or ``1``), a number is a
TOML number (never ``"15"``), an integer is never ``2.0``; nothing is coerced. Durations
(:data:`DURATION_BOUNDS`) are a TOML number of seconds or a string with a unit (``"90s"``,
``"15m"``, ``"12h"``, ``"5d"``), finite and within the bounds of their key. Webhook secrets
decode to :data:`SECRET_MIN_BYTES` to :data:`SECRET_MAX_BYTES` bytes, wherever they come from.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from ..domain.addresses import literal_refusal
from ..domain.events import EVENT_TYPES, matches
from ..domain.render import RenderError, Shape, check_shape
from ..domain.samples import sample_events
from ..domain.signing import SECRET_PREFIX, SIGNING_KEY_PREFIX, decode_secret, decode_signing_key
from .database_url import check_postgres_url, display_url
from .secret_files import file_exposure

__all__ = [
    "DEFAULT_ACCOUNT",
    "DURATION_BOUNDS",
    "SECRET_MAX_BYTES",
    "SECRET_MIN_BYTES",
    "TOKEN_MAX_CHARS",
    "TOKEN_MIN_CHARS",
    "Account",
    "AccountConfig",
    "ApiConfig",
    "Config",
    "ConfigError",
    "DeliveryConfig",
    "EndpointConfig",
    "LogConfig",
    "PollConfig",
    "ServerConfig",
    "StoreConfig",
    "is_loopback",
    "load_config",
    "parse_duration",
]

DEFAULT_DB_NAME = "sessionhook.db"


class ConfigError(Exception):
    """A bad configuration: ``key`` is the dotted path (``endpoints[0].url``), ``problem`` why.

    ``str()`` is ``config error: <key>: <problem>``, one line, meant for the user as is.
    """

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config error: {key}: {problem}")
        self.key = key
        self.problem = problem


#: Standard Webhooks secrets are 24 to 64 random bytes (after the base64 decoding).
SECRET_MIN_BYTES = 24
SECRET_MAX_BYTES = 64
#: The web token (``server.token_env`` / ``server.token_file``): visible ASCII, no spaces.
TOKEN_MIN_CHARS = 32
TOKEN_MAX_CHARS = 512

_MINUTE, _HOUR, _DAY = 60, 3600, 86400

#: ``key: (lowest, highest)`` in seconds. The highest is inclusive; the lowest is exclusive
#: (the duration must be positive) except for ``retry_delays`` and ``max_retry_after``,
#: which may be 0. A value beyond is refused: an interval of a year or a timeout of a week
#: is a typo, not a wish. docs/configuration.md and config.example.toml document the same figures.
DURATION_BOUNDS: dict[str, tuple[int, int]] = {
    "api.timeout": (0, 10 * _MINUTE),
    "poll.active_interval": (0, _HOUR),
    "poll.idle_interval": (0, _DAY),
    "poll.discovery_interval": (0, _HOUR),
    "poll.list_interval": (0, _HOUR),
    "poll.safety_interval": (0, _DAY),
    "delivery.retry_delays[]": (0, 7 * _DAY),
    "delivery.timeout": (0, 5 * _MINUTE),
    "delivery.max_retry_after": (0, _DAY),
    "delivery.render_timeout": (0, _MINUTE),
    "endpoints[].disable_after": (0, 90 * _DAY),
    "store.delivery_log_retention": (0, 3650 * _DAY),
    "store.lease": (0, 10 * _MINUTE),
    "server.request_timeout": (0, 5 * _MINUTE),
}
_ZERO_ALLOWED = frozenset({"delivery.retry_delays[]", "delivery.max_retry_after"})

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_HELP = 'must be a duration such as "90s", "15m", "12h", "5d" or a number of seconds'


def parse_duration(value: object) -> float:
    """Seconds from a number or a string with a unit: ``"90s"``, ``"15m"``, ``"12h"``, ``"5d"``.

    A string without a unit (``"120"``) is refused, like every other string where a number
    belongs (the config is strictly typed); so are booleans. Non-finite numbers pass through
    here and are refused by the field (``allow_inf_nan=False``).
    """
    if isinstance(value, bool):
        raise ValueError(_DURATION_HELP)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and (match := _DURATION.match(value)):
        return float(match.group(1)) * _UNITS[match.group(2)]
    raise ValueError(_DURATION_HELP)


#: Seconds: a TOML number or a string with a unit (finite: ``allow_inf_nan=False``).
_Seconds = Annotated[float, BeforeValidator(parse_duration)]


def _within(key: str) -> Any:
    """The bounds of the duration ``key`` (from :data:`DURATION_BOUNDS`) as a Field."""
    low, high = DURATION_BOUNDS[key]
    return Field(ge=low, le=high) if key in _ZERO_ALLOWED else Field(gt=low, le=high)


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http(s) URL")
    return value


class _Section(BaseModel):
    # strict: no "yes" -> True, "15" -> 15.0 or 2.0 -> 2; a TOML value must have the
    # key's type. Tuples and paths opt out at the field (TOML gives lists and strings),
    # their items stay strict.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


_LAX = Field(strict=False)


class ApiConfig(_Section):
    """``[api]``: where the Sessions API is and how to authenticate."""

    base_url: str = "http://127.0.0.1:8080"
    api_key_env: str | None = "SESSIONHOOK_API_KEY"
    api_key_file: str | None = None
    api_key_header: Annotated[str, Field(min_length=1)] = "x-vendor-api-key"
    requests_per_minute: Annotated[int, Field(gt=0, le=1_000_000)] = 600
    #: Deadline of one upstream exchange, from sending to the last byte of the answer.
    timeout: Annotated[_Seconds, _within("api.timeout")] = 30.0
    #: Bytes of one upstream answer read at most (16 MiB); 64 KiB .. 1 GiB.
    max_response_bytes: Annotated[int, Field(ge=65_536, le=1 << 30)] = 16 << 20

    _api_key: SecretStr | None = PrivateAttr(default=None)

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        value = _http_url(value).rstrip("/")
        if value.endswith("/v1alpha"):
            raise ValueError("must not end with /v1alpha (the client appends it)")
        return value

    @model_validator(mode="after")
    def _one_key_source(self) -> ApiConfig:
        if self.api_key_file and self.api_key_env and "api_key_env" in self.model_fields_set:
            raise ValueError("set only one of api_key_env or api_key_file")
        if not self.api_key_file and not self.api_key_env:
            raise ValueError("set api_key_env or api_key_file")
        return self

    @property
    def api_key(self) -> SecretStr:
        """The API key (resolved by :func:`load_config`)."""
        if self._api_key is None:
            raise ConfigError("api", "the API key was not resolved (resolve_secrets=False)")
        return self._api_key


#: The name of the one account a config without ``[[accounts]]`` follows (``[api]``).
DEFAULT_ACCOUNT = "default"


class AccountConfig(_Section):
    """``[[accounts]]``: one account of the Sessions API the relay follows, with its own
    discovery and budget. ``base_url``, ``api_key_header`` and ``requests_per_minute``
    default to ``[api]``'s; the key comes from ``api_key_env`` or ``api_key_file``."""

    name: str
    base_url: str | None = None
    api_key_env: str | None = None
    api_key_file: str | None = None
    requests_per_minute: Annotated[int, Field(gt=0)] | None = None

    _api_key: SecretStr | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be made of letters, digits, '_', '.' and '-'")
        return value

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str | None) -> str | None:
        return None if value is None else ApiConfig._check_base_url(value)

    @model_validator(mode="after")
    def _one_key_source(self) -> AccountConfig:
        if bool(self.api_key_env) == bool(self.api_key_file):
            raise ValueError("set exactly one of api_key_env or api_key_file")
        return self

    @property
    def api_key(self) -> SecretStr:
        """The account's API key (resolved by :func:`load_config`)."""
        if self._api_key is None:
            raise ConfigError(f"account {self.name}", "the API key was not resolved")
        return self._api_key


@dataclass(frozen=True)
class Account:
    """One upstream account as the daemon uses it: ``[[accounts]]`` merged with ``[api]``."""

    name: str
    base_url: str
    api_key: SecretStr
    api_key_header: str
    requests_per_minute: int


class StoreConfig(_Section):
    """``[store]``: where the relay keeps everything. A SQLite file (``path``, the default:
    after loading, an absolute path) or a PostgreSQL database (``url``, or ``url_env``
    naming the environment variable that holds it, so the password stays out of the file).
    At most one of the three is set."""

    path: Annotated[Path, _LAX] = Path(DEFAULT_DB_NAME)
    #: ``postgresql://user:password@host:port/database`` (after loading: from ``url_env``
    #: too). Shown and logged only through :attr:`location` (no password).
    url: SecretStr | None = None
    url_env: Annotated[str, Field(min_length=1)] | None = None
    #: PostgreSQL connections per relay process (its store's worker threads).
    pool_size: Annotated[int, Field(ge=1, le=64)] = 4
    #: Delete attempts, and delivered deliveries, older than this (unset: keep everything).
    #: Open and dead deliveries and the archive (sessions, activities, events) are kept.
    delivery_log_retention: Annotated[_Seconds, _within("store.delivery_log_retention")] | None = (
        None
    )

    #: How long a replica's claims (deliveries in flight, session polls, an account's
    #: poller) hold after its last heartbeat (every third of it): what a crash costs in
    #: latency before another replica takes its work over.
    lease: Annotated[_Seconds, _within("store.lease")] = 15.0

    @field_validator("lease")
    @classmethod
    def _lease_is_long_enough(cls, value: float) -> float:
        if value < 1.0:
            raise ValueError("must be at least 1 s (replicas heartbeat every third of it)")
        return value

    @field_validator("path", mode="before")
    @classmethod
    def _path_is_text(cls, value: object) -> object:
        if not isinstance(value, str | Path):
            raise ValueError("must be a string")
        return value

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            check_postgres_url(value.get_secret_value())
        return value

    @model_validator(mode="after")
    def _one_location(self) -> StoreConfig:
        given = [k for k in ("path", "url", "url_env") if k in self.model_fields_set]
        if len(given) > 1:
            raise ValueError("set only one of path, url or url_env")
        return self

    def database_url(self) -> str | None:
        """The PostgreSQL URL (password included: for connecting only), or ``None``."""
        return None if self.url is None else self.url.get_secret_value()

    @property
    def location(self) -> str:
        """The store as logs and messages name it: the file, or the URL without password."""
        if self.url is None:
            return str(self.path)
        return display_url(self.url.get_secret_value())


class PollConfig(_Section):
    """``[poll]``: how often sessions are listed and activities fetched (seconds)."""

    active_interval: Annotated[_Seconds, _within("poll.active_interval")] = 2.0
    idle_interval: Annotated[_Seconds, _within("poll.idle_interval")] = 30.0
    discovery_interval: Annotated[_Seconds, _within("poll.discovery_interval")] = 10.0
    backfill: bool = False
    mode: Literal["auto", "list", "timer"] = "auto"
    list_interval: Annotated[_Seconds, _within("poll.list_interval")] = 1.0
    safety_interval: Annotated[_Seconds, _within("poll.safety_interval")] = 30.0
    history_share: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.2
    #: Pages one walk (a session's activities, the session list) may take.
    max_pages: Annotated[int, Field(ge=1, le=100_000)] = 200


class DeliveryConfig(_Section):
    """``[delivery]``: retry schedule, timeouts, limits of the webhook sender."""

    retry_delays: Annotated[
        tuple[Annotated[_Seconds, _within("delivery.retry_delays[]")], ...],
        Field(min_length=1, max_length=100, strict=False),
    ] = (5, 300, 1800, 7200, 18000, 36000, 36000)
    timeout: Annotated[_Seconds, _within("delivery.timeout")] = 15.0
    #: A consumer's ``Retry-After`` longer than this is read as this (0: never wait longer
    #: than the schedule says).
    max_retry_after: Annotated[_Seconds, _within("delivery.max_retry_after")] = 3600.0
    allow_private_networks: bool = False
    max_media_bytes: Annotated[int, Field(ge=0, le=64 * 1024 * 1024)] = 262_144
    response_body_limit: Annotated[int, Field(ge=0, le=1024 * 1024)] = 4096
    concurrency: Annotated[int, Field(ge=1, le=1024)] = 16
    #: A template render taking longer is stopped: that attempt fails.
    render_timeout: Annotated[_Seconds, _within("delivery.render_timeout")] = 5.0


_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class EndpointConfig(_Section):
    """``[[endpoints]]``: one webhook receiver.

    Exactly one of ``secret``, ``secret_env``, ``secret_file`` gives the signing secret(s):
    ``whsec_`` + base64, several separated by spaces during a rotation (each signs).
    """

    name: str
    url: str
    secret: SecretStr | None = None
    secret_env: str | None = None
    secret_file: str | None = None
    events: Annotated[
        tuple[Annotated[str, Field(min_length=1)], ...], Field(min_length=1, strict=False)
    ] = ("*",)
    disable_after: Annotated[_Seconds, _within("endpoints[].disable_after")] = 5 * 86400.0
    enabled: bool = True
    #: ``full``: the whole event; ``thin``: type, ids and the session summary.
    payload: Literal["full", "thin"] = "full"
    #: ``standard`` (Standard Webhooks JSON), ``cloudevents`` or a chat preset.
    format: Literal["standard", "cloudevents", "slack", "discord", "google_chat", "teams"] = (
        "standard"
    )
    #: A sandboxed Jinja2 template of the body (instead of ``format``).
    template: Annotated[str, Field(min_length=1)] | None = None
    #: Content type of what ``template`` renders (JSON is checked and compacted).
    content_type: Annotated[str, Field(min_length=1)] = "application/json"
    #: ``{dotted path: [globs]}`` on the payload; all must match (any glob per path).
    filter: dict[str, tuple[Annotated[str, Field(min_length=1)], ...]] = Field(default_factory=dict)
    #: ``v1`` (HMAC, ``whsec_`` secrets) or ``v1a`` (ed25519, ``whsk_`` signing keys).
    signature: Literal["v1", "v1a"] = "v1"
    #: At most this many deliveries per second to this endpoint (the rest waits, in order).
    rate_limit: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    #: Only events of these accounts (``data.account``); absent: every account.
    accounts: Annotated[tuple[str, ...], Field(min_length=1, strict=False)] | None = None

    _secrets: tuple[SecretStr, ...] | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be made of letters, digits, '_', '.' and '-'")
        return value

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return _http_url(value)

    @field_validator("secret")
    @classmethod
    def _check_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            text = value.get_secret_value()
            # Checked again against ``signature`` once the whole endpoint is read.
            asymmetric = text.strip().startswith(SIGNING_KEY_PREFIX)
            _split_secrets(text, "v1a" if asymmetric else "v1")
        return value

    @field_validator("filter", mode="before")
    @classmethod
    def _one_glob_is_a_list(cls, value: object) -> object:
        if isinstance(value, dict):
            return {
                k: (v,) if isinstance(v, str) else tuple(v) if isinstance(v, list) else v
                for k, v in value.items()
            }
        return value

    @field_validator("filter")
    @classmethod
    def _check_filter(cls, value: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        for path, globs in value.items():
            if not path or any(not part for part in path.split(".")):
                raise ValueError(f"{path!r} is not a dotted path such as data.session.source")
            if not globs:
                raise ValueError(f"{path}: give at least one glob")
        return value

    @model_validator(mode="after")
    def _check_shape(self) -> EndpointConfig:
        if self.template is not None and "format" in self.model_fields_set:
            raise ValueError("set format or template, not both")
        if self.content_type != "application/json" and self.template is None:
            raise ValueError("content_type only applies to a template")
        if self.secret is not None:
            try:
                _split_secrets(self.secret.get_secret_value(), self.signature)
            except ValueError as exc:
                raise ValueError(f"secret: {exc}") from None
        if not self.shape.is_standard:
            # Rendered once against a sample of every event type: a template that cannot
            # render is a config error now, never a failed delivery later.
            try:
                check_shape(self.shape, [(e.id, e.body) for e in sample_events()])
            except RenderError as exc:
                raise ValueError(str(exc)) from None
        return self

    @property
    def shape(self) -> Shape:
        """What :func:`~sessionhook.relay.domain.render.render` makes of an event here."""
        return Shape(
            payload=self.payload,
            format=self.format,
            template=self.template,
            content_type=self.content_type,
        )

    @field_validator("events")
    @classmethod
    def _check_events(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for glob in value:
            if not any(matches([glob], t) for t in EVENT_TYPES):
                raise ValueError(
                    f"{glob!r} matches no event type (known: {', '.join(EVENT_TYPES)})"
                )
        return value

    @model_validator(mode="after")
    def _one_secret_source(self) -> EndpointConfig:
        given = [self.secret is not None, bool(self.secret_env), bool(self.secret_file)]
        if sum(given) != 1:
            raise ValueError("set exactly one of secret, secret_env or secret_file")
        return self

    @property
    def secrets(self) -> list[SecretStr]:
        """The signing secrets, first to last; each one signs every message."""
        if self._secrets is None:
            if self.secret is None:
                raise ConfigError(f"endpoint {self.name}", "secrets were not resolved")
            texts = _split_secrets(self.secret.get_secret_value(), self.signature)
            return [SecretStr(s) for s in texts]
        return list(self._secrets)

    @property
    def secret_value(self) -> SecretStr:
        """All secrets as configured: one string, space-separated."""
        return SecretStr(" ".join(s.get_secret_value() for s in self.secrets))


class ServerConfig(_Section):
    """``[server]``: the daemon's HTTP listener (absent: no listener).

    ``/healthz``, ``/readyz``, ``/metrics`` and ``/openapi.json`` are always served, without
    authentication. The web console and the event stream show payloads, so they need one of:

    * a bearer token (``token_env`` or ``token_file``, :data:`TOKEN_MIN_CHARS` to
      :data:`TOKEN_MAX_CHARS` visible ASCII characters; a token file must not be accessible
      to "others", e.g. mode 0600 or 0640);
    * ``allow_unauthenticated = true``, accepted only when ``listen`` is a loopback address.

    With neither, the console and the stream stay off (404) and the daemon logs
    ``web.console_off`` once at start.
    """

    listen: str = "127.0.0.1:9187"
    token_env: str | None = Field(default=None, min_length=1)
    token_file: str | None = Field(default=None, min_length=1)
    allow_unauthenticated: bool = False
    #: Concurrent ``/v1/events/stream`` connections; one more is answered 503.
    max_streams: int = Field(default=32, ge=1, le=1024)
    #: Connections the listener holds at once; more wait in the kernel's listen queue. At
    #: most half the process's open-files limit (checked at start: the rest is for
    #: deliveries, polls and the store).
    max_connections: int = Field(default=256, ge=8, le=1 << 20)
    #: Seconds a connection has to send a complete request (headers and body) after it
    #: opened or got its previous answer; then it is closed.
    request_timeout: Annotated[_Seconds, _within("server.request_timeout")] = 5.0
    _token: SecretStr | None = PrivateAttr(default=None)

    @field_validator("request_timeout")
    @classmethod
    def _request_timeout_is_long_enough(cls, value: float) -> float:
        if value < 1.0:
            raise ValueError("must be at least 1 s")
        return value

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        _split_listen(value)
        return value

    @model_validator(mode="after")
    def _one_way_in(self) -> ServerConfig:
        if self.token_env and self.token_file:
            raise ValueError("set token_env or token_file, not both")
        if self.allow_unauthenticated and (self.token_env or self.token_file):
            raise ValueError("allow_unauthenticated = true and a token exclude each other")
        if self.allow_unauthenticated and not is_loopback(self.host):
            raise ValueError(
                f"allow_unauthenticated = true needs a loopback listen address, not {self.host}"
                " (the console shows payloads: set token_env or token_file)"
            )
        return self

    @property
    def host(self) -> str:
        """The address to bind (brackets of an IPv6 literal removed)."""
        return _split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        """The TCP port to bind."""
        return _split_listen(self.listen)[1]

    @property
    def web_enabled(self) -> bool:
        """The console and the stream are served (a token, or the loopback opt-out)."""
        return bool(self.token_env or self.token_file or self.allow_unauthenticated)

    @property
    def token(self) -> SecretStr | None:
        """The bearer token (``None`` without one); raises ConfigError when configured but
        not resolved (``load_config(resolve_secrets=False)``)."""
        if (self.token_env or self.token_file) and self._token is None:
            raise ConfigError("server.token", "the token was not resolved")
        return self._token


def is_loopback(host: str) -> bool:
    """``127.0.0.0/8``, ``::1`` or ``localhost``: only this machine can connect."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class LogConfig(_Section):
    """``[log]``: level and format (``auto``: console on a TTY, JSON lines otherwise)."""

    level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    format: Literal["auto", "json", "console"] = "auto"

    @field_validator("level", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value


class Config(_Section):
    """The whole configuration. Build it with :func:`load_config`."""

    api: ApiConfig = Field(default_factory=ApiConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    poll: PollConfig = Field(default_factory=PollConfig)
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig)
    endpoints: Annotated[tuple[EndpointConfig, ...], _LAX] = ()
    server: ServerConfig | None = None
    log: LogConfig = Field(default_factory=LogConfig)
    accounts: Annotated[tuple[AccountConfig, ...], _LAX] = ()

    @model_validator(mode="after")
    def _unique_endpoint_names(self) -> Config:
        seen: set[str] = set()
        for i, endpoint in enumerate(self.endpoints):
            if endpoint.name in seen:
                # Raised as ConfigError (not ValueError) so the key can name the index.
                raise ConfigError(f"endpoints[{i}].name", f"duplicate name {endpoint.name!r}")
            seen.add(endpoint.name)
        names: set[str] = set()
        for i, account in enumerate(self.accounts):
            if account.name in names:
                raise ConfigError(f"accounts[{i}].name", f"duplicate name {account.name!r}")
            names.add(account.name)
        known = names or {DEFAULT_ACCOUNT}
        for i, endpoint in enumerate(self.endpoints):
            for name in endpoint.accounts or ():
                if name not in known:
                    raise ConfigError(
                        f"endpoints[{i}].accounts",
                        f"no account {name!r} (accounts: {', '.join(sorted(known))})",
                    )
        return self

    @model_validator(mode="after")
    def _no_private_only_endpoint(self) -> Config:
        # An endpoint whose URL can only reach a refused address (127.0.0.1, [::1], 10.x,
        # localhost...) would fail every attempt: say so now, not in the delivery log.
        # Names are judged when connecting (they need DNS).
        if self.delivery.allow_private_networks:
            return self
        for i, endpoint in enumerate(self.endpoints):
            reason = literal_refusal(endpoint.url)
            if reason is not None:
                raise ConfigError(
                    f"endpoints[{i}].url",
                    f"{reason}, refused while delivery.allow_private_networks = false",
                )
        return self

    def upstream_accounts(self) -> list[Account]:
        """The accounts the relay follows: each ``[[accounts]]`` entry, or the one
        ``[api]`` describes (named ``default``). Needs resolved secrets."""
        api = self.api
        if not self.accounts:
            return [
                Account(
                    DEFAULT_ACCOUNT,
                    api.base_url,
                    api.api_key,
                    api.api_key_header,
                    api.requests_per_minute,
                )
            ]
        return [
            Account(
                a.name,
                a.base_url or api.base_url,
                a.api_key,
                api.api_key_header,
                a.requests_per_minute or api.requests_per_minute,
            )
            for a in self.accounts
        ]

    def endpoint_by_name(self, name: str) -> EndpointConfig | None:
        """The endpoint called ``name``, or ``None``."""
        return next((e for e in self.endpoints if e.name == name), None)


def load_config(
    path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    resolve_secrets: bool = True,
    need_api_key: bool = True,
) -> Config:
    """Read, validate and resolve the TOML config at ``path``.

    ``env`` replaces :data:`os.environ` (tests). With ``resolve_secrets=False`` the API key
    and file/env secrets are left unresolved (operator commands that only read the store);
    with ``need_api_key=False`` only the endpoint secrets are (``endpoints test`` signs a
    ping but never calls the API, nor serves the console: ``server.token`` stays
    unresolved). Touching an unresolved ``api.api_key`` or
    ``endpoint.secrets`` raises ConfigError. Raises :class:`ConfigError` for every problem,
    never a pydantic or TOML exception.
    """
    environ = os.environ if env is None else env
    file = Path(path)
    try:
        with file.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(str(file), "file not found") from None
    except OSError as exc:
        raise ConfigError(str(file), f"cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(file), f"invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(file), f"not UTF-8 text (byte {exc.start})") from None
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise _translate(exc) from None
    base = file.resolve().parent
    config = _resolve_store_path(config, base, environ)
    if resolve_secrets:
        # With [[accounts]], each account has its key and [api] only gives defaults.
        api_needs_key = need_api_key and not config.accounts
        api = _resolve_api_key(config.api, base, environ) if api_needs_key else config.api
        accounts = config.accounts
        if need_api_key:
            accounts = tuple(
                _resolve_account_key(i, a, base, environ) for i, a in enumerate(accounts)
            )
        endpoints = _resolve_endpoint_secrets(config.endpoints, base, environ)
        # The web token is the daemon's alone, like the API key (`endpoints test` needs neither).
        server = (
            _resolve_server_token(config.server, base, environ) if need_api_key else config.server
        )
        config = config.model_copy(
            update={"api": api, "endpoints": endpoints, "accounts": accounts, "server": server}
        )
    return config


# --------------------------------------------------------------------------- helpers


def _split_secrets(text: str, signature: str = "v1") -> list[str]:
    parts = text.split()
    if not parts:
        raise ValueError("must not be empty")
    for part in parts:
        if signature == "v1a":
            if not part.startswith(SIGNING_KEY_PREFIX):
                raise ValueError(
                    f'signature = "v1a" needs {SIGNING_KEY_PREFIX} signing keys '
                    "(sessionhook secret generate --asymmetric)"
                )
            decode_signing_key(part)
            continue
        if not part.startswith(SECRET_PREFIX):
            raise ValueError(f"each secret must start with {SECRET_PREFIX}")
        size = len(decode_secret(part))
        if not SECRET_MIN_BYTES <= size <= SECRET_MAX_BYTES:
            raise ValueError(
                f"a secret must decode to {SECRET_MIN_BYTES} to {SECRET_MAX_BYTES} bytes, "
                f"not {size} (create one with `sessionhook secret generate`)"
            )
    return parts


def _split_listen(value: str) -> tuple[str, int]:
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError('must be "host:port", for example "127.0.0.1:9187"')
    return host.removeprefix("[").removesuffix("]"), int(port_text)


_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def _expand_path(key: str, raw: str | Path, base: Path, env: Mapping[str, str]) -> Path:
    def substitute(match: re.Match[str]) -> str:
        var = match.group(1) or match.group(2)
        if var not in env:
            raise ConfigError(key, f"environment variable {var} (used in the path) is not set")
        return env[var]

    expanded = Path(_VAR.sub(substitute, str(raw))).expanduser()
    return expanded if expanded.is_absolute() else base / expanded


def _resolve_store_path(config: Config, base: Path, env: Mapping[str, str]) -> Config:
    if config.store.url_env is not None:
        var = config.store.url_env
        if not env.get(var):
            raise ConfigError("store.url_env", f"environment variable {var} is not set")
        try:
            check_postgres_url(env[var])
        except ValueError as exc:
            raise ConfigError("store.url_env", f"{var}: {exc}") from None
        url = SecretStr(env[var])
        return config.model_copy(update={"store": config.store.model_copy(update={"url": url})})
    if config.store.url is not None:
        return config
    if "path" in config.store.model_fields_set:
        db = _expand_path("store.path", config.store.path, base, env)
    elif env.get("STATE_DIRECTORY"):
        # systemd passes a colon-separated list when StateDirectory= names several.
        db = Path(env["STATE_DIRECTORY"].split(":")[0]) / DEFAULT_DB_NAME
    else:
        db = base / DEFAULT_DB_NAME
    return config.model_copy(update={"store": config.store.model_copy(update={"path": db})})


def _read_secret_file(key: str, raw: str, base: Path, env: Mapping[str, str]) -> str:
    """The secret in the file ``raw`` names; a file its group or other users can access is
    refused (:mod:`.secret_files`: the same rule for every secret file)."""
    file = _expand_path(key, raw, base, env)
    try:
        exposed = file_exposure(file)
    except OSError as exc:
        raise ConfigError(key, f"cannot read {file}: {exc.strerror or exc}") from None
    if exposed is not None:
        raise ConfigError(key, f"{file} holds a secret but {exposed}: chmod 600 {file}")
    try:
        text = file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(key, f"cannot read {file}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(key, f"{file} is not UTF-8 text (byte {exc.start})") from None
    if not text:
        raise ConfigError(key, f"{file} is empty")
    return text


# Copies get the private secrets, so no instance shared with another Config is touched.


def _resolve_api_key(api: ApiConfig, base: Path, env: Mapping[str, str]) -> ApiConfig:
    api = api.model_copy()
    if api.api_key_file:
        api._api_key = SecretStr(_read_secret_file("api.api_key_file", api.api_key_file, base, env))
    else:
        var = api.api_key_env or ""
        if not env.get(var):
            raise ConfigError("api.api_key_env", f"environment variable {var} is not set")
        api._api_key = SecretStr(env[var].strip())
    return api


def _resolve_account_key(
    index: int, account: AccountConfig, base: Path, env: Mapping[str, str]
) -> AccountConfig:
    account = account.model_copy()
    if account.api_key_file:
        key = f"accounts[{index}].api_key_file"
        account._api_key = SecretStr(_read_secret_file(key, account.api_key_file, base, env))
    else:
        var = account.api_key_env or ""
        if not env.get(var):
            raise ConfigError(
                f"accounts[{index}].api_key_env", f"environment variable {var} is not set"
            )
        account._api_key = SecretStr(env[var].strip())
    return account


_TOKEN_CHARS = re.compile(r"^[\x21-\x7e]+$")


def _resolve_server_token(
    server: ServerConfig | None, base: Path, env: Mapping[str, str]
) -> ServerConfig | None:
    if server is None or not (server.token_env or server.token_file):
        return server
    if server.token_file:
        key = "server.token_file"
        text = _read_secret_file(key, server.token_file, base, env)
    else:
        key, var = "server.token_env", server.token_env or ""
        if not env.get(var):
            raise ConfigError(key, f"environment variable {var} is not set")
        text = env[var].strip()
    if not TOKEN_MIN_CHARS <= len(text) <= TOKEN_MAX_CHARS:
        raise ConfigError(
            key,
            f"the token must be {TOKEN_MIN_CHARS} to {TOKEN_MAX_CHARS} characters, not "
            f"{len(text)} (create one with `sessionhook secret token`)",
        )
    if not _TOKEN_CHARS.match(text):
        raise ConfigError(key, "the token must be visible ASCII characters without spaces")
    resolved = server.model_copy()
    resolved._token = SecretStr(text)
    return resolved


def _resolve_endpoint_secrets(
    configured: Sequence[EndpointConfig], base: Path, env: Mapping[str, str]
) -> tuple[EndpointConfig, ...]:
    endpoints = []
    for i, endpoint in enumerate(configured):
        if endpoint.secret is not None:
            key, text = f"endpoints[{i}].secret", endpoint.secret.get_secret_value()
        elif endpoint.secret_env:
            key = f"endpoints[{i}].secret_env"
            if not env.get(endpoint.secret_env):
                raise ConfigError(key, f"environment variable {endpoint.secret_env} is not set")
            text = env[endpoint.secret_env]
        else:
            key = f"endpoints[{i}].secret_file"
            text = _read_secret_file(key, endpoint.secret_file or "", base, env)
        try:
            parts = _split_secrets(text, endpoint.signature)
        except ValueError as exc:
            raise ConfigError(key, f"not a valid secret: {exc}") from None
        resolved = endpoint.model_copy()
        resolved._secrets = tuple(SecretStr(p) for p in parts)
        endpoints.append(resolved)
    return tuple(endpoints)


def _translate(exc: ValidationError) -> ConfigError:
    """The first pydantic error as a one-line ConfigError (never a pydantic dump)."""
    err = exc.errors()[0]
    key = ""
    for part in err["loc"]:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return ConfigError(key or "config", _problem(err["type"], err.get("ctx") or {}, err["msg"]))


_SIMPLE_PROBLEMS = {
    "extra_forbidden": "unknown key",
    "missing": "is required",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be an integer",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "tuple_type": "must be a list",
    "model_type": "must be a table",
    "model_attributes_type": "must be a table",
    "dict_type": "must be a table",
    "too_short": "must not be empty",
    "string_too_short": "must not be empty",
    "finite_number": "must be a finite number",
    "path_type": "must be a string",
    "too_long": "has too many items",
}


def _problem(kind: str, ctx: dict[str, Any], msg: str) -> str:
    if kind in _SIMPLE_PROBLEMS:
        return _SIMPLE_PROBLEMS[kind]
    if kind == "value_error":
        return str(ctx.get("error", msg.removeprefix("Value error, ")))
    if kind == "greater_than":
        return f"must be > {ctx['gt']}"
    if kind == "greater_than_equal":
        return f"must be >= {ctx['ge']}"
    if kind == "less_than_equal":
        return f"must be <= {ctx['le']}"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}"
    return msg[:1].lower() + msg[1:]
