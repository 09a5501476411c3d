"""Metrics families and the health server, scraped over a real loopback socket."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import anyio
import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from sessionhook import __version__
from sessionhook.relay.telemetry.metrics import CONTENT_TYPE, Metrics
from sessionhook.relay.web.server import (
    HealthServerError,
    check_ready,
    create_app,
    parse_listen,
    serve,
)

pytestmark = [pytest.mark.app, pytest.mark.anyio]


def _samples(text: str) -> dict[str, list[Sample]]:
    """Family name -> samples, parsed by the Prometheus client's own parser."""
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def _value(samples: list[Sample], name: str, **labels: str) -> float:
    matches = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(matches) == 1, (name, labels, samples)
    return matches[0]


def _filled_metrics() -> Metrics:
    m = Metrics()
    m.event_ingested("activity.progress_updated", 3)
    m.event_ingested("session.discovered")
    m.event_ingested("session.discovered", 0)  # nothing new: no change
    m.delivery_attempted("ci", "delivered", 0.2)
    m.delivery_attempted("ci", "retry", 12.0)
    m.delivery_attempted("ci", "dead", 0.03)
    m.upstream_request("list_sessions", 200)
    m.upstream_request("list_activities", 429)
    m.upstream_request("list_activities", None)
    m.endpoint_was_disabled("chat", "failing")
    m.poll_succeeded(1_000.0)
    m.refresh_outbox({"ci": (4, 940.0), "chat": (0, None)}, now=1_010.0, endpoints=["ci", "ops"])
    return m


def test_families_values_and_text_format() -> None:
    families = _samples(_filled_metrics().render().decode())

    ingested = families["sessionhook_events_ingested"]
    assert _value(ingested, "sessionhook_events_ingested_total", type="session.discovered") == 1
    assert (
        _value(ingested, "sessionhook_events_ingested_total", type="activity.progress_updated") == 3
    )

    deliveries = families["sessionhook_deliveries"]
    for outcome in ("delivered", "retry", "dead"):
        assert (
            _value(deliveries, "sessionhook_deliveries_total", endpoint="ci", outcome=outcome) == 1
        )
    dead = families["sessionhook_dead_letters"]
    assert _value(dead, "sessionhook_dead_letters_total", endpoint="ci") == 1

    duration = families["sessionhook_delivery_attempt_duration_seconds"]
    name = "sessionhook_delivery_attempt_duration_seconds"
    assert _value(duration, f"{name}_count", endpoint="ci") == 3
    assert _value(duration, f"{name}_sum", endpoint="ci") == pytest.approx(12.23)
    assert _value(duration, f"{name}_bucket", endpoint="ci", le="0.25") == 2
    assert _value(duration, f"{name}_bucket", endpoint="ci", le="+Inf") == 3

    upstream = families["sessionhook_upstream_requests"]
    total = "sessionhook_upstream_requests_total"
    assert _value(upstream, total, endpoint="list_activities", status="429") == 1
    assert _value(upstream, total, endpoint="list_activities", status="error") == 1
    assert _value(upstream, total, endpoint="list_sessions", status="200") == 1

    disabled = families["sessionhook_endpoint_disabled"]
    assert (
        _value(disabled, "sessionhook_endpoint_disabled_total", endpoint="chat", reason="failing")
        == 1
    )
    enabled = families["sessionhook_endpoint_enabled"]
    assert _value(enabled, "sessionhook_endpoint_enabled", endpoint="chat") == 0

    pending = families["sessionhook_outbox_pending"]
    assert _value(pending, "sessionhook_outbox_pending", endpoint="ci") == 4
    assert _value(pending, "sessionhook_outbox_pending", endpoint="chat") == 0
    assert _value(pending, "sessionhook_outbox_pending", endpoint="ops") == 0  # explicit zero
    age = families["sessionhook_outbox_oldest_pending_age_seconds"]
    assert _value(age, "sessionhook_outbox_oldest_pending_age_seconds", endpoint="ci") == 70
    assert _value(age, "sessionhook_outbox_oldest_pending_age_seconds", endpoint="ops") == 0

    assert _value(families["sessionhook_poll_lag_seconds"], "sessionhook_poll_lag_seconds") == 10
    last = families["sessionhook_last_successful_poll_timestamp_seconds"]
    assert _value(last, "sessionhook_last_successful_poll_timestamp_seconds") == 1_000
    build = families["sessionhook_build_info"]
    assert _value(build, "sessionhook_build_info", version=__version__) == 1


