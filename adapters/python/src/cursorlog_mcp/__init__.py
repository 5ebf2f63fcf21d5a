"""cursorlog-backed resumability for the official MCP Python SDK (Streamable HTTP).

    store = CursorlogEventStore("127.0.0.1:50051")
    app = streamable_http_app(mcp_server, store)      # a Starlette app; run it with uvicorn

See README.md for the session-isolation mechanism and what a resuming client sees.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__all__ = [
    "PRODUCER_ABORTED",
    "RESUME_DISCONTINUITY",
    "CursorlogClient",
    "CursorlogError",
    "CursorlogEventStore",
    "CursorlogMcpError",
    "CursorlogSessionManager",
    "SessionBindingError",
    "SessionEventStore",
    "SessionRecord",
    "streamable_http_app",
]

# Imported lazily so that `python -m cursorlog_mcp.codegen` works before the stubs exist.
_WHERE = {
    "PRODUCER_ABORTED": "errors",
    "RESUME_DISCONTINUITY": "errors",
    "CursorlogError": "errors",
    "CursorlogMcpError": "errors",
    "SessionBindingError": "errors",
    "CursorlogClient": "client",
    "CursorlogEventStore": "store",
    "SessionEventStore": "store",
    "SessionRecord": "record",
    "CursorlogSessionManager": "manager",
    "streamable_http_app": "manager",
}

if TYPE_CHECKING:
    from .client import CursorlogClient
    from .errors import PRODUCER_ABORTED, RESUME_DISCONTINUITY, CursorlogError, CursorlogMcpError, SessionBindingError
    from .manager import CursorlogSessionManager, streamable_http_app
    from .record import SessionRecord
    from .store import CursorlogEventStore, SessionEventStore


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'cursorlog_mcp' has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)
