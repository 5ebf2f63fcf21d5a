"""The cursorlog ``EventStore`` for the MCP Python SDK.

``CursorlogEventStore`` is the process-wide root: it owns the cursorlog connection and keeps
the producer leases of the streams this process writes alive. It is deliberately unusable as
an ``EventStore`` itself: the SDK gives one store instance to every session's transport and
never tells it the session, so the root refuses every call (``SessionBindingError``).
``CursorlogSessionManager`` gives each session's transport ``root.for_session(session_id)``,
a ``SessionEventStore`` that passes the real MCP session id to every cursorlog call.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import grpc
from mcp.server.streamable_http import GET_STREAM_KEY, EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import (
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    jsonrpc_message_adapter,
)
from pydantic import ValidationError

from ._proto import cursorlog_pb2 as pb
from .client import CursorlogClient
from .errors import (
    CursorlogError,
    CursorlogFailedPrecondition,
    CursorlogMcpError,
    CursorlogNotFound,
    CursorlogUnavailable,
    SessionBindingError,
)
from .record import InitCapture, SessionRecord
from .resume import (
    SESSION_INIT_CORRELATION,
    Action,
    Plan,
    Reason,
    aborted_reason,
    correlation_for_request,
    discontinuity_error,
    plan,
    request_id_from_correlation,
    resolution_facts,
    state_name,
    verdict_name,
)

logger = logging.getLogger("cursorlog_mcp")
resume_logger = logging.getLogger("cursorlog_mcp.resume")

DEFAULT_LEASE_MS = 10_000
SESSION_RECORD_KIND = "mcp.session-init"
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
_PROBE_CURSOR = "0-0-0"
"""A cursor no session ever issues (epochs start at 1): Resolve answers UNKNOWN_SESSION for a
missing or expired session and EPOCH_MISMATCH (with the current epoch) otherwise."""


@dataclass
class _Stream:
    """A request stream this process produces."""

    sdk_stream_id: str
    stream: int
    epoch: int
    correlation: str
    next_seq: int = 1
    lock: anyio.Lock = field(default_factory=anyio.Lock)


def _kind(message: JSONRPCMessage) -> str:
    if isinstance(message, JSONRPCResponse):
        return "result"
    if isinstance(message, JSONRPCError):
        return "error"
    if isinstance(message, JSONRPCNotification):
        return "notification"
    if isinstance(message, JSONRPCRequest):
        return "request"
    return "message"  # pragma: no cover - JSONRPCMessage has exactly the four arms


def _wire(message: JSONRPCMessage) -> bytes:
    # Exactly what the SDK writes as the SSE `data:` field (StreamableHTTPServerTransport._create_event_data).
    return message.model_dump_json(by_alias=True, exclude_unset=True).encode()


def _parse(payload: bytes, event_id: str) -> JSONRPCMessage:
    try:
        return jsonrpc_message_adapter.validate_json(payload, by_name=False)
    except ValidationError as e:
        raise CursorlogMcpError(f"event {event_id} does not hold a JSON-RPC message: {e}") from e


class CursorlogEventStore(EventStore):
    """Process-wide root of the cursorlog event store. Bind it per session with ``for_session``.

    ``lease_ms`` is the producer lease of every request stream: if this process stops renewing
    it (it died, or lost cursorlog for that long), cursorlog aborts the stream and a client
    resuming it anywhere gets an explicit error instead of waiting forever. Leases are renewed
    every ``keepalive_interval_ms`` (default: a third of the lease) while ``running()`` is
    entered; ``CursorlogSessionManager.run()`` enters it.
    """

    def __init__(
        self,
        target: str | CursorlogClient,
        *,
        lease_ms: int = DEFAULT_LEASE_MS,
        keepalive_interval_ms: int | None = None,
        token: str | None = None,
    ) -> None:
        if lease_ms < 1:
            raise ValueError("lease_ms must be >= 1")
        self.client = target if isinstance(target, CursorlogClient) else CursorlogClient(target, token=token)
        self._owns_client = not isinstance(target, CursorlogClient)
        self.lease_ms = lease_ms
        interval = keepalive_interval_ms if keepalive_interval_ms is not None else max(lease_ms // 3, 20)
        if not 0 < interval < lease_ms:
            raise ValueError("keepalive_interval_ms must be positive and shorter than lease_ms")
        self._keepalive_interval_s = interval / 1000
        self._leases: dict[tuple[str, int], str] = {}

    # -- the root refuses to act as a store ------------------------------------------------
    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        raise SessionBindingError(
            f"CursorlogEventStore.store_event({stream_id!r}) called on the unbound root store: the SDK "
            "does not say which session the stream belongs to. Serve through CursorlogSessionManager, "
            "which binds store.for_session(<Mcp-Session-Id>) to each session's transport."
        )

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        raise SessionBindingError(
            f"CursorlogEventStore.replay_events_after({last_event_id!r}) called on the unbound root store; "
            "serve through CursorlogSessionManager."
        )

    # -- binding -----------------------------------------------------------------------------
    def for_session(
        self,
        session_id: str,
        *,
        record: SessionRecord | None = None,
        init_capture: InitCapture | None = None,
    ) -> SessionEventStore:
        """The store for one MCP session: every cursorlog call it makes names ``session_id``."""
        return SessionEventStore(self, session_id, record=record, init_capture=init_capture)

    # -- lifecycle ---------------------------------------------------------------------------
    @asynccontextmanager
    async def running(self) -> AsyncIterator[CursorlogEventStore]:
        """Renews producer leases in the background while entered; closes the client after."""
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._keepalive_loop)
                try:
                    yield self
                finally:
                    tg.cancel_scope.cancel()
        finally:
            if self._owns_client:
                with anyio.CancelScope(shield=True):
                    await self.client.close()

    def _hold_lease(self, session: str, stream: int, label: str) -> None:
        self._leases[(session, stream)] = label

    def _release_lease(self, session: str, stream: int) -> None:
        self._leases.pop((session, stream), None)

    def held_leases(self) -> list[tuple[str, int]]:
        """(session, stream) of every stream whose lease this process renews."""
        return list(self._leases)

    async def _keepalive_loop(self) -> None:
        while True:
            await anyio.sleep(self._keepalive_interval_s)
            held = list(self._leases.items())
            if not held:
                continue
            async with anyio.create_task_group() as tg:
                for (session, stream), label in held:
                    tg.start_soon(self._renew, session, stream, label)

    async def _renew(self, session: str, stream: int, label: str) -> None:
        try:
            await self.client.keep_alive(session, stream)
        except (CursorlogFailedPrecondition, CursorlogNotFound) as e:
            if self._leases.pop((session, stream), None) is not None:
                logger.warning(
                    "stopped renewing the lease of stream %d (session %s, SDK stream %s): %s", stream, session, label, e
                )
        except CursorlogError as e:
            logger.warning("could not renew the lease of stream %d (session %s): %s; retrying", stream, session, e)

    # -- sessions (used by the manager) -----------------------------------------------------
    async def session_epoch(self, session_id: str) -> int | None:
        """The session's current epoch; None when it is unknown to cursorlog or expired."""
        resolution = await self.client.resolve(session_id, _PROBE_CURSOR)
        if resolution.verdict == pb.UNKNOWN_SESSION:
            return None
        return resolution.current_epoch

    async def load_session_record(self, session_id: str) -> SessionRecord | None:
        """The initialize record of a live session, or None (never initialized through
        cursorlog-mcp, expired, or forgotten)."""
        found = await self.client.get_outcome(session_id, correlation=SESSION_INIT_CORRELATION)
        if not found.found or found.outcome.state != pb.STREAM_STATE_COMPLETED or not found.outcome.HasField("frame"):
            return None
        epoch = await self.session_epoch(session_id)
        if epoch is None:
            return None
        return SessionRecord.from_json(session_id, found.outcome.frame.payload, epoch)

    async def expire_session(self, session_id: str) -> None:
        """Expires the session in cursorlog (its open streams are aborted)."""
        try:
            expired = await self.client.expire_session(session_id)
        except (CursorlogNotFound, CursorlogFailedPrecondition) as e:
            logger.info("session %s was already unknown or expired in cursorlog: %s", session_id, e)
            return
        logger.info("expired session %s in cursorlog (aborted streams %s)", session_id, list(expired.aborted_streams))


