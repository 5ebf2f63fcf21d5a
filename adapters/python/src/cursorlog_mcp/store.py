"""The cursorlog ``EventStore`` for the MCP Python SDK.

One ``CursorlogEventStore`` serves every session of a process. The SDK never tells a store
which session it is storing for; ``CursorlogMiddleware`` names it for every HTTP request (see
``binding``), and every cursorlog call this store makes carries that session. Event ids are
cursorlog cursors ``{epoch}-{stream}-{seq}``, which cursorlog interprets only inside the
session they are presented in.

Appends of all sessions are coalesced into shared ``AppendBatch`` calls (``batcher``). A store
that cannot store raises (a typed ``CursorlogError``): it never hands the SDK an event id of an
event it did not store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from mcp.server.streamable_http import GET_STREAM_KEY, EventCallback, EventId, EventStore, StreamId
from mcp_types import JSONRPCError, JSONRPCMessage, JSONRPCNotification, JSONRPCRequest, JSONRPCResponse
from mcp_types.version import is_version_at_least

from ._proto import cursorlog_pb2 as pb
from .batcher import AppendBatcher
from .binding import Binding, current_binding
from .client import CursorlogClient
from .errors import CursorlogError, CursorlogFailedPrecondition, CursorlogNotFound, SessionRecordError
from .record import SessionState, initialize_params
from .resume import STANDALONE_CORRELATION, EvictedMode, correlation_for_request

logger = logging.getLogger("cursorlog_mcp")

DEFAULT_LEASE_MS = 10_000
SYNTHETIC_EVENT_ID = "cursorlog-restore"
"""The id of events of the adapter's own restore handshake, which no client ever sees."""
RESUME_HANDOVER_TIMEOUT_S = 2.0
"""How long a locally produced stream waits for the SDK to re-register a resumed connection
before its producer goes on (the SDK then serves the connection the replay alone)."""

FailureListener = Callable[[str, CursorlogError], None]


@dataclass
class _Stream:
    """A request stream this process produces."""

    session: str
    sdk_stream_id: str
    stream: int
    epoch: int
    correlation: str
    next_seq: int = 1
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    renewed_at: float = field(default_factory=time.monotonic)
    handover: asyncio.TimerHandle | None = None
    """Set while a resumed connection is being handed over to the SDK (``replay``)."""

    def head_cursor(self) -> str:
        return f"{self.epoch}-{self.stream}-{self.next_seq - 1}"


@dataclass
class _Session:
    """What this process knows of a session it serves."""

    session_id: str
    epoch: int
    state: SessionState
    streams: dict[str, _Stream] = field(default_factory=dict)
    by_stream: dict[int, _Stream] = field(default_factory=dict)
    used_at: float = field(default_factory=time.monotonic)

    @property
    def get_stream(self) -> int | None:
        return self.state.get_stream


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


