"""The database schema: migrations (the only way the schema changes) and the checks that a
file is a sessionhook database of a version we know.

Each migration is registered with ``_migration`` and applied by :func:`migrate`, all pending
ones in one write transaction with their bookkeeping rows.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from sqlite_utils import Database
from sqlite_utils.migrations import Migrations

from . import codec
from .rows import StoreError

MIGRATIONS = Migrations("sessionhook")
#: Every migration this version knows, in order (a database with others is newer than us).
_KNOWN_MIGRATIONS: list[str] = []


def _migration(name: str) -> Callable[[Callable[[Database], None]], Callable[[Database], None]]:
    _KNOWN_MIGRATIONS.append(name)
    return MIGRATIONS(name=name)


_INITIAL_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)",
    """CREATE TABLE sessions (
        name TEXT PRIMARY KEY,
        id TEXT NOT NULL DEFAULT '',
        title TEXT NOT NULL DEFAULT '',
        state TEXT NOT NULL DEFAULT '',
        url TEXT NOT NULL DEFAULT '',
        source TEXT NOT NULL DEFAULT '',
        create_time TEXT NOT NULL DEFAULT '',
        update_time TEXT NOT NULL DEFAULT '',
        raw TEXT NOT NULL,
        first_seen_at REAL NOT NULL,
        baseline INTEGER NOT NULL DEFAULT 0,
        polled_update_time TEXT,
        activity_cursor TEXT,
        last_polled_at REAL,
        next_poll_at REAL,
        poll_errors INTEGER NOT NULL DEFAULT 0
    )""",
    """CREATE TABLE activities (
        name TEXT PRIMARY KEY,
        session_name TEXT NOT NULL REFERENCES sessions(name),
        id TEXT NOT NULL DEFAULT '',
        create_time TEXT NOT NULL DEFAULT '',
        kind TEXT NOT NULL,
        raw TEXT NOT NULL,
        ingested_at REAL NOT NULL
    )""",
    "CREATE INDEX activities_by_session ON activities(session_name, create_time)",
    """CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        session_name TEXT NOT NULL REFERENCES sessions(name),
        type TEXT NOT NULL,
        activity_name TEXT,
        occurred_at TEXT NOT NULL,
        occurred_ts REAL NOT NULL,
        created_at REAL NOT NULL,
        body TEXT NOT NULL
    )""",
    "CREATE INDEX events_by_session ON events(session_name, seq)",
    "CREATE INDEX events_by_time ON events(occurred_ts)",
    """CREATE TABLE endpoints (
        name TEXT PRIMARY KEY,
        url TEXT NOT NULL,
        events TEXT NOT NULL DEFAULT '["*"]',
        configured INTEGER NOT NULL DEFAULT 1,
        enabled INTEGER NOT NULL DEFAULT 1,
        disabled_reason TEXT,
        disabled_at REAL,
        last_success_at REAL,
        failing_since REAL,
        last_error TEXT,
        last_error_at REAL,
        created_at REAL NOT NULL
    )""",
    """CREATE TABLE deliveries (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        event_id TEXT NOT NULL REFERENCES events(id),
        endpoint TEXT NOT NULL REFERENCES endpoints(name),
        session_name TEXT NOT NULL,
        status TEXT NOT NULL CHECK (status IN ('pending', 'failed', 'dead', 'delivered')),
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at REAL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        delivered_at REAL,
        last_status_code INTEGER,
        last_error TEXT,
        replayed INTEGER NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX deliveries_by_key ON deliveries(endpoint, session_name, status, id)",
    # The outbox proper: only open rows, so it stays small however long the history grows.
    """CREATE INDEX deliveries_open ON deliveries(endpoint, session_name, id)
        WHERE status IN ('pending', 'failed')""",
    "CREATE INDEX deliveries_by_event ON deliveries(event_id)",
    "CREATE INDEX deliveries_by_update ON deliveries(status, updated_at)",
    """CREATE TABLE attempts (
        id INTEGER PRIMARY KEY,
        delivery_id INTEGER NOT NULL REFERENCES deliveries(id),
        attempt INTEGER NOT NULL,
        started_at REAL NOT NULL,
        duration_ms REAL NOT NULL,
        status_code INTEGER,
        error TEXT,
        response_body TEXT NOT NULL DEFAULT ''
    )""",
    "CREATE INDEX attempts_by_delivery ON attempts(delivery_id, attempt)",
    "CREATE INDEX attempts_by_time ON attempts(started_at)",
    """CREATE TABLE upstream_requests (
        minute INTEGER NOT NULL,
        label TEXT NOT NULL,
        status INTEGER NOT NULL,
        count INTEGER NOT NULL,
        PRIMARY KEY (minute, label, status)
    ) WITHOUT ROWID""",
)


