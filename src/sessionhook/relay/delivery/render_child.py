"""The renderer's child process: render requests in on stdin, answers out on stdout.

Started by :class:`~sessionhook.relay.delivery.render_process.RenderProcess` and killed when a
render goes over its budget. A frame is a 4-byte big-endian length and that many bytes. The
child first sends ``ready``; a request (:func:`request`) is a JSON header and the event's
body, the answer a JSON header (``{"ok": true, "content_type": ...}`` or ``{"ok": false,
"error": ...}``) and the rendered bytes.

The child guards itself as well: its address space is capped at :data:`MEMORY_BYTES`
where the system allows it, and each render arms an alarm one second past its budget
that ends the process even when nobody is left to kill it. It ignores SIGINT (the daemon
decides) and exits when stdin closes.
"""

from __future__ import annotations

import json
import signal
import struct
import sys
from typing import Any, BinaryIO

from ..domain.render import RenderError, Shape, render

#: The child's address-space cap (a 16 MiB event parses into well under 200 MB).
MEMORY_BYTES = 1024 * 1024 * 1024
#: The first frame the child sends: imports done, requests welcome.
READY = b"ready"
_LENGTH = struct.Struct(">I")


def frame(data: bytes) -> bytes:
    """``data`` as one frame (length prefix + bytes)."""
    return _LENGTH.pack(len(data)) + data


def request(event_id: str, body: bytes, shape: Shape, timeout: float) -> bytes:
    """The two frames asking a child to render ``body`` as ``shape`` within ``timeout``."""
    header = {
        "event_id": event_id,
        "payload": shape.payload,
        "format": shape.format,
        "template": shape.template,
        "content_type": shape.content_type,
        "public_url": shape.public_url,
        "timeout": timeout,
    }
    return frame(json.dumps(header).encode()) + frame(body)


def _read_frame(stream: BinaryIO) -> bytes | None:
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(head)
    data = stream.read(length)
    return data if len(data) == length else None


def _limit_memory() -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    except (ImportError, OSError, ValueError):
        pass  # refused (seccomp) or unsupported: the module docstring says what bounds it then


def _answer(header: dict[str, Any], body: bytes) -> dict[str, Any] | tuple[bytes, str]:
    shape = Shape(
        payload=header["payload"],
        format=header["format"],
        template=header["template"],
        content_type=header["content_type"],
        public_url=header.get("public_url"),
    )
    try:
        return render(header["event_id"], body, shape)
    except RenderError as exc:
        return {"ok": False, "error": str(exc)}
    except MemoryError:  # reading the event, before the template ran
        return {
            "ok": False,
            "error": f"event over the renderer's memory budget of {MEMORY_BYTES // 2**20} MiB",
        }
    except Exception as exc:  # a bug here: still one answer, never a dead child
        return {"ok": False, "error": f"renderer failed: {exc!r}"}


def main() -> int:
    """Serve render requests until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _limit_memory()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    stdout.write(frame(READY))
    stdout.flush()
    while True:
        header_bytes = _read_frame(stdin)
        body = _read_frame(stdin) if header_bytes is not None else None
        if header_bytes is None or body is None:
            return 0
        header = json.loads(header_bytes)
        signal.setitimer(signal.ITIMER_REAL, float(header["timeout"]) + 1.0)
        try:
            answer = _answer(header, body)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        if isinstance(answer, dict):
            rendered, meta = b"", answer
        else:
            rendered, meta = answer[0], {"ok": True, "content_type": answer[1]}
        stdout.write(frame(json.dumps(meta).encode()) + frame(rendered))
        stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
