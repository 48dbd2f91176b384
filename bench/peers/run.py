"""Run the queue workload of bench/queue_bench.py on peer brokers on this machine.

For each peer (RabbitMQ quorum queue, NATS JetStream work-queue stream, Redis Streams consumer
group), at-least-once with explicit acks and 4 consumer processes:
- throughput publish -> deliver -> ack of N messages of 200 B and 1 KiB, published as fast as the
  peer confirms them; plus the publish rate during that run and with nobody consuming;
- publish-to-delivery latency percentiles at fixed offered loads (1,000 and 10,000 msg/s, 200 B);
  a load the peer cannot keep up with is reported with the rate it achieved.

Each measurement uses a fresh, uniquely named queue/stream/group, deleted afterwards. Results go to
bench/results/peers-YYYYMMDD-HHMMSS.json (or --out) and a Markdown table on stdout.

Every selected peer must be up: a peer that cannot be reached fails the run (exit 3) with the
command that starts it. Exit codes: 0 done, 1 a measurement failed, 2 bad usage, 3 a peer is down.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from bench.peers.common import CONSUMERS, PeerUnavailable

log = logging.getLogger("bench.peers")

ROOT = Path(__file__).resolve().parents[2]
PEERS = {
    "rabbitmq": ("bench.peers.rabbitmq", "RabbitMQ quorum queue"),
    "nats": ("bench.peers.nats_js", "NATS JetStream work queue"),
    "redis": ("bench.peers.redis_streams", "Redis Streams group"),
}
SIZES = (200, 1024)
RATES = (1000.0, 10000.0)
LATENCY_SIZE = 200


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.peers.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick", action="store_true", help="5,000 messages and 5 s latency points (under ~2 min)"
    )
    p.add_argument(
        "--peers",
        default=",".join(PEERS),
        help=f"comma-separated, from {', '.join(PEERS)} (default: all)",
    )
    p.add_argument("--out", help="JSON result file (default bench/results/peers-<time>.json)")
    p.add_argument("--messages", type=int, help="messages per throughput run (default 100,000)")
    p.add_argument("--seconds", type=float, help="length of each latency point (default 20)")
    p.add_argument("--prefetch", type=int, default=100, help="RabbitMQ basic_qos prefetch")
    p.add_argument("--max-ack-pending", type=int, default=1000, help="NATS consumer MaxAckPending")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    args = p.parse_args(argv)
    args.peers = [s.strip() for s in args.peers.split(",") if s.strip()]
    unknown = [s for s in args.peers if s not in PEERS]
    if unknown or not args.peers:
        p.error(
            f"--peers: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(PEERS)}"
        )
    if args.messages is None:
        args.messages = 5_000 if args.quick else 100_000
    if args.seconds is None:
        args.seconds = 5.0 if args.quick else 20.0
    return args


def peer_options(name: str, args: argparse.Namespace) -> dict[str, Any]:
    if name == "rabbitmq":
        return {"prefetch": args.prefetch}
    if name == "nats":
        return {"max_ack_pending": args.max_ack_pending}
    return {}


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        # the box may be shared: the load before the run says how much it was
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def bench_peer(name: str, args: argparse.Namespace) -> dict[str, Any]:
    mod = importlib.import_module(PEERS[name][0])
    opts = peer_options(name, args)
    out: dict[str, Any] = {"throughput": [], "latency": []}
    for size in SIZES:
        log.info("%s: throughput, %d messages of %d B", name, args.messages, size)
        t = mod.run_throughput(args.messages, size, CONSUMERS, **opts)
        log.info(
            "%s %d B: %d msg/s end to end, publish %d msg/s (%d alone), p50 %s ms",
            name, size, t["throughput_msg_s"], t["publish_msg_s"], t["publish_only_msg_s"],
            t["latency_saturated"].get("p50_ms"),
        )  # fmt: skip
        out["throughput"].append(t)
    for rate in RATES:
        log.info("%s: latency at %.0f msg/s for %.0f s", name, rate, args.seconds)
        lat = mod.run_latency(rate, args.seconds, LATENCY_SIZE, CONSUMERS, **opts)
        log.info(
            "%s at %.0f/s (achieved %d/s): p50 %s ms, p99 %s ms%s",
            name, rate, lat["achieved_rate"], lat["latency"].get("p50_ms"),
            lat["latency"].get("p99_ms"), "" if lat["sustained"] else " - NOT SUSTAINED",
        )  # fmt: skip
        out["latency"].append(lat)
    out["settings"] = out["throughput"][0]["settings"]
    return out


def markdown(results: dict[str, Any]) -> str:
    names = list(results["peers"])
    peers = [results["peers"][n] for n in names]
    rows = [
        "| measure | " + " | ".join(PEERS[n][1] for n in names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]

    def row(label: str, cells: list[str]) -> None:
        rows.append(f"| {label} | " + " | ".join(cells) + " |")

    for i, size in enumerate(SIZES):
        t0 = peers[0]["throughput"][i]
        row(
            f"throughput {size} B, {t0['consumers']} consumers, publish -> ack (msg/s)",
            [f"{p['throughput'][i]['throughput_msg_s']:,}" for p in peers],
        )
        row(
            f"publish {size} B, during the run / alone (msg/s)",
            [
                f"{p['throughput'][i]['publish_msg_s']:,} / {p['throughput'][i]['publish_only_msg_s']:,}"
                for p in peers
            ],
        )
    notes: list[str] = []
    for i, rate in enumerate(RATES):
        cells = []
        for n, p in zip(names, peers, strict=True):
            lat = p["latency"][i]
            q = lat["latency"]
            cell = f"{q.get('p50_ms')} / {q.get('p99_ms')} / {q.get('p999_ms')} / {q.get('max_ms')}"
            if not lat["sustained"]:
                cell += f" (achieved {lat['achieved_rate']:,}/s)*"
                notes.append(f"\\* {PEERS[n][1]} at {rate:,.0f} msg/s: {lat['note']}")
            cells.append(cell)
        row(f"latency at {rate:,.0f} msg/s, {LATENCY_SIZE} B, p50 / p99 / p99.9 / max (ms)", cells)
    row("server", [p["settings"]["server"] for p in peers])
    row("client", [p["settings"]["client"] for p in peers])
    return "\n".join(rows + ([""] + notes if notes else []))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format="[peers] %(message)s",
        stream=sys.stderr,
    )
    if not args.debug:
        # the clients log each failed connect with a traceback; our one-line error says it
        for noisy in ("pika", "nats", "redis"):
            logging.getLogger(noisy).setLevel(logging.CRITICAL)
    try:
        # every peer is checked before any is measured: a down service fails the run at once
        for name in args.peers:
            importlib.import_module(PEERS[name][0]).check_available()
        results: dict[str, Any] = {
            "benchmark": "peers-queue",
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "quick": args.quick,
            "machine": machine(),
            "workload": {
                "semantics": "at-least-once, explicit acks",
                "consumers": CONSUMERS,
                "messages": args.messages,
                "sizes": list(SIZES),
                "latency_rates": list(RATES),
                "latency_seconds": args.seconds,
                "latency_size": LATENCY_SIZE,
            },
            "peers": {},
        }
        for name in args.peers:
            results["peers"][name] = bench_peer(name, args)
    except PeerUnavailable as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except Exception as exc:
        if args.debug:
            raise
        print(
            f"error: benchmark failed: {type(exc).__name__}: {exc} (--debug for the traceback)",
            file=sys.stderr,
        )
        return 1
    out = (
        Path(args.out)
        if args.out
        else (ROOT / "bench" / "results" / f"peers-{time.strftime('%Y%m%d-%H%M%S')}.json")
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    log.info("results written to %s", out)
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