@_migration("0001_initial")
def _m0001_initial(db: Database) -> None:
    # Statement by statement: executescript() would COMMIT the migration's transaction.
    for statement in _INITIAL_SCHEMA:
        db.execute(statement)


@_migration("0002_refused_activities")
def _m0002_refused_activities(db: Database) -> None:
    # What the relay refused to archive from upstream (too large to read, a name of another
    # session or no name at all, a name archived under another session): never skipped
    # without a trace. One row per (session, name); ``count`` grows when it is met again.
    db.execute(
        """CREATE TABLE refused_activities (
            session_name TEXT NOT NULL,
            name TEXT NOT NULL,
            create_time TEXT NOT NULL DEFAULT '',
            reason TEXT NOT NULL,
            detail TEXT NOT NULL DEFAULT '',
            size INTEGER,
            first_refused_at REAL NOT NULL,
            last_refused_at REAL NOT NULL,
            count INTEGER NOT NULL DEFAULT 1,
            PRIMARY KEY (session_name, name, reason)
        )"""
    )
    db.execute("CREATE INDEX refused_by_time ON refused_activities(last_refused_at)")


@_migration("0005_economy")
def _m0005_economy(db: Database) -> None:
    # history: found at the first start, archived by the background history walk
    # (history_done_at once archived); account: which [[accounts]] entry lists the session,
    # endpoints.accounts: the accounts an endpoint takes events of;
    # request_budget: the grants of the last minute, so a restart keeps within the budget.
    for statement in (
        "ALTER TABLE sessions ADD COLUMN history INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE sessions ADD COLUMN history_done_at REAL",
        "ALTER TABLE sessions ADD COLUMN account TEXT NOT NULL DEFAULT 'default'",
        "ALTER TABLE endpoints ADD COLUMN accounts TEXT",  # JSON list; NULL: every account
        """CREATE INDEX sessions_history_pending ON sessions(create_time)
            WHERE history = 1 AND history_done_at IS NULL""",
        "CREATE TABLE request_budget (budget TEXT NOT NULL, at REAL NOT NULL)",
        "CREATE INDEX request_budget_by_time ON request_budget(budget, at)",
    ):
        db.execute(statement)


@_migration("0006_event_shapes")
def _m0006_event_shapes(db: Database) -> None:
    # Per endpoint payload conditions (events.payload_matches), checked at enqueue time.
    db.execute("ALTER TABLE endpoints ADD COLUMN filter TEXT NOT NULL DEFAULT '{}'")
    # The bytes a delivery's first attempt sent, when they differ from the event body (a
    # format or template): every retry sends them again, whatever the config says by then.
    db.execute(
        """CREATE TABLE rendered_bodies (
            delivery_id INTEGER PRIMARY KEY REFERENCES deliveries(id) ON DELETE CASCADE,
            content_type TEXT NOT NULL,
            body BLOB NOT NULL
        )"""
    )


def schema_state(db: Database) -> tuple[list[str], list[str]]:
    """(pending migration names, applied names this version does not know)."""
    applied = [m.name for m in MIGRATIONS.applied(db)]
    pending = [name for name in _KNOWN_MIGRATIONS if name not in applied]
    return pending, [name for name in applied if name not in _KNOWN_MIGRATIONS]


