"""The memory of past use (shared/core/usage.py) and where it enters shares
(shared/core/queues.py ``weigh``/``deserved``, shared/core/hierarchy.py ``fair``)."""

from __future__ import annotations

import math
from typing import Literal

import msgspec
import pytest

from shared.core.gangs import Gangs, Policy
from shared.core.hierarchy import TreeQueue, build, fair
from shared.core.model import DeviceInfo, DeviceUUID, NodeName
from shared.core.queues import QueueShare, QueueSpec, deserved, weigh
from shared.core.usage import CAPACITY, Stored, UsageMemory, UsageParams

GPU = "nvidia.count"
MINUTE_BUCKETS = UsageParams(weight=1.0, half_life_s=3600.0, window_s=168 * 60.0)
"""Buckets of a minute: fine enough to compare with the integrals."""


def run(
    memory: UsageMemory, held: dict[str, float], capacity: float, start: float, end: float
) -> None:
    """Sample every 10 s from ``start`` to ``end`` with each queue holding ``held`` GPUs."""
    t = start
    while t <= end + 1e-9:
        memory.sample(t, {q: {GPU: v} for q, v in held.items()}, {GPU: capacity})
        t += 10.0


def test_usage_decays_by_its_half_life() -> None:
    """One GPU held for an hour, half-life an hour: ∫ 0.5^((T-t)/h) dt = h/ln2 · (1 - 1/2)."""
    memory = UsageMemory(MINUTE_BUCKETS)
    run(memory, {"a": 1.0}, 4.0, 0.0, 3600.0)
    expected = 3600.0 / math.log(2) * 0.5
    assert memory.usage(3600.0)["a"][GPU] == pytest.approx(expected, rel=0.01)
    # An hour later with nothing held, it weighs half.
    run(memory, {}, 4.0, 3610.0, 7200.0)
    assert memory.usage(7200.0)["a"][GPU] == pytest.approx(expected / 2, rel=0.01)


def test_normalized_usage_is_the_part_of_the_capacity_held() -> None:
    """A queue holding one of four GPUs all along has a quarter of the capacity's usage,
    whatever the half-life."""
    memory = UsageMemory(MINUTE_BUCKETS)
    run(memory, {"a": 1.0, "b": 3.0}, 4.0, 0.0, 7200.0)
    assert memory.normalized["a"][GPU] == pytest.approx(0.25, rel=1e-3)
    assert memory.normalized["b"][GPU] == pytest.approx(0.75, rel=1e-3)
    assert CAPACITY not in memory.normalized


def test_a_zero_half_life_sums_over_the_window_and_forgets_past_it() -> None:
    params = UsageParams(half_life_s=0.0, window_s=3600.0)
    memory = UsageMemory(params)
    run(memory, {"a": 2.0}, 4.0, 0.0, 1800.0)
    assert memory.usage(1800.0)["a"][GPU] == pytest.approx(2.0 * 1800.0)
    run(memory, {}, 4.0, 1810.0, 5500.0)  # its last bucket is over an hour old
    assert "a" not in memory.usage(5500.0)
    assert "a" not in memory.normalized
    assert "a" in memory.dirty  # to be deleted from the store


def test_what_is_stored_comes_back_and_the_gap_counts_at_the_stored_rates() -> None:
    memory = UsageMemory(MINUTE_BUCKETS)
    run(memory, {"a": 1.0}, 4.0, 0.0, 1800.0)
    stored = memory.stored(sorted(memory.dirty))
    assert not memory.dirty
    wire = {
        name: msgspec.json.decode(msgspec.json.encode(entry), type=Stored)
        for name, entry in stored.items()
        if entry is not None
    }
    again = UsageMemory(MINUTE_BUCKETS)
    again.restore(wire)
    # The restarted memory samples 10 minutes later: the gap counts at 1 of 4 GPUs.
    again.sample(2400.0, {"a": {GPU: 1.0}}, {GPU: 4.0})
    run(memory, {"a": 1.0}, 4.0, 1810.0, 2400.0)
    assert again.usage(2400.0)["a"][GPU] == pytest.approx(memory.usage(2400.0)["a"][GPU], rel=0.01)
    assert again.normalized["a"][GPU] == pytest.approx(0.25, rel=1e-3)


def test_a_gap_longer_than_the_window_counts_one_window() -> None:
    params = UsageParams(half_life_s=0.0, window_s=600.0)
    memory = UsageMemory(params)
    memory.sample(0.0, {"a": {GPU: 1.0}}, {GPU: 1.0})
    memory.sample(100_000.0, {"a": {GPU: 1.0}}, {GPU: 1.0})
    assert memory.usage(100_000.0)["a"][GPU] == pytest.approx(600.0, rel=0.02)


