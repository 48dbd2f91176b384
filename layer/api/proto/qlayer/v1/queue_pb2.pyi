from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AckOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACK_OP_UNSPECIFIED: _ClassVar[AckOp]
    ACK_OP_ACK: _ClassVar[AckOp]
    ACK_OP_CANCEL: _ClassVar[AckOp]
    ACK_OP_EXPIRE: _ClassVar[AckOp]
    ACK_OP_EXTEND: _ClassVar[AckOp]
ACK_OP_UNSPECIFIED: AckOp
ACK_OP_ACK: AckOp
ACK_OP_CANCEL: AckOp
ACK_OP_EXPIRE: AckOp
ACK_OP_EXTEND: AckOp

class ClientFrame(_message.Message):
    __slots__ = ("subscribe", "ack", "close", "replace", "check")
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    subscribe: Subscribe
    ack: Ack
    close: Close
    replace: Replace
    check: Check
    def __init__(self, subscribe: _Optional[_Union[Subscribe, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., close: _Optional[_Union[Close, _Mapping]] = ..., replace: _Optional[_Union[Replace, _Mapping]] = ..., check: _Optional[_Union[Check, _Mapping]] = ...) -> None: ...

class Subscribe(_message.Message):
    __slots__ = ("queue", "max_backlog", "client_name", "filter", "batch_frames", "message_columns", "common_columns")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_BACKLOG_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    BATCH_FRAMES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    COMMON_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    max_backlog: int
    client_name: str
    filter: str
    batch_frames: bool
    message_columns: bool
    common_columns: bool
    def __init__(self, queue: _Optional[str] = ..., max_backlog: _Optional[int] = ..., client_name: _Optional[str] = ..., filter: _Optional[str] = ..., batch_frames: _Optional[bool] = ..., message_columns: _Optional[bool] = ..., common_columns: _Optional[bool] = ...) -> None: ...

class OffsetRuns(_message.Message):
    __slots__ = ("topic", "partition", "runs")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    runs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., runs: _Optional[_Iterable[int]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("request_id", "op", "offsets", "seconds")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    op: AckOp
    offsets: _containers.RepeatedCompositeFieldContainer[OffsetRuns]
    seconds: float
    def __init__(self, request_id: _Optional[int] = ..., op: _Optional[_Union[AckOp, str]] = ..., offsets: _Optional[_Iterable[_Union[OffsetRuns, _Mapping]]] = ..., seconds: _Optional[float] = ...) -> None: ...

class Close(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Replace(_message.Message):
    __slots__ = ("request_id", "queue", "max_backlog", "filter")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_BACKLOG_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    queue: str
    max_backlog: int
    filter: str
    def __init__(self, request_id: _Optional[int] = ..., queue: _Optional[str] = ..., max_backlog: _Optional[int] = ..., filter: _Optional[str] = ...) -> None: ...

class Check(_message.Message):
    __slots__ = ("request_id", "made_at")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MADE_AT_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    made_at: float
    def __init__(self, request_id: _Optional[int] = ..., made_at: _Optional[float] = ...) -> None: ...

class ServerFrame(_message.Message):
    __slots__ = ("subscribed", "messages", "ack_result", "error", "replaced", "batch", "checked")
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ACK_RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    CHECKED_FIELD_NUMBER: _ClassVar[int]
    subscribed: Subscribed
    messages: Messages
    ack_result: AckResult
    error: Error
    replaced: Replaced
    batch: Batch
    checked: Checked
    def __init__(self, subscribed: _Optional[_Union[Subscribed, _Mapping]] = ..., messages: _Optional[_Union[Messages, _Mapping]] = ..., ack_result: _Optional[_Union[AckResult, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., replaced: _Optional[_Union[Replaced, _Mapping]] = ..., batch: _Optional[_Union[Batch, _Mapping]] = ..., checked: _Optional[_Union[Checked, _Mapping]] = ...) -> None: ...

class Checked(_message.Message):
    __slots__ = ("request_id", "current", "server_time", "wall_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_FIELD_NUMBER: _ClassVar[int]
    WALL_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    current: bool
    server_time: float
    wall_ms: int
    def __init__(self, request_id: _Optional[int] = ..., current: _Optional[bool] = ..., server_time: _Optional[float] = ..., wall_ms: _Optional[int] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[ServerFrame]
    def __init__(self, frames: _Optional[_Iterable[_Union[ServerFrame, _Mapping]]] = ...) -> None: ...

class Subscribed(_message.Message):
    __slots__ = ("subscription_id", "backlog", "lease_period_s", "server_time", "stale_after_s")
    SUBSCRIPTION_ID_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    LEASE_PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_FIELD_NUMBER: _ClassVar[int]
    STALE_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    subscription_id: str
    backlog: int
    lease_period_s: float
    server_time: float
    stale_after_s: float
    def __init__(self, subscription_id: _Optional[str] = ..., backlog: _Optional[int] = ..., lease_period_s: _Optional[float] = ..., server_time: _Optional[float] = ..., stale_after_s: _Optional[float] = ...) -> None: ...

class Messages(_message.Message):
    __slots__ = ("messages", "columns", "made_at")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    MADE_AT_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    columns: MessageColumns
    made_at: float
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., columns: _Optional[_Union[MessageColumns, _Mapping]] = ..., made_at: _Optional[float] = ...) -> None: ...

class MessageColumns(_message.Message):
    __slots__ = ("topic", "partition", "offset", "key", "value", "timestamp_ms", "deliveries", "cancels", "lease_deadline_ms", "queue", "flags", "parse_error", "header_count", "headers", "common_topic", "common_queue", "common_flags", "common_deliveries", "common_cancels", "common_lease_deadline_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    CANCELS_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    PARSE_ERROR_FIELD_NUMBER: _ClassVar[int]
    HEADER_COUNT_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    COMMON_TOPIC_FIELD_NUMBER: _ClassVar[int]
    COMMON_QUEUE_FIELD_NUMBER: _ClassVar[int]
    COMMON_FLAGS_FIELD_NUMBER: _ClassVar[int]
    COMMON_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    COMMON_CANCELS_FIELD_NUMBER: _ClassVar[int]
    COMMON_LEASE_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    topic: _containers.RepeatedScalarFieldContainer[str]
    partition: _containers.RepeatedScalarFieldContainer[int]
    offset: _containers.RepeatedScalarFieldContainer[int]
    key: _containers.RepeatedScalarFieldContainer[bytes]
    value: _containers.RepeatedScalarFieldContainer[bytes]
    timestamp_ms: _containers.RepeatedScalarFieldContainer[int]
    deliveries: _containers.RepeatedScalarFieldContainer[int]
    cancels: _containers.RepeatedScalarFieldContainer[int]
    lease_deadline_ms: _containers.RepeatedScalarFieldContainer[int]
    queue: _containers.RepeatedScalarFieldContainer[str]
    flags: _containers.RepeatedScalarFieldContainer[int]
    parse_error: _containers.RepeatedScalarFieldContainer[str]
    header_count: _containers.RepeatedScalarFieldContainer[int]
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    common_topic: str
    common_queue: str
    common_flags: int
    common_deliveries: int
    common_cancels: int
    common_lease_deadline_ms: int
    def __init__(self, topic: _Optional[_Iterable[str]] = ..., partition: _Optional[_Iterable[int]] = ..., offset: _Optional[_Iterable[int]] = ..., key: _Optional[_Iterable[bytes]] = ..., value: _Optional[_Iterable[bytes]] = ..., timestamp_ms: _Optional[_Iterable[int]] = ..., deliveries: _Optional[_Iterable[int]] = ..., cancels: _Optional[_Iterable[int]] = ..., lease_deadline_ms: _Optional[_Iterable[int]] = ..., queue: _Optional[_Iterable[str]] = ..., flags: _Optional[_Iterable[int]] = ..., parse_error: _Optional[_Iterable[str]] = ..., header_count: _Optional[_Iterable[int]] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., common_topic: _Optional[str] = ..., common_queue: _Optional[str] = ..., common_flags: _Optional[int] = ..., common_deliveries: _Optional[int] = ..., common_cancels: _Optional[int] = ..., common_lease_deadline_ms: _Optional[int] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("topic", "partition", "offset", "key", "value", "headers", "timestamp_ms", "deliveries", "cancels", "lease_deadline_ms", "barrier", "queue", "parse_error")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    CANCELS_FIELD_NUMBER: _ClassVar[int]
    LEASE_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    BARRIER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PARSE_ERROR_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    timestamp_ms: int
    deliveries: int
    cancels: int
    lease_deadline_ms: int
    barrier: bool
    queue: str
    parse_error: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., timestamp_ms: _Optional[int] = ..., deliveries: _Optional[int] = ..., cancels: _Optional[int] = ..., lease_deadline_ms: _Optional[int] = ..., barrier: _Optional[bool] = ..., queue: _Optional[str] = ..., parse_error: _Optional[str] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: bytes
    def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class AckResult(_message.Message):
    __slots__ = ("request_id", "failures")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    failures: _containers.RepeatedCompositeFieldContainer[AckFailure]
    def __init__(self, request_id: _Optional[int] = ..., failures: _Optional[_Iterable[_Union[AckFailure, _Mapping]]] = ...) -> None: ...

class AckFailure(_message.Message):
    __slots__ = ("bookmark", "error", "message")
    BOOKMARK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    bookmark: str
    error: str
    message: str
    def __init__(self, bookmark: _Optional[str] = ..., error: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message", "request_id")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    request_id: int
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., request_id: _Optional[int] = ...) -> None: ...

class Replaced(_message.Message):
    __slots__ = ("request_id", "backlog")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    backlog: int
    def __init__(self, request_id: _Optional[int] = ..., backlog: _Optional[int] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("queue", "value", "key", "headers")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    value: bytes
    key: bytes
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    def __init__(self, queue: _Optional[str] = ..., value: _Optional[bytes] = ..., key: _Optional[bytes] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ...) -> None: ...

class PublishReply(_message.Message):
    __slots__ = ("topic", "partition", "offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    def __init__(self, queue: _Optional[str] = ...) -> None: ...

class StatsReply(_message.Message):
    __slots__ = ("queues", "missing")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueStats]
    missing: _containers.RepeatedCompositeFieldContainer[StatsMissing]
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueStats, _Mapping]]] = ..., missing: _Optional[_Iterable[_Union[StatsMissing, _Mapping]]] = ...) -> None: ...

class StatsMissing(_message.Message):
    __slots__ = ("member", "address", "reason", "queues")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    member: str
    address: str
    reason: str
    queues: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, member: _Optional[str] = ..., address: _Optional[str] = ..., reason: _Optional[str] = ..., queues: _Optional[_Iterable[str]] = ...) -> None: ...

class QueueStats(_message.Message):
    __slots__ = ("queue", "available", "leased", "inactive", "subscriptions", "oldest_available_age_s", "delivered_total", "acked_total", "dead_lettered_total", "extra", "owner")
    class ExtraEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    INACTIVE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    OLDEST_AVAILABLE_AGE_S_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ACKED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    queue: str
    available: int
    leased: int
    inactive: int
    subscriptions: int
    oldest_available_age_s: float
    delivered_total: int
    acked_total: int
    dead_lettered_total: int
    extra: _containers.ScalarMap[str, float]
    owner: str
    def __init__(self, queue: _Optional[str] = ..., available: _Optional[int] = ..., leased: _Optional[int] = ..., inactive: _Optional[int] = ..., subscriptions: _Optional[int] = ..., oldest_available_age_s: _Optional[float] = ..., delivered_total: _Optional[int] = ..., acked_total: _Optional[int] = ..., dead_lettered_total: _Optional[int] = ..., extra: _Optional[_Mapping[str, float]] = ..., owner: _Optional[str] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListQueuesReply(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueInfo]
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueInfo, _Mapping]]] = ...) -> None: ...

class QueueInfo(_message.Message):
    __slots__ = ("name", "underlying_topic", "semantics", "message_type", "lease_period_s", "max_per_subscription_backlog", "dead_letter_topic", "default_publish_target")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UNDERLYING_TOPIC_FIELD_NUMBER: _ClassVar[int]
    SEMANTICS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    LEASE_PERIOD_S_FIELD_NUMBER: _ClassVar[int]
    MAX_PER_SUBSCRIPTION_BACKLOG_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_TOPIC_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_PUBLISH_TARGET_FIELD_NUMBER: _ClassVar[int]
    name: str
    underlying_topic: str
    semantics: str
    message_type: str
    lease_period_s: float
    max_per_subscription_backlog: int
    dead_letter_topic: str
    default_publish_target: str
    def __init__(self, name: _Optional[str] = ..., underlying_topic: _Optional[str] = ..., semantics: _Optional[str] = ..., message_type: _Optional[str] = ..., lease_period_s: _Optional[float] = ..., max_per_subscription_backlog: _Optional[int] = ..., dead_letter_topic: _Optional[str] = ..., default_publish_target: _Optional[str] = ...) -> None: ...

class BrowseRequest(_message.Message):
    __slots__ = ("queue", "filter", "limit")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    queue: str
    filter: str
    limit: int
    def __init__(self, queue: _Optional[str] = ..., filter: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class BrowseReply(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ...) -> None: ...

class AckWhereRequest(_message.Message):
    __slots__ = ("queue", "filter", "expire")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_FIELD_NUMBER: _ClassVar[int]
    queue: str
    filter: str
    expire: bool
    def __init__(self, queue: _Optional[str] = ..., filter: _Optional[str] = ..., expire: _Optional[bool] = ...) -> None: ...

class AckWhereReply(_message.Message):
    __slots__ = ("acked", "skipped")
    ACKED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    acked: int
    skipped: int
    def __init__(self, acked: _Optional[int] = ..., skipped: _Optional[int] = ...) -> None: ...

class RedriveRequest(_message.Message):
    __slots__ = ("queue", "filter", "limit")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    queue: str
    filter: str
    limit: int
    def __init__(self, queue: _Optional[str] = ..., filter: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class RedriveReply(_message.Message):
    __slots__ = ("moved", "already", "unmatched")
    MOVED_FIELD_NUMBER: _ClassVar[int]
    ALREADY_FIELD_NUMBER: _ClassVar[int]
    UNMATCHED_FIELD_NUMBER: _ClassVar[int]
    moved: int
    already: int
    unmatched: int
    def __init__(self, moved: _Optional[int] = ..., already: _Optional[int] = ..., unmatched: _Optional[int] = ...) -> None: ...

class DeadLettersRequest(_message.Message):
    __slots__ = ("queue", "filter", "limit")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    queue: str
    filter: str
    limit: int
    def __init__(self, queue: _Optional[str] = ..., filter: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("bookmark", "original", "reason", "detail", "deliveries", "cancels", "key", "payload", "headers", "message_timestamp_ms", "dead_lettered_at_ms", "redriven")
    BOOKMARK_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    CANCELS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    REDRIVEN_FIELD_NUMBER: _ClassVar[int]
    bookmark: str
    original: str
    reason: str
    detail: str
    deliveries: int
    cancels: int
    key: bytes
    payload: bytes
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    message_timestamp_ms: int
    dead_lettered_at_ms: int
    redriven: bool
    def __init__(self, bookmark: _Optional[str] = ..., original: _Optional[str] = ..., reason: _Optional[str] = ..., detail: _Optional[str] = ..., deliveries: _Optional[int] = ..., cancels: _Optional[int] = ..., key: _Optional[bytes] = ..., payload: _Optional[bytes] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., message_timestamp_ms: _Optional[int] = ..., dead_lettered_at_ms: _Optional[int] = ..., redriven: _Optional[bool] = ...) -> None: ...

class DeadLettersReply(_message.Message):
    __slots__ = ("letters",)
    LETTERS_FIELD_NUMBER: _ClassVar[int]
    letters: _containers.RepeatedCompositeFieldContainer[DeadLetter]
    def __init__(self, letters: _Optional[_Iterable[_Union[DeadLetter, _Mapping]]] = ...) -> None: ...

class ReloadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReloadReply(_message.Message):
    __slots__ = ("source", "applied", "added", "removed", "changed", "refused")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    source: str
    applied: bool
    added: _containers.RepeatedScalarFieldContainer[str]
    removed: _containers.RepeatedScalarFieldContainer[str]
    changed: _containers.RepeatedCompositeFieldContainer[ReloadChange]
    refused: _containers.RepeatedCompositeFieldContainer[ReloadRefusal]
    def __init__(self, source: _Optional[str] = ..., applied: _Optional[bool] = ..., added: _Optional[_Iterable[str]] = ..., removed: _Optional[_Iterable[str]] = ..., changed: _Optional[_Iterable[_Union[ReloadChange, _Mapping]]] = ..., refused: _Optional[_Iterable[_Union[ReloadRefusal, _Mapping]]] = ...) -> None: ...

class ReloadChange(_message.Message):
    __slots__ = ("queue", "option", "old", "new")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    OPTION_FIELD_NUMBER: _ClassVar[int]
    OLD_FIELD_NUMBER: _ClassVar[int]
    NEW_FIELD_NUMBER: _ClassVar[int]
    queue: str
    option: str
    old: str
    new: str
    def __init__(self, queue: _Optional[str] = ..., option: _Optional[str] = ..., old: _Optional[str] = ..., new: _Optional[str] = ...) -> None: ...

class ReloadRefusal(_message.Message):
    __slots__ = ("where", "option", "old", "new", "reason")
    WHERE_FIELD_NUMBER: _ClassVar[int]
    OPTION_FIELD_NUMBER: _ClassVar[int]
    OLD_FIELD_NUMBER: _ClassVar[int]
    NEW_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    where: str
    option: str
    old: str
    new: str
    reason: str
    def __init__(self, where: _Optional[str] = ..., option: _Optional[str] = ..., old: _Optional[str] = ..., new: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class QueueDefinition(_message.Message):
    __slots__ = ("name", "options", "origin", "changed_by", "changed_at_ms", "temporary")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    CHANGED_BY_FIELD_NUMBER: _ClassVar[int]
    CHANGED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    TEMPORARY_FIELD_NUMBER: _ClassVar[int]
    name: str
    options: _containers.ScalarMap[str, str]
    origin: str
    changed_by: str
    changed_at_ms: int
    temporary: bool
    def __init__(self, name: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ..., origin: _Optional[str] = ..., changed_by: _Optional[str] = ..., changed_at_ms: _Optional[int] = ..., temporary: _Optional[bool] = ...) -> None: ...

class CreateQueueRequest(_message.Message):
    __slots__ = ("options",)
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    options: _containers.ScalarMap[str, str]
    def __init__(self, options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CreateTemporaryQueueRequest(_message.Message):
    __slots__ = ("queue", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    options: _containers.ScalarMap[str, str]
    def __init__(self, queue: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class AlterQueueRequest(_message.Message):
    __slots__ = ("name", "options")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    options: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., options: _Optional[_Mapping[str, str]] = ...) -> None: ...

class QueueDefinitionReply(_message.Message):
    __slots__ = ("definition",)
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    definition: QueueDefinition
    def __init__(self, definition: _Optional[_Union[QueueDefinition, _Mapping]] = ...) -> None: ...

class DeleteQueueRequest(_message.Message):
    __slots__ = ("name", "force")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    force: bool
    def __init__(self, name: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class DeleteQueueReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListDefinitionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListDefinitionsReply(_message.Message):
    __slots__ = ("definitions",)
    DEFINITIONS_FIELD_NUMBER: _ClassVar[int]
    definitions: _containers.RepeatedCompositeFieldContainer[QueueDefinition]
    def __init__(self, definitions: _Optional[_Iterable[_Union[QueueDefinition, _Mapping]]] = ...) -> None: ...

class ReplayRequest(_message.Message):
    __slots__ = ("queue", "since_bookmarks", "since_ms", "until_ms", "follow", "filter")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    SINCE_BOOKMARKS_FIELD_NUMBER: _ClassVar[int]
    SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    queue: str
    since_bookmarks: _containers.RepeatedScalarFieldContainer[str]
    since_ms: int
    until_ms: int
    follow: bool
    filter: str
    def __init__(self, queue: _Optional[str] = ..., since_bookmarks: _Optional[_Iterable[str]] = ..., since_ms: _Optional[int] = ..., until_ms: _Optional[int] = ..., follow: _Optional[bool] = ..., filter: _Optional[str] = ...) -> None: ...

class ReplayReply(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ...) -> None: ...

class ClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterMember(_message.Message):
    __slots__ = ("id", "address", "partitions", "alive")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    alive: bool
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ..., alive: _Optional[bool] = ...) -> None: ...

class QueueOwner(_message.Message):
    __slots__ = ("queue", "partition", "member", "address")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    partition: int
    member: str
    address: str
    def __init__(self, queue: _Optional[str] = ..., partition: _Optional[int] = ..., member: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class ClusterReply(_message.Message):
    __slots__ = ("cluster", "member", "members", "queues", "standalone")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    STANDALONE_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    member: str
    members: _containers.RepeatedCompositeFieldContainer[ClusterMember]
    queues: _containers.RepeatedCompositeFieldContainer[QueueOwner]
    standalone: bool
    def __init__(self, cluster: _Optional[str] = ..., member: _Optional[str] = ..., members: _Optional[_Iterable[_Union[ClusterMember, _Mapping]]] = ..., queues: _Optional[_Iterable[_Union[QueueOwner, _Mapping]]] = ..., standalone: _Optional[bool] = ...) -> None: ...
