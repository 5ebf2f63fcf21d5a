from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TaskStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATUS_UNSPECIFIED: _ClassVar[TaskStatus]
    WORKING: _ClassVar[TaskStatus]
    INPUT_REQUIRED: _ClassVar[TaskStatus]
    COMPLETED: _ClassVar[TaskStatus]
    FAILED: _ClassVar[TaskStatus]
    CANCELLED: _ClassVar[TaskStatus]

class TaskVerdict(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_VERDICT_UNSPECIFIED: _ClassVar[TaskVerdict]
    TASK_FOUND: _ClassVar[TaskVerdict]
    TASK_EXPIRED: _ClassVar[TaskVerdict]
    TASK_DELETED: _ClassVar[TaskVerdict]
    TASK_UNKNOWN: _ClassVar[TaskVerdict]

class TaskEndCause(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_END_CAUSE_UNSPECIFIED: _ClassVar[TaskEndCause]
    TASK_END_CAUSE_CLIENT: _ClassVar[TaskEndCause]
    TASK_END_CAUSE_TTL_EXPIRED: _ClassVar[TaskEndCause]
    TASK_END_CAUSE_LEASE_EXPIRED: _ClassVar[TaskEndCause]
    TASK_END_CAUSE_FENCED: _ClassVar[TaskEndCause]
TASK_STATUS_UNSPECIFIED: TaskStatus
WORKING: TaskStatus
INPUT_REQUIRED: TaskStatus
COMPLETED: TaskStatus
FAILED: TaskStatus
CANCELLED: TaskStatus
TASK_VERDICT_UNSPECIFIED: TaskVerdict
TASK_FOUND: TaskVerdict
TASK_EXPIRED: TaskVerdict
TASK_DELETED: TaskVerdict
TASK_UNKNOWN: TaskVerdict
TASK_END_CAUSE_UNSPECIFIED: TaskEndCause
TASK_END_CAUSE_CLIENT: TaskEndCause
TASK_END_CAUSE_TTL_EXPIRED: TaskEndCause
TASK_END_CAUSE_LEASE_EXPIRED: TaskEndCause
TASK_END_CAUSE_FENCED: TaskEndCause

class Task(_message.Message):
    __slots__ = ("task_id", "status", "status_message", "created_at_ms", "last_updated_at_ms", "ttl_ms", "poll_interval_ms", "version", "cancel_requested", "context", "request_key", "worker_lease_ms", "ended_at_ms", "end_cause")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATUS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_UPDATED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    POLL_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_KEY_FIELD_NUMBER: _ClassVar[int]
    WORKER_LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    END_CAUSE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    status: TaskStatus
    status_message: str
    created_at_ms: int
    last_updated_at_ms: int
    ttl_ms: int
    poll_interval_ms: int
    version: int
    cancel_requested: bool
    context: bytes
    request_key: str
    worker_lease_ms: int
    ended_at_ms: int
    end_cause: TaskEndCause
    def __init__(self, task_id: _Optional[str] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., status_message: _Optional[str] = ..., created_at_ms: _Optional[int] = ..., last_updated_at_ms: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., poll_interval_ms: _Optional[int] = ..., version: _Optional[int] = ..., cancel_requested: bool = ..., context: _Optional[bytes] = ..., request_key: _Optional[str] = ..., worker_lease_ms: _Optional[int] = ..., ended_at_ms: _Optional[int] = ..., end_cause: _Optional[_Union[TaskEndCause, str]] = ...) -> None: ...

class TaskOutcome(_message.Message):
    __slots__ = ("kind", "json")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[TaskOutcome.Kind]
        RESULT: _ClassVar[TaskOutcome.Kind]
        ERROR: _ClassVar[TaskOutcome.Kind]
    KIND_UNSPECIFIED: TaskOutcome.Kind
    RESULT: TaskOutcome.Kind
    ERROR: TaskOutcome.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    kind: TaskOutcome.Kind
    json: bytes
    def __init__(self, kind: _Optional[_Union[TaskOutcome.Kind, str]] = ..., json: _Optional[bytes] = ...) -> None: ...

class InputSlot(_message.Message):
    __slots__ = ("key", "request", "response")
    KEY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    key: str
    request: bytes
    response: bytes
    def __init__(self, key: _Optional[str] = ..., request: _Optional[bytes] = ..., response: _Optional[bytes] = ...) -> None: ...

class TaskView(_message.Message):
    __slots__ = ("task", "outstanding", "outcome", "outbound_queued", "inbound_queued", "answered")
    TASK_FIELD_NUMBER: _ClassVar[int]
    OUTSTANDING_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    OUTBOUND_QUEUED_FIELD_NUMBER: _ClassVar[int]
    INBOUND_QUEUED_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    task: Task
    outstanding: _containers.RepeatedCompositeFieldContainer[InputSlot]
    outcome: TaskOutcome
    outbound_queued: int
    inbound_queued: int
    answered: _containers.RepeatedCompositeFieldContainer[InputSlot]
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., outstanding: _Optional[_Iterable[_Union[InputSlot, _Mapping]]] = ..., outcome: _Optional[_Union[TaskOutcome, _Mapping]] = ..., outbound_queued: _Optional[int] = ..., inbound_queued: _Optional[int] = ..., answered: _Optional[_Iterable[_Union[InputSlot, _Mapping]]] = ...) -> None: ...

class CreateTaskRequest(_message.Message):
    __slots__ = ("owner", "task_id", "request_key", "ttl_ms", "poll_interval_ms", "worker_lease_ms", "status_message", "context")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_KEY_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    POLL_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    WORKER_LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    STATUS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    owner: str
    task_id: str
    request_key: str
    ttl_ms: int
    poll_interval_ms: int
    worker_lease_ms: int
    status_message: str
    context: bytes
    def __init__(self, owner: _Optional[str] = ..., task_id: _Optional[str] = ..., request_key: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., poll_interval_ms: _Optional[int] = ..., worker_lease_ms: _Optional[int] = ..., status_message: _Optional[str] = ..., context: _Optional[bytes] = ...) -> None: ...

class CreateTaskResponse(_message.Message):
    __slots__ = ("task", "created")
    TASK_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    task: Task
    created: bool
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., created: bool = ...) -> None: ...