def test_refresh_drops_endpoints_that_are_gone_and_enabled_gauge_follows_the_store() -> None:
    m = _filled_metrics()
    m.refresh_outbox({"ci": (1, 1_000.0)}, now=1_030.0)
    m.refresh_endpoints({"ci": True, "chat": False})
    families = _samples(m.render().decode())
    pending = families["sessionhook_outbox_pending"]
    assert {s.labels["endpoint"] for s in pending} == {"ci"}
    age = families["sessionhook_outbox_oldest_pending_age_seconds"]
    assert _value(age, "sessionhook_outbox_oldest_pending_age_seconds", endpoint="ci") == 30
    assert _value(families["sessionhook_poll_lag_seconds"], "sessionhook_poll_lag_seconds") == 30
    enabled = families["sessionhook_endpoint_enabled"]
    assert {s.labels["endpoint"]: s.value for s in enabled} == {"ci": 1, "chat": 0}


def test_each_instance_has_its_own_registry() -> None:
    a, b = Metrics(), Metrics()  # the global registry would refuse the second
    a.event_ingested("session.discovered")
    families = _samples(b.render().decode())
    assert families["sessionhook_events_ingested"] == []


def test_poll_lag_stays_zero_before_the_first_success() -> None:
    m = Metrics()
    m.refresh_outbox({}, now=5_000.0)
    families = _samples(m.render().decode())
    assert _value(families["sessionhook_poll_lag_seconds"], "sessionhook_poll_lag_seconds") == 0


# -- readiness (pure) -------------------------------------------------------------------


def test_check_ready() -> None:
    fresh = check_ready(store_writable=True, last_successful_poll=95.0, now=100.0, max_poll_age=60)
    assert fresh == (True, [])
    stale = check_ready(store_writable=True, last_successful_poll=10.0, now=100.0, max_poll_age=60)
    assert stale == (False, ["last successful upstream poll 90s ago (bound 60s)"])
    broken = check_ready(
        store_writable=False, last_successful_poll=99.0, now=100.0, max_poll_age=60
    )
    assert broken == (False, ["store is not writable"])
    # Just started, no poll finished yet: ready until the bound has passed.
    for now, expected in [
        (100.0, (True, [])),
        (200.0, (False, ["no successful upstream poll yet"])),
    ]:
        young = check_ready(
            store_writable=True,
            last_successful_poll=None,
            now=now,
            max_poll_age=60,
            started_at=80.0,
        )
        assert young == expected
    never = check_ready(store_writable=True, last_successful_poll=None, now=1.0, max_poll_age=60)
    assert never == (False, ["no successful upstream poll yet"])


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("127.0.0.1:9187", ("127.0.0.1", 9187)),
        ("[::1]:0", ("::1", 0)),
        ("localhost:80", ("localhost", 80)),
    ],
)
def test_parse_listen(listen: str, expected: tuple[str, int]) -> None:
    assert parse_listen(listen) == expected


@pytest.mark.parametrize("listen", ["9187", ":9187", "::1:9187", "host:port", "h:70000"])
def test_parse_listen_rejects(listen: str) -> None:
    with pytest.raises(HealthServerError, match="listen address"):
        parse_listen(listen)


# -- the server over a real socket ------------------------------------------------------


@dataclass
class _Daemon:
    """What the daemon would hand the health server: metrics, readiness, a scrape hook."""

    metrics: Metrics = field(default_factory=Metrics)
    ready: bool = True
    reasons: Sequence[str] = ()
    scrapes: int = 0
    refresh_fails: bool = False

    async def readiness(self) -> tuple[bool, Sequence[str]]:
        return self.ready, self.reasons

    async def before_scrape(self) -> None:
        self.scrapes += 1
        if self.refresh_fails:
            raise RuntimeError("database is locked")
        self.metrics.refresh_outbox({"ci": (self.scrapes, 0.0)}, now=10.0)


@dataclass
class _Running:
    daemon: _Daemon
    http: httpx.AsyncClient
    address: tuple[str, int]


