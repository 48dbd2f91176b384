"""Which members a survivor removes from the group (``layer.coordinator.evict``), with a
scripted probe instead of sockets."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from layer.coordinator.evict import REFUSALS, Evictions, Remover
from layer.coordinator.membership import (
    ClusterMap,
    Member,
    group_write,
    member_write,
    owner_write,
)
from tests.helpers import wait_until

A, B, C = (Member(x, f"{x}:7070", f"{x}-changelog") for x in "abc")


def membership(*writes: Any) -> Any:
    cmap = ClusterMap("a")
    for offset, w in enumerate(writes):
        cmap.apply(w.key, w.value, offset)
    return SimpleNamespace(
        map=cmap, member=A, cluster="c1", group="qlayer.c1", removed=cmap.departed.add
    )


def test_a_member_refusing_connections_in_a_row_is_removed_once() -> None:
    m = membership(
        member_write(A), member_write(B), member_write(C),
        owner_write(0, A, False), owner_write(1, B, False), owner_write(2, C, False),
        group_write(B, "gid-b"), group_write(C, "gid-c"),
    )  # fmt: skip
    refusing = {"b:7070"}
    removed: list[tuple[str, str]] = []

    async def probe(address: str) -> bool:
        return address in refusing

    def remove(group: str, gid: str) -> str:
        removed.append((group, gid))
        return "ok"

    evictions = Evictions(m, remove, probe=probe)

    async def steps(n: int) -> None:
        for _ in range(n):
            await evictions.step()

    asyncio.run(steps(REFUSALS - 1))
    assert removed == []  # not yet: one refusal may be a restart
    asyncio.run(steps(1))
    assert removed == [("qlayer.c1", "gid-b")]
    asyncio.run(steps(REFUSALS * 2))
    assert removed == [("qlayer.c1", "gid-b")]  # once per group member id


def test_a_member_that_answers_or_left_is_never_removed() -> None:
    # c answers between refusals; b took its group id out (a graceful stop); a is this member
    m = membership(
        member_write(A), member_write(B), member_write(C),
        owner_write(0, A, False), owner_write(1, B, False), owner_write(2, C, False),
        group_write(A, "gid-a"), group_write(B, "gid-b"), group_write(B, None),
        group_write(C, "gid-c"),
    )  # fmt: skip
    answers = iter([True, False] * 10)
    removed: list[str] = []

    async def probe(address: str) -> bool:
        return True if address != "c:7070" else next(answers)

    evictions = Evictions(m, lambda group, gid: removed.append(gid) or "", probe=probe)

    async def steps() -> None:
        for _ in range(REFUSALS * 4):
            await evictions.step()

    asyncio.run(steps())
    assert removed == []


def test_a_removed_member_is_fenced_once_as_it_is_removed() -> None:
    m = membership(
        member_write(A), member_write(B), owner_write(0, A, False), owner_write(1, B, False),
        group_write(B, "gid-b"),
    )  # fmt: skip
    fenced: list[str] = []
    removed: list[str] = []

    async def probe(address: str) -> bool:
        return address == "b:7070"

    async def fence(member: Member) -> None:
        fenced.append(member.transactional_id)

    evictions = Evictions(m, lambda g, gid: removed.append(gid) or "", probe=probe, fence=fence)

    async def steps() -> None:
        for _ in range(REFUSALS):
            assert not fenced
            await evictions.step()
        assert evictions.suspect is False  # removed: not probed again soon
        for _ in range(REFUSALS * 2):
            await evictions.step()
        await asyncio.sleep(0)  # the fence runs as its own task

    asyncio.run(steps())
    assert removed == ["gid-b"] and fenced == ["b-changelog"]


@pytest.mark.filterwarnings("ignore::ResourceWarning")  # kafka-python's failed bootstrap
def test_closing_the_remover_does_not_wait_for_a_call_kafka_does_not_answer() -> None:
    """A removal (or the client's warm-up) under way while Kafka is away waits up to its
    bootstrap timeout (30 s by default); the member's stop must not wait for it, and the
    call drops its client when it ends."""
    silent = socket.socket()  # takes connections, never answers: a paused broker
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    remover = Remover(
        {"bootstrap_servers": f"127.0.0.1:{silent.getsockname()[1]}", "bootstrap_timeout_ms": 3000}
    )
    calling = threading.Thread(target=lambda: _quietly(remover.warm), daemon=True)
    calling.start()
    try:
        wait_until(lambda: remover._lock.locked(), 10, message="the warm-up to begin")
        started = time.monotonic()
        remover.close()
        took = time.monotonic() - started
        assert took < 1.0, f"close waited {took:.1f}s for the call under way"
        assert calling.is_alive(), "the call ended: the test proves nothing"
        calling.join(30)
        assert not calling.is_alive(), "the warm-up outlived its bootstrap timeout"
        assert remover._admin is None
    finally:
        silent.close()
        gc.collect()  # kafka-python's sockets: their warnings here, not in a later test


def _quietly(call: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):
        call()
