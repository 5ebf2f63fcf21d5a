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

logger = logging.getLogger("cursorlog_mcp")

MAX_ITEMS = 4096
"""cursorlog's ``batch_items_max``."""

MAX_BATCH_BYTES = 4 * 1024 * 1024
"""Payload bytes per batch, well under the 16 MiB gRPC message limit of both sides."""

_RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.4, 0.8)


@dataclass
class _Item:
    item: pb.BatchItem
    size: int
    future: asyncio.Future[pb.BatchResult]
    retryable: bool
    attempts: int = 0


@dataclass
class BatcherStats:
    """Counters, for tests and benchmarks."""

    rpcs: int = 0
    items: int = 0
    retries: int = 0
    batch_sizes: list[int] = field(default_factory=list)


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
        self._unanswered: set[asyncio.Future[pb.BatchResult]] = set()
        self.stats = BatcherStats()

    async def append(
        self, session: str, stream: int, event: pb.NewEvent, *, expected_next_seq: int | None
    ) -> pb.AppendResponse:
        """Appends one event; returns once it is durable (or raises its typed error)."""
        request = pb.AppendRequest(session=session, stream=stream, events=[event])
        if expected_next_seq is not None:
            request.expected_next_seq = expected_next_seq
        result = await self._submit(pb.BatchItem(append=request), len(event.payload), expected_next_seq is not None)
        if result.WhichOneof("result") != "appended":
            raise CursorlogError("AppendBatch", grpc.StatusCode.INTERNAL, "append answered as a completion")
        return result.appended

    async def complete(
        self, session: str, stream: int, terminal: pb.NewEvent, *, expected_next_seq: int | None
    ) -> pb.TerminateResponse:
        """Writes the stream's terminal frame; returns once it is durable."""
        request = pb.CompleteRequest(session=session, stream=stream, terminal=terminal)
        if expected_next_seq is not None:
            request.expected_next_seq = expected_next_seq
        result = await self._submit(
            pb.BatchItem(complete=request), len(terminal.payload), expected_next_seq is not None
        )
        if result.WhichOneof("result") != "completed":
            raise CursorlogError("AppendBatch", grpc.StatusCode.INTERNAL, "completion answered as an append")
        return result.completed

    async def _submit(self, item: pb.BatchItem, size: int, retryable: bool) -> pb.BatchResult:
        loop = asyncio.get_running_loop()
        entry = _Item(item, size, loop.create_future(), retryable)
        self._pending.append(entry)
        self._unanswered.add(entry.future)
        entry.future.add_done_callback(self._settled)
        self._pump()
        result = await asyncio.shield(entry.future)
        if result.WhichOneof("result") == "failure":
            rpc = "Append" if item.WhichOneof("item") == "append" else "Complete"
            raise from_failure(rpc, result.failure.code, result.failure.message)
        return result

    def _settled(self, future: asyncio.Future[pb.BatchResult]) -> None:
        self._unanswered.discard(future)
        if not future.cancelled():
            future.exception()  # retrieved here, so a caller that was cancelled leaves no warning

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
            if batch and size + nxt.size > MAX_BATCH_BYTES:
                break
            batch.append(self._pending.popleft())
            size += nxt.size
        return batch

    async def _send(self, batch: list[_Item]) -> None:
        try:
            self.stats.rpcs += 1
            self.stats.items += len(batch)
            self.stats.batch_sizes.append(len(batch))
            try:
                response = await self._client.append_batch([entry.item for entry in batch])
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
            for entry, result in zip(batch, response.results, strict=True):
                if not entry.future.done():
                    entry.future.set_result(result)
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
        attempt = max(e.attempts for e in retry)
        if attempt >= len(_RETRY_DELAYS_S):
            for entry in retry:
                if not entry.future.done():
                    entry.future.set_exception(error)
            return
        for entry in retry:
            entry.attempts += 1
        self.stats.retries += 1
        delay = _RETRY_DELAYS_S[attempt]
        logger.warning(
            "cursorlog AppendBatch unavailable (%s); retrying %d items in %.2fs", error.details, len(retry), delay
        )
        loop = asyncio.get_running_loop()
        loop.call_later(delay, self._requeue, retry)

    def _requeue(self, entries: list[_Item]) -> None:
        self._pending.extendleft(reversed(entries))
        self._pump()

    async def drain(self) -> None:
        """Waits until every submitted item is answered."""
        while self._unanswered:
            await asyncio.wait(list(self._unanswered))
