"""Does a state directory belong to the Kafka cluster a coordinator is about to use?

The local store is a cache of the changelog in one Kafka cluster. Two ways it can stop matching:

- **another cluster**: the store recorded a cluster id and the broker reports a different one
  (the coordinator was pointed at another cluster, or the state directory was copied);
- **ahead of the changelog**: the store has applied a changelog partition up to an offset the
  broker does not have (a broker that keeps nothing restarted empty, the changelog topic was
  deleted or recreated). Restoring from there would wait for records that never come.

A store that is *behind* (the changelog has more) is normal: restore reads the rest. The stored
offset is the next one to read, which after a transaction is the commit marker's offset, so an
up-to-date store is at most the broker's high watermark, never beyond it.

``judge`` decides from plain facts (no I/O); ``broker_facts`` reads them from the broker, taking
high watermarks from fetch responses (``connectors.kafka.read_watermarks``), which are right on
every broker, where ListOffsets(latest) is not on Tansu. Tansu reports the same cluster id
(``tansu_cluster``) for every broker, so there only the offsets tell an empty broker apart.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from connectors.kafka import admin_settings, read_watermarks
from layer.exceptions import BrokerError, StateMismatch
from layer.state.base import Store, StoreBatch

__all__ = [
    "BrokerFacts",
    "Mismatch",
    "StoredFacts",
    "Verdict",
    "broker_facts",
    "check_state",
    "judge",
    "mismatch_message",
]

logger = logging.getLogger(__name__)

# How many mismatched partitions one error line names before "and N more".
_NAMED = 3


class Verdict(enum.Enum):
    OK = "ok"
    OTHER_CLUSTER = "other cluster"
    AHEAD = "ahead of the changelog"


@dataclass(frozen=True, slots=True)
class StoredFacts:
    """What the state directory says: its cluster id and changelog offsets (next to read)."""

    cluster_id: str | None
    offsets: Mapping[tuple[str, int], int]


@dataclass(frozen=True, slots=True)
class BrokerFacts:
    """What the broker says: its cluster id, the partition count of each changelog topic that
    exists, and the high watermark of each of those partitions."""

    cluster_id: str | None
    partitions: Mapping[str, int]
    ends: Mapping[tuple[str, int], int]


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The verdict and, for each way the state does not match, one short phrase."""

    verdicts: frozenset[Verdict]
    details: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.details


def judge(stored: StoredFacts, broker: BrokerFacts, topics: Iterable[str]) -> Mismatch:
    """Compare the stored facts of the changelog ``topics`` with the broker's (pure)."""
    verdicts: set[Verdict] = set()
    details: list[str] = []
    if (
        stored.cluster_id is not None
        and broker.cluster_id is not None
        and stored.cluster_id != broker.cluster_id
    ):
        verdicts.add(Verdict.OTHER_CLUSTER)
        details.append(
            f"it was built from Kafka cluster {stored.cluster_id!r}, the broker is cluster"
            f" {broker.cluster_id!r}"
        )
    wanted = set(topics)
    ahead: list[str] = []
    for (topic, partition), offset in sorted(stored.offsets.items()):
        if topic not in wanted or offset <= 0:
            continue  # another configuration's changelog, or nothing applied from it
        where = f"{topic}/{partition}: state at offset {offset}"
        if topic not in broker.partitions:
            ahead.append(f"{where}, the topic does not exist on the broker")
        elif partition >= broker.partitions[topic]:
            ahead.append(f"{where}, the topic has {broker.partitions[topic]} partition(s)")
        else:
            end = broker.ends.get((topic, partition))
            if end is not None and offset > end:
                ahead.append(f"{where}, the broker's changelog ends at {end}")
    if ahead:
        verdicts.add(Verdict.AHEAD)
        if len(ahead) > _NAMED:
            ahead = ahead[:_NAMED] + [f"and {len(ahead) - _NAMED} more partitions"]
        details.append("it is ahead of the broker's changelog: " + ", ".join(ahead))
    return Mismatch(frozenset(verdicts), tuple(details))


def mismatch_message(
    state_dir: Path | str, bootstrap: str, mismatch: Mismatch, config_file: str = "FILE"
) -> str:
    """The one line a coordinator exits with: where, what does not match, what to do."""
    return (
        f"state dir {state_dir} does not belong to the Kafka cluster at {bootstrap}: "
        + "; ".join(mismatch.details)
        + f". Either run `qlayer coordinator --config {config_file} --reset-state` to discard"
        " the local state and rebuild it from this cluster's changelog, or point the"
        " coordinator at the cluster the state belongs to"
    )


def broker_facts(
    settings: Mapping[str, Any], wanted: Iterable[tuple[str, int]], *, timeout: float = 10.0
) -> BrokerFacts:
    """Read the cluster id, the changelog topics' partition counts and their high watermarks.

    ``settings`` are base client settings (``connectors.kafka.client_settings``). Topics are
    listed whole: a metadata request that names a missing topic would create it on Tansu.
    """
    admin = AdminClient(admin_settings(settings))
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise BrokerError(f"cannot read the cluster metadata: {exc}") from exc
    asked = list(wanted)
    asked_topics = {topic for topic, _partition in asked}
    partitions = {
        name: len(topic.partitions)
        for name, topic in metadata.topics.items()
        if name in asked_topics and topic.error is None
    }
    present = [(t, p) for t, p in asked if p < partitions.get(t, 0)]
    marks = read_watermarks(settings, present, timeout=timeout)
    ends = {tp: mark.high for tp, mark in marks.items()}
    return BrokerFacts(metadata.cluster_id or None, partitions, ends)


def check_state(
    store: Store,
    state_dir: Path | str,
    settings: Mapping[str, Any],
    changelog_topics: Iterable[str],
    *,
    config_file: str = "FILE",
    timeout: float = 10.0,
) -> None:
    """Raise ``StateMismatch`` when ``store`` does not belong to the cluster of ``settings``;
    otherwise record the cluster id if the store has none yet. ``config_file`` is named in the
    remedy the error suggests."""
    topics = sorted(set(changelog_topics))
    stored = StoredFacts(store.cluster_id(), store.changelog_offsets())
    wanted = [(topic, p) for (topic, p), offset in stored.offsets.items() if topic in topics]
    broker = broker_facts(settings, wanted, timeout=timeout)
    mismatch = judge(stored, broker, topics)
    bootstrap = str(settings.get("bootstrap.servers", "?"))
    if not mismatch.ok:
        # The exception's message is the one line the operator sees; this is for --debug.
        logger.debug(
            "state dir does not match the cluster",
            extra={
                "state_dir": str(state_dir),
                "verdicts": sorted(v.value for v in mismatch.verdicts),
                "stored_cluster_id": stored.cluster_id,
                "broker_cluster_id": broker.cluster_id,
            },
        )
        raise StateMismatch(mismatch_message(state_dir, bootstrap, mismatch, config_file))
    if broker.cluster_id is not None and stored.cluster_id is None:
        batch = StoreBatch()
        batch.set_cluster_id(broker.cluster_id)
        store.write(batch)
        logger.info(
            "state dir recorded its cluster id %s",
            broker.cluster_id,
            extra={"state_dir": str(state_dir), "cluster_id": broker.cluster_id},
        )
