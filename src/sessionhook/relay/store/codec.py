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
ingest. Rows written before migration ``0006`` hold plain text and are read as they are.

Formats (the first byte of a BLOB names it; TEXT is the legacy plain form)::

    0x01  zlib, dictionary ARCHIVE_DICT + hints             activities.raw
    0x02  zlib, dictionary BODY_DICT + reference            events.body (no activity)
    0x03  zlib, dictionary BODY_DICT + reference + raw      events.body of an activity
    0x04  as 0x01, raw deflate + CRC-32                     activities.raw (since 0008)
    0x05  as 0x02, raw deflate + CRC-32                     events.body, body_refs.data
    0x06  as 0x03, raw deflate + CRC-32                     events.body of an activity

Formats 4-6 are written since migration 0008: the same deflate stream without zlib's
framing (a 2-byte header, the dictionary's 4-byte Adler-32 and the data's 4-byte Adler-32:
10 bytes per row, about 5 % of a stored activity) but followed by the CRC-32 of the
decoded bytes (4 bytes, big-endian), checked on every decode: a wrong dictionary or a
damaged row still fails loudly instead of giving other bytes. 1-3 are still read.

The dictionaries below are part of the file format: never edit them; add a new format byte
with a new dictionary instead.
"""

from __future__ import annotations

import zlib

ARCHIVE = 0x04
BODY = 0x05
BODY_WITH_ACTIVITY = 0x06
#: The zlib-framed formats written before migration 0008 (read, never written).
_ZLIB_FORMATS = {0x01: ARCHIVE, 0x02: BODY, 0x03: BODY_WITH_ACTIVITY}
#: A body that compresses to more than this many bytes against its session's reference
#: becomes the session's new reference (the summary changed too much to share).
REF_THRESHOLD = 160
#: Bytes of a dictionary that count: deflate's window keeps the tail of a longer one.
WINDOW = 32768
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


def _compress(form: int, data: bytes, zdict: bytes) -> bytes:
    # The window is 32 KB: a longer dictionary keeps its tail, the most useful part.
    # memLevel 8, not 9: setting up the bigger hash table costs more than it saves here.
    # wbits -15: a raw deflate stream (no zlib header and trailer; the CRC-32 follows).
    packer = zlib.compressobj(
        _LEVEL, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, zdict[-WINDOW:]
    )
    check = (zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "big")
    return bytes((form,)) + packer.compress(data) + packer.flush() + check


def _decompress(stored: bytes, zdict: bytes) -> bytes:
    """Decode ``stored`` (its format byte first) against ``zdict``. A whole stream comes
    out of ``decompress`` (no output limit): ``flush`` only for one that did not end (each
    call lets the GIL go and takes it back, which the dispatcher's thread paid twice per
    delivery while the event loop ran)."""
    if stored[0] in _ZLIB_FORMATS:
        unpacker = zlib.decompressobj(15, zdict[-WINDOW:])
        data = unpacker.decompress(stored[1:])
        return data if unpacker.eof else data + unpacker.flush()
    unpacker = zlib.decompressobj(-15, zdict[-WINDOW:])
    data = unpacker.decompress(stored[1:-4])
    if not unpacker.eof:
        data += unpacker.flush()
    if not unpacker.eof or (zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "big") != stored[-4:]:
        raise ValueError("stored JSON does not decode to what was stored (damaged row?)")
    return data


def _form(stored: bytes) -> int:
    """The format of a stored BLOB, the old zlib-framed ones named as their successors."""
    form = stored[0] if stored else 0
    return _ZLIB_FORMATS.get(form, form)


def encode_raw(raw: bytes, hints: bytes) -> bytes:
    """An activity's raw JSON for ``activities.raw``; ``hints`` (its name and createTime)
    must be given again to :func:`decode_raw`."""
    return _compress(ARCHIVE, raw, ARCHIVE_DICT + hints)


def decode_raw(stored: str | bytes, hints: bytes) -> bytes:
    """The exact raw JSON bytes of a stored ``activities.raw`` (TEXT or a format 1 or 4
    BLOB)."""
    if isinstance(stored, str):
        return stored.encode("utf-8")
    if _form(stored) != ARCHIVE:
        raise ValueError(f"unknown archive format {stored[:1]!r}")
    return _decompress(stored, ARCHIVE_DICT + hints)


def encode_body(body: bytes, reference: bytes, context: bytes) -> bytes:
    """An event body for ``events.body``, against the session's ``reference`` body and the
    ``context`` (the activity's raw JSON, or ``b""``); both are needed to decode it."""
    if context:
        return _compress(BODY_WITH_ACTIVITY, body, BODY_DICT + reference + context)
    return _compress(BODY, body, BODY_DICT + reference)


def needs_context(stored: str | bytes) -> bool:
    """Whether decoding this stored body needs its activity's raw JSON."""
    return isinstance(stored, bytes) and _form(stored) == BODY_WITH_ACTIVITY


def reference_used(stored: str | bytes, context: bytes) -> bool:
    """Whether decoding ``stored`` against ``context`` reads its reference body: the
    dictionary is the last :data:`WINDOW` bytes of ``BODY_DICT + reference + context``, so
    a context that long leaves nothing of the reference (a big activity's event)."""
    if not isinstance(stored, bytes):
        return False
    form = _form(stored)
    return form == BODY or (form == BODY_WITH_ACTIVITY and len(context) < WINDOW)


def decode_body(stored: str | bytes, reference: bytes, context: bytes) -> bytes:
    """The exact bytes of a stored ``events.body`` (TEXT or a format 2, 3, 5 or 6 BLOB);
    ``context`` is only used by formats 3 and 6."""
    if isinstance(stored, str):
        return stored.encode("utf-8")
    form = _form(stored)
    if form == BODY_WITH_ACTIVITY:
        return _decompress(stored, BODY_DICT + reference + context)
    if form == BODY:
        return _decompress(stored, BODY_DICT + reference)
    raise ValueError(f"unknown body format {stored[:1]!r}")


# Names (migration 0008): an activity's name is ``<session>/activities/<id>``, so the rows
# store what the name does not already say. The SQL twins are the generated columns of
# ``activities.session_name`` and ``events.activity_name`` (migrations.py).
_ACTIVITIES = "/activities/"


def session_of(name: str) -> str:
    """The session an activity's name says it belongs to: the text before the first
    ``/activities/`` ('' when there is none)."""
    at = name.find(_ACTIVITIES)
    return name[:at] if at >= 0 else ""


def session_ref(name: str, session_name: str) -> str | None:
    """What ``activities.session_ref`` stores: ``None`` when the name says its session
    (always, for what the poller archives), else the session's name."""
    return None if session_of(name) == session_name else session_name


def split_activity_name(session_name: str, name: str | None) -> tuple[str | None, str | None]:
    """``(activity_id, activity_other)`` stored for an event's ``activity_name``: the part
    after ``<session>/activities/``, or (a name of another shape) the whole name."""
    if name is None:
        return None, None
    prefix = session_name + _ACTIVITIES
    if name.startswith(prefix):
        return name[len(prefix) :], None
    return None, name


# Enumerations (migration 0008): ``events.type`` and ``activities.kind`` repeat a few names
# in every row; a row stores the name's position in these tuples (``type_code``,
# ``kind_code``; commonest first: 0 and 1 take no byte at all in SQLite) and the text only
# for a name not listed (``type_other``, ``kind_other``). The readable column is generated
# from both (:func:`uncoded_sql`). Part of the file format: never reorder or edit these;
# a new name is stored as ``*_other`` until a new migration extends the list.
EVENT_TYPES: tuple[str, ...] = (
    "activity.progress_updated",
    "activity.agent_messaged",
    "activity.user_messaged",
    "activity.plan_generated",
    "activity.plan_approved",
    "activity.session_completed",
    "activity.session_failed",
    "activity.unknown",
    "session.discovered",
    "session.state_changed",
    "session.pull_request_opened",
    "session.action_required",
    "session.completed",
    "session.failed",
)
KINDS: tuple[str, ...] = (
    "progressUpdated",
    "agentMessaged",
    "userMessaged",
    "planGenerated",
    "planApproved",
    "sessionCompleted",
    "sessionFailed",
    "unknown",
)
_CODES = {names: {name: i for i, name in enumerate(names)} for names in (EVENT_TYPES, KINDS)}


def coded(names: tuple[str, ...], value: str) -> tuple[int | None, str | None]:
    """``(code, other)`` stored for ``value`` of the enumeration ``names``."""
    code = _CODES[names].get(value)
    return (code, None) if code is not None else (None, value)


def uncoded_sql(names: tuple[str, ...], code: str, other: str) -> str:
    """The SQL (both engines) giving the name back from the ``code`` and ``other`` columns."""
    cases = " ".join(f"WHEN {i} THEN '{name}'" for i, name in enumerate(names))
    return f"COALESCE({other}, CASE {code} {cases} END)"


def coded_sql(names: tuple[str, ...], column: str) -> str:
    """The SQL giving the code of ``column``'s text (``NULL``: not listed): migrations."""
    cases = " ".join(f"WHEN '{name}' THEN {i}" for i, name in enumerate(names))
    return f"CASE {column} {cases} END"
