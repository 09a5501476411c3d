"""``sessionhook run`` sets up the garbage collector for a long run (``tune_collector``):
the start-up heap frozen, young collections every 10,000 net allocations. ``--once`` is
left alone. Each check runs in a fresh interpreter: freezing this test process's heap
would keep every later test's cycles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.processes import run_python

pytestmark = pytest.mark.process


def _run(script: str, tmp_path: Path) -> dict[str, object]:
    result: dict[str, object] = json.loads(run_python(script, tmp_path).splitlines()[-1])
    return result


def test_tune_collector_freezes_the_heap_and_cycles_are_still_collected(tmp_path: Path) -> None:
    out = _run(
        """
        import gc, json, weakref
        from sessionhook.cli.relay import YOUNG_THRESHOLD, tune_collector

        before = gc.get_freeze_count()
        tune_collector()

        class Node:
            pass

        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle: only the collector frees it
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        print(json.dumps({"before": before, "frozen": gc.get_freeze_count(),
                          "young": gc.get_threshold()[0], "wanted": YOUNG_THRESHOLD,
                          "cycle_freed": gone() is None}))
        """,
        tmp_path,
    )
    assert out["before"] == 0
    assert isinstance(out["frozen"], int) and out["frozen"] > 1000  # the modules and more
    assert out["young"] == out["wanted"] == 10_000
    assert out["cycle_freed"] is True


def test_run_tunes_the_collector_and_run_once_does_not(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[store]\npath = "{tmp_path / "relay.db"}"\n')
    script = f"""
        import gc, json, os, sys
        import anyio
        from sessionhook.cli import cli

        seen = {{}}

        def fake_run(fn, **kwargs):  # instead of the daemon: what the command set up
            seen[fn.__name__] = [gc.get_freeze_count(), gc.get_threshold()[0]]
            return 0

        anyio.run = fake_run  # `run` imports anyio when it runs
        os.environ["SESSIONHOOK_API_KEY"] = "test-key-0123456789"
        for args in (["--once"], []):
            try:
                cli.main(["run", "--config", {str(config)!r}, *args], standalone_mode=False)
            except SystemExit:
                pass
        print(json.dumps(seen))
        """
    out = _run(script, tmp_path)
    assert out["run_once"] == [0, 700]  # the one-shot pass keeps Python's defaults
    frozen, young = out["run"]  # type: ignore[misc]
    assert frozen > 1000 and young == 10_000
