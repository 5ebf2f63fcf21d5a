"""Two MCP servers of the real SDK (two replicas), each with its own CursorlogTaskStore on one
cursorlog: a task started through replica A is polled, read and cancelled through replica B."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import pytest
from anyio.abc import TaskGroup
from mcp.client.session import ClientSession
from mcp.server import Server
from mcp.server.experimental.task_context import ServerTaskContext
from mcp.shared.message import SessionMessage
from mcp.types import TASK_REQUIRED, CallToolResult, CreateTaskResult, TextContent, Tool, ToolExecution

from cursorlog_mcp_tasks import CursorlogTaskStore

pytestmark = pytest.mark.anyio


def replica(store: CursorlogTaskStore) -> Server:
    server = Server("replica")
    server.experimental.enable_tasks(store=store)

    @server.list_tools()
    async def list_tools() -> list[Tool]:
        return [
            Tool(name=n, inputSchema={"type": "object"}, execution=ToolExecution(taskSupport=TASK_REQUIRED))
            for n in ("greet", "wait_forever")
        ]

    @server.call_tool()
    async def call_tool(name: str, arguments: dict[str, Any]) -> CallToolResult | CreateTaskResult:
        async def greet(task: ServerTaskContext) -> CallToolResult:
            return CallToolResult(content=[TextContent(type="text", text=f"Hello, {arguments['name']}!")])

        async def wait_forever(task: ServerTaskContext) -> CallToolResult:
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

        run_task = server.request_context.experimental.run_task
        return await run_task(greet if name == "greet" else wait_forever)

    return server


async def connect(server: Server, group: TaskGroup, stack: AsyncExitStack) -> ClientSession:
    to_client_send, to_client_receive = anyio.create_memory_object_stream[SessionMessage](10)
    to_server_send, to_server_receive = anyio.create_memory_object_stream[SessionMessage](10)

    async def run() -> None:
        # Stateless: the task ids carry no session marker, so any client session (on any
        # replica) that knows an id may use it, as behind a load balancer.
        await server.run(to_server_receive, to_client_send, server.create_initialization_options(), stateless=True)

    group.start_soon(run)
    client = await stack.enter_async_context(ClientSession(to_client_receive, to_server_send))
    await client.initialize()
    return client


@asynccontextmanager
async def two_replicas(cursorlog: str, owner: str) -> AsyncIterator[tuple[ClientSession, ClientSession]]:
    a = replica(CursorlogTaskStore(cursorlog, owner=owner))
    b = replica(CursorlogTaskStore(cursorlog, owner=owner))
    async with anyio.create_task_group() as group, AsyncExitStack() as stack:
        yield await connect(a, group, stack), await connect(b, group, stack)
        group.cancel_scope.cancel()


async def test_a_task_started_on_replica_a_is_polled_and_read_on_replica_b(cursorlog: str, owner: str) -> None:
    async with two_replicas(cursorlog, owner) as (on_a, on_b):
        created = await on_a.experimental.call_tool_as_task("greet", {"name": "Ada"})
        task_id = created.task.taskId
        # Found at once on the other replica (linearizable get; durable before CreateTaskResult).
        first = await on_b.experimental.get_task(task_id)
        assert first.taskId == task_id
        with anyio.fail_after(10):
            statuses = [s.status async for s in on_b.experimental.poll_task(task_id)]
        assert statuses[-1] == "completed"
        result = await on_b.experimental.get_task_result(task_id, CallToolResult)
        assert result.content == [TextContent(type="text", text="Hello, Ada!")]


async def test_a_cancel_through_replica_b_is_what_replica_a_reports(cursorlog: str, owner: str) -> None:
    async with two_replicas(cursorlog, owner) as (on_a, on_b):
        task_id = (await on_a.experimental.call_tool_as_task("wait_forever", {})).task.taskId
        cancelled = await on_b.experimental.cancel_task(task_id)
        assert cancelled.status == "cancelled"
        seen = await on_a.experimental.get_task(task_id)
        assert seen.status == "cancelled"
