"""The definition of an endpoint created at run time: the keys of ``[[endpoints]]`` it may
set, checked exactly as the config file's are, and the :class:`~.endpoints.EndpointConfig`
a dispatcher delivers with. It signs with one ``whsec_`` secret, two during a rotation's
overlap. Every check is pure: a failure is a one-line :class:`ValueError` naming the key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from pydantic import ValidationError

from ..domain.addresses import literal_refusal
from .endpoints import EndpointConfig, split_secrets
from .fields import check_name

#: The keys of ``[[endpoints]]`` an endpoint created at run time may set (its name, secret
#: and enabled state are not part of its definition).
SPEC_KEYS: Final = (
    "url",
    "events",
    "accounts",
    "payload",
    "format",
    "template",
    "content_type",
    "filter",
    "rate_limit",
    "disable_after",
)
MAX_NAME_CHARS: Final = 64
MAX_DESCRIPTION_CHARS: Final = 1000
MAX_URL_CHARS: Final = 2048


def check_endpoint_name(name: str) -> str:
    """``name`` when it may name an endpoint created at run time."""
    if not name:
        raise ValueError("name: must not be empty")
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"name: at most {MAX_NAME_CHARS} characters, not {len(name)}")
    try:
        return check_name(name)
    except ValueError as exc:
        raise ValueError(f"name: {exc}") from None


def check_one_secret(secret: str) -> str:
    """``secret`` when it is one ``whsec_`` secret of the right size."""
    try:
        parts = split_secrets(secret, "v1")
    except ValueError as exc:
        raise ValueError(f"secret: {exc}") from None
    if len(parts) != 1:
        raise ValueError("secret: give one secret (a rotation adds the next one)")
    return parts[0]


def spec_endpoint(
    name: str,
    spec: Mapping[str, Any],
    secrets: Sequence[str],
    *,
    allow_private_networks: bool,
    accounts: Iterable[str] | None = None,
) -> EndpointConfig:
    """The endpoint ``name`` defined by ``spec`` (keys of :data:`SPEC_KEYS`), signing with
    ``secrets``, validated as a ``[[endpoints]]`` entry is (template and URL included), its
    accounts among ``accounts`` when given. :class:`ValueError` with one line otherwise."""
    unknown = sorted(set(spec) - set(SPEC_KEYS))
    if unknown:
        raise ValueError(f"{unknown[0]}: not a key of an endpoint (keys: {', '.join(SPEC_KEYS)})")
    url = spec.get("url")
    if isinstance(url, str) and len(url) > MAX_URL_CHARS:
        raise ValueError(f"url: at most {MAX_URL_CHARS} characters")
    try:
        endpoint = EndpointConfig.model_validate(
            {**spec, "name": name, "secret": " ".join(secrets)}
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "endpoint"
        message = str(first["msg"]).removeprefix("Value error, ")
        raise ValueError(f"{where}: {message}".splitlines()[0][:300]) from None
    if not allow_private_networks:
        reason = literal_refusal(endpoint.url)
        if reason is not None:
            raise ValueError(
                f"url: {reason}, refused while delivery.allow_private_networks = false"
            )
    if accounts is not None and endpoint.accounts is not None:
        known = set(accounts)
        for account in endpoint.accounts:
            if account not in known:
                raise ValueError(
                    f"accounts: no account {account!r} (accounts: {', '.join(sorted(known))})"
                )
    return endpoint
