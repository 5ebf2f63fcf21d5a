"""One store used from event loops that come and go (the SDK's tests run each test in its own
loop; a worker may run one loop per job): no gRPC callback may land on a closed loop."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import anyio
from mcp.types import TaskMetadata

from cursorlog_mcp_tasks import CursorlogTaskStore


def test_stores_outlive_the_event_loops_that_used_them(cursorlog: str, owner: str) -> None:
    shared = CursorlogTaskStore(cursorlog, owner=owner)
    problems: list[str] = []

    async def one_loop(round_: int) -> None:
        def record(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            problems.append(f"round {round_}: {context.get('message')} {context.get('exception')!r}")

        asyncio.get_running_loop().set_exception_handler(record)
        gc.collect()  # the stores of earlier loops (and their channels) go now, on this loop
        for store in (shared, CursorlogTaskStore(cursorlog, owner=owner)):
            await use(store)
        await asyncio.sleep(0.05)  # lets a stray callback of an earlier loop's channel show up

    async def use(store: CursorlogTaskStore) -> None:
        task = await store.create_task(TaskMetadata(ttl=60_000))
        assert await store.get_task(task.taskId) is not None
        with anyio.move_on_after(0.05):
            await store.wait_for_update(task.taskId)  # a watch cancelled mid-stream
        await store.update_task(task.taskId, status="completed")

    for round_ in range(15):
        asyncio.run(one_loop(round_))
    assert problems == []
