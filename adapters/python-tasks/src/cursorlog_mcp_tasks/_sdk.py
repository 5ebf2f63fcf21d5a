"""The one place this package touches an internal of the MCP SDK (read in mcp 1.30.0).

``RequestContext.experimental.run_task`` spawns ``execute()``: it awaits the work, then, unless
the task context's cached ``task`` already shows an end, writes ``complete(result)`` (or, on an
exception, ``fail(str(e))``). When the task was ended by someone else (a ``tasks/cancel``, on
this replica or another), those writes raise ``ValueError`` ("Cannot transition from terminal
status"), ``execute()`` does not catch the second one, and the task group of the server's
``TaskSupport`` fails: ``Server.run`` ends. The context's public writers all go through the
store (and are refused for the ended task), so the only way to tell ``execute()`` that the task
has ended is to put the ended task into the context's cache: ``ServerTaskContext._ctx._task``.
"""

from __future__ import annotations

import functools
from importlib.metadata import version

from mcp.server.experimental.task_context import ServerTaskContext
from mcp.shared.experimental.tasks.context import TaskContext
from mcp.types import Task

CHECKED_SDK = "1.30"
"""The ``mcp`` minor version whose ``ServerTaskContext`` internals this module was read against."""


class SdkMismatchError(RuntimeError):
    """The installed ``mcp`` is not the one ``_sdk.py`` was read against, or its task context
    does not have the shape it expects: re-read ``execute()`` in ``run_task`` and this module."""


@functools.cache
def check_sdk() -> None:
    """Fails loudly (``SdkMismatchError``) on an ``mcp`` other than 1.30.x."""
    installed = version("mcp")
    if installed != CHECKED_SDK and not installed.startswith(CHECKED_SDK + "."):
        raise SdkMismatchError(
            f"cursorlog_mcp_tasks.cancellable was checked against mcp {CHECKED_SDK}.x, not {installed}: "
            "re-check how run_task's execute() ends a task (cursorlog_mcp_tasks/_sdk.py)"
        )


def inner_context(task: ServerTaskContext) -> TaskContext:
    """The ``TaskContext`` a ``ServerTaskContext`` wraps; ``SdkMismatchError`` when it has none
    (checked before the work starts, so a mismatch never surfaces in the middle of a cancel)."""
    inner = getattr(task, "_ctx", None)
    if not isinstance(inner, TaskContext) or not isinstance(getattr(inner, "_task", None), Task):
        raise SdkMismatchError(
            f"mcp {version('mcp')}: ServerTaskContext has no TaskContext at ._ctx with a Task at ._task "
            "(cursorlog_mcp_tasks/_sdk.py was read against mcp 1.30)"
        )
    return inner


def adopt_end(task: ServerTaskContext, ended: Task) -> None:
    """Makes ``task.task`` the ended task, so the SDK's ``execute()`` writes nothing after the
    work returns (it checks ``is_terminal(task.task.status)`` first)."""
    inner_context(task)._task = ended
