"""What an endpoint's shape costs per delivery: render time and body size per format.

Renders one sample event of every type (``relay/samples.py``) through each shape, many
times, and prints the median time per event over several runs, interleaved so machine
noise hits every shape alike, with the median body size. ``standard`` is the baseline: the
stored bytes go out untouched. A shape is rendered once per delivery (its first attempt);
retries resend the kept bytes.

``template`` is a user template rendered inline; ``template, child`` is the same template
the way the daemon renders it (``RenderProcess``: in a child process, off the event loop,
each render awaited in turn): the difference is what the hop to the child costs.

    .venv/bin/python bench/render.py [--rounds 200] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio

from sessionhook.relay.delivery.render_process import RenderProcess
from sessionhook.relay.domain import render
from sessionhook.relay.domain.events import Event
from sessionhook.relay.domain.samples import sample_events

#: The template of config.example.toml.
TEMPLATE = '{"text": {{ (type ~ ": " ~ session.title) | tojson }}}'
SHAPES = {
    "standard": render.Shape(),
    "thin": render.Shape(payload="thin"),
    **{name: render.Shape(format=name) for name in render.PRESET_FORMATS},
    "template": render.Shape(template=TEMPLATE),
}
CHILD = "template, child"


def in_child(events: list[Event], rounds: int) -> float:
    """Seconds to render ``rounds`` times every event through a RenderProcess (the child
    is started, and the template compiled there, before the clock starts)."""

    async def run() -> float:
        renderer = RenderProcess()
        shape = SHAPES["template"]
        try:
            await renderer.render(events[0].id, events[0].body, shape, time_budget=60)
            started = time.perf_counter()
            for _ in range(rounds):
                for event in events:
                    await renderer.render(event.id, event.body, shape, time_budget=60)
            return time.perf_counter() - started
        finally:
            await renderer.aclose()

    return anyio.run(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    events = sample_events()
    timings: dict[str, list[float]] = {name: [] for name in (*SHAPES, CHILD)}
    per_event = args.rounds * len(events) / 1e6
    for _ in range(args.runs):
        for name, shape in SHAPES.items():
            started = time.perf_counter()
            for _ in range(args.rounds):
                for event in events:
                    render.render(event.id, event.body, shape)
            timings[name].append((time.perf_counter() - started) / per_event)
        timings[CHILD].append(in_child(events, args.rounds) / per_event)
    print(f"{len(events)} sample events x {args.rounds} rounds, {args.runs} runs (median)")
    print(f"{'shape':<16} {'us/event':>9} {'bytes':>6}")
    for name in timings:
        shape = SHAPES.get(name, SHAPES["template"])
        size = statistics.median(len(render.render(e.id, e.body, shape)[0]) for e in events)
        print(f"{name:<16} {statistics.median(timings[name]):>9.1f} {size:>6.0f}")


if __name__ == "__main__":
    main()