class CursorlogEventStore(EventStore):
    """The SDK's ``EventStore``, backed by cursorlog, for every session of this process.

    Pass it to the SDK as ``event_store=`` and wrap the SDK's app in ``CursorlogMiddleware``
    (which names the session of every call). ``lease_ms`` is the producer lease of every
    request stream: if this process stops renewing it (it died, or lost cursorlog for that
    long), cursorlog aborts the stream and a client resuming it anywhere gets an explicit error
    instead of waiting forever. ``on_evicted`` chooses what a client resuming an evicted cursor
    gets (``"gap"``: a warning, then the retained rest and the result; ``"error"``: ``-32011``).
    ``max_in_flight`` bounds the ``AppendBatch`` calls on the wire at once.
    """

    def __init__(
        self,
        target: str | CursorlogClient,
        *,
        lease_ms: int = DEFAULT_LEASE_MS,
        token: str | None = None,
        on_evicted: EvictedMode | str = EvictedMode.GAP,
        max_in_flight: int = 1,
    ) -> None:
        if lease_ms < 3:
            raise ValueError("lease_ms must be >= 3")
        self.client = target if isinstance(target, CursorlogClient) else CursorlogClient(target, token=token)
        self._owns_client = not isinstance(target, CursorlogClient)
        self.lease_ms = lease_ms
        try:
            self.on_evicted = EvictedMode(on_evicted)
        except ValueError:
            raise ValueError(f"on_evicted must be 'gap' or 'error', not {on_evicted!r}") from None
        self._max_in_flight = max_in_flight
        self._batcher: AppendBatcher | None = None
        self._batcher_loop: asyncio.AbstractEventLoop | None = None
        self._sessions: dict[str, _Session] = {}
        self._loading: dict[str, asyncio.Lock] = {}
        self._listeners: list[FailureListener] = []
        self._maintainer: asyncio.Task[None] | None = None
        self._idle_ttl_ms: int | None = None

    @property
    def idle_ttl_ms(self) -> int | None:
        """The server's session idle TTL (from ``GetSession``), once known; 0: no idle expiry."""
        return self._idle_ttl_ms

    @idle_ttl_ms.setter
    def idle_ttl_ms(self, value: int | None) -> None:
        changed, self._idle_ttl_ms = value != self._idle_ttl_ms, value
        task = self._maintainer
        if changed and task is not None and not task.done():
            # Its renewal period depends on the TTL: start it again with the new one.
            task.cancel()
            self._maintainer = None
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return
            self._ensure_maintainer()

    # -- plumbing ------------------------------------------------------------------------------
    @property
    def batcher(self) -> AppendBatcher:
        """The append coalescer of the running event loop."""
        loop = asyncio.get_running_loop()
        if self._batcher is None or self._batcher_loop is not loop:
            self._batcher = AppendBatcher(self.client, max_in_flight=self._max_in_flight)
            self._batcher_loop = loop
        return self._batcher

    def add_failure_listener(self, listener: FailureListener) -> None:
        """``listener(session, error)`` runs when an event of ``session`` could not be stored
        (the SDK stops routing that session's messages; the middleware then ends it)."""
        self._listeners.append(listener)

    def _failed(self, session: str, error: CursorlogError) -> None:
        for listener in self._listeners:
            try:
                listener(session, error)
            except Exception:  # a listener's bug must not hide the storage failure
                logger.exception("cursorlog-mcp failure listener raised")

    def _ensure_maintainer(self) -> None:
        task = self._maintainer
        loop = asyncio.get_running_loop()
        if task is None or task.done() or task.get_loop() is not loop:
            self._maintainer = loop.create_task(self._maintain(), name="cursorlog-mcp leases")

    async def aclose(self) -> None:
        """Stops renewing leases, waits for queued appends, closes the client if it owns it."""
        task, self._maintainer = self._maintainer, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._batcher is not None and self._batcher_loop is asyncio.get_running_loop():
            await self._batcher.drain()
        if self._owns_client:
            await self.client.close()

    # -- sessions --------------------------------------------------------------------------------
    def known_session(self, session_id: str) -> bool:
        return session_id in self._sessions

    def session_owner(self, session_id: str) -> dict[str, object] | None:
        """The credential that created a session this process knows (None: unauthenticated)."""
        known = self._sessions.get(session_id)
        return known.state.owner if known is not None else None

    async def lookup_session(self, session_id: str) -> SessionState | None:
        """The session's state if it is alive in cursorlog (renewing its idle TTL), else None
        (never opened, expired, past its horizon, or created without cursorlog-mcp state)."""
        try:
            found = await self.client.get_session(session_id)
        except CursorlogNotFound:
            found = None
        if found is not None:
            self.idle_ttl_ms = found.idle_ttl_ms
        if found is None or found.expired or not found.state:
            gone = self._sessions.pop(session_id, None)
            if gone is not None:
                await self._abandon_all(gone, "session ended")
            return None
        state = SessionState.from_json(session_id, found.state)
        known = self._sessions.get(session_id)
        if known is None:
            self._sessions[session_id] = _Session(session_id, found.epoch, state)
        else:
            known.epoch, known.state, known.used_at = found.epoch, state, time.monotonic()
        self._ensure_maintainer()
        return state

    async def _session_for(self, binding: Binding) -> _Session:
        known = self._sessions.get(binding.session)
        if known is not None:
            known.used_at = time.monotonic()
            return known
        lock = self._loading.setdefault(binding.session, asyncio.Lock())
        async with lock:
            known = self._sessions.get(binding.session)
            if known is not None:
                return known
            if binding.opening:
                known = await self._create_session(binding)
            else:
                state = await self.lookup_session(binding.session)
                known = self._sessions.get(binding.session)
                if state is None or known is None:
                    raise CursorlogNotFound(
                        "GetSession",
                        grpc.StatusCode.NOT_FOUND,
                        f"session {binding.session} is unknown or expired in cursorlog",
                    )
            self._loading.pop(binding.session, None)
            return known

    async def _create_session(self, binding: Binding) -> _Session:
        params = initialize_params(bytes(binding.body))
        if params is None:
            raise SessionRecordError(f"session {binding.session}: its opening request is not an initialize request")
        state = SessionState(initialize_params=params, owner=binding.owner())
        opened = await self.client.open_session(binding.session, state=state.to_json())
        # No lease: the standalone stream lives as long as the session, whichever replica
        # serves it; ExpireSession (DELETE, idle TTL) aborts it.
        get = await self.client.open_stream(binding.session, opened.epoch, correlation=STANDALONE_CORRELATION)
        state = SessionState(initialize_params=params, owner=state.owner, get_stream=get.stream)
        await self.client.set_session_state(binding.session, state.to_json())
        if self.idle_ttl_ms is None:
            self.idle_ttl_ms = (await self.client.get_session(binding.session)).idle_ttl_ms
        session = _Session(binding.session, opened.epoch, state)
        self._sessions[binding.session] = session
        self._ensure_maintainer()
        logger.info("session %s: opened in cursorlog (standalone stream %d)", binding.session, get.stream)
        return session

    async def standalone_cursor(self, session_id: str) -> str | None:
        """The cursor at the head of the session's standalone stream (a plain GET follows it
        from there), or None when the session or its standalone stream is unknown."""
        session = self._sessions.get(session_id)
        if session is None or session.get_stream is None:
            return None
        resolution = await self.client.resolve(session_id, f"{session.epoch}-{session.get_stream}-0")
        if resolution.verdict == pb.EPOCH_MISMATCH and resolution.HasField("current_epoch"):
            return None
        return f"{session.epoch}-{session.get_stream}-{resolution.head}"

    async def end_session(self, session_id: str) -> None:
        """The client deleted the session: expire it in cursorlog (aborting its open streams)."""
        gone = self._sessions.pop(session_id, None)
        if gone is not None:
            for stream in list(gone.streams.values()):
                gone.streams.pop(stream.sdk_stream_id, None)
        try:
            expired = await self.client.expire_session(session_id)
        except (CursorlogNotFound, CursorlogFailedPrecondition) as e:
            logger.info("session %s was already unknown or expired in cursorlog: %s", session_id, e)
            return
        logger.info("expired session %s in cursorlog (aborted streams %s)", session_id, list(expired.aborted_streams))

    async def forget(self, session_id: str, reason: str) -> None:
        """This process stopped serving the session: abort the request streams it still
        produces (their requests cannot finish any more) and drop what it knows."""
        gone = self._sessions.pop(session_id, None)
        if gone is not None:
            await self._abandon_all(gone, reason)

    async def _abandon_all(self, session: _Session, reason: str) -> None:
        for stream in list(session.streams.values()):
            await self._abandon(session, stream, reason)

    async def _abandon(self, session: _Session, stream: _Stream, reason: str) -> None:
        if session.streams.get(stream.sdk_stream_id) is stream:
            del session.streams[stream.sdk_stream_id]
        session.by_stream.pop(stream.stream, None)
        try:
            await self.client.abort(session.session_id, stream.stream, reason[:256])
        except (CursorlogFailedPrecondition, CursorlogNotFound) as e:
            logger.debug("session %s: stream %d already ended: %s", session.session_id, stream.stream, e)
        except CursorlogError as e:
            logger.warning(
                "session %s: could not abort stream %d (%s); its lease will end it: %s",
                session.session_id,
                stream.stream,
                reason,
                e,
            )

    # -- producing -------------------------------------------------------------------------------
    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        binding = current_binding("store_event")
        if stream_id in binding.synthetic_streams:
            return SYNTHETIC_EVENT_ID
        session = await self._session_for(binding)
        if message is None:
            return await self._prime(session, stream_id)
        try:
            return await self._record(session, stream_id, message)
        except CursorlogError as e:
            logger.error(
                "session %s: could not store %s on SDK stream %s: %s; the session is ended on this replica",
                session.session_id,
                _kind(message),
                stream_id,
                e,
            )
            self._failed(session.session_id, e)
            raise

    async def _open_request_stream(self, session: _Session, sdk_stream_id: str) -> _Stream:
        correlation = correlation_for_request(sdk_stream_id)
        try:
            opened = await self.client.open_stream(
                session.session_id, session.epoch, correlation=correlation, lease_ms=self.lease_ms
            )
        except CursorlogFailedPrecondition:
            # A stale epoch (someone advanced it) is retried once in the current epoch; an
            # expired session fails again and propagates.
            state = await self.lookup_session(session.session_id)
            if state is None:
                raise
            opened = await self.client.open_stream(
                session.session_id, session.epoch, correlation=correlation, lease_ms=self.lease_ms
            )
        stream = _Stream(session.session_id, sdk_stream_id, opened.stream, opened.epoch, correlation)
        previous = session.streams.get(sdk_stream_id)
        if previous is not None:
            await self._abandon(session, previous, "request id reused by a new request")
        session.streams[sdk_stream_id] = stream
        session.by_stream[stream.stream] = stream
        return stream

    async def _prime(self, session: _Session, stream_id: StreamId) -> EventId:
        """Priming event of an SDK stream: a cursor before anything it will carry."""
        if stream_id == GET_STREAM_KEY:
            cursor = await self.standalone_cursor(session.session_id)
            if cursor is None:
                raise CursorlogNotFound(
                    "Resolve", grpc.StatusCode.NOT_FOUND, f"session {session.session_id} has no standalone stream"
                )
            return cursor
        existing = session.streams.get(stream_id)
        if existing is not None and existing.handover is not None:
            # The SDK re-registered a connection this store resumed (see replay): its priming
            # cursor is the head the replay delivered up to, and the producer may go on.
            cursor = existing.head_cursor()
            self._end_handover(existing)
            return cursor
        stream = await self._open_request_stream(session, stream_id)
        return f"{stream.epoch}-{stream.stream}-0"

    def _end_handover(self, stream: _Stream) -> None:
        handle, stream.handover = stream.handover, None
        if handle is not None:
            handle.cancel()
            if stream.lock.locked():
                stream.lock.release()

    async def _record(self, session: _Session, stream_id: StreamId, message: JSONRPCMessage) -> EventId:
        payload = _wire(message)
        kind = _kind(message)
        if stream_id == GET_STREAM_KEY:
            if session.get_stream is None:
                raise CursorlogNotFound(
                    "Append", grpc.StatusCode.NOT_FOUND, f"session {session.session_id} has no standalone stream"
                )
            # Any replica serving the session may append here, so no expected seq.
            appended = await self.batcher.append(
                session.session_id, session.get_stream, payload, kind=kind, expected_next_seq=None
            )
            return str(appended.event_ids[0])
        stream = session.streams.get(stream_id)
        if stream is None:
            # A client older than 2025-11-25 gets no priming event: open on the first message.
            stream = await self._open_request_stream(session, stream_id)
        terminal = (
            isinstance(message, JSONRPCResponse | JSONRPCError)
            and message.id is not None
            and str(message.id) == stream_id
        )
        async with stream.lock:
            try:
                if not terminal:
                    appended = await self.batcher.append(
                        session.session_id, stream.stream, payload, kind=kind, expected_next_seq=stream.next_seq
                    )
                    stream.next_seq = appended.last_seq + 1
                    stream.renewed_at = time.monotonic()
                    return str(appended.event_ids[0])
                done = await self.batcher.complete(
                    session.session_id,
                    stream.stream,
                    payload,
                    kind=kind,
                    correlation=stream.correlation,
                    expected_next_seq=stream.next_seq,
                )
            except CursorlogError as e:
                await self._abandon(session, stream, f"producer could not store an event: {e.code.name}: {e.details}")
                raise
            if session.streams.get(stream_id) is stream:
                del session.streams[stream_id]
            session.by_stream.pop(stream.stream, None)
            stream.next_seq = done.terminal_seq + 1
            return done.terminal_event_id

    # -- resuming ------------------------------------------------------------------------------
    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        """Answers a ``Last-Event-ID`` (a GET resuming its own stream) per the verdict table.

        A request stream this process is still producing is replayed up to its head and handed
        back to the SDK (its stream id is returned), so the connection gets the SDK's priming
        event and retry hint, ``close_sse_stream()`` works on it, and live events flow from
        the producer directly. Any other stream (produced elsewhere, finished, or the
        standalone stream) is followed from cursorlog until its end, and None is returned.
        """
        from .replay import Replayer  # the replay half lives in its own module

        binding = current_binding("replay_events_after")
        session = await self._session_for(binding)
        replayer = Replayer(self, session, last_event_id, send_callback)
        local = self._local_stream(session, last_event_id)
        if local is not None:
            await local.lock.acquire()
            if session.by_stream.get(local.stream) is not local:
                local.lock.release()  # finished while we waited: follow it from cursorlog
                local = None
        if local is None:
            await replayer.follow()
            return None
        handed_over = False
        try:
            handed_over = await replayer.up_to_head(local)
            if not handed_over:
                return None
            if binding.protocol_version is not None and is_version_at_least(binding.protocol_version, "2025-11-25"):
                # The SDK now stores a priming event for the stream (our _prime), then registers
                # the connection for live events: the producer waits until then.
                loop = asyncio.get_running_loop()
                local.handover = loop.call_later(RESUME_HANDOVER_TIMEOUT_S, self._handover_timed_out, local)
            return local.sdk_stream_id
        finally:
            if local.handover is None:
                # No priming is coming (older protocol: the SDK registers the connection before
                # anything else can run), or we are not handing over: the producer goes on.
                local.lock.release()

    def _handover_timed_out(self, stream: _Stream) -> None:
        logger.warning(
            "session %s: the SDK did not re-register resumed stream %s within %.1fs; its producer goes on",
            stream.session,
            stream.sdk_stream_id,
            RESUME_HANDOVER_TIMEOUT_S,
        )
        stream.handover = None
        if stream.lock.locked():
            stream.lock.release()

    def _local_stream(self, session: _Session, cursor: str) -> _Stream | None:
        parts = cursor.split("-")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            return None
        stream = session.by_stream.get(int(parts[1]))
        if stream is None or int(parts[0]) != stream.epoch:
            return None
        return stream

    # -- leases and session renewal ----------------------------------------------------------------
    async def _maintain(self) -> None:
        """Renews, every third of the shorter of the lease and the session idle TTL, the leases of
        streams with no recent append and the sessions no recent call named."""
        while True:
            ttl = self.idle_ttl_ms or 0
            period_ms = min(self.lease_ms, ttl) if ttl > 0 else self.lease_ms
            interval = period_ms / 3000
            await asyncio.sleep(interval)
            now = time.monotonic()
            calls = []
            for session in list(self._sessions.values()):
                for stream in list(session.by_stream.values()):
                    if now - stream.renewed_at >= self.lease_ms / 3000:
                        calls.append(self._renew_stream(session, stream, now))
                if ttl > 0 and now - session.used_at >= ttl / 3000:
                    calls.append(self._renew_session(session, now))
            if calls:
                await asyncio.gather(*calls)

    async def _renew_stream(self, session: _Session, stream: _Stream, now: float) -> None:
        try:
            await self.client.keep_alive(session.session_id, stream.stream)
            stream.renewed_at = now
        except (CursorlogFailedPrecondition, CursorlogNotFound) as e:
            if session.by_stream.pop(stream.stream, None) is not None:
                session.streams.pop(stream.sdk_stream_id, None)
                logger.warning(
                    "stopped renewing the lease of stream %d (session %s, SDK stream %s): %s",
                    stream.stream,
                    session.session_id,
                    stream.sdk_stream_id,
                    e,
                )
        except CursorlogError as e:
            logger.warning(
                "could not renew the lease of stream %d (session %s): %s", stream.stream, session.session_id, e
            )

    async def _renew_session(self, session: _Session, now: float) -> None:
        try:
            await self.client.keep_alive(session.session_id)
            session.used_at = now
        except CursorlogError as e:
            logger.warning("could not renew session %s in cursorlog: %s", session.session_id, e)
