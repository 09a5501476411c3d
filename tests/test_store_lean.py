"""Migration 0008 (bytes per event): names derived instead of stored, leaner indexes, the
codec's raw deflate formats. A store written at 0007 migrates in place and reads the same,
on both engines; the console's and operator's reads still use an index (SQLite plans)."""

from __future__ import annotations

import json
import sqlite3
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sessionhook.api.models import Activity
from sessionhook.relay.domain.retry import Dead, Delivered, Retry
from sessionhook.relay.store import AttemptRecord, PostgresStore, Store, codec
from sessionhook.relay.store.core import StoreCore
from tests.support.backends import Backend
from tests.support.backlog import ok
from tests.support.pg import Cluster
from tests.support.schemas import build_old_postgres, build_old_sqlite
from tests.support.store_rows import Ep, activity, built, ingest, session

pytestmark = pytest.mark.app

T0 = 1_800_000_000.0
S = "sessions/1"
A1 = f"{S}/activities/a1"
ODD = "odd-name"  # an activity named otherwise (the poller refuses these; the store keeps them)
RAW_A1 = json.dumps(
    {"name": A1, "createTime": "2026-01-01T00:00:01Z", "agentMessaged": {"agentMessage": "hé"}},
    separators=(",", ":"),
    ensure_ascii=False,
).encode()
RAW_ODD = json.dumps(
    {"name": ODD, "createTime": "2026-01-01T00:00:02Z", "planApproved": {"planId": "p"}},
    separators=(",", ":"),
).encode()
BODY_1 = b'{"type":"activity.agent_messaged","data":{"activity":' + RAW_A1 + b"}}"
BODY_2 = b'{"type":"activity.plan_approved","data":{}}'
BODY_3 = b'{"type":"session.discovered","data":{}}'


def _zlib(form: int, data: bytes, zdict: bytes) -> bytes:
    """A row in the zlib-framed formats 1-3 written before 0008."""
    packer = zlib.compressobj(1, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, zdict[-32768:])
    return bytes((form,)) + packer.compress(data) + packer.flush()


def _old_rows() -> list[tuple[str, tuple[Any, ...]]]:
    """Rows of a store at migration 0007: plain and zlib-framed bodies and raws, an activity
    and an event of another name shape, a session event, a delivered and a pending row."""
    hints = (A1 + "2026-01-01T00:00:01Z").encode()
    return [
        ("INSERT INTO sessions (name, raw, first_seen_at) VALUES (?, ?, ?)", (S, "{}", T0)),
        (
            "INSERT INTO endpoints (name, url, created_at) VALUES (?, ?, ?)",
            ("e1", "https://hooks.example.com/x", T0),
        ),
        (
            "INSERT INTO activities (name, session_name, create_time, kind, raw, ingested_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (
                A1,
                S,
                "2026-01-01T00:00:01Z",
                "agentMessaged",
                _zlib(1, RAW_A1, codec.ARCHIVE_DICT + hints),
                T0,
            ),
        ),
        (
            "INSERT INTO activities (name, session_name, create_time, kind, raw, ingested_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (ODD, S, "2026-01-01T00:00:02Z", "planApproved", RAW_ODD.decode(), T0),
        ),
        (
            "INSERT INTO events (id, session_name, type, activity_name, occurred_at, "
            "occurred_ts, created_at, body) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                "evt_1",
                S,
                "activity.agent_messaged",
                A1,
                "2026-01-01T00:00:01Z",
                T0,
                T0,
                _zlib(3, BODY_1, codec.BODY_DICT + RAW_A1),
            ),
        ),
        (
            "INSERT INTO events (id, session_name, type, activity_name, occurred_at, "
            "occurred_ts, created_at, body) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                "evt_2",
                S,
                "activity.plan_approved",
                ODD,
                "2026-01-01T00:00:02Z",
                T0 + 1,
                T0,
                _zlib(2, BODY_2, codec.BODY_DICT),
            ),
        ),
        (
            "INSERT INTO events (id, session_name, type, activity_name, occurred_at, "
            "occurred_ts, created_at, body) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                "evt_3",
                S,
                "session.discovered",
                None,
                "2026-01-01T00:00:00Z",
                T0 - 1,
                T0,
                BODY_3.decode(),
            ),
        ),
        (
            "INSERT INTO deliveries (event_id, endpoint, session_name, status, attempts, "
            "created_at, updated_at, delivered_at, last_status_code) "
            "VALUES (?, ?, ?, 'delivered', 1, ?, ?, ?, 204)",
            ("evt_1", "e1", S, T0, T0 + 5, T0 + 5),
        ),
        (
            "INSERT INTO deliveries (event_id, endpoint, session_name, status, next_attempt_at, "
            "created_at, updated_at) VALUES (?, ?, ?, 'pending', ?, ?, ?)",
            ("evt_2", "e1", S, T0, T0, T0),
        ),
        (
            "INSERT INTO attempts (delivery_id, attempt, started_at, duration_ms, status_code) "
            "VALUES (1, 1, ?, 3.0, 204)",
            (T0 + 5,),
        ),
    ]


