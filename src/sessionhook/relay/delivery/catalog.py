"""The endpoints created at run time, as a dispatcher delivers to them: :class:`EndpointCatalog`.

Each dispatcher round reads the newest definition revision (in its one store call); when it
is newer than the catalog's, the catalog reads and builds only the definitions changed since
(:meth:`~..store.endpoints.EndpointQueries.endpoint_changes`), or the one whose rotation
overlap ended. Building an endpoint checks its definition but never runs its template (that
was checked when defined, and renders in a child process).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from ..config import EndpointConfig
from ..config.endpoint_spec import spec_endpoint
from ..domain.rows import StoredEndpoint
from ..store import AsyncStore, EndpointQueries
from ..telemetry import logs as relay_logging
from ..telemetry.logs import get_logger

_log = get_logger()

#: Endpoints created at run time by name: the config to deliver with, its signing secrets.
Loaded = Mapping[str, tuple[EndpointConfig, tuple[str, ...]]]
#: What a load changed: the endpoints built (new, changed, rotated) and the names gone
#: (deleted, or a definition that does not build any more).
Changes = tuple[Loaded, frozenset[str]]


class EndpointCatalog:
    """What a dispatcher knows of the endpoints created at run time (see the module
    docstring): :meth:`stale` after each round, :meth:`load` when it is."""

    def __init__(self, store: AsyncStore) -> None:
        self._store = store
        #: The newest revision read (``None``: nothing loaded yet).
        self._revision: int | None = None
        #: Each live endpoint's row as last read (its secrets, its overlap).
        self._rows: dict[str, StoredEndpoint] = {}
        self._loaded: dict[str, tuple[EndpointConfig, tuple[str, ...]]] = {}
        #: When each rotation's overlap ends (its previous secret stops signing), and the
        #: earliest of them.
        self._overlaps: dict[str, float] = {}
        self._expires = math.inf
        #: The endpoints a stored definition could not be built for, by revision (logged once).
        self._refused: dict[str, int] = {}

    @property
    def loaded(self) -> Loaded:
        """Every endpoint created at run time that builds, as last loaded."""
        return self._loaded

    def stale(self, revision: int, now: float) -> bool:
        """Whether what was loaded is out of date: a definition of a revision newer than
        the one held (created, changed, rotated, deleted), or an overlap that has ended."""
        return self._revision is None or revision != self._revision or now >= self._expires

    async def load(self, now: float) -> Changes:
        """Read and build what changed (everything the first time), the secrets signing at
        ``now``; a definition that does not build is logged and left out (its deliveries wait)."""
        since = self._revision or 0
        changes = await self._store.run(
            EndpointQueries.endpoint_changes, since
        )  # raises: the caller keeps
        rows = {row.name: row for row in changes.live}
        # An ended overlap: built again from the row held (the store has nothing newer),
        # without its previous secret from now on.
        for name, until in self._overlaps.items():
            if until <= now and name not in rows:
                rows[name] = replace(self._rows[name], previous_secret=None, previous_until=None)
        gone = set(changes.gone)
        built: dict[str, tuple[EndpointConfig, tuple[str, ...]]] = {}
        for name, row in rows.items():
            outcome = self._build(row, now)
            if outcome is None:
                gone.add(name)
            else:
                built[name] = outcome
        for name in gone:
            self._rows.pop(name, None)
            self._loaded.pop(name, None)
            self._overlaps.pop(name, None)
        for name in built:
            row = self._rows[name] = rows[name]
            if row.previous_secret and row.previous_until is not None and row.previous_until > now:
                self._overlaps[name] = row.previous_until
            else:
                self._overlaps.pop(name, None)
        self._loaded.update(built)
        self._revision = changes.revision
        self._expires = min(self._overlaps.values(), default=math.inf)
        return built, frozenset(gone)

    def _build(
        self, row: StoredEndpoint, now: float
    ) -> tuple[EndpointConfig, tuple[str, ...]] | None:
        """The endpoint of ``row`` and its secrets at ``now``; ``None`` (logged) if unbuildable."""
        secrets = row.secrets_at(now)
        try:
            endpoint = spec_endpoint(row.name, row.spec, secrets, allow_private_networks=True)
        except ValueError as exc:
            if self._refused.get(row.name) != row.revision:
                _log.error("endpoint.unusable", endpoint=row.name, error=str(exc))
            self._refused[row.name] = row.revision
            return None
        self._refused.pop(row.name, None)
        for secret in secrets:
            relay_logging.register_secret(secret)
        return endpoint, secrets
