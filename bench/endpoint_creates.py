"""What one more endpoint created at run time costs when the store holds 10, 1,000 or 10,000
of them, on SQLite, in one run.

For each size, a store is filled with that many endpoints created at run time and a
dispatcher loads them; then endpoints are created one at a time, and each create is timed
in its two parts:

* ``create``: what ``POST /v1/endpoints`` does (``define_endpoint``, ``create_endpoint``
  with the ``delivery.max_endpoints`` count, the answer of the one endpoint);
* ``reload``: what the dispatcher does when its next round sees the newer revision (the
  catalog reads the changed definitions, builds them, the settings take them).

``round`` is, for reference, one whole round of an idle dispatcher at that size (its
per-round reads of the active endpoints and their queue heads grow with their number,
whether or not anything is created). Times are CPU time of the process (all its threads:
the store's too), in ms; each figure is the median of ``--creates`` creates, and of the
``--runs`` runs' medians; ``rows`` and ``built`` count what the reload read from the store
and built per create.

    .venv/bin/python bench/endpoint_creates.py [--sizes 10 1000 10000] [--creates 20] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sessionhook.relay.config import Config  # noqa: E402
from sessionhook.relay.delivery import catalog as catalog_module  # noqa: E402
from sessionhook.relay.delivery.catalog import EndpointCatalog  # noqa: E402
from sessionhook.relay.delivery.dispatcher import DeliverySettings, Dispatcher  # noqa: E402
from sessionhook.relay.ops import endpoint_edits as edits  # noqa: E402
from sessionhook.relay.store import AsyncStore, Store, StoreCore  # noqa: E402

CONFIG = Config.model_validate({"delivery": {"max_endpoints": 1_000_000}})
BUILT = [0]
_real_spec_endpoint = catalog_module.spec_endpoint


def _counting_spec_endpoint(*args: Any, **kwargs: Any) -> Any:
    BUILT[0] += 1
    return _real_spec_endpoint(*args, **kwargs)


def create(store: StoreCore, name: str) -> None:
    """What the management API does for one ``POST /v1/endpoints``."""
    spec = {"url": f"https://hooks.example.com/{name}", "events": ["session.*"]}
    definition, secret = edits.define_endpoint(CONFIG, name, spec)
    edits.create_endpoint(store, CONFIG, definition, secret)
    edits.endpoint_answers(store, CONFIG, time.time(), name)


async def one_size(size: int, creates: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        with Store.open(path) as store:
            for n in range(size):
                create(store, f"ep{n:05d}")
            astore = AsyncStore(Store.open(path))
            try:
                return await _measure(store, astore, creates)
            finally:
                await astore.close()


async def _measure(store: StoreCore, astore: AsyncStore, creates: int) -> dict[str, float]:
    catalog = EndpointCatalog(astore)
    base = DeliverySettings.from_config(CONFIG)
    put, gone = await catalog.load(time.time())
    settings = base.changed(base, put, gone)
    dispatcher = Dispatcher(
        astore,
        httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(204))),
        base,
    )
    await dispatcher.run_until_idle()  # loaded: its rounds from now on are idle ones
    made: list[float] = []
    reloads: list[float] = []
    rounds: list[float] = []
    rows: list[int] = []
    built: list[int] = []
    for n in range(creates):
        start = time.process_time()
        create(store, f"new{n:03d}-{time.monotonic_ns()}")
        made.append(time.process_time() - start)
        BUILT[0] = 0
        active = store.outbox.active_revisions()  # what every round reads (not timed)
        start = time.process_time()
        if catalog.stale(active.revision, time.time()):
            put, gone = await catalog.load(time.time())
            settings = settings.changed(base, put, gone)
            rows.append(len(put) + len(gone))
        reloads.append(time.process_time() - start)
        built.append(BUILT[0])
        await dispatcher.run_until_idle()  # takes the new one (not timed)
        start = time.process_time()
        await dispatcher.run_until_idle()  # an idle round
        rounds.append(time.process_time() - start)
    return {
        "create": statistics.median(made) * 1000,
        "reload": statistics.median(reloads) * 1000,
        "round": statistics.median(rounds) * 1000,
        "rows": statistics.median(rows),
        "built": statistics.median(built),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 1000, 10000])
    parser.add_argument("--creates", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    catalog_module.spec_endpoint = _counting_spec_endpoint  # type: ignore[assignment]
    runs: dict[int, list[dict[str, float]]] = {size: [] for size in args.sizes}
    for _ in range(args.runs):
        for size in args.sizes:  # interleaved: machine noise hits every size alike
            runs[size].append(anyio.run(one_size, size, args.creates))
    first = args.sizes[0]

    def median(size: int, key: str) -> float:
        return statistics.median(r[key] for r in runs[size])

    print(f"{args.creates} creates x {args.runs} runs (medians); ratio: against {first} endpoints")
    print(
        f"{'endpoints':>9}  {'create ms':>9}  {'reload ms':>9}  {'per create':>10}  "
        f"{'ratio':>5}  {'rows':>4}  {'built':>5}  {'idle round ms':>13}"
    )
    for size in args.sizes:
        total = median(size, "create") + median(size, "reload")
        ratio = total / (median(first, "create") + median(first, "reload"))
        print(
            f"{size:>9}  {median(size, 'create'):>9.2f}  {median(size, 'reload'):>9.2f}  "
            f"{total:>10.2f}  {ratio:>5.2f}  {median(size, 'rows'):>4.0f}  "
            f"{median(size, 'built'):>5.0f}  {median(size, 'round'):>13.2f}"
        )


if __name__ == "__main__":
    main()
