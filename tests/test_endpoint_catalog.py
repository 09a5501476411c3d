"""Endpoints created at run time in the store (both engines): what the dispatcher's catalog
loads and when it is stale (created, changed, an overlap ended), only what changed read and
built, names unique across the config file and the store, and a config file that takes a
name of the store's refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest
from structlog.testing import capture_logs

from sessionhook.relay.config import Config
from sessionhook.relay.delivery import catalog
from sessionhook.relay.delivery.catalog import EndpointCatalog
from sessionhook.relay.delivery.dispatcher import DeliverySettings, Dispatcher
from sessionhook.relay.domain.retry import AttemptResult, Delivered, Retry
from sessionhook.relay.domain.rows import EndpointChanges
from sessionhook.relay.domain.signing import generate_secret
from sessionhook.relay.ops import endpoint_edits as edits
from sessionhook.relay.store import (
    AsyncStore,
    AttemptRecord,
    EndpointConflictError,
    StoreCore,
    StoreError,
)
from tests.support.backends import Backend
from tests.support.backlog import fill, ok

pytestmark = pytest.mark.app

NOW = 1_800_000_000.0
#: A consumer's 503.
BUSY = AttemptResult(503, None, 2.0, "busy", None, NOW + 2)


def _config(*names: str) -> Config:
    return Config.model_validate(
        {
            "endpoints": [
                {"name": n, "url": f"https://hooks.example.com/{n}", "secret": generate_secret()}
                for n in names
            ]
        }
    )


def _create(store: StoreCore, config: Config, name: str) -> str:
    definition, secret = edits.define_endpoint(
        config, name, {"url": f"https://hooks.example.com/{name}", "format": "slack"}
    )
    edits.create_endpoint(store, config, definition, secret)
    return secret


@pytest.mark.anyio
async def test_the_catalog_loads_on_a_new_revision_and_when_an_overlap_ends(
    backend: Backend,
) -> None:
    config = _config("filed")
    with backend.open(clock=lambda: NOW) as sync:
        sync.endpoints.sync_endpoints(config.endpoints)
        astore = AsyncStore(backend.open(clock=lambda: NOW))
        try:
            catalog = EndpointCatalog(astore)
            assert catalog.stale(0, NOW)  # nothing loaded yet
            assert await catalog.load(NOW) == ({}, frozenset())
            assert not catalog.stale(sync.outbox.active_revisions().revision, NOW)
            first = _create(sync, config, "chat")
            active = sync.outbox.active_revisions()
            assert active.names == ["chat", "filed"]
            assert catalog.stale(active.revision, NOW)
            put, gone = await catalog.load(NOW)
            endpoint, secrets = put["chat"]
            assert endpoint.format == "slack" and secrets == (first,) and not gone
            assert catalog.loaded == put
            assert not catalog.stale(active.revision, NOW)
            settings = DeliverySettings.from_config(config).with_endpoints(catalog.loaded)
            assert set(settings.endpoints) == {"chat", "filed"}
            assert settings.secrets["chat"] == (first,)

            rotation = edits.rotate_secret(sync, config, "chat", now=NOW, overlap=10)
            active = sync.outbox.active_revisions()
            assert catalog.stale(active.revision, NOW)
            assert (await catalog.load(NOW))[0]["chat"][1] == (rotation.secret, first)
            assert not catalog.stale(active.revision, NOW + 9)
            assert catalog.stale(active.revision, NOW + 10)  # the overlap is over: the old one goes
            assert (await catalog.load(NOW + 10))[0]["chat"][1] == (rotation.secret,)
            assert not catalog.stale(active.revision, NOW + 11)
            assert await catalog.load(NOW + 12) == ({}, frozenset())  # nothing more to build

            # Deleted: gone; created again: a new revision, never one the catalog holds.
            edits.delete_endpoint(sync, config, "chat")
            active = sync.outbox.active_revisions()
            assert active.names == ["filed"] and catalog.stale(active.revision, NOW + 11)
            assert await catalog.load(NOW + 11) == ({}, frozenset({"chat"}))
            assert catalog.loaded == {}
            _create(sync, config, "chat")
            assert catalog.stale(sync.outbox.active_revisions().revision, NOW + 11)
        finally:
            with anyio.CancelScope(shield=True):
                await astore.close()


class Reads:
    """What the dispatcher's catalog reads of the endpoints created at run time (the rows
    the store hands it) and builds (endpoint configs made from them), counted."""

    def __init__(self, astore: AsyncStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rows = 0
        self.built = 0
        role = astore.store.endpoints  # the door looks the method up on it at each call
        for method in ("stored_endpoints", "endpoint_changes"):
            monkeypatch.setattr(role, method, self._counted(getattr(role, method)))
        real = catalog.spec_endpoint

        def building(*args: Any, **kwargs: Any) -> Any:
            self.built += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(catalog, "spec_endpoint", building)

    def _counted(self, read: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any) -> Any:
            got = read(*args)
            self.rows += len(got) if isinstance(got, list) else len(got.live) + len(got.gone)
            return got

        return counted

    def since(self, before: tuple[int, int]) -> tuple[int, int]:
        return self.rows - before[0], self.built - before[1]


@pytest.mark.anyio
async def test_a_change_reads_and_builds_only_the_endpoint_that_changed(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26 item 6: with 300 endpoints created at run time, one create, one update,
    one rotation or one delete reads one definition from the store and builds at most one
    endpoint (counted, not timed); the dispatcher's settings change by that one name."""
    config = _config()
    with backend.open(clock=lambda: NOW) as sync:
        for n in range(300):
            _create(sync, config, f"ep{n:03d}")
        astore = AsyncStore(backend.open(clock=lambda: NOW))
        reads = Reads(astore, monkeypatch)
        try:
            dispatcher = Dispatcher(
                astore,
                httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(204))),
                DeliverySettings.from_config(config),
                clock=lambda: NOW,
            )
            await dispatcher.run_until_idle()
            assert len(dispatcher.settings.endpoints) == 300
            assert (reads.rows, reads.built) == (300, 300)  # the start: all of them

            changes: dict[str, Callable[[], object]] = {
                "create": lambda: _create(sync, config, "new"),
                "update": lambda: edits.update_endpoint(
                    sync,
                    edits.redefine_endpoint(
                        config, edits.stored_or_refused(sync, config, "ep007"), {"payload": "thin"}
                    ),
                ),
                "rotate": lambda: edits.rotate_secret(sync, config, "ep008", now=NOW),
                "delete": lambda: edits.delete_endpoint(sync, config, "ep009"),
                "nothing": lambda: None,
            }
            for what, change in changes.items():
                before = (reads.rows, reads.built)
                await anyio.to_thread.run_sync(change)
                await dispatcher.run_until_idle()
                expected = {"delete": (1, 0), "nothing": (0, 0)}.get(what, (1, 1))
                assert reads.since(before) == expected, what
            endpoints = dispatcher.settings.endpoints
            assert endpoints["ep007"].payload == "thin" and "new" in endpoints
            assert "ep009" not in endpoints and len(endpoints) == 300
        finally:
            with anyio.CancelScope(shield=True):
                await astore.close()


