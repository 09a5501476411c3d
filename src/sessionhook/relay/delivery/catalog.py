"""The endpoints created at run time, as a dispatcher delivers to them: :class:`EndpointCatalog`.

Those endpoints live in the store (``sessionhook endpoints create``, ``POST /v1/endpoints``,
on any replica). Each round of the dispatcher reads the active endpoints with the revision
of their definitions (in the round's one store call, no extra query); when one differs from
what the catalog holds, or a rotation's overlap has ended, the catalog reads them all again
(with their secrets) and the dispatcher delivers with the new set from its next round on.
On PostgreSQL every change also notifies every replica (:mod:`..store.notify`), so an idle
dispatcher makes that round at once rather than at its timer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import anyio.to_thread

from ..config import EndpointConfig
from ..config.endpoint_spec import spec_endpoint
from ..store import AsyncStore, StoredEndpoint
from ..telemetry import logs as relay_logging
from ..telemetry.logs import get_logger

__all__ = ["EndpointCatalog", "Loaded"]

_log = get_logger()

#: Endpoints created at run time by name: the config to deliver with, its signing secrets.
Loaded = Mapping[str, tuple[EndpointConfig, tuple[str, ...]]]


class EndpointCatalog:
    """What a dispatcher knows of the endpoints created at run time (see the module
    docstring): :meth:`stale` after each round, :meth:`load` when it is."""

    def __init__(self, store: AsyncStore) -> None:
        self._store = store
        #: The revision of each endpoint loaded (``None``: nothing loaded yet).
        self._revisions: dict[str, int] | None = None
        #: When the earliest overlap of a rotation ends (the previous secret stops signing).
        self._expires = math.inf
        #: The endpoints a stored definition could not be built for, by revision (logged once).
        self._refused: dict[str, int] = {}

    def stale(self, active: Iterable[tuple[str, int]], now: float) -> bool:
        """Whether what was loaded is out of date: an active endpoint of a revision not
        loaded (created, changed, rotated), or an overlap that has ended."""
        if self._revisions is None or now >= self._expires:
            return True
        known = self._revisions
        return any(
            revision and known.get(name) != revision and self._refused.get(name) != revision
            for name, revision in active
        )

    async def load(self, now: float) -> Loaded:
        """Every live endpoint created at run time, built from its stored definition, with
        the secrets signing at ``now``. A definition that does not build (stored by a
        version that checked less) is logged and left out: its deliveries wait."""
        rows = await self._store.endpoints.stored_endpoints()  # raises: the caller keeps
        # Building renders each template against the sample events: off the event loop.
        built = await anyio.to_thread.run_sync(_build, rows, now) if rows else []
        self._revisions = {row.name: row.revision for row in rows}
        self._expires = min(
            (
                row.previous_until
                for row in rows
                if row.previous_secret
                and row.previous_until is not None
                and row.previous_until > now
            ),
            default=math.inf,
        )
        loaded: dict[str, tuple[EndpointConfig, tuple[str, ...]]] = {}
        for row, outcome in zip(rows, built, strict=True):
            if isinstance(outcome, str):
                if self._refused.get(row.name) != row.revision:
                    _log.error("endpoint.unusable", endpoint=row.name, error=outcome)
                self._refused[row.name] = row.revision
                continue
            self._refused.pop(row.name, None)
            secrets = row.secrets_at(now)
            for secret in secrets:
                relay_logging.register_secret(secret)
            loaded[row.name] = (outcome, secrets)
        return loaded


def _build(rows: list[StoredEndpoint], now: float) -> list[EndpointConfig | str]:
    """Each row's endpoint, or why it cannot be built. Its URL was judged when it was
    defined (as a config file's is when read); every POST is judged again."""
    out: list[EndpointConfig | str] = []
    for row in rows:
        try:
            out.append(
                spec_endpoint(row.name, row.spec, row.secrets_at(now), allow_private_networks=True)
            )
        except ValueError as exc:
            out.append(str(exc))
    return out
