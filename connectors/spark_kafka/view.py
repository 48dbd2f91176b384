"""The ``qlayer_view`` data source: a queue's view topic as typed, signed changes.

A coordinator publishes every change of a queue's live contents (what ``browse`` shows) to the
queue's ``view_topic``: for each round, one ``ViewRound`` record (``avro/view_round.avsc``; Kafka
key: the queue name) with, per change, the message's bookmark, ``sign`` (+1 when it entered the
live contents, -1 when it left them), counts and priority. The messages themselves stay in the
underlying topics: this source reads the view topic with the ``qlayer_kafka`` machinery (same
options, partitions and offsets), expands the rounds into changes, and fetches each change's
message from its underlying topic by offset (the same brokers and ``kafka.*`` settings), on the
executors. Columns::

    sign, queue, bookmark, topic, partition, offset, key, headers, value, priority,
    deliveries, cancels, enqueue_time, changed_at, view_partition, view_offset,
    lease_holder, leased_at

``view_partition``/``view_offset`` are the round's place in the view topic (its order; the
changes of one round keep their order within it). A message no longer on the broker (retention
removed it) has NULL ``key``, ``value`` and ``enqueue_time``.

Options: those of ``qlayer_kafka`` (``kafka.bootstrap.servers``, ``subscribe``...), with these
differences: ``startingOffsets`` defaults to ``earliest`` in streaming too;
``kafka.isolation.level`` defaults to ``read_committed`` (the coordinator writes in
transactions); ``includeHeaders`` and ``maxOffsetsPerTrigger`` are refused. And two of its own:

- ``queue``: only that queue's rounds (a view topic may be shared), and for a partitioned
  queue its shards' (``orders#3``; ``queue`` names the shard); default: every queue's.
- ``leases`` (default false): the set of leased messages instead of the live contents: +1 when
  a lease began, -1 when it ended, with ``lease_holder`` (the subscription holding it) and
  ``leased_at`` (when the lease began); both NULL in the live contents. (View topics written
  before lease changes existed have none.)
- ``snapshot`` (default true): a range that starts at the beginning of a partition is read as the
  live contents at its end (per bookmark the last change, kept if it is +1) instead of every
  change. A batch read from ``earliest`` then *is* the live contents, and a stream's first
  micro-batch is the contents at its end, followed by the changes (every range after a
  stream's first is changes, even one that starts at offset 0 because the first found the
  topic empty). ``false``: every change, as written.

A subscribed topic that does not exist is an error (a coordinator creates its view topic when it
starts): a view of nothing would look like an empty queue.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from confluent_kafka import Message
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from connectors.spark_kafka import follow as following
from connectors.spark_kafka.broker import BrokerView
from connectors.spark_kafka.ends import EndFollower
from connectors.spark_kafka.options import (
    TP,
    KafkaSourceOptions,
    Offsets,
    boolean_option,
    offsets_from_json,
    offsets_to_json,
)
from connectors.spark_kafka.reading import (
    ROWS_PER_ARROW_BATCH,
    KafkaInputPartition,
    as_range,
    consume_range,
    message_offset,
)
from connectors.spark_kafka.source import (
    KafkaBatchReader,
    KafkaDataSource,
    KafkaStreamReader,
    register_once,
)
from layer.config.model import SHARD_MARK
from layer.engine.model import Bookmark, ViewChange
from layer.exceptions import BrokerError, ConfigError, SerializationError
from layer.viewcodec import decode_round
from layer.viewgen import generation_of, generations, is_snapshot

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

VIEW_FORMAT = "qlayer_view"

_REFUSED_OPTIONS = {
    "includeheaders": "the headers column is always there: the message's headers",
    "maxoffsetspertrigger": "a stream's first micro-batch must read the whole topic to be the"
    " live contents",
}


def view_schema() -> StructType:
    """The columns of ``qlayer_view``."""
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    return StructType(
        [
            StructField("sign", IntegerType(), False),
            StructField("queue", StringType()),
            StructField("bookmark", StringType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("key", BinaryType()),
            StructField("headers", ArrayType(header)),
            StructField("value", BinaryType()),
            StructField("priority", LongType()),
            StructField("deliveries", IntegerType()),
            StructField("cancels", IntegerType()),
            StructField("enqueue_time", TimestampType()),
            StructField("changed_at", TimestampType()),
            StructField("view_partition", IntegerType()),
            StructField("view_offset", LongType()),
            StructField("lease_holder", StringType()),
            StructField("leased_at", TimestampType()),
        ]
    )


@dataclass(frozen=True, slots=True)
class ViewSourceOptions:
    """The options of one ``qlayer_view`` read: the Kafka ones and ``snapshot``."""

    kafka: KafkaSourceOptions
    snapshot: bool = True
    queue: str | None = None
    splits: int = 1
    leases: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ViewSourceOptions:
        given = {key.lower(): str(value) for key, value in options.items()}
        for key, why in _REFUSED_OPTIONS.items():
            if key in given:
                raise ConfigError(f"option {key!r} is not supported by {VIEW_FORMAT}: {why}")
        snapshot = boolean_option("snapshot", given.pop("snapshot", "true"))
        leases = boolean_option("leases", given.pop("leases", "false"))
        queue = given.pop("queue", None)
        splits_text = given.pop("splits", "1")
        if not splits_text.isdigit() or not 1 <= int(splits_text) <= 1024:
            raise ConfigError(
                f"option 'splits' must be an integer from 1 to 1024, got {splits_text!r}"
            )
        given.setdefault("kafka.isolation.level", "read_committed")
        given.setdefault("startingoffsets", "earliest")
        kafka = KafkaSourceOptions.parse(given, source=VIEW_FORMAT)
        return cls(kafka, snapshot, queue, int(splits_text), leases)


class ViewInputPartition(KafkaInputPartition):
    """A range of a view topic; ``snapshot``: read it as the live contents at its end;
    ``continuation``: a stream goes on into a newer generation, whose snapshot records only
    repeat what it has read (they are skipped); ``stream``: a stream's (the next one starts
    where it ends); ``last``: the stream's last range of an old generation (the worker closes
    its consumer of it once read: the coordinator may delete the topic)."""

    def __init__(
        self,
        topic: str,
        partition: int,
        start: int,
        end: int,
        snapshot: bool,
        continuation: bool = False,
        shard: int = 0,
        shards: int = 1,
        stream: bool = False,
        last: bool = False,
    ) -> None:
        super().__init__(topic, partition, start, end)
        self.snapshot = snapshot
        self.continuation = continuation
        self.shard, self.shards = shard, shards  # a snapshot's messages: this share of them
        self.stream = stream
        self.last = last

    def __repr__(self) -> str:
        kind = "snapshot" if self.snapshot else "after" if self.continuation else "changes"
        return (
            f"ViewInputPartition({self.topic}/{self.partition} [{self.start}, {self.end}) {kind})"
        )


def _check_topics(options: KafkaSourceOptions, broker: BrokerView) -> None:
    """A subscribed view topic must exist (one of its generations): reading none would look
    like an empty queue."""
    subscription = options.subscription
    wanted = set(subscription.topics) | {topic for topic, _p in subscription.partitions}
    if not wanted:
        return
    topics = broker.topics()
    missing = sorted(topic for topic in wanted if not generations(topic, topics))
    if missing:
        raise ConfigError(
            f"view topic {', '.join(missing)} does not exist at {options.bootstrap_servers}: a"
            " coordinator creates it when it starts with view_topic set on the queue"
        )


def _generational(options: KafkaSourceOptions) -> bool:
    """Whether the read follows the subscribed view topics' generations (``layer.viewgen``):
    with ``subscribe`` and no offsets that name partitions."""
    return options.subscription.kind == "subscribe" and not any(
        spec is not None and spec.kind == "specific"
        for spec in (options.starting_offsets, options.ending_offsets)
    )


def _reading(
    options: KafkaSourceOptions, broker: BrokerView, floor: Mapping[str, int] | None = None
) -> KafkaSourceOptions:
    """``options`` subscribed to the generations to read of each subscribed view topic: with
    no ``floor``, the newest one holding records; else every one from ``floor[view topic]``."""
    if not _generational(options):
        return options
    topics = broker.topics()
    chosen: list[str] = []
    for view_topic in options.subscription.topics:
        found = generations(view_topic, topics)
        if floor is not None:
            low = floor.get(view_topic, found[-1][0] if found else 0)
            chosen.extend(topic for number, topic in found if number >= low)
            continue
        pick = None
        for _number, topic in reversed(found):
            latest = broker.latest([(topic, p) for p in topics[topic]])
            if pick is None:
                pick = topic  # the newest, if none holds records
            if any(end > 0 for end in latest.values()):
                pick = topic
                break
        chosen.append(pick or view_topic)
    subscription = dataclasses.replace(options.subscription, topics=tuple(chosen))
    return dataclasses.replace(options, subscription=subscription)


def _floor(options: KafkaSourceOptions, offsets: Mapping[tuple[str, int], int]) -> dict[str, int]:
    """Per subscribed view topic, the oldest of its generations a stream at ``offsets`` still
    reads: the newest one it has read records of (every older one was done before that one's
    first record was written), else the oldest it names. Older ones are no longer asked
    about, so their deletion never happens under the stream's consumers."""
    floor: dict[str, int] = {}
    for view_topic in options.subscription.topics:
        named = [
            (number, offset)
            for (topic, _p), offset in offsets.items()
            if (number := generation_of(view_topic, topic)) is not None
        ]
        if named:
            begun = [number for number, offset in named if offset > 0]
            floor[view_topic] = max(begun) if begun else min(number for number, _o in named)
    return floor


