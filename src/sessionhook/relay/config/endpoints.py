"""``[[endpoints]]``: one webhook receiver (:class:`EndpointConfig`) and its signing secrets.

A secret is ``whsec_`` + base64 (HMAC, ``"v1"``) of :data:`SECRET_MIN_BYTES` to
:data:`SECRET_MAX_BYTES` bytes, or a ``whsk_`` ed25519 key (``"v1a"``); several, space
separated during a rotation (:func:`split_secrets`). Validating never runs the template
(:func:`~.loading.check_templates` does).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator

from ..domain.addresses import UnusableUrlError, destination
from ..domain.events import EVENT_TYPES, matches
from ..domain.render import Shape
from ..domain.signing import SECRET_PREFIX, SIGNING_KEY_PREFIX, decode_secret, decode_signing_key
from .errors import ConfigError
from .fields import Name, Seconds, Section, http_url, within

#: Standard Webhooks secrets are 24 to 64 random bytes (after the base64 decoding).
SECRET_MIN_BYTES = 24
SECRET_MAX_BYTES = 64


class EndpointConfig(Section):
    """``[[endpoints]]``: one webhook receiver; exactly one of ``secret``, ``secret_env``,
    ``secret_file`` gives its signing secret(s)."""

    name: Name
    url: str
    secret: SecretStr | None = None
    secret_env: str | None = None
    secret_file: str | None = None
    events: Annotated[
        tuple[Annotated[str, Field(min_length=1)], ...], Field(min_length=1, strict=False)
    ] = ("*",)
    disable_after: Annotated[Seconds, within("endpoints[].disable_after")] = 5 * 86400.0
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

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        http_url(value)
        try:
            # The host the senders will connect to must be a plain name or address once
            # normalized (whatever allow_private_networks says); the config judges it.
            destination(value)
        except UnusableUrlError as exc:
            raise ValueError(exc.reason) from None
        return value

    @field_validator("secret")
    @classmethod
    def _check_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            text = value.get_secret_value()
            # Checked again against ``signature`` once the whole endpoint is read.
            asymmetric = text.strip().startswith(SIGNING_KEY_PREFIX)
            split_secrets(text, "v1a" if asymmetric else "v1")
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
                split_secrets(self.secret.get_secret_value(), self.signature)
            except ValueError as exc:
                raise ValueError(f"secret: {exc}") from None
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
            texts = split_secrets(self.secret.get_secret_value(), self.signature)
            return [SecretStr(s) for s in texts]
        return list(self._secrets)

    def with_secrets(self, secrets: tuple[SecretStr, ...]) -> EndpointConfig:
        """A copy holding the resolved signing secrets, first to last."""
        resolved = self.model_copy()
        resolved._secrets = secrets
        return resolved


def split_secrets(text: str, signature: str = "v1") -> list[str]:
    """The space-separated secrets in ``text``, each checked for ``signature`` (``whsec_``
    for ``v1``, ``whsk_`` for ``v1a``); :class:`ValueError` says what is wrong."""
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
