"""Issue 26 item 2: a user template is checked against every sample event in a child
process (``delivery.template_check``), with a delivery's bounds, and nothing of it runs in
the caller's process: what it costs in time and memory is the child's."""

from __future__ import annotations

import os
import sys
import threading
import time
import tracemalloc

import pytest

from sessionhook.relay.delivery.template_check import MAX_CHECKS, check_template
from sessionhook.relay.domain import render
from tests.support.processes import alive, children_of

pytestmark = pytest.mark.process

#: 25 doublings of a string (the issue's template).
DOUBLING = (
    '{% set ns = namespace(s="12345678") %}{% for i in range(25) %}'
    '{% set ns.s = ns.s ~ ns.s %}{% endfor %}{"n": {{ ns.s | length }}}'
)
#: A render child whose size budget is lifted: only its memory cap stops the template.
UNMETERED_CHILD = [
    sys.executable,
    "-c",
    "import sys; from sessionhook.relay.domain import render; render.SIZE_BUDGET = 10**15; "
    "from sessionhook.relay.delivery.render_child import main; sys.exit(main())",
]


def children() -> set[int]:
    return {pid for pid in children_of(os.getpid()) if alive(pid)}


def test_a_template_that_renders_passes_and_leaves_no_child() -> None:
    before = children()
    check_template(render.Shape(template='{"t": {{ type | tojson }}}'), 5.0)
    check_template(render.Shape(template="{{ session.title }}", content_type="text/plain"), 5.0)
    assert children() <= before


@pytest.mark.parametrize(
    ("template", "said"),
    [
        (DOUBLING, "template over its size budget of"),
        ("{{ nope(", "template does not compile"),
        ("not json", "template gave no valid JSON for session.discovered"),
        (
            "{% for i in range(100000) %}{% for j in range(100) %}{% endfor %}{% endfor %}",
            "template over its budget of 1000000 steps on session.discovered",
        ),
    ],
)
def test_a_template_that_fails_on_a_sample_is_refused_by_name(template: str, said: str) -> None:
    before = children()
    with pytest.raises(render.RenderError, match="^" + said):
        check_template(render.Shape(template=template), 10.0)
    assert children() <= before


def test_a_sample_over_the_time_budget_kills_the_child_and_names_the_budget() -> None:
    slow = (
        '{% set long = "zyxwvutsrq " * 30000 %}'
        "{% for i in range(100000) %}{{ long | wordcount }}{% endfor %}"
    )
    before = children()
    with pytest.raises(render.RenderError, match=r"^template over its time budget of 0.5 s on "):
        check_template(render.Shape(template=slow, content_type="text/plain"), 0.5)
    assert children() <= before


def test_what_the_child_does_to_memory_stays_in_the_child() -> None:
    """Its size budget lifted, the child doubles a string 40 times until its memory cap
    stops it; this process allocated next to nothing meanwhile."""
    forty = DOUBLING.replace("range(25)", "range(40)")
    tracemalloc.start()
    try:
        with pytest.raises(render.RenderError, match="memory budget"):
            check_template(render.Shape(template=forty), 60.0, command=UNMETERED_CHILD)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20


def test_a_child_that_does_not_start_or_dies_is_one_line() -> None:
    with pytest.raises(render.RenderError, match=r"did not start \(exit status 3\)"):
        check_template(render.Shape(template="{}"), 5.0, command=[sys.executable, "-c", "exit(3)"])
    ready_then_gone = (
        "import sys; from sessionhook.relay.delivery.render_child import READY, frame; "
        "sys.stdout.buffer.write(frame(READY)); sys.stdout.flush(); sys.exit(4)"
    )
    with pytest.raises(render.RenderError, match=r"died while rendering \S+ \(exit status 4\)"):
        check_template(
            render.Shape(template="{}"), 5.0, command=[sys.executable, "-c", ready_then_gone]
        )
    with pytest.raises(render.RenderError, match="did not start"):
        check_template(render.Shape(template="{}"), 5.0, command=["/nonexistent/python"])


def test_a_burst_of_checks_starts_at_most_two_children_at_once() -> None:
    slow = render.Shape(
        template='{% set long = "zyxwvutsrq " * 30000 %}'
        "{% for i in range(100000) %}{{ long | wordcount }}{% endfor %}",
        content_type="text/plain",
    )
    before = children()
    outcomes: list[str] = []

    def one() -> None:
        try:
            check_template(slow, 0.5)
        except render.RenderError as exc:
            outcomes.append(str(exc))

    burst = [threading.Thread(target=one) for _ in range(5)]
    for thread in burst:
        thread.start()
    most = 0
    while any(thread.is_alive() for thread in burst):
        most = max(most, len(children() - before))
        time.sleep(0.02)
    for thread in burst:
        thread.join()
    assert most <= MAX_CHECKS
    assert len(outcomes) == 5 and all("time budget of 0.5 s" in o for o in outcomes)
    assert children() <= before
