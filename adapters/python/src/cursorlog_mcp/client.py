"""A small asyncio client for the cursorlog.v1 gRPC API with typed errors."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar, cast

import grpc

from ._proto import cursorlog_pb2 as pb
from ._proto import cursorlog_pb2_grpc as pb_grpc
from .errors import CursorlogUnavailable, from_rpc_error

logger = logging.getLogger(__name__)

R = TypeVar("R")

_RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.4, 0.8)
"""Backoff for calls that are safe to repeat when cursorlog is briefly unavailable."""


class CursorlogClient:
    """Async client of one cursorlog server.

    The gRPC channel is created lazily inside the running event loop (``grpc.aio`` binds a
    channel to its loop). ``token`` adds ``authorization: Bearer <token>`` to every call;
    ``root_certificates`` (PEM bytes) switches to TLS.
    """

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        root_certificates: bytes | None = None,
        timeout_s: float = 10.0,
        max_message_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.target = target
        self._token = token
        self._root_certificates = root_certificates
        self._timeout_s = timeout_s
        self._max_message_bytes = max_message_bytes
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.CursorLogStub | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._opened = 0

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self._token}"),) if self._token else ()

    @property
    def stub(self) -> pb_grpc.CursorLogStub:
        """The stub of this event loop's channel.

        ``grpc.aio`` binds a channel to the loop it was created in, so a client used from a new
        loop opens a new channel there and closes the previous one (in the background: its
        calls are cancelled, its sockets released).
        """
        loop = asyncio.get_running_loop()
        if self._stub is None or self._loop is not loop:
            stale = self._channel
            options = [
                ("grpc.max_receive_message_length", self._max_message_bytes),
                ("grpc.max_send_message_length", self._max_message_bytes),
            ]
            if self._root_certificates is not None:
                creds = grpc.ssl_channel_credentials(root_certificates=self._root_certificates)
                self._channel = grpc.aio.secure_channel(self.target, creds, options=options)
            else:
                self._channel = grpc.aio.insecure_channel(self.target, options=options)
            self._stub = pb_grpc.CursorLogStub(self._channel)  # type: ignore[no-untyped-call]
            self._loop = loop
            self._opened += 1
            if stale is not None:
                task = loop.create_task(self._close_stale(stale))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
        return self._stub

    @staticmethod
    async def _close_stale(channel: grpc.aio.Channel) -> None:
        try:
            await channel.close()
        except Exception as e:  # a channel of a dead loop may refuse; it is dropped either way
            logger.debug("closing the previous event loop's cursorlog channel failed: %s", e)

    @property
    def channels_opened(self) -> int:
        """How many channels this client has opened (one per event loop it was used in)."""
        return self._opened

    async def close(self) -> None:
        """Closes the channel (pending calls are cancelled)."""
        channel, self._channel, self._stub, self._loop = self._channel, None, None, None
        if channel is not None:
            await channel.close()
        for task in list(self._closing):
            await task

    async def _unary(self, rpc: str, request: Any, response: type[R], *, retry: bool) -> R:
        method: Callable[..., Awaitable[Any]] = getattr(self.stub, rpc)
        delays = _RETRY_DELAYS_S if retry else ()
        attempt = 0
        while True:
            try:
                return cast(R, await method(request, timeout=self._timeout_s, metadata=self._metadata()))
            except grpc.aio.AioRpcError as e:
                error = from_rpc_error(rpc, e)
                if isinstance(error, CursorlogUnavailable) and attempt < len(delays):
                    logger.warning(
                        "cursorlog %s unavailable (%s); retrying in %.2fs", rpc, error.details, delays[attempt]
                    )
                    await asyncio.sleep(delays[attempt])
                    attempt += 1
                    continue
                raise error from None

    # Sessions.
    async def open_session(self, session: str, *, state: bytes | None = None) -> pb.OpenSessionResponse:
        request = pb.OpenSessionRequest(session=session)
        if state is not None:
            request.state = state
        # Idempotent: a retry returns the existing session unchanged.
        return await self._unary("OpenSession", request, pb.OpenSessionResponse, retry=True)

    async def get_session(self, session: str) -> pb.GetSessionResponse:
        return await self._unary("GetSession", pb.GetSessionRequest(session=session), pb.GetSessionResponse, retry=True)

    async def set_session_state(self, session: str, state: bytes) -> None:
        await self._unary(
            "SetSessionState",
            pb.SetSessionStateRequest(session=session, state=state),
            pb.SetSessionStateResponse,
            retry=True,
        )

    async def expire_session(self, session: str) -> pb.ExpireSessionResponse:
        return await self._unary(
            "ExpireSession", pb.ExpireSessionRequest(session=session), pb.ExpireSessionResponse, retry=False
        )

    async def advance_epoch(self, session: str) -> pb.AdvanceEpochResponse:
        return await self._unary(
            "AdvanceEpoch", pb.AdvanceEpochRequest(session=session), pb.AdvanceEpochResponse, retry=False
        )

    # Producing.
    async def open_stream(
        self, session: str, epoch: int, *, correlation: str | None = None, lease_ms: int | None = None
    ) -> pb.OpenStreamResponse:
        request = pb.OpenStreamRequest(session=session, epoch=epoch)
        if correlation is not None:
            request.correlation = correlation
        if lease_ms is not None:
            request.lease_ms = lease_ms
        # Not retried: a retry after a lost reply would open a second stream.
        return await self._unary("OpenStream", request, pb.OpenStreamResponse, retry=False)

    async def append(
        self, session: str, stream: int, events: list[pb.NewEvent], *, expected_next_seq: int | None = None
    ) -> pb.AppendResponse:
        request = pb.AppendRequest(session=session, stream=stream, events=events)
        if expected_next_seq is not None:
            request.expected_next_seq = expected_next_seq
        # With an expected seq a retry of a written batch is recognised as a duplicate.
        return await self._unary("Append", request, pb.AppendResponse, retry=expected_next_seq is not None)

    async def complete(
        self, session: str, stream: int, terminal: pb.NewEvent, *, expected_next_seq: int | None = None
    ) -> pb.TerminateResponse:
        request = pb.CompleteRequest(session=session, stream=stream, terminal=terminal)
        if expected_next_seq is not None:
            request.expected_next_seq = expected_next_seq
        return await self._unary("Complete", request, pb.TerminateResponse, retry=expected_next_seq is not None)

    async def abort(
        self, session: str, stream: int, reason: str, *, terminal: pb.NewEvent | None = None
    ) -> pb.TerminateResponse:
        request = pb.AbortRequest(session=session, stream=stream, reason=reason)
        if terminal is not None:
            request.terminal.CopyFrom(terminal)
        return await self._unary("Abort", request, pb.TerminateResponse, retry=False)

    async def append_batch(self, request: pb.AppendBatchRequest) -> pb.AppendBatchResponse:
        """``AppendBatch``, not retried here: the caller decides per item (see ``batcher``)."""
        return await self._unary("AppendBatch", request, pb.AppendBatchResponse, retry=False)

    async def keep_alive(self, session: str, stream: int = 0) -> None:
        """Renews the stream's producer lease and the session's idle TTL; ``stream`` 0 renews
        only the session."""
        await self._unary(
            "KeepAlive", pb.KeepAliveRequest(session=session, stream=stream), pb.KeepAliveResponse, retry=False
        )

    # Consuming.
    async def resolve(self, session: str, last_event_id: str) -> pb.Resolution:
        return await self._unary(
            "Resolve", pb.ResolveRequest(session=session, last_event_id=last_event_id), pb.Resolution, retry=True
        )

    async def get_outcome(
        self, session: str, *, correlation: str | None = None, stream: int | None = None
    ) -> pb.GetOutcomeResponse:
        if (correlation is None) == (stream is None):
            raise ValueError("get_outcome needs exactly one of correlation or stream")
        request = pb.GetOutcomeRequest(session=session)
        if stream is not None:
            request.stream = stream
        else:
            assert correlation is not None
            request.correlation = correlation
        return await self._unary("GetOutcome", request, pb.GetOutcomeResponse, retry=True)

    async def trim(self, session: str, stream: int, up_to_seq: int) -> pb.TrimResponse:
        return await self._unary(
            "Trim", pb.TrimRequest(session=session, stream=stream, up_to_seq=up_to_seq), pb.TrimResponse, retry=True
        )

    async def read(
        self, session: str, last_event_id: str, *, follow: bool, resume_own_stream: bool = False
    ) -> AsyncGenerator[pb.ReadResponse, None]:
        """``Read``: the Resolution first, then event batches (and, with ``resume_own_stream``,
        ``gap`` markers), then (if terminal) ``end``.

        Failures mid-stream raise typed ``CursorlogError``s. Leaving the iteration early
        cancels the call.
        """
        call = self.stub.Read(
            pb.ReadRequest(
                session=session, last_event_id=last_event_id, follow=follow, resume_own_stream=resume_own_stream
            ),
            metadata=self._metadata(),
        )
        try:
            async for item in call:
                yield item
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error("Read", e) from None
        finally:
            call.cancel()
