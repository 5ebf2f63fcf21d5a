"""The append coalescer: many callers, few RPCs, each caller its own durable answer."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import grpc
import pytest

from cursorlog_mcp import AppendBatcher, CursorlogClient
from cursorlog_mcp._proto import cursorlog_pb2 as pb
from cursorlog_mcp.errors import CursorlogFailedPrecondition, CursorlogNotFound, CursorlogUnavailable

from .harness import CursorlogServer

pytestmark = pytest.mark.anyio


async def open_streams(client: CursorlogClient, n: int) -> list[tuple[str, int]]:
    """``n`` streams, spread over ``n // 4 + 1`` sessions (one process serves many sessions)."""
    out = []
    sessions = [f"b-{uuid.uuid4().hex}" for _ in range(n // 4 + 1)]
    for i in range(n):
        session = sessions[i % len(sessions)]
        epoch = (await client.open_session(session)).epoch
        out.append((session, (await client.open_stream(session, epoch)).stream))
    return out


def event(text: str) -> bytes:
    return text.encode()


async def test_concurrent_appends_share_rpcs_and_each_caller_gets_its_own_id(client: CursorlogClient) -> None:
    streams = await open_streams(client, 64)
    batcher = AppendBatcher(client)
    answers = await asyncio.gather(
        *(batcher.append(s, st, event(f"e{i}"), kind="n", expected_next_seq=1) for i, (s, st) in enumerate(streams))
    )
    assert batcher.stats.items == 64
    assert batcher.stats.rpcs < 64, batcher.stats.batch_sizes
    assert batcher.stats.batch_sizes[0] == 1, "the first item leaves at once: nothing was in flight"
    for (session, stream), answer in zip(streams, answers, strict=True):
        assert (answer.stream, answer.first_seq, answer.duplicate) == (stream, 1, False)
        epoch = (await client.open_session(session)).epoch
        assert list(answer.event_ids) == [f"{epoch}-{stream}-1"]
    # What each caller was told is what cursorlog stored for it.
    for i, (session, _stream) in enumerate(streams[:8]):
        read = [m async for m in client.read(session, answers[i].event_ids[0].rsplit("-", 1)[0] + "-0", follow=False)]
        stored = [e for m in read if m.WhichOneof("item") == "events" for e in m.events.events]
        assert [e.payload for e in stored] == [f"e{i}".encode()]


async def test_an_idle_append_is_sent_at_once(client: CursorlogClient) -> None:
    ((session, stream),) = await open_streams(client, 1)
    batcher = AppendBatcher(client)
    for seq in (1, 2, 3):
        answer = await batcher.append(session, stream, event(f"s{seq}"), kind="n", expected_next_seq=seq)
        assert answer.first_seq == seq
    assert batcher.stats.batch_sizes == [1, 1, 1]


async def test_a_failed_item_fails_exactly_its_caller(client: CursorlogClient) -> None:
    streams = await open_streams(client, 6)
    done_session, done_stream = streams[0]
    await client.complete(done_session, done_stream, pb.NewEvent(kind="r", payload=b"end"), expected_next_seq=1)
    batcher = AppendBatcher(client)
    calls = [batcher.append(s, st, event("x"), kind="n", expected_next_seq=1) for s, st in streams]
    calls.append(batcher.append(streams[1][0], 987654321, event("x"), kind="n", expected_next_seq=1))
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[0], CursorlogFailedPrecondition), results[0]  # terminated stream
    assert isinstance(results[-1], CursorlogNotFound), results[-1]  # unknown stream
    for ok in results[1:-1]:
        assert isinstance(ok, pb.AppendResponse) and ok.first_seq == 1, ok


async def test_completions_and_appends_of_many_sessions_mix_in_one_batch(client: CursorlogClient) -> None:
    streams = await open_streams(client, 10)
    batcher = AppendBatcher(client)
    calls: list[Any] = []
    for i, (s, st) in enumerate(streams):
        if i % 2:
            calls.append(batcher.complete(s, st, event("result"), kind="r", correlation=None, expected_next_seq=1))
        else:
            calls.append(batcher.append(s, st, event("progress"), kind="n", expected_next_seq=1))
    results = await asyncio.gather(*calls)
    for i, r in enumerate(results):
        if i % 2:
            assert isinstance(r, pb.TerminateResponse) and r.state == pb.STREAM_STATE_COMPLETED
        else:
            assert isinstance(r, pb.AppendResponse) and r.first_seq == 1


class FlakyClient:
    """A client whose first two ``AppendBatch`` calls fail as if the connection broke after the
    write (so an unsafe retry would write twice)."""

    def __init__(self, real: CursorlogClient) -> None:
        self.real = real
        self.failures = 2
        self.router = real.router

    def retry_delays_s(self) -> tuple[float, ...]:
        return self.real.retry_delays_s()

    async def append_batch(self, request: pb.AppendBatchRequest) -> pb.AppendBatchResponse:
        if self.failures:
            self.failures -= 1
            # The batch reached cursorlog before the connection broke: the retry is a duplicate.
            await self.real.append_batch(request)
            raise CursorlogUnavailable("AppendBatch", grpc.StatusCode.UNAVAILABLE, "connection reset")
        return await self.real.append_batch(request)


async def test_unavailable_retries_only_what_can_be_retried_safely(client: CursorlogClient) -> None:
    (a, b) = await open_streams(client, 2)
    batcher = AppendBatcher(FlakyClient(client))  # type: ignore[arg-type]
    retried, unsafe = await asyncio.gather(
        batcher.append(a[0], a[1], event("r"), kind="n", expected_next_seq=1),
        batcher.append(b[0], b[1], event("u"), kind="n", expected_next_seq=None),
        return_exceptions=True,
    )
    assert isinstance(retried, pb.AppendResponse) and retried.first_seq == 1 and retried.duplicate, retried
    assert isinstance(unsafe, CursorlogUnavailable), unsafe
    assert batcher.stats.retries == 1


async def test_client_closes_its_channel_when_the_event_loop_changes(cursorlog: CursorlogServer) -> None:
    shared = CursorlogClient(cursorlog.address)
    first: list[Any] = []

    def in_another_loop() -> None:
        async def use() -> None:
            await shared.open_session(f"c-{uuid.uuid4().hex}")
            first.append(shared._channels[shared.router.current])  # noqa: SLF001

        asyncio.run(use())

    await asyncio.get_running_loop().run_in_executor(None, in_another_loop)
    await shared.open_session(f"c-{uuid.uuid4().hex}")  # this loop: a new channel
    assert shared.channels_opened == 2
    assert shared._channels[shared.router.current] is not first[0]  # noqa: SLF001
    await asyncio.sleep(0)
    await shared.close()  # also waits for the previous channel's close
    stale = first[0]
    with pytest.raises(Exception):  # noqa: B017 - grpc raises its own error types for a closed channel
        await stale.unary_unary("/cursorlog.v1.CursorLog/Stats")(b"", timeout=1)