@pytest.fixture
async def running() -> AsyncIterator[_Running]:
    daemon = _Daemon()
    app = create_app(
        metrics=daemon.metrics, readiness=daemon.readiness, before_scrape=daemon.before_scrape
    )
    async with anyio.create_task_group() as tg:
        address = await tg.start(serve, "127.0.0.1:0", app)
        async with httpx.AsyncClient(
            base_url=f"http://{address[0]}:{address[1]}", trust_env=False, timeout=10
        ) as http:
            yield _Running(daemon, http, address)
        tg.cancel_scope.cancel()


async def test_healthz_is_alive(running: _Running) -> None:
    response = await running.http.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "alive"}
    assert "server" not in response.headers


async def test_readyz_200_then_503_with_reasons(running: _Running) -> None:
    ok = await running.http.get("/readyz")
    assert (ok.status_code, ok.json()) == (200, {"ready": True, "reasons": []})

    running.daemon.ready = False
    running.daemon.reasons = ["store is not writable", "no successful upstream poll yet"]
    not_ready = await running.http.get("/readyz")
    assert not_ready.status_code == 503
    assert not_ready.json() == {
        "ready": False,
        "reasons": ["store is not writable", "no successful upstream poll yet"],
    }


async def test_readyz_with_a_sync_check_that_raises() -> None:
    def broken() -> tuple[bool, Sequence[str]]:
        raise OSError("disk I/O error")

    app = create_app(metrics=Metrics(), readiness=broken)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://health") as http:
        response = await http.get("/readyz")
    assert response.status_code == 503
    assert response.json()["reasons"] == ["readiness check failed: disk I/O error"]


async def test_metrics_are_scraped_and_parse(running: _Running) -> None:
    running.daemon.metrics.delivery_attempted("ci", "delivered", 0.05)
    first = await running.http.get("/metrics")
    second = await running.http.get("/metrics")
    assert first.status_code == 200
    assert first.headers["content-type"] == CONTENT_TYPE
    families = _samples(second.text)
    delivered = families["sessionhook_deliveries"]
    total = "sessionhook_deliveries_total"
    assert _value(delivered, total, endpoint="ci", outcome="delivered") == 1
    # the refresh hook ran before each scrape: the gauge shows the second refresh
    pending = families["sessionhook_outbox_pending"]
    assert _value(pending, "sessionhook_outbox_pending", endpoint="ci") == 2
    assert running.daemon.scrapes == 2


async def test_metrics_still_render_when_the_refresh_fails(running: _Running) -> None:
    await running.http.get("/metrics")
    running.daemon.refresh_fails = True
    response = await running.http.get("/metrics")
    assert response.status_code == 200
    pending = _samples(response.text)["sessionhook_outbox_pending"]
    assert _value(pending, "sessionhook_outbox_pending", endpoint="ci") == 1  # last good value


async def test_a_busy_port_is_a_clear_error(running: _Running) -> None:
    host, port = running.address
    app = create_app(metrics=Metrics(), readiness=lambda: (True, []))
    with pytest.raises(HealthServerError, match=f"cannot listen on {host}:{port}"):
        await serve(f"{host}:{port}", app)


async def test_cancelling_the_task_group_closes_the_socket() -> None:
    app = create_app(metrics=Metrics(), readiness=lambda: (True, []))
    async with anyio.create_task_group() as tg:
        host, port = await tg.start(serve, "127.0.0.1:0", app)
        tg.cancel_scope.cancel()
    with pytest.raises(ConnectionRefusedError), socket.create_connection((host, port), timeout=5):
        pass


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback in this environment")
async def test_ipv6_listen_address() -> None:
    app = create_app(metrics=Metrics(), readiness=lambda: (True, []))
    async with anyio.create_task_group() as tg:
        host, port = await tg.start(serve, "[::1]:0", app)
        async with httpx.AsyncClient(trust_env=False) as http:
            response = await http.get(f"http://[{host}]:{port}/healthz")
        tg.cancel_scope.cancel()
    assert response.status_code == 200


def _without_created_values(text: str) -> str:
    """The exposition text with each ``_created`` sample's value (a clock reading) blanked."""
    return "\n".join(
        line.rsplit(" ", 1)[0] + " <t>" if "_created{" in line else line
        for line in text.splitlines()
    )


def _families(text: str, *names: str) -> str:
    """Only the lines of the named families (HELP, TYPE and samples), in their order."""
    return "\n".join(
        line
        for line in text.splitlines()
        if any(
            line.startswith((f"{name}_", f"{name}{{", f"# HELP {name} ", f"# TYPE {name} "))
            for name in names
        )
    )