class GetTaskRequest(_message.Message):
    __slots__ = ("owner", "task_id", "include_outcome")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    owner: str
    task_id: str
    include_outcome: bool
    def __init__(self, owner: _Optional[str] = ..., task_id: _Optional[str] = ..., include_outcome: bool = ...) -> None: ...

class GetTaskResponse(_message.Message):
    __slots__ = ("verdict", "view", "deleted_at_ms", "final_status")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    DELETED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FINAL_STATUS_FIELD_NUMBER: _ClassVar[int]
    verdict: TaskVerdict
    view: TaskView
    deleted_at_ms: int
    final_status: TaskStatus
    def __init__(self, verdict: _Optional[_Union[TaskVerdict, str]] = ..., view: _Optional[_Union[TaskView, _Mapping]] = ..., deleted_at_ms: _Optional[int] = ..., final_status: _Optional[_Union[TaskStatus, str]] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("owner", "cursor", "page_size")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    owner: str
    cursor: str
    page_size: int
    def __init__(self, owner: _Optional[str] = ..., cursor: _Optional[str] = ..., page_size: _Optional[int] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks", "next_cursor")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    next_cursor: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., next_cursor: _Optional[str] = ...) -> None: ...

class UpdateTaskRequest(_message.Message):
    __slots__ = ("owner", "task_id", "expected_version", "status", "status_message", "ttl_ms", "poll_interval_ms")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATUS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    POLL_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    owner: str
    task_id: str
    expected_version: int
    status: TaskStatus
    status_message: str
    ttl_ms: int
    poll_interval_ms: int
    def __init__(self, owner: _Optional[str] = ..., task_id: _Optional[str] = ..., expected_version: _Optional[int] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., status_message: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., poll_interval_ms: _Optional[int] = ...) -> None: ...

class TaskResponse(_message.Message):
    __slots__ = ("task", "duplicate")
    TASK_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    task: Task
    duplicate: bool
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., duplicate: bool = ...) -> None: ...

class RequestInputRequest(_message.Message):
    __slots__ = ("owner", "task_id", "requests", "status_message")
    class RequestsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    STATUS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    owner: str
    task_id: str
    requests: _containers.ScalarMap[str, bytes]
    status_message: str
    def __init__(self, owner: _Optional[str] = ..., task_id: _Optional[str] = ..., requests: _Optional[_Mapping[str, bytes]] = ..., status_message: _Optional[str] = ...) -> None: ...

class AnswerInputRequest(_message.Message):
    __slots__ = ("owner", "task_id", "responses")
    class ResponsesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    owner: str
    task_id: str
    responses: _containers.ScalarMap[str, bytes]
    def __init__(self, owner: _Optional[str] = ..., task_id: _Optional[str] = ..., responses: _Optional[_Mapping[str, bytes]] = ...) -> None: ...

class AnswerInputResponse(_message.Message):
    __slots__ = ("task", "accepted", "ignored")
    TASK_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    IGNORED_FIELD_NUMBER: _ClassVar[int]
    task: Task
    accepted: _containers.RepeatedScalarFieldContainer[str]
    ignored: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., accepted: _Optional[_Iterable[str]] = ..., ignored: _Optional[_Iterable[str]] = ...) -> None: ...

