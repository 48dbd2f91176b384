"""Where a slow stop waits: the loop's tasks' chains of awaits (``layer.coordinator.app``)."""

from __future__ import annotations

import asyncio

from layer.coordinator.app import _awaiting


async def _inner(gate: asyncio.Event) -> None:
    await gate.wait()


async def _outer(gate: asyncio.Event) -> None:
    await _inner(gate)


def test_awaiting_names_every_coroutine_of_the_chain_outermost_first() -> None:
    async def main() -> str:
        gate = asyncio.Event()
        task = asyncio.create_task(_outer(gate))
        await asyncio.sleep(0)  # the task runs to its wait
        where = _awaiting(task.get_coro())
        gate.set()
        await task
        return where

    where = asyncio.run(main())
    names = [step.split(" (")[0] for step in where.split(" -> ")]
    assert names[:3] == ["_outer", "_inner", "wait"], where
    assert "test_stop_waits.py:" in where


def test_awaiting_a_finished_coroutine_says_no_frame() -> None:
    async def done() -> None:
        return None

    async def main() -> str:
        task = asyncio.create_task(done())
        await task
        return _awaiting(task.get_coro())

    assert asyncio.run(main()) == "no frame"


def test_stop_report_picks_the_step_the_tasks_and_each_threads_innermost_qlayer_frame() -> None:
    from tests.harness import stop_report

    log = "\n".join(
        [
            "2026-12-01 21:30:00,000 INFO layer.coordinator.app: serving",
            "Thread 0x00007f01 (most recent call first):",
            '  File "/usr/lib/python3.11/threading.py", line 331 in wait',
            '  File "/w/layer/coordinator/membership.py", line 672 in close',
            '  File "/w/layer/coordinator/service.py", line 485 in _leave',
            "",
            "Thread 0x00007f02 (most recent call first):",
            '  File "/usr/lib/python3.11/selectors.py", line 468 in select',
            "",
            "2026-12-01 21:30:30,000 WARNING layer.coordinator.app: stop not ended after 30s,"
            " at: leaving the cluster",
            "  task Task-1: run (app.py:140) -> _close (app.py:301)",
            "2026-12-01 21:30:31,000 INFO something else",
        ]
    )
    report = stop_report(log).splitlines()
    assert report[0].endswith("stop not ended after 30s, at: leaving the cluster")
    assert report[1] == "  task Task-1: run (app.py:140) -> _close (app.py:301)"
    assert report[2:] == [
        'Thread 0x00007f01 (most recent call first): File "/w/layer/coordinator/membership.py",'
        " line 672 in close"
    ]
    assert stop_report("nothing here") == "(no stop report in the log)"
