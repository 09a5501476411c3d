"""Endpoints created at run time: create, update, delete, rotate the secret, behind the
management API (``/v1/endpoints``) and ``sessionhook endpoints create|update|delete|rotate-secret``.

Such an endpoint lives in the store with its definition and signing secret, so every replica
delivers to it; an endpoint of the config file stays the file's (:class:`EndpointConflictError`).
Defining renders a template against every sample event in a child process
(:func:`~..delivery.template_check.check_template`), so :func:`define_endpoint` and
:func:`redefine_endpoint` run off the event loop; the writes run in the store's thread.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, ParamSpec, TypeVar

from ...redact import redact_userinfo
from ..config import DEFAULT_ACCOUNT, Config, EndpointConfig
from ..config.endpoint_spec import (
    MAX_DESCRIPTION_CHARS,
    SPEC_KEYS,
    check_endpoint_name,
    check_one_secret,
    spec_endpoint,
)
from ..delivery.template_check import check_template
from ..domain.api_models import DEFAULT_OVERLAP, ApiEndpoint
from ..domain.render import RenderError
from ..domain.rows import EndpointSpec, EndpointState, StoredEndpoint
from ..domain.signing import generate_secret
from ..store import (
    EndpointConflictError as StoreConflict,
)
from ..store import EndpointLimitError, StoreCore, StoreError
from ..store.policy import write
from .endpoint_switches import endpoints, find_endpoint
from .errors import OperatorError, UnknownEndpointError
from .overview import endpoints_in_flight
from .wire import endpoint_state_answer

P = ParamSpec("P")
T = TypeVar("T")

#: The longest overlap a rotation may ask for.
MAX_OVERLAP: Final = 30 * 86400.0
#: The last error of the open deliveries of an endpoint deleted at run time (now dead).
DELETED_REASON: Final = "endpoint deleted"
#: What a URL may not hold unencoded (RFC 3986): spaces, control characters (a NUL, which
#: PostgreSQL cannot store either), and the characters that end an HTML attribute or tag.
_NOT_IN_URL: Final = re.compile(r'[\x00-\x20\x7f"<>\\^`{|}]')
#: Control characters a description may not hold (tab and newline it may).
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class EndpointConflictError(OperatorError):
    """The name is taken, or the endpoint is the config file's to change (HTTP 409)."""


class InvalidEndpointError(OperatorError):
    """A definition that the config file would refuse too (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class Definition:
    """A checked definition: what the store keeps, and the endpoint it delivers as."""

    spec: EndpointSpec
    endpoint: EndpointConfig


@dataclass(frozen=True, slots=True)
class Rotation:
    """A rotation's new secret (shown once) and when the replaced one stops signing."""

    secret: str
    previous_until: float


def define_endpoint(
    config: Config,
    name: str,
    spec: Mapping[str, Any],
    *,
    description: str = "",
    secret: str | None = None,
) -> tuple[Definition, str]:
    """Check a new endpoint ``name`` (``spec``: keys of ``[[endpoints]]``) against
    ``config`` (its names, accounts and address rule; a template rendered against the
    samples in a child process); returns the definition and its secret (``secret``, or a
    new ``whsec_`` one)."""
    try:
        check_endpoint_name(name)
        chosen = generate_secret() if secret is None else check_one_secret(secret)
    except ValueError as exc:
        raise InvalidEndpointError(str(exc)) from None
    _not_in_file(config, name)
    return _definition(config, name, spec, description, chosen), chosen


def redefine_endpoint(
    config: Config,
    current: StoredEndpoint,
    changes: Mapping[str, Any],
    *,
    description: str | None = None,
) -> Definition:
    """``current`` with ``changes`` (a key set to ``None`` goes back to its default),
    checked as :func:`define_endpoint` checks a new one."""
    spec = {k: v for k, v in {**current.spec, **changes}.items() if v is not None}
    told = current.description if description is None else description
    return _definition(config, current.name, spec, told, current.secret)


def _definition(
    config: Config, name: str, spec: Mapping[str, Any], description: str, secret: str
) -> Definition:
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise InvalidEndpointError(f"description: at most {MAX_DESCRIPTION_CHARS} characters")
    if _CONTROL.search(description):
        raise InvalidEndpointError("description: must not hold control characters (such as NUL)")
    url = spec.get("url")
    if isinstance(url, str) and _NOT_IN_URL.search(url):
        raise InvalidEndpointError(
            'url: must not hold spaces, control characters or any of " < > \\ ^ ` { | } '
            "(percent-encode them)"
        )
    try:
        endpoint = spec_endpoint(
            name,
            spec,
            [secret],
            allow_private_networks=config.delivery.allow_private_networks,
            # The accounts' names (upstream_accounts() needs their resolved keys).
            accounts=[a.name for a in config.accounts] or [DEFAULT_ACCOUNT],
        )
    except ValueError as exc:
        raise InvalidEndpointError(str(exc)) from None
    if endpoint.template is not None:
        try:
            check_template(endpoint.shape, config.delivery.render_timeout)
        except RenderError as exc:
            raise InvalidEndpointError(str(exc)) from None
    kept = EndpointSpec(
        name=name,
        url=endpoint.url,
        events=tuple(endpoint.events),
        filter=dict(endpoint.filter),
        accounts=endpoint.accounts,
        spec={k: v for k, v in spec.items() if k in SPEC_KEYS},
        description=description,
    )
    return Definition(kept, endpoint)


def _not_in_file(config: Config, name: str) -> None:
    if config.endpoint_by_name(name) is not None:
        raise EndpointConflictError(
            f"endpoint {name!r} is defined in the config file: change it there (and reload)"
        )