class CancelTaskRequest(_message.Message):
    __slots__ = ("owner", "task_id", "mode", "status_message")
    class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        MODE_UNSPECIFIED: _ClassVar[CancelTaskRequest.Mode]
        REQUEST: _ClassVar[CancelTaskRequest.Mode]
        TERMINAL: _ClassVar[CancelTaskRequest.Mode]
    MODE_UNSPECIFIED: CancelTaskRequest.Mode
    REQUEST: CancelTaskRequest.Mode
    TERMINAL: CancelTaskRequest.Mode
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    owner: str
    task_id: str
    mode: CancelTaskRequest.Mode
    status_message: str
    def __init__(self, owner: _Optional[str] = ..., task_id: _Optional[str] = ..., mode: _Optional[_Union[CancelTaskRequest.Mode, str]] = ..., status_message: _Optional[str] = ...) -> None: ...

class CancelTaskResponse(_message.Message):
    __slots__ = ("task", "already_terminal")
    TASK_FIELD_NUMBER: _ClassVar[int]
    ALREADY_TERMINAL_FIELD_NUMBER: _ClassVar[int]
    task: Task
    already_terminal: bool
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., already_terminal: bool = ...) -> None: ...

class FinishTaskRequest(_message.Message):
    __slots__ = ("owner", "task_id", "expected_version", "status", "status_message", "outcome")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATUS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    owner: str
    task_id: str
    expected_version: int
    status: TaskStatus
    status_message: str
    outcome: TaskOutcome
    def __init__(self, owner: _Optional[str] = ..., task_id: _Optional[str] = ..., expected_version: _Optional[int] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., status_message: _Optional[str] = ..., outcome: _Optional[_Union[TaskOutcome, _Mapping]] = ...) -> None: ...

class FinishTaskResponse(_message.Message):
    __slots__ = ("task", "duplicate")
    TASK_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    task: Task
    duplicate: bool
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., duplicate: bool = ...) -> None: ...

class DeleteTaskRequest(_message.Message):
    __slots__ = ("owner", "task_id")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    owner: str
    task_id: str
    def __init__(self, owner: _Optional[str] = ..., task_id: _Optional[str] = ...) -> None: ...

class DeleteTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ...) -> None: ...

class WatchTaskRequest(_message.Message):
    __slots__ = ("owner", "task_id", "after_version")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_VERSION_FIELD_NUMBER: _ClassVar[int]
    owner: str
    task_id: str
    after_version: int
    def __init__(self, owner: _Optional[str] = ..., task_id: _Optional[str] = ..., after_version: _Optional[int] = ...) -> None: ...

class KeepAliveTaskRequest(_message.Message):
    __slots__ = ("owner", "task_id")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    owner: str
    task_id: str
    def __init__(self, owner: _Optional[str] = ..., task_id: _Optional[str] = ...) -> None: ...

class KeepAliveTaskResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EnqueueTaskMessageRequest(_message.Message):
    __slots__ = ("owner", "task_id", "channel", "message", "max_len", "dedupe_key", "correlation")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MAX_LEN_FIELD_NUMBER: _ClassVar[int]
    DEDUPE_KEY_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_FIELD_NUMBER: _ClassVar[int]
    owner: str
    task_id: str
    channel: int
    message: bytes
    max_len: int
    dedupe_key: str
    correlation: str
    def __init__(self, owner: _Optional[str] = ..., task_id: _Optional[str] = ..., channel: _Optional[int] = ..., message: _Optional[bytes] = ..., max_len: _Optional[int] = ..., dedupe_key: _Optional[str] = ..., correlation: _Optional[str] = ...) -> None: ...

