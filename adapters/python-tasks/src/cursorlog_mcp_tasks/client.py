"""A small asyncio gRPC client for ``cursorlog.v1.Tasks``: one channel per event loop, the
bearer token on every call, and a follower's redirect (UNAVAILABLE naming the leader in the
``cursorlog-leader`` header) followed once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, TypeVar

import grpc

from ._proto import tasks_pb2_grpc as pb_grpc

R = TypeVar("R")

LEADER_HEADER = "cursorlog-leader"


class TasksClient:
    """Calls the Tasks service of the cursorlog at ``target`` (``host:port``, or several members
    as a comma-separated string or a sequence: the first is tried first, a redirect moves on).

    A ``grpc.aio`` channel belongs to the event loop that made it, so one is kept per loop (the
    SDK's tests run each test in its own loop)."""

    def __init__(self, target: str | Sequence[str], *, token: str | None = None, timeout_s: float = 10.0) -> None:
        members = [m.strip() for m in target.split(",")] if isinstance(target, str) else [m.strip() for m in target]
        members = [m for m in members if m]
        if not members:
            raise ValueError("cursorlog target must name at least one host:port")
        self._members = members
        self._current = members[0]
        self._token = token
        self.timeout_s = timeout_s
        self._channels: dict[tuple[int, str], grpc.aio.Channel] = {}

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self._token}"),) if self._token else ()

    def _stub(self, address: str) -> pb_grpc.TasksStub:
        loop = id(asyncio.get_running_loop())
        key = (loop, address)
        channel = self._channels.get(key)
        if channel is None:
            channel = grpc.aio.insecure_channel(address)
            self._channels[key] = channel
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
        any call may be repeated at the leader)."""
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

    def watch(self, request: Any) -> grpc.aio.UnaryStreamCall:
        """Opens a WatchTask stream at the current member (the caller handles errors and cancels
        it)."""
        return self._stub(self._current).WatchTask(request, metadata=self._metadata())

    async def close(self) -> None:
        """Closes the channels of the running loop (others are dropped: they cannot be closed
        from here)."""
        loop = id(asyncio.get_running_loop())
        for key in list(self._channels):
            channel = self._channels.pop(key)
            if key[0] == loop:
                await channel.close()
