"""``[slack]``: a Slack app's interactivity, for teams that install one (absent: off).

Clicks arrive signed with the app's signing secret (``signing_secret_file`` or
``signing_secret_env``, exactly one). The relay answers on the message's ``response_url``
only on ``response_url_hosts`` over https (plain http only for a loopback host listed by
name, for tests).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Final

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator

from .errors import ConfigError
from .fields import LAX, Section

#: Where Slack's ``response_url`` points.
DEFAULT_RESPONSE_URL_HOSTS: Final = ("hooks.slack.com",)
_HOST_NAME: Final = re.compile(
    r"(?=.{1,253}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*"
)


class SlackConfig(Section):
    """``[slack]``: see the module docstring."""

    signing_secret_file: str | None = Field(default=None, min_length=1)
    signing_secret_env: str | None = Field(default=None, min_length=1)
    #: Hosts a ``response_url`` may name (lower case; an IP literal without brackets).
    response_url_hosts: Annotated[tuple[str, ...], LAX] = DEFAULT_RESPONSE_URL_HOSTS
    _secret: SecretStr | None = PrivateAttr(default=None)

    @field_validator("response_url_hosts")
    @classmethod
    def _check_hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("name at least one host (Slack's is hooks.slack.com)")
        for host in value:
            if not (_HOST_NAME.fullmatch(host) or _ip_literal(host)):
                raise ValueError(
                    f"{host[:80]!r} is not a host name in lower case (no scheme, port or path)"
                )
        return value

    @model_validator(mode="after")
    def _one_secret_source(self) -> SlackConfig:
        if bool(self.signing_secret_file) == bool(self.signing_secret_env):
            raise ValueError("set exactly one of signing_secret_file or signing_secret_env")
        return self

    @property
    def signing_secret(self) -> SecretStr:
        """The app's signing secret; raises :class:`ConfigError` when it was not resolved
        (``load_config(resolve_secrets=False)``)."""
        if self._secret is None:
            raise ConfigError("slack.signing_secret", "the signing secret was not resolved")
        return self._secret

    def with_signing_secret(self, secret: SecretStr) -> SlackConfig:
        """A copy holding the resolved signing secret."""
        resolved = self.model_copy()
        resolved._secret = secret
        return resolved


def _ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