def test_weigh_moves_the_weights_by_past_use() -> None:
    """KAI's ``max(0, nW + k·(nW - nU))``, scaled back to the weights' sum."""
    assert weigh({"a": 1.0, "b": 1.0}, {"a": 0.5}, 0.0) == {"a": 1.0, "b": 1.0}
    moved = weigh({"a": 1.0, "b": 1.0}, {"a": 0.5, "b": 0.0}, 1.0)
    assert moved["a"] == pytest.approx(2 / 3)  # 0.5 + (0.5 - 0.5) = 0.5 of 1.5
    assert moved["b"] == pytest.approx(4 / 3)  # 0.5 + (0.5 - 0) = 1.0 of 1.5
    # A queue that used far more than its weight gets nothing of the surplus...
    assert weigh({"a": 1.0, "b": 1.0}, {"a": 1.0}, 1.0)["a"] == 0.0
    # ...unless every queue would weigh nothing: the surplus is divided as before.
    assert weigh({"a": 1.0}, {"a": 3.0}, 1.0) == {"a": 1.0}


def test_proportion_divides_the_surplus_by_moved_weights_and_keeps_guarantees() -> None:
    queues = [
        QueueShare(name="a", demand={GPU: 10.0}, guarantee={GPU: 4.0}),
        QueueShare(name="b", demand={GPU: 10.0}),
    ]
    assert deserved({GPU: 10.0}, queues) == {"a": {GPU: 5.0}, "b": {GPU: 5.0}}
    moved = deserved({GPU: 10.0}, queues, {"a": {GPU: 0.5}, "b": {GPU: 0.0}}, 1.0)
    assert moved["b"][GPU] > 6.0
    assert moved["a"][GPU] == pytest.approx(4.0)  # its guarantee, untouched


def test_capacity_fair_shares_give_the_surplus_above_deserved_by_past_use() -> None:
    tree = build(
        [
            TreeQueue(name="team", deserved={GPU: 8.0}),
            TreeQueue(name="a", parent="team", deserved={GPU: 2.0}),
            TreeQueue(name="b", parent="team", deserved={GPU: 2.0}),
            TreeQueue(name="c", deserved={GPU: 2.0}),
        ]
    )
    demand = {"team": {GPU: 20.0}, "a": {GPU: 10.0}, "b": {GPU: 10.0}, "c": {GPU: 1.0}}
    even = fair(tree, {GPU: 12.0}, demand, {}, 1.0)
    assert even["c"][GPU] == pytest.approx(1.0)  # no more than it asks
    assert even["team"][GPU] == pytest.approx(11.0)
    assert even["a"][GPU] == pytest.approx(5.5)
    assert even["b"][GPU] == pytest.approx(5.5)
    # "a" used 40 % of the cluster lately, within its team, which is owed 11 of 12
    # cards: its use counts as 0.4 / (11/12) of the team's part, so "b" gets more of
    # the team's surplus of 7; the deserved 2 each is untouched.
    past = {"team": {GPU: 0.4}, "a": {GPU: 0.4}, "b": {GPU: 0.0}}
    moved = fair(tree, {GPU: 12.0}, demand, past, 1.0)
    nu = 0.4 / (11 / 12)
    wa, wb = 0.5 + (0.5 - nu), 0.5 + 0.5
    assert moved["team"][GPU] == pytest.approx(11.0)
    assert moved["a"][GPU] == pytest.approx(2.0 + 7.0 * wa / (wa + wb))
    assert moved["b"][GPU] == pytest.approx(2.0 + 7.0 * wb / (wa + wb))
    # A higher-priority sibling takes the surplus first, whatever its past use.
    ranked = build(
        [
            TreeQueue(name="a", deserved={GPU: 2.0}, priority=1),
            TreeQueue(name="b", deserved={GPU: 2.0}),
        ]
    )
    wanting = {"a": {GPU: 10.0}, "b": {GPU: 10.0}}
    first = fair(ranked, {GPU: 12.0}, wanting, {"a": {GPU: 0.9}}, 1.0)
    assert first["a"][GPU] == pytest.approx(10.0)
    assert first["b"][GPU] == pytest.approx(2.0)


def _gangs(plugin: Literal["proportion", "capacity"]) -> Gangs:
    gangs = Gangs(Policy(queue_plugin=plugin, usage=UsageParams(weight=1.0)))
    devices = tuple(
        DeviceInfo(
            uuid=DeviceUUID(f"GPU-{i}"), index=i, vendor="nvidia", model="A100", memory_mib=81920
        )
        for i in range(8)
    )
    gangs.set_node(NodeName("n"), devices)
    return gangs


