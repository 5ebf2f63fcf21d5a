"""A small asyncio client for the cursorlog.v1 gRPC API with typed errors."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

import grpc

from ._proto import cursorlog_pb2 as pb
from ._proto import cursorlog_pb2_grpc as pb_grpc
from .errors import CursorlogError, CursorlogUnavailable, from_rpc_error
from .routing import RetryHint, Router, hints, may_retry

logger = logging.getLogger(__name__)

R = TypeVar("R")

_RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.4, 0.8)
"""Backoff for calls that are safe to repeat when cursorlog is briefly unavailable."""


class CursorlogClient:
    """Async client of cursorlog: one server, or the members of a replicated cursorlog.

    ``target`` is ``host:port``, or for a replicated cursorlog its members as a comma-separated
    string (``"h1:7001,h2:7002,h3:7003"``) or a sequence. Calls go to the leader: an UNAVAILABLE
    answer is followed to the member its ``cursorlog-leader`` header names (a channel is cached
    per member), or, without one, retried on the next address after a bounded exponential
    backoff (50–400 ms), all within ``timeout_s`` — when resending is safe: ``cursorlog-retry:
    safe``, or an idempotent call (see :func:`routing.may_retry`). With a single address and a
    plain UNAVAILABLE (no cursorlog headers) the behaviour is the one of a single server.

    Channels are created lazily inside the running event loop (``grpc.aio`` binds a channel to
    its loop). ``token`` adds ``authorization: Bearer <token>`` to every call;
    ``root_certificates`` (PEM bytes) switches to TLS.
    """

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        token: str | None = None,
        root_certificates: bytes | None = None,
        timeout_s: float = 10.0,
        max_message_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self.router = Router(target)
        self.target = ",".join(self.router.addresses)
        self._multi = len(self.router.addresses) > 1
        self._token = token
        self._root_certificates = root_certificates
        self._timeout_s = timeout_s
        self._max_message_bytes = max_message_bytes
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._stubs: dict[str, pb_grpc.CursorLogStub] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._opened = 0
        self.reads_reopened = 0
        """``Read`` calls re-opened on another member after an UNAVAILABLE (tests, logs)."""

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self._token}"),) if self._token else ()

    @property
    def clustered(self) -> bool:
        """True when configured with several members (leader routing with the long retry budget)."""
        return self._multi

    @property
    def timeout_s(self) -> float:
        """The deadline of a call, retries on other members included."""
        return self._timeout_s

    def retry_delays_s(self) -> tuple[float, ...]:
        """Backoff of writes a caller resends itself (``AppendBatch`` items): the historical
        short series for one server; for a cluster, 50–400 ms steps covering ``timeout_s`` (an
        election included)."""
        if not self._multi:
            return _RETRY_DELAYS_S
        delays: list[float] = []
        step = 0.05
        while sum(delays) < self._timeout_s:
            delays.append(step)
            step = min(step * 2, 0.4)
        return tuple(delays)

    @property
    def stub(self) -> pb_grpc.CursorLogStub:
        """The stub of this event loop's channel to the member believed to lead."""
        return self._stub_at(self.router.current)

    def _stub_at(self, address: str) -> pb_grpc.CursorLogStub:
        """The stub of this event loop's channel to ``address`` (created on first use).

        ``grpc.aio`` binds a channel to the loop it was created in, so a client used from a new
        loop opens new channels there and closes the previous ones (in the background: their
        calls are cancelled, their sockets released).
        """
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            stale = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
            self._loop = loop
            for channel in stale:
                task = loop.create_task(self._close_stale(channel))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
        stub = self._stubs.get(address)
        if stub is None:
            options = [
                ("grpc.max_receive_message_length", self._max_message_bytes),
                ("grpc.max_send_message_length", self._max_message_bytes),
            ]
            if self._root_certificates is not None:
                creds = grpc.ssl_channel_credentials(root_certificates=self._root_certificates)
                channel = grpc.aio.secure_channel(address, creds, options=options)
            else:
                channel = grpc.aio.insecure_channel(address, options=options)
            stub = pb_grpc.CursorLogStub(channel)  # type: ignore[no-untyped-call]
            self._channels[address] = channel
            self._stubs[address] = stub
            self._opened += 1
        return stub

    @staticmethod
    async def _close_stale(channel: grpc.aio.Channel) -> None:
        try:
            await channel.close()
        except Exception as e:  # a channel of a dead loop may refuse; it is dropped either way
            logger.debug("closing the previous event loop's cursorlog channel failed: %s", e)

    @property
    def channels_opened(self) -> int:
        """How many channels this client has opened (one per member per event loop it was used in)."""
        return self._opened

    async def close(self) -> None:
        """Closes the channels (pending calls are cancelled)."""
        channels = list(self._channels.values())
        self._channels.clear()
        self._stubs.clear()
        self._loop = None
        for channel in channels:
            await channel.close()
        for task in list(self._closing):
            await task

    def _routes(self, leader: str | None, hint: RetryHint) -> bool:
        """Whether an UNAVAILABLE is a cluster answer to route on (else the single-server path)."""
        return self._multi or leader is not None or hint is not None

    async def _unary(self, rpc: str, request: Any, response: type[R], *, retry: bool) -> R:
        """One unary call; ``retry`` says it is idempotent (safe to resend whatever happened)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        delays = _RETRY_DELAYS_S if retry else ()
        attempt = 0
        while True:
            address = self.router.current
            method: Callable[..., Awaitable[Any]] = getattr(self._stub_at(address), rpc)
            try:
                result = cast(R, await method(request, timeout=self._timeout_s, metadata=self._metadata()))
                self.router.succeeded(address)
                return result
            except grpc.aio.AioRpcError as e:
                error = from_rpc_error(rpc, e)
                if e.code() == grpc.StatusCode.UNAVAILABLE:
                    leader, hint = hints(_metadata_of(e), error.details)
                    if self._routes(leader, hint):
                        wait = self.router.failed(address, leader)
                        if may_retry(retry, hint) and loop.time() + wait < deadline:
                            logger.info(
                                "cursorlog %s unavailable at %s (%s); trying %s in %.2fs",
                                rpc,
                                address,
                                error.details,
                                self.router.current,
                                wait,
                            )
                            await asyncio.sleep(wait)
                            continue
                        raise error from None
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
        only the session.

        Only the leader renews: a follower (or a leader cut off from its peers) answers
        UNAVAILABLE naming the leader, and the renewal is resent there like any idempotent call
        (renewing twice is renewing once), also after a connection lost mid-call."""
        await self._unary(
            "KeepAlive", pb.KeepAliveRequest(session=session, stream=stream), pb.KeepAliveResponse, retry=True
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

        On a replicated cursorlog a call that fails with UNAVAILABLE (a follower answered, or
        the leader died mid-stream) is re-opened on the leader from the last event it delivered
        (``last_event_id`` = that event's id); the new Resolution is not yielded again, so every
        event is yielded exactly once across leader changes (within ``timeout_s`` per outage).
        Other failures raise typed ``CursorlogError``s. Leaving the iteration early cancels the
        call.
        """
        loop = asyncio.get_running_loop()
        cursor = last_event_id
        resolved = False
        outage_ends: float | None = None
        while True:
            address = self.router.current
            call = self._stub_at(address).Read(
                pb.ReadRequest(session=session, last_event_id=cursor, follow=follow, resume_own_stream=resume_own_stream),
                metadata=self._metadata(),
            )
            first = True
            try:
                async for item in call:
                    outage_ends = None
                    if first:
                        first = False
                        self.router.succeeded(address)
                        if resolved:
                            # A re-opened call resolves our own last event; the reader has the first.
                            verdict = item.resolution.verdict if item.WhichOneof("item") == "resolution" else None
                            if verdict in (pb.RESUMABLE, pb.STREAM_TERMINATED):
                                continue
                            raise CursorlogError(
                                "Read",
                                grpc.StatusCode.ABORTED,
                                f"the Read re-opened after a leader change answered {item.WhichOneof('item')} "
                                f"(verdict {verdict})",
                            )
                        resolved = True
                    if item.WhichOneof("item") == "events" and item.events.events:
                        cursor = item.events.events[-1].id
                    yield item
                return
            except grpc.aio.AioRpcError as e:
                error = from_rpc_error("Read", e)
                leader, hint = hints(_metadata_of(e), error.details)
                if e.code() != grpc.StatusCode.UNAVAILABLE or not self._routes(leader, hint):
                    raise error from None
                now = loop.time()
                outage_ends = outage_ends if outage_ends is not None else now + self._timeout_s
                wait = self.router.failed(address, leader)
                if now + wait >= outage_ends:
                    raise error from None
                self.reads_reopened += 1
                logger.info(
                    "cursorlog Read at %s failed (%s); re-opening at %s from %s in %.2fs",
                    address,
                    error.details,
                    self.router.current,
                    cursor,
                    wait,
                )
                await asyncio.sleep(wait)
            finally:
                call.cancel()


def _metadata_of(error: grpc.aio.AioRpcError) -> list[tuple[str, str | bytes]]:
    """Trailing and initial metadata of a failed call (a trailers-only answer carries the headers)."""
    out: list[tuple[str, str | bytes]] = []
    for md in (error.trailing_metadata(), error.initial_metadata()):
        for key, value in md or ():
            out.append((str(key), value))
    return out
