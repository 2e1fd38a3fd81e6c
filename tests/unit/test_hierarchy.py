"""Hierarchical queues (shared/core/hierarchy.py): real capability, deserved, refused
subtrees, usage rolled up, queue order and both halves of reclaim."""

from __future__ import annotations

import pytest

from shared.core.hierarchy import (
    ROOT,
    TreeQueue,
    build,
    kinship,
    may_reclaim,
    may_take,
    order_key,
    over_capability,
    rolled_up,
    share,
)

C = "nvidia.count"
M = "nvidia.memory"


def team_tree(root_capability: dict[str, float] | None = None) -> list[TreeQueue]:
    """root -> team (guarantee 2) -> {train (guarantee 1), serve}; root -> other (guarantee 3)."""
    queues = [
        TreeQueue("team", capability={C: 10.0}, guarantee={C: 2.0}),
        TreeQueue("train", parent="team", guarantee={C: 1.0}, capability={M: 100.0}),
        TreeQueue("serve", parent="team", capability={C: 20.0}),
        TreeQueue("other", guarantee={C: 3.0}),
    ]
    if root_capability is not None:
        queues.append(TreeQueue(ROOT, parent="ignored", capability=root_capability))
    return queues


def test_real_capability_without_root_capability() -> None:
    t = build(team_tree())
    assert t.real[ROOT] is None
    # inf - 5 + 2 is unlimited: only team's own capability bounds it
    assert t.real["team"] == {C: 10.0}
    # 10 - 1 + 1; memory is train's own, count inherited from team
    assert t.real["train"] == {C: 10.0, M: 100.0}
    # min(20, 10 - 1 + 0)
    assert t.real["serve"] == {C: 9.0}
    assert t.real["other"] is None


def test_real_capability_under_a_root_capability() -> None:
    t = build(team_tree({C: 8.0, M: 50.0}))
    assert t.real[ROOT] == {C: 8.0, M: 50.0}
    # 8 - 5 + 2 = 5 < 10; memory inherited
    assert t.real["team"] == {C: 5.0, M: 50.0}
    assert t.real["train"] == {C: 5.0, M: 50.0}  # min(100, 50 - 0 + 0)
    assert t.real["serve"] == {C: 4.0, M: 50.0}  # 5 - 1 + 0
    assert t.real["other"] == {C: 6.0, M: 50.0}  # 8 - 5 + 3


def test_real_capability_clamps_at_zero() -> None:
    t = build(
        [
            TreeQueue(ROOT, capability={C: 4.0}),
            TreeQueue("a", guarantee={C: 4.0}),
            TreeQueue("b", guarantee={C: 2.0}),
            TreeQueue("c"),
        ]
    )
    assert t.real["a"] == {C: 2.0}  # 4 - 6 + 4
    assert t.real["c"] == {C: 0.0}  # 4 - 6 + 0, clamped


def test_deserved_is_at_least_the_guarantee_and_root_sums_its_children() -> None:
    t = build(
        [
            TreeQueue("a", deserved={C: 4.0, M: 10.0}, guarantee={C: 6.0}),
            TreeQueue("b", deserved={M: 5.0}, guarantee={M: 8.0, C: 1.0}),
            TreeQueue("a1", parent="a", deserved={C: 2.0}),
        ]
    )
    assert t.deserved["a"] == {C: 6.0, M: 10.0}
    assert t.deserved["b"] == {M: 8.0, C: 1.0}
    assert t.deserved[ROOT] == {C: 7.0, M: 18.0}
    assert t.guarantee[ROOT] == {C: 7.0, M: 8.0}
    assert t.children[ROOT] == ("a", "b")
    assert t.children["a"] == ("a1",)
    assert t.path("a1") == (ROOT, "a", "a1")
    assert t.depth("a1") == 2
    assert t.depth(ROOT) == 0
    assert t.leaf("a1")
    assert t.leaf("b")
    assert not t.leaf("a")
    assert not t.leaf(ROOT)


def test_broken_subtrees_wait_and_the_rest_is_computed_without_them() -> None:
    healthy = team_tree({C: 8.0})
    t = build(
        [
            *healthy,
            TreeQueue("orphan", parent="gone", guarantee={C: 5.0}),
            TreeQueue("x", parent="y", guarantee={C: 5.0}),
            TreeQueue("y", parent="x"),
            TreeQueue("self", parent="self"),
            TreeQueue("kid", parent="orphan"),
            TreeQueue("grandkid", parent="kid"),
            TreeQueue("hanger", parent="x"),
        ]
    )
    assert t.broken == {
        "orphan": 'queue "orphan": its parent "gone" does not exist',
        "x": 'queue "x": its parents form a cycle: x → y → x',
        "y": 'queue "y": its parents form a cycle: y → x → y',
        "self": 'queue "self": its parents form a cycle: self → self',
        "kid": 'queue "kid": its ancestor "orphan" is refused: '
        'queue "orphan": its parent "gone" does not exist',
        "grandkid": 'queue "grandkid": its ancestor "orphan" is refused: '
        'queue "orphan": its parent "gone" does not exist',
        "hanger": 'queue "hanger": its ancestor "x" is refused: '
        'queue "x": its parents form a cycle: x → y → x',
    }
    alone = build(healthy)
    assert t.parent == alone.parent
    assert t.children == alone.children
    assert t.real == alone.real
    assert t.deserved == alone.deserved
    assert t.guarantee == alone.guarantee


