"""The store: its roles over one database, whatever the engine.

:class:`StoreCore` composes one collaborator per role (:mod:`.roles` lists their methods),
each built with what it needs: the :class:`~.dialect.Database` (the connection reads run
on, the write transactions, the clock, and what the engines do differently), the codec of
event bodies (:class:`~.bodies.Bodies`, shared by the ingest and every reader) and who this
handle is among the replicas (:class:`~.leases.ReplicaState`, shared by the roles that
claim). A caller reaches a role by name: ``store.outbox.due_deliveries(...)``,
``store.operator.replay(...)``.

A backend provides the database:

* :class:`~.sqlite.Store` (``store.path``): one SQLite file, its pragmas and durability;
* :class:`~.postgres.PostgresStore` (``store.url``): a PostgreSQL database through a pool.

The SQL is written once, in the common subset of SQLite and PostgreSQL (:mod:`.dialect`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from .actions import ActionQueries
from .bodies import Bodies
from .console_queries import ConsoleQueries
from .copying import CopyQueries, CopyStore
from .dialect import Database
from .economy_queries import Economy
from .endpoints import EndpointQueries
from .ingest import Ingest
from .leases import Leases, ReplicaState
from .meta import MetaQueries
from .ops_queries import OperatorQueries
from .outbox import Outbox
from .refusals import Refusals
from .roles import (
    ActionRole,
    ConsoleRole,
    EconomyRole,
    EndpointRole,
    IngestRole,
    LeaseRole,
    MetaRole,
    OperatorRole,
    OutboxRole,
    RefusalRole,
)
from .rows import StoreUnwritableError

__all__ = ["StoreCore"]


class StoreCore:
    """A relay store: one attribute per role, over ``db`` (see the module docstring).

    Synchronous: the daemon goes through :class:`~.aio.AsyncStore`, which runs these in
    the store's thread(s); the operator's commands call them directly.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        bodies = Bodies(db)
        replica = ReplicaState()
        meta = MetaQueries(db)
        endpoints = EndpointQueries(db)
        outbox = Outbox(db, bodies, replica)
        refusals = Refusals(db)
        operator = OperatorQueries(
            db, bodies, endpoints=endpoints, outbox=outbox, meta=meta, refusals=refusals
        )
        #: The ``meta`` table: the baseline, learned verdicts, probes.
        self.meta: MetaRole = meta
        #: The endpoints' configuration and run-time state.
        self.endpoints: EndpointRole = endpoints
        #: The poller's archive: sessions, activities, events, their deliveries enqueued.
        self.ingest: IngestRole = Ingest(db, bodies, endpoints)
        #: What was refused from upstream, and why.
        self.refusals: RefusalRole = refusals
        #: The dispatcher's: due deliveries, attempts recorded, rendered bodies, pruning.
        self.outbox: OutboxRole = outbox
        #: Replicas, their claims and named leases.
        self.leases: LeaseRole = Leases(db, replica)
        #: The poller's upstream economy: history walk, budget, request counters.
        self.economy: EconomyRole = Economy(db, replica)
        #: The operator's: status, delivery log, replay, the event archive.
        self.operator: OperatorRole = operator
        #: The web console's lists and counts.
        self.console: ConsoleRole = ConsoleQueries(
            db, bodies, endpoints=endpoints, operator=operator
        )
        #: Actions people took (signed links, Slack, the console).
        self.actions: ActionRole = ActionQueries(db)
        #: ``sessionhook store copy``'s reads and writes of whole tables.
        self.copy: CopyStore = CopyQueries(db)

    @property
    def path(self) -> Path | None:
        """The SQLite file (``None`` on PostgreSQL)."""
        return self.db.path

    @property
    def location(self) -> str:
        """The store in messages: the file, or the URL without its password."""
        return self.db.location

    @property
    def readonly(self) -> bool:
        """Opened read-only: writes raise :class:`~.rows.StoreError`."""
        return self.db.readonly

    @property
    def concurrency(self) -> int:
        """How many threads may use the store at once (:class:`~.aio.AsyncStore`'s limit):
        one on SQLite (one writer connection), the pool's size on PostgreSQL."""
        return self.db.concurrency

    def unwritable_error(self, exc: BaseException) -> StoreUnwritableError | None:
        """``exc`` (raised by the engine outside a write transaction) as the
        :class:`StoreUnwritableError` it means (no space, read-only, database unreachable),
        or ``None`` when it means something else."""
        return self.db.unwritable_error(exc)

    def open_reader(self) -> StoreCore:
        """A second, read-only handle on the same store (e.g. to read while writing)."""
        return StoreCore(self.db.open_reader())

    def close(self) -> None:
        """Release the connection(s)."""
        self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
