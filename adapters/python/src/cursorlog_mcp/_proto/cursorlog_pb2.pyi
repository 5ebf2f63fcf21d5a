from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StreamState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STREAM_STATE_UNSPECIFIED: _ClassVar[StreamState]
    STREAM_STATE_OPEN: _ClassVar[StreamState]
    STREAM_STATE_COMPLETED: _ClassVar[StreamState]
    STREAM_STATE_ABORTED: _ClassVar[StreamState]
    STREAM_STATE_SUPERSEDED: _ClassVar[StreamState]

class Verdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERDICT_UNSPECIFIED: _ClassVar[Verdict]
    RESUMABLE: _ClassVar[Verdict]
    MALFORMED_CURSOR: _ClassVar[Verdict]
    UNKNOWN_SESSION: _ClassVar[Verdict]
    EPOCH_MISMATCH: _ClassVar[Verdict]
    UNKNOWN_CURSOR: _ClassVar[Verdict]
    STREAM_MISMATCH: _ClassVar[Verdict]
    STREAM_TERMINATED: _ClassVar[Verdict]
    CURSOR_EVICTED: _ClassVar[Verdict]
    CURSOR_AHEAD: _ClassVar[Verdict]
STREAM_STATE_UNSPECIFIED: StreamState
STREAM_STATE_OPEN: StreamState
STREAM_STATE_COMPLETED: StreamState
STREAM_STATE_ABORTED: StreamState
STREAM_STATE_SUPERSEDED: StreamState
VERDICT_UNSPECIFIED: Verdict
RESUMABLE: Verdict
MALFORMED_CURSOR: Verdict
UNKNOWN_SESSION: Verdict
EPOCH_MISMATCH: Verdict
UNKNOWN_CURSOR: Verdict
STREAM_MISMATCH: Verdict
STREAM_TERMINATED: Verdict
CURSOR_EVICTED: Verdict
CURSOR_AHEAD: Verdict