class EnqueueTaskMessageResponse(_message.Message):
    __slots__ = ("qseq", "duplicate")
    QSEQ_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    qseq: int
    duplicate: bool
    def __init__(self, qseq: _Optional[int] = ..., duplicate: bool = ...) -> None: ...

class RouteTaskMessageRequest(_message.Message):
    __slots__ = ("owner", "correlation", "message")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    owner: str
    correlation: str
    message: bytes
    def __init__(self, owner: _Optional[str] = ..., correlation: _Optional[str] = ..., message: _Optional[bytes] = ...) -> None: ...

class RouteTaskMessageResponse(_message.Message):
    __slots__ = ("routed", "task_id", "qseq", "duplicate")
    ROUTED_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    QSEQ_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    routed: bool
    task_id: str
    qseq: int
    duplicate: bool
    def __init__(self, routed: bool = ..., task_id: _Optional[str] = ..., qseq: _Optional[int] = ..., duplicate: bool = ...) -> None: ...

class DequeueTaskMessagesRequest(_message.Message):
    __slots__ = ("owner", "task_id", "channel", "max_messages", "token")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    owner: str
    task_id: str
    channel: int
    max_messages: int
    token: str
    def __init__(self, owner: _Optional[str] = ..., task_id: _Optional[str] = ..., channel: _Optional[int] = ..., max_messages: _Optional[int] = ..., token: _Optional[str] = ...) -> None: ...

class QueuedTaskMessage(_message.Message):
    __slots__ = ("qseq", "message", "at_ms", "correlation")
    QSEQ_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    AT_MS_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_FIELD_NUMBER: _ClassVar[int]
    qseq: int
    message: bytes
    at_ms: int
    correlation: str
    def __init__(self, qseq: _Optional[int] = ..., message: _Optional[bytes] = ..., at_ms: _Optional[int] = ..., correlation: _Optional[str] = ...) -> None: ...

class DequeueTaskMessagesResponse(_message.Message):
    __slots__ = ("messages", "duplicate")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[QueuedTaskMessage]
    duplicate: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[QueuedTaskMessage, _Mapping]]] = ..., duplicate: bool = ...) -> None: ...

class TaskStreamRequest(_message.Message):
    __slots__ = ("id", "create_task", "get_task", "list_tasks", "update_task", "request_input", "answer_input", "cancel_task", "finish_task", "delete_task", "keep_alive_task", "enqueue_task_message", "dequeue_task_messages", "route_task_message")
    ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_TASK_FIELD_NUMBER: _ClassVar[int]
    GET_TASK_FIELD_NUMBER: _ClassVar[int]
    LIST_TASKS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TASK_FIELD_NUMBER: _ClassVar[int]
    REQUEST_INPUT_FIELD_NUMBER: _ClassVar[int]
    ANSWER_INPUT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_TASK_FIELD_NUMBER: _ClassVar[int]
    FINISH_TASK_FIELD_NUMBER: _ClassVar[int]
    DELETE_TASK_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_TASK_FIELD_NUMBER: _ClassVar[int]
    ENQUEUE_TASK_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DEQUEUE_TASK_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ROUTE_TASK_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    id: int
    create_task: CreateTaskRequest
    get_task: GetTaskRequest
    list_tasks: ListTasksRequest
    update_task: UpdateTaskRequest
    request_input: RequestInputRequest
    answer_input: AnswerInputRequest
    cancel_task: CancelTaskRequest
    finish_task: FinishTaskRequest
    delete_task: DeleteTaskRequest
    keep_alive_task: KeepAliveTaskRequest
    enqueue_task_message: EnqueueTaskMessageRequest
    dequeue_task_messages: DequeueTaskMessagesRequest
    route_task_message: RouteTaskMessageRequest
    def __init__(self, id: _Optional[int] = ..., create_task: _Optional[_Union[CreateTaskRequest, _Mapping]] = ..., get_task: _Optional[_Union[GetTaskRequest, _Mapping]] = ..., list_tasks: _Optional[_Union[ListTasksRequest, _Mapping]] = ..., update_task: _Optional[_Union[UpdateTaskRequest, _Mapping]] = ..., request_input: _Optional[_Union[RequestInputRequest, _Mapping]] = ..., answer_input: _Optional[_Union[AnswerInputRequest, _Mapping]] = ..., cancel_task: _Optional[_Union[CancelTaskRequest, _Mapping]] = ..., finish_task: _Optional[_Union[FinishTaskRequest, _Mapping]] = ..., delete_task: _Optional[_Union[DeleteTaskRequest, _Mapping]] = ..., keep_alive_task: _Optional[_Union[KeepAliveTaskRequest, _Mapping]] = ..., enqueue_task_message: _Optional[_Union[EnqueueTaskMessageRequest, _Mapping]] = ..., dequeue_task_messages: _Optional[_Union[DequeueTaskMessagesRequest, _Mapping]] = ..., route_task_message: _Optional[_Union[RouteTaskMessageRequest, _Mapping]] = ...) -> None: ...

