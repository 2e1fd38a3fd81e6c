"""Preemption and hold plans (shared/core/preemption.py) and nodes held for a gang."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from shared.core.disruption import Budget
from shared.core.gangs import Member
from shared.core.hosts import label_selector
from shared.core.model import GangKey, NodeName, VictimUnit
from shared.core.placement import Failure, GangMember, Placement, Placer
from shared.core.preemption import (
    NEVER,
    allowances,
    budget_note,
    eligible,
    marked,
    overdrawn,
    plan,
    respecting,
    victims,
)
from tests.unit.corekit import gpus, place, placer, ref, request
from tests.unit.test_gangs import bind, failed_once, gangs, member

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


# --- kube-scheduler's promises: preemptionPolicy Never, PodDisruptionBudgets ------------


def bound_member(p: Placement, priority: int, labels: dict[str, str] | None = None) -> Member:
    """A bound pod as the coordinator offers it."""
    return Member(
        pod=p.pod,
        key=GangKey.of(p.pod, None),
        request=request(WHOLE),
        priority=priority,
        state="bound",
        vector={"nvidia.count": 1.0},
        labels=labels or {},
    )


def offer(
    waiting: list[Member], held: list[Member], budgets: dict[str, dict[str, Budget]]
) -> tuple[VictimUnit, ...]:
    return victims(
        GangKey(namespace="ns", name="big"),
        waiting,
        {"nvidia.count": 2.0},
        bound={m.key: {m.pod.uid: m} for m in held},
        groups={},
        queues={},
        used={},
        share={},
        lowest=min(m.priority for m in held),
        budgets=budgets,
    )


def guard(allowed: int = 0) -> dict[str, dict[str, Budget]]:
    selector = label_selector({"matchLabels": {"app": "guarded"}})
    return {
        "ns": {"guard": Budget(namespace="ns", name="guard", selector=selector, allowed=allowed)}
    }


def two_nodes() -> tuple[Placer, list[Member], list[Member]]:
    """Nodes a and b of two cards: a full of priority-0 pods a PDB guards, b of
    priority-10 pods (cheaper to evict by priority alone: a's)."""
    pl = placer({"a": gpus(2), "b": gpus(2)})
    held = [place(pl, WHOLE, name=f"p{i}") for i in range(4)]
    on_a = [p for p in held if p.node == held[0].node]
    on_b = [p for p in held if p.node != held[0].node]
    assert len(on_a) == len(on_b) == 2
    low = [bound_member(p, 0, {"app": "guarded"}) for p in on_a]
    mid = [bound_member(p, 10, {"app": "web"}) for p in on_b]
    return pl, low, mid


def test_a_pod_of_preemption_policy_never_is_offered_no_victim() -> None:
    _, low, mid = two_nodes()
    top = Member(pod=ref(), key=BIG, request=request(WHOLE), priority=1000)
    assert offer([top], [*low, *mid], {})
    never = Member(
        pod=ref(), key=BIG, request=request(WHOLE), priority=1000, preemption_policy=NEVER
    )
    assert offer([top, never], [*low, *mid], {}) == ()  # one such pod: the gang evicts no one
    assert not eligible(["", NEVER])
    assert eligible(["", "PreemptLowerPriority"])


def test_the_node_whose_victims_break_no_budget_is_chosen_and_told() -> None:
    pl, low, mid = two_nodes()
    top = Member(pod=ref(), key=BIG, request=request({"nvidia.com/gpu": 2}), priority=1000)
    members = [GangMember(pod=top.pod, request=top.request, group=BIG)]
    without = plan(pl, members, 1, offer([top], [*low, *mid], {}))
    assert without is not None
    assert set(without.pods) == {m.pod.uid for m in low}  # by priority alone: a's pods
    budgets = guard()
    units = offer([top], [*low, *mid], budgets)
    assert [u.budgets for u in units[-2:]] == [(("ns/guard",),)] * 2  # last: they break it
    allowed = allowances(units, budgets)
    assert allowed == {"ns/guard": 0}
    found = plan(pl, members, 1, units)
    assert found is not None
    assert set(found.pods) == {m.pod.uid for m in mid}
    assert found.placements[0].node == pl.ledger.pods[mid[0].pod.uid].node
    assert overdrawn(found.units, allowed) == {}
    assert budget_note(found.units, units, allowed) == "; PodDisruptionBudget ns/guard respected"


def test_when_only_breaking_a_budget_makes_room_the_fewest_breaks_are_chosen_and_said() -> None:
    pl, low, _ = two_nodes()
    top = Member(pod=ref(), key=BIG, request=request({"nvidia.com/gpu": 2}), priority=1000)
    members = [GangMember(pod=top.pod, request=top.request, group=BIG)]
    budgets = guard(allowed=1)
    units = offer([top], low, budgets)
    assert [bool(u.budgets) for u in units] == [True, True]
    allowed = allowances(units, budgets)
    found = plan(pl, members, 1, units)
    assert found is not None
    assert overdrawn(found.units, allowed) == {"ns/guard": 1}
    note = budget_note(found.units, units, allowed)
    assert note == (
        "; violating PodDisruptionBudget ns/guard (it allows 1 disruption(s)): "
        "no choice that respects it makes room"
    )
    whys = [u.why for u in marked(found.units, allowed)]
    assert all(w.endswith("; violates PodDisruptionBudget ns/guard") for w in whys)


def test_a_budget_that_allows_one_lets_the_cheapest_of_its_pods_go_first() -> None:
    _, low, mid = two_nodes()
    top = Member(pod=ref(), key=BIG, request=request(WHOLE), priority=1000)
    units = offer([top], [*low, *mid], guard(allowed=1))
    order = [u.pods[0].uid for u in units]
    # One guarded pod is within what the budget allows: offered by its priority, first;
    # the other would break it: last, after the priority-10 pods.
    assert order[0] in {m.pod.uid for m in low}
    assert order[-1] in {m.pod.uid for m in low}
    assert set(order[1:3]) == {m.pod.uid for m in mid}


def test_a_pod_in_two_units_counts_against_its_budget_once() -> None:
    a, b = ref("a"), ref("b")
    member = VictimUnit(pods=(a,), budgets=(("ns/guard",),))
    whole = VictimUnit(pods=(a, b), budgets=(("ns/guard",), ("ns/guard",)))
    assert overdrawn([member, whole], {"ns/guard": 1}) == {"ns/guard": 1}
    assert respecting([member, whole], {"ns/guard": 1}) == (member, whole)
    assert respecting([member, whole], {"ns/guard": 0}) == (member, whole)  # both break it


def test_the_coordinator_offers_by_budget_and_sends_what_each_allows() -> None:
    g = gangs()
    guarded = member(priority=0)
    guarded.labels = {"app": "guarded"}
    free = member(priority=5)
    for m in (guarded, free):
        bind(g, m)
    g.budgets = guard()
    waiting = failed_once(g, member(priority=9))
    assert [v.pods[0].uid for v in waiting.victims] == [free.pod.uid, guarded.pod.uid]
    assert waiting.budgets == {"ns/guard": 0}
    never = member(priority=9)
    never.preemption_policy = NEVER
    assert failed_once(g, never).victims == ()
