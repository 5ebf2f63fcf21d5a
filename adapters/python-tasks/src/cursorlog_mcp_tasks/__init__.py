"""cursorlog-mcp-tasks: a durable, shared ``TaskStore`` for the experimental tasks of the MCP
Python SDK 1.x (``mcp>=1.30,<2``), on cursorlog's ``cursorlog.v1.Tasks`` service.

    from cursorlog_mcp_tasks import CursorlogTaskStore
    server.experimental.enable_tasks(store=CursorlogTaskStore("cursorlog:7001"))
"""

from .client import TasksClient
from .store import CursorlogTaskStore, CursorlogTaskStoreError, result_from_json, result_to_json, to_mcp_task

__all__ = [
    "CursorlogTaskStore",
    "CursorlogTaskStoreError",
    "TasksClient",
    "result_from_json",
    "result_to_json",
    "to_mcp_task",
]
