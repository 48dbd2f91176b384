"""The changelog writer: one Kafka transaction per batch of state changes (and their dead letters).

The changelog topic is the source of truth of queue state. A batch of changelog records and the
dead letters that go with them are produced in one transaction, so a dead letter is never
published without its done record, nor the other way round. ``commit`` returns the offset of the
last record per changelog partition; the caller stores the next offset with the state it applies
(one RocksDB batch), which is where a restore resumes.

Status of one ``commit``: begun -> produced (all delivery reports in) -> committed, or aborted on
any failure (and ``StateError`` raised). A fenced or otherwise fatally failed producer makes the
writer unusable: create a new one (which fences any older writer with the same transactional id).

``DurableChangelog`` wraps a writer for a process that must outlive Kafka outages: it commits a
batch however long that takes, aborting and redoing it, or re-creating the writer, as the
failure requires.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from layer.exceptions import StateError

__all__ = ["ChangelogRecord", "ChangelogWriter", "DurableChangelog", "ExtraRecord"]

logger = logging.getLogger(__name__)

#: (topic, key, value or None for a tombstone)
ChangelogRecord = tuple[str, bytes, bytes | None]
#: (topic, key, value, headers): a record produced in the same transaction (e.g. a dead letter)
ExtraRecord = tuple[str, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]] | None]

_DEFAULTS: dict[str, Any] = {
    # Batches are committed as a whole; a short linger only groups what one commit produces.
    "linger.ms": 2,
    "acks": "all",
    "enable.idempotence": True,
}


#: how long a commit waits for a topic's partition count (once per topic and writer)
_METADATA_TIMEOUT = 5.0
#: how long closing a failed (fenced) writer may take before the process exits without it
CLOSE_FAILED_S = 5.0

_FENCED_CODES = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)


class _Interrupted(StateError):
    """The commit was given up because the process is stopping (nothing is aborted: the next
    incarnation's ``init_transactions`` aborts what this one left open)."""


class _WriterDead(StateError):
    """A cluster member's writer that is not replaced (fenced, or failed and superseded): the
    member commits nothing more and stops."""


def _kafka_error(exc: BaseException) -> KafkaError | None:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


class ChangelogWriter:
    """A transactional producer for one coordinator's changelog (thread-safe, blocking).

    ``init_transactions`` runs in the constructor: it waits for any transaction a previous
    incarnation left open to be aborted, and fences that incarnation.

    ``patient``: a commit waits for every record's delivery report however long that takes
    (librdkafka fails a record after ``message.timeout.ms``, which is the transaction timeout
    here) and retries a retriable commit error until it succeeds, instead of giving up after
    ``timeout``: a broker that stalls for a while then delays the commit instead of aborting
    it. ``interrupt`` set gives a waiting commit up (``StateError``) without aborting it.
    """

    def __init__(
        self,
        producer_settings: Mapping[str, Any],
        transactional_id: str,
        *,
        timeout: float = 30.0,
        patient: bool = False,
        interrupt: threading.Event | None = None,
    ) -> None:
        self._id = transactional_id
        self._timeout = timeout
        self._patient = patient
        self._interrupt = interrupt or threading.Event()
        self._lock = threading.Lock()
        self._failed: str | None = None
        self._single: dict[str, bool] = {}  # changelog topic -> has one partition
        settings = {**_DEFAULTS, **producer_settings, "transactional.id": transactional_id}
        self._producer: Producer | None = None
        try:
            self._producer = Producer(settings)
            self._producer.init_transactions(timeout)
        except KafkaException as exc:
            if self._producer is not None:
                self._failed = "could not start"
                self.close()
            raise StateError(
                f"changelog writer transactional_id={transactional_id} could not start: {exc}"
            ) from exc
        logger.info("changelog writer started transactional_id=%s", transactional_id)

    @property
    def transactional_id(self) -> str:
        return self._id

    @property
    def fenced(self) -> bool:
        """True once a newer writer with the same transactional id took over."""
        return self._failed is not None and self._failed.startswith("fenced")

    @property
    def usable(self) -> bool:
        """False once fenced, failed fatally, or closed: only a new writer can commit then."""
        return self._producer is not None and self._failed is None

    def commit(
        self,
        records: Sequence[ChangelogRecord],
        extra: Sequence[ExtraRecord] = (),
        bulk: Sequence[ExtraRecord] = (),
    ) -> dict[tuple[str, int], int]:
        """Produce ``records``, ``extra`` and ``bulk`` in one transaction and commit it.

        ``bulk`` records get no delivery report of their own (a Python callback per record is a
        measurable cost for many small records): a failed one still fails the commit, which
        librdkafka refuses while any message of the transaction failed.

        Returns the highest offset written per (changelog topic, partition) of ``records``.
        Raises ``StateError`` when anything failed; nothing of the batch is then visible to a
        read_committed reader.
        """
        with self._lock:
            producer = self._usable()
            if not records and not extra and not bulk:
                return {}
            last: dict[tuple[str, int], int] = {}
            errors: list[str] = []
            delivered = [0]

            def on_record(err: KafkaError | None, msg: Message) -> None:
                if err is not None:
                    errors.append(f"{msg.topic()}: {err}")
                    return
                delivered[0] += 1
                topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
                if topic is None or partition is None or offset is None:
                    errors.append(f"delivery report without offset: {msg.topic()}")
                    return
                if offset > last.get((topic, partition), -1):
                    last[(topic, partition)] = offset

            def on_extra(err: KafkaError | None, msg: Message) -> None:
                if err is not None:
                    errors.append(f"{msg.topic()}: {err}")
                else:
                    delivered[0] += 1

            try:
                producer.begin_transaction()
            except KafkaException as exc:
                raise self._fail(exc, "begin") from exc
            reported = self._reported(producer, records)
            produce = producer.produce
            try:
                for i, (to, record_key, record_value) in enumerate(records):
                    if reported is None or i in reported:
                        self._produce(producer, to, record_key, record_value, None, on_record)
                        continue
                    try:  # no delivery report (see ``_reported``) and no call around produce
                        produce(to, record_value, record_key)
                    except BufferError:
                        self._produce(producer, to, record_key, record_value, None, None)
                for topic, key, value, headers in extra:
                    self._produce(producer, topic, key, value, headers, on_extra)
                for topic, key, value, headers in bulk:
                    self._produce(producer, topic, key, value, headers, None)
                self._flush(producer, errors)
                if errors:
                    raise StateError(f"changelog delivery failed: {'; '.join(errors[:5])}")
                expected = (len(records) if reported is None else len(reported)) + len(extra)
                if delivered[0] != expected:
                    raise StateError(
                        f"{expected - delivered[0]} changelog delivery reports missing"
                    )
                self._commit_transaction(producer)
            except _Interrupted:
                self._failed = "interrupted while committing"
                raise
            except BaseException as exc:
                self._abort(producer, exc)
                if isinstance(exc, KafkaException):
                    raise self._fail(exc, "produce") from exc
                if self._failed is not None:
                    raise StateError(
                        f"changelog writer transactional_id={self._id} {self._failed}"
                    ) from exc
                if isinstance(exc, StateError):
                    raise
                if isinstance(exc, Exception):
                    # confluent-kafka can surface a fatal producer error from flush() as a
                    # malformed exception (SystemError); it is a failed transaction all the same.
                    raise StateError(
                        f"changelog transaction failed transactional_id={self._id}: {exc!r}"
                    ) from exc
                raise
            return last

    def _reported(self, producer: Producer, records: Sequence[ChangelogRecord]) -> set[int] | None:
        """Which of ``records`` (their indexes) get a delivery report; None: all of them.

        ``commit`` returns the last offset per changelog partition, and a Python callback per
        record is a measurable cost: a topic of one partition (as the coordinator creates its
        changelog topics) needs the report of its last record only, since an idempotent
        producer writes one partition's records in the order they are produced. The others
        still fail the transaction when they fail (as ``bulk`` records do). A topic of more
        partitions, or one whose partitions cannot be told, reports every record."""
        if not records:
            return set()
        last = dict(zip(map(itemgetter(0), records), range(len(records)), strict=True))
        if not all(self._single_partition(producer, topic) for topic in last):
            return None
        return set(last.values())

    def _single_partition(self, producer: Producer, topic: str) -> bool:
        """Whether ``topic`` has one partition (asked once per writer: a changelog topic's
        partitions never change, or its keys would move between partitions)."""
        single = self._single.get(topic)
        if single is None:
            try:
                # briefly: with Kafka away, the commit's own produce and flush report it
                timeout = min(self._timeout, _METADATA_TIMEOUT)
                meta = producer.list_topics(topic, timeout=timeout).topics.get(topic)
            except KafkaException:
                return False  # asked again next commit
            if meta is None or meta.error is not None:
                return False
            single = self._single[topic] = len(meta.partitions) == 1
        return single

    def _produce(
        self,
        producer: Producer,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes | None]] | None,
        callback: Any,
    ) -> None:
        while True:
            try:
                if headers:
                    producer.produce(topic, value, key, headers=list(headers), on_delivery=callback)
                elif callback is None:
                    producer.produce(topic, value, key)
                else:
                    producer.produce(topic, value, key, on_delivery=callback)
                return
            except BufferError:
                # The local queue is full: let deliveries drain, then retry this record.
                producer.poll(0.05)

    def _flush(self, producer: Producer, errors: list[str]) -> None:
        """Wait for every delivery report (see ``patient``)."""
        deadline = time.monotonic() + self._timeout
        while True:
            remaining = producer.flush(0.5)
            if not remaining or errors:
                return
            if self._interrupt.is_set():
                raise _Interrupted(f"{remaining} changelog records undelivered: stopping")
            if not self._patient and time.monotonic() > deadline:
                raise StateError(
                    f"{remaining} changelog records undelivered after {self._timeout}s"
                )

    def _commit_transaction(self, producer: Producer) -> None:
        deadline = time.monotonic() + self._timeout
        while True:
            # patient: in short calls, so an interrupt is seen (a timed-out commit may be
            # called again: librdkafka resumes it)
            left = max(deadline - time.monotonic(), 0.1)
            try:
                producer.commit_transaction(min(left, 1.0) if self._patient else left)
                return
            except KafkaException as exc:
                err = _kafka_error(exc)
                if err is None or not err.retriable():
                    raise
                if self._interrupt.is_set():
                    raise _Interrupted(f"commit not confirmed: stopping ({err})") from exc
                if not self._patient and time.monotonic() >= deadline:
                    raise

    def _abort_transaction(self, producer: Producer) -> None:
        """``abort_transaction`` in short calls, so an interrupt is seen (a timed-out abort
        may be called again: librdkafka resumes it)."""
        deadline = time.monotonic() + self._timeout
        while True:
            if self._interrupt.is_set():
                raise _Interrupted("abort not confirmed: stopping")
            left = max(deadline - time.monotonic(), 0.1)
            try:
                producer.abort_transaction(min(left, 1.0))
                return
            except KafkaException as exc:
                err = _kafka_error(exc)
                if err is None or not err.retriable() or time.monotonic() >= deadline:
                    raise

    def _abort(self, producer: Producer, cause: BaseException) -> None:
        err = _kafka_error(cause)
        if err is not None and err.fatal():
            return  # a fatal error leaves nothing to abort; _fail marks the writer failed
        try:
            self._abort_transaction(producer)
        except _Interrupted:
            # stopping: the next incarnation's init_transactions (or the next owner's fence)
            # aborts what is left open; a fenced writer's abort may never be answered (Tansu)
            self._failed = "interrupted while aborting"
            logger.warning("changelog abort given up: stopping transactional_id=%s", self._id)
            return
        except KafkaException as exc:
            abort_err = _kafka_error(exc)
            if abort_err is not None and abort_err.code() in _FENCED_CODES:
                self._failed = f"fenced by a newer writer: {abort_err}"
            else:
                self._failed = f"failed fatally (abort failed): {exc}"
            logger.error("changelog abort failed transactional_id=%s error=%s", self._id, exc)
        else:
            logger.warning(
                "changelog transaction aborted transactional_id=%s cause=%s", self._id, cause
            )

    def _fail(self, exc: KafkaException, stage: str) -> StateError:
        err = _kafka_error(exc)
        if err is not None and err.fatal():
            fenced = err.code() in _FENCED_CODES
            what = "fenced by a newer writer" if fenced else "failed fatally"
            self._failed = f"{what}: {err}"
            return StateError(
                f"changelog writer transactional_id={self._id} {what} ({stage}): {err}"
            )
        return StateError(
            f"changelog transaction {stage} failed transactional_id={self._id}: {exc}"
        )

    def _usable(self) -> Producer:
        if self._producer is None:
            raise StateError(f"changelog writer transactional_id={self._id} is closed")
        if self._failed is not None:
            raise StateError(
                f"changelog writer transactional_id={self._id} is unusable: {self._failed}"
            )
        return self._producer

    def close(self) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is None:
            return
        if self._failed is None:
            self._close(producer)
        else:
            # close() aborts the transaction left open, waiting for the broker as long as it
            # takes: a fenced writer's abort may never be answered (Tansu), so a failed writer
            # is given CLOSE_FAILED_S and then left to the process's exit
            closing = threading.Thread(
                target=self._close, args=(producer,), name="changelog-close", daemon=True
            )
            closing.start()
            closing.join(CLOSE_FAILED_S)
            if closing.is_alive():
                logger.warning(
                    "changelog writer close left unfinished after %.0fs transactional_id=%s",
                    CLOSE_FAILED_S,
                    self._id,
                )
                return
        logger.info("changelog writer closed transactional_id=%s", self._id)

    def _close(self, producer: Producer) -> None:
        try:
            if self._failed is None:
                producer.flush(self._timeout)
            producer.close()
        except Exception as exc:  # a fenced producer can fail to close; it is gone anyway
            logger.warning(
                "changelog writer close failed transactional_id=%s error=%r", self._id, exc
            )

    def __enter__(self) -> ChangelogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DurableChangelog:
    """Commits each batch until it is durable, however long Kafka is away (blocking; one
    caller at a time, the coordinator's commit thread).

    A failed commit is done again with the same records: a retriable error is retried inside
    the writer; an aborted transaction is redone in a new one; a writer that is fenced or
    failed fatally (an abort that could not reach the broker, a transaction the broker timed
    out) is closed and a new one made (its ``init_transactions`` fences the old one and aborts
    what it left open), then the batch is redone. Between attempts it waits until Kafka is
    reachable again (``wait_reachable``), with backoff.

    ``replace_failed`` False (a member of a cluster, ``layer.coordinator.membership``): a writer
    that is fenced is not replaced: its fence is another member that took this one's queues
    over. A writer that failed (Kafka away past the transaction timeout) is replaced only when
    ``confirm_replacement`` is given, and only once it says, after the new writer started, that
    no other member claimed what this one may commit for (None; else the reason): the group
    may have moved those queues meanwhile, and a new writer started after the new owner fenced
    the old one would commit for them with a newer epoch. A claim written after that check is
    followed by its fence, which then fences the new writer too. Otherwise the commit fails
    (``StateError``), nothing of the round is handed out, and the coordinator stops serving (a
    supervisor starts it again, and it rejoins).

    A redo is harmless for the changelog records: the same keys and values again, and restore
    is last-value-wins. The extra records (dead letters, redriven and routed copies, view
    rounds) can appear twice on Kafka in exactly two cases: (1) the commit's outcome was
    unknown (a fatal error after the commit request was sent, so the new writer's
    ``init_transactions`` may have completed it) and the batch is redone; (2) on a broker whose
    read_committed readers see aborted records (Tansu, ``BrokerProfile.
    read_committed_hides_aborted``), any aborted attempt whose records reached the log. Each
    such copy is byte-identical to the one that counts (same key: the message's bookmark), and
    a redrive takes one dead letter per bookmark (``layer.coordinator.redrive``).
    """

    def __init__(
        self,
        make_writer: Callable[[], ChangelogWriter],
        *,
        wait_reachable: Callable[[float], object],
        on_trouble: Callable[[str], None],
        interrupt: threading.Event,
        replace_failed: bool = True,
        confirm_replacement: Callable[[], str | None] | None = None,
        on_dead: Callable[[StateError], None] | None = None,
    ) -> None:
        self._make = make_writer
        self._replace_failed = replace_failed
        self._confirm = confirm_replacement
        self._unconfirmed = False  # a replacement writer not confirmed yet: commits nothing
        self._on_dead = on_dead
        self._wait_reachable = wait_reachable
        self._on_trouble = on_trouble
        self._interrupt = interrupt
        self._writer: ChangelogWriter | None = None
        self.redone = 0  # batches that took more than one attempt
        self.writers_made = 0

    def open(self) -> None:
        """Make the first writer (raises ``StateError`` if it cannot start)."""
        if self._writer is None:
            self._writer = self._make()
            self.writers_made += 1

    def commit(
        self,
        records: Sequence[ChangelogRecord],
        extra: Sequence[ExtraRecord] = (),
        bulk: Sequence[ExtraRecord] = (),
    ) -> dict[tuple[str, int], int]:
        """``ChangelogWriter.commit`` until it succeeds; ``StateError`` only when interrupted."""
        attempts = 0
        started = time.monotonic()
        wait = 0.2
        while True:
            attempts += 1
            writer = self._writer
            try:
                if writer is None:
                    writer = self._writer = self._make()
                    self.writers_made += 1
                if self._unconfirmed:
                    assert self._confirm is not None
                    taken = self._confirm()  # StateError when it cannot tell yet: tried again
                    if taken is not None:
                        raise self._dead(writer, f"failed, and {taken}", None)
                    self._unconfirmed = False
                    logger.info(
                        "changelog writer replaced and confirmed transactional_id=%s",
                        writer.transactional_id,
                    )
                offsets = writer.commit(records, extra, bulk)
            except StateError as exc:
                if self._interrupt.is_set() or isinstance(exc, _WriterDead):
                    raise
                if writer is not None and not writer.usable and not self._replace_failed:
                    if writer.fenced or self._confirm is None:
                        why = (
                            "was fenced by another member of the cluster, which took this"
                            " member's queues over"
                            if writer.fenced
                            else "failed and is not replaced in a cluster (the group may have"
                            " moved this member's queues meanwhile)"
                        )
                        raise self._dead(writer, why, exc) from exc
                    self._unconfirmed = True  # failed: its replacement must be confirmed
                self._on_trouble(str(exc))
                if writer is not None and not writer.usable:
                    logger.warning(
                        "changelog writer replaced transactional_id=%s cause=%s",
                        writer.transactional_id,
                        exc,
                        extra={"transactional_id": writer.transactional_id},
                    )
                    # closing a producer whose transaction failed can block for as long as
                    # the broker is away (measured: past a 120 s outage): let it close on its
                    # own; the new writer fences it
                    threading.Thread(
                        target=writer.close, name="changelog-writer-close", daemon=True
                    ).start()
                    self._writer = None
                self._wait_until_reachable(30.0)
                if self._interrupt.wait(wait):
                    raise StateError("changelog commit given up: stopping") from exc
                wait = min(wait * 2, 5.0)
                continue
            if attempts > 1:
                self.redone += 1
                logger.info(
                    "changelog batch committed after %d attempts in %.1f s",
                    attempts,
                    time.monotonic() - started,
                    extra={"attempts": attempts, "records": len(records)},
                )
            return offsets

    def _wait_until_reachable(self, timeout: float) -> None:
        """``wait_reachable`` for up to ``timeout``, a second at a time so that a stop (the
        interrupt) ends the wait at once."""
        deadline = time.monotonic() + timeout
        while not self._interrupt.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or self._wait_reachable(min(left, 1.0)):
                return

    def _dead(self, writer: ChangelogWriter, why: str, exc: BaseException | None) -> StateError:
        dead = _WriterDead(
            f"changelog writer transactional_id={writer.transactional_id} {why}:"
            f" nothing more is committed here" + (f" ({exc})" if exc is not None else "")
        )
        if self._on_dead is not None:
            self._on_dead(dead)  # whichever path committed, the member must stop
        return dead

    def close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
