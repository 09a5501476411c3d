"""Wake-ups between replicas on PostgreSQL: ``LISTEN``/``NOTIFY`` on :data:`OUTBOX_CHANNEL`.

A statement-level trigger on ``deliveries`` notifies when rows are inserted, and the store
when it gives claims back; PostgreSQL delivers it at commit. Every replica's daemon listens
(:func:`listen`) on a connection of its own and wakes its dispatcher. A notification is
only a hint (the dispatcher's timer backs it up): a listener that lost its connection
reconnects with a growing delay (``store.listen_failed``) and wakes the dispatcher once it
listens again. SQLite needs none of this: one process.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from ..config.database_url import display_url
from ..telemetry.logs import get_logger

#: The channel of "deliveries were enqueued or claims released: look at the outbox".
OUTBOX_CHANNEL = "sessionhook_outbox"
#: Reconnection delays after a lost listening connection: 1 s doubling up to this.
RECONNECT_CAP = 30.0

_log = get_logger()


async def listen(
    url: str,
    on_notify: Callable[[], None],
    *,
    channel: str = OUTBOX_CHANNEL,
    ready: Callable[[], None] = lambda: None,
) -> None:
    """Call ``on_notify()`` for every notification on ``channel``, forever (until
    cancelled). ``ready()`` is called each time the ``LISTEN`` is in place (tests wait on
    it). Failures of the connection are logged and retried; they never end the task."""
    import psycopg  # loaded on PostgreSQL only (a relay on SQLite never listens)

    delay = 1.0
    where = display_url(url)
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
            try:
                await conn.execute(f"LISTEN {channel}".encode())
                if delay > 1.0:
                    _log.info("store.listening_again", store=where, channel=channel)
                delay = 1.0
                ready()
                on_notify()  # whatever was enqueued while nobody listened
                async for _ in conn.notifies():
                    on_notify()
            finally:
                with anyio.CancelScope(shield=True):
                    await conn.close()
        except psycopg.Error as exc:
            _log.warning(
                "store.listen_failed",
                store=where,
                error=str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc),
                retry_in=delay,
                note="the dispatcher's timer backs the wake-ups up meanwhile",
            )
        await anyio.sleep(delay)
        delay = min(RECONNECT_CAP, delay * 2)