def check_ours(conn: sqlite3.Connection, path: Path) -> None:
    """Refuse a SQLite file that holds tables but is not a sessionhook database."""
    tables = {
        row[0]
        for row in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    }
    if not tables:
        return
    ours = (
        Migrations.migrations_table in tables
        and conn.execute(
            f"SELECT 1 FROM {Migrations.migrations_table} WHERE migration_set = ? LIMIT 1",
            (MIGRATIONS.name,),
        ).fetchone()
    )
    if not ours:
        raise StoreError(f"{path} is not a sessionhook database", path=path)


def migrate(conn: sqlite3.Connection, db: Database, path: Path) -> None:
    """Apply pending migrations: each with its bookkeeping row, all under one write lock so
    that two processes starting together cannot both migrate."""
    pending, unknown = schema_state(db)
    if unknown:
        raise StoreError(
            f"{path} was written by a newer sessionhook (migration {unknown[0]})", path=path
        )
    if not pending:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Inside our transaction sqlite-utils runs each migration in a savepoint with its
        # bookkeeping row, and re-reads what is pending under the lock.
        MIGRATIONS.apply(db)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


# --------------------------------------------------------------------------- 0004 (throughput)

#: The head of each (endpoint, session) queue: its oldest open delivery. The dispatcher asks
#: for due heads through ``outbox_heads_due``; the cost of that no longer depends on the
#: backlog (it was a GROUP BY over every open delivery). Triggers keep it exact whichever
#: code path writes ``deliveries`` (ingest, replay, attempts, operator commands, pruning).
_OUTBOX_HEADS = (
    """CREATE TABLE outbox_heads (
        endpoint TEXT NOT NULL,
        session_name TEXT NOT NULL,
        delivery_id INTEGER NOT NULL,
        next_attempt_at REAL NOT NULL,
        PRIMARY KEY (endpoint, session_name)
    ) WITHOUT ROWID""",
    "CREATE INDEX outbox_heads_due ON outbox_heads(endpoint, next_attempt_at, delivery_id)",
    # A new open row becomes its key's head unless an older open row is the head already.
    """CREATE TRIGGER outbox_heads_on_insert AFTER INSERT ON deliveries
        WHEN NEW.status IN ('pending', 'failed')
        BEGIN
            INSERT INTO outbox_heads (endpoint, session_name, delivery_id, next_attempt_at)
            VALUES (NEW.endpoint, NEW.session_name, NEW.id, COALESCE(NEW.next_attempt_at, 0))
            ON CONFLICT (endpoint, session_name) DO UPDATE SET
                delivery_id = excluded.delivery_id, next_attempt_at = excluded.next_attempt_at
            WHERE excluded.delivery_id < outbox_heads.delivery_id;
        END""",
    # Any change of status or due time: re-derive the key's head from the open rows (one
    # probe of the partial index ``deliveries_open``).
    """CREATE TRIGGER outbox_heads_on_update AFTER UPDATE OF status, next_attempt_at
        ON deliveries
        BEGIN
            DELETE FROM outbox_heads
            WHERE endpoint = OLD.endpoint AND session_name = OLD.session_name;
            INSERT INTO outbox_heads (endpoint, session_name, delivery_id, next_attempt_at)
            SELECT endpoint, session_name, id, COALESCE(next_attempt_at, 0) FROM deliveries
            WHERE endpoint = NEW.endpoint AND session_name = NEW.session_name
                AND status IN ('pending', 'failed')
            ORDER BY id LIMIT 1;
        END""",
    """CREATE TRIGGER outbox_heads_on_delete AFTER DELETE ON deliveries
        WHEN OLD.status IN ('pending', 'failed')
        BEGIN
            DELETE FROM outbox_heads
            WHERE endpoint = OLD.endpoint AND session_name = OLD.session_name;
            INSERT INTO outbox_heads (endpoint, session_name, delivery_id, next_attempt_at)
            SELECT endpoint, session_name, id, COALESCE(next_attempt_at, 0) FROM deliveries
            WHERE endpoint = OLD.endpoint AND session_name = OLD.session_name
                AND status IN ('pending', 'failed')
            ORDER BY id LIMIT 1;
        END""",
    """INSERT INTO outbox_heads (endpoint, session_name, delivery_id, next_attempt_at)
        SELECT d.endpoint, d.session_name, d.id, COALESCE(d.next_attempt_at, 0)
        FROM (SELECT MIN(id) AS id FROM deliveries WHERE status IN ('pending', 'failed')
              GROUP BY endpoint, session_name) AS h
        JOIN deliveries d ON d.id = h.id""",
)


