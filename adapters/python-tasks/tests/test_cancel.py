"""A cancel reaches the work it ends: two MCP servers of the real SDK (two replicas), each with
its own CursorlogTaskStore on one cursorlog; a task whose work waits forever is started through
replica A and cancelled through replica B (or A itself). ``store.cancellable(work)`` stops the
work on A (the SDK's ``is_cancelled`` flag, then an anyio cancel) and the task stays
``cancelled``, no result written after."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.server import Server
from mcp.server.experimental.task_context import ServerTaskContext
from mcp.types import TASK_REQUIRED, CallToolResult, CreateTaskResult, Result, TextContent, Tool, ToolExecution

from cursorlog_mcp_tasks import CursorlogTaskStore

from .test_replicas import connect

pytestmark = pytest.mark.anyio

HANG_GUARD_S = 30


@dataclass
class Work:
    """What the tool's work on replica A went through."""

    started: anyio.Event = field(default_factory=anyio.Event)
    interrupted: anyio.Event = field(default_factory=anyio.Event)
    returned: anyio.Event = field(default_factory=anyio.Event)  # the wrapped work, as the SDK awaits it
    flag_when_interrupted: bool | None = None
    release: anyio.Event = field(default_factory=anyio.Event)


def replica(store: CursorlogTaskStore, work: Work) -> Server:
    server = Server("replica")
    server.experimental.enable_tasks(store=store)

    @server.list_tools()
    async def list_tools() -> list[Tool]:
        return [
            Tool(name=n, inputSchema={"type": "object"}, execution=ToolExecution(taskSupport=TASK_REQUIRED))
            for n in ("wait", "greet", "complete_then_wait", "raise", "cancelled_then_return")
        ]

    @server.call_tool()
    async def call_tool(name: str, arguments: dict[str, Any]) -> CallToolResult | CreateTaskResult:
        async def wait(task: ServerTaskContext) -> CallToolResult:
            work.started.set()
            try:
                await work.release.wait()  # set by no one in the cancel tests
            except anyio.get_cancelled_exc_class():
                work.flag_when_interrupted = task.is_cancelled
                work.interrupted.set()
                raise
            return CallToolResult(content=[TextContent(type="text", text="released")])

        async def greet(task: ServerTaskContext) -> CallToolResult:
            return CallToolResult(content=[TextContent(type="text", text="Hello!")])

        async def complete_then_wait(task: ServerTaskContext) -> CallToolResult:
            done = CallToolResult(content=[TextContent(type="text", text="early")])
            await task.complete(done)  # its own end: the watch sees it and must not stop the work
            work.started.set()
            return await wait(task)

        async def fail(task: ServerTaskContext) -> CallToolResult:
            work.started.set()
            raise RuntimeError("boom")

        async def cancelled_then_return(task: ServerTaskContext) -> CallToolResult:
            # A cancel landing after the work's last await, before its result is written: the
            # SDK's runner would be refused twice and fail the server's task group.
            await store.update_task(task.task_id, status="cancelled")
            work.started.set()
            return CallToolResult(content=[TextContent(type="text", text="too late")])

        works = {
            "wait": wait,
            "greet": greet,
            "complete_then_wait": complete_then_wait,
            "raise": fail,
            "cancelled_then_return": cancelled_then_return,
        }
        wrapped = store.cancellable(works[name])

        async def tracked(task: ServerTaskContext) -> Result:
            try:
                return await wrapped(task)
            finally:
                if name != "greet":
                    work.returned.set()

        return await server.request_context.experimental.run_task(tracked)

    return server


@asynccontextmanager
async def two_replicas(
    cursorlog: str, owner: str, work: Work
) -> AsyncIterator[tuple[ClientSession, ClientSession, CursorlogTaskStore]]:
    store_a = CursorlogTaskStore(cursorlog, owner=owner)
    a = replica(store_a, work)
    b = replica(CursorlogTaskStore(cursorlog, owner=owner), Work())
    async with anyio.create_task_group() as group, AsyncExitStack() as stack:
        yield await connect(a, group, stack), await connect(b, group, stack), store_a
        group.cancel_scope.cancel()


async def within(awaitable: Callable[[], Awaitable[None]]) -> None:
    with anyio.fail_after(HANG_GUARD_S):  # a hang guard only: the events decide
        await awaitable()


