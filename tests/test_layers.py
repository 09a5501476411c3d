"""The layer contracts (``.importlinter``) hold, and they catch an import that runs upward.

``make lint`` runs the same check on the tree; this test shows that the check can fail: it
plants an upward import in a copy of the source and expects the contract that forbids it
to break.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).parent / "lint-imports"


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    return subprocess.run(
        [str(LINT), "--config", str(tree / ".importlinter"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


def plant(tree: Path, module: str, line: str) -> None:
    path = tree / "src" / (module.replace(".", "/") + ".py")
    text = path.read_text()
    head, sep, rest = text.partition("from __future__ import annotations\n")
    assert sep, module
    path.write_text(f"{head}{sep}\n{line}\n{rest}")


def test_the_tree_keeps_every_contract(tree: Path) -> None:
    result = lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        (
            "sessionhook.relay.domain.events",
            "from sessionhook.relay.store import errors as _planted  # noqa",
            "domain imports nothing else of the relay BROKEN",
        ),
        (
            "sessionhook.relay.store.errors",
            "from sessionhook.relay.daemon import errors as _planted  # noqa",
            "The relay's layers: arrows point down BROKEN",
        ),
        (
            "sessionhook.relay.polling.discovery",
            "from sessionhook.relay.delivery import sender as _planted  # noqa",
            "polling and delivery never import each other BROKEN",
        ),
        (
            "sessionhook.cli.ops",
            "from sessionhook.relay.store import errors as _planted  # noqa",
            "cli goes through ops: never the store, the poller, the dispatcher or the web BROKEN",
        ),
        (
            "sessionhook.relay.web.auth",
            "from sessionhook.relay.web import stream as _planted  # noqa",
            "inside web: route groups > context > auth, server > leaves BROKEN",
        ),
        (
            "sessionhook.relay.web.console.common",
            "from sessionhook.relay.web.console import pages as _planted  # noqa",
            "console: routes > pages|actions|live > common > text|chart BROKEN",
        ),
        (
            "sessionhook.relay.web.console.pages",
            "from sessionhook.relay.web.console import actions as _planted  # noqa",
            "console: routes > pages|actions|live > common > text|chart BROKEN",
        ),
        (
            "sessionhook.relay.daemon.readiness",
            "from sessionhook.relay.daemon import wiring as _planted  # noqa",
            "only daemon.py composes: the daemon's collaborators never import each other BROKEN",
        ),
        (
            "sessionhook.relay.polling.state",
            "from sessionhook.relay.polling import scheduling as _planted  # noqa",
            "polling: the Poller composes, each collaborator imports only those below it BROKEN",
        ),
        (
            "sessionhook.relay.domain.addresses",
            "import socket as _planted  # noqa",
            "domain does no I/O: no socket, DNS, HTTP or event loop BROKEN",
        ),
        (
            "sessionhook.emulator.agent",
            "from sessionhook.emulator import world as _planted  # noqa",
            "The emulator's layers: app over world over agent BROKEN",
        ),
    ],
)
def test_a_planted_upward_import_breaks_its_contract(
    tree: Path, module: str, line: str, contract: str
) -> None:
    plant(tree, module, line)
    result = lint(tree)
    assert result.returncode != 0
    assert contract in result.stdout, result.stdout