@_migration("0004_outbox_heads")
def _m0004_outbox_heads(db: Database) -> None:
    for statement in _OUTBOX_HEADS:
        db.execute(statement)


@_migration("0004_compact_archive")
def _m0004_compact_archive(db: Database) -> None:
    # Bodies and raw JSON are now stored compressed against their context (see codec.py);
    # rows written before stay plain text and are read as they are.
    # ``body_refs``: per session, an earlier event body that later bodies are compressed
    # against (it carries the session summary every body repeats).
    db.execute(
        """CREATE TABLE body_refs (
            id INTEGER PRIMARY KEY,
            session_name TEXT NOT NULL,
            data BLOB NOT NULL
        )"""
    )
    db.execute("CREATE INDEX body_refs_by_session ON body_refs(session_name, id)")
    db.execute("ALTER TABLE events ADD COLUMN body_ref INTEGER REFERENCES body_refs(id)")


# --------------------------------------------------------------------------- 0007 (replicas)

#: Replicas sharing one store (see ``leases.py`` and docs/replicas.md).
#: ``replicas``: who runs (a random id per process, its host and pid), its heartbeat and
#: lease: a replica is alive while ``heartbeat_at + lease`` is not past, and every claim it
#: holds lives exactly as long. Claims are an owner (and when it claimed) on the outbox
#: heads (one delivery in flight per (endpoint, session) across replicas) and on session
#: polls; ``leases``: named leases (an account's poller: discovery, the list's head, the
#: history walk, the schedule); ``budget_locks``: one row per request budget, written first
#: in ``take_budget`` so that replicas' transactions on one budget run one after the other.
_REPLICAS = (
    """CREATE TABLE replicas (
        id TEXT PRIMARY KEY,
        host TEXT NOT NULL,
        pid INTEGER NOT NULL,
        started_at REAL NOT NULL,
        heartbeat_at REAL NOT NULL,
        lease REAL NOT NULL,
        stopped_at REAL
    ) WITHOUT ROWID""",
    "ALTER TABLE outbox_heads ADD COLUMN claimed_by TEXT",
    "ALTER TABLE outbox_heads ADD COLUMN claimed_at REAL",
    # The due query filters on the claim: kept in its index, which stays covering.
    "DROP INDEX outbox_heads_due",
    """CREATE INDEX outbox_heads_due
        ON outbox_heads(endpoint, next_attempt_at, delivery_id, claimed_by)""",
    "ALTER TABLE sessions ADD COLUMN poll_owner TEXT",
    "ALTER TABLE sessions ADD COLUMN poll_claimed_at REAL",
    "CREATE INDEX sessions_poll_claims ON sessions(poll_owner) WHERE poll_owner IS NOT NULL",
    """CREATE TABLE leases (
        name TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        acquired_at REAL NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE budget_locks (
        budget TEXT PRIMARY KEY,
        touched_at REAL NOT NULL
    ) WITHOUT ROWID""",
)


@_migration("0007_replicas")
def _m0007_replicas(db: Database) -> None:
    for statement in _REPLICAS:
        db.execute(statement)


# ------------------------------------------------------------------ 0008 (bytes per event)

