"""Loading the relay's configuration: :func:`load_config`.

It reads the TOML file, validates it into a :class:`~sessionhook.relay.config.Config`
(unknown keys are errors), anchors relative paths at the config file's directory (``$VAR``,
``${VAR}`` and ``~`` expanded) and resolves secrets from the environment or files (a file
others can read is refused: :mod:`.secret_files`). Any problem is one :class:`ConfigError`
whose ``str()`` is a single line naming the key::

    config error: endpoints[1].url: must be an http(s) URL

Each endpoint's ``template`` is rendered against a sample of every event type
(:func:`check_templates`), here (:func:`check_here`) or, in the daemon, in a child process.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError

from ..domain.render import RenderError, Shape, check_shape
from ..domain.samples import sample_events
from .actions import DEFAULT_KEY_FILE
from .database_url import check_postgres_url
from .endpoints import EndpointConfig, split_secrets
from .errors import ConfigError
from .models import (
    DEFAULT_ACCOUNT,
    DEFAULT_DB_NAME,
    TOKEN_MAX_CHARS,
    TOKEN_MIN_CHARS,
    Account,
    AccountConfig,
    ApiConfig,
    Config,
    ServerConfig,
)
from .secret_files import SecretFileError, read_secret_file
from .slack import SlackConfig

#: Renders a template against every sample event within a time budget (seconds), or
#: raises :class:`~..domain.render.RenderError`.
TemplateCheck = Callable[[Shape, float], None]


def check_here(shape: Shape, time_budget: float) -> None:
    """:data:`TemplateCheck` in this process: the sandbox's step and size budgets bound
    each render (``time_budget`` is not enforced: no thread can be stopped)."""
    check_shape(shape, [(event.id, event.body) for event in sample_events()])


def check_templates(config: Config, check: TemplateCheck) -> None:
    """Every ``template`` of ``config``'s endpoints through ``check``, with
    ``delivery.render_timeout``: :class:`ConfigError` naming the endpoint otherwise."""
    for index, endpoint in enumerate(config.endpoints):
        if endpoint.template is None:
            continue
        try:
            check(endpoint.shape, config.delivery.render_timeout)
        except RenderError as exc:
            raise ConfigError(
                f"endpoints[{index}].template", f"endpoint {endpoint.name!r}: {exc}"
            ) from None


def load_config(
    path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    resolve_secrets: bool = True,
    need_api_key: bool = True,
    endpoint_secrets: Collection[str] | None = None,
    templates_here: bool = True,
) -> Config:
    """Read, validate and resolve the TOML config at ``path``.

    ``env`` replaces :data:`os.environ`. ``resolve_secrets=False`` leaves every secret
    unresolved; ``need_api_key=False`` resolves only the endpoint secrets (of
    ``endpoint_secrets``, default all); touching an unresolved one raises ConfigError.
    ``templates_here=False`` leaves the templates to the caller (:func:`check_templates`).
    Raises :class:`ConfigError` for every problem, never a pydantic or TOML exception.
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
    if templates_here:
        check_templates(config, check_here)
    base = file.resolve().parent
    config = _resolve_store_path(config, base, environ)
    config = _resolve_action_key_file(config, base, environ)
    if resolve_secrets:
        # With [[accounts]], each account has its key and [api] only gives defaults.
        api_needs_key = need_api_key and not config.accounts
        api = _resolve_api_key(config.api, base, environ) if api_needs_key else config.api
        accounts = config.accounts
        if need_api_key:
            accounts = tuple(
                _resolve_account_key(i, a, base, environ) for i, a in enumerate(accounts)
            )
        endpoints = _resolve_endpoint_secrets(config.endpoints, base, environ, endpoint_secrets)
        # The web token is the daemon's alone, like the API key (`endpoints test` needs neither).
        server = (
            _resolve_server_token(config.server, base, environ) if need_api_key else config.server
        )
        slack = _resolve_slack_secret(config.slack, base, environ) if need_api_key else None
        config = config.model_copy(
            update={"api": api, "endpoints": endpoints, "accounts": accounts, "server": server}
        )
        if slack is not None:
            config = config.model_copy(update={"slack": slack})
    return config


def upstream_account(
    config: Config,
    path: str | os.PathLike[str],
    name: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    resolve_key: bool = True,
) -> Account:
    """The account ``name`` of ``config`` (loaded with ``resolve_secrets=False``), resolving
    its API key alone (``resolve_key=False``: left empty); ``name`` may be left out with one
    account. :class:`ConfigError` for an unknown name or an unreadable key."""
    environ = os.environ if env is None else env
    base = Path(path).resolve().parent
    api = config.api
    if not config.accounts:
        if name not in (None, DEFAULT_ACCOUNT):
            raise ConfigError("accounts", f"no account {name!r} (the config has [api] alone)")
        key = _resolve_api_key(api, base, environ).api_key if resolve_key else SecretStr("")
        return Account(
            DEFAULT_ACCOUNT, api.base_url, key, api.api_key_header, api.requests_per_minute
        )
    names = [a.name for a in config.accounts]
    if name is None and len(names) == 1:
        name = names[0]
    if name not in names:
        raise ConfigError("accounts", f"no account {name!r} (known: {', '.join(names)})")
    index = names.index(name)
    account = config.accounts[index]
    if resolve_key:
        key = _resolve_account_key(index, account, base, environ).api_key
    else:
        key = SecretStr("")
    return Account(
        account.name,
        account.base_url or api.base_url,
        key,
        api.api_key_header,
        account.requests_per_minute or api.requests_per_minute,
    )


