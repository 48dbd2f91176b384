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