def test_usage_rolls_up_and_the_deepest_exceeding_queue_is_named() -> None:
    t = build(team_tree({C: 8.0}))  # team 5, train 5, serve 4, other 6
    rolled = rolled_up(t, {"train": {C: 2.0}, "serve": {C: 1.0}, "other": {C: 1.0}, "nope": {C: 9}})
    assert rolled[ROOT] == {C: 4.0}
    assert rolled["team"] == {C: 3.0}
    assert rolled["serve"] == {C: 1.0}
    assert over_capability(t, "serve", rolled, {C: 2.0}) is None  # 3/4, 5/5, 6/8
    assert over_capability(t, "serve", rolled, {C: 4.0}) == "serve"  # serve 5/4 and team 7/5
    assert over_capability(t, "train", rolled, {C: 3.0}) == "team"  # train 5/5, team 6/5
    assert over_capability(t, "other", rolled, {C: 5.0}) == ROOT  # other 6/6, root 9/8
    assert over_capability(t, "other", rolled, {M: 1e9}) is None  # memory is unlimited


def test_share_is_the_largest_ratio_over_deserved_dimensions() -> None:
    t = build([TreeQueue("a", deserved={C: 4.0, M: 100.0, "x": 0.0}), TreeQueue("b")])
    rolled = rolled_up(t, {"a": {C: 1.0, M: 50.0, "x": 3.0}, "b": {C: 9.0}})
    assert share(t, "a", rolled) == pytest.approx(0.5)
    assert share(t, "b", rolled) == 1.0


def test_order_key_priority_first_then_the_diverging_level() -> None:
    t = build(
        [
            TreeQueue("a", deserved={C: 10.0}),
            TreeQueue("a1", parent="a", deserved={C: 4.0}),
            TreeQueue("a2", parent="a", deserved={C: 4.0}),
            TreeQueue("b", deserved={C: 10.0}),
            TreeQueue("b1", parent="b", deserved={C: 4.0}),
            TreeQueue("vip", priority=5),
        ]
    )
    rolled = rolled_up(t, {"a1": {C: 4.0}, "a2": {C: 1.0}, "b1": {C: 3.0}, "vip": {C: 50.0}})

    def order(*queues: str) -> list[str]:
        return sorted(queues, key=lambda q: order_key(t, q, rolled))

    assert order("a1", "a2", "b1", "vip")[0] == "vip"  # priority before any share
    # a and b diverge at the top: b's 3/10 goes before a's 5/10
    assert order("a2", "b1") == ["b1", "a2"]  # b 0.3 < a 0.5, though a2 0.25 < b1 0.75
    assert order("a1", "a2") == ["a2", "a1"]  # same parent: the leaves decide


def test_order_key_tie_prefers_the_queue_with_a_deserved() -> None:
    t = build([TreeQueue("best"), TreeQueue("owed", deserved={C: 2.0})])
    rolled = rolled_up(t, {"owed": {C: 2.0}})  # both share 1.0
    keys = sorted(["best", "owed"], key=lambda q: order_key(t, q, rolled))
    assert keys == ["owed", "best"]


def test_may_reclaim_within_capability_and_under_deserved_on_one_dimension() -> None:
    t = build(
        [
            TreeQueue("a", deserved={C: 4.0}, capability={C: 6.0}),
            TreeQueue("a1", parent="a", deserved={C: 2.0, M: 100.0, "x": 0.0}),
            TreeQueue("z", deserved={}),
        ]
    )
    rolled = rolled_up(t, {"a1": {C: 2.0, M: 10.0}})
    # count would be 3 > 2, memory 20 <= 100: one dimension is enough
    assert may_reclaim(t, "a1", rolled, {C: 1.0, M: 10.0})
    # count alone is over; "x" deserves 0 and is ignored
    assert not may_reclaim(t, "a1", rolled, {C: 1.0, "x": 1.0})
    # a queue that deserves nothing never reclaims
    assert not may_reclaim(t, "z", rolled, {C: 1.0})
    # within deserved memory, but a1's real capability (inherited 6) is exceeded
    assert not may_reclaim(t, "a1", rolled, {C: 5.0, M: 1.0})