def _reads_the_same(store: StoreCore) -> None:
    """What every reader sees of :func:`_old_rows` once migrated."""
    bodies = {e.id: (e.body, e.activity_name) for e in store.operator.iter_events()}
    assert bodies == {"evt_1": (BODY_1, A1), "evt_2": (BODY_2, ODD), "evt_3": (BODY_3, None)}
    assert store.operator.get_event("evt_1").activity_name == A1  # type: ignore[union-attr]
    assert store.ingest.activity_raw(A1) == RAW_A1
    assert store.ingest.activity_raw(ODD) == RAW_ODD
    found = store.ingest.latest_activity(S, "agentMessaged")
    assert found is not None and found.name == A1
    odd = store.ingest.latest_activity(S, "planApproved")
    assert odd is not None and odd.name == ODD
    assert store.ingest.latest_activity("sessions/2", "agentMessaged") is None
    rows = store.operator.list_deliveries(endpoint="e1")
    assert [(d.id, d.event_id, d.status) for d in rows] == [
        (2, "evt_2", "pending"),
        (1, "evt_1", "delivered"),
    ]
    assert [d.id for d in store.operator.list_deliveries(endpoint="e1", status="delivered")] == [1]
    assert [d.id for d in store.console.deliveries_of_events(["evt_1", "evt_2"])] == [1, 2]
    assert [a.status_code for a in store.operator.list_attempts(1)] == [204]
    sessions = dict(store.db.conn.execute("SELECT name, session_name FROM activities").fetchall())
    assert sessions == {A1: S, ODD: S}


def _new_rows_work(store: StoreCore) -> None:
    """After the migration, the poller's writes and the dispatcher's reads still work."""
    (due,) = store.outbox.due_deliveries(T0 + 10, 10)
    assert (due.event_id, due.body) == ("evt_2", BODY_2)


