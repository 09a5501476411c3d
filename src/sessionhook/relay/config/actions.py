"""``[actions]``: signed links in ``session.action_required`` events that let a person approve
a plan or answer the agent from the chat message (the pages behind them are served on
``[server] listen``, reached through ``public_url``).

The links are signed with a key the relay keeps in ``key_file`` (:mod:`.action_keys`).
"""

from __future__ import annotations

from typing import Annotated, Final
from urllib.parse import urlsplit

from pydantic import field_validator, model_validator

from .fields import Seconds, Section, TextPath, is_loopback, within

#: The key file's name next to the store when ``key_file`` is not set.
DEFAULT_KEY_FILE: Final = "action-links.key"


class ActionsConfig(Section):
    """``[actions]``: see the module docstring."""

    enabled: bool = False
    #: How people's browsers reach ``[server] listen`` (normally an https reverse proxy).
    public_url: str | None = None
    #: How long a link works after its event was built (seconds).
    link_ttl: Annotated[Seconds, within("actions.link_ttl")] = 86400.0
    #: After loading: an absolute path (default: next to the store).
    key_file: TextPath | None = None
    #: The pages need the console's login as well as the link.
    require_login: bool = False

    @field_validator("public_url")
    @classmethod
    def _check_public_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an https URL (http only for a loopback host)")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError("must be a plain base URL (no query, fragment or user)")
        if parts.scheme == "http" and not is_loopback(parts.hostname):
            raise ValueError(
                "must be https: the links are capabilities and must not travel in clear"
                " (http is accepted for a loopback host only)"
            )
        return value.rstrip("/")

    @model_validator(mode="after")
    def _public_url_when_enabled(self) -> ActionsConfig:
        if self.enabled and self.public_url is None:
            raise ValueError("public_url is required when enabled = true")
        return self
