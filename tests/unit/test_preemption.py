"""Preemption and hold plans (shared/core/preemption.py) and nodes held for a gang."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shared.core.model import GangKey, NodeName, VictimUnit
from shared.core.placement import Failure, GangMember, Placement
from shared.core.preemption import plan
from tests.unit.corekit import gpus, place, placer, ref, request

WHOLE = {"nvidia.com/gpu": 1}


def half() -> dict[str, Any]:
    return {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50}


BIG = GangKey(namespace="ns", name="big")


def gang(n: int, limits: dict[str, Any] = WHOLE) -> list[GangMember]:
    return [GangMember(pod=ref(), request=request(limits), group=BIG) for _ in range(n)]


def unit(*placements: Placement) -> VictimUnit:
    return VictimUnit(pods=tuple(p.pod for p in placements))


def test_cheapest_units_are_taken_until_the_gang_fits_and_the_ledger_is_untouched() -> None:
    pl = placer({"a": gpus(2), "b": gpus(2)})
    held = [place(pl, WHOLE) for _ in range(4)]
    before = pl.ledger.snapshot()
    result = plan(pl, gang(2), 2, [unit(p) for p in held])
    assert result is not None
    assert result.pods == (held[0].pod.uid, held[1].pod.uid)
    assert len(result.placements) == 2
    assert pl.ledger.snapshot() == before


def test_a_unit_that_turned_out_not_to_help_is_put_back() -> None:
    pl = placer({"a": gpus(1), "b": gpus(1)})
    x1 = place(pl, half(), name="x1")  # one node: two halves
    x2 = place(pl, half(), name="x2")
    y = place(pl, WHOLE, name="y")  # the other: one whole card
    assert x1.node == x2.node != y.node
    result = plan(pl, gang(1), 1, [unit(x1), unit(y), unit(x2)])
    assert result is not None
    assert result.pods == (y.pod.uid,)  # x1 alone would not have been enough: kept
    assert result.placements[0].node == y.node


def test_a_gang_unit_leaves_whole_and_a_shared_pod_is_counted_once() -> None:
    pl = placer({"a": gpus(2)})
    g1, g2 = place(pl, WHOLE), place(pl, WHOLE)
    surplus = unit(g2)
    whole_gang = unit(g1, g2)
    result = plan(pl, gang(2), 2, [surplus, whole_gang])
    assert result is not None
    assert sorted(result.pods) == sorted([g1.pod.uid, g2.pod.uid])


def test_no_plan_when_all_units_are_not_enough_and_nothing_changes() -> None:
    pl = placer({"a": gpus(2)})
    held = [place(pl, WHOLE) for _ in range(2)]
    before = pl.ledger.snapshot()
    assert plan(pl, gang(3), 3, [unit(p) for p in held]) is None
    assert plan(pl, gang(1), 1, []) is None
    assert pl.ledger.snapshot() == before


def test_units_holding_nothing_are_skipped() -> None:
    pl = placer({"a": gpus(1)})
    held = place(pl, WHOLE)
    ghost = VictimUnit(pods=(ref(),))  # a pod the ledger does not know
    result = plan(pl, gang(1), 1, [ghost, unit(held)])
    assert result is not None
    assert result.units == (unit(held),)


def test_nodes_held_for_a_gang_are_closed_to_others_and_open_to_it() -> None:
    pl = placer({"a": gpus(1), "b": gpus(1)})
    pl.reserved_nodes[NodeName("a")] = BIG
    first = place(pl, WHOLE)
    assert first.node == NodeName("b")
    refused = pl.place(ref(), request(WHOLE))
    assert isinstance(refused, Failure)
    assert "held for gang ns/big" in refused.message
    assert not refused.unresolvable  # the hold ends; the pod is retried
    mine = pl.place_gang(gang(1), 1, owner=BIG)
    assert mine.ok
    assert mine.placed[0].node == NodeName("a")


@given(
    loads=st.lists(st.sampled_from([10, 25, 50, 100]), min_size=1, max_size=12),
    size=st.integers(1, 4),
    percent=st.sampled_from([30, 60, 100]),
)
def test_a_plan_is_exact_and_sufficient(loads: list[int], size: int, percent: int) -> None:
    pl = placer({"a": gpus(2), "b": gpus(2)})
    held = []
    for pct in loads:
        got = pl.place(ref(), request({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": pct}))
        if isinstance(got, Placement):
            held.append(got)
    before = pl.ledger.snapshot()
    want = {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": percent}
    members = gang(size, want)
    result = plan(pl, members, size, [unit(p) for p in held])
    assert pl.ledger.snapshot() == before
    if result is None:
        for p in held:  # even with every unit gone it does not fit
            pl.ledger.release(p.pod.uid)
        assert not pl.place_gang(members, size).ok
        return
    for uid in result.pods:
        pl.ledger.release(uid)
    assert pl.place_gang(members, size).ok
