"""``python -m bench.txn_begin`` against the test broker: both variants timed, one file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.txn_begin import VARIANTS, main

pytestmark = pytest.mark.integration


def test_both_variants_commit_every_time_and_the_file_says_so(broker: Any, tmp_path: Path) -> None:
    args = ["--bootstrap", broker.bootstrap_servers, "--commits", "5", "--gap", "1"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    [written] = tmp_path.glob("txn-begin-*.json")
    doc = json.loads(written.read_text())
    assert (doc["records"], doc["gap_ms"]) == (5, 1.0)
    for v in VARIANTS:
        assert doc[v]["commits"] == 5
        assert 0 < doc[v]["p50_ms"] <= doc[v]["p90_ms"] < 30_000


@pytest.mark.parametrize("bad", [["--commits", "0"], ["--records", "0"], ["--gap", "-1"]])
def test_bad_arguments_are_a_usage_error(bad: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(bad)
    assert exited.value.code == 2
