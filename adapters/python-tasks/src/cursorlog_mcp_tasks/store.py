"""``CursorlogTaskStore``: the ``mcp`` 1.x ``TaskStore`` on cursorlog's ``Tasks`` service, so
every replica of an MCP server reads, updates and cancels the same tasks (docs/TASKS-DESIGN.md
§4.3)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import anyio
import grpc
from mcp.server.experimental.task_context import ServerTaskContext
from mcp.shared.experimental.tasks.helpers import is_terminal
from mcp.shared.experimental.tasks.store import TaskStore
from mcp.types import (
    CallToolResult,
    CreateMessageResult,
    ElicitResult,
    Result,
    Task,
    TaskMetadata,
    TaskStatus,
)
from pydantic import ValidationError

from . import _sdk
from ._proto import tasks_pb2 as pb
from .client import TasksClient

log = logging.getLogger(__name__)

_TO_PB: dict[str, pb.TaskStatus] = {
    "working": pb.WORKING,
    "input_required": pb.INPUT_REQUIRED,
    "completed": pb.COMPLETED,
    "failed": pb.FAILED,
    "cancelled": pb.CANCELLED,
}
_FROM_PB: dict[pb.TaskStatus, TaskStatus] = {
    pb.WORKING: "working",
    pb.INPUT_REQUIRED: "input_required",
    pb.COMPLETED: "completed",
    pb.FAILED: "failed",
    pb.CANCELLED: "cancelled",
}

UNLIMITED_TTL_MS = 2**64 - 1
"""Sent for ``TaskMetadata(ttl=None)``: the server clamps it to its ``--task-ttl-max-secs``."""

_SEEN_MAX = 10_000

# The result types a task of the SDK ends with, most specific first (a stored result is JSON;
# ``get_result`` gives back the SDK type it validates as, or a plain ``Result``).
_RESULT_TYPES: tuple[type[Result], ...] = (CreateMessageResult, CallToolResult, ElicitResult)

# A watch of a running task ends when the server ends its stream after the task's end; a stream
# that breaks before (UNAVAILABLE: the member stopped leading or died; or ended early) is opened
# again from the last version seen, on the leader named or the next member, after a pause that
# starts here and doubles up to the cap, for as long as the work runs.
_REWATCH_FIRST_S = 0.05
_REWATCH_MAX_S = 2.0

# ``wait_for_update`` re-opens its watch the same way, but gives up (raising the store's error)
# once watch calls in a row have failed for this long: a failover takes seconds, and a caller
# waiting on a cursorlog that is gone should hear so rather than wait for ever.
_UPDATE_OUTAGE_MAX_S = 60.0

TaskWork = Callable[[ServerTaskContext], Awaitable[Result]]
"""The work ``run_task`` runs: it gets the task's context and returns the task's result."""


@dataclass
class _Run:
    """One run of a ``cancellable`` work: ``own_end`` is set before the work (or its wrapper)
    writes an end of its own task, so the watch does not take that end for someone else's."""

    task_id: str
    own_end: bool = False


_RUN: ContextVar[_Run | None] = ContextVar("cursorlog_mcp_tasks_run", default=None)


class CursorlogTaskStoreError(RuntimeError):
    """cursorlog could not be reached or refused a call for a reason the ``TaskStore`` interface
    has no word for (UNAVAILABLE, UNAUTHENTICATED, RESOURCE_EXHAUSTED, INTERNAL...). The gRPC
    error is the ``__cause__``."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code

    @classmethod
    def from_rpc(cls, operation: str, error: grpc.aio.AioRpcError) -> CursorlogTaskStoreError:
        """The error for a failed call of ``operation``."""
        return cls(f"cursorlog {operation}: {error.code().name}: {error.details()}", error.code())


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def to_mcp_task(task: pb.Task) -> Task:
    """The SDK's ``Task`` for a cursorlog task."""
    return Task(
        taskId=task.task_id,
        status=_FROM_PB[task.status],
        statusMessage=task.status_message if task.HasField("status_message") else None,
        createdAt=_time(task.created_at_ms),
        lastUpdatedAt=_time(task.last_updated_at_ms),
        ttl=task.ttl_ms if task.HasField("ttl_ms") else None,
        pollInterval=task.poll_interval_ms,
    )


