"""Funnels the appends of every session a process serves into shared ``AppendBatch`` calls.

Kafka-producer style: a caller hands in one append or completion and awaits its own durable
answer. When no batch is in flight the item is sent at once (no added latency when idle);
items that arrive while ``max_in_flight`` batches are on the wire wait and leave together in
the next one, so under load many sessions' events share one RPC and one group commit.

Each item is answered alone: cursorlog's per-item ``Failure`` becomes a typed error raised in
exactly that caller. When the whole call fails with UNAVAILABLE, items that carry an
``expected_next_seq`` are sent again (cursorlog recognises a written retry as a duplicate and
returns the original ids); items without one (the shared standalone stream) cannot be retried
safely and fail.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field

import grpc

from ._proto import cursorlog_pb2 as pb
from .client import CursorlogClient
from .errors import CursorlogError, CursorlogUnavailable, from_failure
from .routing import leader_in_message

logger = logging.getLogger("cursorlog_mcp")

MAX_ITEMS = 4096
"""cursorlog's ``batch_items_max``."""

MAX_BATCH_BYTES = 4 * 1024 * 1024
"""Payload bytes per batch, well under the 16 MiB gRPC message limit of both sides."""


@dataclass(slots=True)
class _Item:
    """One append or completion, as plain fields: its protobuf is built once, in the batch."""

    session: str
    stream: int
    kind: str
    payload: bytes
    correlation: str | None
    complete: bool
    expected_next_seq: int | None
    future: asyncio.Future[pb.BatchResult]
    attempts: int = 0

    @property
    def retryable(self) -> bool:
        return self.expected_next_seq is not None

    def fill(self, item: pb.BatchItem) -> None:
        if self.complete:
            done = item.complete
            done.session = self.session
            done.stream = self.stream
            if self.expected_next_seq is not None:
                done.expected_next_seq = self.expected_next_seq
            done.terminal.kind = self.kind
            done.terminal.payload = self.payload
            if self.correlation is not None:
                done.terminal.correlation = self.correlation
        else:
            append = item.append
            append.session = self.session
            append.stream = self.stream
            if self.expected_next_seq is not None:
                append.expected_next_seq = self.expected_next_seq
            event = append.events.add()
            event.kind = self.kind
            event.payload = self.payload


@dataclass
class BatcherStats:
    """Counters, for tests and benchmarks."""

    rpcs: int = 0
    items: int = 0
    retries: int = 0
    batch_sizes: list[int] = field(default_factory=list)


def _resend(entry: _Item, result: pb.BatchResult, budget: int) -> bool:
    """Whether an item answered with an UNAVAILABLE ``Failure`` inside the batch is sent again:
    only one that carries ``expected_next_seq`` (a resend of one that was applied is answered
    ``duplicate``), within the retry budget."""
    return (
        result.WhichOneof("result") == "failure"
        and result.failure.code == grpc.StatusCode.UNAVAILABLE.value[0]
        and entry.retryable
        and entry.attempts < budget
        and not entry.future.done()
    )