#: A session's name as the start of its activities' names (``<session>/activities/<id>``):
#: the SQL twin of :func:`.codec.session_of` (text before the first ``/activities/``, or '').
SESSION_OF_NAME = (
    "CASE WHEN instr(name, '/activities/') > 0 "
    "THEN substr(name, 1, instr(name, '/activities/') - 1) ELSE '' END"
)

#: Migration 0008: what every row repeated is derived instead of stored, and the indexes
#: nothing needs any more are dropped (see docs/store.md "Storage").
#:
#: * ``activities.session_name`` is a VIRTUAL column: the start of ``name`` (the poller
#:   archives only ``<session>/activities/<id>``); ``session_ref`` holds it only when it is
#:   not derivable (never written by the poller). SQLite cannot drop a column under a
#:   foreign key: the table is rebuilt (rowids kept), in the migration's transaction.
#: * ``activities_by_session`` is gone (its one reader, ``latest_activity``, walks the
#:   primary key's range of the session's names instead).
#: * ``events.activity_name`` is a VIRTUAL column: ``session_name || '/activities/' ||
#:   activity_id``; ``activity_other`` holds a name not of that shape.
#: * ``events.type`` and ``activities.kind`` are VIRTUAL columns too: a row stores the
#:   name's code (``type_code``, ``kind_code``: a byte) or, for a name not listed, the text
#:   (``*_other``); see codec.EVENT_TYPES / codec.KINDS.
#: * ``deliveries_by_key (endpoint, session_name, status, id)`` becomes
#:   ``deliveries_by_endpoint (endpoint, status)`` (the rowid ends every SQLite index: the
#:   same order by id): only the console and CLI lists read it, never by session.
_KIND = codec.uncoded_sql(codec.KINDS, "kind_code", "kind_other")
_TYPE = codec.uncoded_sql(codec.EVENT_TYPES, "type_code", "type_other")
_M0008 = (
    f"""CREATE TABLE activities_0008 (
        name TEXT PRIMARY KEY,
        session_ref TEXT,
        session_name TEXT GENERATED ALWAYS AS (COALESCE(session_ref, {SESSION_OF_NAME}))
            VIRTUAL REFERENCES sessions(name),
        id TEXT NOT NULL DEFAULT '',
        create_time TEXT NOT NULL DEFAULT '',
        kind_code INTEGER,
        kind_other TEXT,
        kind TEXT GENERATED ALWAYS AS ({_KIND}) VIRTUAL,
        raw TEXT NOT NULL,
        ingested_at REAL NOT NULL
    )""",
    "INSERT INTO activities_0008 (rowid, name, session_ref, id, create_time, kind_code, "
    "kind_other, raw, ingested_at) SELECT rowid, name, "
    f"CASE WHEN session_name = {SESSION_OF_NAME} THEN NULL ELSE session_name END, id, "
    f"create_time, {codec.coded_sql(codec.KINDS, 'kind')}, "
    f"CASE WHEN {codec.coded_sql(codec.KINDS, 'kind')} IS NULL THEN kind END, raw, "
    "ingested_at FROM activities ORDER BY rowid",
    "DROP TABLE activities",
    "ALTER TABLE activities_0008 RENAME TO activities",
    # A name not of its session's shape is found by this (empty unless such rows exist).
    "CREATE INDEX activities_by_session_ref ON activities(session_ref) "
    "WHERE session_ref IS NOT NULL",
    "ALTER TABLE events ADD COLUMN activity_id TEXT",
    "ALTER TABLE events ADD COLUMN activity_other TEXT",
    "ALTER TABLE events ADD COLUMN type_code INTEGER",
    "ALTER TABLE events ADD COLUMN type_other TEXT",
    "UPDATE events SET activity_id = substr(activity_name, length(session_name) + 13) "
    "WHERE substr(activity_name, 1, length(session_name) + 12) = session_name || '/activities/'",
    "UPDATE events SET activity_other = activity_name "
    "WHERE activity_name IS NOT NULL AND activity_id IS NULL",
    f"UPDATE events SET type_code = {codec.coded_sql(codec.EVENT_TYPES, 'type')}",
    "UPDATE events SET type_other = type WHERE type_code IS NULL",
    "ALTER TABLE events DROP COLUMN activity_name",
    "ALTER TABLE events DROP COLUMN type",
    "ALTER TABLE events ADD COLUMN activity_name TEXT GENERATED ALWAYS AS "
    "(COALESCE(activity_other, session_name || '/activities/' || activity_id)) VIRTUAL",
    f"ALTER TABLE events ADD COLUMN type TEXT GENERATED ALWAYS AS ({_TYPE}) VIRTUAL",
    "DROP INDEX deliveries_by_key",
    "CREATE INDEX deliveries_by_endpoint ON deliveries(endpoint, status)",
)


