"""Verdict → what the MCP client sees: the pure part of a resume.

``plan(resolution)`` decides, from cursorlog's Resolution alone, what a replica does with a
``Last-Event-ID``; ``discontinuity_error`` builds the JSON-RPC error response that ends the
client's pending call when the cursor cannot be continued. ``SessionEventStore`` carries
the plan out (see ``store.py``).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

from mcp_types import ErrorData, JSONRPCError, JSONRPCNotification, RequestId

from ._proto import cursorlog_pb2 as pb
from .errors import PRODUCER_ABORTED, RESUME_DISCONTINUITY

STANDALONE_CORRELATION = "mcp:standalone"
"""Correlation of a session's standalone (GET) stream; never issued for a request."""

_RESERVED_PREFIX = "mcp:"
_ESCAPED_PREFIX = "mcp:req:"
_INTEGER_ID = re.compile(r"-?(0|[1-9][0-9]{0,17})")


def correlation_for_request(sdk_stream_id: str) -> str:
    """The OpenStream correlation for an SDK request stream id (``str(request.id)``).

    Request ids are used verbatim, except ids that start with ``mcp:`` (the adapter's
    reserved namespace), which get the prefix ``mcp:req:`` so that no request can take the
    correlation of a session's standalone stream.
    """
    if sdk_stream_id.startswith(_RESERVED_PREFIX):
        return _ESCAPED_PREFIX + sdk_stream_id
    return sdk_stream_id


def request_id_from_correlation(correlation: str | None) -> RequestId | None:
    """The JSON-RPC id to answer for a stream's correlation; None when unknown.

    The SDK keys request streams by ``str(request.id)``, so the original type is lost; an
    integer-looking id is answered as an integer (what the SDK client and most clients send).
    The SDK client replaces the id of any response on a resumed stream with its pending
    request's id anyway.
    """
    if correlation is None:
        return None
    raw = correlation[len(_ESCAPED_PREFIX) :] if correlation.startswith(_ESCAPED_PREFIX) else correlation
    if correlation.startswith(_RESERVED_PREFIX) and not correlation.startswith(_ESCAPED_PREFIX):
        return None
    if _INTEGER_ID.fullmatch(raw):
        return int(raw)
    return raw


def verdict_name(verdict: int) -> str:
    return str(pb.Verdict.Name(verdict))


def state_name(state: int) -> str:
    """``ABORTED`` for ``STREAM_STATE_ABORTED``."""
    return str(pb.StreamState.Name(state)).removeprefix("STREAM_STATE_")


def cursor_text(cursor: pb.Cursor) -> str:
    return f"{cursor.epoch}-{cursor.stream}-{cursor.seq}"


def resolution_facts(resolution: pb.Resolution, last_event_id: str) -> dict[str, Any]:
    """The verdict and its facts, as put into the error's ``data`` and the log line."""
    facts: dict[str, Any] = {"verdict": verdict_name(resolution.verdict), "cursor": last_event_id}
    if resolution.HasField("current_epoch"):
        facts["current_epoch"] = resolution.current_epoch
    if resolution.HasField("stream_state"):
        facts["state"] = state_name(resolution.stream_state)
    if resolution.HasField("head"):
        facts["head"] = resolution.head
    if resolution.HasField("watermark"):
        facts["watermark"] = resolution.watermark
    if resolution.HasField("terminal_seq"):
        facts["terminal_seq"] = resolution.terminal_seq
    if resolution.HasField("detail"):
        facts["detail"] = resolution.detail
    if resolution.session_expired:
        facts["session_expired"] = True
    if resolution.missed_terminal_frame:
        facts["missed_terminal_frame"] = True
    return facts


class Reason(enum.StrEnum):
    """Why a resumed call cannot continue (``error.data.reason``)."""

    CURSOR_EVICTED = "cursor_evicted"
    CURSOR_AHEAD = "cursor_ahead"
    UNKNOWN_CURSOR = "unknown_cursor"
    MALFORMED_CURSOR = "malformed_cursor"
    UNKNOWN_SESSION = "unknown_session"
    STREAM_MISMATCH = "stream_mismatch"
    PRODUCER_ABORTED = "producer_aborted"
    STREAM_SUPERSEDED = "stream_superseded"


_MESSAGES: dict[Reason, str] = {
    Reason.CURSOR_EVICTED: (
        "Cannot resume {what}: the events after Last-Event-ID {cursor} were evicted from the event log "
        "by retention, so messages of this response were lost. The request may have finished; "
        "reconcile its outcome, or re-issue it as a new request."
    ),
    Reason.CURSOR_AHEAD: (
        "Cannot resume {what}: Last-Event-ID {cursor} is beyond anything the server recorded for its "
        "stream (never issued, or lost). Re-issue the request as a new request."
    ),
    Reason.UNKNOWN_CURSOR: (
        "Cannot resume {what}: Last-Event-ID {cursor} does not name a stream of this session. "
        "Re-issue the request as a new request."
    ),
    Reason.MALFORMED_CURSOR: (
        "Cannot resume {what}: Last-Event-ID {cursor} is not an event id issued by this server. "
        "Re-issue the request as a new request."
    ),
    Reason.UNKNOWN_SESSION: (
        "Cannot resume {what}: the session has ended or expired. Initialize a new session and re-issue the request."
    ),
    Reason.STREAM_MISMATCH: (
        "Cannot resume {what}: Last-Event-ID {cursor} belongs to another stream. Re-issue the request as a new request."
    ),
    Reason.PRODUCER_ABORTED: (
        "Cannot resume {what}: the server stopped producing its response ({detail}); no result will "
        "arrive. Re-issue the request as a new request."
    ),
    Reason.STREAM_SUPERSEDED: (
        "Cannot resume {what}: its stream was superseded by a newer session epoch ({detail}); no result "
        "will arrive. Re-issue the request as a new request."
    ),
}


