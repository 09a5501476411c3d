"""``sessionhook store copy`` in process: every row and byte over, ids kept, the id
generators past them, a non-empty target refused unless ``--replace``, one-line errors."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from sessionhook.cli import cli
from sessionhook.relay.retry import Delivered
from sessionhook.relay.store import AttemptRecord, Store
from sessionhook.relay.store.copy import SKIPPED_TABLES, plan

from .test_outbox import T0, Clock, Ep, fill, ok

TABLES = ("events", "activities", "deliveries", "attempts", "endpoints", "sessions", "meta")


def source_store(path: Path) -> None:
    with Store.open(path, clock=Clock()) as s:
        s.sync_endpoints([Ep("a"), Ep("b")])
        fill(s, 3, 4)
        for due in s.due_deliveries(T0, 2):
            s.record_attempts([AttemptRecord(due.id, ok(), Delivered())])
        s.set_endpoint_enabled("b", False, "operator")
        s.set_meta("first_started_at", repr(T0))
        s.take_budget("default", T0, 100, count=3)


def dump(path: Path, table: str) -> list[tuple[object, ...]]:
    with Store.open_readonly(path) as s:
        return sorted(s._conn.execute(f"SELECT * FROM {table}").fetchall(), key=repr)


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
        before = max(r[0] for r in t._conn.execute("SELECT id FROM deliveries"))
        fill(t, 4, 1)  # one more session: new rows
        assert (
            min(
                r[0]
                for r in t._conn.execute(
                    "SELECT id FROM deliveries WHERE session_name = 'sessions/3'"
                )
            )
            > before
        )
        assert {e.name: e.enabled for e in t.endpoint_states()} == {"a": True, "b": False}


def test_a_non_empty_target_is_refused_unless_replace(tmp_path: Path) -> None:
    source, target = tmp_path / "s.db", tmp_path / "t.db"
    source_store(source)
    with Store.open(target, clock=Clock()) as t:
        t.sync_endpoints([Ep("other")])
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
        tables = plan(a, b)
    assert not set(tables) & SKIPPED_TABLES
    assert tables.index("sessions") < tables.index("activities") < tables.index("events")
    assert tables.index("events") < tables.index("deliveries") < tables.index("attempts")