def _done(options: KafkaSourceOptions, topic: str, offsets: Mapping[tuple[str, int], int]) -> bool:
    """Whether ``topic`` is a generation a stream at ``offsets`` has read all of (older than
    its ``_floor``): the coordinator may delete it (``layer.viewgen``), so nothing of the stream
    may stay on it. librdkafka (2.16) crashes the process when a topic is deleted under a
    consumer assigned to it (a null topic name in its metadata cache on Tansu)."""
    floor = _floor(options, offsets)
    for view_topic in options.subscription.topics:
        number = generation_of(view_topic, topic)
        if number is not None:
            return number < floor.get(view_topic, number)
    return False


def _superseded(
    options: KafkaSourceOptions, topic: str, offsets: Iterable[tuple[str, int]]
) -> bool:
    """Whether ``topic`` is a generation older than one ``offsets`` already name (a stream went
    on into the newer one, so it had read all of the older one, which was done by then)."""
    for view_topic in options.subscription.topics:
        number = generation_of(view_topic, topic)
        if number is not None:
            return any((generation_of(view_topic, t) or -1) > number for t, _p in offsets)
    return False


def _continues(options: KafkaSourceOptions, topic: str, offsets: Iterable[tuple[str, int]]) -> bool:
    """Whether ``topic`` is a generation newer than one ``offsets`` name: a stream in the older
    one goes on into it past its snapshot, even once its offsets name the newer one (at 0, when
    the newer one was created but its snapshot not yet written as a micro-batch was planned)."""
    for view_topic in options.subscription.topics:
        number = generation_of(view_topic, topic)
        if number is not None:
            return any(
                (older := generation_of(view_topic, t)) is not None and older < number
                for t, _p in offsets
            )
    return False


