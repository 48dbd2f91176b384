"""The README's example of expressions over the Kafka record, run as written: its config block
(the queue renamed onto a fresh topic) and its ``qlayer`` lines, with the results its comments
promise."""

from __future__ import annotations

import json
import re
import shlex
import tomllib

import pytest

from layer.client import QueueClient
from tests.harness import ROOT, qlayer
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def readme_block(opening: str) -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index(opening)
    body = readme.index("\n", start) + 1
    return readme[body : readme.index("```", body)]


def test_the_readme_record_expression_example(broker, coordinator_factory, names) -> None:
    config = tomllib.loads(readme_block('```toml\n[[queue]]\nname = "jobs"'))
    (queue,) = config["queue"]
    q = names("jobs")
    queue.update(name=q, underlying_topic=names("jobs-t"))
    c = coordinator_factory([queue])
    lines = readme_block("```sh\nqlayer publish jobs 'resize img-1'").strip().splitlines()
    browsed = []
    for line in lines:
        command, _, comment = line.partition("  #")
        args = shlex.split(command)
        assert args[0] == "qlayer" and args[2] == "jobs", line
        args[2] = q
        if args[1] == "browse":
            expected = re.findall(r"img-\d", comment)
            got = qlayer(*args[1:], "--json", "--server", c.address)
            assert got.returncode == 0, got.stderr
            values = [json.loads(row)["value"] for row in got.stdout.splitlines()]
            browsed.append((values, expected))
            assert [v.split()[-1] for v in values] == expected, line
            continue
        r = qlayer(*args[1:], "--server", c.address)
        assert r.returncode == 0, r.stderr
        if line.startswith("qlayer publish") and "resize img-3" in line:
            with QueueClient(c.address) as client:
                wait_until(
                    lambda: (
                        client.stats(q)[0].available == 2
                        and client.stats(q)[0].extra["filtered_total"] == 1
                    ),
                    20,
                    message="two queued, one filtered out",
                )
    assert len(browsed) == 2
