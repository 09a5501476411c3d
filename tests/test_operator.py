"""The operator layer (``relay/operator.py``) the CLI and the console share: cursor reads,
resume positions, errors the operator can act on; on both store engines (``backend``)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from sessionhook.relay import ops as operator
from sessionhook.relay.ops import EventFilter, Follower, OperatorError
from sessionhook.relay.store import AsyncStore, StoreCore, ops_queries
from sessionhook.relay.web import Bell
from tests.support.backends import Backend
from tests.support.web_relay import WebRelay

pytestmark = pytest.mark.app


def _store(backend: Backend, kinds: list[tuple[str, str]]) -> tuple[StoreCore, list[str]]:
    """A store on ``backend`` holding one event per ``(type, session)``; the ids, in order."""
    relay = WebRelay(AsyncStore(backend.open()), "", Bell())
    ids: list[str] = []

    async def fill() -> None:
        for kind, session in kinds:
            ids.extend(r.id for r in await relay.archive(1, kind=kind, session=session))
        await relay.astore.close()

    anyio.run(fill)
    return backend.open(), ids


def test_a_follower_moves_past_rows_that_do_not_match(backend: Backend) -> None:
    kinds = [("activity.a", "sessions/1")] * 5 + [("session.completed", "sessions/1")]
    store, ids = _store(backend, kinds)
    with store:
        follower = Follower(0, EventFilter(("session.*",)))
        page = follower.read(store, limit=3)
        assert page.events == [] and page.cursor == 3 and page.more
        page = follower.read(store, limit=3)
        assert [e.id for e in page.events] == [ids[5]] and page.cursor == 6 and page.more
        page = follower.read(store, limit=3)
        assert page.events == [] and page.cursor == 6 and not page.more


def test_session_filter_and_several_globs(backend: Backend) -> None:
    kinds = [
        ("session.failed", "sessions/2"),
        ("activity.plan_generated", "sessions/1"),
        ("session.failed", "sessions/1"),
        ("activity.progress_updated", "sessions/1"),
    ]
    store, ids = _store(backend, kinds)
    wanted = EventFilter(("session.*", "*.plan_*"), "sessions/1")
    with store:
        page = Follower(0, wanted).read(store)
    assert [e.id for e in page.events] == [ids[1], ids[2]]
    assert EventFilter().matches("anything") and not wanted.matches("Session.failed")


@dataclass
class Row:
    seq: int
    type: str = "x.a"
    session_name: str = "sessions/1"


class Holey:
    """A store whose committed rows the test chooses (PostgreSQL's view mid-transaction)."""

    def __init__(self, *seqs: int) -> None:
        self.seqs = sorted(seqs)

    @property
    def operator(self) -> Holey:
        """The role the follower reads: this fake is its own."""
        return self

    def events_after(
        self, seq: int, *, limit: int = 200, max_bytes: int | None = None
    ) -> list[Row]:
        return [Row(s) for s in self.seqs if s > seq][:limit]


def test_a_follower_waits_at_a_hole_until_it_fills_or_settles() -> None:
    now = [100.0]
    store = Holey(1, 2, 4, 5, 8)  # 3 is being written; 6 and 7 never will be
    follower = Follower(0, EventFilter(), settle=5.0, clock=lambda: now[0])

    def read() -> list[int]:
        return [r.seq for r in follower.read(store).events]  # type: ignore[arg-type]

    assert read() == [1, 2]  # stops before the hole at 3
    now[0] += 2
    assert read() == []
    store.seqs = sorted([*store.seqs, 3])  # its transaction commits: in order, nothing lost
    assert read() == [3, 4, 5]
    assert follower.cursor == 5
    # The hole at 6-7 was seen at the first read, with the one at 3: its clock runs since.
    now[0] += 2.9
    assert read() == []
    now[0] += 0.2
    assert read() == [8]  # 6 and 7 never came: settled 5 s after first seen, passed
    assert read() == [] and follower.cursor == 8


class _Spy:
    """Stands for a store's connection: records how many rows each statement reading the
    events table returned."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.sizes: list[int] = []

    def execute(self, sql: str, params: Any = ()) -> Any:
        rows = self.conn.execute(sql, params).fetchall()
        if "FROM events e" in sql:
            self.sizes.append(len(rows))
        return _Result(rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


class _Result:
    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows

    def fetchall(self) -> list[Any]:
        rows, self.rows = self.rows, []
        return rows

    def fetchone(self) -> Any:
        return self.fetchmany(1)[0] if self.rows else None

    def fetchmany(self, size: int = 1) -> list[Any]:
        rows, self.rows = self.rows[:size], self.rows[size:]
        return rows

    def close(self) -> None:
        self.rows = []


def test_events_filters_hold_across_pages(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``events`` (the CLI's listing) reads a page per statement (see test_store's
    test_fetches_in_batches); its session, type and limit filters hold across pages."""
    kinds = [("x.a", "sessions/1"), ("x.b", "sessions/1"), ("x.a", "sessions/2")] * 3
    store, ids = _store(backend, kinds)
    monkeypatch.setattr(ops_queries, "_FETCH", 3)
    with store:
        spy = _Spy(store.db.conn)
        monkeypatch.setattr(store.db, "conn", spy)
        assert [e.id for e in operator.events(store)] == ids
        assert max(spy.sizes) <= 3 and len(spy.sizes) == 4  # three full pages, one empty
        spy.sizes.clear()
        wanted = [i for i, (kind, _) in zip(ids, kinds, strict=True) if kind == "x.a"]
        assert [e.id for e in operator.events(store, type_glob="x.a")] == wanted
        first = [e.id for e in operator.events(store, session="sessions/1", limit=2)]
        assert first == ids[:2]
        assert max(spy.sizes) <= 3


def test_resume_position(backend: Backend) -> None:
    store, ids = _store(backend, [("x.a", "sessions/1")] * 3)
    with store:
        assert operator.resume_position(store, None) == 3  # only what comes next
        assert operator.resume_position(store, ids[0]) == 1
        with pytest.raises(OperatorError, match="unknown event id 'evt_zzz'"):
            operator.resume_position(store, "evt_zzz")


def test_errors_the_operator_can_act_on(backend: Backend) -> None:
    store, ids = _store(backend, [("x.a", "sessions/1")])
    with store:
        with pytest.raises(OperatorError, match=r"no endpoint named 'ci' .*known: none yet"):
            operator.find_endpoint(store, "ci")
        with pytest.raises(OperatorError, match="status must be one of"):
            operator.deliveries(store, status="lost")
        with pytest.raises(OperatorError, match="no delivery 9"):
            operator.attempts(store, "#9")
        event, found = operator.attempts(store, ids[0])
        assert event is not None and event.id == ids[0] and found == []
        with pytest.raises(OperatorError, match="either a start time"):
            operator.replay(store, "ci")


def test_the_operator_package_is_a_face_over_its_modules() -> None:
    """``relay/ops/__init__.py`` defines nothing itself: it imports from the modules that hold
    the operator's functions and lists ``__all__``, every name of which it has."""
    tree = ast.parse(Path(operator.__file__ or "").read_text("utf-8"))
    defined = [
        node
        for node in tree.body
        if not isinstance(node, ast.Import | ast.ImportFrom | ast.Expr)
        and not (isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__")
    ]
    assert [ast.unparse(node).splitlines()[0] for node in defined] == []
    assert [name for name in operator.__all__ if not hasattr(operator, name)] == []
    assert {"status", "deliveries", "replay", "Follower", "test_endpoint"} <= set(operator.__all__)