async def cancel_and_check(canceller: ClientSession, on_a: ClientSession, store_a: CursorlogTaskStore, work: Work) -> None:
    task_id = (await on_a.experimental.call_tool_as_task("wait", {})).task.taskId
    await within(work.started.wait)
    assert (await canceller.experimental.cancel_task(task_id)).status == "cancelled"
    await within(work.interrupted.wait)
    assert work.flag_when_interrupted is True  # the SDK's flag was set before the interrupt
    await within(work.returned.wait)
    await nothing_after_the_cancel(task_id, on_a, canceller, store_a)


async def nothing_after_the_cancel(
    task_id: str, on_a: ClientSession, other: ClientSession, store_a: CursorlogTaskStore
) -> None:
    assert store_a.client.open_watches == 0  # the work's watch ended with it
    # Nothing was written after the cancel: still cancelled, no result, on either replica.
    for session in (on_a, other):
        assert (await session.experimental.get_task(task_id)).status == "cancelled"
    assert await store_a.get_result(task_id) is None
    # Replica A's server still runs tasks (the SDK's runner did not fail on the ended task).
    greeted = (await on_a.experimental.call_tool_as_task("greet", {})).task.taskId
    with anyio.fail_after(HANG_GUARD_S):
        statuses = [s.status async for s in on_a.experimental.poll_task(greeted)]
    assert statuses[-1] == "completed"


async def test_a_cancel_through_replica_b_stops_the_work_on_replica_a(cursorlog: str, owner: str) -> None:
    work = Work()
    async with two_replicas(cursorlog, owner, work) as (on_a, on_b, store_a):
        await cancel_and_check(on_b, on_a, store_a, work)


async def test_a_cancel_through_replica_a_itself_stops_its_work(cursorlog: str, owner: str) -> None:
    work = Work()
    async with two_replicas(cursorlog, owner, work) as (on_a, _on_b, store_a):
        await cancel_and_check(on_a, on_a, store_a, work)


async def test_work_that_ends_by_itself_completes_and_closes_its_watch(cursorlog: str, owner: str) -> None:
    work = Work()
    async with two_replicas(cursorlog, owner, work) as (on_a, on_b, store_a):
        task_id = (await on_a.experimental.call_tool_as_task("wait", {})).task.taskId
        await within(work.started.wait)
        work.release.set()
        await within(work.returned.wait)
        assert not work.interrupted.is_set()
        assert store_a.client.open_watches == 0
        result = await on_b.experimental.get_task_result(task_id, CallToolResult)
        assert result.content == [TextContent(type="text", text="released")]
        assert (await on_b.experimental.get_task(task_id)).status == "completed"


async def test_an_end_the_work_writes_itself_does_not_stop_it(cursorlog: str, owner: str) -> None:
    work = Work()
    async with two_replicas(cursorlog, owner, work) as (on_a, on_b, store_a):
        task_id = (await on_a.experimental.call_tool_as_task("complete_then_wait", {})).task.taskId
        await within(work.started.wait)
        # The watch saw this end and ended (the task ends once); the work runs on.
        assert (await on_b.experimental.get_task(task_id)).status == "completed"
        work.release.set()
        await within(work.returned.wait)
        assert not work.interrupted.is_set()
        assert store_a.client.open_watches == 0
        result = await on_b.experimental.get_task_result(task_id, CallToolResult)
        assert result.content == [TextContent(type="text", text="early")]


async def test_a_work_that_raises_fails_its_task_as_the_sdk_does(cursorlog: str, owner: str) -> None:
    work = Work()
    async with two_replicas(cursorlog, owner, work) as (on_a, on_b, store_a):
        task_id = (await on_a.experimental.call_tool_as_task("raise", {})).task.taskId
        await within(work.returned.wait)
        assert store_a.client.open_watches == 0
        failed = await on_b.experimental.get_task(task_id)
        assert (failed.status, failed.statusMessage) == ("failed", "boom")


async def test_a_cancel_after_the_works_last_await_wins_and_the_server_runs_on(cursorlog: str, owner: str) -> None:
    work = Work()
    async with two_replicas(cursorlog, owner, work) as (on_a, on_b, store_a):
        task_id = (await on_a.experimental.call_tool_as_task("cancelled_then_return", {})).task.taskId
        await within(work.returned.wait)
        assert not work.interrupted.is_set()
        await nothing_after_the_cancel(task_id, on_a, on_b, store_a)