def _mark(
    options: ViewSourceOptions,
    ranges: Sequence[InputPartition],
    continuing: Iterable[tuple[str, int]] = (),
    earliest: Callable[[Sequence[TP]], Offsets] | None = None,
    stream: bool = False,
) -> list[ViewInputPartition]:
    """The ranges, each marked snapshot when it starts at its partition's beginning (but the
    ``continuing`` ones, newer generations a stream goes on into), and ``stream`` when a
    stream's; ``earliest`` gives the partitions' beginnings (default: asked through a new
    consumer)."""
    after = set(continuing)
    tasks = [r for r in ranges if isinstance(r, KafkaInputPartition)]
    starts: dict[tuple[str, int], int] = {}
    if options.snapshot and tasks:
        wanted = sorted({(t.topic, t.partition) for t in tasks})
        if earliest is not None:
            starts = earliest(wanted)
        else:
            with BrokerView(options.kafka) as broker:
                starts = broker.earliest(wanted)
    return [
        ViewInputPartition(
            t.topic,
            t.partition,
            t.start,
            t.end,
            snapshot=options.snapshot
            and (t.topic, t.partition) not in after
            and t.start <= starts[(t.topic, t.partition)],
            continuation=(t.topic, t.partition) in after,
            stream=stream,
        )
        for t in tasks
    ]


# -- reading ---------------------------------------------------------------------------------

# A new range read starts where the wanted offsets of a partition are further apart than this:
# reading past a gap is cheaper than a new consumer only while the gap is small.
_GAP = 5_000
# Changes expanded and fetched at a time (bounds a task's memory on a long range of changes).
_CHUNK = 20_000

