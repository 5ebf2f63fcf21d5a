"""A small gRPC client for ``cursorlog.v1.Tasks``: the bearer token on every call, and a
follower's redirect (UNAVAILABLE naming the leader in the ``cursorlog-leader`` header) followed
once. A watch that fails with UNAVAILABLE moves the client on (to the leader named, else to the
next member) for whoever re-opens it.

Every call runs on one private event loop in a daemon thread, whatever loop the caller runs on.
A ``grpc.aio`` channel belongs to the loop that made it, and one left open when its loop closes
gets its callbacks scheduled on a closed loop ("Event loop is closed"); callers whose loops come
and go (the SDK's tests, a worker per request) therefore share one channel on a loop that never
closes. A cancelled caller cancels its call there and returns once it has ended there (its
stream closed), so a cancelled watch holds no server slot after its caller moved on."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import anyio
import grpc

from ._proto import tasks_pb2 as pb
from ._proto import tasks_pb2_grpc as pb_grpc

T = TypeVar("T")

LEADER_HEADER = "cursorlog-leader"

# How long a cancelled caller waits for its call to end on the gRPC loop (a cancel there is
# immediate; the bound only keeps a wedged loop from holding the caller forever).
_CANCEL_WAIT_S = 5.0

_IO_LOCK = threading.Lock()
_IO_LOOP: asyncio.AbstractEventLoop | None = None


def _io_loop() -> asyncio.AbstractEventLoop:
    """The process's gRPC loop, started on first use in a daemon thread."""
    global _IO_LOOP
    with _IO_LOCK:
        if _IO_LOOP is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="cursorlog-tasks-grpc", daemon=True)
            thread.start()
            _IO_LOOP = loop
        return _IO_LOOP


async def _on_io_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Runs ``coro`` on the gRPC loop and awaits it from the caller's loop. A cancelled caller
    cancels ``coro`` there and waits (shielded, bounded) until it has ended, so its ``finally``
    blocks (a stream's cancel) ran before the caller moves on."""
    caller = asyncio.get_running_loop()
    ended = caller.create_future()

    def mark_ended() -> None:
        if not ended.done():
            ended.set_result(None)

    async def run() -> T:
        try:
            return await coro
        finally:
            try:
                caller.call_soon_threadsafe(mark_ended)
            except RuntimeError:
                pass  # the caller's loop is closed: nobody waits

    future = asyncio.run_coroutine_threadsafe(run(), _io_loop())
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        future.cancel()
        with anyio.move_on_after(_CANCEL_WAIT_S, shield=True):
            await ended
        raise


class TasksClient:
    """Calls the Tasks service of the cursorlog at ``target`` (``host:port``, or several members
    as a comma-separated string or a sequence: the first is tried first, a redirect moves on)."""

    def __init__(self, target: str | Sequence[str], *, token: str | None = None, timeout_s: float = 10.0) -> None:
        members = [m.strip() for m in target.split(",")] if isinstance(target, str) else [m.strip() for m in target]
        members = [m for m in members if m]
        if not members:
            raise ValueError("cursorlog target must name at least one host:port")
        self._members = members
        self._current = members[0]
        self._token = token
        self.timeout_s = timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}  # touched on the gRPC loop only
        self._open_watches = 0  # changed on the gRPC loop only

    @property
    def open_watches(self) -> int:
        """``WatchTask`` streams open now (each holds one of the server's ``--read-calls-max``)."""
        return self._open_watches

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self._token}"),) if self._token else ()

    def _stub(self, address: str) -> pb_grpc.TasksStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(address)
            self._channels[address] = channel
        return pb_grpc.TasksStub(channel)  # type: ignore[no-untyped-call]

    @staticmethod
    def _leader_of(error: grpc.aio.AioRpcError) -> str | None:
        if error.code() != grpc.StatusCode.UNAVAILABLE:
            return None
        for metadata in (error.trailing_metadata(), error.initial_metadata()):
            for key, value in metadata or ():
                if key == LEADER_HEADER and value:
                    return str(value)
        return None

    async def unary(self, rpc: str, request: Any) -> Any:
        """Calls ``rpc``; a follower's redirect is followed once (the follower wrote nothing, so
        any call may be repeated at the leader). Raises ``grpc.aio.AioRpcError``."""
        return await _on_io_loop(self._unary(rpc, request))

    async def _unary(self, rpc: str, request: Any) -> Any:
        for attempt in range(2):
            address = self._current
            try:
                method = getattr(self._stub(address), rpc)
                return await method(request, timeout=self.timeout_s, metadata=self._metadata())
            except grpc.aio.AioRpcError as e:
                leader = self._leader_of(e)
                if attempt == 0 and leader is not None and leader != address:
                    self._current = leader
                    continue
                raise
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover

    async def watch_until(
        self, request: pb.WatchTaskRequest, done: Callable[[pb.GetTaskResponse], bool]
    ) -> pb.GetTaskResponse | None:
        """Follows ``WatchTask`` until ``done`` accepts a response (returned) or the stream ends
        (``None``). Raises ``grpc.aio.AioRpcError``; the stream is cancelled on the way out."""
        return await _on_io_loop(self._watch_until(request, done))

    async def _watch_until(
        self, request: pb.WatchTaskRequest, done: Callable[[pb.GetTaskResponse], bool]
    ) -> pb.GetTaskResponse | None:
        address = self._current
        call = self._stub(address).WatchTask(request, metadata=self._metadata())
        self._open_watches += 1
        try:
            async for response in call:
                if done(response):
                    return response  # type: ignore[no-any-return]
            return None
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNAVAILABLE:
                self._move_on(address, self._leader_of(e))
            raise
        finally:
            call.cancel()
            self._open_watches -= 1

    def _move_on(self, address: str, leader: str | None) -> None:
        """After ``address`` failed with UNAVAILABLE: the next call goes to the leader it named,
        else (it died, or knows no leader: an election) to the member after it in the list.
        Nothing moves if another call already moved on from ``address``."""
        if self._current != address:
            return
        if leader is not None and leader != address:
            self._current = leader
        elif address in self._members:
            self._current = self._members[(self._members.index(address) + 1) % len(self._members)]
        else:  # a leader the hint named, not in the list, is down: start over
            self._current = self._members[0]

    async def close(self) -> None:
        """Closes the channels."""
        await _on_io_loop(self._close())

    async def _close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()
