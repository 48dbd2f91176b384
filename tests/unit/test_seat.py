"""The coordinator's seat (``layer.coordinator.seat``) as a part of its own: what it says about
the queues served, alone and as a member of a cluster that has not been given anything yet,
over a host that is a plain object (the port the coordinator implements). The group's
assignments, fences and releases need Kafka: the cluster's integration and fault tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

import pytest

from connectors.kafka import TANSU
from layer.api.service import ClusterInfo, ReloadResult
from layer.config import Config
from layer.config.model import CoordinatorConfig
from layer.coordinator.cluster_queues import ClusterQueues
from layer.coordinator.membership import partition_of
from layer.coordinator.peers import Peers
from layer.coordinator.seat import Seat, SeatHost, writer_id
from layer.exceptions import NotOwner, StateError
from layer.state import MemoryStore

T = TypeVar("T")


class Host:
    """A coordinator as the seat sees it: its configuration and the queues it runs."""

    def __init__(self, config: Config, running: set[str]) -> None:
        self.reload_lock = asyncio.Lock()
        self.config = config
        self.running = running
        self.is_failed = False
        self.gave_up: list[StateError] = []
        self.applied: list[str] = []

    def current_config(self) -> Config:
        return self.config

    def cluster_queues(self) -> ClusterQueues | None:
        return None

    def serves(self, queue: str) -> bool:
        return queue in self.running

    async def apply_definitions(self, reason: str) -> ReloadResult:
        self.applied.append(reason)
        return ReloadResult(source=reason, applied=True)

    def give_up(self, error: StateError) -> None:
        self.gave_up.append(error)

    async def until_reachable(self, what: str, step: Callable[[], T]) -> T:
        return step()

    def outage_lately(self) -> bool:
        return False

    def failed(self) -> bool:
        return self.is_failed

    def stopping(self) -> bool:
        return False


def seat_of(coordinator: CoordinatorConfig, running: set[str]) -> tuple[Seat, Host]:
    host = Host(Config(source="<test>", coordinator=coordinator), running)
    port: SeatHost = host  # the coordinator's port, checked by mypy
    seat = Seat(
        port, coordinator, {"bootstrap.servers": "127.0.0.1:1"}, TANSU, MemoryStore(), Peers(None)
    )
    return seat, host


def run(step: Awaitable[T]) -> T:
    async def main() -> T:
        return await step

    return asyncio.run(main())


def test_alone_it_serves_every_queue_and_forwards_nothing() -> None:
    seat, host = seat_of(CoordinatorConfig(id="solo"), {"orders", "trades"})
    assert not seat.clustered
    assert seat.membership is None and seat.member_id == ""
    assert seat.owns("orders") and seat.owns("anything")
    assert seat.owner_elsewhere("orders") is None
    assert seat.owner_elsewhere("unknown") is None
    assert run(seat.owner_settled("unknown")) is None
    assert seat.stale_after_s() == 0.0
    assert seat.confirm_replacement() is None  # no other member can have taken anything


def test_alone_its_deliveries_stop_once_the_rounds_failed() -> None:
    seat, host = seat_of(CoordinatorConfig(id="solo"), {"orders"})
    assert run(seat.deliverable()) is True
    assert run(seat.current_since(0.0)) is True
    host.is_failed = True
    assert run(seat.deliverable()) is False
    assert run(seat.current_since(0.0)) is False


def test_alone_the_metadata_names_itself_as_the_owner_of_each_queue_served() -> None:
    seat, host = seat_of(CoordinatorConfig(id="solo"), {"trades", "orders"})

    async def joined_then_info() -> ClusterInfo:
        await seat.join("127.0.0.1:7070")  # alone: only the address is taken
        info = await seat.cluster_info(sorted(host.running, reverse=True))
        await seat.leave()
        await seat.close()
        return info

    info = run(joined_then_info())
    assert seat.address == "127.0.0.1:7070"
    assert info.standalone and info.cluster == "solo" and info.member == "solo"
    assert [m.id for m in info.members] == ["solo"]
    queues = info.queues
    assert [q.queue for q in queues] == ["orders", "trades"]  # sorted by name
    assert [q.partition for q in queues] == [partition_of("orders"), partition_of("trades")]
    assert {(q.member, q.address) for q in queues} == {("solo", "127.0.0.1:7070")}
    assert host.applied == [] and host.gave_up == []


def test_a_member_that_was_given_nothing_yet_owns_no_queue() -> None:
    coordinator = CoordinatorConfig(id="m1", cluster="c")
    seat, host = seat_of(coordinator, set())
    assert seat.clustered
    assert not seat.owns("orders")
    # not joined yet: nobody is known to serve it, so the caller is told to try again
    error = seat.not_owner("orders")
    assert isinstance(error, NotOwner)
    assert "has no owner right now" in str(error) and "'orders'" in str(error)
    assert seat.owner_elsewhere("orders") is None
    # a queue it runs is never forwarded
    host.running.add("orders")
    assert seat.owner_elsewhere("orders") is None


def test_the_writer_id_is_the_members_id_for_all_its_queues() -> None:
    assert writer_id(CoordinatorConfig(id="m2")) == "m2-changelog"
    base = CoordinatorConfig(id="m2", cluster="c")
    assert writer_id(replace(base, standby_replicas=3)) == "m2-changelog"


@pytest.mark.parametrize("cluster", [None, "c"])
def test_leaving_before_joining_is_harmless(cluster: str | None) -> None:
    seat, host = seat_of(CoordinatorConfig(id="m3", cluster=cluster), set())

    async def leave_twice() -> None:
        await seat.leaving()
        await seat.leave()
        await seat.leave()
        await seat.close()

    run(leave_twice())
    assert host.gave_up == []
