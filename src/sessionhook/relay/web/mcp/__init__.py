"""The MCP server at ``/mcp`` (docs/mcp.md): :class:`McpService` (the route, and the
server it builds when the listener starts: :mod:`.server`, which alone imports the SDK),
the tools (:mod:`.tools`), the watcher of the archive (:mod:`.watch`)."""

from .service import MCP_PATH, McpService
from .watch import SESSION_URI, WAITING_URI, Watcher, session_uri

__all__ = [
    "MCP_PATH",
    "SESSION_URI",
    "WAITING_URI",
    "McpService",
    "Watcher",
    "session_uri",
]