class AppendBatcher:
    """Coalesces appends and completions into ``AppendBatch`` calls (see module docstring)."""

    def __init__(self, client: CursorlogClient, *, max_in_flight: int = 1, max_items: int = MAX_ITEMS) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        if not 1 <= max_items <= MAX_ITEMS:
            raise ValueError(f"max_items must be between 1 and {MAX_ITEMS}")
        self._client = client
        self._max_in_flight = max_in_flight
        self._max_items = max_items
        self._pending: deque[_Item] = deque()
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._retrying = 0
        self.stats = BatcherStats()

    async def append(
        self, session: str, stream: int, payload: bytes, *, kind: str, expected_next_seq: int | None
    ) -> pb.AppendResponse:
        """Appends one event; returns once it is durable (or raises its typed error)."""
        result = await self._submit(session, stream, kind, payload, None, False, expected_next_seq)
        if result.WhichOneof("result") != "appended":
            raise CursorlogError("AppendBatch", grpc.StatusCode.INTERNAL, "append answered as a completion")
        return result.appended

    async def complete(
        self,
        session: str,
        stream: int,
        payload: bytes,
        *,
        kind: str,
        correlation: str | None,
        expected_next_seq: int | None,
    ) -> pb.TerminateResponse:
        """Writes the stream's terminal frame; returns once it is durable."""
        result = await self._submit(session, stream, kind, payload, correlation, True, expected_next_seq)
        if result.WhichOneof("result") != "completed":
            raise CursorlogError("AppendBatch", grpc.StatusCode.INTERNAL, "completion answered as an append")
        return result.completed

    async def _submit(
        self,
        session: str,
        stream: int,
        kind: str,
        payload: bytes,
        correlation: str | None,
        complete: bool,
        expected_next_seq: int | None,
    ) -> pb.BatchResult:
        future: asyncio.Future[pb.BatchResult] = asyncio.get_running_loop().create_future()
        self._pending.append(_Item(session, stream, kind, payload, correlation, complete, expected_next_seq, future))
        self._pump()
        # A caller cancelled here cancels its future; the item may still be written (it may
        # already be on the wire), which is what a cancelled unary Append does too.
        result = await future
        if result.WhichOneof("result") == "failure":
            raise from_failure("Complete" if complete else "Append", result.failure.code, result.failure.message)
        return result

    def _pump(self) -> None:
        while self._pending and self._in_flight < self._max_in_flight:
            batch = self._take()
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[_Item]:
        batch: list[_Item] = []
        size = 0
        while self._pending and len(batch) < self._max_items:
            nxt = self._pending[0]
            if batch and size + len(nxt.payload) > MAX_BATCH_BYTES:
                break
            batch.append(self._pending.popleft())
            size += len(nxt.payload)
        return batch

    async def _send(self, batch: list[_Item]) -> None:
        try:
            self.stats.rpcs += 1
            self.stats.items += len(batch)
            self.stats.batch_sizes.append(len(batch))
            request = pb.AppendBatchRequest()
            items = request.items
            for entry in batch:
                entry.fill(items.add())
            try:
                response = await self._client.append_batch(request)
            except CursorlogError as e:
                self._failed(batch, e)
                return
            except BaseException as e:  # cancelled (loop shutting down) or a bug: no caller may hang
                for entry in batch:
                    if not entry.future.done():
                        entry.future.set_exception(e if isinstance(e, Exception) else asyncio.CancelledError())
                raise
            if len(response.results) != len(batch):
                error = CursorlogError(
                    "AppendBatch",
                    grpc.StatusCode.INTERNAL,
                    f"{len(response.results)} results for {len(batch)} items",
                )
                for entry in batch:
                    entry.future.set_exception(error)
                return
            again: list[_Item] = []
            leader: str | None = None
            for entry, result in zip(batch, response.results, strict=True):
                if _resend(entry, result, len(self._client.retry_delays_s())):
                    again.append(entry)
                    leader = leader or leader_in_message(result.failure.message)
                elif not entry.future.done():
                    entry.future.set_result(result)
            if again:
                # A replicated cursorlog refused these items on this member (not the leader, or
                # leadership lost before commit): resend them where the leader is.
                wait = self._client.router.failed(self._client.router.current, leader)
                self._retry_later(again, wait, "refused by a non-leader")
        finally:
            self._in_flight -= 1
            self._pump()

    def _failed(self, batch: list[_Item], error: CursorlogError) -> None:
        retry = [e for e in batch if isinstance(error, CursorlogUnavailable) and e.retryable]
        for entry in batch:
            if entry not in retry and not entry.future.done():
                entry.future.set_exception(error)
        if not retry:
            return
        delays = self._client.retry_delays_s()
        attempt = max(e.attempts for e in retry)
        if attempt >= len(delays):
            for entry in retry:
                if not entry.future.done():
                    entry.future.set_exception(error)
            return
        self._retry_later(retry, delays[attempt], error.details)

    def _retry_later(self, entries: list[_Item], delay: float, why: str) -> None:
        """Requeues ``entries`` (each carries ``expected_next_seq``) after ``delay`` seconds."""
        for entry in entries:
            entry.attempts += 1
        self.stats.retries += 1
        logger.warning("cursorlog AppendBatch unavailable (%s); retrying %d items in %.2fs", why, len(entries), delay)
        self._retrying += 1
        asyncio.get_running_loop().call_later(delay, self._requeue, entries)

    def _requeue(self, entries: list[_Item]) -> None:
        self._retrying -= 1
        self._pending.extendleft(reversed(entries))
        self._pump()

    async def drain(self) -> None:
        """Waits until every submitted item is answered."""
        while self._tasks or self._pending or self._retrying:
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
            else:
                await asyncio.sleep(0.01)
