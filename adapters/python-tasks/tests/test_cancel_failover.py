"""A cancel reaches the work across a failover of cursorlog: a 3-member cluster, a task whose
work waits forever started through replica A (``store.cancellable``, its watch on the leader);
the leader is SIGKILLed; once a new leader is elected the task is cancelled through replica B.
A's watch must have re-opened on the new leader (from the last version it saw) and stop the
work; before, the broken watch was logged and given up, and the cancel never reached the work.
And ``wait_for_update`` across the same failover returns at the next change, not UNAVAILABLE."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.types import TaskMetadata

from cursorlog_mcp_tasks import CursorlogTaskStore, CursorlogTaskStoreError
from cursorlog_mcp_tasks._proto import tasks_pb2 as pb

from .harness import CursorlogCluster
from .test_cancel import Work, replica
from .test_replicas import connect

pytestmark = pytest.mark.anyio

GUARD_S = 60  # hang guards only: events decide


async def leader_of(addresses: list[str]) -> str:
    """The member that leads now: the one a write (a probe task) succeeded on, tried on each
    live member in turn until an election is over."""
    with anyio.fail_after(GUARD_S):
        while True:
            for address in addresses:
                probe = CursorlogTaskStore(address, owner=f"probe:{uuid.uuid4().hex}", timeout_s=5)
                try:
                    await probe.create_task(TaskMetadata(ttl=60_000))
                    return probe.client._current
                except CursorlogTaskStoreError:
                    pass  # down, or no leader yet
                finally:
                    await probe.close()
            await anyio.sleep(0.05)  # a retry pace while the election runs, not a synchronisation


def watched(store: CursorlogTaskStore) -> threading.Event:
    """Set once A's watch has had a response (it is open on a member): set on the gRPC loop."""
    seen = threading.Event()
    original = store.client.watch_until

    async def watch_until(request: pb.WatchTaskRequest, done: Callable[[pb.GetTaskResponse], bool]) -> Any:
        def noting(response: pb.GetTaskResponse) -> bool:
            seen.set()
            return done(response)

        return await original(request, noting)

    store.client.watch_until = watch_until  # type: ignore[method-assign]
    return seen


async def test_a_cancel_after_the_leader_dies_still_stops_the_work(tmp_path: Path, owner: str) -> None:
    cluster = CursorlogCluster(tmp_path)
    try:
        leader = await leader_of(cluster.addresses)
        store_a = CursorlogTaskStore(cluster.list, owner=owner)
        seen = watched(store_a)
        work = Work()
        async with anyio.create_task_group() as group, AsyncExitStack() as stack:
            on_a = await connect(replica(store_a, work), group, stack)
            task_id = (await on_a.experimental.call_tool_as_task("wait", {})).task.taskId
            with anyio.fail_after(GUARD_S):
                await work.started.wait()
            assert await anyio.to_thread.run_sync(seen.wait, GUARD_S), "A's watch never opened"
            assert store_a.client._current == leader  # A's calls and its watch are on the leader

            cluster.kill(leader)
            survivors = [a for a in cluster.addresses if a != leader]
            new_leader = await leader_of(survivors)
            assert new_leader != leader

            store_b = CursorlogTaskStore([new_leader, *survivors], owner=owner)
            on_b = await connect(replica(store_b, Work()), group, stack)
            assert (await on_b.experimental.cancel_task(task_id)).status == "cancelled"
            with anyio.fail_after(GUARD_S):
                await work.interrupted.wait()
            assert work.flag_when_interrupted is True
            with anyio.fail_after(GUARD_S):
                await work.returned.wait()
            assert store_a.client.open_watches == 0  # the re-opened watch ended with the work
            # A's client moved on with its watch: its own calls reach the new leader too.
            assert (await on_a.experimental.get_task(task_id)).status == "cancelled"
            assert await store_a.get_result(task_id) is None
            group.cancel_scope.cancel()
        await store_b.close()
        await store_a.close()
    finally:
        cluster.stop()


async def test_a_wait_for_update_across_a_leader_kill_returns_at_the_next_change(tmp_path: Path, owner: str) -> None:
    """``wait_for_update`` (what the SDK's ``tasks/result`` waits with) on A while the leader
    is SIGKILLed: its watch re-opens on the new leader from the version it had, and returns at
    the change made through B; before, the broken watch raised the store's UNAVAILABLE error."""
    cluster = CursorlogCluster(tmp_path)
    try:
        leader = await leader_of(cluster.addresses)
        store_a = CursorlogTaskStore(cluster.list, owner=owner)
        task = await store_a.create_task(TaskMetadata(ttl=60_000))
        assert store_a.client._current == leader
        returned = anyio.Event()
        failure: list[BaseException] = []

        async def wait() -> None:
            try:
                await store_a.wait_for_update(task.taskId)
            except Exception as e:  # noqa: BLE001 - reported by the assertion below
                failure.append(e)
            returned.set()

        async with anyio.create_task_group() as group:
            group.start_soon(wait)
            with anyio.fail_after(GUARD_S):
                while store_a.client.open_watches == 0:  # polls a condition: the watch is open
                    await anyio.sleep(0.01)
            cluster.kill(leader)
            survivors = [a for a in cluster.addresses if a != leader]
            new_leader = await leader_of(survivors)
            store_b = CursorlogTaskStore([new_leader, *survivors], owner=owner)
            assert not returned.is_set(), f"returned before the change: {failure}"
            changed = await store_b.update_task(task.taskId, status_message="changed through B")
            with anyio.fail_after(GUARD_S):
                await returned.wait()
            assert failure == [], f"wait_for_update failed across the failover: {failure}"
            seen = await store_a.get_task(task.taskId)
            assert seen is not None and seen.statusMessage == "changed through B"
            assert changed.statusMessage == "changed through B"
            assert store_a.client.open_watches == 0
        await store_b.close()
        await store_a.close()
    finally:
        cluster.stop()
