"""The ``qlayer`` command line.

Exit codes: 0 success, 1 runtime failure (broker or coordinator failed), 2 bad usage, bad
configuration or a state directory that does not belong to the cluster, 3 the server refused the
request (unknown queue, refused ack), 130 interrupted.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import math
import signal
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layer.coordinator.live_options import LIVE_OPTIONS
from layer.exceptions import (
    ClientError,
    ConfigError,
    InvalidRequest,
    LeaseError,
    PermissionDenied,
    QLayerError,
    QueueBusy,
    QueueExists,
    StateMismatch,
    Unauthenticated,
    UnknownQueue,
)

if TYPE_CHECKING:
    from layer.client import Reconnected

log = logging.getLogger("layer.cli")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_REFUSED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

DEFAULT_SERVER = "127.0.0.1:7070"

FILTER_HELP = (
    "Filters are AMPS-style expressions over the message's JSON fields, e.g.\n"
    "  \"/symbol = 'IBM' AND /qty > 100\"\n"
    "  \"/region IN ('EU', 'US') OR /order/priority >= 5\"\n"
    "  \"/symbol LIKE '^IB'\"   (a regular expression)\n"
    "  \"HEADER('region') = 'EU' AND KEY() LIKE '^cust-'\"   (the Kafka record's fields)\n"
    "Field paths look like XPath: /order/qty, /items[0]/qty (0-based). KEY(), HEADER('name'),\n"
    "TIMESTAMP() (seconds), TOPIC() and PARTITION() read the record. Quote the whole filter\n"
    "for the shell; an invalid one is refused with the column of the problem (exit code 2)."
)


def _filter_epilog(*examples: str) -> str:
    return FILTER_HELP + "\n\nExamples:\n" + "\n".join(f"  {e}" for e in examples)


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
    return value


def _count(text: str) -> int:
    """An argparse type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="qlayer",
        description=(
            "Message queues on Kafka. Publishers write to ordinary Kafka topics; the coordinator "
            "turns them into queues (leases, acks, redelivery, dead letters); consumers use the "
            "coordinator's API."
        ),
        epilog=(
            "Start here:  qlayer demo   (embedded broker, coordinator, publish, consume)\n"
            "Then:        qlayer broker  &  qlayer coordinator --config qlayer.toml"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--debug", action="store_true", help="log debug output and show tracebacks")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    b = sub.add_parser(
        "broker",
        help="run the embedded Kafka-compatible broker (Tansu, in memory) in the foreground",
        description="Run the embedded broker until SIGINT/SIGTERM. Data lives in memory only.",
    )
    b.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")

    c = sub.add_parser(
        "coordinator",
        help="run a coordinator: the queues of a config file, served over gRPC",
        description=(
            "Run the queues defined in a TOML config file. Flags override the file; the "
            "environment (QLAYER_BOOTSTRAP_SERVERS, QLAYER_KAFKA_<KEY>) overrides the file too. "
            "Without a bootstrap address an embedded in-memory broker is started (development "
            "only)."
        ),
    )
    c.add_argument("--config", required=True, help="the TOML config file")
    c.add_argument("--bootstrap", help="Kafka bootstrap servers, host:port[,host:port]")
    c.add_argument("--listen", help="API address host:port (default from config: 127.0.0.1:7070)")
    c.add_argument("--state-dir", help="RocksDB state directory")
    c.add_argument(
        "--reset-state",
        action="store_true",
        help=(
            "discard the local state (the RocksDB files in the state directory) and rebuild it "
            "from the changelog in Kafka. Use it when the coordinator refuses a state directory "
            "that does not belong to the cluster (exit code 2), e.g. after an in-memory broker "
            "restarted empty"
        ),
    )
    c.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve GET /healthz and /readyz on this address (default from config: off)",
    )

    def client_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--server",
            default=DEFAULT_SERVER,
            help=(
                f"coordinator HOST:PORT, several as H1:P1,H2:P2; of a cluster any member will do "
                f"(subscriptions follow their queue's owner) (default {DEFAULT_SERVER})"
            ),
        )
        sp.add_argument("--token", help="bearer token, if the coordinator requires one")
        sp.add_argument("--tls-ca", metavar="PEM", help="CA certificate: connect with TLS")
        sp.add_argument(
            "--tls-cert",
            metavar="PEM",
            help="client certificate (mutual TLS; its subject names the principal)",
        )
        sp.add_argument("--tls-key", metavar="PEM", help="the client certificate's private key")

    pub = sub.add_parser(
        "publish",
        help="publish messages to a queue (its publish target topic)",
        description=(
            "Publish DATA, or one message per line of standard input when DATA is '-'.\n"
            "On a json (or avro) queue a message that does not parse is refused, naming the\n"
            "queue, the type and where parsing stopped (exit 2); with '-' the refused lines\n"
            "are named by number on stderr and the others are published."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pub.add_argument("queue")
    pub.add_argument("data", help="the message (use '-' to read lines from standard input)")
    pub.add_argument("--key", help="the Kafka message key")
    pub.add_argument(
        "--header", action="append", default=[], metavar="K=V", help="a header (repeatable)"
    )
    pub.add_argument(
        "--delay",
        type=_seconds,
        metavar="SECONDS",
        help=(
            "deliver no sooner than SECONDS from now (sets the header deliver_after to that "
            "UNIX time, e.g. 1763800000.250)"
        ),
    )
    client_args(pub)

    con = sub.add_parser(
        "consume",
        help="consume messages from a queue, print them and ack them (or --cancel)",
        description=(
            "Print each message as a JSON line and ack it (or cancel it with --cancel).\n"
            'A barrier message is printed with "barrier": true and needs no ack.'
        ),
        epilog=_filter_epilog("qlayer consume orders --filter \"/symbol = 'IBM' AND /qty > 100\""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    con.add_argument("queue")
    con.add_argument("--filter", metavar="EXPR", help="deliver only messages matching EXPR")
    con.add_argument(
        "--max-backlog", type=int, default=1, help="unacked messages in flight (default 1)"
    )
    con.add_argument("--count", type=int, default=0, help="stop after N messages (default: run on)")
    con.add_argument(
        "--timeout", type=float, default=0, help="stop after N idle seconds (default: never)"
    )
    con.add_argument("--cancel", action="store_true", help="cancel instead of ack (returns them)")
    client_args(con)

    dl = sub.add_parser(
        "dead-letters",
        help="list a queue's dead letters, decoded",
        description=(
            "List the dead letters of QUEUE (read from its dead_letter_topic, in the order\n"
            "they were dead-lettered): a table (letter bookmark, reason, deliveries, cancels,\n"
            "original bookmark, payload), or with --json one JSON object per line with\n"
            "bookmark, original, reason, detail, deliveries, cancels, key, payload, headers,\n"
            "message_timestamp_ms, dead_lettered_at_ms and redriven. Keys and payloads are\n"
            'UTF-8 text, {"base64": "..."} when they are not valid UTF-8, or null.'
        ),
        epilog=_filter_epilog("qlayer dead-letters orders --filter \"/sym = 'IBM'\" --limit 20"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dl.add_argument("queue")
    dl.add_argument("--filter", metavar="EXPR", help="only letters whose payload matches EXPR")
    dl.add_argument("--limit", type=int, metavar="N", help="at most N letters")
    dl.add_argument("--json", action="store_true", help="one JSON object per line")
    client_args(dl)

    cl = sub.add_parser(
        "cluster",
        help="the cluster: its members, whether they answer, and the owner of each queue",
        description=(
            "Ask the coordinator at --server about its cluster (the coordinators sharing its\n"
            "[coordinator] cluster name): each member's id, API address, control partitions\n"
            "and whether it is alive (it answered that coordinator's health check within a\n"
            "second), then each queue with its partition and the member serving it (none while\n"
            "it moves between members). A coordinator not in a cluster says so and lists the\n"
            "queues it serves itself. With --json: one JSON object with cluster, member (the\n"
            "one that answered), standalone, members and queues.\n"
            "Exit codes: 0 answered, 1 no coordinator at --server, 3 refused (token)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cl.add_argument("--json", action="store_true", help="one JSON object")
    client_args(cl)

    st = sub.add_parser(
        "stats",
        help="print queue statistics as JSON",
        description=(
            "Print one JSON object per queue: QUEUE's, or every queue's. On a member of a\n"
            "cluster, every queue of the cluster, each with the figures of the member serving\n"
            'it (its id in "owner"). A member that does not answer costs only its own\n'
            "queues: one line on stderr names it, the reason and the queues not shown, the\n"
            "others are printed, and the exit code is 1.\n"
            "Exit codes: 0 every queue shown, 1 some or all not (coordinator or member\n"
            "unreachable), 3 refused (unknown queue, token)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    st.add_argument("queue", nargs="?", help="one queue (default: every queue)")
    client_args(st)

    br = sub.add_parser(
        "browse",
        help="list a queue's available messages without consuming them",
        description=(
            "List the messages available in QUEUE, in delivery order, without leasing or\n"
            "changing anything: a table (bookmark, deliveries, timestamp, value), or with\n"
            "--json one JSON object per line with bookmark, key, value, headers ([key, value]\n"
            "pairs), deliveries, cancels, timestamp_ms and barrier. Keys and values are UTF-8\n"
            'text, {"base64": "..."} when they are not valid UTF-8, or null.'
        ),
        epilog=_filter_epilog(
            "qlayer browse orders --limit 20",
            "qlayer browse orders --filter \"/symbol = 'IBM' AND /qty > 100\" --json | jq .value",
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    br.add_argument("queue")
    br.add_argument("--filter", metavar="EXPR", help="list only messages matching EXPR")
    br.add_argument("--limit", type=_count, metavar="N", help="list at most N messages")
    br.add_argument("--json", action="store_true", help="one JSON object per line")
    client_args(br)

    rp = sub.add_parser(
        "replay",
        help="replay a queue's topics from a bookmark or a time (nothing consumed)",
        description=(
            "Replay through the queue's name (AMPS's bookmark subscription to a queue): print\n"
            "the records of QUEUE's underlying topics from a point on, as plain\n"
            "publish/subscribe. Nothing is leased or acked and the queue's state is not\n"
            "touched. One JSON object per line: bookmark, key, value, headers, timestamp_ms and\n"
            "parse_error (set when the payload does not parse as the queue's message_type).\n"
            "Without --follow it stops at the end the topics had when it began."
        ),
        epilog=(
            "--since is a bookmark TOPIC/PARTITION/OFFSET (replayed after it; repeat it, one\n"
            "per partition: the others replay from their beginning), a time (ISO 8601 with a\n"
            "zone, e.g. 2026-11-25T01:00:00Z, or epoch seconds) or a duration ago (10m, 2h).\n"
            "Without --since: from the beginning. --until takes a time or a duration ago.\n\n"
            "examples:\n"
            "  qlayer replay orders --since 10m\n"
            "  qlayer replay orders --since orders/0/41 --filter '/qty > 10'\n"
            "  qlayer replay orders --since 2026-11-25T01:00:00Z --follow"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rp.add_argument("queue")
    rp.add_argument("--since", action="append", default=[], metavar="BOOKMARK|TIME")
    rp.add_argument("--until", metavar="TIME", help="stop before records from this time on")
    rp.add_argument("--follow", action="store_true", help="go on with new records (Ctrl-C ends)")
    rp.add_argument("--filter", metavar="EXPR", help="print only records matching EXPR")
    rp.add_argument("--count", type=_count, default=0, metavar="N", help="stop after N records")
    client_args(rp)

    aw = sub.add_parser(
        "ack-where",
        help="ack (or --expire) every available message matching a filter",
        description=(
            "Ack every deliverable message of QUEUE that matches FILTER, or with --expire\n"
            "expire it (dead-letter it, where the queue has a dead-letter topic). Prints\n"
            '"acked N, skipped M" ("expired N, skipped M" with --expire); skipped messages\n'
            "matched but are leased to a subscriber under strict leasing, or not deliverable now."
        ),
        epilog=_filter_epilog(
            "qlayer ack-where orders \"/status = 'cancelled'\"",
            "qlayer ack-where orders \"/symbol = 'IBM' AND /qty > 100\" --expire",
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    aw.add_argument("queue")
    aw.add_argument("filter", help="the filter expression (quote it)")
    aw.add_argument("--expire", action="store_true", help="expire instead of ack")
    client_args(aw)

    rd = sub.add_parser(
        "redrive",
        help="move a queue's dead letters back into it",
        description=(
            "Publish QUEUE's dead letters into it again as new messages (fresh delivery\n"
            "counts), each at most once ever: the move is recorded in the changelog. Prints\n"
            '"moved N, already redriven M, unmatched K".'
        ),
        epilog=_filter_epilog(
            "qlayer redrive orders",
            "qlayer redrive orders --filter \"/symbol = 'IBM'\" --limit 100",
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rd.add_argument("queue")
    rd.add_argument("--filter", metavar="EXPR", help="move only dead letters matching EXPR")
    rd.add_argument("--limit", type=_count, metavar="N", help="move at most N dead letters")
    client_args(rd)

    rl = sub.add_parser(
        "reload",
        help="make a running coordinator read its config file again and apply it",
        description=(
            "Have the coordinator at --server read the config file it was started with again\n"
            "(as SIGHUP does) and apply it, all or nothing: added queues start serving, removed\n"
            "ones end their subscriptions (their state is kept for a later re-add), live options\n"
            "change, and consumers of other queues notice nothing. An option that cannot change\n"
            "while it runs (underlying_topic, semantics, [coordinator], ...) refuses the whole\n"
            "reload: nothing changes. Prints what was added, removed, changed or refused.\n"
            "Exit codes: 0 applied, 2 the file does not load (nothing changed), 3 refused.\n"
            "An admin call: pass a token with the admin right on every queue (a tokens-file\n"
            'grant on "*") or the coordinator\'s admin_token, with --token.'
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    client_args(rl)

    qd = sub.add_parser(
        "queue",
        help="create, alter, delete or list the cluster's queues, live",
        description=(
            "The cluster's queues live in its definitions topic (qlayer.queues.<cluster>, the\n"
            "cluster being [coordinator] cluster, or its id): a change made here is live on\n"
            "every coordinator of the cluster at once, with no restart, and survives restarts.\n"
            "The config file's [[queue]] tables seed the topic: a table new or edited in the\n"
            "file is written when the coordinator starts or reloads; an unchanged table writes\n"
            "nothing, so what you change here stays as you left it. Options and their checks\n"
            "are the config file's. Admin calls (create, alter, delete): pass a token with the\n"
            'admin right on every queue (a grant on "*") or the admin_token, with --token.\n'
            "Exit codes: 0 done, 2 invalid input (nothing changed), 3 refused (unknown queue,\n"
            "leased messages, permission)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    qsub = qd.add_subparsers(dest="queue_command", metavar="ACTION", required=True)
    option_help = (
        "an option of the queue's [[queue]] table, its value as TOML writes it"
        ' (lease_period=30s, max_deliveries=5, exclusive=true, filter="/x > 1"); a value'
        " that is not TOML is taken as a string; repeat for several"
    )
    qc = qsub.add_parser(
        "create",
        help="define a new queue for the whole cluster",
        description=(
            "Define a queue: it serves on every coordinator of the cluster as soon as this\n"
            "returns (topics created if missing, as for the config file's queues)."
        ),
        epilog=(
            "examples:\n"
            "  qlayer queue create orders --underlying-topic orders --option lease_period=30s\n"
            "  qlayer queue create --from-file orders.toml   # a file of one [[queue]] table"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    qc.add_argument("name", nargs="?", help="the queue's name (or give it in --from-file)")
    qc.add_argument("--underlying-topic", metavar="TOPIC", help="the topic (or ^regex) it reads")
    qc.add_argument(
        "--from-file", metavar="FILE", help="a TOML file with one [[queue]] table (or its keys)"
    )
    qc.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help=option_help)
    client_args(qc)
    qa = qsub.add_parser(
        "alter",
        help="change options of a queue, live",
        description=(
            "New values of a queue's options, live on every coordinator when this returns.\n"
            "The options that change live, and when the new value applies:\n"
            + "".join(f"  {name}: {when}\n" for name, when in LIVE_OPTIONS.items())
            + "The others (underlying_topic, semantics, filter, priority, ...) shape the state\n"
            "already built: refused, with the reason; define a new queue instead."
        ),
        epilog=(
            "example:\n"
            "  qlayer queue alter orders --option lease_period=2m --option max_deliveries=5"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    qa.add_argument("name")
    qa.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help=option_help)
    client_args(qa)
    qx = qsub.add_parser(
        "delete",
        help="delete a queue for the whole cluster",
        description=(
            "Delete a queue: its subscriptions end (queue_removed) and it stops serving on\n"
            "every coordinator; it stays deleted across restarts even if a config file still\n"
            "has its table (create it again to bring it back). Its topics and changelog are\n"
            "kept: a queue created again under the same name resumes from its state. Refused\n"
            "while messages are leased (their acks would be refused) unless --force."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    qx.add_argument("name")
    qx.add_argument("--force", action="store_true", help="delete even with leased messages")
    client_args(qx)
    ql = qsub.add_parser("list", help="the cluster's queue definitions")
    ql.add_argument("--json", action="store_true", help="one JSON object per queue")
    client_args(ql)

    tok = sub.add_parser(
        "token",
        help="make bearer tokens for the coordinator's tokens file",
        description="Make bearer tokens and the tokens-file entries that hold their hashes.",
    )
    tok_sub = tok.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    tn = tok_sub.add_parser(
        "new",
        help="make a token and print it with its [[principal]] table",
        description=(
            "Print a new random token for principal NAME and the [[principal]] table to add to\n"
            "the tokens file ([coordinator] tokens_file). The file keeps only the token's\n"
            "SHA-256: the token is shown this once. Give it to the client (--token, or metadata\n"
            "'authorization: Bearer <token>'); apply the file with `qlayer reload` or SIGHUP.\n"
            "To give a principal a second token (rotation), add its token_sha256 to the list."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tn.add_argument("name", help="the principal's name (shown in denials and logs)")
    tn.add_argument(
        "--queues", default="*", metavar="GLOB", help="queues of the grant (default: *)"
    )
    tn.add_argument(
        "--rights",
        default="consume",
        metavar="R[,R]",
        help="rights of the grant: consume, publish, browse, admin (default: consume)",
    )
    tn.add_argument("--json", action="store_true", help="print one JSON object instead")

    d = sub.add_parser(
        "demo",
        help="run the end-to-end demo: broker, coordinator, 1,000 orders, 3 consumers",
        description="Start everything it needs, show a consumer dying midway, clean up.",
    )
    d.add_argument("--messages", type=int, default=1000)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # the long-running commands report progress; client commands only print their result and,
    # on failure, one line (the client library's own warnings would make it two)
    quiet = args.command not in ("broker", "coordinator", "demo")
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.ERROR if quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not args.debug:
        logging.getLogger("grpc").setLevel(logging.WARNING)
        # kafka-python (a cluster member's removal of a dead one) narrates each connection
        logging.getLogger("kafka").setLevel(logging.WARNING)
    if args.command is None:
        _parser().print_help()
        return EXIT_USAGE
    try:
        return int(COMMANDS[args.command](args) or 0)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (ConfigError, InvalidRequest, QueueExists) as exc:
        return _fail(args, exc, EXIT_USAGE)
    except (UnknownQueue, QueueBusy, LeaseError, PermissionDenied, Unauthenticated) as exc:
        return _fail(args, exc, EXIT_REFUSED)
    except (ClientError, QLayerError) as exc:
        return _fail(args, exc, EXIT_FAILURE)


def _fail(args: argparse.Namespace, exc: BaseException, code: int) -> int:
    if args.debug:
        log.exception("qlayer %s failed", args.command)
    print(f"qlayer {args.command}: {exc}", file=sys.stderr)
    return code


def cmd_broker(args: argparse.Namespace) -> int:
    from connectors.embedded import EmbeddedBroker

    broker = EmbeddedBroker(port=args.port or None)
    broker.start()
    print(
        f"embedded broker serving on {broker.bootstrap_servers} (in memory; Ctrl-C stops it)",
        flush=True,
    )
    stop = False

    def on_signal(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        while not stop and broker.running:
            time.sleep(0.2)
    finally:
        broker.stop()
    return EXIT_OK if stop else EXIT_FAILURE


# The coordinator's threads (ingest readers, the changelog commit, gRPC) hand each batch to the
# event loop and back; a thread whose blocking call returned waits for the GIL up to this long
# while another runs Python. Python's 5 ms default put up to 5 ms on each hand-over of a
# delivery's way (latency by stage, README "Latency").
COORDINATOR_SWITCH_INTERVAL = 0.001

#: how long the threads a stopped coordinator leaves running may take to end before it exits
#: without them (``cmd_coordinator``)
EXIT_GRACE_S = 2.0
#: how long a stopped coordinator's interpreter exit may take (``cmd_coordinator``)
EXIT_BOUND_S = 10.0


def cmd_coordinator(args: argparse.Namespace) -> int:
    from layer.config import load
    from layer.coordinator.app import (
        exit_now_if_stuck,
        print_http_ready,
        print_ready,
        run_loop,
        serve,
    )

    overrides = {
        k: v
        for k, v in {
            "bootstrap_servers": args.bootstrap,
            "listen": args.listen,
            "state_dir": args.state_dir,
            "http": args.http,
        }.items()
        if v is not None
    }
    config = load(args.config, overrides=overrides)
    sys.setswitchinterval(COORDINATOR_SWITCH_INTERVAL)
    try:
        code = run_loop(
            serve(
                config,
                ready=print_ready,
                http_ready=print_http_ready,
                reset_state=args.reset_state,
            )
        )
    except StateMismatch as exc:
        # the operator must choose (reset or repoint): a plain restart would fail the same way
        return _fail(args, exc, EXIT_USAGE)
    # Its parts are closed (the state store too): what is left is the interpreter's exit, which
    # joins the threads still running. One blocked in a client library must not keep the
    # process (and a supervisor's restart) waiting: after EXIT_GRACE_S the process exits
    # without them; and past EXIT_BOUND_S, whatever holds it, every thread's stack is printed
    # to stderr and the process exits 1.
    faulthandler.dump_traceback_later(EXIT_BOUND_S, exit=True)
    exit_now_if_stuck(code, EXIT_GRACE_S)
    return code


def _client(args: argparse.Namespace, **options: Any):  # type: ignore[no-untyped-def]
    from layer.client import QueueClient

    root = None
    if args.tls_ca:
        try:
            with open(args.tls_ca, "rb") as f:
                root = f.read()
        except OSError as exc:
            raise InvalidRequest(f"--tls-ca {args.tls_ca}: {exc.strerror}") from exc
    if (args.tls_cert is None) != (args.tls_key is None):
        raise InvalidRequest("--tls-cert and --tls-key go together")
    if args.tls_cert is not None:
        pair = []
        for flag, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
            try:
                with open(path, "rb") as f:
                    pair.append(f.read())
            except OSError as exc:
                raise InvalidRequest(f"{flag} {path}: {exc.strerror}") from exc
        options["tls_client_cert"] = (pair[0], pair[1])
    return QueueClient(args.server, token=args.token, tls_root_cert=root, **options)


def cmd_publish(args: argparse.Namespace) -> int:
    headers = []
    for h in args.header:
        k, sep, v = h.partition("=")
        if not sep:
            raise InvalidRequest(f"header {h!r} is not K=V")
        headers.append((k, v.encode()))
    if args.delay is not None and any(k == "deliver_after" for k, _ in headers):
        raise InvalidRequest("--delay sets the header deliver_after: give one or the other")
    batch = args.data == "-"
    lines = sys.stdin if batch else [args.data]
    refused = 0
    with _client(args) as client:
        for number, line in enumerate(lines, 1):
            line = line.rstrip("\n")
            if not line:
                continue
            try:
                bookmark = client.publish(
                    args.queue,
                    line.encode(),
                    key=args.key.encode() if args.key else None,
                    headers=headers,
                    delay=args.delay,
                )
            except InvalidRequest as exc:
                if not batch:
                    raise
                # one refused line (say, one that does not parse) does not stop the others
                print(f"qlayer publish: line {number}: {exc}", file=sys.stderr, flush=True)
                refused += 1
                continue
            print(bookmark, flush=True)
    if refused:
        print(f"qlayer publish: {refused} line(s) refused", file=sys.stderr, flush=True)
        return EXIT_USAGE
    return EXIT_OK


def _reconnected(event: Reconnected) -> None:
    # stdout carries only messages: the news of a reconnect goes to stderr
    print(
        f"qlayer consume: reconnected to {event.address} after {event.downtime_s:.1f}s "
        f"({event.unconfirmed_acks} acks unconfirmed: their messages come back)",
        file=sys.stderr,
        flush=True,
    )


def cmd_consume(args: argparse.Namespace) -> int:
    """Runs across coordinator restarts: the client reconnects (and says so on stderr)."""
    n = 0
    with (
        _client(args, on_reconnect=_reconnected) as client,
        client.subscribe(args.queue, max_backlog=args.max_backlog, filter=args.filter) as sub,
    ):
        while args.count <= 0 or n < args.count:
            msg = sub.next(timeout=args.timeout or None)
            if msg is None:
                break
            try:
                data: object = json.loads(msg.data)
            except ValueError:
                data = msg.data.decode(errors="replace")
            line: dict[str, object] = {
                "bookmark": msg.bookmark,
                "deliveries": msg.deliveries,
                "data": data,
            }
            if msg.barrier:
                line["barrier"] = True  # ack and cancel below are no-ops for it
            if msg.parse_error is not None:
                line["parse_error"] = msg.parse_error  # on_unparseable = "deliver"
            print(json.dumps(line, default=str), flush=True)
            if args.cancel:
                msg.cancel()
            else:
                msg.ack()
            n += 1
        sub.flush(timeout=10)
    return EXIT_OK


def cmd_stats(args: argparse.Namespace) -> int:
    import dataclasses

    with _client(args) as client:
        if args.queue is not None:
            found, missing = client.stats(args.queue), []
        else:
            report = client.cluster_stats()
            found, missing = report.queues, report.missing
    for s in found:
        print(json.dumps(dataclasses.asdict(s), default=str), flush=True)
    for m in missing:
        queues = ", ".join(m.queues)
        if m.member:
            print(
                f"qlayer stats: member {m.member!r} at {m.address}: {m.reason};"
                f" not shown: {queues}",
                file=sys.stderr,
            )
        else:
            print(f"qlayer stats: {m.reason}; not shown: {queues}", file=sys.stderr)
    # what was shown is right, but not everything: a script must be able to tell
    return EXIT_FAILURE if missing else EXIT_OK


def cmd_cluster(args: argparse.Namespace) -> int:
    import dataclasses

    with _client(args) as client:
        info = client.cluster()
    if args.json:
        print(json.dumps(dataclasses.asdict(info)), flush=True)
        return EXIT_OK
    if info.standalone:
        print(
            f"coordinator {info.member!r} is not in a cluster ([coordinator] cluster is not set):"
            " it serves every queue it defines itself"
        )
    else:
        print(f"cluster {info.cluster!r} (as member {info.member!r} sees it)")
        rows = [
            (m.id, m.address, "yes" if m.alive else "NO", " ".join(map(str, m.partitions)) or "-")
            for m in info.members
        ]
        _table(("MEMBER", "ADDRESS", "ALIVE", "PARTITIONS"), rows)
    print()
    if not info.queues:
        print("no queues")
    else:
        _table(
            ("QUEUE", "PARTITION", "OWNER", "ADDRESS"),
            [
                (q.queue, str(q.partition), q.member or "-", q.address or "(none: moving)")
                for q in info.queues
            ],
        )
    sys.stdout.flush()
    return EXIT_OK


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Columns padded to their widest cell, the last one left as it is."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head) - 1)]
    for row in [head, *rows]:
        cells = [f"{cell:<{w}}" for cell, w in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]))


def _shown(data: bytes | None, width: int) -> str:
    """Bytes for a table cell: one line, control characters escaped, cut to ``width``."""
    if data is None:
        return "(null)"
    text = data.decode("utf-8", errors="replace")
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    return text if len(text) <= width else text[: width - 3] + "..."


def cmd_browse(args: argparse.Namespace) -> int:
    from layer.api.service import bytes_json

    with _client(args) as client:
        messages = client.browse(args.queue, filter=args.filter, limit=args.limit)
    if args.json:
        for m in messages:
            record = {
                "bookmark": m.bookmark,
                "key": bytes_json(m.key),
                "value": bytes_json(m.value),
                "headers": [[k, bytes_json(v)] for k, v in m.headers],
                "deliveries": m.deliveries,
                "cancels": m.cancels,
                "timestamp_ms": m.timestamp_ms,
                "barrier": m.barrier,
                "parse_error": m.parse_error,
            }
            print(json.dumps(record, ensure_ascii=False), flush=True)
        return EXIT_OK
    if not messages:
        print(f"no available messages in queue {args.queue}")
        return EXIT_OK
    width = max(len("BOOKMARK"), *(len(m.bookmark) for m in messages))
    print(f"{'BOOKMARK':<{width}}  {'DELIVERIES':>10}  {'TIMESTAMP (UTC)':<23}  VALUE")
    for m in messages:
        when = datetime.fromtimestamp(m.timestamp_ms / 1000, UTC)
        stamp = when.strftime("%Y-%m-%d %H:%M:%S.") + f"{m.timestamp_ms % 1000:03d}"
        value = ("[barrier] " if m.barrier else "") + _shown(m.value, 60)
        print(f"{m.bookmark:<{width}}  {m.deliveries:>10}  {stamp:<23}  {value}")
    return EXIT_OK


def _replay_time(option: str, text: str) -> float:
    """Epoch seconds of a --since/--until value: ISO 8601 with a zone, epoch seconds, or a
    duration ago."""
    from layer.durations import parse_duration

    try:
        return float(text)
    except ValueError:
        pass
    try:
        return time.time() - parse_duration(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidRequest(
            f"{option} {text!r} is not a bookmark, an ISO 8601 time, epoch seconds or a duration"
        ) from None
    if when.tzinfo is None:
        raise InvalidRequest(f"{option} {text!r}: give the time zone, e.g. {text}Z")
    return when.timestamp()


def cmd_replay(args: argparse.Namespace) -> int:
    from layer.api.service import bytes_json

    bookmarks = [s for s in args.since if "/" in s]
    times = [s for s in args.since if "/" not in s]
    if times and (bookmarks or len(times) > 1):
        raise InvalidRequest("--since: one time, or bookmarks (one per partition), not both")
    since: str | list[str] | float | None = None
    if bookmarks:
        since = bookmarks
    elif times:
        since = _replay_time("--since", times[0])
    until = None if args.until is None else _replay_time("--until", args.until)
    n = 0
    with _client(args) as client:
        stream = client.replay(args.queue, since, until, follow=args.follow, filter=args.filter)
        try:
            for m in stream:
                record = {
                    "bookmark": m.bookmark,
                    "key": bytes_json(m.key),
                    "value": bytes_json(m.value),
                    "headers": [[k, bytes_json(v)] for k, v in m.headers],
                    "timestamp_ms": m.timestamp_ms,
                    "parse_error": m.parse_error,
                }
                print(json.dumps(record, ensure_ascii=False), flush=True)
                n += 1
                if args.count and n >= args.count:
                    break
        finally:
            stream.close()
    return EXIT_OK


def cmd_dead_letters(args: argparse.Namespace) -> int:
    from layer.api.service import bytes_json

    with _client(args) as client:
        letters = client.dead_letters(args.queue, filter=args.filter, limit=args.limit)
    if args.json:
        for d in letters:
            record = {
                "bookmark": d.bookmark,
                "original": d.original,
                "reason": d.reason,
                "detail": d.detail,
                "deliveries": d.deliveries,
                "cancels": d.cancels,
                "key": bytes_json(d.key),
                "payload": bytes_json(d.payload),
                "headers": [[k, bytes_json(v)] for k, v in d.headers],
                "message_timestamp_ms": d.message_timestamp_ms,
                "dead_lettered_at_ms": d.dead_lettered_at_ms,
                "redriven": d.redriven,
            }
            print(json.dumps(record, ensure_ascii=False), flush=True)
        return EXIT_OK
    if not letters:
        print(f"no dead letters for queue {args.queue}")
        return EXIT_OK
    width = max(len("LETTER"), *(len(d.bookmark) for d in letters))
    owidth = max(len("ORIGINAL"), *(len(d.original) for d in letters))
    print(f"{'LETTER':<{width}}  {'REASON':<15}  DELIV  CANCL  {'ORIGINAL':<{owidth}}  PAYLOAD")
    for d in letters:
        reason = d.reason + (" (redriven)" if d.redriven else "")
        payload = _shown(d.payload, 50) + (f"  [{d.detail}]" if d.detail else "")
        print(
            f"{d.bookmark:<{width}}  {reason:<15}  {d.deliveries:>5}  {d.cancels:>5}"
            f"  {d.original:<{owidth}}  {payload}"
        )
    return EXIT_OK


def cmd_ack_where(args: argparse.Namespace) -> int:
    with _client(args) as client:
        result = client.ack_where(args.queue, args.filter, expire=args.expire)
    verb = "expired" if args.expire else "acked"
    print(f"{verb} {result.acked}, skipped {result.skipped}", flush=True)
    return EXIT_OK


def cmd_redrive(args: argparse.Namespace) -> int:
    with _client(args) as client:
        result = client.redrive(args.queue, args.filter, args.limit)
    print(
        f"moved {result.moved}, already redriven {result.already}, unmatched {result.unmatched}",
        flush=True,
    )
    return EXIT_OK


def cmd_reload(args: argparse.Namespace) -> int:
    with _client(args) as client:
        result = client.reload()
    for line in result.lines():
        print(line, flush=True)
    return EXIT_OK if result.applied else EXIT_REFUSED


def _options(pairs: Sequence[str]) -> dict[str, object]:
    """``--option key=value`` as TOML values (a value that is not TOML is a string)."""
    from layer.toml_values import parse_literal

    out: dict[str, object] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise InvalidRequest(f"--option {pair!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = parse_literal(value)
        except ValueError:
            out[key.strip()] = value
    return out


def cmd_queue(args: argparse.Namespace) -> int:
    import tomllib

    action = args.queue_command
    if action == "create":
        options: dict[str, object] = {}
        if args.from_file:
            try:
                data = tomllib.loads(Path(args.from_file).read_text(encoding="utf-8"))
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise ConfigError(f"{args.from_file}: {exc}") from None
            tables = data.get("queue", [data])
            if not isinstance(tables, list) or len(tables) != 1:
                raise ConfigError(f"{args.from_file}: expected one [[queue]] table")
            options = dict(tables[0])
        if args.name:
            options["name"] = args.name
        if args.underlying_topic:
            options["underlying_topic"] = args.underlying_topic
        options.update(_options(args.option))
        with _client(args) as client:
            info = client.create_queue(options)
        print(f"created queue {info.name!r}", flush=True)
    elif action == "alter":
        with _client(args) as client:
            info = client.alter_queue(args.name, _options(args.option))
        print(f"altered queue {info.name!r}", flush=True)
    elif action == "delete":
        with _client(args) as client:
            client.delete_queue(args.name, force=args.force)
        print(f"deleted queue {args.name!r}", flush=True)
    else:
        with _client(args) as client:
            found = client.queue_definitions()
        for d in found:
            if args.json:
                print(
                    json.dumps(
                        {
                            "name": d.name,
                            "options": d.options,
                            "origin": d.origin,
                            "changed_by": d.changed_by,
                            "changed_at_ms": d.changed_at_ms,
                            "temporary": d.temporary,
                        }
                    )
                )
            else:
                opts = " ".join(f"{k}={v}" for k, v in d.options.items() if k != "name")
                kind = ", temporary" if d.temporary else ""
                print(f"{d.name}  {opts}  ({d.origin}{kind})")
        sys.stdout.flush()
    return EXIT_OK


def cmd_token(args: argparse.Namespace) -> int:
    from layer.api.access import token_hash
    from layer.api.tokens import new_token, principal_table

    rights = tuple(r.strip() for r in args.rights.split(",") if r.strip())
    token = new_token()
    table = principal_table(args.name, token, args.queues, rights)  # ConfigError: bad name/right
    if args.json:
        record = {
            "name": args.name,
            "token": token,
            "token_sha256": token_hash(token),
            "table": table,
        }
        print(json.dumps(record), flush=True)
        return EXIT_OK
    print(f"Token for principal {args.name!r} (shown once; the tokens file keeps only its hash):")
    print(f"  {token}")
    print()
    print("Add this to the tokens file, then run `qlayer reload` or send the coordinator SIGHUP:")
    print()
    print(table, end="", flush=True)
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from layer.demo import run_demo

    return run_demo(messages=args.messages)


COMMANDS = {
    "broker": cmd_broker,
    "coordinator": cmd_coordinator,
    "publish": cmd_publish,
    "consume": cmd_consume,
    "stats": cmd_stats,
    "cluster": cmd_cluster,
    "browse": cmd_browse,
    "ack-where": cmd_ack_where,
    "redrive": cmd_redrive,
    "dead-letters": cmd_dead_letters,
    "replay": cmd_replay,
    "reload": cmd_reload,
    "queue": cmd_queue,
    "token": cmd_token,
    "demo": cmd_demo,
}

if __name__ == "__main__":
    raise SystemExit(main())
