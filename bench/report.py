"""The README table of a benchmark run: every figure, and qlayer's ratio to the best peer and to
the raw-Kafka ceiling.

``python -m bench.report bench/results/queue-....json`` prints the Markdown; with ``--readme
README.md`` it also replaces the text between ``<!-- bench-table:begin -->`` and
``<!-- bench-table:end -->`` (inside the README's Benchmarks section) with it.

A ratio is always qlayer's figure divided by the other's: for throughput above 1 is better, for
latency, memory and restart times below 1 is better. The best peer is the best of RabbitMQ, NATS
JetStream and Redis Streams on that row (highest throughput, lowest latency, memory and restart
time); raw Kafka is not a peer but the ceiling. A latency point a system did not sustain shows the
rate it achieved instead of percentiles, and gives no ratio; nor does a best figure of zero or less
(a server whose memory did not grow with the messages queued).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

BEGIN = "<!-- bench-table:begin -->"
END = "<!-- bench-table:end -->"
PEERS = ("rabbitmq", "nats", "redis")
COLUMNS = ("qlayer", "kafka", "rabbitmq", "nats", "redis")
HEADS = {
    "qlayer": "qlayer",
    "kafka": "raw Kafka (ceiling)",
    "rabbitmq": "RabbitMQ",
    "nats": "NATS JetStream",
    "redis": "Redis Streams",
}
SHORT = {"rabbitmq": "RabbitMQ", "nats": "NATS", "redis": "Redis"}

# a cell: the number to compare (None: none), and the text to show
Cell = tuple[float | None, str]


def _num(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def _tp_cells(results: dict[str, Any], i: int) -> dict[str, Cell]:
    cells: dict[str, Cell] = {}
    for s, runs in results.get("throughput", {}).items():
        r = runs[i] if i < len(runs) else {}
        if "msgs_per_s" in r:
            cells[s] = (float(r["msgs_per_s"]), _num(r["msgs_per_s"]))
        else:
            cells[s] = (None, "failed" if "error" in r else "skipped")
    return cells


def _lat_cells(results: dict[str, Any], i: int, key: str) -> dict[str, Cell]:
    cells: dict[str, Cell] = {}
    for s, runs in results.get("latency", {}).items():
        r = runs[i] if i < len(runs) else {}
        if "sustained" not in r:
            cells[s] = (None, "failed" if "error" in r else "skipped")
        elif not r["sustained"]:
            cells[s] = (None, f"not sustained ({_num(r['delivered_msgs_per_s'])}/s)")
        else:
            v = r["latency"][key]
            cells[s] = (float(v), _num(v, 1 if v >= 10 else 2))
    return cells


def _ratio(a: float | None, b: float | None) -> str:
    # nothing to divide by: e.g. a server whose RSS did not grow with the messages queued
    if a is None or b is None or b <= 0:
        return "–"
    return f"{a / b:.2f}"


def _row(label: str, cells: dict[str, Cell], higher_better: bool, columns: list[str]) -> str:
    peers = [(s, cells[s][0]) for s in PEERS if s in cells and cells[s][0] is not None]
    best = None
    if peers:
        pick = max if higher_better else min
        best = pick(peers, key=lambda p: p[1])  # type: ignore[arg-type, return-value]
    q = cells.get("qlayer", (None, ""))[0]
    vs_peer = "–"
    if best is not None:
        r = _ratio(q, best[1])
        vs_peer = f"{r} ({SHORT[best[0]]})" if r != "–" else "–"
    vs_ceiling = _ratio(q, cells.get("kafka", (None, ""))[0])
    shown = [cells.get(s, (None, "–"))[1] for s in columns]
    return f"| {label} | " + " | ".join(shown) + f" | {vs_peer} | {vs_ceiling} |"


def _consumer_cpu_rows(results: dict[str, Any], columns: list[str]) -> list[str]:
    """ "consumer CPU per message": the 4 consumer processes' CPU (client library and the
    harness's own, the same for every system) over the messages of each throughput run; none
    for results written before it was measured."""
    sizes = results["workload"]["sizes"]
    cells: dict[str, Cell] = {}
    for s, runs in results.get("throughput", {}).items():
        cpu = [r.get("consumer_cpu_us_per_msg") for r in runs[: len(sizes)]]
        if len(cpu) == len(sizes) and all(c is not None for c in cpu):
            # compared on the first size; every size shown
            cells[s] = (float(cpu[0]), " / ".join(f"{c:.0f}" for c in cpu))  # type: ignore[arg-type]
    if not cells:
        return []
    label = (
        "consumer CPU per message in those runs, "
        + " / ".join(f"{size:,} B" for size in sizes)
        + " (µs, all consumer processes)"
    )
    return [_row(label, cells, False, columns)]


def _memory_rows(results: dict[str, Any], columns: list[str]) -> list[str]:
    """RSS (and the peers' disk) per queued message, ingest, and the restarts with them queued.

    A peer restarts one way (SIGKILLed, started on its store): its figures stand in both of
    qlayer's restart rows. Redis, in memory only, loses the queue: no figure to compare.
    """
    runs = dict(results.get("memory_restart_peers") or {})
    if results.get("memory_restart"):
        runs["qlayer"] = results["memory_restart"]
    if not runs:
        return []
    done = [r for r in runs.values() if "queued" in r]
    if not done:
        failed = any("error" in r for r in runs.values())
        return [f"| memory and restart | {'failed' if failed else 'skipped'} |"]
    q, size = done[0]["queued"], done[0]["message_bytes"]

    def cells(cell: Callable[[str, dict[str, Any]], Cell]) -> dict[str, Cell]:
        return {
            s: cell(s, r) if "queued" in r else (None, "failed" if "error" in r else "skipped")
            for s, r in runs.items()
        }

    def figure(key: str) -> Callable[[str, dict[str, Any]], Cell]:
        return lambda _s, r: (float(r[key]), _num(r[key])) if key in r else (None, "–")

    def restart(mode: str) -> Callable[[str, dict[str, Any]], Cell]:
        def cell(s: str, r: dict[str, Any]) -> Cell:
            if "restart_error" in r:
                return (None, "failed")
            if r.get("lost_on_restart"):
                return (None, "lost on restart")
            k = f"restart_{mode}" if s == "qlayer" else "restart"
            serving, full = r[f"{k}_serving_s"], r[f"{k}_all_available_s"]
            return (float(serving), f"{serving} / {full}")

        return cell

    rows = [
        _row(
            f"coordinator / server RSS per queued message, {q:,} queued (bytes)",
            cells(figure("bytes_per_queued_message")),
            False,
            columns,
        )
    ]
    if any("disk_bytes_per_queued_message" in r for r in done):
        rows.append(
            _row(
                f"server data dir growth per queued message, {q:,} queued (bytes)",
                cells(figure("disk_bytes_per_queued_message")),
                False,
                columns,
            )
        )
    rows.append(
        _row(
            f"ingest into the queue, {size} B, no consumers (msg/s)",
            cells(figure("ingest_msgs_per_s")),
            True,
            columns,
        )
    )
    for mode, name in (
        ("state_intact", "state dir intact"),
        ("from_changelog", "rebuilt from the changelog"),
    ):
        rows.append(
            _row(
                f"restart with {q:,} queued, {name}: serving / all available (s)",
                cells(restart(mode)),
                False,
                columns,
            )
        )
    return rows


def markdown(results: dict[str, Any], source: Path | str | None = None) -> str:
    columns = [c for c in COLUMNS if c in results.get("settings", {})]
    head = "| measure | " + " | ".join(HEADS[c] for c in columns)
    rows = [
        head + " | qlayer ÷ best peer | qlayer ÷ ceiling |",
        "|---|" + "---:|" * (len(columns) + 2),
    ]
    w = results["workload"]
    for i, size in enumerate(w["sizes"] if results.get("throughput") else ()):
        label = f"throughput, {size:,} B JSON, publish → deliver → ack (msg/s)"
        rows.append(_row(label, _tp_cells(results, i), True, columns))
    cpu = [
        r.get("coordinator_cpu_us_per_msg") for r in results.get("throughput", {}).get("qlayer", [])
    ]
    if cpu and all(c is not None for c in cpu):
        rows.append(
            _row(
                "coordinator CPU per message in those runs, "
                + " / ".join(f"{size:,} B" for size in w["sizes"])
                + " (µs)",
                {"qlayer": (None, " / ".join(f"{c:.0f}" for c in cpu))},
                False,
                columns,
            )
        )
    rows += _consumer_cpu_rows(results, columns)
    for i, rate in enumerate(w["latency_rates"] if results.get("latency") else ()):
        for key, name in (("p50_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p99.9")):
            label = f"latency at {rate:,.0f} msg/s offered, {name} (ms)"
            rows.append(_row(label, _lat_cells(results, i, key), False, columns))
    rows += _memory_rows(results, columns)
    notes = []
    for s, runs in results.get("latency", {}).items():
        for r in runs:
            if r.get("note"):
                notes.append(f"- {HEADS[s]}: {r['note']}.")
    notes += stage_notes(results)
    notes += round_notes(results)
    notes += thread_notes(results)
    notes += repeat_notes(results)
    peers = results.get("memory_restart_peers") or {}
    if any("queued" in r for r in peers.values()):
        notes.append(
            "- Restarts: qlayer's coordinator and each peer's server are SIGKILLed and started "
            "again. Serving is qlayer's \"serving\" line, a peer's first delivery to a consumer; "
            "a peer restarts one way, from its own store, so its figures stand in both rows."
        )
    for s, r in peers.items():
        if r.get("bytes_per_queued_message", 1) <= 0:
            notes.append(
                f"- {HEADS[s]}: RSS did not grow with {r['queued']:,} queued "
                f"({r['rss_base_mib']} → {r['rss_queued_mib']} MiB), so no ratio on the RSS row."
            )
        elif 0 < r.get("bytes_per_queued_message", 0) < r.get("disk_bytes_per_queued_message", 0):
            notes.append(
                f"- {HEADS[s]}: keeps its queued messages on disk, not in memory:"
                f" {r['bytes_per_queued_message']:,} B of RSS and"
                f" {r['disk_bytes_per_queued_message']:,} B on disk per queued message."
            )
        if "restart_error" in r:
            notes.append(f"- {HEADS[s]}: restart failed: {r['restart_error']}.")
        elif r.get("lost_on_restart"):
            notes.append(
                f"- {HEADS[s]}: {results['settings'][s]['durability']}; "
                f"{r['messages_after_restart']:,} of {r['queued']:,} queued messages were left "
                "after its restart."
            )
    p = results.get("profile") or {}
    if "throughput_while_sampled" in p:
        notes.append(
            f"- qlayer under py-spy ({p['samples']:,} samples): "
            f"{_num(p['throughput_while_sampled']['msgs_per_s'])} msg/s at 200 B."
        )
    out = "\n".join(rows)
    if notes:
        out += "\n\n" + "\n".join(notes)
    return out + "\n\n" + context(results, source)


STAGE_NAMES = {
    "fetch": "fetch",
    "round_wait": "wait for the round",
    "lease": "to its lease (fetch + wait for the round + wait for a consumer's room)",
    "decide": "decide",
    "commit": "commit",
    "push": "push",
    "wire_and_client": "wire + client (p50)",
    "ack": "ack to confirmed",
}


def stage_notes(results: dict[str, Any]) -> list[str]:
    """qlayer's latency by stage at each rate (p50 / p99 ms of each stage on its own; the
    coordinator's ``layer.coordinator.stages``), so the next cut is visible."""
    rates = results["workload"]["latency_rates"]
    notes = []
    for rate, r in zip(rates, results.get("latency", {}).get("qlayer", []), strict=False):
        stages = r.get("stages") or {}
        parts = [
            f"{label} "
            + " / ".join(str(stages[k][q]) for q in ("p50_ms", "p99_ms") if q in stages[k])
            for k, label in STAGE_NAMES.items()
            if k in stages
        ]
        if parts:
            notes.append(
                f"- qlayer's stages at {rate:,.0f} msg/s, p50 / p99 ms each: "
                + "; ".join(parts)
                + "."
            )
    return notes


def round_notes(results: dict[str, Any]) -> list[str]:
    """qlayer's coordinator per round in the throughput runs: messages, CPU and thread
    wake-ups a round, with what a wake-up costs on the machine, so a round's fixed cost shows
    beside the per-message one."""
    runs = results.get("throughput", {}).get("qlayer", [])
    rounds = [r.get("coordinator_per_round") or {} for r in runs]
    if not rounds or not all("cpu_ms" in r for r in rounds):
        return []
    sizes = " / ".join(f"{r['message_bytes']:,} B" for r in runs)

    def each(key: str, fmt: str) -> str:
        return " / ".join(format(r[key], fmt) if key in r else "?" for r in rounds)

    line = (
        f"- qlayer's coordinator per round in the throughput runs ({sizes}): "
        f"{each('messages', ',.0f')} messages, {each('cpu_ms', '.1f')} ms of CPU"
    )
    if all("wakeups" in r for r in rounds):
        line += f", {each('wakeups', '.0f')} thread wake-ups"
    handoff = results.get("machine", {}).get("thread_handoff_cpu_us")
    if handoff is not None:
        line += f" (a hand-off between two threads costs {handoff} µs of CPU on this machine)"
    return [line + "."]


_THREAD_LABELS = {
    "main": "the event loop",
    "python": "the other Python threads",
    "librdkafka": "librdkafka's",
    "grpc": "gRPC's",
    "rocksdb": "RocksDB's",
    "other": "the others",
}


def thread_notes(results: dict[str, Any]) -> list[str]:
    """qlayer's coordinator split by its threads in the throughput runs
    (``bench.harness.thread_split``): where its CPU a message goes, and which threads a round
    wakes, so the next cut can be aimed."""
    runs = results.get("throughput", {}).get("qlayer", [])
    splits = [r.get("coordinator_threads") or {} for r in runs]
    if not splits or not all(splits):
        return []
    sizes = " / ".join(f"{r['message_bytes']:,} B" for r in runs)
    parts = []
    for group, label in _THREAD_LABELS.items():
        if not any(group in split for split in splits):
            continue
        each = [split.get(group, {}) for split in splits]

        def col(key: str, fmt: str, each: list[dict[str, float]] = each) -> str:
            return " / ".join(format(e[key], fmt) if key in e else "?" for e in each)

        parts.append(
            f"{label} {col('cpu_us_per_msg', '.1f')} µs ({col('cpu_share', '.0f')}%), "
            f"{col('wakeups_per_round', '.0f')} wake-ups"
        )
    return [
        f"- qlayer's coordinator by its threads in the throughput runs ({sizes}), CPU a "
        f"message (share) and wake-ups a round: {'; '.join(parts)}."
    ]


def repeat_notes(results: dict[str, Any]) -> list[str]:
    """Every throughput run behind the table's median ones (``bench.run --repeat``), per system
    and size in the order they were taken, with qlayer's coordinator CPU a message: how far one
    run of the shared machine could move a figure. None for a run of one each."""
    lines = []
    for s in COLUMNS:
        runs = results.get("throughput", {}).get(s, [])
        if not any("repeats" in r for r in runs):
            continue

        def each(key: str, fmt: str, runs: list[dict[str, Any]] = runs) -> str:
            return "; ".join(
                " / ".join(format(x[key], fmt) if key in x else "–" for x in r.get("repeats", [r]))
                for r in runs
            )

        line = f"  - {HEADS[s]}: {each('msgs_per_s', ',.0f')} msg/s"
        if any("coordinator_cpu_us_per_msg" in x for r in runs for x in r.get("repeats", [])):
            line += f" (coordinator {each('coordinator_cpu_us_per_msg', '.1f')} µs a message)"
        lines.append(line)
    if not lines:
        return []
    w = results["workload"]  # a run with repeats says how many (bench.run)
    count, sizes = w["throughput_repeats"], "; ".join(f"{size:,} B" for size in w["sizes"])
    head = (
        f"- Throughput: the rows above show the median of {count} runs of each system and size"
        f" (the CPU rows: that run's), taken in turn across the systems; every run ({sizes}):"
    )
    return [head, *lines]


def context(results: dict[str, Any], source: Path | str | None = None) -> str:
    """Machine, versions and settings of a run, as a short list."""
    mc, v, w = results["machine"], results["versions"], results["workload"]
    st = results["settings"]
    mins = results.get("duration_s", 0) / 60
    lines = [
        f"Run `{results['name']}`"
        + (f" (`{source}`)" if source else "")
        + f", {results['started'][:16].replace('T', ' ')}, {mins:.0f} min"
        + (", quick" if results.get("quick") else "")
        + f", git {results.get('git', {}).get('head', '?')}"
        + (" with uncommitted changes" if results.get("git", {}).get("uncommitted") else "")
        + ".",
        f"- Machine: {mc['cpus']} cores ({mc.get('cpu') or 'cpu ?'}), {mc['memory_gib']} GiB, "
        f"{mc['platform']}; load average (1/5/15 min) {'/'.join(map(str, mc['loadavg_before']))} "
        f"before, {'/'.join(map(str, mc.get('loadavg_after', [])))} after (shared machine).",
        f"- Versions: Python {v['python']}, confluent-kafka {v['confluent-kafka']}, "
        f"grpcio {v['grpcio']}, rocksdict {v['rocksdict']}, pika {v['pika']}, "
        f"nats-py {v['nats-py']}, redis-py {v['redis']}.",
    ]
    servers = (
        [st["kafka" if "kafka" in st else "qlayer"]["broker"]]
        if ("kafka" in st or "qlayer" in st)
        else []
    )
    servers += [st[s]["server"] for s in PEERS if s in st]
    lines.append("- Servers: " + "; ".join(servers) + ".")
    lines.append(
        f"- Workload: {w['semantics']}; {w['consumers']} consumer processes, "
        f"{w['consumer_window']} unacked messages per consumer "
        "(qlayer max_backlog, RabbitMQ prefetch, Redis XREADGROUP COUNT, NATS MaxAckPending "
        f"{w['consumer_window'] * w['consumers']} for the group); "
        f"{w['throughput_messages']:,} messages per throughput run"
        + (
            f" ({w['throughput_repeats']} of each system and size, the median shown)"
            if w.get("throughput_repeats", 1) > 1
            else ""
        )
        + "; latency points of "
        f"{w['latency_seconds']:.0f} s with {w['latency_message_bytes']} B messages."
    )
    for s in ("rabbitmq", "nats", "redis"):
        if s in st:
            d = st[s]
            lines.append(f"- {HEADS[s]}: {d['queue']}; {d['durability']}; ack: {d['ack']}.")
    if "qlayer" in st:
        lines.append(f"- qlayer: {st['qlayer']['queue']}; {st['qlayer']['consumer']}.")
    return "\n".join(lines)


def mean_load(results: dict[str, Any]) -> float:
    loads = [
        x
        for group in ("throughput", "latency")
        for runs in results.get(group, {}).values()
        for r in runs
        for x in (r.get("loadavg_before", [None])[0], r.get("loadavg_after", [None])[0])
        if x is not None
    ]
    return sum(loads) / len(loads) if loads else float("nan")


def spread(runs: list[tuple[str, dict[str, Any]]]) -> str:
    """Headline figures of several runs side by side: how much a shared machine moves them."""

    def tp(r: dict[str, Any], s: str, i: int) -> str:
        rs = r.get("throughput", {}).get(s, [])
        return _num(rs[i]["msgs_per_s"]) if i < len(rs) and "msgs_per_s" in rs[i] else "–"

    def p50(r: dict[str, Any], s: str, i: int) -> str:
        rs = r.get("latency", {}).get(s, [])
        if i >= len(rs) or "sustained" not in rs[i]:
            return "–"
        if not rs[i]["sustained"]:
            return f"n.s. ({_num(rs[i]['delivered_msgs_per_s'])}/s)"
        return _num(rs[i]["latency"]["p50_ms"], 1)

    order = " / ".join(("qlayer", "Kafka", *(SHORT[s] for s in PEERS)))
    rows = [
        f"| run | mean load | msg/s at 200 B: {order} | msg/s at 1 KiB | p50 at 1,000 msg/s (ms) |",
        "|---|---:|---|---|---|",
    ]
    for name, r in runs:
        rows.append(
            f"| `{name}` | {mean_load(r):.1f} | "
            + " | ".join(
                [
                    " / ".join(tp(r, s, 0) for s in COLUMNS),
                    " / ".join(tp(r, s, 1) for s in COLUMNS),
                    " / ".join(p50(r, s, 0) for s in COLUMNS),
                ]
            )
            + " |"
        )
    return "\n".join(rows)


def update_readme(readme: Path, text: str) -> None:
    body = readme.read_text()
    start, end = body.find(BEGIN), body.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{readme}: no {BEGIN} ... {END} block to replace")
    readme.write_text(body[: start + len(BEGIN)] + "\n" + text + "\n" + body[end:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("results", type=Path, help="a bench/results/queue-*.json file")
    p.add_argument("--readme", type=Path, help="replace the table block in this README")
    p.add_argument(
        "--also", type=Path, nargs="*", default=[], help="other runs: a table of their headlines"
    )
    args = p.parse_args(argv)
    results = json.loads(args.results.read_text())
    text = markdown(results, source=args.results)
    if args.also:
        runs = [(args.results.stem, results)]
        runs += [(f.stem, json.loads(f.read_text())) for f in args.also]
        text += (
            "\n\nThe headline figures of every full run of the day (the one above first), "
            "with the mean 1-minute load average over its measurements:\n\n" + spread(runs)
        )
    print(text)
    if args.readme:
        update_readme(args.readme, text)
        print(f"updated {args.readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
