"""The messages of a relay's event stream (``GET /v1/events/stream``, Server-Sent Events),
read within a byte bound: what ``events --follow --url`` and ``listen --forward-to`` parse.

A message whose fields add up to more than :data:`MAX_MESSAGE_BYTES` is not held: its
bytes are dropped as they arrive until it ends, and it comes out as a
:class:`SkippedEvent` (its id and type). So the reader holds at most :attr:`SseParser.most`
bytes plus one chunk, however large a message. Text is UTF-8, a bad sequence read as
U+FFFD, as the SSE standard says.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

#: A message larger than this is skipped (a bound, not a real event size: an event's body
#: is at most about the 16 MiB an upstream answer may be).
MAX_MESSAGE_BYTES: Final = 32 * 1024 * 1024
#: The longest ``id`` or ``event`` value taken.
MAX_NAME_BYTES: Final = 1024
# What a line may hold beyond the data's bound: a field's name, or an id or type.
_SLACK: Final = MAX_NAME_BYTES + 16


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One SSE message of ``/v1/events/stream``: webhook-id, type and body."""

    id: str
    type: str
    body: bytes

    def payload(self) -> dict[str, Any]:
        """The body parsed; ``{"type": ...}`` when it is not a JSON object (it is shown by
        its type, and forwarded as it came)."""
        try:
            parsed = json.loads(self.body)
        except (ValueError, RecursionError):
            parsed = None
        return parsed if isinstance(parsed, dict) else {"type": self.type}


@dataclass(frozen=True, slots=True)
class SkippedEvent:
    """A message over :data:`MAX_MESSAGE_BYTES`, read past and not kept: its id and type
    (``""`` when it had none, or one over :data:`MAX_NAME_BYTES`)."""

    id: str
    type: str

    def note(self) -> str:
        """The line that says so."""
        from ..receiver import printable

        what = printable(self.id) if self.id else "a message without an id"
        kind = f" ({printable(self.type)})" if self.type else ""
        return (
            f"skipped {what}{kind}: its message is over {MAX_MESSAGE_BYTES >> 20} MiB, "
            "the most this command takes"
        )


class SseParser:
    """Feed it the stream's bytes as they come; it returns the messages completed."""

    def __init__(self, limit: int = MAX_MESSAGE_BYTES) -> None:
        #: A message whose data is longer than this is skipped.
        self.limit = limit
        #: The most this parser holds between two chunks.
        self.most = limit + _SLACK
        self._line = bytearray()
        self._line_dropped = False  # the current line passed the bound: its bytes go
        self._start_message()

    def _start_message(self) -> None:
        self._id = b""
        self._type = b""
        self._data: bytearray | None = None  # None: no data field yet
        self._size = 0
        self._over = False

    @property
    def buffered(self) -> int:
        """Bytes held now (the current line and the message's data)."""
        return len(self._line) + (len(self._data) if self._data is not None else 0)

    def feed(self, chunk: bytes) -> list[StreamEvent | SkippedEvent]:
        """The messages that ``chunk`` completes, in order."""
        done: list[StreamEvent | SkippedEvent] = []
        view = memoryview(chunk)
        start = 0
        while start < len(chunk):
            end = chunk.find(b"\n", start)
            stop = len(chunk) if end < 0 else end
            if not self._line_dropped:
                # The line and the data held so far, together within the bound.
                held = len(self._data) if self._data is not None else 0
                if held + len(self._line) + stop - start > self.most:
                    self._line_dropped = True
                    self._line = bytearray()
                    self._drop()
                else:
                    self._line += view[start:stop]
            if end < 0:
                break
            self._end_line(done)
            start = end + 1
        return done

    def _drop(self) -> None:
        """The message is over the bound: nothing more of its data is kept."""
        self._over = True
        self._data = None

    def _end_line(self, done: list[StreamEvent | SkippedEvent]) -> None:
        line, dropped = self._line, self._line_dropped
        self._line, self._line_dropped = bytearray(), False
        if dropped:
            return
        if line.endswith(b"\r"):
            del line[-1:]
        if not line:
            self._dispatch(done)
        elif not line.startswith(b":"):
            self._field(line)

    def _field(self, line: bytearray) -> None:
        colon = line.find(b":")
        name = bytes(line if colon < 0 else line[:colon])
        at = len(line) if colon < 0 else colon + 1
        if line[at : at + 1] == b" ":
            at += 1
        if name == b"data":
            # Data lines are joined with a newline (counted too).
            self._size += len(line) - at + (0 if self._data is None else 1)
            if self._size > self.limit:
                self._drop()
            elif self._over:
                pass
            elif self._data is None:
                del line[:at]  # in place: the line becomes the data, with no copy
                self._data = line
            else:
                self._data += b"\n"
                self._data += memoryview(line)[at:]
        elif name in (b"id", b"event"):
            value = bytes(line[at:])
            if len(value) > MAX_NAME_BYTES:
                self._drop()
                value = b""
            if name == b"id":
                self._id = value
            else:
                self._type = value

    def _dispatch(self, done: list[StreamEvent | SkippedEvent]) -> None:
        event_id = self._id.decode("utf-8", "replace")
        event_type = self._type.decode("utf-8", "replace")
        if self._over:
            done.append(SkippedEvent(event_id, event_type))
        elif self._data is not None:
            done.append(StreamEvent(event_id, event_type or "message", bytes(self._data)))
        self._start_message()


async def parse_sse(
    chunks: AsyncIterator[bytes], limit: int = MAX_MESSAGE_BYTES
) -> AsyncIterator[StreamEvent | SkippedEvent]:
    """The messages of a byte stream (see the module docstring)."""
    parser = SseParser(limit)
    async for chunk in chunks:
        for message in parser.feed(chunk):
            yield message
