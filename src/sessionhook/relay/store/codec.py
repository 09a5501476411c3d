"""How the archive's JSON is kept on disk: lossless, compact, byte for byte (pure, no SQL).

Most of an event body repeats what the store already holds: ``data.activity`` IS the
activity's raw JSON (same serializer, same separators), and ``data.session`` is the same
summary in every event of a session. So a body is compressed with zlib against a
*dictionary* made of that context, and only the difference is stored:

* an activity's raw JSON: ``zlib(raw, zdict = ARCHIVE_DICT + name + createTime)`` (the row's
  own columns, which the JSON repeats);
* an event body: ``zlib(body, zdict = BODY_DICT + reference + activity raw)``, where the
  *reference* is an earlier body of the same session kept once in ``body_refs`` (it holds
  the session summary) and the activity raw is the archived one (activity events only).

Decompressing with the same dictionary gives back the exact bytes (zlib is lossless; the
dictionary only shortens back-references), so every attempt still sends the bytes stored at
ingest. Rows written before migration ``0004`` hold plain text and are read as they are.

Formats (the first byte of a BLOB names it; TEXT is the legacy plain form)::

    0x01  zlib, dictionary ARCHIVE_DICT + hints             activities.raw
    0x02  zlib, dictionary BODY_DICT + reference            events.body (no activity)
    0x03  zlib, dictionary BODY_DICT + reference + raw      events.body of an activity

The dictionaries below are part of the file format: never edit them; add a new format byte
with a new dictionary instead.
"""

from __future__ import annotations

import zlib

__all__ = [
    "ARCHIVE",
    "BODY",
    "BODY_WITH_ACTIVITY",
    "REF_THRESHOLD",
    "decode_body",
    "decode_raw",
    "encode_body",
    "encode_raw",
    "needs_context",
]

ARCHIVE = 0x01
BODY = 0x02
BODY_WITH_ACTIVITY = 0x03
#: A body that compresses to more than this many bytes against its session's reference
#: becomes the session's new reference (the summary changed too much to share).
REF_THRESHOLD = 160
_LEVEL = 1  # level 6 saves 1 % of the bytes at twice the CPU on these short texts

# Fragments that recur in activities and bodies (keys, enum values, framing). Later bytes are
# cheaper to refer to, so the commonest come last.
_COMMON = (
    b'"suggestedCommitMessage":"'
    b'"bashOutput":{"command":"'
    b'"output":"'
    b'"exitCode":'
    b'"media":{"mimeType":"image/png","data":"'
    b'"changeSet":{"source":"sources/github/'
    b'"gitPatch":{"unidiffPatch":"--- a/'
    b'"baseCommitId":"'
    b'"artifacts":[{'
    b'"planGenerated":{"plan":{"id":"'
    b'"steps":[{"id":"'
    b'"index":'
    b'"planApproved":{"planId":"'
    b'"userMessaged":{"userMessage":"'
    b'"agentMessaged":{"agentMessage":"'
    b'"sessionCompleted":{}'
    b'"sessionFailed":{"reason":"'
    b'"progressUpdated":{"title":"'
    b'"description":"'
    b'"originator":"agent"'
    b'"originator":"user"'
    b'"originator":"system"'
)
ARCHIVE_DICT = _COMMON + b'{"name":"sessions/","id":"","createTime":"'
BODY_DICT = (
    _COMMON
    + b'"pull_request":{"url":"https://github.com/'
    + b'"previous_state":"'
    + b'"outputs":[{"pullRequest":{"url":"'
    + b'"sourceContext":{"source":"sources/github/'
    + b'"state":"IN_PROGRESS"'
    + b'"state":"COMPLETED"'
    + b'"prompt":"'
    + b'{"type":"session.state_changed","timestamp":"'
    + b'{"type":"session.discovered","timestamp":"'
    + b'{"type":"activity.progress_updated","timestamp":"'
    + b'","data":{"session":{"name":"sessions/","id":"","title":"","state":"","url":"https://'
    + b'","source":"","createTime":"","updateTime":"'
    + b'"},"activity":'
)


def _compress(data: bytes, zdict: bytes) -> bytes:
    # The window is 32 KB: a longer dictionary keeps its tail, the most useful part.
    # memLevel 8, not 9: setting up the bigger hash table costs more than it saves here.
    packer = zlib.compressobj(_LEVEL, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, zdict[-32768:])
    return packer.compress(data) + packer.flush()


def _decompress(data: bytes, zdict: bytes) -> bytes:
    unpacker = zlib.decompressobj(15, zdict[-32768:])
    return unpacker.decompress(data) + unpacker.flush()


def encode_raw(raw: bytes, hints: bytes) -> bytes:
    """An activity's raw JSON for ``activities.raw``; ``hints`` (its name and createTime)
    must be given again to :func:`decode_raw`."""
    return bytes((ARCHIVE,)) + _compress(raw, ARCHIVE_DICT + hints)


def decode_raw(stored: str | bytes, hints: bytes) -> bytes:
    """The exact raw JSON bytes of a stored ``activities.raw`` (TEXT or a format 1 BLOB)."""
    if isinstance(stored, str):
        return stored.encode("utf-8")
    if stored[:1] != bytes((ARCHIVE,)):
        raise ValueError(f"unknown archive format {stored[:1]!r}")
    return _decompress(stored[1:], ARCHIVE_DICT + hints)


def encode_body(body: bytes, reference: bytes, context: bytes) -> bytes:
    """An event body for ``events.body``, against the session's ``reference`` body and the
    ``context`` (the activity's raw JSON, or ``b""``); both are needed to decode it."""
    if context:
        return bytes((BODY_WITH_ACTIVITY,)) + _compress(body, BODY_DICT + reference + context)
    return bytes((BODY,)) + _compress(body, BODY_DICT + reference)


def needs_context(stored: str | bytes) -> bool:
    """Whether decoding this stored body needs its activity's raw JSON."""
    return isinstance(stored, bytes) and stored[:1] == bytes((BODY_WITH_ACTIVITY,))


def decode_body(stored: str | bytes, reference: bytes, context: bytes) -> bytes:
    """The exact bytes of a stored ``events.body`` (TEXT or a format 2 or 3 BLOB);
    ``context`` is only used by format 3."""
    if isinstance(stored, str):
        return stored.encode("utf-8")
    if stored[:1] == bytes((BODY_WITH_ACTIVITY,)):
        return _decompress(stored[1:], BODY_DICT + reference + context)
    if stored[:1] == bytes((BODY,)):
        return _decompress(stored[1:], BODY_DICT + reference)
    raise ValueError(f"unknown body format {stored[:1]!r}")
