"""End to end against a replicated cursorlog (issue 19 item 6): three real members, replicas
configured with the member list, the SDK's own client. The cursorlog LEADER is SIGKILLed in
the middle of a streaming tool call; the client must still get every progress notification
exactly once, and the result."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from cursorlog_mcp import CursorlogClient, CursorlogEventStore
from cursorlog_mcp._proto import cursorlog_pb2 as pb

from .harness import CursorlogCluster, Replica, SwitchableProxy
from .test_e2e import Seen, call_slow_count, executions, mcp_session, text_of
from .test_store import Bound, progress, result, stream_of

pytestmark = pytest.mark.anyio

STEPS = 30


class Setup:
    def __init__(self, workdir: Path) -> None:
        self.exec_log = workdir / "executions.log"
        self.cluster = CursorlogCluster(workdir)
        self.replicas: dict[str, Replica] = {}
        self.proxy = SwitchableProxy()
        try:
            for name in ("A", "B"):
                self.replicas[name] = Replica(name, self.cluster.target, workdir, exec_log=self.exec_log)
        except BaseException:
            self.close()
            raise

    async def kill_leader(self) -> str:
        """SIGKILLs the member that leads now (the one an idempotent OpenSession succeeded on)."""
        probe = CursorlogClient(self.cluster.target, timeout_s=30)
        try:
            await probe.open_session(f"probe-{uuid.uuid4().hex}")
            leader = probe.router.current
        finally:
            await probe.close()
        self.cluster.kill(leader)
        return leader

    def close(self) -> None:
        self.proxy.close()
        for replica in self.replicas.values():
            replica.kill()
        self.cluster.stop()


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    s = Setup(tmp_path)
    try:
        yield s
    finally:
        s.close()


def resumes(log: str, session: str) -> list[str]:
    """The resumes of request streams (the GET stream's own reconnects are not counted)."""
    return re.findall(rf"resume session={session} cursor=(\S+) verdict=.*stream_kind=request", log)


async def test_the_producing_replica_rides_out_a_leader_kill(setup: Setup) -> None:
    a = setup.replicas["A"]
    setup.proxy.route(a.port)
    call_id = uuid.uuid4().hex
    seen = Seen()
    fifth = anyio.Event()
    at_kill: list[int] = []

    async def on_progress(value: float) -> None:
        if value >= 5:
            fifth.set()

    async with mcp_session(setup.proxy.url) as (session, _ids):
        await session.initialize()
        async with anyio.create_task_group() as tg:

            async def kill() -> None:
                await fifth.wait()
                await setup.kill_leader()
                at_kill.append(len(seen.progress))

            tg.start_soon(kill)
            with anyio.fail_after(90):
                result = await call_slow_count(session, call_id, seen, steps=STEPS, delay_s=0.05, on_progress=on_progress)

    assert text_of(result) == f"{call_id}: counted to {STEPS} on A"
    assert seen.progress == [float(i) for i in range(1, STEPS + 1)], "every progress notification exactly once"
    assert at_kill and at_kill[0] < STEPS, f"the leader died mid-call (after {at_kill} of {STEPS})"
    assert executions(setup.exec_log, call_id) == [f"A slow_count {call_id}"]


async def test_a_read_follow_is_re_resolved_on_the_new_leader(setup: Setup) -> None:
    """The client loses A and resumes on B, whose Read(follow) streams A's events from
    cursorlog; the leader dies while B follows: B re-opens the Read on the new leader from the
    last event it delivered, and the client never has to resume again."""
    a, b = setup.replicas["A"], setup.replicas["B"]
    setup.proxy.route(a.port)
    call_id = uuid.uuid4().hex
    seen = Seen()
    fifth = anyio.Event()
    followed = anyio.Event()
    cut_at: list[int] = []
    at_kill: list[int] = []

    async def on_progress(value: float) -> None:
        if value >= 5 and not fifth.is_set():
            setup.proxy.pause()
            setup.proxy.cut()
            cut_at.append(int(value))
            fifth.set()
            setup.proxy.route(b.port)
        elif cut_at and value >= cut_at[0] + 5:
            followed.set()

    async with mcp_session(setup.proxy.url) as (session, ids):
        await session.initialize()
        async with anyio.create_task_group() as tg:

            async def kill() -> None:
                await followed.wait()
                await setup.kill_leader()
                at_kill.append(len(seen.progress))

            tg.start_soon(kill)
            with anyio.fail_after(90):
                result = await call_slow_count(session, call_id, seen, steps=STEPS, delay_s=0.05, on_progress=on_progress)

    assert text_of(result) == f"{call_id}: counted to {STEPS} on A"
    assert seen.progress == [float(i) for i in range(1, STEPS + 1)], "every progress notification exactly once"
    assert at_kill and at_kill[0] < STEPS, f"the leader died mid-call (after {at_kill} of {STEPS})"
    assert executions(setup.exec_log, call_id) == [f"A slow_count {call_id}"]
    sid = ids["session"]
    assert len(resumes(a.log_text(), sid)) + len(resumes(b.log_text(), sid)) == 1, "one resume: the cut only"
    assert "cursorlog Read at" in b.log_text() and "re-opening at" in b.log_text(), "B's Read was re-opened"


LEASE_MS = 1_500


async def test_a_lease_renewal_that_lands_on_a_follower_after_a_failover_keeps_the_call_alive(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 30 item 2. A producer's store holds a stream with a short lease; its member list is
    the leader L, then a member F that cannot win the next election (it misses a write: killed
    before it, restarted after L is killed). L is SIGKILLed, so the store's next renewal lands on
    F, a follower, which answers ``KeepAlive`` UNAVAILABLE naming the new leader: the renewal is
    followed there, and after three leases with no append the stream is still open and the
    producer's next event is stored. (When a follower answered OK and renewed nothing, the new
    leader aborted the stream: "producer lease expired".)"""
    cluster = CursorlogCluster(tmp_path)
    try:
        probe = CursorlogClient(cluster.target, timeout_s=30)
        try:
            await probe.open_session(f"probe-{uuid.uuid4().hex}")
            leader = probe.router.current
        finally:
            await probe.close()
        follower, heir = (a for a in cluster.addresses if a != leader)
        client = CursorlogClient([leader, follower], timeout_s=30)
        store = CursorlogEventStore(client, lease_ms=LEASE_MS)
        try:
            producer = Bound(store)
            first = await producer.store_event("1", progress(1, 1))
            # F misses a write (committed by L and H), so only H can win the election after L.
            cluster.kill(follower)
            await client.open_session(f"missed-{uuid.uuid4().hex}")
            caplog.set_level(logging.INFO, logger="cursorlog_mcp.client")
            cluster.kill(leader)
            cluster.restart(follower)
            probe = CursorlogClient([heir], timeout_s=30)
            try:
                await probe.open_session(f"probe-{uuid.uuid4().hex}")
                assert probe.router.current == heir
            finally:
                await probe.close()
            await anyio.sleep(3 * LEASE_MS / 1000)  # three leases under the new leader, renewals only
            outcome = await client.get_outcome(producer.session_id, stream=stream_of(first))
            assert outcome.outcome.state == pb.STREAM_STATE_OPEN, outcome
            done = await producer.store_event("1", result(1, "ok"))
            assert stream_of(done) == stream_of(first) and done.endswith("-2"), done
            # A renewal did land on the follower, and was followed from there to the new leader.
            refused = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cursorlog KeepAlive")]
            assert any(f"unavailable at {follower} " in m and f"trying {heir} " in m for m in refused), refused
            assert client.router.current == heir
        finally:
            await store.aclose()
            await client.close()
    finally:
        cluster.stop()
