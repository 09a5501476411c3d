"""The console's browser walk on a PostgreSQL store: the same tests as
test_console_browser.py (imported from it, not copied), against ``sessionhook run`` whose
``[store]`` names a fresh database of the session's PostgreSQL cluster (``tests/pg.py``).

A focused subset, to keep CI short: sign in, the overview (endpoint health, upstream, the
chart's per-minute counts), a session's timeline, a failed attempt replayed until the new
attempt shows delivered, and events appearing live (the sessions list and a running
session's timeline). The other pages read through the same queries, which
tests/test_console.py runs on both engines in process.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import test_console_browser as walk
from tests.conftest import TEMPLATE
from tests.console_harness import Stack
from tests.pg import Cluster

pytestmark = pytest.mark.integration

# The fixtures and tests of the walk, bound here in the order they run (the replay and the
# live events change what later tests see); ``stack`` below replaces the module's own.
browser = walk.browser
chrome = walk.chrome
test_sign_in_with_the_token = walk.test_sign_in_with_the_token
test_overview_shows_endpoint_health_upstream_and_the_chart = (
    walk.test_overview_shows_endpoint_health_upstream_and_the_chart
)
test_timeline_shows_events_with_deliveries_per_endpoint = (
    walk.test_timeline_shows_events_with_deliveries_per_endpoint
)
test_failed_attempt_detail_then_replay_and_see_the_new_attempt = (
    walk.test_failed_attempt_detail_then_replay_and_see_the_new_attempt
)
test_new_events_appear_live_without_reload = walk.test_new_events_appear_live_without_reload


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, pg_cluster: Cluster) -> Iterator[Stack]:
    """The console's stack with its daemon on a PostgreSQL database of its own."""
    name = pg_cluster.create_database(TEMPLATE)
    try:
        with walk.opened_stack(tmp_path_factory.mktemp("console-pg"), pg_cluster.url(name)) as st:
            assert st.get("/readyz").json()["store"]["backend"] == "postgresql"
            yield st
    finally:
        pg_cluster.drop_database(name)
