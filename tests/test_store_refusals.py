"""The store's side of screening upstream: refused activities (migration 0002), the cursor
bounded by the upstream clock, names archived under another session."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionhook.api.models import Activity, Session
from sessionhook.relay.store import Store
from tests.support.backends import Backend
from tests.support.schemas import build_old_sqlite

pytestmark = pytest.mark.app


def store(backend: Backend) -> Store:
    s = backend.open(clock=lambda: 1000.0)
    for name in ("sessions/1", "sessions/2"):
        s.ingest.upsert_session(Session(name=name, state="IN_PROGRESS"), baseline=False)
    return s


def act(session: str, ident: str, when: str) -> Activity:
    return Activity(name=f"{session}/activities/{ident}", create_time=when)


def cursor(s: Store, session: str = "sessions/1") -> str | None:
    row = s.ingest.get_session(session)
    assert row is not None
    return row.activity_cursor


def test_the_cursor_ignores_times_past_the_limit(backend: Backend) -> None:
    with store(backend) as s:
        batch = [
            act("sessions/1", "a", "2026-01-01T00:00:00.000000Z"),
            act("sessions/1", "b", "9999-12-31T23:59:59.999999Z"),
        ]
        added = s.ingest.ingest_activities(
            "sessions/1", batch, [], True, cursor_limit="2026-01-01T00:00:01Z"
        )
        assert added.activities == 2  # archived, both
        assert cursor(s) == "2026-01-01T00:00:00.000000Z"


def test_a_name_archived_under_another_session_is_reported_not_archived(backend: Backend) -> None:
    with store(backend) as s:
        taken = act("sessions/1", "x", "2026-01-01T00:00:00Z")
        s.ingest.ingest_activities("sessions/2", [taken], [], True)
        again = s.ingest.ingest_activities("sessions/1", [taken], [], True)
        assert again.activities == 0
        assert again.conflicts == (taken.name,)
        assert cursor(s) is None  # its time is not trusted either
        same = s.ingest.ingest_activities("sessions/2", [taken], [], True)
        assert same.conflicts == ()


def test_refusals_are_recorded_once_counted_and_summarised(backend: Backend) -> None:
    with store(backend) as s:
        assert s.refusals.refuse_activity("sessions/1", "sessions/9/activities/a", "foreign_name")
        assert not s.refusals.refuse_activity(
            "sessions/1", "sessions/9/activities/a", "foreign_name"
        )
        assert s.refusals.refuse_activity(
            "sessions/1",
            "sessions/1/activities/big",
            "too_large",
            create_time="2026-01-01T00:00:05Z",
            size=50_000_000,
            advance_cursor=True,
            cursor_limit="2026-01-01T00:01:00Z",
        )
        assert cursor(s) == "2026-01-01T00:00:05Z"  # polling goes on after it
        rows = {r.name: r for r in s.refusals.refused_activities()}
        assert rows["sessions/9/activities/a"].count == 2
        assert rows["sessions/1/activities/big"].size == 50_000_000
        summary = s.operator.status_summary(1000.0).refused
        assert summary.total == 2
        assert summary.by_reason == {"foreign_name": 1, "too_large": 1}
        assert summary.latest is not None
        with pytest.raises(ValueError, match="reason"):
            s.refusals.refuse_activity("sessions/1", "x", "bored")


def test_a_database_of_the_first_version_gains_the_refusals_table(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    build_old_sqlite(path, through="0001_initial")  # only the first migration, as 0.1 left it
    with Store.open(path) as s:
        assert s.refusals.refused_activities() == []
        applied = [r[0] for r in s.db.conn.execute("SELECT name FROM _sqlite_migrations")]
        assert "0002_refused_activities" in applied
