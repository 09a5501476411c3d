"""The decoded reference bodies a store keeps in memory (:mod:`sessionhook.relay.store.bodies`):
bounded by bytes, and not read at all where the compression could not use them."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from sessionhook.relay.store import Store, codec
from sessionhook.relay.store.bodies import REF_CACHE_BYTES, Bodies

pytestmark = pytest.mark.app

BIG = 100_000


def test_a_reference_beyond_the_window_is_not_needed_to_decode() -> None:
    reference = b'{"session":"' + os.urandom(2_000).hex().encode() + b'"}'
    for context_size, used in ((1_000, True), (codec.WINDOW, False), (BIG, False)):
        context = os.urandom(context_size // 2).hex().encode().ljust(context_size, b"x")
        body = b'{"data":{"activity":' + context + b',"session":' + reference + b"}}"
        stored = codec.encode_body(body, reference, context)
        assert codec.reference_used(stored, context) is used
        assert codec.decode_body(stored, reference, context) == body
        if used:
            with pytest.raises((ValueError, zlib.error)):
                codec.decode_body(stored, b"", context)
        else:
            assert codec.decode_body(stored, b"", context) == body
    # A body without an activity always needs its reference.
    assert codec.reference_used(codec.encode_body(reference, reference, b""), b"")


def test_a_whole_stream_is_decoded_in_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored JSON comes out of one ``decompress`` call: ``flush`` (one more release and
    take of the GIL, twice per delivery on the store's thread) only for a stream that did
    not end, which is then refused."""
    flushed: list[bytes] = []
    real = zlib.decompressobj

    class Spied:
        def __init__(self, *args: object) -> None:
            self._inner = real(*args)  # type: ignore[arg-type]

        def decompress(self, data: bytes) -> bytes:
            return self._inner.decompress(data)

        def flush(self) -> bytes:
            flushed.append(self._inner.flush())
            return flushed[-1]

        @property
        def eof(self) -> bool:
            return self._inner.eof

    monkeypatch.setattr(codec.zlib, "decompressobj", Spied)
    reference = b'{"session":{"name":"sessions/1","state":"IN_PROGRESS"}}'
    raw = b'{"name":"sessions/1/activities/a","progressUpdated":{"title":"step"}}'
    body = b'{"data":{"activity":' + raw + b',"session":' + reference + b"}}"
    stored_raw = codec.encode_raw(raw, b"hints")
    stored = codec.encode_body(body, reference, raw)
    assert codec.decode_raw(stored_raw, b"hints") == raw
    assert codec.decode_body(stored, reference, raw) == body
    assert flushed == []
    with pytest.raises(ValueError, match="does not decode"):
        codec.decode_body(stored[:-9] + stored[-4:], reference, raw)  # cut short
    assert flushed == [b""]


def test_the_reference_cache_is_bounded_by_bytes(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "relay.db")
    try:
        bodies = Bodies(store.db)
        references = {n: os.urandom(BIG // 2).hex().encode() for n in range(1, 101)}
        for n, body in references.items():
            assert bodies.reference(n, codec.encode_body(body, b"", b"")) == body
            assert bodies.cached_bytes <= REF_CACHE_BYTES
        assert bodies.cached_bytes > REF_CACHE_BYTES - 2 * BIG  # the newest are kept
        # The newest one is answered from memory (no row 100 in this store's body_refs).
        assert bodies.reference(100) == references[100]
        huge = b"x" * (REF_CACHE_BYTES + 1)
        kept = bodies.cached_bytes
        assert bodies.reference(101, codec.encode_body(huge, b"", b"")) == huge
        assert bodies.cached_bytes == kept  # larger than the whole bound: not kept
        bodies.forget()
        assert bodies.cached_bytes == 0
    finally:
        store.close()
