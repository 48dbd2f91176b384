"""Wire errors: one enum of codes and one table from exception class to (gRPC status, code).

The server answers a refused call with the table's status and puts the code in the trailing
metadata (``qlayer-error-code``); an Error frame and an AckResult failure carry the code itself.
The client turns a code back into the same exception class, so a refusal raises on the client
what was raised on the server. A failed call without a code did not come from qlayer's handlers:
it is the transport's (connection refused or dropped, keepalive timeout) or the server's own
checks (authentication, malformed requests), mapped by status alone.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import grpc

from layer.exceptions import (
    AckFailed,
    BrokerError,
    ClientError,
    ConfigError,
    ConnectFailed,
    ConnectionLost,
    ExpressionError,
    InvalidRequest,
    LeaseError,
    LeaseLost,
    MalformedBookmark,
    MalformedFrame,
    NotLeased,
    NotLeaseHolder,
    NotOwner,
    PartitionedQueue,
    PermissionDenied,
    PublishUncertain,
    QLayerError,
    QueueBusy,
    QueueExists,
    QueueRemoved,
    SubscriptionClosed,
    Unauthenticated,
    UnexpectedFrame,
    UnknownBookmark,
    UnknownQueue,
)

__all__ = ["CODE_METADATA_KEY", "ErrorCode", "code_of", "error_from_rpc", "error_of", "status_of"]

CODE_METADATA_KEY = "qlayer-error-code"


class ErrorCode(enum.StrEnum):
    """Why a request was refused; the value is what travels on the wire."""

    UNKNOWN_QUEUE = "unknown_queue"
    QUEUE_REMOVED = "queue_removed"  # by a reload of the configuration, or deleted
    QUEUE_EXISTS = "queue_exists"  # queue create of a name that is defined
    QUEUE_BUSY = "queue_busy"  # queue delete of a queue with leased messages, not forced
    NOT_OWNER = "not_owner"  # another member of the cluster serves the queue
    PARTITIONED_QUEUE = "partitioned_queue"  # subscribe to the queue's shards
    INVALID_EXPRESSION = "invalid_expression"
    INVALID_REQUEST = "invalid_request"
    MALFORMED_BOOKMARK = "malformed_bookmark"
    MALFORMED_FRAME = "malformed_frame"
    UNEXPECTED_FRAME = "unexpected_frame"
    UNKNOWN_BOOKMARK = "unknown_bookmark"
    NOT_LEASE_HOLDER = "not_lease_holder"
    NOT_LEASED = "not_leased"
    LEASE_LOST = "lease_lost"
    SUBSCRIPTION_CLOSED = "subscription_closed"
    ACK_FAILED = "ack_failed"
    LEASE_REFUSED = "lease_refused"
    UNAVAILABLE = "unavailable"  # the coordinator cannot reach Kafka
    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"
    CONFIG_ERROR = "config_error"  # a reload read a file that does not load
    PUBLISH_UNCERTAIN = "publish_uncertain"  # raised by the client only
    CONNECTION_LOST = "connection_lost"  # raised by the client only
    CLIENT_ERROR = "client_error"  # raised by the client only
    INTERNAL = "internal"


@dataclass(frozen=True, slots=True)
class _Row:
    error: type[QLayerError]
    status: grpc.StatusCode
    code: ErrorCode


_S = grpc.StatusCode
# Most specific first: the first row whose class the exception is an instance of wins.
TABLE: tuple[_Row, ...] = (
    _Row(ExpressionError, _S.INVALID_ARGUMENT, ErrorCode.INVALID_EXPRESSION),
    _Row(MalformedBookmark, _S.INVALID_ARGUMENT, ErrorCode.MALFORMED_BOOKMARK),
    _Row(MalformedFrame, _S.INVALID_ARGUMENT, ErrorCode.MALFORMED_FRAME),
    _Row(UnexpectedFrame, _S.INVALID_ARGUMENT, ErrorCode.UNEXPECTED_FRAME),
    _Row(InvalidRequest, _S.INVALID_ARGUMENT, ErrorCode.INVALID_REQUEST),
    _Row(QueueRemoved, _S.NOT_FOUND, ErrorCode.QUEUE_REMOVED),
    _Row(QueueExists, _S.ALREADY_EXISTS, ErrorCode.QUEUE_EXISTS),
    _Row(QueueBusy, _S.FAILED_PRECONDITION, ErrorCode.QUEUE_BUSY),
    _Row(NotOwner, _S.FAILED_PRECONDITION, ErrorCode.NOT_OWNER),
    _Row(PartitionedQueue, _S.FAILED_PRECONDITION, ErrorCode.PARTITIONED_QUEUE),
    _Row(UnknownQueue, _S.NOT_FOUND, ErrorCode.UNKNOWN_QUEUE),
    _Row(UnknownBookmark, _S.NOT_FOUND, ErrorCode.UNKNOWN_BOOKMARK),
    _Row(NotLeaseHolder, _S.FAILED_PRECONDITION, ErrorCode.NOT_LEASE_HOLDER),
    _Row(NotLeased, _S.FAILED_PRECONDITION, ErrorCode.NOT_LEASED),
    _Row(LeaseLost, _S.ABORTED, ErrorCode.LEASE_LOST),
    _Row(SubscriptionClosed, _S.ABORTED, ErrorCode.SUBSCRIPTION_CLOSED),
    _Row(AckFailed, _S.UNAVAILABLE, ErrorCode.ACK_FAILED),
    _Row(LeaseError, _S.FAILED_PRECONDITION, ErrorCode.LEASE_REFUSED),
    _Row(BrokerError, _S.UNAVAILABLE, ErrorCode.UNAVAILABLE),
    _Row(Unauthenticated, _S.UNAUTHENTICATED, ErrorCode.UNAUTHENTICATED),
    _Row(PermissionDenied, _S.PERMISSION_DENIED, ErrorCode.PERMISSION_DENIED),
    _Row(ConfigError, _S.INVALID_ARGUMENT, ErrorCode.CONFIG_ERROR),
    _Row(PublishUncertain, _S.UNAVAILABLE, ErrorCode.PUBLISH_UNCERTAIN),
    _Row(ConnectionLost, _S.UNAVAILABLE, ErrorCode.CONNECTION_LOST),
    _Row(ClientError, _S.UNKNOWN, ErrorCode.CLIENT_ERROR),
    _Row(QLayerError, _S.INTERNAL, ErrorCode.INTERNAL),
)
_BY_CODE = {row.code: row for row in TABLE}

# A failed call without a qlayer code: the transport's or the server's own checks.
_BY_STATUS: dict[grpc.StatusCode, type[QLayerError]] = {
    _S.UNAVAILABLE: ConnectionLost,
    _S.CANCELLED: ConnectionLost,  # the server went away mid-call (we never cancel and read on)
    _S.NOT_FOUND: UnknownQueue,
    _S.INVALID_ARGUMENT: InvalidRequest,
    _S.UNAUTHENTICATED: Unauthenticated,
    _S.PERMISSION_DENIED: PermissionDenied,
}


def _row_of(exc: BaseException) -> _Row:
    for row in TABLE:
        if isinstance(exc, row.error):
            return row
    return _BY_CODE[ErrorCode.INTERNAL]  # not a qlayer error at all: a bug on the server


def code_of(exc: BaseException) -> ErrorCode:
    """The wire code for ``exc`` (``INTERNAL`` for anything outside the hierarchy)."""
    return _row_of(exc).code


def status_of(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status a call refused with ``exc`` ends with."""
    return _row_of(exc).status


