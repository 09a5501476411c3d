"""Issue 20 item 4 and issue 26 item 2, pure part: every render has a step budget and a
size budget (``template_sandbox``, ``template_meter``, ``template_sizes``).

A template passes the start-up check on the sample events and still loops for hours on a
real event whose title has a word in it: the step budget stops it with a ``RenderError``
that says ``budget`` (the dispatcher's ``render failed: ...``), the same way every time.
A template that doubles a string 25 times fills 400 MB in a few hundred steps: the size
budget stops it, and every other way of making a big value in one step, before the value
is made (the peak of what the render allocates stays small: measured with tracemalloc).
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator

import pytest

from sessionhook.relay.domain import render
from sessionhook.relay.domain.samples import sample_events

pytestmark = pytest.mark.unit

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


# --------------------------------------------------------------------------- size budget

#: The issue's template (26, item 2): 25 doublings of 8 characters, 268 MB of text.
DOUBLING = (
    '{% set ns = namespace(s="12345678") %}{% for i in range(25) %}'
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
    '{"n": {{ ns.s | length }}}'
)
#: What a render may allocate at its peak, in these tests (the budget is a million
#: characters plus four per byte of a small event).
PEAK = 32 * 2**20
DAG = (
    "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = [ns.l, ns.l] %}"
    "{% endfor %}"
)
BIG = '{% set s = "x" * 100000 %}'


@pytest.fixture
def peak() -> Iterator[list[int]]:
    """The peak of what the test allocated (bytes), once it is done."""
    found: list[int] = []
    tracemalloc.start()
    try:
        yield found
    finally:
        found.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert found[0] < PEAK, f"{found[0] / 2**20:.0f} MiB allocated at the peak"


def test_the_issues_template_stops_at_the_size_budget_at_the_start_up_check(
    peak: list[int],
) -> None:
    with pytest.raises(render.RenderError) as failed:
        render.check_shape(render.Shape(template=DOUBLING), samples())
    assert "template over its size budget of" in str(failed.value)
    assert str(failed.value).endswith(" characters on session.discovered")


GROWING = {
    "~": '{% set ns = namespace(s="ab") %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}',
    "+": '{% set ns = namespace(s="ab") %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}',
    "+ lists": '{% set ns = namespace(s=["ab"]) %}{% for i in range(60) %}'
    "{% set ns.s = ns.s + ns.s %}",
    "* 2": '{% set ns = namespace(s="ab") %}{% for i in range(60) %}{% set ns.s = ns.s * 2 %}',
    "tojson": '{% set ns = namespace(s="\\\\") %}{% for i in range(60) %}'
    "{% set ns.s = ns.s | tojson %}",
    "format": '{% set ns = namespace(s="ab") %}{% for i in range(60) %}'
    '{% set ns.s = "%s%s" % (ns.s, ns.s) %}',
    "str.format": '{% set ns = namespace(s="ab") %}{% for i in range(60) %}'
    '{% set ns.s = "{0}{0}".format(ns.s) %}',
    "replace": '{% set ns = namespace(s="ab") %}{% for i in range(60) %}'
    '{% set ns.s = ns.s.replace("a", ns.s) %}',
    "copies kept": "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
    "{% set ns.l = ns.l + [[session.title ~ i]] %}",
}


@pytest.mark.parametrize("name", list(GROWING))
def test_a_value_grown_step_by_step_stops_at_the_size_budget(name: str, peak: list[int]) -> None:
    shape = render.Shape(template=GROWING[name] + "{% endfor %}x", content_type="text/plain")
    with pytest.raises(render.RenderError, match="size budget of"):
        render.render(*deploy_event(), shape)


ONE_STEP = {
    "center": '{{ "x" | center(1000000000) }}',
    "ljust": '{{ "x".ljust(1000000000) }}',
    "zfill": '{{ "1".zfill(1000000000) }}',
    "% width": '{{ "%1000000000d" % 1 }}',
    "% star": '{{ "%*d" % (1000000000, 1) }}',
    "% fields": BIG + '{{ ("%(a)s" * 100) % {"a": s} }}',
    "format filter": '{{ "%1000000000d" | format(1) }}',
    "str.format width": '{{ "{:>1000000000}".format(1) }}',
    "str.format nested": '{{ "{:>{w}}".format(1, w=1000000000) }}',
    "str.format fields": BIG + '{{ ("{0}" * 100).format(s) }}',
    "replace filter": BIG + '{{ s | replace("", s) }}',
    "replace method": BIG + '{{ s.replace("x", s) }}',
    "translate": BIG + "{{ s.translate({120: s}) }}",
    "expandtabs": '{{ ("\t" * 1000).expandtabs(1000000) }}',
    "indent": '{{ "a\nb" | indent(1000000000) }}',
    "wordwrap": BIG + "{{ s | wordwrap(1, wrapstring=s) }}",
    "urlize": '{{ ("a.com " * 10000) | urlize(target="x" * 100000) }}',
    "join filter": BIG + "{{ range(10000) | join(s) }}",
    "join method": BIG + '{{ s.join(range(10000) | map("string")) }}',
    "batch": "{{ [1] | batch(1000000000, 0) | list }}",
    "slice": "{{ [1] | slice(1000000000) | list | length }}",
    "lipsum": "{{ lipsum(100000) }}",
    "output": BIG + "{% for i in range(100000) %}{{ s }}{% endfor %}",
    "set block": BIG + "{% set t %}{% for i in range(100000) %}{{ s }}{% endfor %}{% endset %}",
    "macro": BIG + "{% macro m() %}{% for i in range(100000) %}{{ s }}{% endfor %}{% endmacro %}"
    "{{ m() | length }}",
    "int *": "{% set n = 2 ** 90000 %}{{ (n * n) | string | length }}",
    "shared list, output": DAG + "{{ ns.l }}",
    "shared list, ~": DAG + '{{ "a" ~ ns.l }}',
    "shared list, tojson": DAG + "{{ ns.l | tojson }}",
    "shared list, string": DAG + "{{ ns.l | string | length }}",
    "shared list, safe": DAG + "{{ ns.l | safe | length }}",
    "shared list, xmlattr": DAG + '{{ {"a": ns.l} | xmlattr }}',
    "shared list, join": DAG + "{{ [ns.l] | join }}",
    "shared list, %": DAG + '{{ "%s" % [ns.l] }}',
    "shared namespace": DAG + "{{ ns }}",
}


@pytest.mark.parametrize("name", list(ONE_STEP))
def test_one_step_that_would_make_a_huge_value_is_refused_before_it_makes_it(
    name: str, peak: list[int]
) -> None:
    shape = render.Shape(template=ONE_STEP[name], content_type="text/plain")
    with pytest.raises(render.RenderError, match="size budget"):
        render.render(*deploy_event(), shape)


def test_what_fits_the_budget_renders_as_before() -> None:
    template = (
        '{{ "a" ~ 1 ~ none }}|{{ [1] + [2] }}|{{ "%3d" % 7 }}|{{ "%(a)s" % {"a": "b"} }}|'
        '{{ "{:>3}".format(1) }}|{{ "x" | center(5) }}|{{ [1, 2] | join(",") }}|'
        '{{ "a\nb" | indent(2) }}|{{ "ab".replace("a", "c") }}|{{ "1".zfill(3) }}|'
        '{{ "-".join(["a", "b"]) }}|{{ [1, 2, 3] | batch(2, 0) | list }}|'
        '{{ lipsum(1, html=false) | wordcount > 0 }}|{{ "%s" | format("f") }}|'
        "{% autoescape true %}{{ '<' ~ 'b' }}{% endautoescape %}"
    )
    shape = render.Shape(template=template, content_type="text/plain")
    assert render.render(*deploy_event(), shape)[0].decode() == (
        "a1None|[1, 2]|  7|b|  1|  x  |1,2|a\n  b|cb|001|a-b|[[1, 2], [3, 0]]|True|f|&lt;b"
    )


def test_the_size_budget_grows_with_the_event_so_a_big_event_renders_whole() -> None:
    event_id, body = deploy_event("deploy " + "w" * 2_000_000)  # over the base budget
    shape = render.Shape(template='{"event": {{ event | tojson }}, "again": {{ type | tojson }}}')
    rendered = json.loads(render.render(event_id, body, shape)[0])
    assert rendered["event"] == json.loads(body)
    # Ten times the event's text is not.
    many = "{{ " + " ~ ".join(["(event | tojson)"] * 10) + " }}"
    with pytest.raises(render.RenderError, match="size budget"):
        render.render(event_id, body, render.Shape(template=many, content_type="t/p"))


def test_the_size_budget_stops_at_the_same_place_every_time() -> None:
    shape = render.Shape(template=GROWING["~"] + "{% endfor %}", content_type="text/plain")
    errors = set()
    for _ in range(3):
        with pytest.raises(render.RenderError) as failed:
            render.render(*deploy_event(), shape)
        errors.add(str(failed.value))
    assert len(errors) == 1
