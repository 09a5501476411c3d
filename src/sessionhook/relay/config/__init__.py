"""The relay's configuration: frozen, validated sections and :class:`Config` (:mod:`.models`,
``[[endpoints]]`` in :mod:`.endpoints`), their loading (:mod:`.loading`: TOML, environment,
``${VAR}`` in paths, credential files), the building blocks of the sections (:mod:`.fields`:
the strict base, durations with their bounds) and the one error, :class:`ConfigError`.
"""

from .actions import ActionsConfig
from .endpoints import SECRET_MAX_BYTES, SECRET_MIN_BYTES, EndpointConfig
from .errors import ConfigError
from .fields import DURATION_BOUNDS, is_loopback, parse_duration
from .loading import TemplateCheck, check_here, check_templates, load_config, upstream_account
from .models import (
    DEFAULT_ACCOUNT,
    DEFAULT_TRUSTED_PROXIES,
    TOKEN_MAX_CHARS,
    TOKEN_MIN_CHARS,
    Account,
    AccountConfig,
    ApiConfig,
    Config,
    DeliveryConfig,
    LogConfig,
    McpConfig,
    PollConfig,
    ServerConfig,
    StoreConfig,
)
from .slack import SlackConfig

__all__ = [
    "DEFAULT_ACCOUNT",
    "DEFAULT_TRUSTED_PROXIES",
    "DURATION_BOUNDS",
    "SECRET_MAX_BYTES",
    "SECRET_MIN_BYTES",
    "TOKEN_MAX_CHARS",
    "TOKEN_MIN_CHARS",
    "Account",
    "AccountConfig",
    "ActionsConfig",
    "ApiConfig",
    "Config",
    "ConfigError",
    "DeliveryConfig",
    "EndpointConfig",
    "LogConfig",
    "McpConfig",
    "PollConfig",
    "ServerConfig",
    "SlackConfig",
    "StoreConfig",
    "TemplateCheck",
    "check_here",
    "check_templates",
    "is_loopback",
    "load_config",
    "parse_duration",
    "upstream_account",
]
