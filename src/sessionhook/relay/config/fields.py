"""The building blocks of the configuration's sections.

* :class:`Section`, the base of every section: strict, frozen, unknown keys refused;
* durations: a TOML number of seconds or a string with a unit (``"90s"``, ``"15m"``,
  ``"12h"``, ``"5d"``), finite and within the bounds of their key (:data:`DURATION_BOUNDS`);
  a field declares one as ``Annotated[Seconds, within("poll.idle_interval")]``;
* the checks several sections share: :func:`http_url`, :data:`Name`, :data:`TextPath`.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field


class Section(BaseModel):
    """Base of every section of the configuration."""

    # strict: no "yes" -> True, "15" -> 15.0 or 2.0 -> 2; a TOML value must have the
    # key's type. Tuples and paths opt out at the field (TOML gives lists and strings),
    # their items stay strict.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


#: A field whose container is not strict (TOML gives lists and strings for tuples and
#: paths); its items stay strict.
LAX = Field(strict=False)

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def http_url(value: str) -> str:
    """``value`` when it is an http(s) URL with a host; :class:`ValueError` otherwise."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http(s) URL")
    return value


def is_loopback(host: str) -> bool:
    """``127.0.0.0/8``, ``::1`` or ``localhost``: only this machine can connect."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_name(value: str) -> str:
    """``value`` when it can name an endpoint or an account (letters, digits, ``_.-``)."""
    if not _NAME.match(value):
        raise ValueError("must be made of letters, digits, '_', '.' and '-'")
    return value


#: A name of an endpoint or an account (:func:`check_name`).
Name = Annotated[str, AfterValidator(check_name)]


def _path_text(value: object) -> object:
    if not isinstance(value, str | Path):
        raise ValueError("must be a string")
    return value


#: A path: TOML gives a string (anything else is refused as not one).
TextPath = Annotated[Path, BeforeValidator(_path_text), LAX]


_MINUTE, _HOUR, _DAY = 60, 3600, 86400

#: ``key: (lowest, highest)`` in seconds. The highest is inclusive; the lowest is exclusive
#: (the duration must be positive) except for ``retry_delays`` and ``max_retry_after``,
#: which may be 0. A value beyond is refused: an interval of a year or a timeout of a week
#: is a typo, not a wish. docs/configuration.md and config.example.toml document the same figures.
DURATION_BOUNDS: dict[str, tuple[int, int]] = {
    "actions.link_ttl": (0, 30 * _DAY),
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
Seconds = Annotated[float, BeforeValidator(parse_duration)]


def within(key: str) -> Any:
    """The bounds of the duration ``key`` (from :data:`DURATION_BOUNDS`) as a Field."""
    low, high = DURATION_BOUNDS[key]
    return Field(ge=low, le=high) if key in _ZERO_ALLOWED else Field(gt=low, le=high)


def at_least(low: float, why: str = "") -> AfterValidator:
    """A duration's floor above its bounds: ``must be at least <low> s (<why>)``."""

    def check(value: float) -> float:
        if value < low:
            raise ValueError(f"must be at least {low:g} s" + (f" ({why})" if why else ""))
        return value

    return AfterValidator(check)
