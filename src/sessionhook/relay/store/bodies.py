"""Event bodies as stored: compressed against their session's current reference body (and,
for an activity's event, against the activity's raw JSON), see :mod:`.codec`.

:class:`Bodies` encodes them for the ingest and decodes them for every reader (the outbox,
the operator's and the console's queries). It keeps the reference bodies decoded in memory:
a session's events share one, and the ingest keeps each session's current one at hand. That
cache is bounded by bytes as well as by count (:data:`REF_CACHE_BYTES`): a big event is
often its own reference, and a reader going through a backlog of them (an event stream
resumed from the start) must not keep each one. A reference is not read at all where the
compression cannot have used it (:func:`.codec.reference_used`).
"""

from __future__ import annotations

import threading
from typing import Any

from ..domain.events import Event
from . import codec
from .dialect import Connection, Database, first_value
from .errors import StoreError

#: Reference bodies kept decoded in memory (one per recently active session), at most...
REF_CACHE = 512
#: ... and at most this many bytes of them (oldest first out; a bigger one is not kept).
REF_CACHE_BYTES = 4 * 1024 * 1024


#: What :meth:`Bodies.decode_row` reads of a row: the event ``e``'s stored body and
#: reference, and its activity ``a``'s (LEFT JOINed) stored raw JSON and columns.
BODY_COLUMNS = (
    "e.body, e.body_ref, a.raw AS activity_raw, a.name AS raw_name, "
    "a.create_time AS raw_create_time"
)


def raw_hints(name: str, create_time: str) -> bytes:
    """What an activity's compressed raw JSON is coded against (its own columns)."""
    return (name + create_time).encode("utf-8")


class Bodies:
    """The codec of event bodies over one database, with its caches of reference bodies."""

    def __init__(self, db: Database) -> None:
        self._db = db
        # Decoded reference bodies by id, and each session's current reference.
        self._refs: dict[int, bytes] = {}
        self._refs_bytes = 0
        self._session_refs: dict[str, tuple[int, bytes]] = {}
        # ``_refs`` is filled by reads too, which run in several threads on PostgreSQL;
        # ``_session_refs`` only in write transactions, which are serialized.
        self._refs_lock = threading.Lock()

    @property
    def cached_bytes(self) -> int:
        """Bytes of decoded reference bodies held now (at most :data:`REF_CACHE_BYTES`)."""
        return self._refs_bytes

    def forget(self) -> None:
        """Drop the cached references: a rolled-back transaction may have created some."""
        with self._refs_lock:
            self._session_refs.clear()
            self._refs.clear()
            self._refs_bytes = 0

    def encode(self, c: Connection, event: Event, context: bytes) -> tuple[int, bytes]:
        """(reference id, stored body) of ``event`` in the write transaction ``c``: the body
        compressed against its session's current reference; a body that no longer shares
        enough with it becomes the new reference (a ``body_refs`` row). The transaction's
        owner calls :meth:`forget` if it rolls back."""
        current = self._session_refs.get(event.session_name)
        if current is None:
            row = c.execute(
                "SELECT id, data FROM body_refs WHERE session_name = ? ORDER BY id DESC LIMIT 1",
                (event.session_name,),
            ).fetchone()
            if row is not None:
                current = (row["id"], self.reference(row["id"], row["data"]))
        if current is not None:
            stored = codec.encode_body(event.body, current[1], context)
            if len(stored) <= codec.REF_THRESHOLD:
                return current[0], stored
        ref_id = int(
            c.execute(
                "INSERT INTO body_refs (session_name, data) VALUES (?, ?) RETURNING id",
                (event.session_name, codec.encode_body(event.body, b"", b"")),
            ).fetchall()[0]["id"]
        )
        self._remember(ref_id, event.body)
        self._session_refs[event.session_name] = (ref_id, event.body)
        if len(self._session_refs) > REF_CACHE:
            self._session_refs.pop(next(iter(self._session_refs)))
        return ref_id, codec.encode_body(event.body, event.body, context)

    def reference(self, ref_id: int, data: bytes | None = None) -> bytes:
        """A reference body, decoded (cached: a session's events share one)."""
        body = self._refs.get(ref_id)
        if body is None:
            if data is None:
                data = first_value(
                    self._db.conn, "SELECT data FROM body_refs WHERE id = ?", (ref_id,)
                )
                if data is None:
                    raise StoreError(f"missing body reference {ref_id}", path=self._db.path)
            body = codec.decode_body(data, b"", b"")
            self._remember(ref_id, body)
        return body

    def _remember(self, ref_id: int, body: bytes) -> None:
        """Cache a decoded reference within :data:`REF_CACHE` and :data:`REF_CACHE_BYTES`."""
        if len(body) > REF_CACHE_BYTES:
            return
        with self._refs_lock:  # readers in other threads fill it too (PostgreSQL)
            old = self._refs.pop(ref_id, None)
            if old is not None:
                self._refs_bytes -= len(old)
            self._refs[ref_id] = body
            self._refs_bytes += len(body)
            while len(self._refs) > REF_CACHE or self._refs_bytes > REF_CACHE_BYTES:
                self._refs_bytes -= len(self._refs.pop(next(iter(self._refs))))

    def decode_row(self, row: Any) -> bytes:
        """The exact bytes of the event body of a row holding :data:`BODY_COLUMNS`."""
        return self.decode(
            row["body"],
            row["body_ref"],
            row["activity_raw"],
            row["raw_name"],
            row["raw_create_time"],
        )

    def decode(
        self,
        stored: str | bytes,
        ref_id: int | None,
        raw: str | bytes | None,
        name: str | None,
        created: str | None,
    ) -> bytes:
        """The exact bytes of a stored event body, given the row's ``body_ref`` and, for an
        activity event, its activity's stored ``raw``, ``name`` and ``create_time``."""
        if isinstance(stored, str):
            return stored.encode("utf-8")
        context = b""
        if codec.needs_context(stored):
            if raw is None:
                raise StoreError("an event body's activity is missing", path=self._db.path)
            context = codec.decode_raw(raw, raw_hints(name or "", created or ""))
        reference = b""
        if ref_id is not None and codec.reference_used(stored, context):
            reference = self.reference(ref_id)
        return codec.decode_body(stored, reference, context)
