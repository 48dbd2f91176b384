"""Which queue options a reload changes live and which it refuses, with the words that say so.

Apart from ``layer.coordinator.reload`` (which plans with them) so that the CLI's ``--help``
prints them without loading the API's service and gRPC.
"""

from __future__ import annotations

__all__ = ["FIXED_OPTIONS", "LIVE_OPTIONS"]

# Options that take a new value while the queue serves, and when the new value applies.
LIVE_OPTIONS: dict[str, str] = {
    "lease_period": "leases granted from now on; leases already granted keep their deadline",
    "max_per_subscription_backlog": (
        "new subscriptions; open ones above the new cap are lowered to it at once"
    ),
    "fairness": "the next message handed out",
    "leasing": "the next ack, cancel or extend",
    "max_deliveries": "each message when its lease next ends",
    "max_cancels": "each message when it is next cancelled",
    "expiration": "every queued message at once, and each leased one when its lease ends",
    "target_queue_depth": "what is read from the topics from now on",
    "redelivery_backoff": "lease timeouts from now on",
    "dead_letter_topic": "dead letters from now on (the topic is created if missing)",
    "on_unparseable": "messages read from now on (and queued ones read back at a restart)",
}

# Options whose value the queue's state is built on, and why a new value needs a new queue.
FIXED_OPTIONS: dict[str, str] = {
    "underlying_topic": (
        "the queue's messages, bookmarks and state belong to its topics: define a new queue"
        " (a new name) over the new topic instead"
    ),
    "semantics": ("at-least-once and at-most-once record deliveries differently in the changelog"),
    "message_type": "the queued messages were parsed as the old type",
    "avro_schema": "the queued messages were parsed with the old schema",
    "priority": "the queued messages are ordered by the old expression",
    "priorities": "the queued messages are ordered by their levels under the old value",
    "barrier": "the queued messages were held or released by the old expression",
    "filter": "the queued messages were admitted by the old filter",
    "group_key": "the queued messages were grouped by the old expression",
    "group_mode": "the open subscriptions hold message groups under the old mode",
    "conflate_key": "the queued messages were conflated by the old expression",
    "exclusive": "the open subscriptions were ordered as active and standby under the old value",
    "default_publish_target": (
        "the queue's publish route copies to its target from positions kept per target"
    ),
    "view_topic": "the view topic holds the rounds of the live contents since the queue started",
    "start_from": "the reader chose where to start each partition when the queue started",
    "sort_key": "the queued messages are ordered by the old expression",
    "last_value": "the queued messages were kept or replaced under the old value",
    "ttl": "the queued messages' expiry times were set by the old expression",
    "dead_letter_if": "the coordinator compiled the old expression when the queue started",
    "distribution": (
        "a partitioned queue's state is its shards', one per partition: define a new queue"
    ),
    "partitions": "each shard's state belongs to its partition: define a new queue",
}
