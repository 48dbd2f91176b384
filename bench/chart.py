"""A PNG of a benchmark run: throughput per system and size, latency percentiles per load.

``python -m bench.chart bench/results/queue-....json [--out FILE.png]`` (default: beside the
JSON). ``bench.run`` draws it at the end of every run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.report import mean_load

ORDER = ("qlayer", "kafka", "rabbitmq", "nats", "redis")
NAMES = {
    "qlayer": "qlayer",
    "kafka": "raw Kafka\n(ceiling)",
    "rabbitmq": "RabbitMQ\nquorum",
    "nats": "NATS\nJetStream",
    "redis": "Redis\nStreams",
}


def chart(results: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = [s for s in ORDER if s in results.get("settings", {})]
    w = results["workload"]
    fig, axes = plt.subplots(1, 1 + len(w["latency_rates"]), figsize=(16, 5.6))
    x = list(range(len(systems)))

    # throughput: one bar per size per system
    ax = axes[0]
    sizes = w["sizes"]
    width = 0.8 / len(sizes)
    for j, size in enumerate(sizes):
        vals = []
        for s in systems:
            runs = results.get("throughput", {}).get(s, [])
            r = runs[j] if j < len(runs) else {}
            vals.append(r.get("msgs_per_s", 0))
        xs = [i + (j - (len(sizes) - 1) / 2) * width for i in x]
        bars = ax.bar(xs, vals, width, label=f"{size:,} B")
        for b, v in zip(bars, vals, strict=True):
            label = f"{v / 1000:.1f}k" if v else "n/a"
            ax.annotate(
                label,
                (b.get_x() + b.get_width() / 2, v),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 2),
                textcoords="offset points",
            )
    ax.set_xticks(x, [NAMES[s] for s in systems], fontsize=8)
    ax.set_ylabel("messages / s")
    ax.set_title(f"Throughput, publish → deliver → ack\n{w['consumers']} consumers", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)

    # latency: p50 / p99 / p99.9 per system, log scale; an unsustained load says so instead
    keys = (("p50_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p99.9"))
    width = 0.8 / len(keys)
    for k, rate in enumerate(w["latency_rates"]):
        ax = axes[1 + k]
        top, bottom = 1.0, 1.0
        for j, (key, name) in enumerate(keys):
            xs = [i + (j - 1) * width for i in x]
            vals = []
            for s in systems:
                runs = results.get("latency", {}).get(s, [])
                r = runs[k] if k < len(runs) else {}
                vals.append((r.get("latency") or {}).get(key, 0) if r.get("sustained") else 0)
            top = max([top, *vals])
            bottom = min([bottom, *(v for v in vals if v > 0)])
            bars = ax.bar(xs, vals, width, label=name)
            for b, v in zip(bars, vals, strict=True):
                if v:
                    ax.annotate(
                        f"{v:,.0f}" if v >= 100 else f"{v:.3g}",
                        (b.get_x() + b.get_width() / 2, v),
                        ha="center",
                        va="bottom",
                        fontsize=6,
                        xytext=(0, 1),
                        textcoords="offset points",
                    )
        for i, s in enumerate(systems):
            runs = results.get("latency", {}).get(s, [])
            r = runs[k] if k < len(runs) else {}
            if not r.get("sustained"):
                why = (
                    f"not sustained\n{r['delivered_msgs_per_s']:,}/s"
                    if "sustained" in r
                    else "failed"
                    if "error" in r
                    else "skipped"
                )
                ax.text(
                    i,
                    0.05,
                    why,
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    color="firebrick",
                    rotation=90,
                    transform=ax.get_xaxis_transform(),
                )
        ax.set_yscale("log")
        ax.set_ylim(bottom / 2, top * 3)
        ax.set_xticks(x, [NAMES[s] for s in systems], fontsize=8)
        ax.set_ylabel("publish → delivery latency (ms, log)")
        ax.set_title(
            f"Latency at {rate:,.0f} msg/s offered\n{w['latency_message_bytes']} B, "
            f"{w['latency_seconds']:.0f} s",
            fontsize=10,
        )
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3, which="both")

    m = results["machine"]
    fig.suptitle(
        f"{results['name']}: {m['cpus']} cores, {m['memory_gib']} GiB, mean load "
        f"{mean_load(results):.1f} (shared machine), "
        f"Python {results['versions']['python']}, broker {results['settings'].get('kafka', results['settings'].get('qlayer', {})).get('broker', '?').split(',')[0]}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chart", description=__doc__)
    p.add_argument("results", type=Path)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    out = args.out or args.results.with_suffix(".png")
    print(chart(json.loads(args.results.read_text()), out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
