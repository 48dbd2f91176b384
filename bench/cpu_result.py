"""The results file of a CPU-per-message bench (``bench.admit_cpu``, ``ingest_cpu``,
``changelog_cpu``, ``round_cpu``, ``engine_cpu``, ``wire_cpu``, ``payload_cpu``): one head
(what, which build, when, settings, load) and one place and name in ``bench/results/``."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

RESULTS = Path(__file__).resolve().parent / "results"


def head(benchmark: str, args: argparse.Namespace, settings: Sequence[str]) -> dict[str, Any]:
    """The fields every result starts with; ``settings``: the arguments that shape the run."""
    return {
        "benchmark": benchmark,
        "label": args.label,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "git": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "settings": {k: getattr(args, k) for k in settings},
        "loadavg": list(psutil.getloadavg()),
    }


def write(result: dict[str, Any], stamp: str | None = None) -> Path:
    """``result`` as ``bench/results/<benchmark>-<label or run>-<stamp>.json``."""
    RESULTS.mkdir(exist_ok=True)
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    out = RESULTS / f"{result['benchmark']}-{result['label'] or 'run'}-{stamp}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    return out


def repeat(
    benchmark: str,
    args: argparse.Namespace,
    settings: Sequence[str],
    one_run: Callable[[], dict[str, Any]],
) -> Path:
    """``one_run`` ``args.runs`` times (each returns ``us_per_msg`` among its figures), each
    printed; the result (best and median) written and its file named."""
    runs = []
    for i in range(args.runs):
        run = one_run()
        runs.append(run)
        print(f"run {i + 1}/{args.runs}: {json.dumps(run)}", flush=True)
    figures = [r["us_per_msg"] for r in runs]
    result = {
        **head(benchmark, args, settings),
        "best_us_per_msg": min(figures),
        "median_us_per_msg": statistics.median(figures),
        "runs": runs,
    }
    out = write(result)
    print(f"best {min(figures)} µs, median {statistics.median(figures)} µs\nwritten: {out}")
    return out
