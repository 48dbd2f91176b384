"""``python -m bench.fetch_floor`` against the test broker: every message through, one file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.fetch_floor import main

pytestmark = pytest.mark.integration


def test_the_fetch_floor_measures_every_message_and_writes_its_points(
    broker: Any, tmp_path: Path
) -> None:
    args = ["--bootstrap", broker.bootstrap_servers, "--waits", "10,5", "--rate", "200"]
    assert main([*args, "--seconds", "1", "--reps", "1", "--out", str(tmp_path)]) == 0
    [written] = tmp_path.glob("fetch-floor-*.json")
    points = json.loads(written.read_text())["points"]
    assert [p["fetch_wait_max_ms"] for p in points] == [10, 5]
    for p in points:
        assert p["received"] == p["published"] == 200
        assert 0 < p["latency"]["p50_ms"] <= p["latency"]["p99_ms"] < 30_000


@pytest.mark.parametrize("waits", ["0", "ten", ""])
def test_bad_waits_are_a_usage_error(waits: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--waits", waits])
    assert exited.value.code == 2