def test_a_0007_sqlite_store_migrates_in_place_and_reads_the_same(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    build_old_sqlite(path, through="0007_replicas")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    for sql, params in _old_rows():
        conn.execute(sql, params)
    conn.close()
    with Store.open(path) as store:
        _reads_the_same(store)
        _new_rows_work(store)
        assert store.db.conn.execute("PRAGMA foreign_key_check").fetchall() == []
        assert store.db.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        # The stored forms: derivable names are not stored again.
        assert store.db.conn.execute(
            "SELECT name, session_ref FROM activities ORDER BY rowid"
        ).fetchall() == [(A1, None), (ODD, S)]
        assert store.db.conn.execute(
            "SELECT id, activity_id, activity_other FROM events ORDER BY seq"
        ).fetchall() == [("evt_1", "a1", None), ("evt_2", None, ODD), ("evt_3", None, None)]
        # Types and kinds are codes (their text is generated from them).
        assert store.db.conn.execute(
            "SELECT type_code, type_other, type FROM events ORDER BY seq"
        ).fetchall() == [
            (1, None, "activity.agent_messaged"),
            (4, None, "activity.plan_approved"),
            (8, None, "session.discovered"),
        ]
        assert store.db.conn.execute(
            "SELECT kind_code, kind_other FROM activities ORDER BY rowid"
        ).fetchall() == [(1, None), (4, None)]


@pytest.fixture
def empty_pg(pg_cluster: Cluster) -> Iterator[str]:
    name = pg_cluster.create_database()
    yield pg_cluster.url(name)
    pg_cluster.drop_database(name)


def test_a_0007_postgresql_store_migrates_in_place_and_reads_the_same(empty_pg: str) -> None:
    build_old_postgres(empty_pg, through="0007_replicas")
    with psycopg.connect(empty_pg, autocommit=True) as conn, conn.transaction():
        for sql, params in _old_rows():
            conn.execute(sql.replace("?", "%s").encode(), _pg_params(params))
    with PostgresStore.open(empty_pg) as store:
        _reads_the_same(store)
        _new_rows_work(store)


def _pg_params(params: tuple[Any, ...]) -> tuple[Any, ...]:
    # BYTEA columns take bytes: PostgreSQL never held the legacy plain text (copy.py
    # encodes it, without a reference or context, as here).
    plain = {
        BODY_3.decode(): codec.encode_body(BODY_3, b"", b""),
        RAW_ODD.decode(): codec.encode_raw(RAW_ODD, (ODD + "2026-01-01T00:00:02Z").encode()),
    }
    return tuple(plain.get(p, p) if isinstance(p, str) else p for p in params)


def test_names_of_another_shape_round_trip(backend: Backend) -> None:
    """What the poller never archives but the store keeps exactly: an activity named
    outside its session's names and its event; and the usual shape, not stored twice."""
    s = session(1)
    odd = Activity.model_validate(
        {"name": "elsewhere/x", "createTime": "2026-01-01T00:00:00Z", "agentMessaged": {}}
    )
    usual = activity(1, 7, planApproved={"planId": "q"})
    with backend.open(clock=lambda: T0) as store:
        store.ingest.upsert_session(s, baseline=False)
        store.ingest.ingest_activities(s.name, [odd, usual], built(s, [odd, usual]), deliver=False)
        got = store.ingest.latest_activity(s.name, "planApproved")
        assert got is not None and got.name == usual.name
        got = store.ingest.latest_activity(s.name, "agentMessaged")
        assert got is not None and got.name == odd.name
        assert {e.activity_name for e in store.operator.iter_events()} == {odd.name, usual.name}
        assert {e.body for e in store.operator.iter_events()} == {
            e.body for e in built(s, [odd, usual])
        }
        owners = dict(store.db.conn.execute("SELECT name, session_name FROM activities").fetchall())
        assert owners == {odd.name: s.name, usual.name: s.name}
        stored = store.db.conn.execute(
            "SELECT activity_id, activity_other FROM events ORDER BY seq"
        ).fetchall()
        assert sorted(map(tuple, stored), key=str) == sorted(
            [(None, odd.name), (f"{7:032x}", None)], key=str
        )


# --------------------------------------------------------------------------- plans


def _plans(store: Store, call: Callable[[], object]) -> list[tuple[str, list[str]]]:
    """Every statement ``call()`` runs, with SQLite's plan for it."""
    seen: list[str] = []
    store.db.conn.set_trace_callback(seen.append)
    try:
        call()
    finally:
        store.db.conn.set_trace_callback(None)
    return [
        (sql, [row[3] for row in store.db.conn.execute("EXPLAIN QUERY PLAN " + sql)])
        for sql in seen
        if sql.lstrip().upper().startswith("SELECT")
    ]


def test_the_readers_of_the_dropped_indexes_still_search(tmp_path: Path) -> None:
    """Each reader of what ``deliveries_by_key`` and ``activities_by_session`` served reads
    an index (no SCAN of a growing table), and the indexes are the ones expected."""
    with Store.open(tmp_path / "s.db", clock=lambda: T0) as store:
        store.endpoints.sync_endpoints([Ep("e1")])
        s = session(1)
        store.ingest.upsert_session(s, baseline=False)
        ingest(store, s, [activity(1, i) for i in range(3)])
        indexes = {
            r[0]
            for r in store.db.conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_%'"
            )
        }
        assert "deliveries_by_key" not in indexes and "activities_by_session" not in indexes
        assert {
            "deliveries_by_endpoint",
            "deliveries_stuck",
            "deliveries_by_event",
            "deliveries_by_update",
            "deliveries_open",
            "events_by_session",
            "activities_by_session_ref",
        } <= indexes
        growing = ("activities", "events", "deliveries", "attempts")
        calls: list[Callable[[], object]] = [
            lambda: store.ingest.latest_activity(s.name, "agentMessaged"),
            lambda: store.operator.list_deliveries(endpoint="e1", status="pending"),
            lambda: store.operator.list_deliveries(endpoint="e1"),
            lambda: store.console.deliveries_of_events(["evt_x"]),
            lambda: store.operator.list_deliveries(session=s.name, endpoint="e1"),
            lambda: store.operator.list_deliveries(event_id="evt_x", status="dead"),
            lambda: store.console.console_events(session=s.name, status="dead"),
            lambda: store.console.console_events(event_id="evt_x"),
            lambda: store.console.console_timeline(s.name, after_seq=2),
            lambda: store.outbox.pending_count("e1"),
            lambda: store.outbox.prune_delivery_log(T0 - 1),
        ]
        for call in calls:
            for sql, plan in _plans(store, call):
                scans = [p for p in plan if p.startswith("SCAN") and p.split()[1] in growing]
                # d in a list query: the newest first by rowid (stops at the LIMIT).
                scans = [p for p in scans if not p.startswith("SCAN d")]
                assert not scans, (sql, plan)
        # A session's deliveries come through its events, whatever else filters (no index
        # holds (endpoint, session) since 0008; the endpoint's index is not walked per event).
        for filters in ({}, {"endpoint": "e1"}, {"endpoint": "e1", "status": "pending"}):
            call = lambda f=filters: store.operator.list_deliveries(  # noqa: E731
                session=s.name, **f
            )
            plan = [p for _, ps in _plans(store, call) for p in ps]
            assert any("events_by_session" in p for p in plan), plan
            assert any("deliveries_by_event" in p for p in plan), plan
            assert not any("deliveries_stuck" in p for p in plan), plan
            assert len(store.operator.list_deliveries(session=s.name, **filters)) == 3
        assert store.operator.list_deliveries(session=s.name, endpoint="e2") == []
        assert store.operator.list_deliveries(session="sessions/9") == []
        plan = [
            p
            for _, ps in _plans(store, lambda: store.ingest.latest_activity(s.name, "x"))
            for p in ps
        ]
        assert any("sqlite_autoindex_activities" in p for p in plan), plan
        plan = [
            p
            for _, ps in _plans(
                store, lambda: store.operator.list_deliveries(endpoint="e1", status="dead")
            )
            for p in ps
        ]
        assert any("deliveries_stuck" in p for p in plan), plan
        # An endpoint's list, of any status or a pending one: its own index newest first
        # (a quiet endpoint's list does not walk every delivery of the others).
        for status in (None, "pending", "delivered"):
            call = lambda st=status: store.operator.list_deliveries(  # noqa: E731
                endpoint="e1", status=st
            )
            plan = [p for _, ps in _plans(store, call) for p in ps]
            assert any("deliveries_by_endpoint" in p for p in plan), plan
            assert not any("TEMP B-TREE" in p for p in plan), plan