_ABORTED_REASONS = frozenset({Reason.PRODUCER_ABORTED, Reason.STREAM_SUPERSEDED})


def discontinuity_error(request_id: RequestId | None, reason: Reason, facts: dict[str, Any]) -> JSONRPCError:
    """The JSON-RPC error response that ends a resumed call which cannot continue.

    ``data`` holds the reason and the verdict's facts (verdict, cursor, head, watermark,
    terminal_seq, state, detail, ...).
    """
    what = f"request {request_id!r}" if request_id is not None else "the request"
    message = _MESSAGES[reason].format(
        what=what, cursor=facts.get("cursor", "?"), detail=facts.get("detail") or facts.get("state") or "no detail"
    )
    data = {"reason": reason.value, **facts}
    code = PRODUCER_ABORTED if reason in _ABORTED_REASONS else RESUME_DISCONTINUITY
    return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=code, message=message, data=data))


def gap_notice(facts: dict[str, Any], first_seq: int | None = None, last_seq: int | None = None) -> JSONRPCNotification:
    """The ``notifications/message`` warning that marks evicted events where the client sees them.

    Sent before the retained rest of the stream, so the client knows that messages between its
    cursor and the next event are gone (``data.lostSeqs``) and that what follows is still the
    truth: the call goes on and its real result will arrive.
    """
    data: dict[str, Any] = {
        "reason": Reason.CURSOR_EVICTED.value,
        "message": (
            "some messages of this stream were evicted from the event log before they could be "
            "delivered; the stream continues with what is still retained"
        ),
        **facts,
    }
    if first_seq is not None and last_seq is not None:
        data["lostSeqs"] = [first_seq, last_seq]
    return JSONRPCNotification(
        jsonrpc="2.0",
        method="notifications/message",
        params={"level": "warning", "logger": "cursorlog", "data": data},
    )


class EvictedMode(enum.StrEnum):
    """What a resumed call whose cursor was evicted gets (``CursorlogEventStore(on_evicted=...)``)."""

    GAP = "gap"
    """A ``notifications/message`` warning with the verdict's facts, then the retained rest of
    the stream and its result ("state as truth"). The default."""
    ERROR = "error"
    """A ``-32011`` error response that ends the pending call (re-issue it)."""


class Action(enum.Enum):
    """What a replica does with a Last-Event-ID, decided by the verdict alone."""

    REPLAY_AND_FOLLOW = "replay_and_follow"
    """RESUMABLE, or a finished stream whose end the client missed: replay after the cursor
    (with ``resume_own_stream``), follow live appends until the stream's end."""
    GAP_AND_FOLLOW = "gap_and_follow"
    """CURSOR_EVICTED: mark the gap, then replay the retained rest and follow."""
    CHECK_OUTCOME = "check_outcome"
    """A stream that ended ABORTED/SUPERSEDED at the cursor: the client has an answer only if
    the stream ended with a frame at or before the cursor."""
    END = "end"
    """EPOCH_MISMATCH, or a COMPLETED stream at its terminal seq: nothing to deliver."""
    FAIL = "fail"
    """Any other verdict: end the pending call with a discontinuity error."""


@dataclass(frozen=True)
class Plan:
    action: Action
    reason: Reason | None = None


_FAIL_REASONS: dict[int, Reason] = {
    pb.CURSOR_EVICTED: Reason.CURSOR_EVICTED,
    pb.CURSOR_AHEAD: Reason.CURSOR_AHEAD,
    pb.UNKNOWN_CURSOR: Reason.UNKNOWN_CURSOR,
    pb.MALFORMED_CURSOR: Reason.MALFORMED_CURSOR,
    pb.UNKNOWN_SESSION: Reason.UNKNOWN_SESSION,
    pb.STREAM_MISMATCH: Reason.STREAM_MISMATCH,
}


def plan(resolution: pb.Resolution, on_evicted: EvictedMode = EvictedMode.GAP) -> Plan:
    """The action for a Resolution of a client resuming its own stream (a GET with
    Last-Event-ID), per the corrected verdict table of DESIGN.md."""
    verdict = resolution.verdict
    if verdict == pb.RESUMABLE:
        return Plan(Action.REPLAY_AND_FOLLOW)
    if verdict == pb.STREAM_TERMINATED:
        if resolution.missed_terminal_frame:
            return Plan(Action.REPLAY_AND_FOLLOW)
        if resolution.stream_state == pb.STREAM_STATE_COMPLETED:
            return Plan(Action.END)  # the cursor is the result frame: the client has everything
        # ABORTED/SUPERSEDED: the terminal seq is the head when there is no terminal frame, so
        # a client at it may have no answer. The outcome tells whether a frame exists.
        return Plan(Action.CHECK_OUTCOME)
    if verdict == pb.CURSOR_EVICTED and on_evicted is EvictedMode.GAP:
        return Plan(Action.GAP_AND_FOLLOW, Reason.CURSOR_EVICTED)
    if verdict == pb.EPOCH_MISMATCH:
        return Plan(Action.END)
    reason = _FAIL_REASONS.get(verdict)
    if reason is None:
        raise ValueError(f"cursorlog sent an unknown verdict {verdict}")
    return Plan(Action.FAIL, reason)


def aborted_reason(state: int) -> Reason:
    """The reason for a stream that ended without a terminal frame."""
    return Reason.STREAM_SUPERSEDED if state == pb.STREAM_STATE_SUPERSEDED else Reason.PRODUCER_ABORTED
