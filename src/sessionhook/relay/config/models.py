"""The relay's configuration: frozen pydantic models, one per section, and :class:`Config`.

Build it with :func:`~sessionhook.relay.config.loading.load_config`. Secrets are
:class:`pydantic.SecretStr`, set resolved on copies (``with_api_key``, ``with_secrets``,
``with_token``). Types are strict: nothing is coerced. Durations
(:data:`~sessionhook.relay.config.fields.DURATION_BOUNDS`) are seconds or a string with a
unit (``"90s"``, ``"15m"``), finite and within their key's bounds.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator

from ..domain.addresses import literal_refusal
from .actions import ActionsConfig
from .database_url import check_postgres_url, display_url
from .endpoints import EndpointConfig
from .errors import ConfigError
from .fields import (
    LAX,
    Name,
    Seconds,
    Section,
    TextPath,
    at_least,
    http_url,
    is_loopback,
    within,
)
from .slack import SlackConfig

#: The SQLite file's name when ``store.path`` does not give one.
DEFAULT_DB_NAME = "sessionhook.db"

#: The web token (``server.token_env`` / ``server.token_file``): visible ASCII, no spaces.
TOKEN_MIN_CHARS = 32
TOKEN_MAX_CHARS = 512


class ApiConfig(Section):
    """``[api]``: where the Sessions API is and how to authenticate."""

    base_url: str = "http://127.0.0.1:8080"
    api_key_env: str | None = "SESSIONHOOK_API_KEY"
    api_key_file: str | None = None
    api_key_header: Annotated[str, Field(min_length=1)] = "x-vendor-api-key"
    requests_per_minute: Annotated[int, Field(gt=0, le=1_000_000)] = 600
    #: Deadline of one upstream exchange, from sending to the last byte of the answer.
    timeout: Annotated[Seconds, within("api.timeout")] = 30.0
    #: Bytes of one upstream answer read at most (16 MiB); 64 KiB .. 1 GiB.
    max_response_bytes: Annotated[int, Field(ge=65_536, le=1 << 30)] = 16 << 20

    _api_key: SecretStr | None = PrivateAttr(default=None)

    @field_validator("base_url")
    @classmethod
    def _check_base_url(cls, value: str) -> str:
        value = http_url(value).rstrip("/")
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

    def with_api_key(self, key: SecretStr) -> ApiConfig:
        """A copy holding the resolved API key."""
        resolved = self.model_copy()
        resolved._api_key = key
        return resolved


#: The name of the one account a config without ``[[accounts]]`` follows (``[api]``).
DEFAULT_ACCOUNT = "default"


class AccountConfig(Section):
    """``[[accounts]]``: one account of the Sessions API with its own discovery and budget;
    ``base_url``, ``api_key_header`` and ``requests_per_minute`` default to ``[api]``'s."""

    name: Name
    base_url: str | None = None
    api_key_env: str | None = None
    api_key_file: str | None = None
    requests_per_minute: Annotated[int, Field(gt=0)] | None = None

    _api_key: SecretStr | None = PrivateAttr(default=None)

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

    def with_api_key(self, key: SecretStr) -> AccountConfig:
        """A copy holding the resolved API key."""
        resolved = self.model_copy()
        resolved._api_key = key
        return resolved


@dataclass(frozen=True)
class Account:
    """One upstream account as the daemon uses it: ``[[accounts]]`` merged with ``[api]``."""

    name: str
    base_url: str
    api_key: SecretStr
    api_key_header: str
    requests_per_minute: int


class StoreConfig(Section):
    """``[store]``: a SQLite file (``path``, the default) or a PostgreSQL database (``url``,
    or ``url_env`` naming the variable that holds it); at most one of the three."""

    path: TextPath = Path(DEFAULT_DB_NAME)
    #: ``postgresql://user:password@host:port/database`` (after loading: from ``url_env``
    #: too). Shown and logged only through :attr:`location` (no password).
    url: SecretStr | None = None
    url_env: Annotated[str, Field(min_length=1)] | None = None
    #: PostgreSQL connections per relay process (its store's worker threads).
    pool_size: Annotated[int, Field(ge=1, le=64)] = 4
    #: Delete attempts and delivered deliveries older than this (unset: keep everything).
    delivery_log_retention: Annotated[Seconds, within("store.delivery_log_retention")] | None = None

    #: How long a replica's claims hold after its last heartbeat (docs/replicas.md).
    lease: Annotated[
        Seconds, within("store.lease"), at_least(1.0, "replicas heartbeat every third of it")
    ] = 15.0

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


class PollConfig(Section):
    """``[poll]``: how often sessions are listed and activities fetched (seconds)."""

    active_interval: Annotated[Seconds, within("poll.active_interval")] = 2.0
    idle_interval: Annotated[Seconds, within("poll.idle_interval")] = 30.0
    discovery_interval: Annotated[Seconds, within("poll.discovery_interval")] = 10.0
    backfill: bool = False
    mode: Literal["auto", "list", "timer"] = "auto"
    list_interval: Annotated[Seconds, within("poll.list_interval")] = 1.0
    safety_interval: Annotated[Seconds, within("poll.safety_interval")] = 30.0
    history_share: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.2
    #: Share of ``api.requests_per_minute`` the full passes over the session list may take.
    list_share: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.5
    #: Pages one walk (a session's activities, the session list) may take.
    max_pages: Annotated[int, Field(ge=1, le=100_000)] = 200


