"""The example notebook (``examples/orders_dashboard.py``) runs as a new user would run it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]


def test_the_orders_dashboard_example_runs_and_shows_live_totals() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "orders_dashboard.py"), "--seconds", "12"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    batches = re.findall(r"\[batch \d+\] unprocessed: (.*)", done.stdout)
    assert batches, done.stdout[-3000:]
    # the first micro-batch holds the 300 published orders (those not taken yet)
    first = dict(re.findall(r"(\w+): (\d+) orders", batches[0]))
    assert set(first) <= {"ACME", "INIT", "TECH"} and first, batches[0]
    assert "waiting now, by symbol and times delivered:" in done.stdout
    assert re.search(r"\|\s*(ACME|INIT|TECH)\s*\|\s*\d+\s*\|\s*\d+\s*\|", done.stdout), done.stdout
    # the lease view: two consumers, the worker's backlog of 5 and the stuck one's 3
    assert "leased now, by consumer:" in done.stdout
    held = re.findall(r"\|(\S+-\d+)\s*\|(\d+)\s*\|(\d+\.\d+)\s*\|(\d+\.\d+)\s*\|", done.stdout)
    assert sorted(int(orders) for _h, orders, _v, _age in held) == [3, 5], done.stdout[-3000:]
    assert all(float(age) >= 0 for *_rest, age in held), held
