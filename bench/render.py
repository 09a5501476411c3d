"""What an endpoint's shape costs per delivery: ``render()`` time and body size per format.

Renders one sample event of every type (``relay/samples.py``) through each shape, many
times, and prints the median time per event over several runs, interleaved so machine
noise hits every shape alike, with the median body size. ``standard`` is the baseline: the
stored bytes go out untouched. A shape is rendered once per delivery (its first attempt);
retries resend the kept bytes.

    .venv/bin/python bench/render.py [--rounds 200] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from sessionhook.relay import render
from sessionhook.relay.samples import sample_events

SHAPES = {
    "standard": render.Shape(),
    "thin": render.Shape(payload="thin"),
    **{name: render.Shape(format=name) for name in render.PRESET_FORMATS},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    events = sample_events()
    timings: dict[str, list[float]] = {name: [] for name in SHAPES}
    for _ in range(args.runs):
        for name, shape in SHAPES.items():
            started = time.perf_counter()
            for _ in range(args.rounds):
                for event in events:
                    render.render(event.id, event.body, shape)
            elapsed = time.perf_counter() - started
            timings[name].append(elapsed / (args.rounds * len(events)) * 1e6)
    print(f"{len(events)} sample events x {args.rounds} rounds, {args.runs} runs (median)")
    print(f"{'shape':<12} {'us/event':>9} {'bytes':>6}")
    for name, shape in SHAPES.items():
        per_event = statistics.median(timings[name])
        size = statistics.median(len(render.render(e.id, e.body, shape)[0]) for e in events)
        print(f"{name:<12} {per_event:>9.1f} {size:>6.0f}")


if __name__ == "__main__":
    main()