class DeliveryConfig(Section):
    """``[delivery]``: retry schedule, timeouts, limits of the webhook sender."""

    retry_delays: Annotated[
        tuple[Annotated[Seconds, within("delivery.retry_delays[]")], ...],
        Field(min_length=1, max_length=100, strict=False),
    ] = (5, 300, 1800, 7200, 18000, 36000, 36000)
    timeout: Annotated[Seconds, within("delivery.timeout")] = 15.0
    #: A consumer's ``Retry-After`` longer than this is read as this.
    max_retry_after: Annotated[Seconds, within("delivery.max_retry_after")] = 3600.0
    allow_private_networks: bool = False
    max_media_bytes: Annotated[int, Field(ge=0, le=64 * 1024 * 1024)] = 262_144
    response_body_limit: Annotated[int, Field(ge=0, le=1024 * 1024)] = 4096
    concurrency: Annotated[int, Field(ge=1, le=1024)] = 16
    #: A template render taking longer is stopped: that attempt fails.
    render_timeout: Annotated[Seconds, within("delivery.render_timeout")] = 5.0
    #: The most endpoints created at run time the store may hold (a create past it: 409).
    max_endpoints: Annotated[int, Field(ge=0, le=1_000_000)] = 1000


#: ``server.trusted_proxies`` by default: a reverse proxy on the same machine.
DEFAULT_TRUSTED_PROXIES: tuple[str, ...] = ("127.0.0.1", "::1")


class ServerConfig(Section):
    """``[server]``: the daemon's HTTP listener (absent: no listener).

    The health routes are always served. The console and the event stream show payloads, so
    they need a bearer token (``token_env`` or ``token_file``, :data:`TOKEN_MIN_CHARS` to
    :data:`TOKEN_MAX_CHARS` visible ASCII characters) or ``allow_unauthenticated = true`` on a
    loopback ``listen``; with neither they stay off and ``web.console_off`` is logged once.
    """

    listen: str = "127.0.0.1:9187"
    token_env: str | None = Field(default=None, min_length=1)
    token_file: str | None = Field(default=None, min_length=1)
    allow_unauthenticated: bool = False
    #: Concurrent ``/v1/events/stream`` connections; one more is answered 503.
    max_streams: int = Field(default=32, ge=1, le=1024)
    #: Connections the listener holds at once (at most half the open-files limit).
    max_connections: int = Field(default=256, ge=8, le=1 << 20)
    #: Seconds a connection has to send a complete request; then it is closed.
    request_timeout: Annotated[Seconds, within("server.request_timeout"), at_least(1.0)] = 5.0
    #: Peers (addresses or networks) whose ``X-Forwarded-For`` and ``-Proto`` are
    #: believed; empty: every request is its TCP peer's.
    trusted_proxies: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TRUSTED_PROXIES), max_length=64
    )
    _token: SecretStr | None = PrivateAttr(default=None)

    @field_validator("trusted_proxies")
    @classmethod
    def _check_proxies(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                example = "such as 10.0.0.5 or 10.0.0.0/24"
                raise ValueError(f"{entry!r} is not an IP address or network ({example})") from None
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

    def with_token(self, token: SecretStr) -> ServerConfig:
        """A copy holding the resolved bearer token."""
        resolved = self.model_copy()
        resolved._token = token
        return resolved


class McpConfig(Section):
    """``[mcp]``: the MCP server at ``/mcp`` on ``[server] listen`` (docs/mcp.md); served
    whenever the web routes are (a token, or the loopback opt-out)."""

    enabled: bool = True
    #: ``false``: only the read tools (list, get, wait) are served.
    allow_actions: bool = True
    #: Concurrent MCP sessions (2025-11-25 clients); one more is answered 503.
    max_sessions: int = Field(default=64, ge=1, le=10_000)
    #: ``wait_for_session`` calls and resource subscriptions open at once; one more is a
    #: tool error (a wait) or a refused subscription.
    max_waits: int = Field(default=512, ge=1, le=100_000)


class LogConfig(Section):
    """``[log]``: level and format (``auto``: console on a TTY, JSON lines otherwise)."""

    level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    format: Literal["auto", "json", "console"] = "auto"

    @field_validator("level", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value


class Config(Section):
    """The whole configuration. Build it with :func:`load_config`."""

    api: ApiConfig = Field(default_factory=ApiConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    poll: PollConfig = Field(default_factory=PollConfig)
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig)
    endpoints: Annotated[tuple[EndpointConfig, ...], LAX] = ()
    server: ServerConfig | None = None
    log: LogConfig = Field(default_factory=LogConfig)
    accounts: Annotated[tuple[AccountConfig, ...], LAX] = ()
    actions: ActionsConfig = Field(default_factory=ActionsConfig)
    #: A Slack app's interactivity (:mod:`.slack`); ``None``: off.
    slack: SlackConfig | None = None
    mcp: McpConfig = Field(default_factory=McpConfig)

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
    def _actions_need_the_web_server(self) -> Config:
        if self.actions.enabled and self.server is None:
            # Raised as ConfigError (not ValueError) so the key names the section.
            raise ConfigError(
                "actions.enabled", "the action pages are served on [server] listen: add [server]"
            )
        if self.actions.require_login and (self.server is None or not self.server.web_enabled):
            raise ConfigError(
                "actions.require_login",
                "needs the console's login: set server.token_env or server.token_file",
            )
        if self.slack is not None and not self.actions.enabled:
            raise ConfigError(
                "slack", "a Slack app's buttons act through the action links: enable [actions]"
            )
        return self

    @model_validator(mode="after")
    def _no_private_only_endpoint(self) -> Config:
        # A URL that can only reach a refused address would fail every attempt: say so
        # now, not in the delivery log (names are judged when connecting).
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


# --------------------------------------------------------------------------- helpers


def _split_listen(value: str) -> tuple[str, int]:
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError('must be "host:port", for example "127.0.0.1:9187"')
    return host.removeprefix("[").removesuffix("]"), int(port_text)