def test_proportion_shares_follow_the_memory() -> None:
    gangs = _gangs("proportion")
    gangs.queues = {
        "a": QueueSpec(name="a"),
        "b": QueueSpec(name="b"),
    }
    gangs.bound_use = {"a": {GPU: 8.0}}
    for t in range(0, 3600, 60):
        gangs.sample_usage(float(t))
    assert gangs.usage.normalized["a"][GPU] == pytest.approx(1.0, rel=1e-3)
    # Both now ask for the whole cluster (the demand is what they hold and wait for).
    gangs.bound_use = {"a": {GPU: 8.0}, "b": {GPU: 8.0}}
    _, _, share = gangs.shares()
    # "a" used the whole cluster: at k 1, KAI's formula leaves it nothing of the surplus.
    assert share["b"][GPU] == pytest.approx(8.0)
    assert share["a"].get(GPU, 0.0) == 0.0


def test_with_a_memory_reclaim_follows_the_fair_share() -> None:
    """KAI's reclaim follows the fair share: a queue over its deserved but within its
    fair share keeps its pods; one over its fair share gives them up to a queue under
    its own; without ``owed`` it is the deserved share, as before."""
    from shared.core.hierarchy import may_reclaim, may_take, rolled_up

    tree = build(
        [
            TreeQueue(name="a", deserved={GPU: 2.0}),
            TreeQueue(name="b", deserved={GPU: 2.0}),
        ]
    )
    rolled = rolled_up(tree, {"a": {GPU: 5.0}, "b": {GPU: 2.0}})
    card = {GPU: 1.0}
    assert may_take(tree, "b", "a", rolled, card) is None  # a is over its deserved 2
    assert not may_reclaim(tree, "b", rolled, card)  # b is at its deserved 2
    owed = {"a": {GPU: 5.0}, "b": {GPU: 3.0}}  # a's surplus, b's share of it
    assert may_take(tree, "b", "a", rolled, card, owed=owed) == (
        'queue "a" is within its fair share'
    )
    owed = {"a": {GPU: 4.0}, "b": {GPU: 4.0}}  # a used more lately: b's surplus grows
    assert may_reclaim(tree, "b", rolled, card, owed=owed)
    assert may_take(tree, "b", "a", rolled, card, owed=owed) is None


@pytest.mark.parametrize(("half_life", "read_at"), [(3600.0, 0.0), (3600.0, 1800.0), (60.0, 900.0)])
def test_the_decay_is_exact_whatever_the_bucket_against_the_half_life(
    half_life: float, read_at: float
) -> None:
    """Hour-long buckets (the default week's) and any half-life: a queue that held the
    whole cluster for the last 10 minutes of a week has ``1 - 0.5^(600 / h)`` of the
    decayed capacity, wherever in its hour it is read."""
    memory = UsageMemory(UsageParams(half_life_s=half_life))
    assert memory.params.bucket_s == 3600.0
    end = 604800.0 + read_at
    t = 0.0
    while t < end - 600.0:
        memory.sample(t, {}, {GPU: 4.0})
        t = min(t + 600.0, end - 600.0)
    memory.sample(end - 600.0, {"a": {GPU: 4.0}}, {GPU: 4.0})
    memory.sample(end, {"a": {GPU: 4.0}}, {GPU: 4.0})
    assert memory.normalized["a"][GPU] == pytest.approx(1 - 0.5 ** (600.0 / half_life), rel=1e-3)


def test_a_new_rate_is_stored_so_a_restart_counts_the_outage_at_it() -> None:
    memory = UsageMemory(MINUTE_BUCKETS)
    memory.sample(0.0, {"a": {GPU: 1.0}}, {GPU: 4.0})
    memory.stored(sorted(memory.dirty))
    memory.sample(10.0, {"a": {GPU: 1.0}, "b": {GPU: 2.0}}, {GPU: 4.0})
    assert "b" in memory.dirty
    stored = {n: e for n, e in memory.stored(sorted(memory.dirty)).items() if e is not None}
    again = UsageMemory(MINUTE_BUCKETS)
    again.restore(stored)
    again.sample(610.0, {}, {GPU: 4.0})  # back 600 s later: b held 2 GPUs meanwhile
    assert again.usage(610.0)["b"][GPU] == pytest.approx(
        2.0 * 3600 / math.log(2) * (1 - 0.5 ** (600 / 3600)), rel=1e-6
    )


def test_every_queue_name_has_a_key_the_bucket_takes_and_back() -> None:
    from services.gang_coordinator.usage import key_of, name_of

    for name in ["default", "Team A", "a:b", "_capacity", "q.x", "é", CAPACITY]:
        key = key_of(name)
        assert all(c.isalnum() or c in "-_." for c in key), key
        assert name_of(key) == name
    assert name_of("other") is None
