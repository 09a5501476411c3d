"""The MCP server at ``/mcp`` (docs/mcp.md): :class:`McpService` (the SDK's server, its
routes and what runs beside them), the tools (:mod:`.tools`), the watcher of the archive
(:mod:`.watch`)."""

from .server import MCP_PATH, McpService
from .tools import TOOLS, ToolSpec
from .watch import SESSION_URI, WAITING_URI, Watcher, session_uri

__all__ = [
    "MCP_PATH",
    "SESSION_URI",
    "TOOLS",
    "WAITING_URI",
    "McpService",
    "ToolSpec",
    "Watcher",
    "session_uri",
]