def test_the_record_path_indexes_hold_only_what_their_readers_ask_for(tmp_path: Path) -> None:
    """``deliveries_stuck`` holds an endpoint's failed and dead deliveries only, and
    ``deliveries_by_update`` the delivered and dead ones: a delivery sent at its first try
    enters neither, then one (the record path moves two index entries fewer); recover,
    the lists of failed or dead deliveries, pruning and ``status`` still search them."""
    with Store.open(tmp_path / "s.db", clock=lambda: T0) as store:
        store.endpoints.sync_endpoints([Ep("e1")])
        s = session(1)
        store.ingest.upsert_session(s, baseline=False)
        ingest(store, s, [activity(1, i) for i in range(3)])
        ids = [int(r[0]) for r in store.db.conn.execute("SELECT id FROM deliveries ORDER BY id")]

        def entries(index: str, where: str) -> int:
            sql = f"SELECT COUNT(*) FROM deliveries INDEXED BY {index} WHERE {where}"
            return int(store.db.conn.execute(sql).fetchone()[0])

        def stuck() -> int:
            return entries(
                "deliveries_stuck", "endpoint = 'e1' AND (status = 'failed' OR status = 'dead')"
            )

        def final() -> int:
            return entries("deliveries_by_update", "(status = 'delivered' OR status = 'dead')")

        assert (stuck(), final()) == (0, 0)  # pending
        for delivery_id, decision in zip(ids, (Delivered(), Retry(T0 + 60), Dead()), strict=True):
            store.outbox.record_attempts([AttemptRecord(delivery_id, ok(T0), decision)])
        assert (stuck(), final()) == (2, 2)  # failed + dead; delivered + dead
        assert {d.status for d in store.operator.list_deliveries(endpoint="e1")} == {
            "delivered",
            "failed",
            "dead",
        }
        for call, index in (
            (lambda: store.operator.list_deliveries(endpoint="e1", status="dead"), "stuck"),
            (lambda: store.operator.list_deliveries(endpoint="e1", status="failed"), "stuck"),
            (lambda: store.operator.status_summary(T0), "by_update"),
            (lambda: store.outbox.prune_delivery_log(T0 - 1), "by_update"),
            (lambda: store.requeue.recover("e1", 0.0), "stuck"),
        ):
            plan = [p for _, ps in _plans(store, call) for p in ps]
            assert any(f"deliveries_{index}" in p for p in plan), plan
            assert not [p for p in plan if p.startswith("SCAN deliveries")], plan
        assert (stuck(), final()) == (0, 1)  # recovered: pending again