class NewEvent(_message.Message):
    __slots__ = ("kind", "correlation", "payload")
    KIND_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    kind: str
    correlation: str
    payload: bytes
    def __init__(self, kind: _Optional[str] = ..., correlation: _Optional[str] = ..., payload: _Optional[bytes] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("id", "stream", "seq", "kind", "correlation", "payload", "appended_at_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    APPENDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    id: str
    stream: int
    seq: int
    kind: str
    correlation: str
    payload: bytes
    appended_at_ms: int
    def __init__(self, id: _Optional[str] = ..., stream: _Optional[int] = ..., seq: _Optional[int] = ..., kind: _Optional[str] = ..., correlation: _Optional[str] = ..., payload: _Optional[bytes] = ..., appended_at_ms: _Optional[int] = ...) -> None: ...

class Cursor(_message.Message):
    __slots__ = ("epoch", "stream", "seq")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    stream: int
    seq: int
    def __init__(self, epoch: _Optional[int] = ..., stream: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("session", "state")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    session: str
    state: bytes
    def __init__(self, session: _Optional[str] = ..., state: _Optional[bytes] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("session", "epoch", "created", "state")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    session: str
    epoch: int
    created: bool
    state: bytes
    def __init__(self, session: _Optional[str] = ..., epoch: _Optional[int] = ..., created: bool = ..., state: _Optional[bytes] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    def __init__(self, session: _Optional[str] = ...) -> None: ...

class GetSessionResponse(_message.Message):
    __slots__ = ("session", "epoch", "state", "expired", "opened_at_ms", "idle_ttl_ms")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    OPENED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    session: str
    epoch: int
    state: bytes
    expired: bool
    opened_at_ms: int
    idle_ttl_ms: int
    def __init__(self, session: _Optional[str] = ..., epoch: _Optional[int] = ..., state: _Optional[bytes] = ..., expired: bool = ..., opened_at_ms: _Optional[int] = ..., idle_ttl_ms: _Optional[int] = ...) -> None: ...

class SetSessionStateRequest(_message.Message):
    __slots__ = ("session", "state")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    session: str
    state: bytes
    def __init__(self, session: _Optional[str] = ..., state: _Optional[bytes] = ...) -> None: ...

class SetSessionStateResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AdvanceEpochRequest(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    def __init__(self, session: _Optional[str] = ...) -> None: ...

class AdvanceEpochResponse(_message.Message):
    __slots__ = ("epoch", "superseded_streams")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_STREAMS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    superseded_streams: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, epoch: _Optional[int] = ..., superseded_streams: _Optional[_Iterable[int]] = ...) -> None: ...

class ExpireSessionRequest(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    def __init__(self, session: _Optional[str] = ...) -> None: ...

class ExpireSessionResponse(_message.Message):
    __slots__ = ("aborted_streams",)
    ABORTED_STREAMS_FIELD_NUMBER: _ClassVar[int]
    aborted_streams: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, aborted_streams: _Optional[_Iterable[int]] = ...) -> None: ...

class OpenStreamRequest(_message.Message):
    __slots__ = ("session", "epoch", "correlation", "lease_ms")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    session: str
    epoch: int
    correlation: str
    lease_ms: int
    def __init__(self, session: _Optional[str] = ..., epoch: _Optional[int] = ..., correlation: _Optional[str] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class OpenStreamResponse(_message.Message):
    __slots__ = ("stream", "epoch", "start_event_id")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    stream: int
    epoch: int
    start_event_id: str
    def __init__(self, stream: _Optional[int] = ..., epoch: _Optional[int] = ..., start_event_id: _Optional[str] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("session", "stream", "expected_next_seq", "events")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    session: str
    stream: int
    expected_next_seq: int
    events: _containers.RepeatedCompositeFieldContainer[NewEvent]
    def __init__(self, session: _Optional[str] = ..., stream: _Optional[int] = ..., expected_next_seq: _Optional[int] = ..., events: _Optional[_Iterable[_Union[NewEvent, _Mapping]]] = ...) -> None: ...

class AppendBatchRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[BatchItem]
    def __init__(self, items: _Optional[_Iterable[_Union[BatchItem, _Mapping]]] = ...) -> None: ...

class BatchItem(_message.Message):
    __slots__ = ("append", "complete", "open")
    APPEND_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    append: AppendRequest
    complete: CompleteRequest
    open: OpenStreamRequest
    def __init__(self, append: _Optional[_Union[AppendRequest, _Mapping]] = ..., complete: _Optional[_Union[CompleteRequest, _Mapping]] = ..., open: _Optional[_Union[OpenStreamRequest, _Mapping]] = ...) -> None: ...

class AppendBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[BatchResult, _Mapping]]] = ...) -> None: ...

class BatchResult(_message.Message):
    __slots__ = ("appended", "completed", "failure", "opened")
    APPENDED_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    OPENED_FIELD_NUMBER: _ClassVar[int]
    appended: AppendResponse
    completed: TerminateResponse
    failure: Failure
    opened: OpenStreamResponse
    def __init__(self, appended: _Optional[_Union[AppendResponse, _Mapping]] = ..., completed: _Optional[_Union[TerminateResponse, _Mapping]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., opened: _Optional[_Union[OpenStreamResponse, _Mapping]] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("epoch", "stream", "first_seq", "last_seq", "duplicate", "event_ids")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    EVENT_IDS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    stream: int
    first_seq: int
    last_seq: int
    duplicate: bool
    event_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, epoch: _Optional[int] = ..., stream: _Optional[int] = ..., first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ..., duplicate: bool = ..., event_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AppendResult(_message.Message):
    __slots__ = ("appended", "failure")
    APPENDED_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    appended: AppendResponse
    failure: Failure
    def __init__(self, appended: _Optional[_Union[AppendResponse, _Mapping]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class CompleteRequest(_message.Message):
    __slots__ = ("session", "stream", "expected_next_seq", "terminal")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_FIELD_NUMBER: _ClassVar[int]
    session: str
    stream: int
    expected_next_seq: int
    terminal: NewEvent
    def __init__(self, session: _Optional[str] = ..., stream: _Optional[int] = ..., expected_next_seq: _Optional[int] = ..., terminal: _Optional[_Union[NewEvent, _Mapping]] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("session", "stream", "reason", "terminal")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_FIELD_NUMBER: _ClassVar[int]
    session: str
    stream: int
    reason: str
    terminal: NewEvent
    def __init__(self, session: _Optional[str] = ..., stream: _Optional[int] = ..., reason: _Optional[str] = ..., terminal: _Optional[_Union[NewEvent, _Mapping]] = ...) -> None: ...

class TerminateResponse(_message.Message):
    __slots__ = ("stream", "state", "terminal_seq", "terminal_event_id", "duplicate")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    stream: int
    state: StreamState
    terminal_seq: int
    terminal_event_id: str
    duplicate: bool
    def __init__(self, stream: _Optional[int] = ..., state: _Optional[_Union[StreamState, str]] = ..., terminal_seq: _Optional[int] = ..., terminal_event_id: _Optional[str] = ..., duplicate: bool = ...) -> None: ...

class KeepAliveRequest(_message.Message):
    __slots__ = ("session", "stream")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    session: str
    stream: int
    def __init__(self, session: _Optional[str] = ..., stream: _Optional[int] = ...) -> None: ...

class KeepAliveResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResolveRequest(_message.Message):
    __slots__ = ("session", "last_event_id", "declared_stream")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    LAST_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    DECLARED_STREAM_FIELD_NUMBER: _ClassVar[int]
    session: str
    last_event_id: str
    declared_stream: int
    def __init__(self, session: _Optional[str] = ..., last_event_id: _Optional[str] = ..., declared_stream: _Optional[int] = ...) -> None: ...

class Resolution(_message.Message):
    __slots__ = ("verdict", "cursor", "current_epoch", "stream_state", "head", "terminal_seq", "watermark", "session_expired", "detail", "missed_terminal_frame", "correlation")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    CURRENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    STREAM_STATE_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    SESSION_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    MISSED_TERMINAL_FRAME_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_FIELD_NUMBER: _ClassVar[int]
    verdict: Verdict
    cursor: Cursor
    current_epoch: int
    stream_state: StreamState
    head: int
    terminal_seq: int
    watermark: int
    session_expired: bool
    detail: str
    missed_terminal_frame: bool
    correlation: str
    def __init__(self, verdict: _Optional[_Union[Verdict, str]] = ..., cursor: _Optional[_Union[Cursor, _Mapping]] = ..., current_epoch: _Optional[int] = ..., stream_state: _Optional[_Union[StreamState, str]] = ..., head: _Optional[int] = ..., terminal_seq: _Optional[int] = ..., watermark: _Optional[int] = ..., session_expired: bool = ..., detail: _Optional[str] = ..., missed_terminal_frame: bool = ..., correlation: _Optional[str] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("session", "last_event_id", "declared_stream", "follow", "batch_events_max", "resume_own_stream")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    LAST_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    DECLARED_STREAM_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    BATCH_EVENTS_MAX_FIELD_NUMBER: _ClassVar[int]
    RESUME_OWN_STREAM_FIELD_NUMBER: _ClassVar[int]
    session: str
    last_event_id: str
    declared_stream: int
    follow: bool
    batch_events_max: int
    resume_own_stream: bool
    def __init__(self, session: _Optional[str] = ..., last_event_id: _Optional[str] = ..., declared_stream: _Optional[int] = ..., follow: bool = ..., batch_events_max: _Optional[int] = ..., resume_own_stream: bool = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("resolution", "events", "end", "gap")
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    GAP_FIELD_NUMBER: _ClassVar[int]
    resolution: Resolution
    events: EventBatch
    end: StreamEnd
    gap: EvictedGap
    def __init__(self, resolution: _Optional[_Union[Resolution, _Mapping]] = ..., events: _Optional[_Union[EventBatch, _Mapping]] = ..., end: _Optional[_Union[StreamEnd, _Mapping]] = ..., gap: _Optional[_Union[EvictedGap, _Mapping]] = ...) -> None: ...

class EvictedGap(_message.Message):
    __slots__ = ("first_seq", "last_seq")
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    first_seq: int
    last_seq: int
    def __init__(self, first_seq: _Optional[int] = ..., last_seq: _Optional[int] = ...) -> None: ...

class EventBatch(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

class StreamEnd(_message.Message):
    __slots__ = ("state", "terminal_seq", "terminal_event_id", "reason")
    STATE_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    state: StreamState
    terminal_seq: int
    terminal_event_id: str
    reason: str
    def __init__(self, state: _Optional[_Union[StreamState, str]] = ..., terminal_seq: _Optional[int] = ..., terminal_event_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class GetOutcomeRequest(_message.Message):
    __slots__ = ("session", "correlation", "stream")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    session: str
    correlation: str
    stream: int
    def __init__(self, session: _Optional[str] = ..., correlation: _Optional[str] = ..., stream: _Optional[int] = ...) -> None: ...

class GetOutcomeResponse(_message.Message):
    __slots__ = ("found", "outcome")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    found: bool
    outcome: Outcome
    def __init__(self, found: bool = ..., outcome: _Optional[_Union[Outcome, _Mapping]] = ...) -> None: ...

class Outcome(_message.Message):
    __slots__ = ("stream", "epoch", "state", "terminal_seq", "terminal_event_id", "frame", "reason")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_SEQ_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    stream: int
    epoch: int
    state: StreamState
    terminal_seq: int
    terminal_event_id: str
    frame: Event
    reason: str
    def __init__(self, stream: _Optional[int] = ..., epoch: _Optional[int] = ..., state: _Optional[_Union[StreamState, str]] = ..., terminal_seq: _Optional[int] = ..., terminal_event_id: _Optional[str] = ..., frame: _Optional[_Union[Event, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class TrimRequest(_message.Message):
    __slots__ = ("session", "stream", "up_to_seq")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    UP_TO_SEQ_FIELD_NUMBER: _ClassVar[int]
    session: str
    stream: int
    up_to_seq: int
    def __init__(self, session: _Optional[str] = ..., stream: _Optional[int] = ..., up_to_seq: _Optional[int] = ...) -> None: ...

class TrimResponse(_message.Message):
    __slots__ = ("watermark",)
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    watermark: int
    def __init__(self, watermark: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("sessions", "streams", "segments", "log_bytes", "last_lsn", "events_appended", "payload_bytes_appended", "fsyncs", "commit_batches", "records_written", "segments_deleted", "recovery_micros", "active_followers", "live_sessions", "open_streams", "poisoned", "disk_free_bytes", "appends_refused_low_disk", "sessions_expired_idle", "active_reads")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    LOG_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAST_LSN_FIELD_NUMBER: _ClassVar[int]
    EVENTS_APPENDED_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_APPENDED_FIELD_NUMBER: _ClassVar[int]
    FSYNCS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_BATCHES_FIELD_NUMBER: _ClassVar[int]
    RECORDS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_DELETED_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_MICROS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FOLLOWERS_FIELD_NUMBER: _ClassVar[int]
    LIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    OPEN_STREAMS_FIELD_NUMBER: _ClassVar[int]
    POISONED_FIELD_NUMBER: _ClassVar[int]
    DISK_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    APPENDS_REFUSED_LOW_DISK_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_EXPIRED_IDLE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_READS_FIELD_NUMBER: _ClassVar[int]
    sessions: int
    streams: int
    segments: int
    log_bytes: int
    last_lsn: int
    events_appended: int
    payload_bytes_appended: int
    fsyncs: int
    commit_batches: int
    records_written: int
    segments_deleted: int
    recovery_micros: int
    active_followers: int
    live_sessions: int
    open_streams: int
    poisoned: bool
    disk_free_bytes: int
    appends_refused_low_disk: int
    sessions_expired_idle: int
    active_reads: int
    def __init__(self, sessions: _Optional[int] = ..., streams: _Optional[int] = ..., segments: _Optional[int] = ..., log_bytes: _Optional[int] = ..., last_lsn: _Optional[int] = ..., events_appended: _Optional[int] = ..., payload_bytes_appended: _Optional[int] = ..., fsyncs: _Optional[int] = ..., commit_batches: _Optional[int] = ..., records_written: _Optional[int] = ..., segments_deleted: _Optional[int] = ..., recovery_micros: _Optional[int] = ..., active_followers: _Optional[int] = ..., live_sessions: _Optional[int] = ..., open_streams: _Optional[int] = ..., poisoned: bool = ..., disk_free_bytes: _Optional[int] = ..., appends_refused_low_disk: _Optional[int] = ..., sessions_expired_idle: _Optional[int] = ..., active_reads: _Optional[int] = ...) -> None: ...
