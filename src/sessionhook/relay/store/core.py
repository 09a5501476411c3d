"""The store: its roles over one database, whatever the engine (:class:`StoreCore`; a
backend, :mod:`.sqlite` or :mod:`.postgres`, provides the :class:`~.dialect.Database`).
The roles are listed in ``docs/store.md``, "Roles".
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from .actions import ActionQueries
from .bodies import Bodies
from .console_queries import ConsoleQueries
from .copying import CopyQueries
from .dialect import Database
from .economy_queries import Economy
from .endpoints import EndpointQueries
from .errors import StoreUnwritableError
from .ingest import Ingest
from .leases import Leases, ReplicaState
from .meta import MetaQueries
from .ops_queries import OperatorQueries
from .outbox import Outbox
from .refusals import Refusals
from .requeue import Requeue


class StoreCore:
    """A relay store: one attribute per role, over ``db`` (see the module docstring).

    Synchronous: the daemon goes through :class:`~.aio.AsyncStore`, which runs these in
    the store's thread(s) (``await astore.run(Outbox.record_attempts, records)``); the
    operator's commands call them directly.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        bodies = Bodies(db)
        #: Who this handle is among the replicas (shared by the roles that claim).
        self.replica = ReplicaState()
        #: The ``meta`` table: the baseline, learned verdicts, probes.
        self.meta = MetaQueries(db)
        #: The endpoints' configuration and run-time state.
        self.endpoints = EndpointQueries(db)
        #: The poller's archive: sessions, activities, events, their deliveries enqueued.
        self.ingest = Ingest(db, bodies, self.endpoints)
        #: What was refused from upstream, and why.
        self.refusals = Refusals(db)
        #: Replicas, their claims and named leases.
        self.leases = Leases(db, self.replica)
        #: The dispatcher's: due deliveries, attempts recorded, rendered bodies, pruning.
        self.outbox = Outbox(db, bodies, self.replica, self.leases)
        #: The poller's upstream economy: history walk, budget, request counters.
        self.economy = Economy(db, self.replica)
        #: The operator's: status, delivery log, replay, the event archive.
        self.operator = OperatorQueries(
            db,
            bodies,
            endpoints=self.endpoints,
            outbox=self.outbox,
            meta=self.meta,
            refusals=self.refusals,
        )
        #: Retry now and recover: the same delivery rows re-opened.
        self.requeue = Requeue(db)
        #: The web console's lists and counts.
        self.console = ConsoleQueries(db, bodies)
        #: Actions people took (signed links, Slack, the console).
        self.actions = ActionQueries(db)
        #: ``sessionhook store copy``'s reads and writes of whole tables.
        self.copy = CopyQueries(db)

    def roles(self) -> list[object]:
        """The role collaborators: every attribute but the database and the replica state
        (the async door runs their methods)."""
        return [value for name, value in vars(self).items() if name not in ("db", "replica")]

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
        """Opened read-only: writes raise :class:`~.errors.StoreError`."""
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

    def close(self) -> None:
        """Release the connection(s)."""
        self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
