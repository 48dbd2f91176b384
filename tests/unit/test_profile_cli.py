"""``python -m bench.profile``: a raw py-spy file, or a run's results with its profile beside it."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from bench import profile

RAW = (
    "thread (1): MainThread;Rounds.run (layer/coordinator/round.py:490);"
    "Round.decide (layer/coordinator/round.py:223) 3\n"
    "thread (2): changelog_0;ChangelogWriter.commit (layer/state/changelog.py:40) 1\n"
)


def _run_files(tmp_path: Path) -> Path:
    results = tmp_path / "queue-1.json"
    results.write_text("{}")
    with gzip.open(tmp_path / "queue-1-pyspy.txt.gz", "wt") as f:
        f.write(RAW)
    return results


def test_a_results_file_reads_the_profile_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert profile.main([str(_run_files(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert out.startswith("4 samples")
    assert "75.0%  Round.decide (layer/coordinator/round.py)" in out
    assert "25.0%  changelog" in out


def test_a_results_file_without_a_profile_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lone = tmp_path / "view-cost-1.json"
    lone.write_text("{}")
    with pytest.raises(SystemExit) as exc:
        profile.main([str(lone)])
    assert exc.value.code == 2
    assert "view-cost-1-pyspy.txt.gz" in capsys.readouterr().err


def test_a_missing_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        profile.main([str(tmp_path / "nope.txt.gz")])
    assert "nope.txt.gz: no such file" in capsys.readouterr().err