Headers = list[tuple[str, bytes | None]] | None

#: a change with its round's queue and time and the round's place (partition, offset) in the
#: view topic
Placed = tuple[ViewChange, str, int, int, int]


def _changes(options: ViewSourceOptions, task: KafkaInputPartition) -> Iterator[list[Placed]]:
    """The changes of the view records in ``task``, as ``Placed``, in lists of about
    ``_CHUNK``; rounds of other queues (``queue`` option) are passed over."""
    mine = rounds_of(options.queue)
    skip_snapshot = isinstance(task, ViewInputPartition) and task.continuation
    chunk: list[Placed] = []
    for records in _records(options, task):
        for message in records:
            value = message.value()
            if not value or (mine is not None and not mine(message.key())):
                continue
            if skip_snapshot and is_snapshot(cast(Headers, message.headers())):
                continue
            offset = message_offset(message)
            try:
                round_ = decode_round(value)
            except SerializationError as exc:
                raise SerializationError(
                    f"view record {task.topic}/{task.partition}/{offset}: {exc}"
                ) from exc
            queue, at_ms, partition = round_.queue, round_.at_ms, task.partition
            changes = round_.leases if options.leases else round_.changes
            chunk.extend([(change, queue, at_ms, partition, offset) for change in changes])
        if len(chunk) >= _CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def rounds_of(queue: str | None) -> Callable[[bytes | None], bool] | None:
    """Whether a view record's key (the name of the queue that wrote the round) is one of
    ``queue``'s rounds: the queue's own or, for a partitioned queue, one of its shards'
    (``orders#3``: "#" is in no queue's name). None (every round) without ``queue``."""
    if queue is None:
        return None
    own, shard = queue.encode(), (queue + SHARD_MARK).encode()

    def mine(key: bytes | None) -> bool:
        return key == own or (
            key is not None and key.startswith(shard) and key[len(shard) :].isdigit()
        )

    return mine


def _records(options: ViewSourceOptions, task: KafkaInputPartition) -> Iterable[list[Message]]:
    """The view records of ``task``: a stream's range of changes through this process's tail
    of the partition (``connectors.spark_kafka.follow.span``), anything else (or when that
    fails) through a consumer of its own."""
    if isinstance(task, ViewInputPartition) and task.stream and not task.snapshot:
        topics = options.kafka.subscription.topics
        family = [v for v in topics if generation_of(v, task.topic) is not None]
        records = following.span(
            options.kafka,
            task.topic,
            task.partition,
            task.start,
            task.end,
            lambda topic: any(generation_of(v, topic) is not None for v in family),
            keep=not task.last,
        )
        if records is not None:
            return [records]
    return consume_range(options.kafka, task)


def _split(ranges: list[ViewInputPartition], splits: int) -> list[ViewInputPartition]:
    """Each snapshot range as ``splits`` tasks: each reads the whole range (12 bytes a change)
    but keeps, and fetches the messages of, its share of the bookmarks only (blocks of
    ``_BLOCK`` offsets, so the fetches stay runs). Ranges of changes stay whole."""
    if splits <= 1:
        return ranges
    out = []
    for r in ranges:
        if not r.snapshot:
            out.append(r)
            continue
        out.extend(
            ViewInputPartition(r.topic, r.partition, r.start, r.end, True, False, i, splits)
            for i in range(splits)
        )
    return out


_BLOCK = 4096