def parse_code(text: str) -> ErrorCode:
    """A code read from the wire; one this client does not know (a newer server) is INTERNAL."""
    try:
        return ErrorCode(text)
    except ValueError:
        return ErrorCode.INTERNAL


def error_of(code: ErrorCode, message: str) -> QLayerError:
    """The exception a client raises for a refusal with ``code``."""
    cls = _BY_CODE[code].error
    if cls is ExpressionError:
        # its constructor takes the parts of the expression, not a message
        return InvalidRequest(message)
    return cls(message)


def _code_in(exc: grpc.RpcError) -> ErrorCode | None:
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == CODE_METADATA_KEY:
            return parse_code(value.decode() if isinstance(value, bytes) else value)
    return None


def _never_connected(details: str) -> bool:
    """Did the call fail because no connection could be made (so nothing was sent)? gRPC says
    so only in its text: this is the one place that reads it (grpc core's message for a
    channel with no reachable address)."""
    return "failed to connect to all addresses" in details


def error_from_rpc(exc: grpc.RpcError) -> QLayerError:
    """The qlayer exception for a failed call (``raise error_from_rpc(exc) from exc``)."""
    status = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    code = _code_in(exc)
    if code is not None:
        return error_of(code, details)
    name = status.name if status is not None else "UNKNOWN"
    cls = _BY_STATUS.get(status) if status is not None else None
    if cls is None:
        return ClientError(f"{name}: {details}")
    if cls is ConnectionLost and _never_connected(details):
        return ConnectFailed(f"{name}: {details}")
    if issubclass(cls, ClientError):
        return cls(f"{name}: {details}")  # the status says what the transport saw
    return cls(details)