@_migration("0008_derived_names_lean_indexes")
def _m0008_derived_names_lean_indexes(db: Database) -> None:
    for statement in _M0008:
        db.execute(statement)


# ---------------------------------------------------------------- 0009 (endpoints from the API)

#: Endpoints created through the management API live in the store (docs/configuration.md
#: "Endpoints from the API"): ``source`` says where an endpoint is defined (``config``: the
#: file, the row keeps only its state; ``api``: the row is its definition), ``spec`` holds
#: its delivery settings (the keys of ``[[endpoints]]`` it sets, JSON), ``secret`` the
#: signing secret every replica signs with, ``previous_secret`` the one it replaced, still
#: signing until ``previous_until`` (a rotation's overlap). ``revision`` grows with every
#: change of a definition (from one sequence over all rows): a dispatcher compares the
#: revisions of the active endpoints, read with its round, to those it holds.
#: ``deleted_at``: deleted through the API (the row stays: its deliveries' history).
_M0009 = (
    "ALTER TABLE endpoints ADD COLUMN source TEXT NOT NULL DEFAULT 'config'",
    "ALTER TABLE endpoints ADD COLUMN spec TEXT",
    "ALTER TABLE endpoints ADD COLUMN description TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE endpoints ADD COLUMN secret TEXT",
    "ALTER TABLE endpoints ADD COLUMN previous_secret TEXT",
    "ALTER TABLE endpoints ADD COLUMN previous_until REAL",
    "ALTER TABLE endpoints ADD COLUMN revision INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE endpoints ADD COLUMN updated_at REAL",
    "ALTER TABLE endpoints ADD COLUMN deleted_at REAL",
)


@_migration("0009_api_endpoints")
def _m0009_api_endpoints(db: Database) -> None:
    for statement in _M0009:
        db.execute(statement)


@_migration("0010_actions_taken")
def _m0010_actions_taken(db: Database) -> None:
    # Actions people took through signed links, Slack or the console (store/actions.py).
    for statement in (
        """CREATE TABLE actions_taken (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            taken_at REAL NOT NULL,
            session_name TEXT NOT NULL,
            wait TEXT NOT NULL,
            action TEXT NOT NULL,
            account TEXT NOT NULL,
            actor_kind TEXT NOT NULL,
            actor_address TEXT NOT NULL,
            actor_agent TEXT NOT NULL,
            chat_user TEXT,
            token_hash TEXT NOT NULL,
            result TEXT NOT NULL,
            status INTEGER,
            detail TEXT NOT NULL
        )""",
        "CREATE INDEX actions_by_token ON actions_taken(token_hash)",
        "CREATE INDEX actions_by_session ON actions_taken(session_name, id)",
    ):
        db.execute(statement)


# ---------------------------------------------------------------- 0011 (revisions indexed)

#: A dispatcher reads the definitions changed after the revision it holds, and a new
#: definition takes the revision after the newest: both by this index, whatever the number
#: of endpoints (docs/delivery.md "Endpoints created at run time").
_M0011 = ("CREATE INDEX endpoints_by_revision ON endpoints(revision)",)


@_migration("0011_endpoint_revisions")
def _m0011_endpoint_revisions(db: Database) -> None:
    for statement in _M0011:
        db.execute(statement)
