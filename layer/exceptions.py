"""One exception hierarchy for qlayer.

Every class's docstring is its default message, so ``raise UnknownQueue()`` says something useful
and ``raise UnknownQueue("queue 'x' is not configured")`` says more.
"""

from __future__ import annotations


class QLayerError(Exception):
    """qlayer failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip().splitlines()[0])


class ConfigError(QLayerError):
    """The configuration is invalid."""


class BrokerError(QLayerError):
    """The Kafka broker could not be reached or refused a request."""


class CommitUncertain(BrokerError):
    """The coordinator failed while this change's commit was under way: the broker may have
    made it durable or not. Never answered as a refusal (an ack so answered would be taken for
    one that was not applied, and its message expected again)."""


class SerializationError(QLayerError):
    """A record or frame could not be encoded or decoded."""


class StateError(QLayerError):
    """The state store is unusable or inconsistent."""


class RecoveryError(StateError):
    """State could not be restored from the changelog."""


class RestoreStopped(RecoveryError):
    """A changelog restore was stopped before it caught up (what it applied is kept, with its
    offsets: the next restore resumes there)."""


class StateMismatch(StateError):
    """The state directory does not belong to this Kafka cluster."""


class QueueError(QLayerError):
    """A queue operation failed."""


class UnknownQueue(QueueError):
    """No queue with that name is configured."""


class QueueRemoved(UnknownQueue):
    """The queue was removed by a reload of the configuration."""


class NotOwner(QueueError):
    """The queue is served by another member of the cluster: ask that one (its address is in
    the message, and in the cluster metadata)."""


class PartitionedQueue(QueueError):
    """The queue is partitioned (``distribution = "partitioned"``): subscribe to each of its
    shards (``queue#0``, ``queue#1``...), as the Python client does by itself."""


class QueueExists(QueueError):
    """A queue of that name is already defined."""


class QueueBusy(QueueError):
    """The queue has leased messages: refused unless forced."""


class LeaseError(QueueError):
    """A lease operation (ack, cancel, expire, extend) was refused."""


class UnknownBookmark(LeaseError):
    """The bookmark does not name a message of this queue."""


class NotLeaseHolder(LeaseError):
    """The message is leased to another subscription and the queue's leasing is strict."""


class NotLeased(LeaseError):
    """Nobody holds a lease on the message (a cancel or extend of a message not leased)."""


class LeaseLost(LeaseError):
    """The lease ended with the connection it was granted on: the ack was not confirmed.

    The coordinator returns a disconnected consumer's leases, so the message will be delivered
    again (at-least-once): make its processing idempotent, or skip it by its bookmark.
    """


class SubscriptionClosed(LeaseError):
    """The subscription is closed: the operation was not applied."""


class AckFailed(LeaseError):
    """The server could not make the operation durable; the message may come back."""


class PermissionDenied(QLayerError):
    """The caller's credentials do not allow this call."""


class InvalidRequest(QLayerError):
    """The request is malformed."""


class MalformedBookmark(InvalidRequest, LeaseError):
    """A bookmark is not ``topic/partition/offset``.

    Both a malformed request and, in an ack, a refused lease operation: ``except LeaseError``
    around ``ack(wait=True)`` catches it as it catches an unknown bookmark."""


class MalformedFrame(InvalidRequest):
    """A frame sent to the server did not decode."""


class UnexpectedFrame(InvalidRequest):
    """A frame came where the protocol does not allow it."""


class ClientError(QLayerError):
    """The client lost its connection or the server refused the request."""


class Unauthenticated(ClientError):
    """UNAUTHENTICATED: missing or wrong bearer token."""


class ConnectionLost(ClientError):
    """The connection to the qlayer server was lost or could not be made."""


class ConnectFailed(ConnectionLost):
    """No connection to the qlayer server could be made: the request was never sent."""


class PublishUncertain(ConnectionLost):
    """The connection dropped during a publish: it may or may not have reached Kafka.

    Publishing again is safe only if a duplicate is acceptable (consumers see both).
    """


class ExpressionError(InvalidRequest):
    """The expression is invalid.

    A subclass of ``InvalidRequest`` because most expressions arrive in requests (a subscriber's
    content filter), where a bad one is the caller's mistake; the config loader wraps it in a
    ``ConfigError`` that names the file, queue and option. ``text`` is the whole expression,
    ``position`` the 1-based column (character offset) of the problem, ``reason`` what is wrong
    and ``hint`` (or None) what was expected instead.
    """

    def __init__(
        self, text: str = "", position: int = 1, reason: str = "", hint: str | None = None
    ) -> None:
        self.text = text
        self.position = position
        self.reason = reason
        self.hint = hint
        if not reason:
            super().__init__()
            return
        shown = text if len(text) <= 120 else text[:117] + "..."
        message = f'expression "{shown}" : {reason} at column {position}'
        super().__init__(f"{message}; {hint}" if hint else message)

    def __reduce__(self) -> tuple[type[ExpressionError], tuple[str, int, str, str | None]]:
        # the default pickling passes only the message back to __init__
        return type(self), (self.text, self.position, self.reason, self.hint)


class SparkBatchError(QLayerError):
    """A Spark call in a ``foreachBatch`` function failed (the JVM's error text follows)."""


class SparkBatchStopped(SparkBatchError):
    """A Spark call in a ``foreachBatch`` function was interrupted: the query is stopping."""