# --------------------------------------------------------------------------- helpers


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


def _resolve_action_key_file(config: Config, base: Path, env: Mapping[str, str]) -> Config:
    """``actions.key_file`` as an absolute path: as given, or next to the SQLite store
    (with PostgreSQL: in ``$STATE_DIRECTORY``, else beside the config file)."""
    actions = config.actions
    if actions.key_file is not None:
        file = _expand_path("actions.key_file", actions.key_file, base, env)
    elif config.store.url is None:
        file = config.store.path.parent / DEFAULT_KEY_FILE
    elif env.get("STATE_DIRECTORY"):
        file = Path(env["STATE_DIRECTORY"].split(":")[0]) / DEFAULT_KEY_FILE
    else:
        file = base / DEFAULT_KEY_FILE
    return config.model_copy(update={"actions": actions.model_copy(update={"key_file": file})})


def _read_secret_file(key: str, raw: str, base: Path, env: Mapping[str, str]) -> str:
    """The secret in the file ``raw`` names; a file its group or other users can access is
    refused (:mod:`.secret_files`: the same rule for every secret file)."""
    try:
        return read_secret_file(_expand_path(key, raw, base, env))
    except SecretFileError as exc:
        raise ConfigError(key, str(exc)) from None


# Resolved secrets go into copies (with_*), so no instance shared with another Config is
# touched.


def _file_or_env(
    key: str, file: str | None, var: str | None, base: Path, env: Mapping[str, str]
) -> tuple[str, str]:
    """The secret in ``file`` (the key ``<key>_file``) or else in the environment variable
    ``var`` (``<key>_env``), and the key it came from (for the next error)."""
    if file:
        return f"{key}_file", _read_secret_file(f"{key}_file", file, base, env)
    if not var or not env.get(var):
        raise ConfigError(f"{key}_env", f"environment variable {var} is not set")
    return f"{key}_env", env[var].strip()


def _resolve_api_key(api: ApiConfig, base: Path, env: Mapping[str, str]) -> ApiConfig:
    _, key = _file_or_env("api.api_key", api.api_key_file, api.api_key_env, base, env)
    return api.with_api_key(SecretStr(key))


def _resolve_account_key(
    index: int, account: AccountConfig, base: Path, env: Mapping[str, str]
) -> AccountConfig:
    where = f"accounts[{index}].api_key"
    _, key = _file_or_env(where, account.api_key_file, account.api_key_env, base, env)
    return account.with_api_key(SecretStr(key))


_TOKEN_CHARS = re.compile(r"^[\x21-\x7e]+$")


def _resolve_server_token(
    server: ServerConfig | None, base: Path, env: Mapping[str, str]
) -> ServerConfig | None:
    if server is None or not (server.token_env or server.token_file):
        return server
    key, text = _file_or_env("server.token", server.token_file, server.token_env, base, env)
    if not TOKEN_MIN_CHARS <= len(text) <= TOKEN_MAX_CHARS:
        raise ConfigError(
            key,
            f"the token must be {TOKEN_MIN_CHARS} to {TOKEN_MAX_CHARS} characters, not "
            f"{len(text)} (create one with `sessionhook secret token`)",
        )
    if not _TOKEN_CHARS.match(text):
        raise ConfigError(key, "the token must be visible ASCII characters without spaces")
    return server.with_token(SecretStr(text))


def _resolve_slack_secret(
    slack: SlackConfig | None, base: Path, env: Mapping[str, str]
) -> SlackConfig | None:
    if slack is None:
        return None
    key, text = _file_or_env(
        "slack.signing_secret", slack.signing_secret_file, slack.signing_secret_env, base, env
    )
    if not _TOKEN_CHARS.match(text):
        raise ConfigError(key, "a signing secret is visible ASCII characters without spaces")
    return slack.with_signing_secret(SecretStr(text))


def _resolve_endpoint_secrets(
    configured: Sequence[EndpointConfig],
    base: Path,
    env: Mapping[str, str],
    names: Collection[str] | None,
) -> tuple[EndpointConfig, ...]:
    endpoints = []
    for i, endpoint in enumerate(configured):
        if names is not None and endpoint.name not in names:
            endpoints.append(endpoint)
            continue
        key = f"endpoints[{i}].secret"
        if endpoint.secret is not None:
            text = endpoint.secret.get_secret_value()
        else:
            key, text = _file_or_env(key, endpoint.secret_file, endpoint.secret_env, base, env)
        try:
            parts = split_secrets(text, endpoint.signature)
        except ValueError as exc:
            raise ConfigError(key, f"not a valid secret: {exc}") from None
        endpoints.append(endpoint.with_secrets(tuple(SecretStr(p) for p in parts)))
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