class TaskStreamResponse(_message.Message):
    __slots__ = ("id", "create_task", "get_task", "list_tasks", "update_task", "request_input", "answer_input", "cancel_task", "finish_task", "delete_task", "keep_alive_task", "enqueue_task_message", "dequeue_task_messages", "route_task_message", "failure")
    ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_TASK_FIELD_NUMBER: _ClassVar[int]
    GET_TASK_FIELD_NUMBER: _ClassVar[int]
    LIST_TASKS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TASK_FIELD_NUMBER: _ClassVar[int]
    REQUEST_INPUT_FIELD_NUMBER: _ClassVar[int]
    ANSWER_INPUT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_TASK_FIELD_NUMBER: _ClassVar[int]
    FINISH_TASK_FIELD_NUMBER: _ClassVar[int]
    DELETE_TASK_FIELD_NUMBER: _ClassVar[int]
    KEEP_ALIVE_TASK_FIELD_NUMBER: _ClassVar[int]
    ENQUEUE_TASK_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DEQUEUE_TASK_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ROUTE_TASK_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    id: int
    create_task: CreateTaskResponse
    get_task: GetTaskResponse
    list_tasks: ListTasksResponse
    update_task: TaskResponse
    request_input: TaskResponse
    answer_input: AnswerInputResponse
    cancel_task: CancelTaskResponse
    finish_task: FinishTaskResponse
    delete_task: DeleteTaskResponse
    keep_alive_task: KeepAliveTaskResponse
    enqueue_task_message: EnqueueTaskMessageResponse
    dequeue_task_messages: DequeueTaskMessagesResponse
    route_task_message: RouteTaskMessageResponse
    failure: TaskCallFailure
    def __init__(self, id: _Optional[int] = ..., create_task: _Optional[_Union[CreateTaskResponse, _Mapping]] = ..., get_task: _Optional[_Union[GetTaskResponse, _Mapping]] = ..., list_tasks: _Optional[_Union[ListTasksResponse, _Mapping]] = ..., update_task: _Optional[_Union[TaskResponse, _Mapping]] = ..., request_input: _Optional[_Union[TaskResponse, _Mapping]] = ..., answer_input: _Optional[_Union[AnswerInputResponse, _Mapping]] = ..., cancel_task: _Optional[_Union[CancelTaskResponse, _Mapping]] = ..., finish_task: _Optional[_Union[FinishTaskResponse, _Mapping]] = ..., delete_task: _Optional[_Union[DeleteTaskResponse, _Mapping]] = ..., keep_alive_task: _Optional[_Union[KeepAliveTaskResponse, _Mapping]] = ..., enqueue_task_message: _Optional[_Union[EnqueueTaskMessageResponse, _Mapping]] = ..., dequeue_task_messages: _Optional[_Union[DequeueTaskMessagesResponse, _Mapping]] = ..., route_task_message: _Optional[_Union[RouteTaskMessageResponse, _Mapping]] = ..., failure: _Optional[_Union[TaskCallFailure, _Mapping]] = ...) -> None: ...

class TaskCallFailure(_message.Message):
    __slots__ = ("code", "message", "leader", "retry")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    leader: str
    retry: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., leader: _Optional[str] = ..., retry: _Optional[str] = ...) -> None: ...