# --------------------------------------------------------------------------- codec


def test_the_old_zlib_formats_still_decode() -> None:
    hints = b"sessions/1/activities/a2026"
    assert codec.decode_raw(_zlib(1, RAW_A1, codec.ARCHIVE_DICT + hints), hints) == RAW_A1
    assert codec.decode_body(_zlib(2, BODY_2, codec.BODY_DICT + b"ref"), b"ref", b"") == BODY_2
    old = _zlib(3, BODY_1, codec.BODY_DICT + b"ref" + RAW_A1)
    assert codec.needs_context(old)
    assert codec.decode_body(old, b"ref", RAW_A1) == BODY_1


def test_raw_deflate_is_ten_bytes_shorter_minus_its_crc_and_checked() -> None:
    hints = b"sessions/1/activities/a2026"
    new = codec.encode_raw(RAW_A1, hints)
    old = _zlib(1, RAW_A1, codec.ARCHIVE_DICT + hints)
    assert len(old) - len(new) == 6  # zlib's header, dictionary id and Adler-32; CRC-32 kept
    assert codec.decode_raw(new, hints) == RAW_A1
    damaged = new[:-5] + bytes((new[-5] ^ 1,)) + new[-4:]
    with pytest.raises((ValueError, zlib.error)):
        codec.decode_raw(damaged, hints)
    with pytest.raises(ValueError, match="does not decode"):
        codec.decode_raw(new, b"another context entirely")
    body = codec.encode_body(BODY_1, b"ref", RAW_A1)
    assert codec.needs_context(body) and codec.decode_body(body, b"ref", RAW_A1) == BODY_1
    with pytest.raises(ValueError):
        codec.decode_body(body, b"ref", RAW_ODD)  # another activity: other bytes


def test_names_split_and_join_exactly() -> None:
    assert codec.split_activity_name(S, A1) == ("a1", None)
    assert codec.split_activity_name(S, ODD) == (None, ODD)
    assert codec.split_activity_name(S, None) == (None, None)
    assert codec.split_activity_name(S, f"{S}/activities/") == ("", None)
    assert codec.session_ref(A1, S) is None
    assert codec.session_ref(ODD, S) == S
    assert codec.session_ref("sessions/2/activities/x", S) == S


