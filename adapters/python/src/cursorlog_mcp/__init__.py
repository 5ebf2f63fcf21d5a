"""cursorlog-backed resumability for the official MCP Python SDK (Streamable HTTP).

    store = CursorlogEventStore("127.0.0.1:50051")
    app = mcp.streamable_http_app(event_store=store)                  # the SDK's own builder
    app.add_middleware(CursorlogMiddleware, store=store, server=mcp)  # names sessions, restores them

See README.md for what a resuming client sees and what is not drop-in.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__all__ = [
    "PRODUCER_ABORTED",
    "RESUME_DISCONTINUITY",
    "AppendBatcher",
    "CursorlogClient",
    "CursorlogError",
    "CursorlogEventStore",
    "CursorlogMcpError",
    "CursorlogMiddleware",
    "EvictedMode",
    "SessionBindingError",
    "SessionState",
    "client_session_id",
]

# Imported lazily so that `python -m cursorlog_mcp.codegen` works before the stubs exist.
_WHERE = {
    "PRODUCER_ABORTED": "errors",
    "RESUME_DISCONTINUITY": "errors",
    "CursorlogError": "errors",
    "CursorlogMcpError": "errors",
    "SessionBindingError": "errors",
    "AppendBatcher": "batcher",
    "CursorlogClient": "client",
    "CursorlogEventStore": "store",
    "CursorlogMiddleware": "middleware",
    "EvictedMode": "resume",
    "SessionState": "record",
    "client_session_id": "binding",
}

if TYPE_CHECKING:
    from .batcher import AppendBatcher
    from .binding import client_session_id
    from .client import CursorlogClient
    from .errors import PRODUCER_ABORTED, RESUME_DISCONTINUITY, CursorlogError, CursorlogMcpError, SessionBindingError
    from .middleware import CursorlogMiddleware
    from .record import SessionState
    from .resume import EvictedMode
    from .store import CursorlogEventStore


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'cursorlog_mcp' has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)
