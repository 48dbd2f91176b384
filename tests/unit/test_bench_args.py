"""``python -m bench.run``'s options that narrow a latency run."""

from __future__ import annotations

import pytest

from bench.run import RATES, parse_args


def test_latency_points_default_to_both_rates() -> None:
    assert parse_args(["--measures", "latency"]).rates == list(RATES)


def test_rates_narrow_the_latency_points() -> None:
    args = parse_args(["--systems", "qlayer,kafka", "--measures", "latency", "--rates", "1000"])
    assert args.rates == [1000.0]
    assert parse_args(["--rates", "500, 2000"]).rates == [500.0, 2000.0]


@pytest.mark.parametrize("rates", ["fast", "", "0", "1000,-5"])
def test_bad_rates_are_a_usage_error_naming_the_option(
    rates: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--rates", rates])
    assert exited.value.code == 2
    assert "--rates" in capsys.readouterr().err
