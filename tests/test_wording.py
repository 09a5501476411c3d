"""Counts in words (``sessionhook.wording``): ``1 delivery``, never ``1 files`` or
``recovered 1 deliveries``; and no count phrase in the code spelled without it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sessionhook.receiver import summarize
from sessionhook.wording import counted, plural

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[1] / "src" / "sessionhook"

#: Nouns that follow a count somewhere in what a person reads.
NOUNS = (
    "activities|attempts|characters|deliveries|duplicates|endpoints|errors|events|files|"
    "insertions|keys|pages|polls|replicas|requests|rows|sessions|steps"
)
#: ``{expression} <plural noun>`` in a string of the code.
COUNT = re.compile(rf"\{{([^{{}}]+)\}}\)? ({NOUNS})\b")
#: Counts that are never 1: a bound (a constant, or ``limit`` holding one), or said only
#: when above 1.
NEVER_ONE = {
    "cli/_output.py": {"exc.attempts"},  # `if exc.attempts > 1`
    "cli/listen_forward.py": {"self.attempts"},  # `if self.attempts > 1`
    "relay/domain/template_meter.py": {"self.budget", "self.size"},  # the budgets
    "relay/store/ingest.py": {"len(raws)", "len(activities)"},  # a bug's message
    "relay/ops/replaying.py": {"selected"},  # branches: 1 has its own wording
}


def test_counted_agrees_with_its_count() -> None:
    assert counted(1, "delivery") == "1 delivery"
    assert counted(0, "delivery") == "0 deliveries"
    assert counted(2, "file") == "2 files"
    assert counted(1, "insertion(+)", "insertions(+)") == "1 insertion(+)"
    assert counted(3, "insertion(+)", "insertions(+)") == "3 insertions(+)"
    assert [plural(n) for n in ("key", "activity", "match", "session", "replica")] == [
        "keys",
        "activities",
        "matches",
        "sessions",
        "replicas",
    ]


def test_listen_says_1_file_and_1_step() -> None:
    completed = {
        "type": "session.completed",
        "data": {"outputs": {"change_set": {"files_changed": 1, "lines_added": 7}}},
    }
    assert summarize(completed).startswith("1 file +7 -0")
    plan = {
        "type": "activity.plan_generated",
        "data": {"activity": {"planGenerated": {"plan": {"steps": [{"title": "x"}]}}}},
    }
    assert summarize(plan) == "plan with 1 step"


def test_no_count_phrase_in_the_code_is_spelled_without_counted() -> None:
    """``f"{n} deliveries"`` says ``1 deliveries``: counts go through ``counted``."""
    found = []
    for path in sorted(SRC.rglob("*")):
        if path.suffix not in (".py", ".html", ".j2", ".js") or path.name == "wording.py":
            continue
        where = path.relative_to(SRC).as_posix()
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            for match in COUNT.finditer(line):
                expression = match.group(1).split(":")[0].strip()
                if expression == "limit" or re.fullmatch(r"_?[A-Z][A-Z0-9_]*", expression):
                    continue  # a bound: a constant
                if expression in NEVER_ONE.get(where, set()):
                    continue
                found.append(f"{where}:{number}: {line.strip()}")
    assert found == []
