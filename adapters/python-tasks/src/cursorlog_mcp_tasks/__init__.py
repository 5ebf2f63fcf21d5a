"""cursorlog-mcp-tasks: a durable, shared ``TaskStore`` for the experimental tasks of the MCP
Python SDK 1.x (``mcp>=1.30,<2``), on cursorlog's ``cursorlog.v1.Tasks`` service.

    from cursorlog_mcp_tasks import CursorlogTaskStore
    store = CursorlogTaskStore("cursorlog:7001")
    server.experimental.enable_tasks(store=store)
    ...  # in a tool: a cancel on any replica stops the work
    return await server.request_context.experimental.run_task(store.cancellable(work))
"""

from ._sdk import SdkMismatchError
from .client import TasksClient
from .store import CursorlogTaskStore, CursorlogTaskStoreError, result_from_json, result_to_json, to_mcp_task

__all__ = [
    "CursorlogTaskStore",
    "CursorlogTaskStoreError",
    "SdkMismatchError",
    "TasksClient",
    "result_from_json",
    "result_to_json",
    "to_mcp_task",
]