def _snapshot(options: ViewSourceOptions, task: KafkaInputPartition) -> list[Placed]:
    """The live contents at the end of ``task``: per bookmark its last change, if +1 (of the
    task's share of the bookmarks, when a snapshot is split)."""
    last: dict[tuple[str, Bookmark], Placed] = {}
    shard, shards = (task.shard, task.shards) if isinstance(task, ViewInputPartition) else (0, 1)
    for chunk in _changes(options, task):
        for placed in chunk:
            bm = placed[0].bookmark
            if shards > 1 and (bm.offset // _BLOCK + bm.partition) % shards != shard:
                continue
            key = (placed[1], bm)
            if placed[0].sign > 0:
                last[key] = placed
            else:
                last.pop(key, None)
    return sorted(last.values(), key=lambda placed: placed[4])


def fetch_messages(
    kafka: KafkaSourceOptions, bookmarks: Iterable[Bookmark]
) -> dict[Bookmark, Message]:
    """The messages of ``bookmarks`` from their topics: per partition, the wanted offsets in
    runs (a new run past a gap of ``_GAP``), each run one range read. A bookmark no longer on
    the broker is missing from the answer."""
    by_partition: dict[tuple[str, int], set[int]] = {}
    for bm in bookmarks:
        by_partition.setdefault((bm.topic, bm.partition), set()).add(bm.offset)
    found: dict[Bookmark, Message] = {}
    lenient = dataclasses.replace(kafka, fail_on_data_loss=False)  # a gone message is NULL
    for (topic, partition), offsets in sorted(by_partition.items()):
        ordered = sorted(offsets)
        runs: list[list[int]] = [[ordered[0]]]
        for offset in ordered[1:]:
            if offset - runs[-1][-1] > _GAP:
                runs.append([offset])
            else:
                runs[-1].append(offset)
        for run in runs:
            task = KafkaInputPartition(topic, partition, run[0], run[-1] + 1)
            wanted = set(run)
            try:
                for records in consume_range(lenient, task):
                    for message in records:
                        offset = message_offset(message)
                        if offset in wanted:
                            found[Bookmark(topic, partition, offset)] = message
            except BrokerError:
                if not _topic_exists(kafka, topic):
                    continue  # deleted since: its messages show as NULL
                raise
    return found


def _topic_exists(kafka: KafkaSourceOptions, topic: str) -> bool:
    with BrokerView(kafka) as broker:
        return topic in broker.topics()


def spark_priority(priority: int | None) -> int | None:
    """A priority for Spark's LongType, which is signed: one above it (priorities are unsigned
    64-bit) is shown as the largest long, which still sorts above every smaller one."""
    return None if priority is None else min(priority, 2**63 - 1)


def view_columns(
    kafka: KafkaSourceOptions, placed: list[Placed], follow: bool = False
) -> list[list[Any]]:
    """The columns of ``view_schema()`` for these changes, their messages fetched from the
    brokers; ``follow``: a stream's changes, whose messages this process likely read or can
    read ahead (``connectors.spark_kafka.follow``). Built a column at a time, not a row at a
    time and transposed: at 10,000 msg/s a stream's task turns ~20,000 changes a second into
    rows, and the row tuples and their transposition were half of its Python time."""
    wanted = {change.bookmark for change, *_ in placed}
    if follow:
        messages, rest = following.follow(kafka, wanted)
        fetched = fetch_messages(kafka, rest) if rest else {}
        following.remember(fetched)
        messages.update(fetched)
    else:
        messages = fetch_messages(kafka, wanted)
    changes = [p[0] for p in placed]
    bookmarks = [change.bookmark for change in changes]
    found = [messages.get(bm) for bm in bookmarks]
    stamps = [None if m is None else m.timestamp()[1] for m in found]
    top = 2**63 - 1  # spark_priority, inline
    return [
        [change.sign for change in changes],
        [p[1] for p in placed],
        [str(bm) for bm in bookmarks],
        [bm.topic for bm in bookmarks],
        [bm.partition for bm in bookmarks],
        [bm.offset for bm in bookmarks],
        [None if m is None else m.key() for m in found],
        [_headers(m) for m in found],
        [None if m is None else m.value() for m in found],
        [None if (n := c.priority) is None else min(n, top) for c in changes],
        [change.deliveries for change in changes],
        [change.cancels for change in changes],
        [ms * 1000 if ms and ms > 0 else None for ms in stamps],
        [p[2] * 1000 for p in placed],
        [p[3] for p in placed],
        [p[4] for p in placed],
        [change.holder for change in changes],
        [c.leased_at * 1000 if c.holder is not None else None for c in changes],
    ]


def _headers(message: Message | None) -> list[dict[str, Any]]:
    if message is None:
        return []
    pairs = cast(list[tuple[str, bytes | None]] | None, message.headers())
    return [{"key": k, "value": v} for k, v in pairs] if pairs else []


def read_view_range(
    options: ViewSourceOptions, task: KafkaInputPartition | None
) -> Iterator[pa.RecordBatch]:
    """The changes of ``task`` (its live contents at the end if it is a snapshot range), with
    their messages."""
    if isinstance(task, ViewInputPartition) and task.stream and task.start == task.end:
        _warm(options, task)
        return
    if task is None or task.start >= task.end:
        return
    import pyarrow as pa  # on the executors only

    if isinstance(task, ViewInputPartition) and task.snapshot:
        live = _snapshot(options, task)
        chunks: Iterable[list[Placed]] = (live[i : i + _CHUNK] for i in range(0, len(live), _CHUNK))
    else:
        chunks = _changes(options, task)
    follow = not (isinstance(task, ViewInputPartition) and task.snapshot)
    for chunk in chunks:
        batch = view_batch(pa, view_columns(options.kafka, chunk, follow))
        for i in range(0, batch.num_rows, ROWS_PER_ARROW_BATCH):
            yield batch.slice(i, ROWS_PER_ARROW_BATCH)


def _warm(options: ViewSourceOptions, task: ViewInputPartition) -> None:
    """A stream's empty first range (``ViewStreamReader.partitions``): ready this Python worker
    for the changes to come. Spark started it for this task and it imported this module to run
    it; it imports pyarrow too, and opens its tail of the view-topic partition where the next
    micro-batch starts (the tail fetches in the background from now on)."""
    import pyarrow as pa

    # pyarrow's first conversion of a Python list imports pandas (0.4-0.6 s on an idle
    # machine): done once per process, here rather than in the first change's micro-batch
    pa.array([], pa.int32())
    _records(options, task)


def _arrow_types(pa: Any) -> list[Any]:
    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    micros = pa.timestamp("us", tz="UTC")
    return [
        pa.int32(),  # sign
        pa.string(),  # queue
        pa.string(),  # bookmark
        pa.string(),  # topic
        pa.int32(),  # partition
        pa.int64(),  # offset
        pa.binary(),  # key
        pa.list_(pa.field("element", header)),  # headers, named as Spark 4.3 checks
        pa.binary(),  # value
        pa.int64(),  # priority
        pa.int32(),  # deliveries
        pa.int32(),  # cancels
        micros,  # enqueue_time
        micros,  # changed_at
        pa.int32(),  # view_partition
        pa.int64(),  # view_offset
        pa.string(),  # lease_holder
        micros,  # leased_at
    ]


_COLUMNS = [field.name for field in view_schema().fields]


def view_batch(pa: Any, columns: list[list[Any]]) -> pa.RecordBatch:
    """An Arrow batch of ``view_schema()`` columns (``view_columns``), with its exact schema
    (Spark 4.3 compares the nullability of each column and the names of list items)."""
    kinds = _arrow_types(pa)
    arrays = [pa.array(column, kind) for column, kind in zip(columns, kinds, strict=True)]
    schema = pa.schema(
        [
            pa.field(field.name, kind, nullable=field.nullable)
            for field, kind in zip(view_schema().fields, kinds, strict=True)
        ]
    )
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# -- readers and the source ------------------------------------------------------------------


class ViewBatchReader(KafkaBatchReader):
    """``spark.read``: one input partition per view-topic partition with records to read."""

    def __init__(self, options: ViewSourceOptions) -> None:
        super().__init__(options.kafka)
        self._view = options

    def partitions(self) -> list[InputPartition]:
        with BrokerView(self._view.kafka) as broker:
            _check_topics(self._view.kafka, broker)
            self._options = _reading(self._view.kafka, broker)
        return list(_split(_mark(self._view, super().partitions()), self._view.splits))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_view_range(self._view, as_range(partition, VIEW_FORMAT))


class ViewStreamReader(KafkaStreamReader):
    """``spark.readStream``: the live contents first (with ``snapshot``), then every change.

    On the driver it follows the ends of the view-topic partitions it reads with one consumer
    for the stream's life (``connectors.spark_kafka.ends``): a view topic is small.
    """

    def __init__(self, options: ViewSourceOptions) -> None:
        super().__init__(options.kafka)
        self._view = options
        self._checked = False
        self._follower: EndFollower | None = None  # made on first use, on the driver
        self._warmed = False  # a micro-batch ran a read task (Spark's Python worker started)
        self._changes_only = dataclasses.replace(options, snapshot=False)

    def stop(self) -> None:
        super().stop()
        if self._follower is not None:
            self._follower.close()
            self._follower = None

    def initialOffset(self) -> dict:
        if not self._checked:
            with self._broker() as broker:
                _check_topics(self._view.kafka, broker)
            self._checked = True
        return super().initialOffset()

    def _initial_offsets(self) -> Offsets:
        if self._initial is None:
            with self._broker() as broker:
                self._options = _reading(self._view.kafka, broker)
        return super()._initial_offsets()

    def latestOffset(self, *args: Any) -> dict:
        """Up to the end of every generation from the oldest the stream is in."""
        start = offsets_from_json(args[0]) if len(args) == 2 else self._position
        if start is None:
            start = self._initial_offsets()
        with self._broker() as broker:
            self._options = _reading(self._view.kafka, broker, _floor(self._view.kafka, start))
            latest = self._latest(broker, *args)
        if self._follower is not None and _generational(self._view.kafka):
            # The micro-batch to ``latest`` finishes the older generations it reads into a newer
            # one: stop following them now, not at the next call (the coordinator may delete
            # one while the micro-batch runs, and a consumer on it would crash the process).
            end = offsets_from_json(latest)
            self._follower.retain([tp for tp in end if not _done(self._view.kafka, tp[0], end)])
        return latest

    def _ends(self, broker: BrokerView, partitions: Sequence[TP]) -> Offsets:
        if self._follower is None:
            kafka = self._view.kafka
            self._follower = EndFollower(kafka.consumer_config(), kafka.poll_timeout_ms / 1000)
        return self._follower.ends(partitions)

    def _earliest(self, partitions: Sequence[TP]) -> Offsets:
        """Low watermarks, through the end follower where it follows the partitions."""
        found = None if self._follower is None else self._follower.earliest(partitions)
        if found is None:
            with BrokerView(self._view.kafka) as broker:
                found = broker.earliest(partitions)
        return found

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, until = offsets_from_json(start), offsets_from_json(end)
        kafka = self._view.kafka
        if _generational(kafka):
            # a generation deleted after the stream went on into a newer one is no data loss
            begin = {
                tp: offset
                for tp, offset in begin.items()
                if tp in until or not _superseded(kafka, tp[0], begin)
            }
        continuing = (
            [tp for tp in until if tp not in begin or _continues(kafka, tp[0], begin)]
            if _generational(kafka)
            else []
        )
        ranges = super().partitions(offsets_to_json(begin), end)
        # Only the stream's first read is the live contents (a snapshot, with snapshot=true):
        # every range after it is changes, read by the worker's tail of the view partition,
        # even one that starts at the partition's beginning because the first micro-batch
        # found the topic empty (and no partition's beginning is asked for any more).
        view = self._changes_only if self._warmed else self._view
        marked = _mark(view, ranges, continuing, self._earliest, stream=True)
        if not marked and not self._warmed:
            # The stream's first micro-batch has nothing to read (an empty queue): read an
            # empty range of each view-topic partition anyway. Spark starts a Python worker for
            # a data source's first task, which took 2 s on an idle machine and 4-7 s under
            # load (the worker's processes, imports, consumers): without this the first change
            # after the stream started waited for it. Spark reuses the worker for the
            # micro-batches that follow (spark.python.worker.reuse, on by default).
            marked = [
                ViewInputPartition(topic, partition, at, at, snapshot=False, stream=True)
                for (topic, partition), at in sorted(until.items())
            ]
        self._warmed = self._warmed or bool(marked)
        if _generational(kafka):
            for task in marked:
                task.last = _done(kafka, task.topic, until)
        return marked

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_view_range(self._view, as_range(partition, VIEW_FORMAT))


class ViewDataSource(KafkaDataSource):
    """The ``qlayer_view`` format: a queue's view topic as decoded, signed changes."""

    def __init__(self, options: dict[str, str]) -> None:
        # not KafkaDataSource.__init__: it would parse the options as qlayer_kafka's
        DataSource.__init__(self, options)
        self._view = ViewSourceOptions.parse(options)
        self._parsed = self._view.kafka

    @classmethod
    def name(cls) -> str:
        return VIEW_FORMAT

    def schema(self) -> StructType:
        return view_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        super().reader(schema)  # the checks of the options against a batch read
        return ViewBatchReader(self._view)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        super().streamReader(schema)
        return ViewStreamReader(self._view)


def register_view(spark: SparkSession) -> str:
    """Register the ``qlayer_view`` data source with ``spark`` (once); return the format name."""
    return register_once(spark, ViewDataSource)