class SessionEventStore(EventStore):
    """The event store of one MCP session (see module docstring). Event ids are cursorlog
    cursors ``{epoch}-{stream}-{seq}``, which cursorlog interprets only inside this session."""

    def __init__(
        self,
        root: CursorlogEventStore,
        session_id: str,
        *,
        record: SessionRecord | None = None,
        init_capture: InitCapture | None = None,
    ) -> None:
        if not session_id:
            raise SessionBindingError("SessionEventStore needs a non-empty MCP session id")
        self._root = root
        self._client = root.client
        self.session_id = session_id
        self._record = record
        self._capture = init_capture
        self._epoch: int | None = record.epoch if record is not None else None
        self._get_stream: int | None = record.get_stream if record is not None else None
        self._streams: dict[str, _Stream] = {}
        self._session_lock = anyio.Lock()
        self._closed = False

    @property
    def record(self) -> SessionRecord | None:
        """The session's initialize record, once written or loaded."""
        return self._record

    @property
    def get_stream(self) -> int | None:
        """The session's standalone (GET) cursorlog stream, once known."""
        return self._get_stream

    # -- producing -----------------------------------------------------------------------------
    async def _current_epoch(self, refresh: bool = False) -> int:
        async with self._session_lock:
            if self._epoch is None or refresh:
                opened = await self._client.open_session(self.session_id)
                self._epoch = opened.epoch
            return self._epoch

    async def _ensure_get_stream(self) -> int:
        epoch = await self._current_epoch()
        async with self._session_lock:
            if self._get_stream is None:
                # No lease: the standalone stream lives as long as the session, whichever replica
                # serves it; ExpireSession (DELETE) aborts it.
                opened = await self._client.open_stream(self.session_id, epoch)
                self._get_stream = opened.stream
                logger.debug("session %s: standalone stream is %d", self.session_id, opened.stream)
            return self._get_stream

    async def _open_request_stream(self, sdk_stream_id: str) -> tuple[_Stream, str]:
        correlation = correlation_for_request(sdk_stream_id)
        epoch = await self._current_epoch()
        try:
            opened = await self._client.open_stream(
                self.session_id, epoch, correlation=correlation, lease_ms=self._root.lease_ms
            )
        except CursorlogFailedPrecondition:
            # A stale epoch (someone advanced it) is retried once in the current epoch; an
            # expired session fails again and propagates.
            epoch = await self._current_epoch(refresh=True)
            opened = await self._client.open_stream(
                self.session_id, epoch, correlation=correlation, lease_ms=self._root.lease_ms
            )
        stream = _Stream(sdk_stream_id=sdk_stream_id, stream=opened.stream, epoch=opened.epoch, correlation=correlation)
        self._root._hold_lease(self.session_id, opened.stream, sdk_stream_id)
        return stream, opened.start_event_id

    async def _abandon(self, stream: _Stream, reason: str) -> None:
        self._root._release_lease(self.session_id, stream.stream)
        try:
            await self._client.abort(self.session_id, stream.stream, reason)
        except (CursorlogFailedPrecondition, CursorlogNotFound) as e:
            # Already terminal (completed, aborted by its lease, session expired): nothing to end.
            logger.debug("session %s: stream %d already ended: %s", self.session_id, stream.stream, e)
        except CursorlogError as e:
            logger.warning(
                "session %s: could not abort stream %d (%s); its lease will end it: %s",
                self.session_id,
                stream.stream,
                reason,
                e,
            )

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        if message is None:
            return await self._prime(stream_id)
        if self._closed:
            logger.warning(
                "session %s: %s on SDK stream %s after the session closed on this replica; not recorded",
                self.session_id,
                _kind(message),
                stream_id,
            )
            return ""
        try:
            return await self._record_message(stream_id, message)
        except CursorlogError as e:
            # Raising here would end the SDK's message router for the whole session. The message
            # still goes to a connected client, without an event id, so the client's resumption
            # cursor stays at the last recorded event.
            logger.error(
                "session %s: could not record %s on SDK stream %s in cursorlog; sent without an event id: %s",
                self.session_id,
                _kind(message),
                stream_id,
                e,
            )
            return ""

    async def _prime(self, stream_id: StreamId) -> EventId:
        """Priming event of a new SDK stream: open its cursorlog stream, append nothing."""
        if self._closed:
            raise SessionBindingError(f"session {self.session_id} is closed on this replica")
        if stream_id == GET_STREAM_KEY:
            get = await self._ensure_get_stream()
            epoch = await self._current_epoch()
            resolution = await self._client.resolve(self.session_id, f"{epoch}-{get}-0")
            return f"{epoch}-{get}-{resolution.head}"
        previous = self._streams.pop(stream_id, None)
        if previous is not None:
            await self._abandon(previous, "request id reused by a new request")
        stream, start_event_id = await self._open_request_stream(stream_id)
        self._streams[stream_id] = stream
        return start_event_id

    async def _record_message(self, stream_id: StreamId, message: JSONRPCMessage) -> EventId:
        payload = _wire(message)
        kind = _kind(message)
        if stream_id == GET_STREAM_KEY:
            get = await self._ensure_get_stream()
            # Any replica serving the session may append here, so no expected seq.
            appended = await self._client.append(self.session_id, get, [pb.NewEvent(kind=kind, payload=payload)])
            return str(appended.event_ids[0])
        stream = self._streams.get(stream_id)
        if stream is None:
            # A client older than 2025-11-25 gets no priming event: open on the first message.
            stream, _ = await self._open_request_stream(stream_id)
            self._streams[stream_id] = stream
        terminal = (
            isinstance(message, JSONRPCResponse | JSONRPCError)
            and message.id is not None
            and str(message.id) == stream_id
        )
        async with stream.lock:
            if not terminal:
                appended = await self._client.append(
                    self.session_id,
                    stream.stream,
                    [pb.NewEvent(kind=kind, payload=payload)],
                    expected_next_seq=stream.next_seq,
                )
                stream.next_seq = appended.last_seq + 1
                return str(appended.event_ids[0])
            if isinstance(message, JSONRPCResponse):
                await self._maybe_write_session_record(stream_id, message)
            try:
                done = await self._client.complete(
                    self.session_id,
                    stream.stream,
                    pb.NewEvent(kind=kind, correlation=stream.correlation, payload=payload),
                    expected_next_seq=stream.next_seq,
                )
            except CursorlogError as e:
                await self._abandon(stream, f"producer could not record the terminal frame: {e.code.name}")
                raise
            finally:
                self._root._release_lease(self.session_id, stream.stream)
                if self._streams.get(stream_id) is stream:
                    del self._streams[stream_id]
            return done.terminal_event_id

    async def _maybe_write_session_record(self, stream_id: str, response: JSONRPCResponse) -> None:
        """When ``response`` answers the session's initialize request, store the initialize
        record (before the client can see the response, so any replica can restore it)."""
        capture = self._capture
        if capture is None:
            return
        request = capture.initialize_request()
        if request is None or request[0] != stream_id:
            return
        self._capture = None
        _, params = request
        result = response.result if isinstance(response.result, dict) else {}
        negotiated = str(result.get("protocolVersion") or params.get("protocolVersion") or "")
        try:
            epoch = await self._current_epoch()
            get = await self._ensure_get_stream()
            record = SessionRecord(
                session_id=self.session_id,
                initialize_params=params,
                protocol_version=negotiated,
                get_stream=get,
                owner=capture.owner,
                epoch=epoch,
            )
            opened = await self._client.open_stream(self.session_id, epoch, correlation=SESSION_INIT_CORRELATION)
            await self._client.complete(
                self.session_id,
                opened.stream,
                pb.NewEvent(kind=SESSION_RECORD_KIND, correlation=SESSION_INIT_CORRELATION, payload=record.to_json()),
                expected_next_seq=1,
            )
        except CursorlogError as e:
            logger.error(
                "session %s: could not store its initialize record; other replicas will answer 404 for it: %s",
                self.session_id,
                e,
            )
            return
        self._record = record
        logger.info("session %s: initialize record stored (standalone stream %d)", self.session_id, get)

    async def close(self, reason: str = "session closed on this replica") -> None:
        """Stops producing: aborts the request streams still open here (their requests cannot
        finish any more) and stops renewing their leases."""
        self._closed = True
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            await self._abandon(stream, reason)

    # -- resuming ------------------------------------------------------------------------------
    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        """Answers a ``Last-Event-ID`` with cursorlog's verdict, as the SDK client understands it.

        Returns None in every case: the resumed SSE response ends once everything is delivered
        (the stream's terminal frame, or an error response), and live events are followed from
        cursorlog, whichever replica appends them, rather than from this process.
        """
        read = self._client.read(self.session_id, last_event_id, follow=True)
        try:
            first = await read.__anext__()
        except StopAsyncIteration as e:
            raise CursorlogUnavailable("Read", _UNAVAILABLE, "Read ended before its Resolution") from e
        try:
            if first.WhichOneof("item") != "resolution":
                raise CursorlogMcpError(f"Read sent {first.WhichOneof('item')!r} before its Resolution")
            await self._act(first.resolution, last_event_id, read, send_callback)
        finally:
            await read.aclose()
        return None

    def _is_get_stream(self, resolution: pb.Resolution) -> bool:
        return (
            self._get_stream is not None
            and resolution.HasField("cursor")
            and resolution.cursor.stream == self._get_stream
        )

    async def _act(
        self,
        resolution: pb.Resolution,
        last_event_id: str,
        read: AsyncGenerator[pb.ReadResponse, None],
        send: EventCallback,
    ) -> None:
        facts = resolution_facts(resolution, last_event_id)
        correlation = resolution.correlation if resolution.HasField("correlation") else None
        decided = plan(resolution)
        if correlation == SESSION_INIT_CORRELATION:
            # Never issued to a client: the session's own bookkeeping stream.
            decided = Plan(Action.FAIL, Reason.UNKNOWN_CURSOR)
        is_get = self._is_get_stream(resolution)
        request_id = request_id_from_correlation(correlation)
        level = logging.INFO if decided.action in (Action.REPLAY_AND_FOLLOW, Action.END) else logging.WARNING
        resume_logger.log(
            level,
            "resume session=%s cursor=%s verdict=%s action=%s%s stream_kind=%s facts=%s",
            self.session_id,
            last_event_id,
            verdict_name(resolution.verdict),
            decided.action.value,
            f"({decided.reason.value})" if decided.reason else "",
            "standalone" if is_get else "request",
            json.dumps(facts, sort_keys=True),
        )
        if decided.action is Action.REPLAY_AND_FOLLOW:
            await self._follow(read, send, facts, request_id, is_get)
        elif decided.action is Action.DELIVER_OUTCOME:
            await self._deliver_outcome(resolution, send, facts, request_id, is_get)
        elif decided.action is Action.FAIL:
            assert decided.reason is not None
            if is_get and decided.reason in (Reason.CURSOR_EVICTED, Reason.CURSOR_AHEAD):
                await self._restart_standalone(send, decided.reason, facts)
            else:
                await send(EventMessage(discontinuity_error(request_id, decided.reason, facts), None))

    async def _follow(
        self,
        read: AsyncGenerator[pb.ReadResponse, None],
        send: EventCallback,
        facts: dict[str, Any],
        request_id: Any,
        is_get: bool,
    ) -> None:
        answered = False
        async for item in read:
            which = item.WhichOneof("item")
            if which == "events":
                for event in item.events.events:
                    message = _parse(event.payload, event.id)
                    await send(EventMessage(message, event.id))
                    if isinstance(message, JSONRPCResponse | JSONRPCError):
                        answered = True
            elif which == "end":
                end = item.end
                resume_logger.info(
                    "resume session=%s cursor=%s stream ended state=%s terminal_seq=%d reason=%s",
                    self.session_id,
                    facts["cursor"],
                    state_name(end.state),
                    end.terminal_seq,
                    end.reason or "-",
                )
                if not answered and not is_get:
                    ended = {
                        **facts,
                        "state": state_name(end.state),
                        "terminal_seq": end.terminal_seq,
                        "detail": end.reason if end.HasField("reason") else facts.get("detail"),
                    }
                    reason = aborted_reason(end.state)
                    resume_logger.warning(
                        "resume session=%s cursor=%s stream ended without a response: %s",
                        self.session_id,
                        facts["cursor"],
                        reason.value,
                    )
                    await send(EventMessage(discontinuity_error(request_id, reason, ended), None))
                return
            else:
                raise CursorlogMcpError(f"Read sent a second {which!r}")
        # The server ended the follow without `end` (shutting down). Raising closes the SSE
        # response; the client reconnects with the last event id it received.
        raise CursorlogUnavailable("Read", _UNAVAILABLE, f"follow of {facts['cursor']} ended before the stream's end")

    async def _deliver_outcome(
        self,
        resolution: pb.Resolution,
        send: EventCallback,
        facts: dict[str, Any],
        request_id: Any,
        is_get: bool,
    ) -> None:
        if is_get:
            return  # the standalone stream has no response to deliver
        found = await self._client.get_outcome(self.session_id, stream=resolution.cursor.stream)
        outcome = found.outcome
        if found.found and outcome.HasField("frame") and outcome.frame.payload:
            frame = outcome.frame
            if frame.seq <= resolution.cursor.seq:
                return  # the client already has the terminal frame
            message = _parse(frame.payload, frame.id)
            await send(EventMessage(message, frame.id))
            return
        ended = {**facts, "state": state_name(outcome.state) if found.found else facts.get("state")}
        if found.found and outcome.HasField("reason"):
            ended["detail"] = outcome.reason
        reason = aborted_reason(outcome.state) if found.found else Reason.UNKNOWN_CURSOR
        await send(EventMessage(discontinuity_error(request_id, reason, ended), None))

    async def _restart_standalone(self, send: EventCallback, reason: Reason, facts: dict[str, Any]) -> None:
        """The standalone stream has no pending call to fail (and may not carry a response):
        tell the client about the gap with a log notification, then follow from the head."""
        notice = JSONRPCNotification(
            jsonrpc="2.0",
            method="notifications/message",
            params={
                "level": "warning",
                "logger": "cursorlog",
                "data": {"reason": reason.value, "message": "server notifications were lost", **facts},
            },
        )
        await send(EventMessage(notice, None))
        epoch = await self._current_epoch()
        assert self._get_stream is not None
        head = (await self._client.resolve(self.session_id, f"{epoch}-{self._get_stream}-0")).head
        fresh = f"{epoch}-{self._get_stream}-{head}"
        read = self._client.read(self.session_id, fresh, follow=True)
        try:
            first = await read.__anext__()
            if first.WhichOneof("item") == "resolution" and first.resolution.verdict == pb.RESUMABLE:
                await self._follow(read, send, resolution_facts(first.resolution, fresh), None, True)
            else:
                resume_logger.info(
                    "resume session=%s standalone stream not resumable from its head %s: %s",
                    self.session_id,
                    fresh,
                    verdict_name(first.resolution.verdict),
                )
        finally:
            await read.aclose()
