"""The store: schema and migrations, idempotent ingest, the outbox, replay, operator queries."""

from __future__ import annotations

import base64
import itertools
import json
import os
import sqlite3
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from sessionhook.api.models import Activity, Session
from sessionhook.relay.config import EndpointConfig
from sessionhook.relay.domain import events
from sessionhook.relay.domain.events import Event
from sessionhook.relay.domain.retry import AttemptResult, Dead, Delivered, DisableEndpoint, Retry
from sessionhook.relay.domain.rows import Ingested
from sessionhook.relay.store import (
    AsyncStore,
    Economy,
    EndpointQueries,
    Ingest,
    MetaQueries,
    OperatorQueries,
    Outbox,
    Store,
    StoreError,
    migrations,
)
from sessionhook.relay.store.migrations import MIGRATIONS, Migration
from tests.support.backends import Backend, sqlite_only
from tests.support.clock import T0, Clock
from tests.support.store_rows import Ep, activity, built, ingest, ready, session

pytestmark = pytest.mark.app

SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()


def ok(at: float = T0, status: int = 200) -> AttemptResult:
    return AttemptResult(status, None, 5.0, "ok", None, at)


def fail(at: float = T0, status: int | None = 503, error: str | None = None) -> AttemptResult:
    return AttemptResult(status, error, 7.0, "busy", None, at)


def assert_refused(path: Path, message: str) -> None:
    """Opening the file refuses it (``message``), to write and to read."""
    with pytest.raises(StoreError, match=message):
        Store.open(path)
    with pytest.raises(StoreError, match=message):
        Store.open_readonly(path)


def count(store: Store, table: str) -> int:
    return int(store.db.conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


@pytest.fixture
def store(backend: Backend, clock: Clock) -> Iterator[Store]:
    with backend.open(clock=clock) as opened:
        yield opened


# --------------------------------------------------------------------------- opening


@sqlite_only
def test_open_creates_directories_and_sets_pragmas(store: Store) -> None:
    assert store.path.parent.is_dir()
    pragma = store.db.conn.execute
    assert pragma("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert pragma("PRAGMA foreign_keys").fetchone()[0] == 1
    assert pragma("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert pragma("PRAGMA busy_timeout").fetchone()[0] >= 1000
    assert pragma("PRAGMA recursive_triggers").fetchone()[0] == 1


@pytest.mark.real_migrations
def test_migrations_are_recorded_once_and_rerun_safely(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    with Store.open(path) as first:
        first.meta.set_meta("k", "v")
    for _ in range(2):
        with Store.open(path) as again:
            rows = again.db.conn.execute(
                "SELECT migration_set, name, applied_at FROM _sqlite_migrations"
            ).fetchall()
            assert [(r[0], r[1]) for r in rows] == [("sessionhook", m.name) for m in MIGRATIONS]
            assert rows[0][1] == "0001_initial"
            assert "0005_outbox_heads" in [r[1] for r in rows]
            assert all(r[2] for r in rows)
            assert again.meta.get_meta("k") == "v"


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    Store.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO _sqlite_migrations (migration_set, name, applied_at) "
        "VALUES ('sessionhook', '9999_future', 'x')"
    )
    conn.commit()
    conn.close()
    assert_refused(path, "newer sessionhook")


def test_a_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER)")
    conn.commit()
    conn.close()
    assert_refused(path, "not a sessionhook database")
    # Refused before anything was changed: still in its own journal mode, no tables added.
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("customers",)]
    conn.close()


def test_a_failing_migration_leaves_no_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = Migration("0002_broken", ("CREATE TABLE half_done (x INTEGER)", "SELECT nowhere"))
    monkeypatch.setattr(migrations, "MIGRATIONS", (MIGRATIONS[0], broken))
    path = tmp_path / "db.sqlite"
    with pytest.raises(StoreError, match="no such column: nowhere"):
        Store.open(path)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall() == []
    conn.close()
    monkeypatch.undo()
    with Store.open(path) as fixed:
        assert fixed.operator.status_summary(T0).events == 0


def test_a_file_that_is_not_sqlite_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello, this is not a database at all " * 100)
    with pytest.raises(StoreError, match="not a usable SQLite database"):
        Store.open(path)


def test_directory_that_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="cannot create directory"):
        Store.open(tmp_path / "file" / "sub" / "db.sqlite")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_directory_not_writable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(StoreError, match="not writable"):
            Store.open(locked / "db.sqlite")
    finally:
        locked.chmod(0o700)


def test_directory_not_writable_as_the_os_reports_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Runs under root too, where permission bits do not stop anything.
    real_access = os.access
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode)
    )
    with pytest.raises(StoreError, match=r"directory .*locked is not writable") as info:
        Store.open(locked / "db.sqlite")
    assert info.value.path == locked / "db.sqlite"
    assert not (locked / "db.sqlite").exists()


