"""CursorlogTaskStore against a real cursorlog: the mapping of docs/TASKS-DESIGN.md §4.3, and two
store instances (two replicas) sharing tasks."""

from __future__ import annotations

import anyio
import pytest
from mcp.shared.experimental.tasks.context import TaskContext
from mcp.types import CallToolResult, CreateMessageResult, ElicitResult, Result, TaskMetadata, TextContent

from cursorlog_mcp_tasks import CursorlogTaskStore, result_from_json, result_to_json

pytestmark = pytest.mark.anyio


def _result(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)])


async def test_a_task_created_and_completed_on_one_replica_is_read_on_another(cursorlog: str, owner: str) -> None:
    a = CursorlogTaskStore(cursorlog, owner=owner)
    b = CursorlogTaskStore(cursorlog, owner=owner)
    other = CursorlogTaskStore(cursorlog, owner=owner + "-other")
    task = await a.create_task(TaskMetadata(ttl=60_000))

    seen = await b.get_task(task.taskId)
    assert seen is not None and seen.status == "working" and seen.ttl == 60_000 and seen.pollInterval == 500

    # The SDK's TaskContext.complete: store_result, then update_task(status="completed").
    context = TaskContext(task, a)
    await context.complete(_result("done"))
    assert context.task.status == "completed"

    done = await b.get_task(task.taskId)
    assert done is not None and done.status == "completed"
    assert await b.get_result(task.taskId) == _result("done")
    listed, cursor = await b.list_tasks()
    assert [t.taskId for t in listed] == [task.taskId] and cursor is None

    # Another owner sees nothing, and cannot touch it.
    assert await other.get_task(task.taskId) is None
    assert await other.get_result(task.taskId) is None
    assert await other.list_tasks() == ([], None)
    assert await other.delete_task(task.taskId) is False
    with pytest.raises(ValueError, match="not found"):
        await other.update_task(task.taskId, status="cancelled")
    with pytest.raises(ValueError, match="not found"):
        await other.store_result(task.taskId, _result("stolen"))

    assert await b.delete_task(task.taskId) is True
    assert await a.get_task(task.taskId) is None
    assert await a.delete_task(task.taskId) is False


async def test_the_result_is_stored_with_the_terminal_status_in_one_write(cursorlog: str, owner: str) -> None:
    store = CursorlogTaskStore(cursorlog, owner=owner)
    task = await store.create_task(TaskMetadata(ttl=60_000))
    await store.store_result(task.taskId, _result("r"))
    ended = await store.get_task(task.taskId)
    assert ended is not None and ended.status == "completed"
    # Restating the end is harmless; any other status after it is refused, as the SDK's store does.
    again = await store.update_task(task.taskId, status="completed")
    assert again.status == "completed"
    for status in ("working", "failed", "cancelled"):
        with pytest.raises(ValueError, match="Cannot transition from terminal status 'completed'"):
            await store.update_task(task.taskId, status=status)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Cannot transition from terminal status 'completed'"):
        await store.store_result(task.taskId, _result("second"))
    assert await store.get_result(task.taskId) == _result("r")


async def test_a_cancel_on_one_replica_makes_the_other_replicas_completion_fail(cursorlog: str, owner: str) -> None:
    a = CursorlogTaskStore(cursorlog, owner=owner)
    b = CursorlogTaskStore(cursorlog, owner=owner)
    task = await a.create_task(TaskMetadata(ttl=60_000))
    await b.update_task(task.taskId, status="cancelled")
    with pytest.raises(ValueError, match="Cannot transition from terminal status 'cancelled'"):
        await a.store_result(task.taskId, _result("late"))
    assert await b.get_result(task.taskId) is None
    final = await a.get_task(task.taskId)
    assert final is not None and final.status == "cancelled"


async def test_wait_for_update_wakes_on_a_change_made_by_another_replica(cursorlog: str, owner: str) -> None:
    a = CursorlogTaskStore(cursorlog, owner=owner)
    b = CursorlogTaskStore(cursorlog, owner=owner)
    task = await a.create_task(TaskMetadata(ttl=60_000))
    assert await a.get_task(task.taskId) is not None
    woke = anyio.Event()

    async def waiter() -> None:
        await a.wait_for_update(task.taskId)
        woke.set()

    async with anyio.create_task_group() as group:
        group.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        assert not woke.is_set()
        await b.update_task(task.taskId, status="input_required", status_message="need a name")
        with anyio.fail_after(10):
            await woke.wait()
    now = await a.get_task(task.taskId)
    assert now is not None and now.status == "input_required" and now.statusMessage == "need a name"
    # A change made between a's last look and its wait is not lost: the wait starts from the
    # version a saw, so it returns at once.
    await b.update_task(task.taskId, status="working")
    with anyio.fail_after(10):
        await a.wait_for_update(task.taskId)


async def test_wait_for_update_on_an_ended_task_returns_and_on_an_unknown_one_raises(
    cursorlog: str, owner: str
) -> None:
    store = CursorlogTaskStore(cursorlog, owner=owner)
    task = await store.create_task(TaskMetadata(ttl=60_000))
    await store.update_task(task.taskId, status="failed", status_message="boom")
    with anyio.fail_after(10):
        await store.wait_for_update(task.taskId)
    with pytest.raises(ValueError, match="not found"):
        await store.wait_for_update("no-such-task")


async def test_status_message_only_updates_keep_the_status(cursorlog: str, owner: str) -> None:
    store = CursorlogTaskStore(cursorlog, owner=owner)
    task = await store.create_task(TaskMetadata(ttl=None))
    assert task.ttl is not None and task.ttl > 0  # unlimited is clamped to the server's maximum
    await store.update_task(task.taskId, status="input_required")
    updated = await store.update_task(task.taskId, status_message="still waiting")
    assert updated.status == "input_required" and updated.statusMessage == "still waiting"
    with pytest.raises(ValueError, match="already exists"):
        await store.create_task(TaskMetadata(ttl=1000), task.taskId)


async def test_pages_follow_creation_order_and_a_bad_cursor_is_invalid(cursorlog: str, owner: str) -> None:
    store = CursorlogTaskStore(cursorlog, owner=owner, page_size=2)
    ids = [(await store.create_task(TaskMetadata(ttl=60_000), f"t{i}")).taskId for i in range(5)]
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        page, cursor = await store.list_tasks(cursor)
        seen += [t.taskId for t in page]
        pages += 1
        if cursor is None:
            break
    assert seen == ids and pages == 3
    with pytest.raises(ValueError, match="Invalid cursor"):
        await store.list_tasks("%%% not a cursor")


def test_results_come_back_as_the_sdk_type_they_were() -> None:
    samples: list[Result] = [
        _result("x"),
        CreateMessageResult(role="assistant", content=TextContent(type="text", text="hi"), model="m"),
        ElicitResult(action="accept", content={"name": "n"}),
    ]
    for sample in samples:
        back = result_from_json(result_to_json(sample))
        assert type(back) is type(sample) and back == sample
    plain = result_from_json(b'{"anything": 1}')
    assert type(plain) is Result and plain.model_dump()["anything"] == 1