def result_to_json(result: Result) -> bytes:
    """A result as cursorlog keeps it: the MCP JSON of the result, as the wire carries it."""
    return json.dumps(result.model_dump(by_alias=True, mode="json", exclude_none=True)).encode()


def result_from_json(raw: bytes) -> Result:
    """The SDK type a stored result validates as (``CreateMessageResult``, ``CallToolResult``,
    ``ElicitResult``), else a ``Result`` keeping every field."""
    data = json.loads(raw)
    for kind in _RESULT_TYPES:
        try:
            return kind.model_validate(data)
        except ValidationError:
            continue
    return Result.model_validate(data)


class CursorlogTaskStore(TaskStore):
    """A durable ``TaskStore`` shared by every replica that names the same cursorlog and owner.

    - ``owner``: the cursorlog owner of every task of this store (default ``""``, the shared
      namespace). The SDK's methods take no session; since mcp 1.27 the session is in the task
      id and the SDK checks it, so one owner per store is enough. Stores with different owners
      never see each other's tasks.
    - ``page_size``: tasks per ``list_tasks`` page (10, as ``InMemoryTaskStore``).
    - ``poll_interval_ms``: the ``pollInterval`` of new tasks (500, as the SDK's).
    - ``worker_lease_ms``: optional; without a write from the worker within it the task fails,
      so a task whose replica died never stays ``working`` (renew with ``keep_alive``).

    Differences from ``InMemoryTaskStore``: ``store_result`` ends the task ``completed`` with its
    result in one durable write (the SDK's following ``update_task(status="completed")`` restates
    it and is a no-op); an ended task never changes, so its status message cannot be updated
    (``ValueError``); ``ttl=None`` is granted the server's maximum TTL, not forever.
    """

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        owner: str = "",
        page_size: int = 10,
        poll_interval_ms: int = 500,
        worker_lease_ms: int | None = None,
        token: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.client = TasksClient(target, token=token, timeout_s=timeout_s)
        self.owner = owner
        self.page_size = page_size
        self.poll_interval_ms = poll_interval_ms
        self.worker_lease_ms = worker_lease_ms
        self._seen: dict[str, int] = {}
        self._update_events: dict[str, anyio.Event] = {}

    # -- helpers --------------------------------------------------------------------------------------------
    def _saw(self, task: pb.Task) -> None:
        if task.version > self._seen.get(task.task_id, 0):
            self._seen[task.task_id] = task.version
            while len(self._seen) > _SEEN_MAX:
                del self._seen[next(iter(self._seen))]

    async def _call(self, operation: str, rpc: str, request: Any) -> Any:
        try:
            return await self.client.unary(rpc, request)
        except grpc.aio.AioRpcError as e:
            raise CursorlogTaskStoreError.from_rpc(operation, e) from e

    async def _get(self, task_id: str, *, outcome: bool = False) -> pb.GetTaskResponse:
        request = pb.GetTaskRequest(owner=self.owner, task_id=task_id, include_outcome=outcome)
        response: pb.GetTaskResponse = await self._call("get_task", "GetTask", request)
        if response.verdict == pb.TASK_FOUND:
            self._saw(response.view.task)
        return response

    async def _found(self, task_id: str) -> pb.Task:
        response = await self._get(task_id)
        if response.verdict != pb.TASK_FOUND:
            raise ValueError(f"Task with ID {task_id} not found")
        return response.view.task

    async def _ended(self, task_id: str, e: CursorlogTaskStoreError) -> ValueError:
        """The SDK's error for a write refused because the task ended (or is gone)."""
        if e.code == grpc.StatusCode.NOT_FOUND:
            return ValueError(f"Task with ID {task_id} not found")
        task = await self._found(task_id)
        return ValueError(f"Cannot transition from terminal status '{_FROM_PB[task.status]}'")

    # -- TaskStore ------------------------------------------------------------------------------------------
    async def create_task(self, metadata: TaskMetadata, task_id: str | None = None) -> Task:
        """``CreateTask``, durable before it returns; the task id is the idempotency key (the SDK
        passes no request id), so an existing id is ``ValueError`` as in the SDK's store."""
        task_id = task_id or str(uuid.uuid4())
        request = pb.CreateTaskRequest(
            owner=self.owner,
            task_id=task_id,
            request_key=task_id,
            ttl_ms=metadata.ttl if metadata.ttl is not None else UNLIMITED_TTL_MS,
            poll_interval_ms=self.poll_interval_ms,
        )
        if self.worker_lease_ms is not None:
            request.worker_lease_ms = self.worker_lease_ms
        try:
            response: pb.CreateTaskResponse = await self._call("create_task", "CreateTask", request)
        except CursorlogTaskStoreError as e:
            if e.code == grpc.StatusCode.ALREADY_EXISTS:
                raise ValueError(f"Task with ID {task_id} already exists") from e
            raise
        if not response.created:
            raise ValueError(f"Task with ID {task_id} already exists")
        self._saw(response.task)
        return to_mcp_task(response.task)

    async def get_task(self, task_id: str) -> Task | None:
        """``GetTask`` (linearizable: any replica sees a task right after its creation); ``None``
        unless found (unknown, another owner's, deleted or expired)."""
        response = await self._get(task_id)
        return to_mcp_task(response.view.task) if response.verdict == pb.TASK_FOUND else None

    async def update_task(
        self, task_id: str, status: TaskStatus | None = None, status_message: str | None = None
    ) -> Task:
        """A running status (or only a message) → ``UpdateTask``; an ending status →
        ``FinishTask`` without an outcome. Restating an ended task's status is a no-op; any other
        change of an ended task is ``ValueError`` ("Cannot transition from terminal status")."""
        if status is not None and is_terminal(status):
            return await self._finish(task_id, status, status_message)
        for _ in range(8):
            request = pb.UpdateTaskRequest(owner=self.owner, task_id=task_id)
            if status is not None:
                request.status = _TO_PB[status]  # one call: the server refuses it for an ended task
            else:
                # Only a message: keep the status it has now, by compare-and-set on its version.
                current = await self._found(task_id)
                if is_terminal(_FROM_PB[current.status]):
                    if status_message is None:
                        return to_mcp_task(current)
                    raise ValueError(f"Cannot transition from terminal status '{_FROM_PB[current.status]}'")
                request.status = current.status
                request.expected_version = current.version
            if status_message is not None:
                request.status_message = status_message
            try:
                response: pb.TaskResponse = await self._call("update_task", "UpdateTask", request)
            except CursorlogTaskStoreError as e:
                if e.code == grpc.StatusCode.ABORTED:
                    continue  # another writer moved it: read again
                if e.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
                    raise await self._ended(task_id, e) from e
                raise
            self._saw(response.task)
            self._wake(task_id)
            return to_mcp_task(response.task)
        raise CursorlogTaskStoreError(
            f"update_task {task_id}: the task kept changing under 8 attempts", grpc.StatusCode.ABORTED
        )

    async def _finish(
        self, task_id: str, status: TaskStatus, status_message: str | None, outcome: pb.TaskOutcome | None = None
    ) -> Task:
        run = _RUN.get()
        if run is not None and run.task_id == task_id:
            run.own_end = True  # before the write: its watch may see the end before we do
        request = pb.FinishTaskRequest(owner=self.owner, task_id=task_id, status=_TO_PB[status])
        if status_message is not None:
            request.status_message = status_message
        if outcome is not None:
            request.outcome.CopyFrom(outcome)
        try:
            response: pb.FinishTaskResponse = await self._call("finish_task", "FinishTask", request)
        except CursorlogTaskStoreError as e:
            if e.code == grpc.StatusCode.NOT_FOUND:
                raise ValueError(f"Task with ID {task_id} not found") from e
            if e.code != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            current = await self._found(task_id)
            if current.status == _TO_PB[status] and outcome is None:
                return to_mcp_task(current)  # a restatement (with another message): the end stands
            raise ValueError(f"Cannot transition from terminal status '{_FROM_PB[current.status]}'") from e
        self._saw(response.task)
        self._wake(task_id)
        return to_mcp_task(response.task)

    async def store_result(self, task_id: str, result: Result) -> None:
        """``FinishTask{COMPLETED, RESULT}``: the task ends with its result in one durable write,
        so no replica ever sees ``completed`` without the result. ``ValueError`` when the task is
        unknown or ended otherwise (cancelled, failed) before."""
        outcome = pb.TaskOutcome(kind=pb.TaskOutcome.RESULT, json=result_to_json(result))
        await self._finish(task_id, "completed", None, outcome)

    async def get_result(self, task_id: str) -> Result | None:
        """The stored result of a completed task, else ``None``."""
        response = await self._get(task_id, outcome=True)
        if response.verdict != pb.TASK_FOUND or not response.view.HasField("outcome"):
            return None
        outcome = response.view.outcome
        if outcome.kind != pb.TaskOutcome.RESULT:
            return None
        return result_from_json(outcome.json)

    async def list_tasks(self, cursor: str | None = None) -> tuple[list[Task], str | None]:
        """``ListTasks``: one page of this owner's tasks in creation order; a cursor that does not
        decode is ``ValueError("Invalid cursor: ...")`` as in the SDK's store."""
        request = pb.ListTasksRequest(owner=self.owner, cursor=cursor or "", page_size=self.page_size)
        try:
            response: pb.ListTasksResponse = await self._call("list_tasks", "ListTasks", request)
        except CursorlogTaskStoreError as e:
            if e.code == grpc.StatusCode.INVALID_ARGUMENT:
                raise ValueError(f"Invalid cursor: {cursor}") from e
            raise
        return [to_mcp_task(t) for t in response.tasks], response.next_cursor or None

    async def delete_task(self, task_id: str) -> bool:
        """``DeleteTask``: ``True`` when deleted, ``False`` when not found."""
        request = pb.DeleteTaskRequest(owner=self.owner, task_id=task_id)
        try:
            await self._call("delete_task", "DeleteTask", request)
        except CursorlogTaskStoreError as e:
            if e.code == grpc.StatusCode.NOT_FOUND:
                return False
            raise
        self._seen.pop(task_id, None)
        self._wake(task_id)
        return True

    async def wait_for_update(self, task_id: str) -> None:
        """Returns at the task's next change after the last version this store saw of it, taken by
        any replica (``WatchTask``), or at a local ``notify_update``. Returns at once for an ended
        task (it will not change). ``ValueError`` when the task is not found. Across a cursorlog
        failover the watch re-opens on the new leader from that version; only an outage of
        ``_UPDATE_OUTAGE_MAX_S`` (60 s) raises the store's error."""
        after = self._seen.get(task_id)
        if after is None:
            after = (await self._found(task_id)).version
        # A fresh event per wait, as the SDK's store: an event belongs to the loop that first
        # waits on it. A second waiter's wake then comes from the watch alone.
        event = self._update_events[task_id] = anyio.Event()
        async with anyio.create_task_group() as group:

            async def local() -> None:
                await event.wait()
                group.cancel_scope.cancel()

            group.start_soon(local)
            try:
                await self._watch(task_id, after)
            finally:
                group.cancel_scope.cancel()

    async def _watch(self, task_id: str, after: int) -> None:
        def changed(response: pb.GetTaskResponse) -> bool:
            if response.verdict != pb.TASK_FOUND:
                return True  # deleted or expired: a change
            task = response.view.task
            return task.version > after or is_terminal(_FROM_PB[task.status])

        try:
            # A stream the server ends is an ended task (no more changes): that is the answer.
            response = await self._follow(
                task_id, after, changed, outage_s=_UPDATE_OUTAGE_MAX_S, reopen_ended=False
            )
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                raise ValueError(f"Task with ID {task_id} not found") from e
            raise CursorlogTaskStoreError.from_rpc("wait_for_update", e) from e
        if response is not None and response.verdict == pb.TASK_FOUND:
            self._saw(response.view.task)

    def _wake(self, task_id: str) -> None:
        event = self._update_events.pop(task_id, None)
        if event is not None:
            event.set()

    async def _follow(
        self,
        task_id: str,
        after: int,
        done: Callable[[pb.GetTaskResponse], bool],
        outage_s: float | None = None,
        reopen_ended: bool = True,
    ) -> pb.GetTaskResponse | None:
        """Follows ``WatchTask`` from version ``after`` until ``done`` accepts a response (returned).
        A stream that breaks with UNAVAILABLE (the member stopped leading or died) or ends early is
        re-opened from the last version seen, on the leader named or the next member, after a pause
        doubling from ``_REWATCH_FIRST_S`` to ``_REWATCH_MAX_S``. Raises ``grpc.aio.AioRpcError``
        on any other error, and on UNAVAILABLE once calls in a row failed for ``outage_s``. A
        stream the server ends without a response ``done`` took is re-opened only when
        ``reopen_ended``; else that is ``None``."""
        seen = after

        def accept(response: pb.GetTaskResponse) -> bool:
            nonlocal seen
            if response.verdict == pb.TASK_FOUND:
                seen = max(seen, response.view.task.version)
            return done(response)

        pause = _REWATCH_FIRST_S
        failing_since: float | None = None
        while True:
            before = seen
            request = pb.WatchTaskRequest(owner=self.owner, task_id=task_id, after_version=seen)
            try:
                response = await self.client.watch_until(request, accept)
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                now = anyio.current_time()
                failing_since = now if failing_since is None or seen > before else failing_since
                if outage_s is not None and now - failing_since >= outage_s:
                    raise
                log.info("task %s: watch broke (%s), re-opening after version %d", task_id, e.details(), seen)
            else:
                if response is not None or not reopen_ended:
                    return response
                failing_since = None  # the member answered: not an outage
                log.info("task %s: watch ended early, re-opening after version %d", task_id, seen)
            if seen > before:
                pause = _REWATCH_FIRST_S  # that stream worked for a while: a fresh failure
            await anyio.sleep(pause)  # a backoff between attempts, cancelled with the caller
            pause = min(pause * 2, _REWATCH_MAX_S)

    async def notify_update(self, task_id: str) -> None:
        """Wakes this process's ``wait_for_update`` callers of the task. Other replicas need no
        bell: every write to cursorlog wakes their ``WatchTask``."""
        self._wake(task_id)

    # -- beyond the interface -------------------------------------------------------------------------------
    def cancellable(self, work: TaskWork) -> TaskWork:
        """``work`` for ``run_task``, stopped when its task ends by any other hand: a
        ``tasks/cancel`` on this replica or on another (any replica on the same cursorlog and
        owner), the leader failing it (worker lease), a delete or an expiry.

            return await ctx.experimental.run_task(store.cancellable(work))

        mcp 1.30's ``tasks/cancel`` only writes ``cancelled`` to the store: nothing tells the
        running work, and when the work returns the SDK's runner writes ``completed`` over the
        ended task, is refused, and fails the server's task group. The wrapper watches the
        task (one ``WatchTask`` stream, closed when the task ends or the work returns); on an
        end it did not write, it calls ``task.request_cancellation()`` (the SDK's flag,
        ``task.is_cancelled``) and then cancels the work's anyio scope (work that awaits gets
        the backend's cancellation exception). It then hands the SDK the ended task, so nothing
        is written after the end. A work that returns or raises is completed or failed here as
        the SDK's runner would; an end written by the work itself (``task.complete``) does not
        stop it. ``SdkMismatchError`` on an ``mcp`` other than 1.30.x (see ``_sdk.py``)."""
        _sdk.check_sdk()

        async def run(task: ServerTaskContext) -> Result:
            _sdk.inner_context(task)  # a mismatched SDK fails before the work starts
            return await self._run_cancellable(task, work)

        return run

    async def _run_cancellable(self, task: ServerTaskContext, work: TaskWork) -> Result:
        run = _Run(task.task_id)
        work_scope = anyio.CancelScope()
        ended: list[Task] = []  # the end another hand gave the task, once the watch saw it
        result: Result | None = None
        error: Exception | None = None

        async def watch() -> None:
            response = await self._watch_end(task.task_id)
            if response is None or run.own_end:
                return  # not watchable (logged), or the end is the work's own
            ended.append(self._ended_task(response, task.task))
            task.request_cancellation()  # the SDK's flag, for work that polls it
            work_scope.cancel()  # and an interrupt, for work that awaits

        token = _RUN.set(run)
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(watch)
                with work_scope:
                    try:
                        result = await work(task)
                    except Exception as e:  # as the SDK's runner: it fails the task
                        error = e
                group.cancel_scope.cancel()  # the work is over: so is its watch
            if not ended and not is_terminal(task.task.status):
                try:
                    if error is None and result is not None:
                        await task.complete(result)
                    else:
                        await task.fail(str(error))
                except ValueError:
                    # The end lost to another hand's (a cancel racing the result).
                    current = await self.get_task(task.task_id)
                    if current is not None and not is_terminal(current.status):
                        raise
                    ended.append(current or self._ended_task(None, task.task))
        finally:
            _RUN.reset(token)
        if ended:
            if error is not None:
                log.debug("task %s ended by another hand; its work raised %r", task.task_id, error)
            _sdk.adopt_end(task, ended[0])
        return result if result is not None else Result()

    @staticmethod
    def _ended_task(response: pb.GetTaskResponse | None, last: Task) -> Task:
        """The end a watch saw; for a deleted or expired task (no end to show), ``last`` marked
        failed: the SDK reads it only to know that it must write nothing."""
        if response is not None and response.verdict == pb.TASK_FOUND:
            return to_mcp_task(response.view.task)
        return last.model_copy(update={"status": "failed", "statusMessage": "deleted or expired while its work ran"})

    async def _watch_end(self, task_id: str) -> pb.GetTaskResponse | None:
        """Follows ``WatchTask`` until the task ends (a terminal status, deleted, expired): the
        response that says so. A stream that breaks (UNAVAILABLE, or ended before the task) is
        re-opened from the last version seen with a bounded backoff, until the caller (the work's
        end) cancels this. ``None`` on any other error (logged): the work then runs on
        unwatched, and its end is refused by the store if the task ended meanwhile."""

        def ended(response: pb.GetTaskResponse) -> bool:
            return response.verdict != pb.TASK_FOUND or is_terminal(_FROM_PB[response.view.task.status])

        try:
            response = await self._follow(task_id, 0, ended)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return pb.GetTaskResponse(verdict=pb.TASK_DELETED)
            log.warning("task %s: cannot watch for its end (%s: %s)", task_id, e.code().name, e.details())
            return None
        if response is not None and response.verdict == pb.TASK_FOUND:
            self._saw(response.view.task)
        return response

    async def keep_alive(self, task_id: str) -> None:
        """Renews the task's worker lease (``KeepAliveTask``)."""
        request = pb.KeepAliveTaskRequest(owner=self.owner, task_id=task_id)
        try:
            await self._call("keep_alive", "KeepAliveTask", request)
        except CursorlogTaskStoreError as e:
            if e.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
                raise await self._ended(task_id, e) from e
            raise

    async def close(self) -> None:
        """Closes the gRPC channel of the running event loop."""
        await self.client.close()