def test_open_readonly_missing_file(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no database"):
        Store.open_readonly(tmp_path / "none.db")


def test_readonly_reads_while_the_writer_is_open(backend: Backend, clock: Clock) -> None:
    with backend.open(clock=clock) as writer:
        (s,) = ready(writer)
        ingest(writer, s, [activity(1, 1), activity(1, 2)])
        with backend.open_readonly() as reader:
            assert reader.readonly
            assert reader.outbox.pending_count() == 2
            stream = reader.operator.iter_events()
            first = next(stream)
            # The writer commits while the reader holds an open cursor: the reader goes on
            # with its snapshot, and its next query sees the new rows.
            ingest(writer, s, [activity(1, 3)])
            early = built(s, [activity(1, 1), activity(1, 2)])
            assert [first.id, *(e.id for e in stream)] == [e.id for e in early]
            assert len(list(reader.operator.iter_events())) == 3
            assert reader.outbox.pending_count() == 3
            assert reader.operator.status_summary(T0).activities == 3
            with pytest.raises(StoreError, match="read-only"):
                reader.meta.set_meta("x", "y")
            with pytest.raises(StoreError, match="read-only"):
                reader.operator.replay("a", session=s.name)


# --------------------------------------------------------------------------- ingest


def test_same_page_twice_is_archived_once(store: Store) -> None:
    (s,) = ready(store)
    page = [activity(1, i) for i in range(1, 4)]
    assert ingest(store, s, page) == 3
    assert ingest(store, s, page) == 0
    assert count(store, "activities") == 3
    assert count(store, "events") == 3
    assert count(store, "deliveries") == 3


def test_overlapping_pages(store: Store) -> None:
    (s,) = ready(store)
    assert ingest(store, s, [activity(1, i) for i in (1, 2, 3)]) == 3
    assert ingest(store, s, [activity(1, i) for i in (2, 3, 4, 5)]) == 2
    # A server that ignores the time filter returns everything again.
    assert ingest(store, s, [activity(1, i) for i in (1, 2, 3, 4, 5, 6)]) == 1
    assert [e.activity_name for e in store.operator.iter_events()] == [
        activity(1, i).name for i in range(1, 7)
    ]
    assert count(store, "deliveries") == 6


def test_duplicates_within_one_page(store: Store) -> None:
    (s,) = ready(store)
    a = activity(1, 1)
    assert store.ingest.ingest_activities(s.name, [a, a], built(s, [a, a]), True) == Ingested(
        1, ("activity.progress_updated",), deliveries=1
    )
    assert count(store, "events") == 1
    assert count(store, "deliveries") == 1


def test_already_archived_activity_produces_no_event_even_if_its_event_is_new(
    store: Store,
) -> None:
    (s,) = ready(store)
    a = activity(1, 1)
    ingest(store, s, [a])
    # Same activity, an event with a different id (as a future version might build).
    other = Event(
        "evt_other", "activity.unknown", s.name, a.name, "2025-03-01T10:01:00Z", 0.0, b"{}"
    )
    assert store.ingest.ingest_activities(s.name, [a], [other], True) == Ingested(0, ())
    assert store.operator.get_event("evt_other") is None


def test_rebuilt_database_gives_the_same_event_ids(
    backend: Backend, clock: Clock, request: pytest.FixtureRequest
) -> None:
    acts = [activity(1, i) for i in range(1, 8)]
    s = session(1)
    ids = []
    for split, where in ((3, backend), (5, backend.another(request))):
        with where.open(clock=clock) as db:
            ready(db)
            db.ingest.ingest_session_events(s.name, [events.session_discovered(s)], True)
            ingest(db, s, acts[:split])
            ingest(db, s, acts[split - 1 :])
            ids.append([(e.id, e.body) for e in db.operator.iter_events()])
    assert ids[0] == ids[1]
    assert len(ids[0]) == 8
    assert ids[0][1][0] == events.event_id("activity", acts[0].name)


@pytest.mark.parametrize("failure", ["foreign key", "python error"])
def test_failure_mid_ingest_leaves_nothing_half_written(store: Store, failure: str) -> None:
    (s,) = ready(store)
    ingest(store, s, [activity(1, 1)])
    cursor_before = store.ingest.get_session(s.name).activity_cursor  # type: ignore[union-attr]
    acts = [activity(1, 2), activity(1, 3)]
    evs = built(s, acts)
    if failure == "foreign key":
        # The last event names a session that does not exist: the engine refuses it.
        bad = Event("evt_bad", "session.discovered", "sessions/404", None, "", 0.0, b"{}")
        evs.append(bad)
        expected: Any = (sqlite3.IntegrityError, psycopg.IntegrityError)
    else:
        bad_body = Event(evs[1].id, evs[1].type, s.name, acts[1].name, "", 0.0, b"\xff\xfe")
        evs[1] = bad_body
        expected = UnicodeDecodeError
    with pytest.raises(expected):
        store.ingest.ingest_activities(s.name, acts, evs, True)
    assert count(store, "activities") == 1
    assert count(store, "events") == 1
    assert count(store, "deliveries") == 1
    assert (
        store.ingest.get_session(  # type: ignore[union-attr]
            s.name
        ).activity_cursor
        == cursor_before
    )
    # And the same page goes in whole on the next try.
    assert ingest(store, s, acts) == 2


def test_ingest_for_an_unknown_session(store: Store) -> None:
    ready(store)
    with pytest.raises(StoreError, match="unknown session"):
        store.ingest.ingest_activities("sessions/404", [], [], True)


def test_cursor_advances_by_instant_not_by_string(store: Store) -> None:
    (s,) = ready(store)

    def at(name: str, create_time: str) -> Activity:
        return Activity.model_validate(
            {"name": f"{s.name}/activities/{name}", "createTime": create_time}
        )

    # "...00Z" sorts after "...00.000001Z" as a string, but is earlier.
    ingest(store, s, [at("a", "2025-03-01T10:00:00.000001Z"), at("b", "2025-03-01T10:00:00Z")])
    assert (
        store.ingest.get_session(  # type: ignore[union-attr]
            s.name
        ).activity_cursor
        == "2025-03-01T10:00:00.000001Z"
    )
    # An offset form: 12:00+02:00 is 10:00Z, earlier than 10:30Z.
    ingest(store, s, [at("c", "2025-03-01T10:30:00Z"), at("d", "2025-03-01T12:00:00+02:00")])
    assert (
        store.ingest.get_session(  # type: ignore[union-attr]
            s.name
        ).activity_cursor
        == "2025-03-01T10:30:00Z"
    )
    # An older page (already archived or not) never moves it back.
    ingest(store, s, [at("e", "2025-03-01T09:00:00Z"), at("f", "")])
    assert (
        store.ingest.get_session(  # type: ignore[union-attr]
            s.name
        ).activity_cursor
        == "2025-03-01T10:30:00Z"
    )


def test_archive_keeps_activity_whole_and_kind(store: Store) -> None:
    (s,) = ready(store)
    big = "Q" * 5000
    a = Activity.model_validate(
        {
            "name": f"{s.name}/activities/{'b' * 32}",
            "createTime": "2025-03-01T10:00:00Z",
            "sessionCompleted": {},
            "artifacts": [{"media": {"mimeType": "image/png", "data": big}}],
            "novel": {"x": 1},
        }
    )
    ingest(store, s, [a])
    (kind,) = store.db.conn.execute("SELECT kind FROM activities").fetchone()
    assert kind == "sessionCompleted"
    stored = store.ingest.activity_raw(a.name)
    assert stored is not None
    raw = stored.decode()
    assert big in raw and '"novel"' in raw
    assert json.loads(raw) == a.to_wire()
    (ev,) = list(store.operator.iter_events())
    assert big not in ev.body.decode()
    assert ev.payload()["data"]["activity"]["artifacts"][0]["media"]["trimmed"] is True


def test_raws_made_with_the_events_are_archived_as_they_are(store: Store) -> None:
    """The poller hands over each activity's raw JSON made along with its events (one
    serialization for both): the archive keeps those bytes, for the first copy of a name
    on the page; without them the store makes the same bytes itself."""
    s1, s2 = ready(store, sessions=2)
    big = {"artifacts": [{"media": {"mimeType": "image/png", "data": "Z" * 3000}}]}
    page = [activity(1, 1), activity(1, 2, **big), activity(1, 1)]
    made, raws = events.archived_page(s1, page, max_media_bytes=1000)
    raws = [b'{"given":1}', b'{"given":2}', b'{"given":3}']
    assert store.ingest.ingest_activities(s1.name, page, made, True, raws=raws).activities == 2
    assert store.ingest.activity_raw(page[0].name) == b'{"given":1}'
    assert store.ingest.activity_raw(page[1].name) == b'{"given":2}'
    # The events were compressed against the given raws: still read back whole.
    assert [e.body for e in store.operator.iter_events()] == [e.body for e in made[:2]]
    other = [activity(2, 1), activity(2, 2, **big)]
    made, raws = events.archived_page(s2, other, max_media_bytes=1000)
    store.ingest.ingest_activities(s2.name, other, made, True, raws=raws)
    store.ingest.ingest_activities(s2.name, [activity(2, 3)], built(s2, [activity(2, 3)]), True)
    for a in [*other, activity(2, 3)]:
        assert store.ingest.activity_raw(a.name) == json.dumps(
            a.to_wire(), separators=(",", ":"), ensure_ascii=False
        ).encode("utf-8")
    with pytest.raises(ValueError, match="2 raw activities for 1"):
        store.ingest.ingest_activities(s2.name, [activity(2, 4)], [], True, raws=[b"{}", b"{}"])


def test_glob_matching_on_enqueue(store: Store) -> None:
    store.endpoints.sync_endpoints(
        [
            Ep("all"),
            Ep("ends", events=("activity.session_*", "session.state_changed")),
            Ep("off", enabled=False),
            Ep("gone"),
        ]
    )
    store.endpoints.set_endpoint_enabled("gone", False, "410 Gone")
    s = session(1)
    store.ingest.upsert_session(s, baseline=False)
    store.ingest.ingest_session_events(
        s.name,
        [events.session_discovered(s), events.session_state_changed(s, "PLANNING")],
        True,
    )
    ingest(
        store,
        s,
        [activity(1, 1), activity(1, 2, sessionCompleted={}), activity(1, 3, sessionFailed={})],
    )
    got = sorted((d.endpoint, d.event_type) for d in store.operator.list_deliveries(limit=1000))
    assert got == sorted(
        [
            ("all", t)
            for t in (
                "session.discovered",
                "session.state_changed",
                "activity.progress_updated",
                "activity.session_completed",
                "activity.session_failed",
            )
        ]
        + [
            ("ends", "session.state_changed"),
            ("ends", "activity.session_completed"),
            ("ends", "activity.session_failed"),
        ]
    )


def test_endpoint_config_objects_are_accepted(store: Store) -> None:
    config = EndpointConfig(
        name="ci", url="https://ci.example/h", secret=SECRET, events=("activity.*",)
    )
    store.endpoints.sync_endpoints([config])
    (state,) = store.endpoints.endpoint_states()
    assert (state.name, state.url, state.events, state.active) == (
        "ci",
        "https://ci.example/h",
        ("activity.*",),
        True,
    )


def test_backfill_false_archives_without_delivering(store: Store) -> None:
    store.endpoints.sync_endpoints([Ep("a")])
    s = store.ingest.upsert_session(session(1), baseline=True).to_session()
    assert store.ingest.get_session(s.name).baseline  # type: ignore[union-attr]
    assert store.ingest.ingest_session_events(
        s.name, [events.session_discovered(s)], False
    ) == Ingested(0, ("session.discovered",))
    assert ingest(store, s, [activity(1, 1), activity(1, 2)], deliver=False) == 2
    assert count(store, "events") == 3
    assert count(store, "deliveries") == 0
    assert store.outbox.due_deliveries(T0 + 10, 10) == []
    # What happens afterwards is delivered.
    assert ingest(store, s, [activity(1, 3)], deliver=True) == 1
    assert [d.event_type for d in store.operator.list_deliveries()] == ["activity.progress_updated"]


@pytest.mark.parametrize("baseline", [False, True])
def test_archive_discovered_is_the_upsert_the_account_and_the_announcement(
    store: Store, backend: Backend, request: pytest.FixtureRequest, clock: Clock, baseline: bool
) -> None:
    """The discovery's one store call leaves what its three calls left: the session row
    (with its account), the ``session.discovered`` event, its delivery unless baseline."""
    other = backend.another(request).open(clock=clock)
    try:
        for db in (store, other):
            db.endpoints.sync_endpoints([Ep("a")])
        s = session(1, prompt="do it")
        ev = events.with_account(events.session_discovered(s), "work")
        added = store.ingest.archive_discovered(s, ev, baseline=baseline, account="work")
        other.ingest.upsert_session(s, baseline=baseline)
        other.ingest.set_session_account(s.name, "work")
        assert added == other.ingest.ingest_session_events(s.name, [ev], not baseline)
        assert added.event_types == ("session.discovered",)
        assert store.ingest.get_session(s.name) == other.ingest.get_session(s.name)
        for db in (store, other):
            (account,) = db.db.conn.execute(
                "SELECT account FROM sessions WHERE name = ?", (s.name,)
            ).fetchone()
            assert account == "work"
        assert [(e.id, e.body) for e in store.operator.iter_events()] == [
            (e.id, e.body) for e in other.operator.iter_events()
        ]
        assert count(store, "deliveries") == count(other, "deliveries") == (0 if baseline else 1)
        # A repeat (a retry after a failure) archives nothing twice.
        again = store.ingest.archive_discovered(s, ev, baseline=baseline, account="work")
        assert again.event_types == ()
        assert count(store, "events") == 1
    finally:
        other.close()


@pytest.mark.parametrize("refreshed", [True, False])
def test_finish_poll_is_the_upsert_and_the_schedule(
    store: Store, backend: Backend, request: pytest.FixtureRequest, clock: Clock, refreshed: bool
) -> None:
    """A poll's end in one call leaves the row its two calls left."""
    other = backend.another(request).open(clock=clock)
    try:
        listed = session(1)
        fresh = session(
            1, state="COMPLETED", prompt="done", outputs=[{"pullRequest": {"url": "https://pr/1"}}]
        )
        for db in (store, other):
            db.ingest.upsert_session(listed, baseline=True)
        store.ingest.finish_poll(
            listed.name,
            fresh if refreshed else None,
            baseline=True,
            next_poll_at=T0 + 30,
            polled_update_time="2026-01-02T03:04:05Z",
        )
        if refreshed:
            other.ingest.upsert_session(fresh, baseline=True)
        other.ingest.schedule_poll(listed.name, T0 + 30, polled_update_time="2026-01-02T03:04:05Z")
        row = store.ingest.get_session(listed.name)
        assert row == other.ingest.get_session(listed.name)
        assert row is not None and row.next_poll_at == T0 + 30
        assert row.state == ("COMPLETED" if refreshed else listed.state)
    finally:
        other.close()


def test_upstream_counts_in_one_call_are_the_same_rows_as_one_by_one(
    store: Store, backend: Backend, request: pytest.FixtureRequest, clock: Clock
) -> None:
    other = backend.another(request).open(clock=clock)
    try:
        calls = [
            ("list_sessions", 200, T0 - 100),
            ("list_sessions", 200, T0 - 100),
            ("list_activities", 429, T0 - 50),
            ("list_activities", None, T0 - 30),
            ("list_activities", "malformed", T0 - 30),
            ("get_session", 200, T0 - 65),  # the minute before
            ("get_session", 200, T0),
        ]
        counts: dict[tuple[str, int | str | None, int], int] = {}
        for label, status, at in calls:
            store.economy.record_upstream(label, status, at)
            key = (label, status, int(at // 60))
            counts[key] = counts.get(key, 0) + 1
        store.economy.record_upstream("get_session", 200, T0)  # a row there already: added to
        other.economy.record_upstream("get_session", 200, T0)
        other.economy.record_upstream_counts(counts)
        other.economy.record_upstream_counts({})  # nothing: no transaction

        def rows(db: Store) -> list[tuple[Any, ...]]:
            return sorted(
                tuple(r)
                for r in db.db.conn.execute(
                    "SELECT minute, label, status, count FROM upstream_requests"
                )
            )

        assert rows(other) == rows(store)
        assert (
            other.operator.status_summary(T0).upstream == store.operator.status_summary(T0).upstream
        )
    finally:
        other.close()


def test_session_events_are_idempotent(store: Store) -> None:
    (s,) = ready(store)
    ev = events.session_discovered(s)
    assert store.ingest.ingest_session_events(s.name, [ev], True).event_types == (ev.type,)
    assert store.ingest.ingest_session_events(s.name, [ev], True).event_types == ()
    assert count(store, "deliveries") == 1


# --------------------------------------------------------------------------- sessions


def test_upsert_merges_list_items_into_the_full_session(store: Store, clock: Clock) -> None:
    full = session(1, prompt="do it", outputs=[{"pullRequest": {"url": "https://pr/1"}}])
    row = store.ingest.upsert_session(full, baseline=True)
    assert (row.url, row.source, row.baseline, row.first_seen_at) == (
        full.url,
        "sources/github/acme/widgets",
        True,
        T0,
    )
    clock.now += 100
    listed = Session.model_validate(
        {
            "name": "sessions/1",
            "id": "1",
            "title": "Renamed",
            "state": "COMPLETED",
            "createTime": "2025-03-01T10:00:00Z",
            "updateTime": "2025-03-01T11:00:00Z",
        }
    )
    row = store.ingest.upsert_session(listed, baseline=False)
    assert (row.title, row.state, row.update_time) == (
        "Renamed",
        "COMPLETED",
        "2025-03-01T11:00:00Z",
    )
    assert row.url == full.url and row.source == "sources/github/acme/widgets"
    assert row.baseline is True and row.first_seen_at == T0
    assert row.to_session().pull_requests[0].url == "https://pr/1"
    assert row.raw["prompt"] == "do it"
    assert [r.name for r in store.operator.list_sessions()] == ["sessions/1"]
    assert store.ingest.get_session("sessions/2") is None


def test_schedule_poll_records_poll_bookkeeping(store: Store, clock: Clock) -> None:
    (s,) = ready(store)
    store.ingest.schedule_poll(s.name, T0 + 2)
    row = store.ingest.get_session(s.name)
    assert row is not None
    assert (row.next_poll_at, row.last_polled_at, row.polled_update_time) == (T0 + 2, None, None)
    clock.now = T0 + 5
    store.ingest.schedule_poll(s.name, None, polled_update_time="2025-03-01T10:00:00Z")
    row = store.ingest.get_session(s.name)
    assert row is not None
    assert (row.next_poll_at, row.last_polled_at) == (None, T0 + 5)
    assert row.polled_update_time == "2025-03-01T10:00:00Z"
    store.ingest.schedule_poll(s.name, T0 + 60, poll_errors=3, polled_at=T0 + 9)
    row = store.ingest.get_session(s.name)
    assert row is not None
    assert (row.poll_errors, row.last_polled_at, row.polled_update_time) == (
        3,
        T0 + 9,
        "2025-03-01T10:00:00Z",
    )


def test_baseline_flag(store: Store) -> None:
    assert not store.meta.is_baseline_complete()
    store.meta.mark_baseline_complete()
    assert store.meta.is_baseline_complete()


# --------------------------------------------------------------------------- outbox


def test_due_deliveries_keep_order_per_endpoint_and_session(store: Store, clock: Clock) -> None:
    s1, s2 = ready(store, Ep("a"), Ep("b"), sessions=2)
    for s in (s1, s2):
        ingest(store, s, [activity(int(s.id), i) for i in (1, 2, 3)])
    due = store.outbox.due_deliveries(T0, 100)
    # One head per (endpoint, session): the oldest activity of each session.
    assert sorted((d.endpoint, d.session_name, d.event_id) for d in due) == sorted(
        (ep, s.name, events.event_id("activity", activity(int(s.id), 1).name))
        for ep in ("a", "b")
        for s in (s1, s2)
    )
    assert all(d.attempts == 0 and d.url == "https://hooks.example.com/x" for d in due)
    first = due[0]
    assert first.body == store.operator.get_event(first.event_id).body  # type: ignore[union-attr]
    # Delivering a head makes the next event of that key eligible, nothing else changes.
    store.outbox.record_attempt(first.id, ok(), Delivered())
    again = store.outbox.due_deliveries(T0, 100)
    assert len(again) == 4
    nxt = next(d for d in again if d.key == first.key)
    assert nxt.event_id == events.event_id(
        "activity", activity(int(first.session_name[9:]), 2).name
    )


def test_due_deliveries_busy_limit_and_next_due(store: Store) -> None:
    s1, s2 = ready(store, Ep("a"), sessions=2)
    ingest(store, s1, [activity(1, 1), activity(1, 2)])
    ingest(store, s2, [activity(2, 1)])
    assert store.outbox.next_due_at() == T0
    assert {d.session_name for d in store.outbox.due_deliveries(T0, 10, {("a", s1.name)})} == {
        s2.name
    }
    assert len(store.outbox.due_deliveries(T0, 1)) == 1
    assert store.outbox.due_deliveries(T0 - 1, 10) == []
    assert store.outbox.due_deliveries(T0, 0) == []


def test_retry_scheduling_blocks_the_key_until_due(store: Store) -> None:
    s1, s2 = ready(store, Ep("a"), sessions=2)
    ingest(store, s1, [activity(1, 1), activity(1, 2)])
    ingest(store, s2, [activity(2, 1)])
    head = next(d for d in store.outbox.due_deliveries(T0, 10) if d.session_name == s1.name)
    failing = store.outbox.record_attempt(head.id, fail(T0), Retry(at=T0 + 300))
    assert failing == T0
    row = store.operator.get_delivery(head.id)
    assert row is not None
    assert (
        row.status,
        row.attempts,
        row.next_attempt_at,
        row.last_status_code,
        row.last_error,
    ) == (
        "failed",
        1,
        T0 + 300,
        503,
        "HTTP 503",
    )
    # The failed head holds back the session's later event; the other session goes on.
    assert [d.session_name for d in store.outbox.due_deliveries(T0 + 10, 10)] == [s2.name]
    assert store.outbox.next_due_at() == T0
    (retry_due,) = [
        d for d in store.outbox.due_deliveries(T0 + 300, 10) if d.session_name == s1.name
    ]
    assert (retry_due.id, retry_due.attempts) == (head.id, 1)
    # A second failure keeps the first failing_since; a success clears it.
    assert (
        store.outbox.record_attempt(head.id, fail(T0 + 300, None, "timeout"), Retry(T0 + 2000))
        == T0
    )
    assert store.outbox.record_attempt(head.id, ok(T0 + 2000), Delivered()) is None
    (state,) = store.endpoints.endpoint_states()
    assert state.failing_since is None
    assert state.last_success_at == pytest.approx(T0 + 2000.005)
    assert state.last_error == "timeout"
    attempts = store.operator.list_attempts(head.id)
    assert [(a.attempt, a.status_code, a.error) for a in attempts] == [
        (1, 503, None),
        (2, None, "timeout"),
        (3, 200, None),
    ]
    assert attempts[0].response_body == "busy"
    done = store.operator.get_delivery(head.id)
    assert done is not None
    assert (done.status, done.attempts, done.next_attempt_at, done.last_error) == (
        "delivered",
        3,
        None,
        None,
    )
    assert done.delivered_at == pytest.approx(T0 + 2000.005)


def test_dead_letters_do_not_block(store: Store) -> None:
    (s,) = ready(store)
    ingest(store, s, [activity(1, 1), activity(1, 2)])
    (head,) = store.outbox.due_deliveries(T0, 10)
    store.outbox.record_attempt(head.id, fail(), Dead())
    (nxt,) = store.outbox.due_deliveries(T0, 10)
    assert nxt.id != head.id
    assert [d.id for d in store.operator.list_deliveries(status="dead")] == [head.id]
    assert store.outbox.pending_count() == 1


def test_410_disables_the_endpoint_and_parks_the_delivery(store: Store, clock: Clock) -> None:
    s1, s2 = ready(store, Ep("a"), Ep("b"), sessions=2)
    ingest(store, s1, [activity(1, 1), activity(1, 2)])
    head = next(
        d
        for d in store.outbox.due_deliveries(T0, 10)
        if d.endpoint == "a" and d.session_name == s1.name
    )
    store.outbox.record_attempt(head.id, fail(T0, 410), DisableEndpoint("410 Gone"))
    states = {st.name: st for st in store.endpoints.endpoint_states()}
    assert not states["a"].enabled and not states["a"].active
    assert states["a"].disabled_reason == "410 Gone"
    assert states["b"].active
    row = store.operator.get_delivery(head.id)
    assert row is not None and row.status == "pending"
    assert {d.endpoint for d in store.outbox.due_deliveries(T0, 10)} == {"b"}
    assert store.outbox.next_due_at() == T0  # b still has work
    # While disabled, new events are not queued for it.
    ingest(store, s2, [activity(2, 1)])
    assert store.outbox.pending_count("a") == 2
    # Enabled again: the parked delivery goes out first, the failing clock starts afresh.
    clock.now = T0 + 50
    store.endpoints.set_endpoint_enabled("a", True, None)
    states = {st.name: st for st in store.endpoints.endpoint_states()}
    assert states["a"].active and states["a"].failing_since is None
    assert states["a"].disabled_reason is None
    a_due = [d for d in store.outbox.due_deliveries(T0 + 50, 10) if d.endpoint == "a"]
    assert [d.id for d in a_due] == [head.id]


def test_set_endpoint_enabled_unknown(store: Store) -> None:
    with pytest.raises(StoreError, match="unknown endpoint"):
        store.endpoints.set_endpoint_enabled("nope", False, "x")


def test_record_attempt_unknown_delivery(store: Store) -> None:
    with pytest.raises(StoreError, match="unknown delivery"):
        store.outbox.record_attempt(12345, ok(), Delivered())


def test_sync_endpoints_keeps_runtime_state_and_deactivates_removed(store: Store) -> None:
    store.endpoints.sync_endpoints([Ep("a"), Ep("b")])
    store.endpoints.set_endpoint_enabled("a", False, "operator")
    store.endpoints.sync_endpoints([Ep("a", url="https://new.example/h", events=("session.*",))])
    states = {st.name: st for st in store.endpoints.endpoint_states()}
    assert states["a"].url == "https://new.example/h"
    assert states["a"].events == ("session.*",)
    assert not states["a"].enabled and states["a"].disabled_reason == "operator"
    assert not states["b"].configured and not states["b"].active
    store.endpoints.sync_endpoints([Ep("a"), Ep("b")])
    assert {st.name: st.configured for st in store.endpoints.endpoint_states()} == {
        "a": True,
        "b": True,
    }


# --------------------------------------------------------------------------- replay


@pytest.fixture
def history(store: Store) -> tuple[Store, list[Session]]:
    """Two sessions, three activities each (10:01, 10:02, 10:03), one session event each."""
    sessions = ready(store, Ep("a"), Ep("b", events=("activity.*",)), sessions=2)
    for s in sessions:
        store.ingest.ingest_session_events(s.name, [events.session_discovered(s)], True)
        ingest(store, s, [activity(int(s.id), i) for i in (1, 2, 3)])
    # Deliver everything that is queued.
    while due := store.outbox.due_deliveries(T0, 100):
        for d in due:
            store.outbox.record_attempt(d.id, ok(), Delivered())
    return store, sessions


def ts(minute: int) -> float:
    from sessionhook.api.models import parse_timestamp

    return parse_timestamp(f"2025-03-01T10:{minute:02d}:00Z").timestamp()


def test_replay_by_time_range(history: tuple[Store, list[Session]]) -> None:
    store, _ = history
    n = store.operator.replay("a", since=ts(2), until=ts(3))
    assert n == 2  # the 10:02 activity of both sessions
    rows = store.operator.list_deliveries(endpoint="a", status="pending")
    assert len(rows) == 2 and all(r.replayed for r in rows)
    ids = {r.event_id for r in rows}
    assert ids == {events.event_id("activity", activity(k, 2).name) for k in (1, 2)}


def test_replayed_delivery_sends_the_same_id_and_body(
    history: tuple[Store, list[Session]],
) -> None:
    store, _ = history
    target = events.event_id("activity", activity(1, 1).name)
    assert store.operator.replay("a", event_ids=[target]) == 1
    (due,) = store.outbox.due_deliveries(T0 + 1, 10)
    assert due.event_id == target
    assert due.attempts == 0
    assert due.body == store.operator.get_event(target).body  # type: ignore[union-attr]
    assert len(store.operator.list_deliveries(event_id=target, endpoint="a")) == 2


def test_replay_by_type_and_session_respects_subscriptions(
    history: tuple[Store, list[Session]],
) -> None:
    store, sessions = history
    assert store.operator.replay("a", type_glob="session.*") == 2
    # b subscribes to activity.* only: session events are not replayed to it.
    assert store.operator.replay("b", type_glob="session.*") == 0
    assert store.operator.replay("b", session=sessions[0].name) == 3
    # Already on their way: not queued twice.
    assert store.operator.replay("b", session=sessions[0].name) == 0
    assert (
        store.operator.replay("a", session=sessions[1].name, type_glob="activity.progress_*") == 3
    )


def test_replay_includes_dead_letters(store: Store) -> None:
    (s,) = ready(store)
    ingest(store, s, [activity(1, 1)])
    (d,) = store.outbox.due_deliveries(T0, 10)
    store.outbox.record_attempt(d.id, fail(), Dead())
    assert store.outbox.due_deliveries(T0, 10) == []
    assert store.operator.replay("a", event_ids=[d.event_id]) == 1
    (again,) = store.outbox.due_deliveries(T0, 10)
    assert again.event_id == d.event_id and again.id != d.id
    dead = store.operator.get_delivery(d.id)
    assert dead is not None and dead.status == "dead"  # history kept


def test_replay_of_archived_but_never_delivered_backfill(store: Store) -> None:
    store.endpoints.sync_endpoints([Ep("a")])
    s = session(1)
    store.ingest.upsert_session(s, baseline=True)
    ingest(store, s, [activity(1, 1), activity(1, 2)], deliver=False)
    assert store.operator.replay("a", since=0) == 2
    assert [d.event_id for d in store.outbox.due_deliveries(T0, 10)] == [
        events.event_id("activity", activity(1, 1).name)
    ]


def test_replay_errors(history: tuple[Store, list[Session]]) -> None:
    store, _ = history
    with pytest.raises(StoreError, match="unknown endpoint"):
        store.operator.replay("zzz", since=0)
    with pytest.raises(ValueError, match="at least one filter"):
        store.operator.replay("a")


@sqlite_only
def test_replay_of_a_large_range_is_one_statement(store: Store) -> None:
    (s,) = ready(store)
    acts = [activity(1, i, minute=i % 60) for i in range(1, 1501)]
    ingest(store, s, acts, deliver=False)
    statements: list[str] = []
    store.db.conn.set_trace_callback(statements.append)
    assert store.operator.replay("a", since=0) == 1500
    store.db.conn.set_trace_callback(None)
    # sqlite3 traces the statement again each time a trigger (outbox_heads) runs under it;
    # a loop of INSERTs would show as many distinct statements (the values differ).
    assert len({sql for sql in statements if sql.startswith("INSERT")}) == 1
    assert store.outbox.pending_count("a") == 1500


# --------------------------------------------------------------------------- reading


def test_iter_events_streams_and_filters(store: Store) -> None:
    s1, s2 = ready(store, sessions=2)
    ingest(store, s1, [activity(1, i, minute=i % 60) for i in range(1, 1201)], deliver=False)
    ingest(store, s2, [activity(2, 1, sessionCompleted={})], deliver=False)
    stream = store.operator.iter_events()
    assert isinstance(stream, types.GeneratorType)
    head = list(itertools.islice(stream, 3))
    assert [e.seq for e in head] == [1, 2, 3]
    stream.close()
    assert sum(1 for _ in store.operator.iter_events(session=s1.name)) == 1200
    (completed,) = store.operator.iter_events(type_glob="activity.session_*")
    assert completed.session_name == s2.name
    late = list(store.operator.iter_events(session=s1.name, since=ts(59)))
    assert {e.occurred_at for e in late} == {"2025-03-01T10:59:00.000000Z"}
    assert len(list(store.operator.iter_events(until=ts(1)))) == 20  # minute 0: i = 60, 120, ...


def test_fetches_in_batches(store: Store) -> None:
    """``iter_events`` reads the archive a page per statement: PostgreSQL's client cursor
    holds a statement's whole result in memory, so one cursor over everything would."""
    (s,) = ready(store)
    ingest(store, s, [activity(1, i, minute=0) for i in range(1, 1101)], deliver=False)

    class Rows:  # a cursor whose rows were read
        def __init__(self, rows: list[Any]) -> None:
            self.rows = rows

        def fetchall(self) -> list[Any]:
            return self.rows

    class Spy:
        def __init__(self, conn: Any) -> None:
            self.conn = conn
            self.sizes: list[int] = []

        def execute(self, sql: str, params: Any = ()) -> Any:
            cursor = self.conn.execute(sql, params)
            if "FROM events e" in sql:
                rows = cursor.fetchall()
                self.sizes.append(len(rows))
                return Rows(rows)
            return cursor

    spy = Spy(store.db.conn)
    store.db.conn = spy  # type: ignore[assignment]
    try:
        assert sum(1 for _ in store.operator.iter_events()) == 1100
    finally:
        store.db.conn = spy.conn
    assert spy.sizes == [500, 500, 100]


def test_status_summary_numbers(store: Store, clock: Clock) -> None:
    s1, s2 = ready(store, Ep("a"), Ep("b"), sessions=2)
    clock.now = T0 - 7200
    ingest(store, s1, [activity(1, 1)])  # two hours ago: a and b
    clock.now = T0
    ingest(store, s1, [activity(1, 2)])
    ingest(store, s2, [activity(2, 1)])
    by_key = {(d.endpoint, d.session_name): d for d in store.outbox.due_deliveries(T0, 100)}
    # a/s1: old delivery delivered now, a/s2: dead now, b/s1: two failures, b/s2: untouched.
    store.outbox.record_attempt(by_key["a", s1.name].id, ok(T0 - 10), Delivered())
    store.outbox.record_attempt(by_key["a", s2.name].id, fail(T0 - 20), Dead())
    store.outbox.record_attempt(by_key["b", s1.name].id, fail(T0 - 5000, 500), Retry(T0 - 4000))
    store.outbox.record_attempt(
        by_key["b", s1.name].id, fail(T0 - 30, None, "refused"), Retry(T0 + 60)
    )
    store.economy.record_upstream("list_sessions", 200, T0 - 100)
    store.economy.record_upstream("list_sessions", 200, T0 - 100)
    store.economy.record_upstream("list_activities", 429, T0 - 50)
    store.economy.record_upstream("list_activities", 429, T0 - 40)
    store.economy.record_upstream("list_activities", None, T0 - 30)
    store.economy.record_upstream("list_activities", 503, T0 - 20)
    store.economy.record_upstream("list_sessions", 429, T0 - 7200)  # outside the hour
    store.economy.mark_poll(True, T0 - 60)
    store.economy.mark_poll(False, T0 - 5)
    store.meta.mark_baseline_complete()

    summary = store.operator.status_summary(T0)
    a, b = summary.endpoints
    assert (a.name, a.pending, a.delivered_last_hour, a.dead_last_hour, a.dead_total) == (
        "a",
        1,
        1,
        1,
        1,
    )
    assert a.failed_last_hour == 1 and a.last_error == "HTTP 503"
    assert a.oldest_pending_age == 0  # a/s1's second activity, queued at T0
    assert (b.name, b.pending, b.delivered_last_hour, b.failed_last_hour, b.dead_total) == (
        "b",
        3,
        0,
        1,
        0,
    )
    assert b.oldest_pending_age == 7200
    assert b.failing_since == T0 - 5000
    assert b.last_error == "refused"
    up = summary.upstream
    assert (up.requests_last_hour, up.throttled_last_hour, up.errors_last_hour) == (6, 2, 2)
    assert (up.last_poll_at, up.last_ok_poll_at) == (T0 - 5, T0 - 60)
    assert (summary.sessions, summary.activities, summary.events) == (2, 3, 3)
    assert summary.baseline_complete


def test_status_keeps_each_accounts_passes_apart(store: Store) -> None:
    """One account's good passes do not hide another's failing ones: the summary's last
    good pass is the oldest of theirs (none while one has none), and each is listed."""
    store.economy.mark_poll(True, T0 - 3600, account="team-a")
    store.economy.mark_poll(False, T0 - 2, account="team-a")  # its key refused since
    store.economy.mark_poll(True, T0 - 5, 40, account="team-b")
    store.economy.mark_poll(False, T0 - 1, account="team-c")  # never a good pass
    up = store.operator.status_summary(T0).upstream
    assert [(p.account, p.last_poll_at, p.last_ok_poll_at, p.list_cut) for p in up.accounts] == [
        ("team-a", T0 - 2, T0 - 3600, None),
        ("team-b", T0 - 5, T0 - 5, 40),
        ("team-c", T0 - 1, None, None),
    ]
    assert (up.last_poll_at, up.last_ok_poll_at, up.list_cut) == (T0 - 1, None, 40)
    store.economy.mark_poll(True, T0, account="team-c")
    assert store.operator.status_summary(T0).upstream.last_ok_poll_at == T0 - 3600
    assert store.economy.last_ok_poll_at("team-b") == T0 - 5
    assert store.economy.last_ok_poll_at("team-d") is None


def test_outbox_stats_and_pending_count(store: Store, clock: Clock) -> None:
    (s,) = ready(store, Ep("a"), Ep("b", events=("session.*",)), Ep("c"))
    store.endpoints.set_endpoint_enabled("c", False, "x")
    clock.now = T0 + 1
    ingest(store, s, [activity(1, 1)])
    clock.now = T0 + 2
    ingest(store, s, [activity(1, 2)])
    assert store.outbox.outbox_stats() == {"a": (2, T0 + 1), "b": (0, None), "c": (0, None)}
    assert store.outbox.pending_count() == 2
    assert store.outbox.pending_count("b") == 0


def test_upstream_counters_are_pruned(store: Store) -> None:
    store.economy.record_upstream("x", 200, T0 - 3 * 86400)
    store.economy.record_upstream("x", 200, T0)
    assert count(store, "upstream_requests") == 1


def test_list_deliveries_filters(history: tuple[Store, list[Session]]) -> None:
    store, sessions = history
    assert len(store.operator.list_deliveries(limit=1000)) == 8 + 6
    assert len(store.operator.list_deliveries(endpoint="b")) == 6
    assert len(store.operator.list_deliveries(endpoint="a", session=sessions[0].name)) == 4
    assert store.operator.list_deliveries(status="failed") == []
    rows = store.operator.list_deliveries(limit=3)
    assert [r.id for r in rows] == sorted((r.id for r in rows), reverse=True)
    assert store.operator.get_delivery(999999) is None


# --------------------------------------------------------------------------- async


@pytest.mark.anyio
async def test_async_store_serializes_calls(backend: Backend) -> None:
    clock = Clock()
    astore = AsyncStore(backend.open(clock=clock))
    try:
        await astore.run(EndpointQueries.sync_endpoints, [Ep("a")])
        sessions = [session(n) for n in range(1, 6)]

        async def upsert(s: Session) -> None:
            await astore.run(Ingest.upsert_session, s, baseline=False)

        async with anyio.create_task_group() as tg:
            for s in sessions:
                tg.start_soon(upsert, s)

        async def one(s: Session) -> None:
            acts = [activity(int(s.id), i) for i in (1, 2)]
            await astore.run(Ingest.ingest_activities, s.name, acts, built(s, acts), True)
            await astore.run(
                Ingest.ingest_session_events, s.name, [events.session_discovered(s)], True
            )
            await astore.run(Economy.record_upstream, "list_activities", 200, T0)

        async with anyio.create_task_group() as tg:
            for s in sessions:
                tg.start_soon(one, s)
        assert await astore.run(Outbox.pending_count) == 15
        due = await astore.run(Outbox.due_deliveries, T0, 100, set())
        assert len(due) == 5
        failing = await astore.run(Outbox.record_attempt, due[0].id, ok(), Delivered())
        assert failing is None
        assert await astore.run(Outbox.next_due_at) == T0
        assert len(await astore.run(OperatorQueries.list_sessions)) == 5
        row = await astore.run(Ingest.get_session, "sessions/1")
        assert row is not None
        await astore.run(Ingest.schedule_poll, row.name, T0 + 1, polled_update_time=row.update_time)
        await astore.run(Economy.mark_poll, True, T0)
        await astore.run(MetaQueries.mark_baseline_complete)
        assert await astore.run(MetaQueries.is_baseline_complete)
        await astore.run(EndpointQueries.set_endpoint_enabled, "a", False, "maintenance")
        assert not (await astore.run(EndpointQueries.endpoint_states))[0].enabled
        assert (await astore.run(Outbox.outbox_stats))["a"][0] == 14
        summary = await astore.run(OperatorQueries.status_summary, T0)
        assert summary.upstream.requests_last_hour == 5
        # Only the one delivered event lacks an open delivery, so only it is queued again.
        assert await astore.run(OperatorQueries.replay, "a", since=0) == 1
    finally:
        await astore.close()


# --------------------------------------------------------------------------- issue 11


@dataclass(frozen=True)
class FilteredEp(Ep):
    filter: dict[str, tuple[str, ...]] | None = None


def test_endpoint_filter_applies_at_enqueue_and_in_replay(store: Store) -> None:
    acme = FilteredEp("acme", filter={"data.session.source": ("sources/github/acme/*",)})
    other = FilteredEp("other", filter={"data.session.source": ("sources/github/other/*",)})
    ready(store, Ep("all"), acme, other, sessions=1)
    s = session(1)
    ingest(store, s, [activity(1, 1), activity(1, 2)])
    queued = {d.endpoint for d in store.operator.list_deliveries(status="pending")}
    assert queued == {"all", "acme"}  # "other" never gets a row for acme's session
    assert len(store.operator.list_deliveries(endpoint="acme", status="pending")) == 2
    # Replay honours the filter too.
    assert store.operator.replay("other", since=0) == 0
    assert store.operator.replay("acme", since=0) == 0  # already on their way
    # A config change of the filter is synced: now "other" matches everything.
    store.endpoints.sync_endpoints([Ep("all"), acme, FilteredEp("other", filter={})])
    assert store.operator.replay("other", since=0) == 2


def test_rendered_body_is_kept_once_per_delivery(store: Store) -> None:
    ready(store, Ep("a"))
    ingest(store, session(1), [activity(1, 1)])
    (due,) = store.outbox.due_deliveries(T0, 10)
    assert store.outbox.rendered_body(due.id) is None
    store.outbox.save_rendered(due.id, b'{"text":"first"}', "application/json")
    store.outbox.save_rendered(due.id, b'{"text":"second"}', "application/json")  # first one wins
    assert store.outbox.rendered_body(due.id) == (b'{"text":"first"}', "application/json")


def test_latest_activity_is_the_newest_of_its_member(store: Store) -> None:
    ready(store, Ep("a"))
    s = session(1)
    asked = [
        activity(1, i, agentMessaged={"agentMessage": f"q{i}"}) for i in (3, 1, 2)
    ]  # archived out of order: createTime decides
    ingest(store, s, [*asked, activity(1, 9)])
    latest = store.ingest.latest_activity(s.name, "agentMessaged")
    assert latest is not None and latest.agent_messaged is not None
    assert latest.agent_messaged.agent_message == "q3"
    assert store.ingest.latest_activity(s.name, "planGenerated") is None