def stored_or_refused(store: StoreCore, config: Config, name: str) -> StoredEndpoint:
    """The endpoint created at run time ``name``; an :class:`EndpointConflictError` for one
    of the config file, :class:`~.UnknownEndpointError` for a name nobody has."""
    _not_in_file(config, name)
    stored = store.endpoints.stored_endpoint(name)
    if stored is not None:
        return stored
    state = find_endpoint(store, name)  # UnknownEndpointError naming the known ones
    raise EndpointConflictError(
        f"endpoint {name!r} is defined in the config file"
        + ("" if state.configured else " (it was: its history is kept under that name)")
    )


@write
def create_endpoint(
    store: StoreCore, config: Config, definition: Definition, secret: str
) -> EndpointState:
    """Create the endpoint ``definition`` describes, signing with ``secret``; refused
    (:class:`EndpointConflictError`) when the store holds ``delivery.max_endpoints``
    endpoints created at run time already."""
    limit = config.delivery.max_endpoints
    try:
        store.endpoints.create_endpoint(definition.spec, secret, limit)
    except EndpointLimitError as exc:
        raise EndpointConflictError(
            f"no more endpoints can be created at run time: delivery.max_endpoints is {limit} "
            f"(the store holds {exc.held}); delete one first, or raise the limit"
        ) from None
    except StoreConflict as exc:
        raise EndpointConflictError(str(exc)) from None
    return find_endpoint(store, definition.spec.name)


@write
def update_endpoint(store: StoreCore, definition: Definition) -> EndpointState:
    """Replace the definition of an endpoint created at run time."""
    _store_call(store.endpoints.update_endpoint, definition.spec)
    return find_endpoint(store, definition.spec.name)


@write
def delete_endpoint(store: StoreCore, config: Config, name: str) -> int:
    """Delete the endpoint created at run time ``name``: its secrets are erased and its
    open deliveries become dead (last error :data:`DELETED_REASON`); returns how many."""
    stored_or_refused(store, config, name)
    return _store_call(store.endpoints.delete_endpoint, name, DELETED_REASON)


@write
def rotate_secret(
    store: StoreCore,
    config: Config,
    name: str,
    *,
    now: float,
    overlap: float = DEFAULT_OVERLAP,
    secret: str | None = None,
) -> Rotation:
    """Give ``name`` a new secret (``secret``, or a new one); the old one keeps signing
    beside it for ``overlap`` seconds, so a consumer can switch within that time."""
    if not 0 <= overlap <= MAX_OVERLAP:
        raise InvalidEndpointError(f"overlap: 0 to {MAX_OVERLAP:g} seconds, not {overlap:g}")
    try:
        chosen = generate_secret() if secret is None else check_one_secret(secret)
    except ValueError as exc:
        raise InvalidEndpointError(str(exc)) from None
    stored_or_refused(store, config, name)
    _store_call(store.endpoints.rotate_endpoint_secret, name, chosen, now + overlap)
    return Rotation(chosen, now + overlap)


def endpoint_config(store: StoreCore, config: Config, name: str, now: float) -> EndpointConfig:
    """The endpoint ``name`` as a delivery sees it: the config file's, or the one created
    at run time with the secrets signing at ``now``. :class:`~.UnknownEndpointError`
    otherwise."""
    in_file = config.endpoint_by_name(name)
    if in_file is not None:
        return in_file
    stored = stored_or_refused(store, config, name)
    try:
        return spec_endpoint(name, stored.spec, stored.secrets_at(now), allow_private_networks=True)
    except ValueError as exc:  # stored by an older version that checked less
        raise OperatorError(f"endpoint {name!r} cannot be used: {exc}") from None


def _store_call(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args)``; the store's "no such endpoint" as :class:`~.UnknownEndpointError`
    (deleted meanwhile)."""
    try:
        return fn(*args, **kwargs)
    except StoreConflict as exc:
        raise EndpointConflictError(str(exc)) from None
    except StoreError as exc:
        if "no endpoint" in str(exc):
            raise UnknownEndpointError(str(exc)) from None
        raise


def endpoint_answers(
    store: StoreCore, config: Config, now: float, name: str | None = None
) -> list[ApiEndpoint]:
    """Every endpoint (or the one ``name``: :class:`~.UnknownEndpointError` when there is
    none) as the API and ``--json`` show it: its state, open deliveries, deliveries in
    flight per replica, and what it is defined as (never a secret, nor a URL's user-info):
    its keys of ``[[endpoints]]`` and, while a rotation's overlap lasts, when it ends."""
    if name is None:
        listed = endpoints(store)
        stored = {e.name: e for e in store.endpoints.stored_endpoints()}
    else:  # its own rows only, however many endpoints there are
        state = find_endpoint(store, name)
        listed = [(state, store.outbox.pending_count(name))]
        one = store.endpoints.stored_endpoint(name)
        stored = {} if one is None else {name: one}
    claims = endpoints_in_flight(store, now)
    answers = []
    for state, pending in listed:
        answer = dict(endpoint_state_answer(state, pending, claims.get(state.name)))
        # A URL's user-info is a credential of the consumer's: never shown.
        answer["url"] = redact_userinfo(state.url)
        kept, in_file = stored.get(state.name), config.endpoint_by_name(state.name)
        if kept is not None:
            answer["definition"] = dict(kept.spec)
            answer["previous_secret_expires_at"] = (
                kept.previous_until if kept.previous_secret is not None else None
            )
        elif in_file is not None:
            answer["definition"] = in_file.model_dump(
                mode="json", include=set(SPEC_KEYS), exclude_defaults=True
            )
        if "url" in answer.get("definition", {}):
            answer["definition"]["url"] = redact_userinfo(answer["definition"]["url"])
        answers.append(ApiEndpoint.model_validate(answer))
    return answers
