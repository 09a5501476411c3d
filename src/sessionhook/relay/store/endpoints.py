"""The ``endpoints`` table: the configured webhook URLs and their run-time state (enabled,
disabled and why, failing since, last success and error)."""

from __future__ import annotations

import json
from collections.abc import Iterable

from .dialect import Database
from .rows import EndpointLike, EndpointState, StoreError

__all__ = ["EndpointQueries"]


class EndpointQueries:
    """The endpoints role (:class:`~.roles.EndpointRole`) over one database."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def sync_endpoints(self, endpoints: Iterable[EndpointLike]) -> None:
        """Make the endpoints table match the config: upsert url and globs, keep the run-time
        enabled state; endpoints missing from the config stay (history) but become inactive.
        """
        now = self._db.clock()
        with self._db.tx() as c:
            names = []
            for ep in endpoints:
                names.append(ep.name)
                # Payload conditions (EndpointConfig.filter); endpoints without are {}.
                conditions = {k: list(v) for k, v in (getattr(ep, "filter", None) or {}).items()}
                accounts = getattr(ep, "accounts", None)  # optional: every account
                c.execute(
                    "INSERT INTO endpoints (name, url, events, configured, enabled, created_at, "
                    "filter, accounts) VALUES (?, ?, ?, ?, 1, ?, ?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET url = excluded.url, "
                    "events = excluded.events, "
                    "configured = excluded.configured, filter = excluded.filter, "
                    "accounts = excluded.accounts",
                    (
                        ep.name,
                        ep.url,
                        json.dumps(list(ep.events)),
                        int(ep.enabled),
                        now,
                        json.dumps(conditions),
                        None if accounts is None else json.dumps(list(accounts)),
                    ),
                )
            c.execute(
                "UPDATE endpoints SET configured = 0 "
                "WHERE name NOT IN (SELECT value FROM json_each(?))",
                (json.dumps(names),),
            )

    def set_endpoint_enabled(self, name: str, enabled: bool, reason: str | None = None) -> None:
        """Enable (clearing the reason and the failing clock) or disable an endpoint.

        Deliveries left pending while it was disabled are sent once it is enabled again.
        """
        now = self._db.clock()
        with self._db.tx() as c:
            if enabled:
                cur = c.execute(
                    "UPDATE endpoints SET enabled = 1, disabled_reason = NULL, "
                    "disabled_at = NULL, failing_since = NULL WHERE name = ?",
                    (name,),
                )
            else:
                cur = c.execute(
                    "UPDATE endpoints SET enabled = 0, disabled_reason = ?, disabled_at = ? "
                    "WHERE name = ?",
                    (reason, now, name),
                )
            if cur.rowcount == 0:
                raise StoreError(f"unknown endpoint {name!r}", path=self._db.path)

    def endpoint_states(self) -> list[EndpointState]:
        """Every endpoint the store knows, by name."""
        rows = self._db.conn.execute(
            "SELECT name, url, events, configured, enabled, disabled_reason, disabled_at, "
            "last_success_at, failing_since, last_error, last_error_at, created_at "
            "FROM endpoints ORDER BY name"
        ).fetchall()
        return [
            EndpointState(
                name=r[0],
                url=r[1],
                events=tuple(json.loads(r[2])),
                configured=bool(r[3]),
                enabled=bool(r[4]),
                disabled_reason=r[5],
                disabled_at=r[6],
                last_success_at=r[7],
                failing_since=r[8],
                last_error=r[9],
                last_error_at=r[10],
                created_at=r[11],
            )
            for r in rows
        ]

    def subscribers(
        self, account: str | None = None
    ) -> list[tuple[str, list[str], dict[str, list[str]]]]:
        """The active endpoints an event goes to: name, globs, payload conditions; with
        ``account``, only those taking that account's events (``endpoints[].accounts``).
        The ingest's read (not a role method)."""
        rows = self._db.conn.execute(
            "SELECT name, events, filter, accounts FROM endpoints "
            "WHERE enabled = 1 AND configured = 1 ORDER BY name"
        ).fetchall()
        return [
            (name, json.loads(globs), json.loads(cond))
            for name, globs, cond, accounts in rows
            if accounts is None or account is None or account in json.loads(accounts)
        ]
