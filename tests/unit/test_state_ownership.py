"""Whether a state directory belongs to a cluster: the pure decision and its one-line message."""

from __future__ import annotations

from collections.abc import Mapping

from layer.state.ownership import BrokerFacts, StoredFacts, Verdict, judge, mismatch_message

CL = "qlayer-c1-orders-changelog"


def broker(
    ends: Mapping[tuple[str, int], int], cluster_id: str | None = "tansu_cluster"
) -> BrokerFacts:
    partitions: dict[str, int] = {}
    for topic, partition in ends:
        partitions[topic] = max(partitions.get(topic, 0), partition + 1)
    return BrokerFacts(cluster_id, partitions, dict(ends))


def stored(offsets: Mapping[tuple[str, int], int], cluster_id: str | None = None) -> StoredFacts:
    return StoredFacts(cluster_id, dict(offsets))


def test_a_new_state_dir_is_ok_on_any_broker() -> None:
    assert judge(stored({}), broker({}), [CL]).ok
    assert judge(stored({}), broker({(CL, 0): 90}), [CL]).ok


def test_up_to_date_is_ok_even_at_the_end_past_a_commit_marker() -> None:
    # the last transaction's record was at 10, its commit marker at 11: the stored next offset
    # is 11 and the high watermark 12; a store that applied everything is never beyond it
    assert judge(stored({(CL, 0): 11}), broker({(CL, 0): 12}), [CL]).ok
    assert judge(stored({(CL, 0): 12}, "tansu_cluster"), broker({(CL, 0): 12}), [CL]).ok


def test_behind_is_ok_restore_reads_the_rest() -> None:
    assert judge(stored({(CL, 0): 3}, "k1"), broker({(CL, 0): 500}, "k1"), [CL]).ok


def test_ahead_of_an_empty_changelog() -> None:
    found = judge(stored({(CL, 0): 57}), broker({(CL, 0): 0}), [CL])
    assert found.verdicts == {Verdict.AHEAD}
    assert found.details == (
        f"it is ahead of the broker's changelog: {CL}/0: state at offset 57, the broker's"
        " changelog ends at 0",
    )


def test_ahead_by_one_is_ahead() -> None:
    assert judge(stored({(CL, 0): 13}), broker({(CL, 0): 12}), [CL]).verdicts == {Verdict.AHEAD}


def test_a_changelog_topic_that_is_gone_or_lost_a_partition() -> None:
    gone = judge(stored({(CL, 0): 5}), broker({}), [CL])
    assert gone.verdicts == {Verdict.AHEAD}
    assert f"{CL}/0: state at offset 5, the topic does not exist on the broker" in gone.details[0]
    fewer = judge(stored({(CL, 0): 5, (CL, 1): 2}), broker({(CL, 0): 5}), [CL])
    assert fewer.verdicts == {Verdict.AHEAD}
    assert f"{CL}/1: state at offset 2, the topic has 1 partition(s)" in fewer.details[0]


def test_offset_zero_means_nothing_applied_so_a_missing_topic_is_fine() -> None:
    assert judge(stored({(CL, 0): 0}), broker({}), [CL]).ok


def test_changelogs_of_queues_not_configured_are_not_judged() -> None:
    # a removed queue's changelog may be deleted on purpose
    assert judge(stored({("qlayer-c1-old-changelog", 0): 80}), broker({}), [CL]).ok


def test_another_cluster() -> None:
    found = judge(stored({(CL, 0): 4}, "A1b2"), broker({(CL, 0): 9}, "Zz99"), [CL])
    assert found.verdicts == {Verdict.OTHER_CLUSTER}
    assert found.details == (
        "it was built from Kafka cluster 'A1b2', the broker is cluster 'Zz99'",
    )


def test_another_cluster_and_ahead_are_both_reported() -> None:
    found = judge(stored({(CL, 0): 40}, "A1b2"), broker({(CL, 0): 0}, "Zz99"), [CL])
    assert found.verdicts == {Verdict.OTHER_CLUSTER, Verdict.AHEAD}
    assert len(found.details) == 2


def test_no_cluster_id_on_either_side_decides_by_offsets_alone() -> None:
    assert judge(stored({(CL, 0): 4}), broker({(CL, 0): 9}, None), [CL]).ok
    assert judge(stored({(CL, 0): 4}, "A1b2"), broker({(CL, 0): 9}, None), [CL]).ok
    assert not judge(stored({(CL, 0): 10}, "A1b2"), broker({(CL, 0): 9}, None), [CL]).ok


def test_many_partitions_ahead_name_three_and_count_the_rest() -> None:
    offsets = {(CL, p): 10 for p in range(6)}
    found = judge(stored(offsets), broker({(CL, p): 0 for p in range(6)}), [CL])
    assert found.details[0].endswith("and 3 more partitions")
    assert found.details[0].count("state at offset 10") == 3


def test_the_message_is_one_line_with_the_dir_the_mismatch_and_both_remedies() -> None:
    found = judge(stored({(CL, 0): 57}), broker({(CL, 0): 0}), [CL])
    line = mismatch_message("/srv/qlayer/state", "127.0.0.1:9092", found)
    assert "\n" not in line
    assert line.startswith(
        "state dir /srv/qlayer/state does not belong to the Kafka cluster at 127.0.0.1:9092: "
    )
    assert f"{CL}/0: state at offset 57, the broker's changelog ends at 0" in line
    assert "run `qlayer coordinator --config FILE --reset-state` to discard" in line
    named = mismatch_message("/srv/state", "k:9092", found, "/etc/qlayer.toml")
    assert "run `qlayer coordinator --config /etc/qlayer.toml --reset-state` to discard" in named
    assert "point the coordinator at the cluster the state belongs to" in line