@pytest.mark.parametrize("names", [codec.EVENT_TYPES, codec.KINDS])
def test_codes_give_every_name_back_in_sql(names: tuple[str, ...]) -> None:
    """Every listed name and any other one: coded in Python, read back by the generated
    column's SQL (the same text on both engines)."""
    conn = sqlite3.connect(":memory:")
    for name in (*names, "custom.thing", "unknownMember", ""):
        code, other = codec.coded(names, name)
        assert (code is None) == (name not in names)
        sql = "SELECT " + codec.uncoded_sql(names, "?", "?")
        # uncoded_sql names columns; here they are parameters: other first, then code.
        assert conn.execute(sql, (other, code)).fetchone()[0] == name
        if code is not None:
            back = conn.execute("SELECT " + codec.coded_sql(names, "?"), (name,)).fetchone()
            assert back[0] == code


def test_a_sessions_deliveries_with_any_filter(backend: Backend) -> None:
    """``deliveries --session`` with or without endpoint and status, on both engines (the
    query goes through the session's events since 0008)."""
    with backend.open(clock=lambda: T0) as store:
        store.endpoints.sync_endpoints([Ep("e1"), Ep("e2")])
        for n in (1, 2):
            s = session(n)
            store.ingest.upsert_session(s, baseline=False)
            ingest(store, s, [activity(n, i) for i in range(3)])
        mine = store.operator.list_deliveries(session="sessions/1")
        assert len(mine) == 6 and {d.session_name for d in mine} == {"sessions/1"}
        assert [d.id for d in mine] == sorted((d.id for d in mine), reverse=True)
        e1 = store.operator.list_deliveries(session="sessions/1", endpoint="e1", status="pending")
        assert [d.endpoint for d in e1] == ["e1"] * 3
        assert (
            store.operator.list_deliveries(session="sessions/1", endpoint="e1", status="dead") == []
        )
        assert (
            len(store.operator.list_deliveries(session="sessions/2", endpoint="e2", limit=2)) == 2
        )


def test_an_event_type_newer_than_the_code_list_is_kept_as_text(backend: Backend) -> None:
    """``activity.session_started`` came after migration 0008 froze ``codec.EVENT_TYPES``
    (the generated ``type`` column of every existing store decodes exactly those codes): it
    is stored as ``type_other`` and reads, filters and replays like any other type, next to
    the coded ones of earlier rows."""
    s = session(1)
    notice = Activity.model_validate(
        {
            "name": f"{S}/activities/{1:032x}",
            "originator": "system",
            "description": "Session started",
            "createTime": "2026-01-01T00:00:00Z",
        }
    )
    future = activity(1, 2, reviewRequested={"reviewer": "octocat"})
    progress = activity(1, 3)
    with backend.open(clock=lambda: T0) as store:
        store.ingest.upsert_session(s, baseline=False)
        ingest(store, s, [notice, future, progress])
        rows = store.db.conn.execute(
            "SELECT type, type_code, type_other FROM events ORDER BY seq"
        ).fetchall()
        assert [tuple(r) for r in rows] == [
            ("activity.session_started", None, "activity.session_started"),
            ("activity.unknown", codec.EVENT_TYPES.index("activity.unknown"), None),
            ("activity.progress_updated", 0, None),
        ]
        started = list(store.operator.iter_events(type_glob="activity.session_*"))
        assert [e.type for e in started] == ["activity.session_started"]
        assert {e.type for e in store.operator.iter_events(type_glob="activity.*")} == {
            "activity.session_started",
            "activity.unknown",
            "activity.progress_updated",
        }


def test_the_event_type_codes_are_the_file_format_of_migration_0008() -> None:
    """A name added to (or moved in) ``codec.EVENT_TYPES`` would be written as a code that
    the ``type`` column of a store made before cannot decode (its SQL was generated from
    this list when the store migrated): new types stay ``type_other`` text instead."""
    assert codec.EVENT_TYPES == (
        "activity.progress_updated",
        "activity.agent_messaged",
        "activity.user_messaged",
        "activity.plan_generated",
        "activity.plan_approved",
        "activity.session_completed",
        "activity.session_failed",
        "activity.unknown",
        "session.discovered",
        "session.state_changed",
        "session.pull_request_opened",
        "session.action_required",
        "session.completed",
        "session.failed",
    )
