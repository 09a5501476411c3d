"""The suite's tiers (docs/testing.md), a pytest plugin that conftest.py loads.

Every test module declares exactly one tier, ``pytestmark = pytest.mark.<tier>`` (alone or
in a list): a module with none, or with two, fails its collection with one line saying so,
so a new module cannot forget it. A test that runs on PostgreSQL is in the ``process``
tier whatever its module declares (its ``sqlite`` twin stays where it is).
``make quick`` runs ``-m "not process"``.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

#: Lightest first: pure code; the app in the test's own process (the store on SQLite,
#: ASGI, loopback servers it starts, the daemon in process); other processes (the
#: ``sessionhook`` command, a fresh interpreter, PostgreSQL, Chromium).
TIERS = ("unit", "app", "process")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "unit: a pure test, in process (make quick runs it)")
    config.addinivalue_line(
        "markers", "app: the app in the test's own process, store on SQLite (make quick)"
    )
    config.addinivalue_line(
        "markers", "process: other processes, PostgreSQL or Chromium (make test only)"
    )


def declared(module: pytest.Module) -> list[str]:
    """The tiers ``module`` declares in its ``pytestmark``."""
    return [mark.name for mark in module.own_markers if mark.name in TIERS]


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport]:
    report = yield
    if isinstance(collector, pytest.Module) and report.passed:
        tiers = declared(collector)
        if len(tiers) != 1:
            found = " and ".join(tiers) or "none"
            report.outcome = "failed"
            report.longrepr = (
                f"{collector.nodeid}: declare exactly one tier "
                f"(pytestmark = pytest.mark.unit, .app or .process), found {found}"
            )
    return report


def uses_postgresql(item: pytest.Item) -> bool:
    """Whether ``item`` runs on the PostgreSQL cluster: it takes ``pg_cluster`` or
    ``pg_url``, or it is a test's ``postgresql`` parameter (``store_backend``...)."""
    names = getattr(item, "fixturenames", ())
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    return "pg_cluster" in names or "pg_url" in names or "postgresql" in params


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if uses_postgresql(item) and not item.get_closest_marker("process"):
            item.add_marker(pytest.mark.process)
