"""``sessionhook store copy`` in process: every row and byte over, ids kept, the id
generators past them, a non-empty target refused unless ``--replace``, a live store (its
daemon lock held, replicas running) refused, one-line errors."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import sessionhook.relay.store.copying as store_copy_module
from sessionhook.cli import cli
from sessionhook.relay.domain.retry import Delivered
from sessionhook.relay.store import (
    AttemptRecord,
    PostgresStore,
    Store,
    StoreLockedError,
    acquire_daemon_lock,
)
from sessionhook.relay.store.copying import SKIPPED_TABLES, plan
from tests.support.backlog import fill, ok
from tests.support.clock import T0, Clock
from tests.support.store_rows import Ep

pytestmark = pytest.mark.app

TABLES = ("events", "activities", "deliveries", "attempts", "endpoints", "sessions", "meta")


def source_store(path: Path) -> None:
    with Store.open(path, clock=Clock()) as s:
        s.endpoints.sync_endpoints([Ep("a"), Ep("b")])
        fill(s, 3, 4)
        for due in s.outbox.due_deliveries(T0, 2):
            s.outbox.record_attempts([AttemptRecord(due.id, ok(), Delivered())])
        s.endpoints.set_endpoint_enabled("b", False, "operator")
        s.meta.set_meta("first_started_at", repr(T0))
        s.economy.take_budget("default", T0, 100, count=3)


def dump(path: Path, table: str) -> list[tuple[object, ...]]:
    with Store.open_readonly(path) as s:
        return sorted(s.db.conn.execute(f"SELECT * FROM {table}").fetchall(), key=repr)


def test_every_row_and_byte_is_copied_with_its_id(tmp_path: Path) -> None:
    source, target = tmp_path / "s.db", tmp_path / "t.db"
    source_store(source)
    result = CliRunner().invoke(cli, ["store", "copy", "--from", str(source), "--to", str(target)])
    assert result.exit_code == 0, result.output
    assert "counts verified" in result.output
    for table in TABLES:
        assert dump(target, table) == dump(source, table), table
    # The outbox heads were rebuilt by the target, and the id generators follow the copy.
    assert dump(target, "outbox_heads") == dump(source, "outbox_heads")
    with Store.open(target, clock=Clock()) as t:
        before = max(r[0] for r in t.db.conn.execute("SELECT id FROM deliveries"))
        fill(t, 4, 1)  # one more session: new rows
        assert (
            min(
                r[0]
                for r in t.db.conn.execute(
                    "SELECT id FROM deliveries WHERE session_name = 'sessions/3'"
                )
            )
            > before
        )
        assert {e.name: e.enabled for e in t.endpoints.endpoint_states()} == {"a": True, "b": False}


def test_a_non_empty_target_is_refused_unless_replace(tmp_path: Path) -> None:
    source, target = tmp_path / "s.db", tmp_path / "t.db"
    source_store(source)
    with Store.open(target, clock=Clock()) as t:
        t.endpoints.sync_endpoints([Ep("other")])
    runner = CliRunner()
    refused = runner.invoke(cli, ["store", "copy", "--from", str(source), "--to", str(target)])
    assert refused.exit_code == 2
    assert refused.output.startswith("error: the target is not empty (endpoints")
    assert dump(target, "endpoints")[0][0] == "other"  # untouched
    args = ["store", "copy", "--from", str(source), "--to", str(target), "--replace"]
    replaced = runner.invoke(cli, args)
    assert replaced.exit_code == 0, replaced.output
    for table in TABLES:
        assert dump(target, table) == dump(source, table), table


def test_bad_sources_are_one_line_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(
        cli, ["store", "copy", "--from", str(tmp_path / "no.db"), "--to", str(tmp_path / "t")]
    )
    assert missing.exit_code == 2
    assert missing.output.startswith("error: cannot read the source: no database at")
    same = runner.invoke(cli, ["store", "copy", "--from", "x.db", "--to", "x.db"])
    assert same.exit_code == 2 and "the same store" in same.output


def test_runtime_tables_are_not_copied(tmp_path: Path) -> None:
    with Store.open(tmp_path / "a.db") as a, Store.open(tmp_path / "b.db") as b:
        tables = plan(a.copy, b.copy)
    assert not set(tables) & SKIPPED_TABLES
    assert tables.index("sessions") < tables.index("activities") < tables.index("events")
    assert tables.index("events") < tables.index("deliveries") < tables.index("attempts")


# --------------------------------------------------------------------------- a live store


def copy(source: Path | str, target: Path | str) -> Result:
    return CliRunner().invoke(cli, ["store", "copy", "--from", str(source), "--to", str(target)])


@pytest.mark.parametrize("side", ["source", "target"])
def test_a_store_whose_daemon_lock_is_held_is_refused(tmp_path: Path, side: str) -> None:
    # Issue 20: the copy read a store a daemon was writing, without a word.
    source, target = tmp_path / "s.db", tmp_path / "t.db"
    source_store(source)
    held = source if side == "source" else target
    with acquire_daemon_lock(held):
        refused = copy(source, target)
    assert refused.exit_code == 2
    assert refused.output == (
        f"error: a daemon is running on the {side} store {held} (pid {os.getpid()}): "
        "stop it first — sudo systemctl stop sessionhook\n"
    )
    assert not target.exists()  # refused before the target was created
    done = copy(source, target)
    assert done.exit_code == 0, done.output
    with acquire_daemon_lock(source), acquire_daemon_lock(target):
        pass  # the copy let go of both


def test_no_daemon_starts_on_either_side_during_the_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, target = tmp_path / "s.db", tmp_path / "t.db"
    source_store(source)
    tried: list[str] = []

    def copy_store_while_a_daemon_starts(src: Any, dst: Any, **kwargs: Any) -> Any:
        for side in (source, target):
            with pytest.raises(StoreLockedError, match=f"pid {os.getpid()}"):
                acquire_daemon_lock(side)
            tried.append(side.name)
        return real_copy_store(src, dst, **kwargs)

    real_copy_store = store_copy_module.copy_store
    monkeypatch.setattr(store_copy_module, "copy_store", copy_store_while_a_daemon_starts)
    done = copy(source, target)
    assert done.exit_code == 0, done.output
    assert tried == ["s.db", "t.db"]


def test_the_same_file_under_two_names_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "s.db"
    source_store(source)
    refused = copy(source, tmp_path / "sub" / ".." / "s.db")
    assert refused.exit_code == 2 and "the same store" in refused.output


@pytest.mark.parametrize("side", ["source", "target"])
def test_a_postgresql_store_with_a_running_replica_is_refused(
    pg_url: str, tmp_path: Path, side: str
) -> None:
    sqlite = tmp_path / "s.db"
    with PostgresStore.open(pg_url) as pg:
        if side == "source":
            pg.endpoints.sync_endpoints([Ep("a")])
            fill(pg, 2, 2)
        else:
            source_store(sqlite)
        pg.leases.register_replica("r1", host="db1", pid=4242, now=time.time(), lease=30.0)
        source, target = (pg_url, tmp_path / "t.db") if side == "source" else (sqlite, pg_url)
        refused = copy(source, target)
        assert refused.exit_code == 2
        [line] = refused.output.splitlines()
        assert line.startswith(f"error: the {side} database postgresql://")
        assert "has 1 running replica (r1@db1:4242): stop it first" in line
        pg.leases.retire_replica(time.time())  # a clean stop
        done = copy(source, target)
        assert done.exit_code == 0, done.output


def test_a_dead_replica_does_not_make_a_postgresql_source_live(pg_url: str, tmp_path: Path) -> None:
    with PostgresStore.open(pg_url) as pg:
        pg.endpoints.sync_endpoints([Ep("a")])
        fill(pg, 1, 1)
        # Silent for longer than its lease (killed): its claims are free, it runs no more.
        pg.leases.register_replica("gone", host="db1", pid=4242, now=time.time() - 120, lease=30.0)
    done = copy(pg_url, tmp_path / "t.db")
    assert done.exit_code == 0, done.output