def test_names_are_unique_across_the_config_file_and_the_store(backend: Backend) -> None:
    config = _config("filed")
    with backend.open(clock=lambda: NOW) as store:
        store.endpoints.sync_endpoints(config.endpoints)
        _create(store, config, "mine")
        with pytest.raises(edits.EndpointConflictError, match="config file"):
            _create(store, config, "filed")
        # The file gains an endpoint of that name: refused whole, nothing changed.
        with pytest.raises(EndpointConflictError, match="'mine' of the config file"):
            store.endpoints.sync_endpoints(_config("filed", "mine").endpoints)
        (mine,) = store.endpoints.stored_endpoints()
        assert mine.name == "mine" and mine.spec["format"] == "slack"
        # An endpoint the file no longer has keeps its name for its history.
        store.endpoints.sync_endpoints([])
        with pytest.raises(edits.EndpointConflictError, match="history"):
            _create(store, _config(), "filed")
        # A reload does not touch the store's endpoints.
        assert [s.name for s in store.endpoints.endpoint_states() if s.active] == ["mine"]


def test_a_delivery_in_flight_when_its_endpoint_is_deleted_stays_dead(backend: Backend) -> None:
    config = _config()
    with backend.open(clock=lambda: NOW) as store:
        _create(store, config, "mine")
        fill(store, 2, 1)
        first, second = sorted(store.outbox.due_deliveries(NOW + 1, 10), key=lambda d: d.id)
        assert edits.delete_endpoint(store, config, "mine") == 2
        # Both POSTs were in flight; one failed (a retry decided), one was delivered.
        store.outbox.record_attempts(
            [
                AttemptRecord(first.id, BUSY, Retry(at=NOW + 60)),
                AttemptRecord(second.id, ok(NOW + 2), Delivered()),
            ]
        )
        rows = {r.id: r for r in store.operator.list_deliveries("mine", None, None, 10)}
        assert rows[first.id].status == "dead" and rows[second.id].status == "delivered"
        assert store.outbox.pending_count("mine") == 0


@pytest.mark.anyio
async def test_a_store_that_cannot_give_the_definitions_now_stops_no_delivery(
    backend: Backend,
) -> None:
    """The dispatcher keeps what it holds, says so once a second at most, and loads the
    definitions when the store answers again."""
    config = _config()
    now = [NOW]
    with backend.open(clock=lambda: NOW) as sync:
        _create(sync, config, "chat")
        astore = AsyncStore(backend.open(clock=lambda: NOW))
        calls = 0

        def unreachable(since: int) -> EndpointChanges:
            nonlocal calls
            calls += 1
            raise StoreError("the database is not reachable now")

        try:
            dispatcher = Dispatcher(
                astore,
                httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(204))),
                DeliverySettings.from_config(config),
                clock=lambda: now[0],
            )
            astore.store.endpoints.endpoint_changes = unreachable  # type: ignore[method-assign]
            with capture_logs() as logs:
                for _ in range(3):
                    await dispatcher.run_until_idle()
            assert calls == 1  # not again within the second
            assert [e["event"] for e in logs].count("endpoint.reload_failed") == 1
            assert "chat" not in dispatcher.settings.endpoints
            del astore.store.endpoints.endpoint_changes  # the class's method again
            now[0] += 1.0
            await dispatcher.run_until_idle()
            assert "chat" in dispatcher.settings.endpoints
        finally:
            with anyio.CancelScope(shield=True):
                await astore.close()
