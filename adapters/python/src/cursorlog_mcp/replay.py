"""Carrying out a resume: cursorlog's verdict for a ``Last-Event-ID``, as the MCP client sees it.

``Replayer`` reads the cursor's own stream with ``Read(resume_own_stream=True)`` (a GET with
``Last-Event-ID`` always continues its own stream) and turns each verdict into SSE events
through the SDK's callback (the table in README.md, "Verdict → what the client sees").
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import grpc
from mcp.server.streamable_http import EventCallback, EventMessage
from mcp_types import JSONRPCError, JSONRPCMessage, JSONRPCResponse, jsonrpc_message_adapter
from pydantic import ValidationError

from ._proto import cursorlog_pb2 as pb
from .errors import CursorlogMcpError, CursorlogUnavailable
from .resume import (
    STANDALONE_CORRELATION,
    Action,
    Plan,
    Reason,
    aborted_reason,
    discontinuity_error,
    gap_notice,
    plan,
    request_id_from_correlation,
    resolution_facts,
    state_name,
    verdict_name,
)

if TYPE_CHECKING:
    from .store import CursorlogEventStore, _Session, _Stream

resume_logger = logging.getLogger("cursorlog_mcp.resume")

_QUIET = frozenset({Action.REPLAY_AND_FOLLOW, Action.END, Action.CHECK_OUTCOME})
"""Ordinary resumes, logged at INFO; discontinuities are WARNINGs."""


def _parse(payload: bytes, event_id: str) -> JSONRPCMessage:
    try:
        return jsonrpc_message_adapter.validate_json(payload, by_name=False)
    except ValidationError as e:
        raise CursorlogMcpError(f"event {event_id} does not hold a JSON-RPC message: {e}") from e


class Replayer:
    """One resume of ``cursor`` in ``session``, delivering through ``send``."""

    def __init__(self, store: CursorlogEventStore, session: _Session, cursor: str, send: EventCallback) -> None:
        self._store = store
        self._client = store.client
        self._session = session
        self._cursor = cursor
        self._send = send
        self.delivered = 0
        self.answered = False

    @property
    def _sid(self) -> str:
        return self._session.session_id

    async def _first(self, read: AsyncGenerator[pb.ReadResponse, None]) -> pb.Resolution:
        try:
            first = await read.__anext__()
        except StopAsyncIteration as e:
            raise CursorlogUnavailable("Read", grpc.StatusCode.UNAVAILABLE, "Read ended before its Resolution") from e
        if first.WhichOneof("item") != "resolution":
            raise CursorlogMcpError(f"Read sent {first.WhichOneof('item')!r} before its Resolution")
        return first.resolution

    def _decide(self, resolution: pb.Resolution) -> tuple[Plan, dict[str, Any], bool]:
        facts = resolution_facts(resolution, self._cursor)
        standalone = resolution.HasField("correlation") and resolution.correlation == STANDALONE_CORRELATION
        decided = plan(resolution, self._store.on_evicted)
        resume_logger.log(
            logging.INFO if decided.action in _QUIET else logging.WARNING,
            "resume session=%s cursor=%s verdict=%s action=%s%s stream_kind=%s facts=%s",
            self._sid,
            self._cursor,
            verdict_name(resolution.verdict),
            decided.action.value,
            f"({decided.reason.value})" if decided.reason else "",
            "standalone" if standalone else "request",
            json.dumps(facts, sort_keys=True),
        )
        return decided, facts, standalone

    async def follow(self) -> None:
        """Resume a stream produced elsewhere (or finished, or the standalone stream): deliver
        per the verdict, following live events until the stream's end."""
        read = self._client.read(self._sid, self._cursor, follow=True, resume_own_stream=True)
        try:
            resolution = await self._first(read)
            decided, facts, standalone = self._decide(resolution)
            request_id = request_id_from_correlation(
                resolution.correlation if resolution.HasField("correlation") else None
            )
            if decided.action in (Action.REPLAY_AND_FOLLOW, Action.GAP_AND_FOLLOW):
                ended = await self._deliver(read, facts)
                if ended is None:
                    # cursorlog ended the follow without `end` (shutting down). Raising closes
                    # the SSE response; the client reconnects with the last id it received.
                    raise CursorlogUnavailable(
                        "Read", grpc.StatusCode.UNAVAILABLE, f"follow of {self._cursor} ended before the stream's end"
                    )
                if not self.answered and not standalone:
                    await self._aborted(request_id, facts, ended)
            elif decided.action is Action.CHECK_OUTCOME:
                await self._check_outcome(resolution, facts, request_id)
            elif decided.action is Action.FAIL:
                assert decided.reason is not None
                if standalone:
                    await self._restart_standalone(decided.reason, facts)
                else:
                    await self._send(EventMessage(discontinuity_error(request_id, decided.reason, facts), None))
        finally:
            await read.aclose()

    async def up_to_head(self, stream: _Stream) -> bool:
        """Resume a stream this process produces, up to its current head (its producer is held
        by the caller). True when the connection should be handed to the SDK for live events."""
        read = self._client.read(self._sid, self._cursor, follow=False, resume_own_stream=True)
        try:
            resolution = await self._first(read)
            decided, facts, _ = self._decide(resolution)
            if decided.action in (Action.REPLAY_AND_FOLLOW, Action.GAP_AND_FOLLOW):
                await self._deliver(read, facts)
                return not self.answered
            request_id = request_id_from_correlation(stream.correlation)
            if decided.action is Action.FAIL:
                assert decided.reason is not None
                await self._send(EventMessage(discontinuity_error(request_id, decided.reason, facts), None))
            return False
        finally:
            await read.aclose()

    async def _deliver(self, read: AsyncGenerator[pb.ReadResponse, None], facts: dict[str, Any]) -> pb.StreamEnd | None:
        """Events (and gap markers) until ``end``; returns it, or None when the call ended first."""
        async for item in read:
            which = item.WhichOneof("item")
            if which == "events":
                for event in item.events.events:
                    message = _parse(event.payload, event.id)
                    await self._send(EventMessage(message, event.id))
                    self.delivered += 1
                    if isinstance(message, JSONRPCResponse | JSONRPCError):
                        self.answered = True
            elif which == "gap":
                resume_logger.warning(
                    "resume session=%s cursor=%s evicted seqs %d..%d marked for the client",
                    self._sid,
                    self._cursor,
                    item.gap.first_seq,
                    item.gap.last_seq,
                )
                await self._send(EventMessage(gap_notice(facts, item.gap.first_seq, item.gap.last_seq), None))
            elif which == "end":
                end = item.end
                resume_logger.info(
                    "resume session=%s cursor=%s stream ended state=%s terminal_seq=%d reason=%s delivered=%d",
                    self._sid,
                    self._cursor,
                    state_name(end.state),
                    end.terminal_seq,
                    end.reason or "-",
                    self.delivered,
                )
                return end
            else:
                raise CursorlogMcpError(f"Read sent a second {which!r}")
        return None

    async def _aborted(self, request_id: Any, facts: dict[str, Any], end: pb.StreamEnd) -> None:
        ended = {
            **facts,
            "state": state_name(end.state),
            "terminal_seq": end.terminal_seq,
            "detail": end.reason if end.HasField("reason") else facts.get("detail"),
        }
        reason = aborted_reason(end.state)
        resume_logger.warning(
            "resume session=%s cursor=%s stream ended without a response: %s", self._sid, self._cursor, reason.value
        )
        await self._send(EventMessage(discontinuity_error(request_id, reason, ended), None))

    async def _check_outcome(self, resolution: pb.Resolution, facts: dict[str, Any], request_id: Any) -> None:
        found = await self._client.get_outcome(self._sid, stream=resolution.cursor.stream)
        outcome = found.outcome
        if found.found and outcome.HasField("frame") and outcome.frame.payload:
            frame = outcome.frame
            if frame.seq > resolution.cursor.seq:
                await self._send(EventMessage(_parse(frame.payload, frame.id), frame.id))
            return  # at or past the frame: the client has its answer
        ended = {**facts, "state": state_name(outcome.state) if found.found else facts.get("state")}
        if found.found and outcome.HasField("reason"):
            ended["detail"] = outcome.reason
        reason = aborted_reason(outcome.state) if found.found else Reason.UNKNOWN_CURSOR
        await self._send(EventMessage(discontinuity_error(request_id, reason, ended), None))

    async def _restart_standalone(self, reason: Reason, facts: dict[str, Any]) -> None:
        """The standalone stream has no pending call to fail: tell the client about the gap with
        a warning, then follow the stream from its head."""
        await self._send(EventMessage(gap_notice({**facts, "reason": reason.value}), None))
        cursor = await self._store.standalone_cursor(self._sid)
        if cursor is None:
            return
        again = Replayer(self._store, self._session, cursor, self._send)
        await again.follow()
