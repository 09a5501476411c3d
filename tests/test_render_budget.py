"""Issue 20 item 4, pure part: every render has a step budget, and the operators that make
a huge value in one go are bounded (``template_sandbox``).

A template passes the start-up check on the sample events and still loops for hours on a
real event whose title has a word in it: the budget stops it with a ``RenderError`` that
says ``budget`` (the dispatcher's ``render failed: ...``), the same way every time.
"""

from __future__ import annotations

import json

import pytest

from sessionhook.relay.domain import render
from sessionhook.relay.domain.samples import sample_events

#: The issue's template: harmless on the samples, ten billion iterations on "deploy" titles.
NESTED = (
    '{% if "deploy" in session.title %}'
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    '{% endif %}{"t": {{ type | tojson }}}'
)
RUNAWAYS = {
    "nested ranges": NESTED,
    "macro tree": (
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
        '{% if "deploy" in session.title %}{{ f(60) }}{% endif %}{"t": 1}'
    ),
    "recursive loop": (
        '{% if "deploy" in session.title %}{% for x in [1, 2] recursive %}'
        "{{ loop([1, 2]) if loop.depth < 60 else '' }}{% endfor %}{% endif %}{\"t\": 1}"
    ),
    "loops over upstream words": (
        '{% set words = session.title.split(" ") %}{% for a in words %}{% for b in words %}'
        '{% for c in words %}{% if c %}{% endif %}{% endfor %}{% endfor %}{% endfor %}{"t": 1}'
    ),
    "caller loop": (
        "{% macro twice() %}{{ caller() }}{{ caller() }}{% endmacro %}"
        "{% macro deep(n) %}{% if n %}{% call twice() %}{{ deep(n - 1) }}{% endcall %}"
        '{% endif %}{% endmacro %}{% if "deploy" in session.title %}{{ deep(22) }}{% endif %}'
        '{"t": 1}'
    ),
}


def deploy_event(title: str = "deploy the service") -> tuple[str, bytes]:
    event = next(e for e in sample_events() if e.type == "session.failed")
    payload = json.loads(event.body)
    payload["data"]["session"]["title"] = title
    return event.id, json.dumps(payload).encode()


def samples() -> list[tuple[str, bytes]]:
    return [(e.id, e.body) for e in sample_events()]


@pytest.mark.parametrize("name", list(RUNAWAYS))
def test_a_template_that_runs_away_on_a_real_event_stops_at_its_step_budget(name: str) -> None:
    shape = render.Shape(template=RUNAWAYS[name])
    render.check_shape(shape, samples())  # the start-up check passes
    title = "deploy " + "w " * 3000 if name == "loops over upstream words" else "deploy it"
    event_id, body = deploy_event(title)
    with pytest.raises(render.RenderError) as first:
        render.render(event_id, body, shape)
    assert "over its budget of 1000000 steps on session.failed" in str(first.value)
    with pytest.raises(render.RenderError) as second:
        render.render(event_id, body, shape)
    assert str(second.value) == str(first.value)  # deterministic: it stops at the same place


def test_the_budget_is_per_render_and_a_smaller_one_can_be_given() -> None:
    loop = "{% for s in range(400) %}{{ session.title }}{% endfor %}"
    shape = render.Shape(template=loop, content_type="text/plain")
    event_id, body = deploy_event()
    for _ in range(3):  # 1200+ steps each, far below the budget: nothing carries over
        assert render.render(event_id, body, shape)[0].startswith(b"deploy the service")
    with pytest.raises(render.RenderError, match="budget of 1000 steps"):
        render.render(event_id, body, shape, steps=1000)


def test_a_template_slow_on_the_samples_is_refused_at_start_up() -> None:
    slow = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    with pytest.raises(render.RenderError, match="budget"):
        render.check_shape(render.Shape(template=slow, content_type="text/plain"), samples())


@pytest.mark.parametrize(
    "expression",
    [
        '"x" * 10**7',
        "session.title * 1000000",
        "[session.title] * 100000",
        "100000 * [session.title]",
        "2 ** 1000000",
        "(10 ** 400) ** 400",
    ],
)
def test_an_operator_that_would_make_a_huge_value_is_refused_before_it_runs(
    expression: str,
) -> None:
    shape = render.Shape(template="{{ (" + expression + ") | length }}", content_type="text/plain")
    event_id, body = deploy_event()
    with pytest.raises(render.RenderError, match="size budget"):
        render.render(event_id, body, shape)


def test_ordinary_arithmetic_and_repetition_still_work() -> None:
    template = '{{ "-" * 3 }} {{ [1] * 2 }} {{ 2 ** 10 }} {{ 3 * 4 }} {{ 2.5 * 2 }}'
    shape = render.Shape(template=template, content_type="text/plain")
    event_id, body = deploy_event()
    assert render.render(event_id, body, shape)[0] == b"--- [1, 1] 1024 12 5.0"