def test_may_reclaim_through_an_ancestor_within_level() -> None:
    t = build(
        [
            TreeQueue("a", deserved={C: 10.0}),
            TreeQueue("a1", parent="a", deserved={C: 6.0}),
            TreeQueue("a11", parent="a1", deserved={C: 2.0}),
        ]
    )
    rolled = rolled_up(t, {"a11": {C: 5.0}})  # a11 over, a1 5/6, a 5/10
    assert not may_reclaim(t, "a11", rolled, {C: 1.0})
    assert not may_reclaim(t, "a11", rolled, {C: 1.0}, level=0)
    assert may_reclaim(t, "a11", rolled, {C: 1.0}, level=1)  # a1: 6 <= 6
    assert not may_reclaim(t, "a11", rolled, {C: 2.0}, level=1)  # a1: 7 > 6
    assert may_reclaim(t, "a11", rolled, {C: 2.0}, level=2)  # a: 7 <= 10


def test_kinship_is_the_depth_of_the_deepest_common_ancestor() -> None:
    t = build(
        [
            TreeQueue("a"),
            TreeQueue("a1", parent="a"),
            TreeQueue("a2", parent="a"),
            TreeQueue("a11", parent="a1"),
            TreeQueue("a12", parent="a1"),
            TreeQueue("b"),
        ]
    )
    assert kinship(t, "a1", "a2") == 1
    assert kinship(t, "a", "b") == 0
    assert kinship(t, "a11", "b") == 0
    assert kinship(t, "a11", "a12") == 2
    assert kinship(t, "a11", "a2") == 1


def test_may_take_keeps_guarantees_and_deserved_shares() -> None:
    t = build(
        [
            TreeQueue("r", deserved={C: 4.0}),
            TreeQueue("g", deserved={C: 2.0}, guarantee={C: 3.0}),
            TreeQueue("d", deserved={C: 4.0}),
            TreeQueue("free"),
            TreeQueue("mem", deserved={M: 100.0}),
        ]
    )
    rolled = rolled_up(t, {"g": {C: 4.0, M: 1.0}, "d": {C: 4.0}, "free": {C: 1.0}, "mem": {C: 2}})
    pod = {C: 1.0}
    assert may_take(t, "r", "g", rolled, pod) is None  # 4 > 3, and 3 left is the guarantee
    assert may_take(t, "r", "g", rolled, {C: 2.0}) == 'queue "g" would fall below its guarantee'
    assert may_take(t, "r", "d", rolled, pod) == 'queue "d" is within its deserved share'
    assert may_take(t, "r", "free", rolled, pod) is None  # deserves nothing: immediate victim
    assert may_take(t, "r", "mem", rolled, pod) is None  # deserves nothing of what the pod uses


def issue_5107() -> tuple[list[TreeQueue], dict[str, dict[str, float]]]:
    queues = [
        TreeQueue("A", deserved={C: 100.0}),
        TreeQueue("A1", parent="A", deserved={C: 20.0}),
        TreeQueue("A2", parent="A", deserved={C: 80.0}),
        TreeQueue("B", deserved={C: 10.0}),
    ]
    return queues, {"A1": {C: 40.0}, "A2": {}, "B": {C: 10.0}}


def test_may_take_checks_diverging_ancestors_unlike_volcano_issue_5107() -> None:
    queues, own = issue_5107()
    t = build(queues)
    rolled = rolled_up(t, own)
    pod = {C: 1.0}
    assert (
        may_take(t, "B", "A1", rolled, pod) == 'its parent queue "A" is within its deserved share'
    )
    assert may_take(t, "B", "A1", rolled, pod, level=1) is not None
    assert may_take(t, "B", "A1", rolled, pod, level=0) is None  # Volcano's default
    # a sibling shares A: only A1 itself is weighed
    assert may_take(t, "A2", "A1", rolled, pod) is None


def test_may_take_names_a_grandparent_and_level_counts_from_the_parent() -> None:
    t = build(
        [
            TreeQueue("A", deserved={C: 100.0}),
            TreeQueue("Am", parent="A", deserved={C: 10.0}),
            TreeQueue("Am1", parent="Am", deserved={C: 5.0}),
            TreeQueue("B", deserved={C: 10.0}),
        ]
    )
    rolled = rolled_up(t, {"Am1": {C: 20.0}})  # Am1 and Am over, A under
    pod = {C: 1.0}
    assert may_take(t, "B", "Am1", rolled, pod) == (
        'its ancestor queue "A" is within its deserved share'
    )
    assert may_take(t, "B", "Am1", rolled, pod, level=1) is None  # Am only
    assert may_take(t, "B", "Am1", rolled, pod, level=2) is not None