def test_delivery_metrics_show_what_prometheus_clients_counter_and_histogram_would() -> None:
    """The delivery counter and histogram are counted without prometheus_client's per-value
    objects; the scrape must still show exactly what its Counter and Histogram show for the
    same attempts: every line, every value, in the same order."""
    import prometheus_client.metrics
    from prometheus_client import CollectorRegistry, Counter, Histogram

    from sessionhook.relay.telemetry.metrics import _DURATION_BUCKETS

    reference = CollectorRegistry(auto_describe=True)
    counter = Counter(
        "deliveries",
        "Delivery attempts by endpoint and outcome (delivered, retry, dead, disabled).",
        ["endpoint", "outcome"],
        namespace="sessionhook",
        registry=reference,
    )
    histogram = Histogram(
        "delivery_attempt_duration_seconds",
        "Duration of one webhook POST, from connect to the capped response body.",
        ["endpoint"],
        namespace="sessionhook",
        buckets=_DURATION_BUCKETS,
        registry=reference,
    )
    m = Metrics()
    # On a bound, between bounds, beyond the last, zero, a negative clock step, tiny ones.
    durations = [0.01, 0.0100001, 0.2, 0.25, 1.0, 29.9, 30.0, 31.0, 1e6, 0.0, -0.5, 3e-4]
    attempts = [
        (endpoint, outcome, duration)
        for i, duration in enumerate(durations * 3)
        for endpoint, outcome in [
            ("ci", "delivered"),
            ("chat", ("retry", "dead", "disabled", "delivered")[i % 4]),
            ('we"ird\\name', "retry"),
        ]
    ]
    for endpoint, outcome, duration in attempts:
        m.delivery_attempted(endpoint, outcome, duration)
        counter.labels(endpoint=endpoint, outcome=outcome).inc()
        histogram.labels(endpoint=endpoint).observe(max(0.0, duration))

    names = ("sessionhook_deliveries", "sessionhook_delivery_attempt_duration_seconds")
    ours = m.render().decode()
    theirs = generate_latest(reference).decode()
    assert _families(ours, *names)  # there is something to compare
    assert _without_created_values(_families(ours, *names)) == _without_created_values(
        _families(theirs, *names)
    )
    # Where they sit in the whole scrape did not move either.
    order = [
        line.split()[2]
        for line in ours.splitlines()
        if line.startswith("# TYPE ") and not line.split()[2].endswith("_created")
    ]
    assert order[:4] == [
        "sessionhook_events_ingested_total",
        "sessionhook_deliveries_total",
        "sessionhook_delivery_attempt_duration_seconds",
        "sessionhook_dead_letters_total",
    ]
    # The _created samples are clock readings taken when the series first appeared.
    stamps = [
        float(line.rsplit(" ", 1)[1])
        for line in ours.splitlines()
        if line.startswith("sessionhook_deliveries_created{")
    ]
    if not getattr(prometheus_client.metrics, "_use_created", True):
        return  # PROMETHEUS_DISABLE_CREATED_SERIES: none on either side (compared above)
    assert len(stamps) == 6 and all(abs(stamp - time.time()) < 3600 for stamp in stamps)


def test_docs_list_every_family_with_its_labels() -> None:
    """docs/operations.md's table is the one list of the families: every family the relay
    exposes is in it, and it names no other; the labels of those with samples are listed."""
    from pathlib import Path

    docs = (Path(__file__).parents[1] / "docs" / "operations.md").read_text("utf-8")
    metrics = Metrics()
    metrics.delivery_attempted("ci", "delivered", 0.1)  # DeliveryStats shows families once used
    exposed: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        name = family.name.removeprefix("sessionhook_")
        name += "_total" if family.type == "counter" else ""
        exposed[name] = {label for s in family.samples for label in s.labels if label != "le"}
    table = docs.split("| metric | labels | meaning |", 1)[1].split("\n\n", 1)[0]
    listed: dict[str, set[str]] = {}
    for row in table.strip().splitlines()[1:]:
        first, second, _ = (cell.strip() for cell in row.strip().strip("|").split("|"))
        names = re.findall(r"`([a-z_]+)`", first)
        labels = set(re.findall(r"`([a-z_]+)`", second))
        for name in names:
            listed[name] = labels
            assert exposed.get(name, set()) <= labels, (name, exposed.get(name), labels)
    assert set(listed) == set(exposed)
