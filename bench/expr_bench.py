"""The expression benchmark: nanoseconds per evaluation of typical filters, priorities and keys.

Each case compiles one expression and calls the method a queue would call on a small decoded
JSON order (``matches`` for filters, ``priority`` for priorities, ``key`` for message groups) in
loops of 100,000, timed with ``time.perf_counter_ns``; the figure is the median over the repeats.
The time of an empty call of the same shape is reported beside it, as the floor. Compile time per
expression is measured too (it is paid once per queue or subscription, not per message).

Results go to bench/results/expr-<time>.json and a Markdown table on stdout.

Run: ``python -m bench.expr_bench [--quick]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lark
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from layer.expr import compile_expression  # noqa: E402

# The filter the design target is stated for: under ~1.5 us per matches() call.
TARGET_EXPRESSION = "/symbol = 'IBM' AND /qty > 100"
TARGET_NS = 1500

DOCUMENT: dict[str, Any] = {
    "id": 7,
    "symbol": "IBM",
    "qty": 150,
    "price": 10.5,
    "side": "buy",
    "order": {"customer": {"region": "EMEA", "tier": 2}, "desk": "rates"},
    "legs": [{"px": 1.25}, {"px": 2.5}],
}

# name, expression, method, expected result (checked, so a broken fast path cannot look fast)
CASES: list[tuple[str, str, str, object]] = [
    ("string equality", "/symbol = 'IBM'", "matches", True),
    ("target: string = AND number >", TARGET_EXPRESSION, "matches", True),
    ("numeric range AND", "/qty >= 100 AND /qty < 500", "matches", True),
    ("numeric BETWEEN", "/qty BETWEEN 100 AND 500", "matches", True),
    (
        "IN list of 10",
        "/symbol IN ('AAPL', 'MSFT', 'GOOG', 'AMZN', 'META', 'TSLA', 'NVDA', 'ORCL', 'SAP', 'IBM')",
        "matches",
        True,
    ),
    ("LIKE regex", "/symbol LIKE '^I.M$'", "matches", True),
    ("nested path", "/order/customer/region = 'EMEA'", "matches", True),
    ("array index path", "/legs[1]/px > 2", "matches", True),
    ("arithmetic priority", "/price * /qty", "priority", 1575),
    ("COALESCE/UPPER filter", "UPPER(COALESCE(/desk, /symbol)) = 'IBM'", "matches", True),
    ("COALESCE/UPPER group key", "COALESCE(/group, UPPER(/side))", "key", "BUY"),
    ("missing field (NULL)", "/absent = 'x' OR /absent > 1", "matches", False),
]


def say(text: str) -> None:
    print(f"[bench] {text}", flush=True)


def time_calls(call: Callable[[Any], object], loops: int, repeats: int) -> list[float]:
    """ns per call of ``call(DOCUMENT)``, once per repeat."""
    runs = []
    doc = DOCUMENT
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in itertools.repeat(None, loops):
            call(doc)
        runs.append((time.perf_counter_ns() - start) / loops)
    return runs


def bench_case(
    name: str, text: str, method: str, expected: object, loops: int, repeats: int
) -> dict[str, Any]:
    expression = compile_expression(text)
    call = getattr(expression, method)
    result = call(DOCUMENT)
    if result != expected:
        raise AssertionError(f"{name}: {text} gave {result!r}, expected {expected!r}")
    runs = time_calls(call, loops, repeats)
    return {
        "name": name,
        "expression": text,
        "method": method,
        "result": result,
        "ns_per_eval_median": round(statistics.median(runs), 1),
        "ns_per_eval_min": round(min(runs), 1),
        "runs_ns": [round(r, 1) for r in runs],
    }


def bench_compile(text: str, count: int) -> dict[str, Any]:
    compile_expression(text)  # the grammar's tables are built on first use: not ours to count
    times = []
    for _ in range(count):
        start = time.perf_counter_ns()
        compile_expression(text)
        times.append((time.perf_counter_ns() - start) / 1000.0)
    return {"expression": text, "us_per_compile_median": round(statistics.median(times), 1)}


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="fewer repeats, for a smoke run")
    p.add_argument("--loops", type=int, default=100_000, help="calls per timed loop")
    p.add_argument("--repeats", type=int, default=7, help="timed loops per case (median taken)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args()
    if args.quick:
        args.loops, args.repeats = 20_000, 3
    results: dict[str, Any] = {
        "benchmark": "expr",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            # other work on the machine inflates the figures; this says how much there was
            "load_average_1m_at_start": round(os.getloadavg()[0], 2),
        },
        "lark": lark.__version__,
        "settings": {"loops": args.loops, "repeats": args.repeats, "quick": args.quick},
        "document": DOCUMENT,
        "target": {"expression": TARGET_EXPRESSION, "ns_per_eval": TARGET_NS},
    }

    def empty(doc: object) -> bool:
        return True

    results["call_floor_ns"] = round(
        statistics.median(time_calls(empty, args.loops, args.repeats)), 1
    )
    say(f"an empty call costs {results['call_floor_ns']} ns")
    evaluations = []
    for index, (name, text, method, expected) in enumerate(CASES, 1):
        row = bench_case(name, text, method, expected, args.loops, args.repeats)
        evaluations.append(row)
        say(f"[{index}/{len(CASES)}] {name}: {row['ns_per_eval_median']} ns per {method}()")
    results["evaluation"] = evaluations
    target_row = next(r for r in evaluations if r["expression"] == TARGET_EXPRESSION)
    results["target"]["measured_ns"] = target_row["ns_per_eval_median"]
    results["target"]["met"] = target_row["ns_per_eval_median"] <= TARGET_NS
    compile_count = 50 if args.quick else 300
    results["compile"] = [bench_compile(text, compile_count) for _, text, _, _ in CASES]

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"expr-{time.strftime('%Y%m%d-%H%M%S')}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    say(f"results written to {path}")
    print(markdown(results))
    return 0


def markdown(r: dict[str, Any]) -> str:
    compile_us = {c["expression"]: c["us_per_compile_median"] for c in r["compile"]}
    rows = [
        "| case | expression | call | ns per call (median) | compile (us) |",
        "|---|---|---|---|---|",
    ]
    for e in r["evaluation"]:
        rows.append(
            f"| {e['name']} | `{e['expression']}` | {e['method']}() | {e['ns_per_eval_median']:,} | {compile_us[e['expression']]:,} |"
        )
    rows.append(f"| empty call (floor) | | | {r['call_floor_ns']:,} | |")
    t = r["target"]
    verdict = "met" if t["met"] else "NOT met"
    rows.append("")
    rows.append(
        f"Target {t['ns_per_eval']:,} ns for `{t['expression']}`: {t['measured_ns']:,} ns, {verdict}."
    )
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
